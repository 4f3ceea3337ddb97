#!/usr/bin/env bash
# Per-call cost of small asynchronous calls through Chidori on loopback, emulated backend
# (no GPU): 100,000 cudaMemsetAsync and 25,000 cudaEventRecord per round, then a
# synchronize; microseconds per call, client and server pipelined. Usage:
#   bash bench/call_overhead.sh DIST [DIST...]   (a dist: target/dist, or an older one)
# An older dist's `serve` may lack --insecure; it is passed only where the help lists it.
set -euo pipefail
cd "$(dirname "$0")/.."
include=target/cuda-headers/13.0/include
exe=$(mktemp -d)/call_overhead
gcc -O2 -o "$exe" bench/call_overhead.c -I"$include" -Iheaders/stub -Ltarget/dist/lib -l:libcudart.so.13
for dist in "$@"; do
  bin=$dist/bin/chidori
  extra=()
  "$bin" serve --help | grep -q -- --insecure && extra=(--insecure)
  "$bin" serve --backend emulated --profile worker/profiles/nvidia-h200.json --bind 127.0.0.1 --port 45123 \
    "${extra[@]}" > /dev/null 2>&1 &
  server=$!
  sleep 1.5
  rounds=$(CHIDORI_LEARNED=0 timeout 120 "$bin" run -s 127.0.0.1:45123 -- "$exe" | awk '{print $3}' | tr '\n' ' ')
  echo "$dist: $rounds(us per call, per round)"
  kill "$server"
  wait "$server" 2>/dev/null || true
done
