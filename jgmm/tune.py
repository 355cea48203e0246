"""jgmm-tune (also `python -m jgmm.tune`): tune the backend and kernel config of grouped-GEMM calls on this GPU.

    jgmm-tune --model-config examples/models/mixtral-8x7b.json --ep 1,8 --tokens 1,16,64,256,1024,4096,16384
    jgmm-tune --capture shapes.jsonl          # the keys a run with JGMM_CAPTURE_SHAPES=shapes.jsonl traced
    jgmm-tune --shape gmm,8192,4096,14336,8   # op,M,K,N,G (--dtype, --out-dtype)
    jgmm-tune --model-config examples/models/deepseek-v3.json --ep 8 --fp8 1x128-128x128   # its FP8 calls too
    jgmm-tune --shape masked_fp8,4096,7168,4096,4 --scale 1x128-128x128,row-channel   # FP8 (--fp8-dtype)

Each key (jgmm/config_table.py) is tuned in two phases: a quick screen of every candidate (the candidate space of
--space, or --candidates FILE, plus the configs --seed-table files hold for the key, the heuristic's config and the
xla backend), then the --finalists fastest and the heuristic's config and the xla backend timed again interleaved
(with no more Triton candidates than --finalists, the screen is skipped), each checked against the xla backend's
output: a candidate whose max |out - xla out| / max |xla out| passes --err-ratio x the unit roundoff of its dtypes is
rejected. The fastest of the rest (by its median over the interleaved rounds: 7 or more) is the entry, "xla" where the
portable backend is the fastest, only where it beats the heuristic's config beyond noise (beats(): by more than
--min-gain in the median of the per-round ratios, and in 70% of the rounds at least) and does so again in a
confirming round (the two timed afresh: the first verdict picked the luckiest of several, so it cannot confirm
itself); otherwise the heuristic's config is the entry (so that a table never picks a config slower than the
heuristic beyond noise, and the key counts as tuned). --sustained-s SECONDS times the final and confirming rounds
(5 each) with each candidate running alone for SECONDS instead: interleaved batches share one clock, so on a GPU at
its power cap they rank candidates by work per clock and cannot show which spends less energy per FLOP, which a
sustained run's clock follows (docs/perf-notes.md, session 42). Results go to
--output (default: ./<the table name this GPU reads>, e.g. sm90-nvidia_h200.json), rewritten atomically after each
key: killing the tuner loses no finished key, and rerunning resumes (keys in --output, or with an exact entry in
the tables select() reads now, are skipped unless --all). Use the file with JGMM_CONFIG_FILES=path, or ship it in
configs/. Keys are tuned largest (in flops) first; --time-limit SECONDS starts no key that would end past that
budget (judged by the longest key so far), so that a run bounded in time stops cleanly and the next resumes.

--recheck TABLE re-examines a table (after a jgmm or Triton upgrade, or one tuned by an older, less careful tuner):
each of its entries that is not the heuristic's choice is timed against the heuristic's config (M = rows x G, the
bucket's largest) by the rule above and kept (newly measured), or replaced by the heuristic's config; TABLE's
entries, so changed, are written to --output (another file: an entry there that differs from TABLE's is rechecked,
so that a rerun resumes).

FP8 ops (config_table.FP8_OPS: gmm_fp8, gmm_t_fp8 (rhs (G, N, K)), tgmm_fp8, masked_fp8) are keyed by their scale
recipe too: --shape's are tuned in each recipe of --scale (default 1x128-128x128: DeepSeek-V3's 1x128 activations
and 128x128 weights; row-channel: per row and per channel), tgmm_fp8's in its one (128x1: lhs (K, M) and rhs (N, M)
scaled per 128 rows of M, as jgmm.fp8_gmm's backward calls it); --model-config's with --fp8 RECIPES
(jgmm/model_shapes.py: 1x128-128x128 adds jgmm.fp8_gmm's forward and backward); a capture file's as captured.
Their inputs (--fp8-dtype) are quantised once by jgmm.quantize, so that every candidate and the xla backend read
the same FP8 values and scales: their error bound is --err-ratio x the output dtype's unit roundoff. `python -m
jgmm.bench --fp8 --tune` tunes the keys of the FP8 benchmark's cases (jgmm.bench_fp8.tune_argv).

Candidates run in a worker process (jgmm.tune_worker): one that runs longer than --timeout seconds (a hang) or
kills the worker (a crash) is reported and skipped, and a fresh worker goes on. Timing is serial (one candidate at
a time on the GPU) but compiling is not: --jobs worker processes without a GPU (Precompiler) compile the Triton
candidates of the keys ahead into Triton's on-disk cache meanwhile; one that fails there is not screened. A small
key runs several times in each timed program (jgmm.tune_worker.problem, jgmm.timing.chain), so that the GPU's time
is measured, not the host's dispatch (tens of us: it hid a 23 us kernel behind 66 us). On a
machine without a GPU, the xla backend runs (and Triton's interpreter under TRITON_INTERPRET=1), so the loop runs
end to end on a CPU.
"""
import argparse
import dataclasses
import json
import os
import queue
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from jgmm import capture, config_table, model_shapes
from jgmm.config import Config
from jgmm.triton_kernels import gmm_ws_cluster

