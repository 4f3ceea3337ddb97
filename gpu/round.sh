#!/usr/bin/env bash
# One whole round on the GPU machine, in one device call (binaries come from
# `cargo xtask dist` on the developer machine: carry target/dist).
#
#   bash gpu/round.sh            # writes logs under $OUT, prints a table last
#
# Grows with each issue; today: import torch through the shims, and record the device
# profile for the emulated backend.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/chidori-round}
mkdir -p "$OUT"
DIST=target/dist
export PYTHONUNBUFFERED=1
rows=()

python3 gpu/record_profile.py > "$OUT/h200-profile.json" 2> "$OUT/profile.err" \
  && rows+=("profile|recorded $(python3 -c "import json;d=json.load(open('$OUT/h200-profile.json'));print(len(d['devices'][0]['attributes']),'attributes')")") \
  || rows+=("profile|FAILED: $(tail -1 "$OUT/profile.err")")

python3 - > "$OUT/env.txt" 2>&1 <<'PY'
import torch, subprocess
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print(subprocess.run(["python3", "-m", "pip", "list"], capture_output=True, text=True).stdout)
PY

IMPORT='import time; t=time.time(); import torch, torch.nn; print("available", torch.cuda.is_available(), "import_s", round(time.time()-t, 2))'
native=$(python3 -c "$IMPORT" 2>&1 | tail -1)
remote=$(CHIDORI_LOG=info "$DIST/bin/chidori" run -- python3 -c "$IMPORT" > "$OUT/import-chidori.log" 2>&1; tail -1 "$OUT/import-chidori.log")
rows+=("import torch native|$native")
rows+=("import torch chidori (no server)|$remote")

echo
echo "== chidori GPU round =="
for r in "${rows[@]}"; do printf '%-34s %s\n' "${r%%|*}" "${r#*|}"; done
