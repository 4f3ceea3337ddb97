#!/usr/bin/env bash
# One whole round on the GPU machine, in one device call. Binaries come from the developer
# machine (there is no cargo on the GPU machine):
#
#   ./dev gpu                  (GPU_XTASK=1 ./dev gpu for the `core` stage: xtask instead of
#                               the hostile binary, to stay within the device's 64 MiB)
#   run (device): bash gpu/round.sh [STAGE...]      carry: ["target/dist"]
#   (over the device's 64 MiB: carry ["target/dist.txz"], and run
#    tar -C target -xJf target/dist.txz && bash gpu/round.sh [STAGE...])
#
# Stages (default: core kernels):
#   profile  record the device profile the emulated backend answers from
#   core     version matrix against the real GPU; 4-byte D2H round trip (median, p99 of
#            10,000) and 1 GiB H2D/D2H, native and remote; GPU memory back after SIGKILL
#   kernels  the CUDA suite: native, loopback, 70 ms WAN; the module cache's second run
#            ($SUITE_NAMES: some of its programs; SUITE_CUDART=static: runtime linked statically;
#            SUITE_LOG=debug: each of $SUITE_NAMES again with the client's log at that level)
#   first    `import torch` and the first result read back (round trips, fresh and warm
#            module cache); always first, also run by `torch`
#   torch    the standard workloads and the torch suite, native and remote ($BEFORE_DIST: a
#            dist of an earlier commit, carried too; every workload's remote runs again through it;
#            SUITE_BEFORE=1: the torch suite too)
#   waits    every round trip in order, and cuDNN's descriptor traffic, for the workloads'
#            70 ms arguments (CHIDORI_LOG trace), on loopback
#   calls    decode with the dynamic cache, 100 and 200 tokens, native and through a server
#            that logs the time it spent in each library function (chidori::calls=debug)
#   learned  cuDNN finalizes answered from an earlier session (CHIDORI_LEARNED_CUDNN=1): the
#            torch suite's cuDNN cases ($LEARNED_CASES) at 70 ms, twice with one fresh client
#            cache, then decode with the dynamic cache (4 layers) learning 32 tokens, and again
#            with 8 and 32: values against native, round trips, per token once running
#            (LEARNED_CASES=none: decode only)
#   casetrace  each of $CASES (torch suite cases) alone on loopback: its round trips by
#            function and in order (CASETRACE_WAN=1: through the 70 ms relay, with learned
#            answers; CASETRACE_RUNS=N: N runs in one client cache, the last one traced;
#            CASETRACE_LOG: the client's log filter besides the waits, e.g. chidori::custom::cudnn=debug;
#            $BEFORE_DIST: each case through the earlier commit's server too)
#   repeat   decode with the dynamic cache through chidori $REPEAT times in each of
#            $REPEAT_MODES (plain, mcheck, nocudnn): hunting an intermittent client abort
#   repro    each step of gpu/opinfo/repro.py ($REPRO_STEPS: all) in its own process, native
#            and remote; remotely also through a server run with CUDA_LAUNCH_BLOCKING=1 that
#            logs every call (a fault is reported by the call that made it)
#   wheel    the wheel in target/wheels (carry it too), installed with pip --target: a torch
#            smoke test and the standard workloads (quick, loopback) with server and client
#            from the installed package
#   optimize server-side decode (gpu/decode/generate_cases.py): native generate, the native
#            CUDA-graph replay reference (decode.py --mode graph), and through chidori with
#            chidori.optimize() (loopback and 70 ms) and with `chidori run --optimize`
#            (loopback); $DECODE_CASES narrows the cases, $DECODE_RUNS the runs (native
#            lo-api lo-cli wan-api wan-cli); $DECODE_TRACE names a case whose waits are traced
#            (with chidori.optimize(), or plain generate where $DECODE_TRACE_OPTIMIZE=none)
#   resume   the training workload natively, then remotely through gpu/tools/cut_relay.py,
#            which cuts the connection $RESUME_CUTS times (every $RESUME_EVERY s): a
#            resumable session must give the native losses (RESUME_WAN=1: through the 70 ms
#            relay behind the cutting one)
#   copies   bulk copies at 70 ms and $COPY_MBIT (1000) Mbit/s through gpu/tools/wan_relay.py:
#            what the relay carries alone, then 1 GiB each way, as fractions of the cap, of
#            each $COPY_DATA (random: incompressible; relu: half-zero activations)
#   content  a 2 GB checkpoint (safetensors and torch.save) loaded natively, then twice
#            through a server with a fresh content store at 70 ms and $CONTENT_MBIT Mbit/s:
#            the second run should send hashes, not bytes (bytes sent from the trace)
#   nccl     torch.distributed over NCCL (gpu/distributed/allreduce.py): one rank, or
#            $NCCL_RANKS through torchrun; all-reduce and DDP steps native and remote
#   libs     JAX, CuPy, pynvml, numba-cuda, cuda-python, torch 2:4 sparsity, CTC, expandable segments, CUDA IPC,
#            the profiler and cudnn.benchmark (gpu/libs/*_smoke.py;
#            $LIBS narrows): native and loopback values equal; without $LIBS also nvidia-smi's GPU facts (name, UUID, bus, memory, driver),
#            the server's nvidia-smi run by the session
#   tls      a second server that requires TLS and its token (--secure, here on loopback)
#            against the plain one, alternately: gpu/bench/escape.c (copies that must be
#            refused: native, plain, TLS), the small-call round trip and 1 GiB copies (rtt,
#            $TLS_TRIES times each; over TLS once per lane count in $TLS_LANES, e.g. "8 4"),
#            the training workload; then the torch suite over TLS
#            ($TLS_SUITE=0: not; $TLS_SUITE_TIMEOUT)
#            ($TLS_CPU=1: CPU seconds per thread in the 1 GiB copies, gpu/tools/thread_cpu.py)
#   wire     what bounds a bulk copy on this machine (gpu/bench/wire.cu): loopback TCP with
#            1/2/4 connections, 8 MiB chunks to and from the GPU; then rtt's copies through chidori
#            without and with bulk lanes (CHIDORI_LANES=0, 4), twice each
#   samples  NVIDIA's CUDA samples (gpu/samples/samples.py; carry target/cuda-samples.txz, made
#            here by `python3 gpu/samples/samples.py pack`): built as their CMake files say,
#            runtime linked statically ($SAMPLES_CUDART=shared: not), native and loopback
#            compared ($SAMPLES_WAN=1: also at 70 ms; $SAMPLES_ONLY=a,b narrows;
#            $SAMPLES_TIMEOUT per run, $SAMPLES_PARALLEL at once; $SAMPLES_TRACE: each of these
#            names again with CHIDORI_TRACE (its table); $SAMPLES_LOG: each of
#            $SAMPLES_LOG_NAMES or $SAMPLES_ONLY again alone, server and client logging at
#            that filter); a warm machine keeps the build
#   hostile  every call descriptor with NULL pointers against the real libraries (the worker's
#            hostile test binary, built by ./dev gpu); $HOSTILE_TIMEOUT, $HOSTILE_STUCK seconds
#   opinfo   PyTorch's operator database natively and remotely, compared (gpu/opinfo/):
#            $OPINFO_JOBS processes per run, $OPINFO_TOTAL seconds, $OPINFO_OPS or
#            $OPINFO_FIRST to narrow it, OPINFO_TWICE=1 for a second native run
# The standard workloads and the WAN relay come from ../shared (copied into target/dist by
# `cargo xtask dist`, since only the repository travels). Logs go to $LOGS, packed into
# $OUT/round-logs-STAGES.tgz at the end (the device tool returns at most 8 files); a table last.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOGS=${LOGS:-/tmp/chidori-round}
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY_DIR=${OUT:-$LOGS}
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(core kernels)
# Named by the stages, so rounds run one after another in one device call keep their files.
TAG=$(IFS=-; echo "${stages[*]}")
ROWS=$SUMMARY_DIR/rows-$TAG.txt
PACK=$SUMMARY_DIR/round-logs-$TAG.tgz
rm -f "$ROWS"
DIST=$ROOT/target/dist
SHARED=$DIST/shared
[[ -d $SHARED ]] || SHARED=$ROOT/../shared
CHIDORI=$DIST/bin/chidori
PORT=43211
WAN_PORT=43300
SERVER=127.0.0.1:$PORT
export PYTHONUNBUFFERED=1
NVCC=${NVCC:-/usr/local/cuda-13.0/bin/nvcc}
B=${BUILD_DIR:-/tmp/chidori-build}
mkdir -p "$B"
rows=()
# Each row also goes to $OUT/rows-STAGES.txt at once, and the logs are packed again after every
# row: a round cut short by the device's time limit still returns what it measured.
row() {
  rows+=("$1|$2")
  echo "[round] $1: $2"
  printf '%-26s %s\n' "$1" "$2" >> "$ROWS"
  tar czf "$PACK" -C "$LOGS" --exclude='*.bin' . 2>/dev/null
}
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }

# The server, with its own module cache, for the whole round.
CACHE=$B/module-cache
rm -rf "$CACHE"
CHIDORI_LOG=${SERVE_LOG:-info} "$CHIDORI" serve --bind 127.0.0.1 --port $PORT --module-cache "$CACHE" > "$LOGS/serve.log" 2>&1 &
SERVE_PID=$!
python3 "$SHARED/tools/wan_delay.py" --listen 127.0.0.1:$WAN_PORT --target $SERVER --rtt-ms 70 \
  --max-seconds 3000 > "$LOGS/wan.log" 2>&1 &
WAN_PID=$!
# BEFORE_DIST (target/dist of an earlier commit, carried too): its own server and 70 ms
# relay, and the torch stage's workloads run through it as well (before and after).
BEFORE_PIDS=()
before_args=()
if [[ -n ${BEFORE_DIST:-} ]]; then
  BEFORE_PORT=43213
  BEFORE_WAN_PORT=43301
  "$BEFORE_DIST/bin/chidori" serve --bind 127.0.0.1 --port $BEFORE_PORT > "$LOGS/serve-before.log" 2>&1 &
  BEFORE_PIDS+=($!)
  python3 "$SHARED/tools/wan_delay.py" --listen 127.0.0.1:$BEFORE_WAN_PORT --target 127.0.0.1:$BEFORE_PORT \
    --rtt-ms 70 --max-seconds 3000 > "$LOGS/wan-before.log" 2>&1 &
  BEFORE_PIDS+=($!)
  before_args=(--before-chidori "$BEFORE_DIST/bin/chidori" --before-server 127.0.0.1:$BEFORE_PORT
    --before-wan-server 127.0.0.1:$BEFORE_WAN_PORT)
fi
# The table and the log tarball come out even when an outer timeout stops the round.
finish() {
  kill $SERVE_PID $WAN_PID "${BEFORE_PIDS[@]}" 2>/dev/null
  grep -E "WARN|ERROR" "$LOGS/serve.log" | sort | uniq -c | sort -rn | head -15 > "$LOGS/serve-warnings.txt"
  echo
  echo "== chidori GPU round ($(date -u +%F), stages: ${stages[*]}) =="
  for r in "${rows[@]}"; do printf '%-26s %s\n' "${r%%|*}" "${r#*|}"; done
  echo "-- server warnings (count, first 15):"
  cat "$LOGS/serve-warnings.txt"
  tar czf "$PACK" -C "$LOGS" --exclude='*.bin' . 2>/dev/null
}
trap finish EXIT
trap 'exit 124' TERM INT
sleep 1
kill -0 $SERVE_PID 2>/dev/null || { echo "chidori serve did not start:"; cat "$LOGS/serve.log"; exit 1; }

if want first || want torch; then
  # `import torch` makes no call; the first result read back, on a fresh server (the fill
  # kernel's module goes with its load) and again (the module cache has it). Runs before
  # every other stage, so the server is fresh; the client's record of what the server
  # holds is kept in a directory of its own for the round.
  export XDG_CACHE_HOME=$B/client-cache
  rm -rf "$XDG_CACHE_HOME"
  "$CHIDORI" run --trace -s $SERVER -- python3 -c "import torch, torch.nn" > "$LOGS/import.txt" 2>&1
  row "import torch" "$(grep -q TOTAL "$LOGS/import.txt" && grep TOTAL "$LOGS/import.txt" | tr -s ' ' || echo "no call")"
  for n in 1 2; do
    "$CHIDORI" run --trace -s $SERVER -- python3 -c "import torch; print(torch.ones(1, device='cuda').item())" \
      > "$LOGS/first-$n.txt" 2>&1
    row "first result (run $n)" "$(grep -q '^1.0' "$LOGS/first-$n.txt" && echo ok || echo FAILED); $(grep TOTAL "$LOGS/first-$n.txt" | awk '{print $2" calls, "$3" round trips"}'); $(grep -E '^\(module load\)' "$LOGS/first-$n.txt" | awk '{print $5" bytes uploaded"}')"
  done
fi

nv() { "$NVCC" -arch=sm_90 -O2 -cudart shared -Xlinker -rpath -Xlinker /usr/local/cuda-13.0/lib64 "$@"; }

if want profile; then
  python3 gpu/record_profile.py > "$LOGS/h200-profile.json" 2> "$LOGS/profile.err" \
    && row profile "recorded" || row profile "FAILED: $(tail -1 "$LOGS/profile.err")"
fi

if want core; then
  # The version matrix: prebuilt C programs (one per CUDA version) against the real GPU.
  if [[ -x $DIST/bin/xtask && -d $DIST/matrix ]]; then
    # Checked against this GPU's profile, recorded natively (UUIDs differ between machines).
    [[ -s $LOGS/h200-profile.json ]] || python3 gpu/record_profile.py > "$LOGS/h200-profile.json" 2> "$LOGS/profile.err"
    timeout ${MATRIX_TIMEOUT:-300} "$DIST/bin/xtask" matrix --prebuilt --dir "$DIST/matrix" --server $SERVER --chidori "$CHIDORI" \
      --profile "$LOGS/h200-profile.json" \
      > "$LOGS/matrix.txt" 2>&1
    rc=$?
    cat "$LOGS/matrix.txt"
    row "matrix (real H200)" "$( ((rc == 0)) && echo "all versions pass" || echo "FAILED rc=$rc (matrix.txt)")"
  else
    row "matrix (real H200)" "SKIPPED: no prebuilt matrix in target/dist"
  fi

  nv gpu/bench/rtt.cu -o "$B/rtt" && nv gpu/bench/hold.cu -o "$B/hold" || row bench "BUILD FAILED"
  "$B/rtt" > "$LOGS/rtt-native.json" 2> "$LOGS/rtt-native.err"; row "rtt+copy native" "$(cat "$LOGS/rtt-native.json")"
  timeout ${RTT_TIMEOUT:-300} "$CHIDORI" run -s $SERVER -- "$B/rtt" > "$LOGS/rtt-remote.json" 2> "$LOGS/rtt-remote.err"
  row "rtt+copy loopback" "$(cat "$LOGS/rtt-remote.json") $(tail -1 "$LOGS/rtt-remote.err")"
  timeout 60 "$CHIDORI" run -s 127.0.0.1:$WAN_PORT -- "$B/rtt" 50 0 > "$LOGS/rtt-wan.json" 2> "$LOGS/rtt-wan.err"
  row "rtt+copy wan70" "$(cat "$LOGS/rtt-wan.json") $(tail -1 "$LOGS/rtt-wan.err")"

  # SIGKILL a client holding 8 GiB; how long until the GPU has the memory back.
  "$CHIDORI" run -s $SERVER -- "$B/hold" 8 > "$LOGS/hold.out" 2>&1 &
  HOLD=$!
  for _ in $(seq 600); do grep -q ready "$LOGS/hold.out" && break; sleep 0.1; done
  if grep -q ready "$LOGS/hold.out"; then
    row "sigkill release (8 GiB)" "$(python3 gpu/bench/kill_release.py $HOLD 8)"
  else
    kill -9 $HOLD 2>/dev/null
    row "sigkill release (8 GiB)" "FAILED: hold never ready: $(tail -2 "$LOGS/hold.out")"
  fi
  wait $HOLD 2>/dev/null
fi

if want kernels; then
  # SUITE_NAMES narrows the suite to some of its programs ("fft rand", or "fft,rand").
  suite_list=${SUITE_NAMES:-}
  read -r -a suite_names <<< "${suite_list//,/ }"
  suite_only=()
  for name in "${suite_names[@]}"; do suite_only+=(--only "$name"); done
  # SUITE_CUDART=static links the runtime statically (nvcc's default): the program then
  # reaches the driver only, through cudart's private tables (cuGetExportTable).
  cudart=${SUITE_CUDART:-shared}
  suite_dir=$B/suite; [[ $cudart == shared ]] || suite_dir=$B/suite-$cudart
  BUILD_DIR=$suite_dir CUDART=$cudart NVCC=$NVCC bash gpu/cuda-suite/build.sh "${suite_names[@]}" > "$LOGS/suite-build.txt" 2>&1 \
    || row "cuda suite build" "FAILED: $(grep FAILED "$LOGS/suite-build.txt" | head -3 | tr '\n' ' ')"
  # Each failed program's compiler output travels with the logs.
  for log in $(awk '$1 == "FAILED" {print $NF}' "$LOGS/suite-build.txt"); do
    [[ -f $log ]] && cp "$log" "$LOGS/suite-build-$(basename "$(dirname "$log")").log"
  done
  timeout ${SUITE_TOTAL:-540} python3 gpu/cuda-suite/run.py --build-dir "$suite_dir" --chidori "$CHIDORI" --server $SERVER \
    --wan-server 127.0.0.1:$WAN_PORT --json "$LOGS/suite.json" --timeout ${SUITE_RUN_TIMEOUT:-90} \
    "${suite_only[@]}" > "$LOGS/suite.txt" 2>&1
  rc=$?
  cat "$LOGS/suite.txt"
  row "cuda suite ($cudart cudart)" "$( ((rc == 0)) && echo "all match (suite.txt)" || echo "MISMATCHES rc=$rc (suite.txt)")"
  # SUITE_LOG (a CHIDORI_LOG filter, e.g. debug): each of $SUITE_NAMES once more on loopback
  # with the client's log at that level; its last lines here, the whole log with the logs.
  if [[ -n ${SUITE_LOG:-} ]]; then
    for name in "${suite_names[@]}"; do
      CHIDORI_LOG=$SUITE_LOG timeout ${SUITE_RUN_TIMEOUT:-90} "$CHIDORI" run -s $SERVER -- "$suite_dir/$name" \
        > "$LOGS/suite-log-$name.txt" 2>&1
      echo "== $name with CHIDORI_LOG=$SUITE_LOG (rc $?), last lines:"
      tail -n ${SUITE_LOG_LINES:-40} "$LOGS/suite-log-$name.txt" | cut -c1-240
    done
  fi
  # The module cache: a fresh client process whose modules the server already has.
  if [[ -x $suite_dir/params ]]; then
    "$CHIDORI" run --trace -s $SERVER -- "$suite_dir/params" > /dev/null 2> "$LOGS/second-run-trace.txt"
    row "second run uploads" "$(grep -i "module" "$LOGS/second-run-trace.txt" | tr -s ' ' | tr '\n' ';')"
  fi