_C = Config
# The default space (--space small): configs measured best on some case on an H200 or H100 (docs/perf-notes.md; the
# last round in column halves, tail_split: mixtral's d lhs and dsv3 gate-up's forward and d lhs, Session 48).
_GMM = [_C(128, 256, 64, 8, 3), _C(128, 256, 64, 8, 3, tail_split=True), _C(128, 256, 64, 8, 4), _C(64, 256, 64, 4, 4),
        _C(64, 256, 32, 4, 4, programs_per_sm=2), _C(64, 256, 32, 4, 3, programs_per_sm=2),
        _C(128, 128, 32, 4, 4, programs_per_sm=2), _C(128, 256, 64, 8, 3, warp_specialized=True), _C(64, 128, 64, 4, 4)]
# The bf16 warp-specialised kernel's tile orders and clusters (Config.band_tiles, cluster_size): each the fastest on
# some bench case's forward or d lhs on an H100 under Triton 3.9 (docs/perf-notes.md, Session 24); in bands of 8
# with the last round in column halves (Config.tail_split): mixtral's forward on an H200 (Session 48).
_GMM_WS = [_C(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8),
           _C(128, 256, 64, 8, 3, warp_specialized=True, cluster_size=2),
           _C(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8, cluster_size=2),
           _C(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8, tail_split=True)]
_SMALL_GMM = [_C(16, 128, 128, 4, 5), _C(16, 128, 128, 4, 6), _C(16, 64, 128, 4, 6), _C(16, 128, 64, 4, 8),
              _C(32, 128, 128, 4, 4)]
_TGMM = [_C(128, 256, 64, 8, 3), _C(128, 256, 64, 8, 4), _C(128, 128, 128, 8, 3), _C(256, 128, 64, 8, 3)]
# The warp-specialised bf16 tgmm's (lhs (M, K) read transposed): each the fastest on some bench case's weight
# gradient on an H100 under Triton 3.6 (docs/perf-notes.md, Session 26), and in bands of K tiles (Session 39).
_TGMM_WS = [_C(128, 256, 64, 8, 3, warp_specialized=True), _C(128, 256, 32, 8, 6, warp_specialized=True),
            _C(128, 128, 64, 8, 5, warp_specialized=True), _C(128, 256, 32, 8, 6, warp_specialized=True, band_tiles=8),
            _C(128, 256, 64, 8, 3, warp_specialized=True, band_tiles=8)]
_SMALL_TGMM = [_C(128, 256, 16, 8, 3), _C(128, 256, 32, 8, 3), _C(128, 128, 16, 4, 4)]
# The plain FP8 kernels' tilings (gmm_fp8_kernel, masked_gmm_fp8_kernel; each with TMA loads and without): K steps
# of one 128-wide scale block, or half of one.
_FP8 = [_C(128, 128, 128, 8, 4), _C(128, 128, 128, 4, 4), _C(128, 256, 128, 8, 3), _C(64, 128, 128, 4, 5),
        _C(64, 256, 128, 4, 4), _C(128, 128, 64, 8, 6)]
# The warp-specialised FP8 kernel's tilings (FP8 gmm with K-major rhs, FP8 masked_gmm): each the best somewhere;
# with cluster_size 2 (the block recipe on 2-CTA clusters, Triton >= 3.7), each the best on some bench case under
# Triton 3.9 (docs/perf-notes.md, Session 36).
_FP8_WS = [_C(128, 128, 128, 8, 4, tma=False, warp_specialized=True),
           _C(128, 256, 128, 8, 3, tma=False, warp_specialized=True),
           _C(192, 128, 128, 8, 4, tma=False, warp_specialized=True),
           _C(128, 128, 128, 8, 5, tma=False, warp_specialized=True, cluster_size=2),
           _C(192, 128, 128, 8, 4, tma=False, warp_specialized=True, cluster_size=2)]
