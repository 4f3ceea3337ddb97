#!/usr/bin/env bash
# Plain TCP against TLS on loopback with the emulated backend: bench/tls_loopback.c
# (5,000 small calls, 1 GiB each way in 256 MiB copies) through a plain server and a
# --secure one, alternately, ROUNDS times (default 3), for each build directory given
# (default target/dist; e.g. an older build copied aside, to compare two builds in turn).
#
#   bash bench/tls_loopback.sh [DIST...]
set -eu
cd "$(dirname "$0")/.."
dists=("$@"); [[ ${#dists[@]} -gt 0 ]] || dists=(target/dist)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
gcc -O2 -Itarget/cuda-headers/13.0/include -Iheaders/stub bench/tls_loopback.c \
  -L"${dists[0]}/lib" -l:libcudart.so.13 -o "$work/tls_loopback"
port() { grep -o '127.0.0.1:[0-9]*' "$1" | head -1; }
declare -A plain tls token
i=0
for d in "${dists[@]}"; do
  mkdir -p "$work/$i"
  "$d/bin/chidori" serve --backend emulated --bind 127.0.0.1 --port 0 > "$work/$i/plain.log" 2>&1 &
  XDG_CONFIG_HOME=$work/$i "$d/bin/chidori" serve --backend emulated --bind 127.0.0.1 --port 0 --secure \
    > "$work/$i/tls.log" 2>&1 &
  i=$((i + 1))
done
sleep 2
for r in $(seq "${ROUNDS:-3}"); do
  i=0
  for d in "${dists[@]}"; do
    p=$(port "$work/$i/plain.log"); t=$(port "$work/$i/tls.log")
    a=$("$d/bin/chidori" run -s "$p" -- "$work/tls_loopback" 5000 1024 2>&1 | tail -1)
    b=$("$d/bin/chidori" run -s "$t" --token "$(cat "$work/$i/chidori/token")" -- "$work/tls_loopback" 5000 1024 2>&1 | tail -1)
    echo "$d round $r plain: $a"
    echo "$d round $r tls:   $b"
    i=$((i + 1))
  done
done
