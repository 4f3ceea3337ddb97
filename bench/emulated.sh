#!/usr/bin/env bash
# Run a bench program through Chidori on loopback against the emulated backend (no GPU),
# once per dist, each with a server of its own. Usage:
#   bash bench/emulated.sh NAME DIST [DIST...] [-- ARGS...]
# builds bench/NAME.c and prints "DIST: <its output>" for each dist (target/dist, or an
# older one); ARGS go to the program. PORT: the servers' port (47311).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift
dists=()
while (($#)) && [[ $1 != -- ]]; do dists+=("$1"); shift; done
(($#)) && shift
exe=$(mktemp -d)/$name
gcc -O2 -o "$exe" "bench/$name.c" -Itarget/cuda-headers/13.0/include -Iheaders/stub -Ltarget/dist/lib -l:libcudart.so.13
port=${PORT:-47311}
for dist in "${dists[@]}"; do
  bin=$dist/bin/chidori
  extra=()
  # An older dist's `serve` may lack --insecure.
  "$bin" serve --help | grep -q -- --insecure && extra=(--insecure)
  "$bin" serve --backend emulated --profile worker/profiles/nvidia-h200.json --bind 127.0.0.1 --port "$port" \
    "${extra[@]}" > /dev/null 2>&1 &
  server=$!
  sleep 1.5
  kill -0 "$server" 2>/dev/null || { echo "$dist: its server did not start (port $port taken? set PORT)" >&2; exit 1; }
  echo "$dist: $(timeout 300 "$bin" run -s 127.0.0.1:"$port" -- "$exe" "$@")"
  kill "$server"
  wait "$server" 2>/dev/null || true
done