# The warp-specialised FP8 tgmm's (lhs (K, M), rhs (N, M)): 128 x block_n tiles of out (K, N), 128 rows of M a step;
# the most stages its shared memory holds with bf16 out (geometry.tgmm_fp8_ws_ok), and one fewer at 128 wide; in
# bands of 8 K tiles (1.05x on the recipe's dsv3 gate-up on an H100, 0.99x on down: docs/perf-notes.md, Session 39).
_TGMM_FP8_WS = [_C(128, 128, 128, 8, 4, tma=False, warp_specialized=True),
                _C(128, 128, 128, 8, 5, tma=False, warp_specialized=True),
                _C(128, 128, 128, 8, 5, tma=False, warp_specialized=True, band_tiles=8),
                _C(128, 256, 128, 8, 3, tma=False, warp_specialized=True)]
_FLOAT_DTYPES = ("bfloat16", "float16", "float32")  # --dtype's, --out-dtype's
# Unit roundoff per dtype. fp32: Triton's dots round inputs to TF32 (10 mantissa bits). FP8 inputs have none here:
# every backend reads the same quantised values (tune_worker.problem), so only the product's rounding differs.
_EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-11}


def candidate_space(key: config_table.Key, space: str) -> list[Config]:
  """Triton Configs to screen for key: space "small" (the measured bests above), "full" (a grid) or "none".
  FP8 ops: their own tilings, and the warp-specialised ones of their kernel where they have one (FP8_WS_OPS,
  tgmm_fp8); candidates() keeps their K steps within a scale block."""
  fp8 = key.op in config_table.FP8_OPS
  gmm_like = key.op not in ("tgmm", "tgmm_fp8")  # tgmm loads through pointers: no TMA variants
  if space == "none":
    return []
  if space == "full":
    configs = [_C(bm, bn, bk, w, s, programs_per_sm=p, tma=t)
               for bm in (16, 32, 64, 128) for bn in (64, 128, 256) for bk in (32, 64, 128) for w in (4, 8)
               for s in (3, 4, 5) for p in (1, 2) for t in ((True, False) if gmm_like else (False,))
               if (w == 8) == (bm * bn >= 128 * 256) and bm <= max(16, 2 * key.rows)]
  else:
    if fp8:
      base = _FP8 if gmm_like else _TGMM
    elif key.rows <= 32:
      base = _SMALL_GMM if gmm_like else _SMALL_TGMM
    else:
      base = _GMM if gmm_like else _TGMM
    configs = [dataclasses.replace(c, tma=t) for c in base for t in ((True, False) if gmm_like else (False,))]
    if base is _GMM:  # Clusters only where this Triton has them (elsewhere the one-CTA kernel would run again).
      configs += [c for c in _GMM_WS if c.cluster_size == 1 or gmm_ws_cluster.supported()]
  if key.op not in ("gmm", "gmm_t"):  # gmm_ws's configs (_GMM's and _GMM_WS) and tail_split are gmm's only.
    configs = [c for c in configs if not (c.warp_specialized or c.tail_split)]
  if key.op == "tgmm" and key.transpose and key.in_dtype in ("bf16", "fp16") and key.rows > 32:
    configs += _TGMM_WS
  if key.op in config_table.FP8_WS_OPS:  # Clusters only where this Triton has them, for the block recipe.
    configs += [c for c in _FP8_WS if c.cluster_size == 1 or (gmm_ws_cluster.supported()
                                                              and key.scale == model_shapes.FP8_GMM_RECIPE)]
  if key.op == "tgmm_fp8":
    configs += _TGMM_FP8_WS
  return configs


def candidates(key, configs, arch, backends, measured=()):
  """[{"backend": ..., "config": ...}] to screen: the heuristic's config first, the `measured` configs (a table's:
  they ran on a GPU, so fits(), an upper bound, does not judge them) and the configs that fit arch's shared memory
  (if "triton" in backends), and the xla backend (if "xla" in backends). Each config once as its kernel runs it: an
  FP8 op's within its scale block (config_table.within_scale_block)."""
  out = []
  if "triton" in backends:
    as_run = config_table.within_scale_block if key.op in config_table.FP8_OPS else lambda config: config
    heuristic = as_run(config_table.heuristic_config(key, arch))
    fitting = [c for c in configs if config_table.fits(key, c, arch)]
    triton = [c for c in dict.fromkeys(map(as_run, [*measured, *fitting])) if c != heuristic]
    out += [{"backend": "triton", "config": dataclasses.asdict(c)} for c in [heuristic, *triton]]
  if "xla" in backends:
    out.append({"backend": "xla"})
  return out


class WorkerFailed(Exception):
  """The worker hung (timed out) or died while running candidate i (-1: the whole final phase)."""

  def __init__(self, i, reason):
    super().__init__(reason)
    self.i = i


