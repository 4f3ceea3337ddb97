#!/usr/bin/env bash
# Seconds per round of copies into 64 MiB of mapped pinned memory (bench/mapped_copies.c;
# PAGEABLE=1: unregistered memory, the floor), through Chidori on loopback,
# emulated backend (no GPU). Usage:
#   bash bench/mapped_copies.sh DIST [DIST...]   (a dist: target/dist, or an older one)
set -euo pipefail
cd "$(dirname "$0")/.."
include=target/cuda-headers/13.0/include
exe=$(mktemp -d)/mapped_copies
gcc -O2 -o "$exe" bench/mapped_copies.c -I"$include" -Iheaders/stub -Ltarget/dist/lib -l:libcudart.so.13
for dist in "$@"; do
  bin=$dist/bin/chidori
  "$bin" serve --backend emulated --profile worker/profiles/nvidia-h200.json --bind 127.0.0.1 --port 47311 \
    --insecure > /dev/null 2>&1 &
  server=$!
  sleep 1.5
  echo "$dist: $(timeout 300 "$bin" run -s 127.0.0.1:47311 -- "$exe" "${ROUNDS:-10}")"
  kill "$server"
  wait "$server" 2>/dev/null || true
done
