#!/usr/bin/env bash
# CPU seconds spent by the client (`chidori run` and the program) and by a --secure server
# (its workers included, reaped) for bench/tls_loopback.c over TLS, 200 small calls and
# 1 GiB each way, three runs for each build given. On a machine whose cores the client,
# the server and the emulated GPU share, the CPU a copy costs tells builds apart where
# their throughput does not.
#
#   bash bench/tls_cpu.sh DIST...      (e.g. an older build copied aside, and target/dist)
set -u
cd "$(dirname "$0")/.."
gcc -O2 -Itarget/cuda-headers/13.0/include -Iheaders/stub bench/tls_loopback.c \
  -L"$1/lib" -l:libcudart.so.13 -o /tmp/tls_loopback.$$ || exit 1
# CPU seconds of a process and of its children it reaped (utime, stime, cutime, cstime).
cpu() { awk '{print ($14 + $15 + $16 + $17) / 100}' "/proc/$1/stat"; }
for d in "$@"; do
  w=$(mktemp -d)
  XDG_CONFIG_HOME=$w "$d/bin/chidori" serve --backend emulated --bind 127.0.0.1 --port 0 --secure > "$w/tls.log" 2>&1 &
  server=$!
  sleep 2
  address=$(grep -o '127.0.0.1:[0-9]*' "$w/tls.log" | head -1)
  for r in 1 2 3; do
    before=$(cpu $server)
    out=$( { /usr/bin/time -f "client_cpu %U %S" "$d/bin/chidori" run -s "$address" --token "$(cat "$w/chidori/token")" \
      -- /tmp/tls_loopback.$$ 200 1024; } 2>&1 | tail -2 | tr '\n' ' ')
    sleep 0.5
    echo "$d run $r: $out server_cpu $(awk -v a="$(cpu $server)" -v b="$before" 'BEGIN {print a - b}')"
  done
  kill $server
  rm -rf "$w"
done
rm -f /tmp/tls_loopback.$$