class Worker:
  """A jgmm.tune_worker process; restarted after a failure."""

  def __init__(self, verbose, start_timeout_s=600, command=(sys.executable, "-m", "jgmm.tune_worker"), env=None):
    self.verbose, self.start_timeout_s, self.command, self.env = verbose, start_timeout_s, list(command), env
    self.proc = self.device = None

  def start(self):
    self.log = None if self.verbose else tempfile.TemporaryFile()
    self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                 env=self.env)
    self.buffer = b""
    self.device = self._read(self.start_timeout_s, -1)

  def stop(self):
    if self.proc is not None:
      self.proc.kill()
      self.proc.wait()
      self.proc = None

  def _read(self, timeout_s, i):
    """The next JSON line of the worker, or WorkerFailed(i) after timeout_s or if it exits."""
    deadline = time.monotonic() + timeout_s
    fd = self.proc.stdout.fileno()
    while b"\n" not in self.buffer:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        self.stop()
        raise WorkerFailed(i, f"timed out after {timeout_s:.0f} s")
      chunk = os.read(fd, 1 << 16)
      if not chunk:
        self.proc.wait()
        reason = f"the worker died (exit status {self.proc.returncode}){self._log_tail()}"
        self.proc = None
        raise WorkerFailed(i, reason)
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    return json.loads(line)

  def _log_tail(self):
    if self.log is None:
      return ""
    self.log.seek(0)
    return ": " + self.log.read().decode(errors="replace")[-500:]

  def run(self, job, timeout_s):
    """Yields the result events of a job; WorkerFailed when a candidate (or the final phase) fails."""
    if self.proc is None:
      self.start()
    self.proc.stdin.write((json.dumps(job) + "\n").encode())
    self.proc.stdin.flush()
    current, limit = -1, timeout_s * (len(job["candidates"]) + 1 if job["phase"] == "final" else 1)
    while True:
      event = self._read(limit, current)
      if event["event"] == "done":
        return
      if event["event"] == "start":
        current = event["i"]
      else:
        yield event


class Precompiler:
  """Compiles the Triton candidates of the keys ahead in `jobs` worker processes without a GPU (JAX_PLATFORMS=cpu,
  JGMM_TARGET=the GPU's architecture) while the timing worker times others: each lowers a candidate, which
  writes its kernel to Triton's on-disk cache, where the timing worker finds it. A candidate that fails to compile,
  hangs (timeout_s) or kills its process is not screened. command: the worker's (Worker)."""

  def __init__(self, jobs, arch, timeout_s, verbose, command):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    self.platforms = None  # The interpreter's (arch None): lower for the CPU.
    if arch:
      self.platforms = ["rocm"] if arch.startswith("gfx") else ["cuda"]
      env["JGMM_TARGET"] = f"rocm:{arch}" if arch.startswith("gfx") else f"cuda:{arch.removeprefix('sm')}"
    self.timeout_s, self.tasks, self.results, self.changed = timeout_s, queue.Queue(), {}, threading.Condition()
    self.workers = [Worker(verbose, command=command, env=env) for _ in range(jobs)]
    self.threads = [threading.Thread(target=self._loop, args=(w,), daemon=True) for w in self.workers]
    for thread in self.threads:
      thread.start()

  def submit(self, key, m, cands):
    """Queues the Triton candidates of key (compiled in the order submitted)."""
    for cand in cands:
      if cand["backend"] == "triton":
        self.tasks.put((key, m, cand))

  def _loop(self, worker):
    while (task := self.tasks.get()) is not None:
      key, m, cand = task
      job = {"phase": "compile", "key": key._asdict(), "m": m, "candidates": [cand], "seconds": 0,
             "platforms": self.platforms}
      try:
        (event,) = worker.run(job, self.timeout_s)
      except WorkerFailed as failed:
        event = {"error": f"compiling: {failed}"}
      with self.changed:
        self.results[key, json.dumps(cand)] = event
        self.changed.notify_all()
    worker.stop()

  def wait(self, key, cands, timeout_s):
    """{candidate index: compile event} of key's Triton candidates, waiting at most timeout_s for them."""
    ids = {i: (key, json.dumps(c)) for i, c in enumerate(cands) if c["backend"] == "triton"}
    with self.changed:
      self.changed.wait_for(lambda: all(id in self.results for id in ids.values()), timeout_s)
      return {i: self.results.pop(id) for i, id in ids.items() if id in self.results}

  def stop(self):
    """Drops the queued candidates, lets each process finish the one it compiles, and ends them."""
    with self.tasks.mutex:
      self.tasks.queue.clear()
    for _ in self.threads:
      self.tasks.put(None)
    for thread in self.threads:
      thread.join()


