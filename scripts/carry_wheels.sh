#!/usr/bin/env bash
# Here (a machine that reaches PyPI), from the repo root: download the cp312 manylinux x86_64 wheels that the GPU
# machine lacks into .whl/ (ignored by git) and pack them into .whl/part1/, .whl/part2/, ... of < 60 MiB each,
# wheels larger than that split into numbered pieces: the device tool carries 64 MiB per call, the repo included.
#   bash scripts/carry_wheels.sh                  triton 3.9.0 (TRITON=3.x.y for another)
#   JAX=0.12.0.1 bash scripts/carry_wheels.sh     also jax, jaxlib, jax-cuda13-plugin, jax-cuda13-pjrt
#   TRIM=1 bash scripts/carry_wheels.sh           the triton wheel repacked without what an NVIDIA run never loads
#     (the AMD backend's code generator library, CUPTI and Proton's profiler libraries, the instrumentation test
#     library: its Python packages stay, as Triton imports every backend named in its entry points; 272 -> ~112 MiB
#     with LZMA members, which pip reads): 2 device calls instead of 5. Every other file is the wheel's own; RECORD
#     is rewritten without the dropped files.
# Then one device call per part in quick succession (an ignored folder stays on the warm machine), each naming
# only its part in carry; the last part's call runs scripts/gpu_triton39.sh, which joins and installs them all.
# It prints those calls. Each part holds SHA256SUMS of the whole wheels, which gpu_triton39.sh checks.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
git check-ignore -q .whl/part1/x.whl || { echo "add /.whl/ to .gitignore or .git/info/exclude first" >&2; exit 1; }
pkgs=("triton==${TRITON:-3.9.0}")
if [[ -n ${JAX:-} ]]; then
  pkgs+=("jax==$JAX" "jaxlib==$JAX" "jax-cuda13-plugin==$JAX" "jax-cuda13-pjrt==$JAX")
fi
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl/download "${pkgs[@]}"
if [[ -n ${TRIM:-} ]]; then
  python3 - <<'EOF'
import csv, io, pathlib, zipfile

DROP = ("triton/backends/amd/lib/libtriton_amd_codegen.so", "triton/backends/nvidia/lib/cupti", "triton/_C/libproton",
        "triton/instrumentation/")
(wheel,) = pathlib.Path(".whl/download").glob("triton-*.whl")
trimmed = wheel.with_suffix(".trim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_LZMA) as dst:
  for info in src.infolist():
    if info.filename.startswith(DROP):
      continue
    data = src.read(info)
    if info.filename.endswith(".dist-info/RECORD"):
      rows = [r for r in csv.reader(io.StringIO(data.decode())) if r and not r[0].startswith(DROP)]
      out = io.StringIO()
      csv.writer(out, lineterminator="\n").writerows(rows)
      data = out.getvalue().encode()
    dst.writestr(info, data, compress_type=zipfile.ZIP_LZMA)
trimmed.replace(wheel)
print(f"{wheel.name}: trimmed to {wheel.stat().st_size / 2**20:.1f} MiB")
EOF
fi
python3 - <<'EOF'
import hashlib, pathlib, shutil

PART_LIMIT = 60 * 2**20  # bytes per part folder
PIECE = 56 * 2**20  # bytes per piece of a split wheel, leaving room for the checksums and small wheels
root = pathlib.Path(".whl")
wheels = sorted((root / "download").glob("*.whl"))
sums = "".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels)
pieces = []  # (name in its part, bytes)
for w in wheels:
  data = w.read_bytes()
  if len(data) <= PIECE:
    pieces.append((w.name, data))
  else:
    count = -(-len(data) // PIECE)
    pieces += [(f"{w.name}.piece{i + 1:02d}of{count:02d}", data[i * PIECE:(i + 1) * PIECE]) for i in range(count)]
parts = []  # first fit, largest first
for name, data in sorted(pieces, key=lambda p: -len(p[1])):
  part = next((p for p in parts if sum(len(d) for _, d in p) + len(data) + len(sums) <= PART_LIMIT), None)
  if part is None:
    part = []
    parts.append(part)
  part.append((name, data))
for i, part in enumerate(parts, 1):
  folder = root / f"part{i}"
  folder.mkdir()
  (folder / "SHA256SUMS").write_text(sums)
  for name, data in part:
    (folder / name).write_bytes(data)
  size = sum(f.stat().st_size for f in folder.iterdir())
  assert size < PART_LIMIT, folder
  print(f"{folder}: {size / 2**20:.1f} MiB, {', '.join(name for name, _ in part)}")
shutil.rmtree(root / "download")
print(f"\n{len(parts)} device calls, in quick succession (the machine must stay warm between them):")
for i in range(1, len(parts)):
  print(f'  run(carry=[".whl/part{i}"], command="ls .whl")')
print(f'  run(carry=[".whl/part{len(parts)}"], command="bash scripts/gpu_triton39.sh")')
EOF
