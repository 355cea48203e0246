#!/usr/bin/env bash
# On the GPU machine, from the repo root, once every .whl/partN of scripts/carry_wheels.sh has been carried there:
# join the split wheels, check them against SHA256SUMS, install them into /tmp/site (first on PYTHONPATH, so they
# shadow the image's triton / jax), then the GPU tests and a short benchmark under them.
#   bash scripts/gpu_triton39.sh [FOLDER]         FOLDER: where the parts were carried (default .whl)
#   PYTEST_ARGS=... CASES=a,b STEPS=tests|bench bash scripts/gpu_triton39.sh   (PYTEST_ARGS: words without spaces,
#   as scripts/gpu.sh splits them; default -x: the whole suite, the fuzz tests too (32 in 33 s on an H200, session
#   54); with SHARD=0/2 and SHARD=1/2 in two calls, as scripts/gpu.sh says)
# Logs and bench.json go to $OUT/triton-new (never the wheels: $OUT comes back).
set -uo pipefail
src=${1:-.whl}
wheels=/tmp/jgmm-wheels
site=/tmp/site
out=${OUT:-/tmp/jgmm-out}/triton-new
mkdir -p "$out"
rm -rf "$wheels" && mkdir -p "$wheels"
python - "$src" "$wheels" <<'EOF' || exit 1
import collections, hashlib, pathlib, re, shutil, sys

src, dest = map(pathlib.Path, sys.argv[1:])
sums = {}
for f in src.rglob("SHA256SUMS"):
  sums.update(line.split()[::-1] for line in f.read_text().splitlines() if line.strip())
pieces = collections.defaultdict(dict)
for f in src.rglob("*.whl*"):
  match = re.fullmatch(r"(.+\.whl)\.piece(\d+)of(\d+)", f.name)
  if match:
    pieces[match.group(1)][int(match.group(2))] = (f, int(match.group(3)))
  elif f.name.endswith(".whl"):
    shutil.copy(f, dest / f.name)
for name, parts in pieces.items():
  count = next(iter(parts.values()))[1]
  missing = sorted(set(range(1, count + 1)) - set(parts))
  if missing:
    sys.exit(f"{name}: pieces {missing} of {count} were not carried (every .whl/partN needs its own call)")
  with open(dest / name, "wb") as out:
    for i in range(1, count + 1):
      out.write(parts[i][0].read_bytes())
for wheel in sorted(dest.iterdir()):
  digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
  if sums.get(wheel.name) != digest:
    sys.exit(f"{wheel.name}: sha256 {digest} does not match SHA256SUMS ({sums.get(wheel.name)})")
  print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB, sha256 ok")
if not any(dest.iterdir()):
  sys.exit(f"no wheels under {src}")
EOF
python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
  || exit 1
rm -rf "$wheels"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
python -c "import jax, jaxlib, triton; print('triton', triton.__version__, triton.__file__, 'jax', jax.__version__,
  'jaxlib', jaxlib.__version__)" | tee "$out/versions.log"
steps=${STEPS:-tests bench}
if [[ $steps == *tests* ]]; then
  OUT=$out STEPS=tests PYTEST_ARGS=${PYTEST_ARGS:-"-x"} bash scripts/gpu.sh
fi
if [[ $steps == *bench* ]]; then
  python -m jgmm.bench --cases "${CASES:-mixtral8x7b-w1,dsv3-ep8-gateup,dsv3-ep8-down,decode-small}" --out "$out" 2>&1 \
    | tee "$out/bench.log"
fi
