# From an Nsight Compute report: $OUT/details.txt (every section, base units) and $OUT/raw.csv (the metrics), and
# the metrics printed a kernel per line. Run by bf16_ncu.sh and fp8_profile.sh on the GPU machine.
#   bash docs/experiments/ncu_tables.sh REPORT.ncu-rep METRICS(comma-separated)
ncu -i "$1" --page details --print-units base > $OUT/details.txt 2>&1
ncu -i "$1" --page raw --csv --metrics "$2" > $OUT/raw.csv 2>&1
python - <<'P'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/raw.csv")))
keep = [i for i, h in enumerate(rows[0]) if h in ("Kernel Name",) or "__" in h]
for r in rows:
  print(" | ".join(r[i][:30] for i in keep))
P