def _screen(worker, key, m, cands, todo, args, report):
  """{candidate index: us} of the candidates of indices todo that ran; failures are reported."""
  timings = {}
  while todo:
    job = {"phase": "screen", "key": key._asdict(), "m": m, "candidates": [cands[i] for i in todo],
           "seconds": args.screen_s}
    try:
      for event in worker.run(job, args.timeout):
        i = todo[event["i"]]
        report("screen", cands[i], event)
        if "us" in event:
          timings[i] = event["us"]
      todo = []
    except WorkerFailed as failed:
      if failed.i < 0:  # before any candidate started: the key's inputs
        report("screen", None, {"error": str(failed)})
        break
      report("screen", cands[todo[failed.i]], {"error": str(failed)})
      todo = todo[failed.i + 1:]
  return timings


def key_candidates(key, args, device):
  """candidates() of key for args on the worker's device: the --seed-table configs of key first; with --recheck,
  the heuristic's config and the table's choice only."""
  if args.recheck:
    entry = args.recheck_table[key]
    configs, backends = [], ["triton"] if entry.backend == "triton" else ["triton", "xla"]
    measured = [entry.config] if entry.backend == "triton" else []
  else:
    measured = [entry.config for table in args.seed_table if (entry := table.get(key)) and entry.backend == "triton"]
    configs, backends = args.candidates or candidate_space(key, args.space), args.backends
  return candidates(key, configs, device["arch"], backends if device["triton"] else ["xla"], measured)


def _unit_roundoff(key):
  """The unit roundoff of key's dtypes that --err-ratio scales: its output's for an FP8 op (its inputs are the same
  FP8 values in every backend), else the larger of its inputs' and output's."""
  if key.op in config_table.FP8_OPS:
    return _EPS[key.out_dtype]
  return max(_EPS[key.in_dtype], _EPS[key.out_dtype])


def beats(fast, slow, min_gain):
  """Whether the candidate of round times `fast` beats the one of `slow` (one time per round, interleaved or
  sustained, the same rounds) beyond noise: the median of the ratios slow / fast above 1 + min_gain, and faster in at
  least 70% of the rounds (e.g. 6 of 8: a sign test that one or two rounds hit by a stall of the host or GPU do not
  fail)."""
  ratios = [s / f for f, s in zip(fast, slow, strict=True)]
  return statistics.median(ratios) > 1 + min_gain and sum(r > 1 for r in ratios) >= 0.7 * len(ratios)


def _final(worker, key, m, cands, indices, args, report, phase="final"):
  """{candidate index: result event} of the candidates of `indices` timed by the worker's final phase (interleaved,
  or sustained with --sustained-s) and correct (within --err-ratio of the xla backend); None if the phase failed.
  Each result is reported."""
  job = {"phase": "final", "key": key._asdict(), "m": m, "candidates": [cands[i] for i in indices],
         "seconds": args.final_s, "sustained": args.sustained_s}
  bound = args.err_ratio * _unit_roundoff(key)
  results = {}
  try:
    for event in worker.run(job, args.timeout):
      i = indices[event["i"]]
      if "us" in event and event["max_rel_err"] > bound:
        event = {**event, "error": f"max_rel_err {event['max_rel_err']:.3g} > {bound:.3g}"}
      report(phase, cands[i], event)
      if "error" not in event:
        results[i] = event
  except WorkerFailed as failed:
    report(phase, None, {"error": f"{phase} phase: {failed}"})
    return None
  return results


def tune_key(worker, key, m, args, report, precompiler=None):
  """The Entry for key (None if no candidate ran correctly). With a precompiler (that key's candidates were
  submitted to), candidates that failed to compile there are reported and not screened."""
  cands = key_candidates(key, args, worker.device)
  # Each compile ends within args.timeout (a hang is killed): the bound only guards against a dead thread.
  compiled = precompiler.wait(key, cands, args.timeout * (len(cands) + 1)) if precompiler else {}
  for i, event in compiled.items():
    report("compile", cands[i], event)
  todo = [i for i in range(len(cands)) if "error" not in compiled.get(i, {})]
  if sum(cands[i]["backend"] == "triton" for i in todo) <= args.finalists:
    finalists = todo  # All would be finalists: no screen.
  else:
    timings = _screen(worker, key, m, cands, todo, args, report)
    if not timings:
      return None
    # The fastest Triton configs, the heuristic's (cands[0] with Triton) and the xla backend go to the final.
    triton = sorted((i for i in timings if cands[i]["backend"] == "triton"), key=timings.get)[:args.finalists]
    finalists = sorted(set(triton) | {i for i in timings if cands[i]["backend"] == "xla" or i == 0})
  results = _final(worker, key, m, cands, finalists, args, report)
  if not results:
    return None
  best = min(results, key=lambda i: (results[i]["us"], i))
  event = results[best]
  if best != 0 and 0 in results and cands[0]["backend"] == "triton":  # Leave the heuristic's config only if it is
    beaten = lambda results: beats(results[best]["samples_us"], results[0]["samples_us"], args.min_gain)
    confirm = beaten(results) and _final(worker, key, m, cands, [best, 0], args, report, "confirm")
    if confirm and len(confirm) == 2 and beaten(confirm):  # beaten twice, the second time in fresh rounds.
      event = confirm[best]
    else:
      best, event = 0, results[0]
  cand = cands[best]
  device = worker.device
  return config_table.Entry(key, cand["backend"], Config(**cand["config"]) if "config" in cand else None,
                            us=event["us"], tflops=event["tflops"], max_rel_err=event["max_rel_err"],
                            gpu=device["gpu"], jgmm=device["jgmm_version"], triton=device["triton_version"])