fi

if want calls; then
  # Where a remote run's time goes on the server: the library time per function, per session.
  CALLS_PORT=43212
  CHIDORI_LOG=info,chidori::calls=debug "$CHIDORI" serve --bind 127.0.0.1 --port $CALLS_PORT \
    --module-cache "$CACHE" > "$LOGS/serve-calls.log" 2>&1 &
  CALLS_PID=$!
  sleep 1
  for n in ${CALLS_TOKENS:-100 200}; do
    args=("$SHARED/workloads/decode.py" --cache dynamic --new-tokens "$n")
    timeout ${RUN_TIMEOUT:-150} python3 "${args[@]}" > "$LOGS/calls-native-$n.out" 2>&1
    timeout ${RUN_TIMEOUT:-150} "$CHIDORI" run --trace -s 127.0.0.1:$CALLS_PORT -- python3 "${args[@]}" \
      > "$LOGS/calls-remote-$n.out" 2> "$LOGS/calls-remote-$n.err"
    secs() { grep -o '"seconds": [0-9.]*' "$1" | head -1 | awk '{print $2}'; }
    row "calls dynamic $n tokens" "native $(secs "$LOGS/calls-native-$n.out") s, remote $(secs "$LOGS/calls-remote-$n.out") s"
  done
  kill $CALLS_PID 2>/dev/null; wait $CALLS_PID 2>/dev/null
  grep -E "chidori::calls" "$LOGS/serve-calls.log" | sed -E 's/^.*chidori::calls: //' | grep -v "^ *$" \
    | grep -v "^module " | head -90
  echo "-- the slowest module loads (bytes, kernels, ms):"
  grep -oE "module [0-9a-f]+ loaded: .*" "$LOGS/serve-calls.log" | sort -t, -k3 -rn | head -8
fi

if want repeat; then
  # REPEAT_MODES: plain | mcheck (glibc's malloc checks: an abort nearer the corruption) |
  # nocudnn (torch's cuDNN attention backend off: is the cuDNN path involved?)
  wrapper='import runpy, sys, torch; torch.backends.cuda.enable_cudnn_sdp(False); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")'
  for mode in ${REPEAT_MODES:-plain}; do
    ok=0; n=${REPEAT:-3}
    for i in $(seq "$n"); do
      envs=(); py=(python3 -X faulthandler)
      [[ $mode == mcheck ]] && envs=(LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0 MALLOC_CHECK_=3)
      [[ $mode == nocudnn ]] && py=(python3 -X faulthandler -c "$wrapper")
      env "${envs[@]}" timeout ${RUN_TIMEOUT:-150} "$CHIDORI" run -s $SERVER -- "${py[@]}" \
        "$SHARED/workloads/decode.py" --cache dynamic > "$LOGS/repeat-$mode-$i.out" 2> "$LOGS/repeat-$mode-$i.err"
      grep -q '"tokens"' "$LOGS/repeat-$mode-$i.out" && ok=$((ok + 1))
      grep -m1 '"tokens"' "$LOGS/repeat-$mode-$i.out" | cut -c1-150
      grep -m3 -E "malloc|free\(\)|corrupt|Error" "$LOGS/repeat-$mode-$i.err"
    done
    row "decode dynamic $mode" "$ok of $n passed (repeat-$mode-*.err)"
  done
fi

