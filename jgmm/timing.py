"""Wall-clock timing of asynchronous calls (JAX or torch), shared by `python -m jgmm` and jgmm.bench.

Timing: wall clock around a batch of asynchronous calls ended by one synchronisation, median of several
batches, after warm-up (a wait per call would time the host's dispatch and synchronisation instead). A call whose
GPU work is shorter than the host's dispatch of it (tens of us) times the host: chain() runs it several times in
one program. kernel_ms times instead a call's named GPU kernels by the profiler's record (traced_kernels), as
DeepGEMM times its published figures. sustained_runs times each call back to back for seconds, the rate a GPU
holds under its power cap once its clock has settled (interleaved batches of 50 ms see clocks a sustained run does
not keep: docs/perf-notes.md, session 41).
"""
import functools
import glob
import math
import re
import statistics
import tempfile
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp


def jax_sync(x):
  jax.block_until_ready(x)


def chain(fn, runs):
  """fn(*args) run `runs` times in one program (jit the result), returning the last run's output; one dispatch of
  the host then covers `runs` times fn's GPU work (divide the time by runs). Each run after the first gets, in the
  first element of args[0], 1 added where the first element of one of the last run's outputs is NaN, which it is
  not for finite inputs: a true data dependency (an optimisation barrier alone is expanded before XLA's CSE on some
  backends), so XLA neither merges the runs nor hoists them. All of fn's work must read args[0] (the activations:
  group sizes or masked_m will not do, XLA's backend applies them after a dot it can then share). Its cost: one
  copy of args[0] per call and a one-element update per run."""
  def chained(first, *rest):
    out = fn(first, *rest)
    for _ in range(runs - 1):
      nan = jnp.any(jnp.stack([jnp.isnan(leaf.ravel()[0]) for leaf in jax.tree.leaves(out)]))
      first = first.at[(0,) * first.ndim].add(nan.astype(first.dtype))
      out = fn(first, *rest)
    return out
  return chained


def chain_runs(floor_ms, target_ms=0.5, most=32):
  """How many runs of work whose speed-of-light time is floor_ms fill about target_ms of GPU time (1 to most): a
  chain() that long keeps the GPU, not the host's dispatch, the bottleneck."""
  return min(most, max(1, math.ceil(target_ms / max(floor_ms, 1e-9))))


def traced_events(call, calls=1):
  """[(start_ns, end_ns, name)] of the GPU kernels that `calls` calls of call() (each waiting for its work) ran, in
  the order they started, from JAX's profiler (CUPTI: every kernel of the process, torch's too; none on a CPU). call
  must be compiled already (a compile's kernels would be traced)."""
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    try:
      for _ in range(calls):
        call()
    finally:
      jax.profiler.stop_trace()
    data = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
  events = sorted((event.start_ns, event.name, event.duration_ns) for plane in data.planes
                  if plane.name.startswith("/device:") for line in plane.lines for event in line.events)
  return [(start, start + duration, name) for start, name, duration in events]


def traced_kernels(call, calls=1):
  """[(name, ms)] of traced_events' kernels."""
  return [(name, (end - start) / 1e6) for start, end, name in traced_events(call, calls)]


def kernel_ms(fn, sync, kernel, launches=5, flush_bytes=256 << 20):
  """Median ms of a call's GPU kernels whose names match the regex `kernel` (summed where a call launches several)
  over `launches` calls of fn(), one at a time (each ended by sync()), each after a write of flush_bytes that evicts
  the L2: DeepGEMM's method (its bench_kineto: the kernels' own durations, without the call's other kernels or the
  host's dispatch), by traced_kernels. Raises LookupError where the matching kernels are not the same number each
  call (none, e.g., on a CPU)."""
  flush = _l2_flush(flush_bytes)

  def flushed():
    jax_sync(flush())
    sync(fn())

  durations = [ms for name, ms in traced_kernels(flushed, launches) if re.search(kernel, name)]
  if not durations or len(durations) % launches:
    raise LookupError(f"the profiler recorded {len(durations)} kernels matching {kernel!r} in {launches} calls")
  per_call = len(durations) // launches
  return statistics.median(sum(durations[i:i + per_call]) for i in range(0, len(durations), per_call))