def _parse_shape(text, args):
  """[(Key, M)] of a --shape "op,M,K,N,G": an FP8 op's once per --scale recipe (tgmm_fp8's: its one, 128x1)."""
  try:
    op, *sizes = text.split(",")
    m, k, n, g = (int(s) for s in sizes)
  except ValueError:
    raise SystemExit(f"--shape wants op,M,K,N,G (e.g. gmm,8192,4096,14336,8), got {text!r}") from None
  if op not in config_table.OPS:
    raise SystemExit(f"--shape: op must be one of {', '.join(config_table.OPS)}, got {op!r} in {text!r}")
  if min(m, k, n, g) < 1:
    raise SystemExit(f"--shape: M, K, N and G must be positive, got {text!r}")
  if op in ("masked", "masked_fp8") and m % g:
    raise SystemExit(f"--shape: a masked op's M is G x rows per group (expected_m), a multiple of G; got M = {m}, "
                     f"G = {g} in {text!r}")
  transpose = op in ("gmm_t", "tgmm", "gmm_t_fp8")  # as jgmm's calls make them (tgmm_fp8: lhs (K, M))
  if op not in config_table.FP8_OPS:
    return [(config_table.make_key(op, args.dtype, args.out_dtype, m / g, k, n, g, transpose=transpose), m)]
  scales = [config_table.TGMM_FP8_RECIPE] if op == "tgmm_fp8" else args.scale
  return [(config_table.make_key(op, args.fp8_dtype, args.out_dtype, m / g, k, n, g, transpose=transpose,
                                 scale=scale), m) for scale in scales]


def calls(args):
  """[(Key, M)] of the capture files, the --shape options, the model config and the --recheck table (M = rows x G),
  in order, without repeats."""
  found = [(key, key.rows * key.g) for key in args.recheck_table]
  for path in args.capture:
    for i, fields in enumerate(capture.read(path)):
      try:
        key = config_table.Key(**fields)
      except TypeError as e:
        raise SystemExit(f"{path}: line {i + 1}: not a jgmm key: {e}") from None
      found.append((key, key.rows * key.g))
  found += [key_m for text in args.shape for key_m in _parse_shape(text, args)]
  for path in args.model_config:
    with open(path) as f:
      dims = model_shapes.moe_dims(json.load(f), path)
    for ep in args.ep:
      found += model_shapes.layer_calls(dims, ep, args.tokens, args.dtype, args.fp8, args.fp8_dtype)
  unique = {}
  for key, m in found:
    if key.op in args.ops:
      unique.setdefault(key, m)
  return list(unique.items())


def _comment(path):
  """The "comment" of the table file at path (kept when the tuner rewrites it), or None."""
  try:
    with open(path) as f:
      return json.load(f).get("comment")
  except FileNotFoundError:
    return None


def _progress(total):
  try:
    from tqdm import tqdm
  except ImportError:
    return None
  return tqdm(total=total, unit="key", dynamic_ncols=True)


def ints(text):
  """[int] of a comma-separated list ("1,8")."""
  return [int(t) for t in text.split(",")]


def _float_dtype(text):
  """--dtype's and --out-dtype's argparse type: a numpy name of _FLOAT_DTYPES."""
  if text not in _FLOAT_DTYPES:
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(_FLOAT_DTYPES)} (FP8 ops' inputs are "
                                     f"--fp8-dtype), got {text!r}")
  return text


def _names(allowed, what):
  """An argparse type: the list of a comma-separated text of names each in `allowed`; the error says what is
  expected (argparse adds the flag)."""
  def parse(text):
    names = text.split(",")
    if not set(names) <= set(allowed):
      raise argparse.ArgumentTypeError(f"expected {what}, comma-separated, of {', '.join(allowed)}; got {text!r}")
    return names
  return parse