if want waits; then
  # Every round trip in order, and cuDNN's descriptor traffic, for the 70 ms arguments of the
  # workloads (run on loopback: the calls are the same, the waiting is not).
  for spec in "train:train.py --dtype fp16 --steps 12 --log-every 6" \
      "static:decode.py --cache static --layers 4 --new-tokens 8" \
      "dynamic:decode.py --cache dynamic --layers 4 --new-tokens 8"; do
    name=${spec%%:*}; args=(${spec#*:}); script=$SHARED/workloads/${args[0]}
    CHIDORI_LOG=warn,chidori::waits=trace,chidori::custom::cudnn=trace timeout ${RUN_TIMEOUT:-150} \
      "$CHIDORI" run -s $SERVER -- python3 "$script" "${args[@]:1}" > "$LOGS/waits-$name.out" 2> "$LOGS/waits-$name.err"
    echo "== $name: $(grep -cE 'TRACE [A-Za-z_0-9]+ -> ' "$LOGS/waits-$name.err") round trips; the last 120, in order:"
    grep -E 'TRACE [A-Za-z_0-9]+ -> ' "$LOGS/waits-$name.err" | tail -120 | awk '{print $2}' | uniq -c | head -60
    echo "-- cuDNN gets (descriptor type, attribute, type, requested>0), finalizes and creates that wait:"
    grep -E "TRACE (get|set|finalize|create):" "$LOGS/waits-$name.err" \
      | sed -E 's/descriptor 0x[0-9a-f]+ /descriptor /; s/requested [1-9][0-9]*/requested N/; s/[0-9]+ elements/N elements/; s/-> .*//' | sort | uniq -c | sort -rn | head -40
    row "waits $name" "$(grep -cE 'TRACE [A-Za-z_0-9]+ -> ' "$LOGS/waits-$name.err") round trips (waits-$name.err)"
  done
fi

if want learned; then
  # The first run learns, the second answers cuDNN's finalizes from it (every call still
  # made on the server and its answer checked): same values, fewer round trips.
  lcache=$(mktemp -d)
  trips() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); t=[l for run in r.get('runs', []) if run.get('label','').startswith('wan') for l in run.get('stderr_tail', []) if l.startswith('TOTAL')]; print(t[-1].split()[2] if t else '?')" "$1" 2>/dev/null; }
  # LEARNED_CASES=all: the whole suite (each case against native + syncs × RTT + 10 RTT).
  only=(--only "${LEARNED_CASES:-conv_cudnn,cnn_training,lstm,sdpa_backends}")
  [[ ${LEARNED_CASES:-} == all ]] && only=()
  runs=(first second)
  # LEARNED_CASES=none: decode only.
  [[ ${LEARNED_CASES:-} == none ]] && runs=()
  for run in "${runs[@]}"; do
    CHIDORI_LEARNED_CUDNN=1 CHIDORI_TRACE=- XDG_CACHE_HOME=$lcache timeout ${LEARNED_TIMEOUT:-240} python3 gpu/torch-suite/compare.py \
      --chidori "$CHIDORI" --server $SERVER --wan-server 127.0.0.1:$WAN_PORT --wan-only \
      "${only[@]}" --json "$LOGS/learned-$run.json" > "$LOGS/learned-$run.txt" 2>&1
    rc=$?
    sed -n '/^case  *native s/,$p' "$LOGS/learned-$run.txt" | tail -40
    row "learned cuDNN cases, $run run" "rc=$rc, round trips $(trips "$LOGS/learned-$run.json"); $(grep 'within the bound' "$LOGS/learned-$run.txt") (learned-$run.txt)"
  done
  # Decode (LEARNED_DECODE=0: not): the first run learns 32 tokens' graphs; the second runs
  # 8 and 32 tokens, whose difference is the round trips of 24 tokens once running (target:
  # 1.05 per token).
  if [[ ${LEARNED_DECODE:-1} == 1 ]]; then
    base=("$SHARED/workloads/decode.py" --cache dynamic --layers 4)
    declare -A rts
    for run in first:32 second:8 second:32; do
      label=${run%%:*}; n=${run#*:}
      timeout ${RUN_TIMEOUT:-150} python3 "${base[@]}" --new-tokens $n > "$LOGS/learned-decode-native-$n.out" 2>&1
      # LEARNED_LOG: the client's log filter for these runs (what still waits:
      # chidori::custom::cudnn=debug names each cuDNN get that asks the server).
      CHIDORI_LOG=${LEARNED_LOG:-warn} CHIDORI_LEARNED_CUDNN=1 XDG_CACHE_HOME=$lcache timeout ${RUN_TIMEOUT:-150} \
        "$CHIDORI" run --trace -s 127.0.0.1:$WAN_PORT -- \
        python3 "${base[@]}" --new-tokens $n > "$LOGS/learned-decode-$label-$n.out" 2> "$LOGS/learned-decode-$label-$n.err"
      same=$(cmp -s <(grep -o '"tokens": \[[^]]*\]' "$LOGS/learned-decode-native-$n.out") \
        <(grep -o '"tokens": \[[^]]*\]' "$LOGS/learned-decode-$label-$n.out") && echo "native's tokens" || echo "TOKENS DIFFER")
      rts[$label-$n]=$(grep TOTAL "$LOGS/learned-decode-$label-$n.err" | awk '{print $3}')
      row "learned decode dynamic, $label run, $n tokens" "$same, ${rts[$label-$n]} round trips, \
$(grep -c 'answered differently' "$LOGS/learned-decode-$label-$n.err") mismatches"
    done
    # Per token: the round trips waited at the timed generate's own line (the trace's
    # table by source line), 32 tokens against 8. The processes' totals differ by more
    # than the tokens (module loads, learning), so their difference is shown beside it only.
    at_generate() { awk '/min_new_tokens=n/ {s += $1} END {print s + 0}' "$LOGS/learned-decode-second-$1.err"; }
    row "learned decode dynamic, round trips per token once running" \
      "$(awk -v a="$(at_generate 32)" -v b="$(at_generate 8)" 'BEGIN {printf "%.2f", (a - b) / 24}') at generate's line \
($(at_generate 8) for 8 tokens, $(at_generate 32) for 32); whole processes' difference / 24: \
$(awk -v a="${rts[second-32]:-0}" -v b="${rts[second-8]:-0}" 'BEGIN {printf "%.2f", (a - b) / 24}')"
  fi
  rm -rf "$lcache"
fi

if want casetrace; then
  # Where a torch suite case's round trips go: each of $CASES alone on loopback, with
  # --trace (the functions that waited most) and the order of its round trips; with
  # $BEFORE_DIST, each case again through the earlier commit's server (rows "... before").
  lanes=("now|$CHIDORI|$SERVER|127.0.0.1:$WAN_PORT")
  # (A $BEFORE_DIST of the server alone, without lib/: this commit's client against it.)
  before_client=${BEFORE_DIST:-}/bin/chidori
  [[ -e ${BEFORE_DIST:-}/lib/libchidori.so ]] || before_client=$CHIDORI
  [[ -n ${BEFORE_DIST:-} ]] && lanes+=("before|$before_client|127.0.0.1:$BEFORE_PORT|127.0.0.1:$BEFORE_WAN_PORT")
  for c in ${CASES:-lstm cuda_graph elementwise_reductions sdpa_backends cnn_training}; do
    for lane in "${lanes[@]}"; do
      IFS='|' read -r label bin plain wan <<< "$lane"
      trace_target=$plain
      [[ ${CASETRACE_WAN:-0} == 1 ]] && trace_target=$wan
      trace_cache=$(mktemp -d)
      name=$c; [[ $label == before ]] && name=$c-before
      # Each run's round trips (the last run's log is kept).
      per_run=""
      for _ in $(seq 1 ${CASETRACE_RUNS:-1}); do
        CHIDORI_LOG=${CASETRACE_LOG:-warn},chidori::waits=trace CHIDORI_LEARNED_CUDNN=1 XDG_CACHE_HOME=$trace_cache \
          timeout ${RUN_TIMEOUT:-150} "$bin" run --trace -s $trace_target -- \
          python3 gpu/torch-suite/run_cases.py --only "$c" > "$LOGS/case-$name.out" 2> "$LOGS/case-$name.err"
        per_run+="$(grep TOTAL "$LOGS/case-$name.err" | awk '{print $3}') "
      done
      echo "== case $name: rc=$?; functions by round trips:"
      grep -E '^[A-Za-z(].* [0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+$' "$LOGS/case-$name.err" | sort -k3 -nr | head -12
      echo "-- the round trips in order (runs of one function counted):"
      grep -E 'TRACE [A-Za-z_0-9]+ -> ' "$LOGS/case-$name.err" | awk '{print $2}' | uniq -c | sort -rn | head -12
      # With chidori::custom::cudnn=debug in $CASETRACE_LOG: why the last run's waiting
      # finalizes were not answered as before (nothing prints without it).
      grep -o 'finalize: descriptor type [0-9]*, [0-9]* calls ahead; learned: .*' "$LOGS/case-$name.err" \
        | sed 's/, [0-9]* calls ahead//' | sort | uniq -c | sort -rn | head -8
      load=$(grep -E '^\(module load\) ' "$LOGS/case-$name.err" | awk '{print $NF}')
      row "case $name" "$(grep TOTAL "$LOGS/case-$name.err" | awk '{print $2" calls, "$3" round trips, "$NF" ms waiting"}'), module load ${load:-0} ms; round trips by run: ${per_run% }"
      rm -rf "$trace_cache"
    done
  done
fi

if want repro; then
  DBG_PORT=43213
  CUDA_LAUNCH_BLOCKING=1 CHIDORI_LOG=info,chidori::calls=debug "$CHIDORI" serve --bind 127.0.0.1 --port $DBG_PORT \
    --module-cache "$CACHE" > "$LOGS/serve-debug.log" 2>&1 &
  DBG_PID=$!
  sleep 1
  steps=${REPRO_STEPS:-$(python3 -c "import ast,sys; t=ast.parse(open('gpu/opinfo/repro.py').read()); print(' '.join(n.name for n in t.body if isinstance(n, ast.FunctionDef) and any(getattr(d,'id','')=='step' for d in n.decorator_list)))")}
  for s in $steps; do
    n=$(timeout 120 python3 gpu/opinfo/repro.py "$s" 2> "$LOGS/repro-$s-native.err" | head -1)
    r=$(CHIDORI_LOG=warn,chidori::waits=trace timeout 120 "$CHIDORI" run -s $SERVER -- python3 gpu/opinfo/repro.py "$s" \
      2> "$LOGS/repro-$s-remote.err" | head -1)
    d=$(CHIDORI_LOG=warn,chidori::waits=trace timeout 120 "$CHIDORI" run -s 127.0.0.1:$DBG_PORT -- python3 gpu/opinfo/repro.py "$s" \
      2> "$LOGS/repro-$s-debug.err" | head -1)
    row "repro $s" "native [${n#*: }] remote [${r#*: }] blocking [${d#*: }]"
  done
  kill $DBG_PID 2>/dev/null
  grep -E "WARN|ERROR|status [1-9]" "$LOGS/serve-debug.log" | head -20
fi

if want resume; then
  # Sessions that survive a dropped connection: the same training natively and through a
  # relay that cuts every connection (reset) a few times; the losses must be the same.
  CUT_PORT=43310
  target=$SERVER; [[ ${RESUME_WAN:-0} == 1 ]] && target=127.0.0.1:$WAN_PORT
  # Deterministic kernels (the math attention backend, no atomics where torch has another
  # way): two native runs gave different losses after 800 steps without them, which hides
  # what a lost or repeated frame would do.
  det='import runpy, sys, torch
torch.use_deterministic_algorithms(True, warn_only=True)
for off in ("flash", "mem_efficient", "cudnn"):
    getattr(torch.backends.cuda, f"enable_{off}_sdp")(False)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")'
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  args=(-c "$det" "$SHARED/workloads/train.py" --steps ${RESUME_STEPS:-1500} --log-every 10)
  timeout ${RUN_TIMEOUT:-300} python3 "${args[@]}" > "$LOGS/resume-native.out" 2> "$LOGS/resume-native.err"
  python3 gpu/tools/cut_relay.py --listen 127.0.0.1:$CUT_PORT --target $target --cut-every ${RESUME_EVERY:-3} \
    --cuts ${RESUME_CUTS:-3} --max-seconds 900 > "$LOGS/cut-relay.log" 2>&1 &
  CUT_PID=$!
  sleep 0.5
  CHIDORI_RESUME=1 timeout ${RUN_TIMEOUT:-300} "$CHIDORI" run -s 127.0.0.1:$CUT_PORT -- python3 "${args[@]}" \
    > "$LOGS/resume-remote.out" 2> "$LOGS/resume-remote.err"
  rc=$?
  kill $CUT_PID 2>/dev/null
  # (Quoted on the right of ==, or the brackets of the list would make it a glob pattern.)
  losses() { grep -o '"losses": \[[^]]*\]' "$1"; }
  cuts=$(grep -c " cut " "$LOGS/cut-relay.log")
  resumed=$(grep -c "resumed the session" "$LOGS/resume-remote.err")
  # A second native run: whether the workload itself gives the same losses twice.
  timeout ${RUN_TIMEOUT:-300} python3 "${args[@]}" > "$LOGS/resume-native2.out" 2>> "$LOGS/resume-native.err"
  native_same=$([[ $(losses "$LOGS/resume-native.out") == "$(losses "$LOGS/resume-native2.out")" ]] && echo "native runs agree" || echo "NATIVE RUNS DIFFER")
  if [[ $rc == 0 && -n $(losses "$LOGS/resume-native.out") && $(losses "$LOGS/resume-native.out") == "$(losses "$LOGS/resume-remote.out")" ]]; then
    verdict="native losses ($native_same)"
  else
    verdict="DIFFERENT or failed rc=$rc (resume-*.out; $native_same)"
  fi
  unset CUBLAS_WORKSPACE_CONFIG
  row "resume (cut $cuts times)" "$verdict; resumed $resumed times; native $(grep -o '"seconds": [0-9.]*' "$LOGS/resume-native.out") remote $(grep -o '"seconds": [0-9.]*' "$LOGS/resume-remote.out")"
fi

if want wheel; then
  W=$B/wheel-install
  rm -rf "$W"
  whl=$(ls "$ROOT"/target/wheels/chidori-*.whl 2>/dev/null | head -1)
  if [[ -z $whl ]]; then
    row "wheel" "SKIPPED: no wheel in target/wheels (carry it)"
  elif python3 -m pip install --quiet --no-index --no-deps --target "$W" "$whl" > "$LOGS/wheel-install.txt" 2>&1; then
    WPORT=43214
    "$W/bin/chidori" serve --bind 127.0.0.1 --port $WPORT > "$LOGS/serve-wheel.log" 2>&1 &
    WPID=$!
    sleep 1
    prog="import torch; torch.manual_seed(0); x = torch.randn(256, 256, device='cuda'); print('smoke', float((x @ x).sum()))"
    native=$(timeout 60 python3 -c "$prog" 2>&1 | grep smoke)
    smoke=$(PYTHONPATH=$W timeout 120 "$W/bin/chidori" run -s 127.0.0.1:$WPORT -- python3 -c \
      "$prog; import chidori; print('smoke-info', chidori.is_remote(), chidori.server(), chidori.__version__)" 2>&1 | grep smoke | tr '\n' ' ')
    [[ -n $native && $smoke == "$native"* ]] && smoke="same as native: $smoke"
    row "wheel torch smoke" "${smoke:-FAILED (see serve-wheel.log)} (native: $native)"
    timeout ${WORKLOAD_TIMEOUT:-300} python3 gpu/workloads.py --chidori "$W/bin/chidori" --server 127.0.0.1:$WPORT \
      --workloads "$SHARED/workloads" --json "$LOGS/workloads-wheel.json" --timeout ${RUN_TIMEOUT:-150} --quick --no-wan \
      ${WHEEL_WORKLOADS:+$(printf -- '--only %s ' $WHEEL_WORKLOADS)} \
      > "$LOGS/workloads-wheel.txt" 2>&1
    rc=$?
    tail -12 "$LOGS/workloads-wheel.txt"
    row "wheel workloads" "rc=$rc (workloads-wheel.txt)"
    kill $WPID 2>/dev/null
  else
    row "wheel" "INSTALL FAILED: $(tail -1 "$LOGS/wheel-install.txt")"
  fi
fi

if want optimize; then
  D=gpu/decode
  only=(); [[ -n ${DECODE_CASES:-} ]] && only=(--only "$DECODE_CASES")
  runs=" ${DECODE_RUNS:-native lo-api lo-cli wan-api} "
  timeout ${DECODE_TIMEOUT:-240} python3 $D/generate_cases.py --optimize none "${only[@]}" > "$LOGS/gen-native.jsonl" 2> "$LOGS/gen-native.err"
  graphs=()
  for layers in 22 4; do
    g=$(timeout 120 python3 "$SHARED/workloads/decode.py" --mode graph --layers $layers --new-tokens 200 2>/dev/null | grep -o '"tok_per_s": [0-9.]*' | awk '{print $2}')
    [[ -n $g ]] && graphs+=(--graph "tinyllama${layers}_greedy_200=$g")
    [[ -n $g && $layers == 22 ]] && graphs+=(--graph "tinyllama22_tokenized_200=$g")
    row "native graph replay ${layers}L" "${g:-FAILED} tok/s"
  done
  export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
  compared=()
  if [[ $runs == *" lo-api "* ]]; then
    CHIDORI_LOG=${DECODE_CLIENT_LOG:-warn} timeout ${DECODE_TIMEOUT:-240} "$CHIDORI" run -s $SERVER -- \
      python3 $D/generate_cases.py --optimize api "${only[@]}" > "$LOGS/gen-lo-api.jsonl" 2> "$LOGS/gen-lo-api.err"
    compared+=(lo-api="$LOGS/gen-lo-api.jsonl")
  fi
  if [[ $runs == *" lo-cli "* ]]; then
    timeout ${DECODE_TIMEOUT:-240} "$CHIDORI" run --optimize -s $SERVER -- python3 $D/generate_cases.py --optimize none "${only[@]}" \
      > "$LOGS/gen-lo-cli.jsonl" 2> "$LOGS/gen-lo-cli.err"
    compared+=(lo-cli="$LOGS/gen-lo-cli.jsonl")
  fi
  if [[ $runs == *" wan-api "* ]]; then
    timeout ${DECODE_TIMEOUT:-300} "$CHIDORI" run -s 127.0.0.1:$WAN_PORT -- python3 $D/generate_cases.py --optimize api "${only[@]}" \
      > "$LOGS/gen-wan-api.jsonl" 2> "$LOGS/gen-wan-api.err"
    compared+=(wan70-api="$LOGS/gen-wan-api.jsonl")
  fi
  if [[ $runs == *" wan-cli "* ]]; then
    timeout ${DECODE_TIMEOUT:-300} "$CHIDORI" run --optimize -s 127.0.0.1:$WAN_PORT -- python3 $D/generate_cases.py \
      --optimize none "${only[@]}" > "$LOGS/gen-wan-cli.jsonl" 2> "$LOGS/gen-wan-cli.err"
    compared+=(wan70-cli="$LOGS/gen-wan-cli.jsonl")
  fi
  if [[ -n ${DECODE_TRACE:-} ]]; then
    # Where the waited round trips of one case come from (warm-up and timed generate both):
    # the program lines (chidori run --trace) and every wait in order.
    CHIDORI_LOG=warn,chidori::waits=trace timeout ${DECODE_TIMEOUT:-240} "$CHIDORI" run --trace -s $SERVER -- \
      python3 $D/generate_cases.py --optimize ${DECODE_TRACE_OPTIMIZE:-api} --sync-debug --only "$DECODE_TRACE" \
      > "$LOGS/gen-trace.jsonl" 2> "$LOGS/gen-trace.err"
    echo "== $DECODE_TRACE: waits in order (runs of one function counted):"
    grep -E 'TRACE [A-Za-z_0-9]+ -> ' "$LOGS/gen-trace.err" | awk '{print $2}' | uniq -c | tail -40
    echo "== $DECODE_TRACE: where the timed generate made the host wait (torch's sync debug mode):"
    grep -A10 '^SYNC' "$LOGS/gen-trace.err" | grep -v '^--' | head -60
    grep -vE 'TRACE' "$LOGS/gen-trace.err" | tail -30
  fi
  python3 $D/compare.py "$LOGS/gen-native.jsonl" "${compared[@]}" "${graphs[@]}" > "$LOGS/gen-compare.txt" 2>&1
  rc=$?
  cat "$LOGS/gen-compare.txt"
  grep -h "chidori" "$LOGS"/gen-*.err | sort | uniq -c | head -10
  row "optimize" "$( ((rc == 0)) && echo "all cases match (gen-compare.txt)" || echo "MISMATCHES rc=$rc (gen-compare.txt)")"
fi

if want copies; then
  # Bulk copies at link speed: what the relay itself carries at 70 ms and $COPY_MBIT Mbit/s,
  # then 1 GiB each way (pageable and pinned) through it, as a fraction of the cap.
  [[ -x $B/rtt ]] || nv gpu/bench/rtt.cu -o "$B/rtt" || row copies "BUILD FAILED"
  KPORT=43317; mbit=${COPY_MBIT:-1000}
  row "relay alone ${mbit} Mbit" "$(timeout 120 python3 gpu/tools/wan_relay.py --measure 1024 --rtt-ms 70 --mbit $mbit 2>&1 | tail -1)"
  python3 gpu/tools/wan_relay.py --listen 127.0.0.1:$KPORT --target $SERVER --rtt-ms 70 --mbit $mbit \
    --max-seconds 400 > "$LOGS/wan-copies.log" 2>&1 &
  K_PID=$!
  sleep 1
  # random: the link's own speed (nothing compresses); relu: half-zero float32 activations,
  # which travel compressed both ways at this round trip.
  for data in ${COPY_DATA:-random relu}; do
    timeout ${COPY_TIMEOUT:-240} "$CHIDORI" run -s 127.0.0.1:$KPORT -- "$B/rtt" 20 1 1 $data \
      > "$LOGS/copies-wan-$data.json" 2> "$LOGS/copies-wan-$data.err"
    row "1 GiB $data 70ms ${mbit}M" "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); cap=float(sys.argv[2])/8e3; print(", ".join(f"{k[:-5]} {v:.3f} GB/s ({v/cap:.2f} of cap)" for k,v in r.items() if k.endswith("_gbps")))' "$LOGS/copies-wan-$data.json" $mbit 2>&1 | tail -1)"
  done
  kill $K_PID 2>/dev/null
fi

if want content; then
  # Uploads sent once: a checkpoint loaded onto the GPU natively, then twice through a
  # server with a fresh content store behind a 70 ms, ${CONTENT_MBIT:-1000} Mbit/s relay:
  # bytes the client sent (trace) and seconds, first and second run.
  CPORT=43215; CWAN=43316; CK=$B/checkpoint
  timeout 300 python3 gpu/content/load_checkpoint.py make "$CK" --gb ${CONTENT_GB:-2} > "$LOGS/content-make.txt" 2>&1
  rm -rf "$B/content-store" "$B/content-client"
  "$CHIDORI" serve --bind 127.0.0.1 --port $CPORT --module-cache "$CACHE" --content-cache "$B/content-store" \
    > "$LOGS/serve-content.log" 2>&1 &
  CS_PID=$!
  # The repository's relay: the shared one cannot carry a 1 Gbit/s cap (gpu/tools/wan_relay.py).
  python3 gpu/tools/wan_relay.py --listen 127.0.0.1:$CWAN --target 127.0.0.1:$CPORT --rtt-ms 70 \
    --mbit ${CONTENT_MBIT:-1000} --max-seconds 1200 > "$LOGS/wan-content.log" 2>&1 &
  CW_PID=$!
  sleep 1
  secs() { grep -o '"seconds": [0-9.]*' "$1" | head -1 | awk '{print $2}'; }
  sum() { grep -o '"checksum": [-0-9.e+]*' "$1" | head -1 | awk '{print $2}'; }
  sent() { awk '$1 ~ /^cu(da)?Memcpy/ {s += $4} END {printf "%.1f", s / 1e6}' "$1"; }
  for fmt in ${CONTENT_FORMATS:-safetensors torch}; do
    timeout 200 python3 gpu/content/load_checkpoint.py load "$CK" --format $fmt > "$LOGS/content-$fmt-native.out" 2>&1
    for run in 1 2; do
      CHIDORI_CONTENT=1 XDG_CACHE_HOME=$B/content-client timeout ${CONTENT_TIMEOUT:-200} "$CHIDORI" run --trace \
        -s 127.0.0.1:$CWAN -- python3 gpu/content/load_checkpoint.py load "$CK" --format $fmt \
        > "$LOGS/content-$fmt-$run.out" 2> "$LOGS/content-$fmt-$run.err"
    done
    same=$([[ -n $(sum "$LOGS/content-$fmt-native.out") && $(sum "$LOGS/content-$fmt-native.out") == "$(sum "$LOGS/content-$fmt-2.out")" ]] && echo "native checksum" || echo "CHECKSUM DIFFERS")
    row "content $fmt" "native $(secs "$LOGS/content-$fmt-native.out") s; 70ms first $(secs "$LOGS/content-$fmt-1.out") s $(sent "$LOGS/content-$fmt-1.err") MB sent, second $(secs "$LOGS/content-$fmt-2.out") s $(sent "$LOGS/content-$fmt-2.err") MB; $same"
  done
  kill $CS_PID $CW_PID 2>/dev/null
  du -sh "$B/content-store" >> "$LOGS/content-make.txt" 2>&1
fi

if want samples; then
  samples_cudart=${SAMPLES_CUDART:-static}
  samples_src=$B/samples-src
  samples_dir=$B/samples-$samples_cudart
  if [[ ! -f $samples_dir/BUILT || -n ${SAMPLES_REBUILD:-} ]]; then
    rm -rf "$samples_src" && mkdir -p "$samples_src" && tar -C "$samples_src" -xJf target/cuda-samples.txz
    timeout ${SAMPLES_BUILD_TIMEOUT:-300} python3 gpu/samples/samples.py build --src "$samples_src" --out "$samples_dir" \
      --cudart "$samples_cudart" ${SAMPLES_ONLY:+--only "$SAMPLES_ONLY"} > "$LOGS/samples-build.txt" 2>&1
    for log in $(awk '$1 == "FAILED" {print $NF}' "$LOGS/samples-build.txt"); do
      [[ -f $log ]] && cp "$log" "$LOGS/samples-build-$(basename "$(dirname "$log")").log"
    done
  fi
  row "samples build" "$(tail -1 "$LOGS/samples-build.txt" 2>/dev/null) ($(cat "$samples_src/SOURCE" 2>/dev/null | cut -c1-34))"
  samples_wan=()
  [[ -n ${SAMPLES_WAN:-} ]] && samples_wan=(--wan-server 127.0.0.1:$WAN_PORT)
  timeout ${SAMPLES_TOTAL:-400} python3 gpu/samples/samples.py run --build "$samples_dir" --chidori "$CHIDORI" \
    --server $SERVER "${samples_wan[@]}" --json "$LOGS/samples.json" --timeout ${SAMPLES_TIMEOUT:-90} \
    --parallel ${SAMPLES_PARALLEL:-4} ${SAMPLES_ONLY:+--only "$SAMPLES_ONLY"} > "$LOGS/samples.txt" 2>&1
  rc=$?
  # The samples that do not simply match, and the counts (the whole table is in the logs).
  grep -vE '^[A-Za-z0-9_]+ +[0-9.]+( +match [0-9.]+)+$' "$LOGS/samples.txt" | tail -80
  row "samples ($samples_cudart cudart)" "$(grep -E '^(loopback|wan):' "$LOGS/samples.txt" | tr '\n' ' ') rc=$rc"
  # SAMPLES_TRACE (sample names): each once more, alone, with `chidori run --trace`: the
  # functions that sent, waited and carried the most (the whole table with the logs).
  for name in ${SAMPLES_TRACE//,/ }; do
    exe=$samples_dir/$name/$name
    [[ -x $exe ]] || { echo "== $name: not built"; continue; }
    start=$(date +%s.%N)
    (cd "$(dirname "$exe")" && CHIDORI_TRACE="$LOGS/samples-trace-$name.txt" timeout ${SAMPLES_TIMEOUT:-90} \
      "$CHIDORI" run -s $SERVER -- "$exe") > "$LOGS/samples-trace-$name.out" 2>&1
    echo "== $name traced (rc $?, $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $start}") s), by ms waiting:"
    grep -E ' [0-9.]+$' "$LOGS/samples-trace-$name.txt" 2>/dev/null | sort -k6 -g -r | head -n ${SAMPLES_TRACE_LINES:-20} | cut -c1-200
  done
  # SAMPLES_LOG (a CHIDORI_LOG filter, e.g. debug): each of $SAMPLES_LOG_NAMES (default
  # $SAMPLES_ONLY) once more, alone,
  # through a server of its own that logs at that level too, with the client's log at it;
  # the last lines of both here, the whole logs with the logs.
  log_names=${SAMPLES_LOG_NAMES:-${SAMPLES_ONLY:-}}
  if [[ -n ${SAMPLES_LOG:-} && -n $log_names ]]; then
    SLOG_PORT=43217
    CHIDORI_LOG=$SAMPLES_LOG "$CHIDORI" serve --bind 127.0.0.1 --port $SLOG_PORT --module-cache "$B/samples-log-cache" \
      > "$LOGS/samples-log-serve.log" 2>&1 &
    SLOG_PID=$!
    sleep 1
    for name in ${log_names//,/ }; do
      exe=$samples_dir/$name/$name
      [[ -x $exe ]] || { echo "== $name: not built"; continue; }
      lines=$(wc -l < "$LOGS/samples-log-serve.log")
      (cd "$(dirname "$exe")" && CHIDORI_LOG=$SAMPLES_LOG timeout ${SAMPLES_TIMEOUT:-90} "$CHIDORI" run \
        -s 127.0.0.1:$SLOG_PORT -- "$exe") > "$LOGS/samples-log-$name.txt" 2>&1
      echo "== $name with CHIDORI_LOG=$SAMPLES_LOG (rc $?), last client lines:"
      tail -n ${SAMPLES_LOG_LINES:-30} "$LOGS/samples-log-$name.txt" | cut -c1-240
      echo "== $name: the server's last lines"
      tail -n +$((lines + 1)) "$LOGS/samples-log-serve.log" | tail -n ${SAMPLES_LOG_LINES:-30} | cut -c1-240
    done
    kill $SLOG_PID 2>/dev/null
  fi
fi

if want nccl; then
  # torch.distributed over NCCL with one rank (this machine's one GPU): all-reduce and DDP
  # steps natively and through Chidori; with NCCL_RANKS=2 (two GPUs), torchrun of two ranks.
  ranks=${NCCL_RANKS:-1}
  launch=(python3); ((ranks > 1)) && launch=(python3 -m torch.distributed.run --nproc-per-node "$ranks")
  timeout ${RUN_TIMEOUT:-150} "${launch[@]}" gpu/distributed/allreduce.py > "$LOGS/nccl-native.out" 2> "$LOGS/nccl-native.err"
  timeout ${RUN_TIMEOUT:-150} "$CHIDORI" run -s $SERVER -- "${launch[@]}" gpu/distributed/allreduce.py \
    > "$LOGS/nccl-remote.out" 2> "$LOGS/nccl-remote.err"
  rc=$?
  field() { grep -o "\"$2\": [^,}]*" "$1" | head -1 | sed 's/.*: //'; }
  same=$([[ -n $(field "$LOGS/nccl-native.out" checksum) && $(field "$LOGS/nccl-native.out" checksum) == "$(field "$LOGS/nccl-remote.out" checksum)" ]] && echo "native checksum" || echo "CHECKSUM DIFFERS")
  row "nccl $ranks rank(s)" "rc=$rc $same; all-reduce ok $(field "$LOGS/nccl-remote.out" allreduce_ok), bus GB/s native $(field "$LOGS/nccl-native.out" allreduce_bus_gbps) remote $(field "$LOGS/nccl-remote.out" allreduce_bus_gbps); $(tail -1 "$LOGS/nccl-remote.err" | cut -c1-160)"
fi

if want libs; then
  # Libraries beyond PyTorch (gpu/libs/*_smoke.py, or $LIBS): each natively, then through
  # chidori on loopback; the printed values must be equal.
  for script in ${LIBS:-gpu/libs/jax_smoke.py gpu/libs/cupy_smoke.py gpu/libs/nvml_smoke.py gpu/libs/numba_smoke.py gpu/libs/cuda_python_smoke.py gpu/libs/torch_sparse_smoke.py gpu/libs/torch_ctc_smoke.py gpu/libs/torch_expandable_smoke.py gpu/libs/torch_profiler_smoke.py gpu/libs/torch_cudnn_benchmark_smoke.py gpu/libs/torch_ipc_smoke.py gpu/libs/torch_ipc_expandable_smoke.py}; do
    name=$(basename "$script" .py)
    # -X faulthandler: a crash prints the Python stack it happened under.
    timeout ${RUN_TIMEOUT:-150} python3 -X faulthandler "$script" > "$LOGS/$name-native.out" \
      2> "$LOGS/$name-native.err"
    native_rc=$?
    timeout ${RUN_TIMEOUT:-150} "$CHIDORI" run -s $SERVER -- python3 -X faulthandler "$script" \
      > "$LOGS/$name-remote.out" 2> "$LOGS/$name-remote.err"
    remote_rc=$?
    if ((remote_rc == 139)) && command -v gdb >/dev/null; then
      # A native crash remotely: once more under gdb for the C stacks of every thread.
      timeout ${RUN_TIMEOUT:-150} "$CHIDORI" run -s $SERVER -- gdb -q -batch -ex run \
        -ex 'thread apply all bt 25' --args python3 "$script" > "$LOGS/$name-gdb.txt" 2>&1
    fi
    if ((native_rc == 0 && remote_rc == 0)) && cmp -s "$LOGS/$name-native.out" "$LOGS/$name-remote.out"; then
      row "$name" "match: $(head -1 "$LOGS/$name-native.out")"
    else
      row "$name" "DIFFERENT native rc=$native_rc remote rc=$remote_rc: $(diff "$LOGS/$name-native.out" \
        "$LOGS/$name-remote.out" | head -4 | tr '\n' ' ') $(tail -2 "$LOGS/$name-remote.err" | tr '\n' ' ' | cut -c1-300)"
    fi
  done
  # nvidia-smi through Chidori (the server's, run by the session's worker; a program's own
  # through the PATH chidori run gives it): the fixed facts of the GPU must be the native
  # ones; the whole default screen is kept in the logs.
  if [[ -z ${LIBS:-} ]] && command -v nvidia-smi >/dev/null; then
    query=(--query-gpu=name,uuid,pci.bus_id,memory.total,driver_version,compute_cap --format=csv,noheader)
    timeout 60 nvidia-smi "${query[@]}" > "$LOGS/nvidia-smi-native.out" 2>&1
    timeout 60 "$CHIDORI" run -s $SERVER -- nvidia-smi "${query[@]}" > "$LOGS/nvidia-smi-remote.out" \
      2> "$LOGS/nvidia-smi-remote.err"
    rc=$?
    timeout 60 "$CHIDORI" run -s $SERVER -- nvidia-smi > "$LOGS/nvidia-smi-screen.out" 2>&1
    if ((rc == 0)) && cmp -s "$LOGS/nvidia-smi-native.out" "$LOGS/nvidia-smi-remote.out"; then
      row "nvidia-smi" "match: $(head -1 "$LOGS/nvidia-smi-native.out" | cut -c1-100)"
    else
      row "nvidia-smi" "DIFFERENT rc=$rc: $(head -2 "$LOGS/nvidia-smi-remote.out" | tr '\n' ' ' | cut -c1-200) $(tail -2 "$LOGS/nvidia-smi-remote.err" | tr '\n' ' ' | cut -c1-200)"
    fi
  fi
fi

if want tls; then
  TPORT=43214; TCONF=$B/tls-server; TCLIENT=$B/tls-client
  rm -rf "$TCONF" "$TCLIENT"
  XDG_CONFIG_HOME=$TCONF CHIDORI_LOG=${SERVE_LOG:-info} "$CHIDORI" serve --bind 127.0.0.1 --port $TPORT --secure \
    --module-cache "$B/tls-module-cache" > "$LOGS/serve-tls.log" 2>&1 &
  TLS_PID=$!
  for _ in $(seq 50); do grep -q "clients connect with" "$LOGS/serve-tls.log" && break; sleep 0.2; done
  token=$(cat "$TCONF/chidori/token" 2>/dev/null)
  row "tls server" "$([[ -n $token ]] && echo "token made; $(grep -c -- --token "$LOGS/serve-tls.log") line(s) name it" || echo "NO TOKEN: $(tail -2 "$LOGS/serve-tls.log")")"
  # `chidori run` through the secure server (the token only there: a plain server is reached without TLS).
  over_tls=(env XDG_CONFIG_HOME="$TCLIENT" CHIDORI_TOKEN="$token" "$CHIDORI" run -s 127.0.0.1:$TPORT --)
  [[ -x $B/rtt ]] || nv gpu/bench/rtt.cu -o "$B/rtt" || row "tls rtt" "BUILD FAILED"
  nv gpu/bench/escape.c -o "$B/escape" -lcuda || row "escape" "BUILD FAILED"
  row "escape native" "$(timeout 30 "$B/escape" 2>&1 | tail -1)"
  row "escape plain" "$(timeout 30 "$CHIDORI" run -s $SERVER -- "$B/escape" 2>&1 | tail -1)"
  row "escape tls" "$(timeout 30 "${over_tls[@]}" "$B/escape" 2>&1 | tail -1)"
  for i in $(seq ${TLS_TRIES:-2}); do
    timeout 60 "$CHIDORI" run -s $SERVER -- "$B/rtt" > "$LOGS/tls-rtt-plain-$i.json" 2> "$LOGS/tls-rtt-plain-$i.err"
    row "rtt plain $i" "$(cat "$LOGS/tls-rtt-plain-$i.json")"
    # $TLS_LANES: lane counts to compare over TLS ("default": the client's own choice).
    for lanes in ${TLS_LANES:-default}; do
      lane_env=(); [[ $lanes == default ]] || lane_env=(CHIDORI_LANES=$lanes)
      env "${lane_env[@]}" timeout 60 "${over_tls[@]}" "$B/rtt" > "$LOGS/tls-rtt-tls-$i-$lanes.json" 2> "$LOGS/tls-rtt-tls-$i-$lanes.err"
      row "rtt tls $i lanes=$lanes" "$(cat "$LOGS/tls-rtt-tls-$i-$lanes.json") $(tail -1 "$LOGS/tls-rtt-tls-$i-$lanes.err")"
    done
  done
  if [[ ${TLS_CPU:-0} == 1 ]]; then
    # Where the CPU goes in the 1 GiB copies (100 small calls, 2 tries): per thread name,
    # client and worker alike, plain (4 lanes) and over TLS with each of $TLS_LANES.
    for lanes in plain ${TLS_LANES:-8}; do
      if [[ $lanes == plain ]]; then via=("$CHIDORI" run -s $SERVER --); else via=(env CHIDORI_LANES=$lanes "${over_tls[@]}"); fi
      timeout 60 python3 gpu/tools/thread_cpu.py -- "${via[@]}" "$B/rtt" 100 1 2 \
        > "$LOGS/tls-cpu-$lanes.json" 2> "$LOGS/tls-cpu-$lanes.err"
      echo "== CPU by thread, $lanes: $(cat "$LOGS/tls-cpu-$lanes.json")"
      grep '^thread_cpu:' "$LOGS/tls-cpu-$lanes.err" | head -16
    done
  fi
  train=("$SHARED/workloads/train.py" --steps 60 --log-every 20)
  timeout 90 "$CHIDORI" run -s $SERVER -- python3 "${train[@]}" > "$LOGS/tls-train-plain.out" 2> "$LOGS/tls-train-plain.err"
  row "train plain" "$(tail -1 "$LOGS/tls-train-plain.out" | cut -c1-220)"
  timeout 90 "${over_tls[@]}" python3 "${train[@]}" > "$LOGS/tls-train-tls.out" 2> "$LOGS/tls-train-tls.err"
  row "train tls" "$(tail -1 "$LOGS/tls-train-tls.out" | cut -c1-220) $(tail -1 "$LOGS/tls-train-tls.err" | cut -c1-120)"
  if [[ ${TLS_SUITE:-1} == 1 ]]; then
    XDG_CONFIG_HOME=$TCLIENT CHIDORI_TOKEN=$token timeout ${TLS_SUITE_TIMEOUT:-120} python3 gpu/torch-suite/compare.py \
      --chidori "$CHIDORI" --server 127.0.0.1:$TPORT --json "$LOGS/torch-suite-tls.json" --timeout 100 \
      > "$LOGS/torch-suite-tls.txt" 2>&1
    rc=$?
    tail -32 "$LOGS/torch-suite-tls.txt"
    row "torch suite over tls" "$( ((rc == 0)) && echo "all match" || echo "FAILURES rc=$rc (torch-suite-tls.txt)")"
  fi
  kill $TLS_PID 2>/dev/null
fi

if want wire; then
  nv gpu/bench/wire.cu -o "$B/wire" -lpthread || row wire "BUILD FAILED"
  timeout 120 "$B/wire" > "$LOGS/wire.txt" 2>&1
  row "kernel TLS" "$(timeout 20 python3 gpu/bench/ktls_probe.py 2>&1 | tail -1)"
  while read -r line; do row "${line% *}" "${line##* } GB/s"; done < <(grep "GB/s" "$LOGS/wire.txt" | sed 's/ GB\/s$//')
  [[ -x $B/rtt ]] || nv gpu/bench/rtt.cu -o "$B/rtt" || row "rtt" "BUILD FAILED"
  # Bytes checked: large copies natively and through chidori's lanes (async, two threads).
  nv gpu/bench/lane_copies.c -o "$B/lane_copies" -lpthread || row "lane copies" "BUILD FAILED"
  row "lane copies native" "$(timeout 60 "$B/lane_copies" 2>&1 | tail -1)"
  row "lane copies remote" "$(timeout 120 "$CHIDORI" run -s $SERVER -- "$B/lane_copies" 2>&1 | tail -1)"
  # Through chidori: on the session's connection only, then with its bulk lanes (the default).
  for lanes in 0 4 0 4; do
    CHIDORI_LANES=$lanes timeout 60 "$CHIDORI" run -s $SERVER -- "$B/rtt" > "$LOGS/wire-rtt-$lanes.json" 2> "$LOGS/wire-rtt-$lanes.err"
    row "rtt+copy lanes=$lanes" "$(cat "$LOGS/wire-rtt-$lanes.json") $(tail -1 "$LOGS/wire-rtt-$lanes.err" | cut -c1-160)"
  done
fi

if want hostile; then
  # Every descriptor with NULL pointers (counts 0, 1, 7) against the real libraries, each run
  # in a child of worker/tests/hostile.rs that a signal may kill; the ones that did are named.
  if [[ -x $DIST/bin/hostile ]]; then
    CHIDORI_HOSTILE_REAL=$B/hostile-progress CHIDORI_HOSTILE_STUCK=${HOSTILE_STUCK:-20} timeout ${HOSTILE_TIMEOUT:-300} \
      "$DIST/bin/hostile" real_libraries_survive_null_pointers --exact --nocapture > "$LOGS/hostile.txt" 2>&1
    rc=$?
    grep -E "died at|broke the context" "$LOGS/hostile.txt" | head -30
    ((rc == 0)) || grep -A4 "panicked" "$LOGS/hostile.txt" | head -12
    row "hostile NULL run" "rc=$rc, last descriptor $(cat "$B/hostile-progress" 2>/dev/null), $(grep -c "died at" "$LOGS/hostile.txt") died; $(grep "descriptors run" "$LOGS/hostile.txt")"
  else
    row "hostile NULL run" "no target/dist/bin/hostile (./dev gpu builds it)"
  fi
fi

if want opinfo; then
  twice=(); [[ ${OPINFO_TWICE:-0} == 1 ]] && twice=(--native-twice)
  timeout $(( ${OPINFO_TOTAL:-420} + 120 )) python3 gpu/opinfo/conformance.py --chidori "$CHIDORI" --server $SERVER \
    --work "$B/opinfo" --jobs ${OPINFO_JOBS:-6} --total ${OPINFO_TOTAL:-420} --op-timeout ${OPINFO_OP_TIMEOUT:-120} \
    ${OPINFO_OPS:+--ops $OPINFO_OPS} ${OPINFO_FIRST:+--first $OPINFO_FIRST} ${OPINFO_DTYPES:+--dtypes $OPINFO_DTYPES} \
    "${twice[@]}" --json "$LOGS/opinfo.json" > "$LOGS/opinfo.txt" 2>&1
  rc=$?
  mkdir -p "$LOGS/opinfo-logs"
  for run in native remote native2; do
    for f in "$B/opinfo/$run"/shard-*.log; do [[ -f $f ]] && cp "$f" "$LOGS/opinfo-logs/$run-${f##*/}"; done
  done
  grep -v "^    " "$LOGS/opinfo.txt" | tail -25
  row "opinfo" "rc=$rc $(python3 -c "import json; s=json.load(open('$LOGS/opinfo.json'))['summary']; print(', '.join(f'{k} {s[k]}' for k in ('ops','compared','identical','within_tolerance','differ','differ_in_nondeterministic_kernels','missing','remote_crash','remote_timeout','native_crash','not_run','seconds')))" 2>/dev/null)"
fi

if want torch; then
  # The standard workloads (QUICK=1: small sizes, a functional check), then the suite.
  quick=(); [[ ${QUICK:-0} == 1 ]] && quick=(--quick)
  timeout ${WORKLOAD_TIMEOUT:-400} python3 gpu/workloads.py --chidori "$CHIDORI" --server $SERVER \
    --wan-server 127.0.0.1:$WAN_PORT --workloads "$SHARED/workloads" --json "$LOGS/workloads.json" \
    --timeout ${RUN_TIMEOUT:-150} "${quick[@]}" ${WORKLOADS:+$(printf -- '--only %s ' $WORKLOADS)} ${NO_WAN:+--no-wan} ${WAN_ONLY:+--wan-only} \
    "${before_args[@]}" > "$LOGS/workloads.txt" 2>&1
  rc=$?
  cat "$LOGS/workloads.txt"
  row "workloads" "rc=$rc (workloads.txt)"
  if [[ ${SUITE:-1} == 1 ]]; then
    timeout ${SUITE_TIMEOUT:-200} python3 gpu/torch-suite/compare.py --chidori "$CHIDORI" --server $SERVER \
      --json "$LOGS/torch-suite.json" --timeout ${TORCH_RUN_TIMEOUT:-150} ${SUITE_WAN:+--wan-server 127.0.0.1:$WAN_PORT} \
      ${SUITE_WAN_ONLY:+--wan-only} ${SUITE_ONLY:+--only $SUITE_ONLY} ${TORCH_SUITE_TOTAL:+--total $TORCH_SUITE_TOTAL} \
      > "$LOGS/torch-suite.txt" 2>&1
    rc=$?
    tail -40 "$LOGS/torch-suite.txt"
    row "torch suite" "$( ((rc == 0)) && echo "all match" || echo "FAILURES rc=$rc (torch-suite.txt)")"
    if [[ -n ${BEFORE_DIST:-} && ${SUITE_BEFORE:-0} == 1 ]]; then
      # The same suite through the earlier commit (its cases compared with native too).
      timeout ${SUITE_TIMEOUT:-200} python3 gpu/torch-suite/compare.py --chidori "$BEFORE_DIST/bin/chidori" \
        --server 127.0.0.1:$BEFORE_PORT --json "$LOGS/torch-suite-before.json" --timeout ${TORCH_RUN_TIMEOUT:-150} \
        ${SUITE_ONLY:+--only $SUITE_ONLY} ${TORCH_SUITE_TOTAL:+--total $TORCH_SUITE_TOTAL} > "$LOGS/torch-suite-before.txt" 2>&1
      rc=$?
      tail -30 "$LOGS/torch-suite-before.txt"
      row "torch suite (before)" "$( ((rc == 0)) && echo "all match" || echo "FAILURES rc=$rc (torch-suite-before.txt)")"
    fi
  fi
fi
