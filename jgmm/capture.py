"""JGMM_CAPTURE_SHAPES: a file of the untuned keys that processes traced, one JSON object per line, each once.

Several processes may append at once: each holds an exclusive fcntl lock on the file while it reads it (to skip a
line already there) and appends its line with a single write() to a file opened with O_APPEND. So no line is lost,
torn or written twice. `jgmm-tune --capture FILE` tunes them.
"""
import fcntl
import json
import os


def _line(fields):
  return json.dumps(fields, sort_keys=True) + "\n"


def append(path: str, fields: dict) -> None:
  """Appends the JSON object `fields` (a dict) to `path` as one line unless the file holds it already."""
  line = _line(fields).encode()
  fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    with os.fdopen(os.dup(fd), "rb") as f:
      present = line in f.read().splitlines(keepends=True)
    if not present:
      os.write(fd, line)
  finally:
    os.close(fd)  # Closing releases the lock.


def read(path: str) -> list[dict]:
  """The objects of a capture file, in order; ValueError naming the line where one does not parse."""
  objects = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        objects.append(json.loads(line))
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not a JSON line: {e}") from None
  return objects