def _read_table(flag, path):
  if not os.path.exists(path):
    raise SystemExit(f"{flag}: no such file: {path}")
  return config_table.read_table(path)


def _read_configs(path):
  with open(path) as f:
    return [Config(**fields) for fields in json.load(f)]


def parse_args(argv):
  p = argparse.ArgumentParser(prog="jgmm-tune", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--capture", action="append", default=[], help="a JGMM_CAPTURE_SHAPES file (repeatable)")
  p.add_argument("--shape", action="append", default=[],
                 help=f"op,M,K,N,G (repeatable; op: {', '.join(config_table.OPS)}; masked: M = G x rows)")
  p.add_argument("--model-config", action="append", default=[],
                 help="a Hugging Face MoE model's config.json (jgmm/model_shapes.py; repeatable)")
  p.add_argument("--ep", type=ints, default=[1],
                 help="expert parallelism: devices the experts are spread over, comma-separated (each is tuned)")
  p.add_argument("--tokens", type=ints, default=[1, 16, 64, 256, 1024, 4096, 16384],
                 help="tokens per device, comma-separated")
  p.add_argument("--dtype", default="bfloat16", type=_float_dtype,
                 help="--shape's and --model-config's inputs' dtype (FP8 ops: their outputs' default)")
  p.add_argument("--out-dtype", default=None, type=_float_dtype, help="--shape outputs' dtype (default --dtype)")
  p.add_argument("--fp8-dtype", default="float8_e4m3fn", choices=("float8_e4m3fn", "float8_e4m3fnuz"),
                 help="the FP8 ops' inputs' dtype (float8_e4m3fnuz: ROCm's)")
  p.add_argument("--scale", type=_names(tuple(config_table.FP8_RECIPES), "FP8 scale recipes"), metavar="RECIPES",
                 default=[model_shapes.FP8_GMM_RECIPE],
                 help="the scale recipes of --shape's gmm_fp8, gmm_t_fp8 and masked_fp8, comma-separated (each "
                      "tuned; tgmm_fp8's is 128x1)")
  p.add_argument("--fp8", type=_names(tuple(config_table.FP8_RECIPES), "FP8 scale recipes"), metavar="RECIPES",
                 default=[],
                 help="also --model-config's FP8 calls with these scale recipes, comma-separated (1x128-128x128: "
                      "jgmm.fp8_gmm's forward and backward; any: the FP8 forward and masked products)")
  p.add_argument("--ops", type=_names(config_table.OPS, "ops"), default=list(config_table.OPS),
                 help="ops to tune, comma-separated (default: all)")
  p.add_argument("--all", action="store_true", help="retune keys already tuned (in --output or the tables)")
  p.add_argument("--output", help="the table file to write (default: ./<this GPU's table name>)")
  p.add_argument("--profile-file", help="append every candidate's result to this file, one JSON line each")
  p.add_argument("--verbose", action="store_true", help="print every candidate and the worker's log")
  p.add_argument("--timeout", type=float, default=120.0, help="seconds a candidate may take (compile and time)")
  p.add_argument("--backends", type=lambda s: s.split(","), default=["triton", "xla"], help="triton,xla")
  p.add_argument("--space", choices=("small", "full", "none"), default="small",
                 help="the candidate space (none: the heuristic's config, --seed-table's and --candidates' only)")
  p.add_argument("--seed-table", action="append", default=[], type=lambda path: _read_table("--seed-table", path),
                 help="a table file (e.g. another GPU's) whose config for a key is a candidate too (repeatable)")
  p.add_argument("--recheck", metavar="TABLE",
                 help="time TABLE's entries that are not the heuristic's choice against it again; keep or replace")
  p.add_argument("--candidates", type=_read_configs,
                 help="a JSON list of Config objects to screen instead of --space")
  p.add_argument("--finalists", type=int, default=3, help="Triton candidates timed again in the final phase")
  p.add_argument("--err-ratio", type=float, default=4.0,
                 help="reject a candidate whose error vs the xla backend exceeds this x the dtypes' unit roundoff "
                      "(FP8 ops: the output's)")
  p.add_argument("--screen-s", type=float, default=0.01, help="seconds per screening batch")
  p.add_argument("--final-s", type=float, default=0.05, help="seconds per final-phase batch")
  p.add_argument("--sustained-s", type=float, default=0.0, metavar="SECONDS",
                 help="time the final phase's candidates each alone for SECONDS a round (5 rounds), the rate they "
                      "hold under the GPU's power cap, instead of in interleaved batches (default 0: interleaved)")
  p.add_argument("--min-gain", type=float, default=0.01,
                 help="keep the heuristic's config (as the entry) unless the best is faster by more than this")
  p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                 help="processes compiling the candidates of the keys ahead while one is timed (0: none)")
  p.add_argument("--time-limit", type=float,
                 help="seconds: start no key that would end past them (by the longest key so far); rerun to resume")
  args = p.parse_args(argv)
  args.out_dtype = args.out_dtype or args.dtype
  args.recheck_table = _read_table("--recheck", args.recheck) if args.recheck else {}
  if not (args.capture or args.shape or args.model_config or args.recheck):
    p.error("give --capture, --shape, --model-config or --recheck")
  if args.recheck and (args.capture or args.shape or args.model_config):
    p.error("--recheck takes its keys from the table: no --capture, --shape or --model-config with it")
  if args.sustained_s < 0:
    p.error(f"--sustained-s: expected seconds >= 0 (0: interleaved), got {args.sustained_s}")
  return args


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  todo = calls(args)
  worker = Worker(args.verbose)
  try:
    tune(args, todo, worker)
  finally:
    worker.stop()


