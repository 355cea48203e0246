"""pytest's --shard I/N (tests/conftest.py): a GPU suite longer than one device call's limit runs as N calls."""


def shard(items, spec):
  """(kept, dropped) of items for spec "I/N": items I, I + N, I + 2N, ... are kept, so the N shards are disjoint,
  cover items, and share each file's slow and fast tests alike. ValueError names a spec that is not I/N with integers
  0 <= I < N."""
  try:
    index, count = (int(part) for part in spec.split("/"))
  except ValueError:
    index, count = -1, 0
  if not 0 <= index < count:
    raise ValueError(f"--shard: expected I/N with integers 0 <= I < N, got {spec!r}")
  return items[index::count], [item for j, item in enumerate(items) if j % count != index]