@functools.cache
def _l2_flush(nbytes):
  """A compiled call that writes nbytes of fresh device memory (evicting the L2 before a timed kernel)."""
  flush = jax.jit(lambda: jnp.zeros((nbytes // 4,), jnp.int32) + 1)
  jax_sync(flush())
  return flush


def time_ms(fn, sync, min_batch_s=0.05, batches=7):
  """Median ms per call of fn() over `batches` timed batches (each ended by sync()), after warm-up."""
  return time_interleaved({"fn": (fn, sync)}, min_batch_s, batches)["fn"]


_WALL_OFFSET = time.time() - time.perf_counter()


class Run(NamedTuple):
  """One timed run (a batch of interleaved_runs, a run of sustained_runs): calls completed between start and end
  (time.perf_counter() seconds)."""
  start: float
  end: float
  calls: int

  @property
  def ms(self):
    """ms per call."""
    return 1e3 * (self.end - self.start) / self.calls

  @property
  def wall(self):
    """(start, end) on the wall clock, time.time()'s: to match other records (nvidia-smi's samples) against."""
    return self.start + _WALL_OFFSET, self.end + _WALL_OFFSET


def _call(fn, sync, calls):
  """fn() `calls` times, asynchronously, the last one waited for by sync()."""
  for _ in range(calls - 1):
    fn()
  sync(fn())


def time_interleaved(fns, min_batch_s=0.05, batches=7, cap_s=None):
  """{name: median ms per call} of fns {name: (fn, sync)} (interleaved_samples)."""
  return {name: statistics.median(ms) for name, ms in interleaved_samples(fns, min_batch_s, batches, cap_s).items()}


def interleaved_samples(fns, min_batch_s=0.05, batches=7, cap_s=None):
  """{name: [ms per call of each batch]} of fns {name: (fn, sync)}: sample i of every fn from round i
  (interleaved_runs)."""
  return {name: [run.ms for run in runs] for name, runs in interleaved_runs(fns, min_batch_s, batches, cap_s).items()}


def balanced_orders(n):
  """Orders of range(n), one a round, in which each i follows each other j equally often (a Williams design: n
  orders for an even n, 2n for an odd n). Under a power cap a batch's speed depends on the one before it: the
  clock it inherits (session 42: 2.3-4.0% for the same kernel after torch's batch against after the dense one)."""
  first = [0 if j == 0 else (j + 1) // 2 if j % 2 else n - j // 2 for j in range(n)]
  orders = [[(i + shift) % n for i in first] for shift in range(max(n, 1))]
  return orders + [order[::-1] for order in orders] if n % 2 and n > 1 else orders


def interleaved_runs(fns, min_batch_s=0.05, batches=7, cap_s=None):
  """{name: [Run of each batch]} of fns {name: (fn, sync)}: run i of every fn from round i.

  Each fn is warmed up (compiled) and timed once to size its batch; then the batches run in rounds, one per fn
  each, so that every implementation sees the same clocks and temperature (a GPU at full load slows down within a
  second), and the samples of one round can be compared pairwise. Round i runs the fns in balanced_orders' order
  i (cycled), so that no fn always follows the same one; `batches` is rounded up to whole cycles where one cycle
  is no longer than it. A fn whose single warm call takes longer than cap_s is timed by that call (one run).
  """
  reps, result = {}, {}
  for name, (fn, sync) in fns.items():
    sync(fn())
    start = time.perf_counter()
    sync(fn())
    end = time.perf_counter()
    if cap_s is not None and end - start > cap_s:
      result[name] = [Run(start, end, 1)]
    else:
      reps[name] = max(1, int(min_batch_s / max(end - start, 1e-6)))
  names = list(reps)
  orders = balanced_orders(len(names))
  if len(orders) <= batches:
    batches = -(-batches // len(orders)) * len(orders)
  runs = {name: [] for name in names}
  for i in range(batches):
    for name in (names[j] for j in orders[i % len(orders)]):
      start = time.perf_counter()
      _call(*fns[name], reps[name])
      runs[name].append(Run(start, time.perf_counter(), reps[name]))
  return result | runs


def sustained_runs(fns, seconds, rounds=2, settle_s=0.5, rest_s=1.0, calls_per_sync=10):
  """{name: [Run of each round]} of fns {name: (fn, sync)}, each compiled already: per round, each fn called back to
  back (a sync every calls_per_sync calls) for settle_s, then timed for `seconds` more (the clock of a GPU under
  its power cap settles within half a second), the GPU left idle for rest_s between runs so that each starts from
  the same clock; every other round in reverse order, so that no fn always follows the same one."""
  names = list(fns)
  runs = {name: [] for name in names}
  for r in range(rounds):
    for name in names[::-1] if r % 2 else names:
      fn, sync = fns[name]
      settle_end = time.perf_counter() + settle_s
      while time.perf_counter() < settle_end:
        sync(fn())
      start, calls = time.perf_counter(), 0
      while time.perf_counter() - start < seconds:
        _call(fn, sync, calls_per_sync)
        calls += calls_per_sync
      runs[name].append(Run(start, time.perf_counter(), calls))
      time.sleep(rest_s)
  return runs