def tune(args, todo, worker):
  """Tunes the (Key, M) pairs of todo with worker, the largest (in flops) first, writing args.output after each;
  with args.jobs, a Precompiler compiles the candidates of the keys ahead."""
  start = time.monotonic()
  worker.start()
  device = worker.device
  output = args.output or config_table.table_files(device["arch"] or device["platform"], device["kind"])[0]
  table = config_table.read_table(output)
  comment = _comment(output)
  if args.recheck:
    if os.path.abspath(output) == os.path.abspath(args.recheck):
      raise SystemExit("--recheck: --output must be another file than TABLE (a rerun tells the entries rechecked "
                       "by their differing)")
    # To recheck: the entries that are not the heuristic's and not yet rechecked (the same in the output).
    table = args.recheck_table | table
    comment = comment or _comment(args.recheck)
    skipped = [key for key, _ in todo
               if table[key] != args.recheck_table[key] or config_table.is_heuristic(table[key], device["arch"])]
  else:
    tuned = set(table) | set(config_table.active_table(device["arch"], device["kind"]))
    skipped = [key for key, _ in todo if key in tuned and not args.all]
  todo = sorted(((key, m) for key, m in todo if key not in skipped), key=lambda km: -km[1] * km[0].k * km[0].n)
  if args.recheck:
    verb, done_verb, skipped_as = "recheck", "rechecked", "the heuristic's or rechecked"
  else:
    verb, done_verb, skipped_as = "tune", "tuned", "already tuned" + (" (--all retunes them)" if skipped else "")
  print(f"jgmm-tune on {device['gpu']} ({device['platform']}): {len(todo)} keys to {verb}, {len(skipped)} "
        f"{skipped_as}; writing {output}", flush=True)
  profile = open(args.profile_file, "a", buffering=1) if args.profile_file else None
  bar = _progress(len(todo))

  def reporter(key):
    def report(phase, cand, event):
      record = {"key": str(key), "phase": phase, "candidate": cand, **event}
      if profile:
        profile.write(json.dumps(record) + "\n")
      if args.verbose or ("error" in event and phase == "final"):
        (bar.write if bar else print)(json.dumps(record))
    return report

  precompiler = None
  if args.jobs > 0 and device["triton"] and "triton" in args.backends:
    precompiler = Precompiler(args.jobs, device["arch"], args.timeout, args.verbose, worker.command)
    for key, m in todo:
      precompiler.submit(key, m, key_candidates(key, args, device))
  done, longest = 0, 0.0
  try:
    for key, m in todo:
      if args.time_limit is not None and time.monotonic() - start + longest > args.time_limit:
        break
      key_start = time.monotonic()
      if bar:
        bar.set_description(str(key))
      entry = tune_key(worker, key, m, args, reporter(key), precompiler)
      longest = max(longest, time.monotonic() - key_start)
      if entry is None:
        best = "no candidate ran correctly; not written"
      else:
        done += 1
        table[key] = entry
        config_table.write_table(output, table.values(), comment)
        best = f"{entry.backend} {entry.us:.1f} us {entry.tflops:.2f} TFLOP/s {entry.config or ''}"
      if bar:
        bar.set_postfix_str(f"last: {best}")
        bar.update()
      else:
        print(f"{key}: {best}", flush=True)
  finally:
    if bar:
      bar.close()
    if precompiler:
      precompiler.stop()
    if profile:
      profile.close()
  total = len(skipped) + len(todo)
  finished = len(skipped) + done
  print(f"{done_verb} {finished} of {total} keys{'' if finished == total else '; rerun to resume'}"
        f" ({time.monotonic() - start:.0f} s)", flush=True)


if __name__ == "__main__":
  main()
