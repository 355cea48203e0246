# On the GPU machine (device tool), from the repo root: Nsight Compute over docs/experiments/grid_l2.py's kernels
# (gmm_ws's forward on persistent grids of fewer SMs), clocks locked at base so that a kernel's cycles compare
# across grids; per kernel its grid, elapsed and active cycles, L2 and DRAM rates and the tensor pipe's share of
# its SMs' active cycles (FMA / (active SM cycles x 2048), the bf16 wgmma peak per SM and cycle).
#   bash docs/experiments/grid_l2.sh [CASE,...] [GRID,...]     (jgmm installed: python -m pip install --no-deps -e .)
# SCRIPT=another script with grid_l2.py's output lines ("CASE: FMA FMA, ...", "profiled I: CASE LABEL", its kernels
# run once each between cudaProfilerStart/Stop): the same table of its kernels, e.g.
#   SCRIPT=docs/experiments/consumer_skew_ab.py bash docs/experiments/grid_l2.sh ncu [CASE,...]
#   (session 46's A/B, removed: git show d20cb15:docs/experiments/consumer_skew_ab.py)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
metrics=gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_active.sum,sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second,launch__grid_size
ncu --clock-control base --profile-from-start off -k regex:"gmm_ws|gmm_kernel|deferred" --metrics $metrics --csv \
  --print-units base python ${SCRIPT:-docs/experiments/grid_l2.py} "$@" > $OUT/grid_l2.csv 2> $OUT/grid_l2.err
grep -i "FMA\|profiled\|error" $OUT/grid_l2.csv $OUT/grid_l2.err | head -20
python - <<'P'
import csv, os, re
lines = open(os.environ["OUT"] + "/grid_l2.csv").read().splitlines()
fma = {m.group(1): int(m.group(2)) for m in map(re.compile(r"(\S+): (\d+) FMA").match, lines) if m}
rows = list(csv.DictReader([l for l in lines if l.startswith('"')]))
by = {}
for r in rows:
  by.setdefault(r["ID"], {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
runs = [m.groups() for m in map(re.compile(r"profiled \d+: (\S+) (.*)").match, lines) if m]
print("| case | run | grid | us | GHz | elapsed cycles | active cycles per program | pipe share of active | L2 TB/s |")
for (name, label), (i, v) in zip(runs, sorted(by.items(), key=lambda x: int(x[0]))):
  grid = v["launch__grid_size"]
  per_prog = v["sm__cycles_active.sum"] / grid
  share = fma[name] / (v["sm__cycles_active.sum"] * 2048)
  us, ghz = v["gpu__time_duration.sum"] / 1e3, v["sm__cycles_elapsed.avg.per_second"] / 1e9
  print(f"| {name} | {label} | {grid:.0f} | {us:.0f} | {ghz:.2f} | {v['sm__cycles_elapsed.max']:.0f} | {per_prog:.0f} "
        f"| {100 * share:.1f}% | {v['lts__t_bytes.sum.per_second'] / 1e12:.2f} |")
P
