#!/usr/bin/env bash
# Builds the CUDA suite: one executable per program in $BUILD_DIR; objects and the build log of
# each program (commands included) in $BUILD_DIR/obj/NAME/. Prints one line per program, goes on
# past failures and exits 1 if any build failed.
#
#   bash build.sh [NAME...]
#   NVCC (default /usr/local/cuda-13.0/bin/nvcc), BUILD_DIR (default /tmp/cuda-suite),
#   CUDART (shared or static, default shared), JOBS (parallel builds, default nproc)
set -u
cd "$(dirname "$0")"
NVCC=${NVCC:-/usr/local/cuda-13.0/bin/nvcc}
B=${BUILD_DIR:-/tmp/cuda-suite}
CUDART=${CUDART:-shared}
JOBS=${JOBS:-$(nproc)}
[[ -x $NVCC ]] || { echo "no nvcc at $NVCC" >&2; exit 2; }
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)

# cudart is linked shared by default (Chidori replaces libcudart.so.13); CUDART=static links it
# into each program as nvcc does by default, which then reaches Chidori's driver only. The rpath
# lets native runs find libcudart without LD_LIBRARY_PATH.
FLAGS=(-arch=sm_90 -O2 -std=c++17 -Isrc)
LINK=(-cudart "$CUDART" -Xlinker -rpath -Xlinker "$CUDA_HOME/lib64")
if [[ $CUDART == shared ]]; then HOST_CUDART=(-lcudart); else HOST_CUDART=(-lcudart_static -ldl -lpthread -lrt); fi

NAMES=(params templates multi_tu rdc dyn_smem symbols atomics coop_grid streams_events pinned_async
       memset_copy graph_replay host_callbacks threads fault compress_zstd compress_lz4 driver_ptx
       launch_ex launch_default launch_legacy textures copies_3d graph_build mem_pools peer_functions
       driver_graphs fft rand managed managed_vars device_printf solver_sparse sparse
       graph_host_memory green_ctx blas_xt solver_lowlevel cudnn_legacy sparse_lt user_objects
       alloc_lifecycle zero_copy vmm)

nv() { "$NVCC" "${FLAGS[@]}" "$@"; }

# The NVIDIA wheels beside torch (site-packages/nvidia/WHEEL/SUBDIR), for SUBDIR lib or include.
wheel_dirs() {
  local site
  for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    echo "$site/nvidia/cu13/$1" "$site/nvidia/cudnn/$1" "$site/nvidia/cusparselt/$1"
  done
}

# libNAME.so from the toolkit, else from the NVIDIA wheels beside torch: "-L DIR -rpath DIR".
library_dir() {
  local lib=$1 dir
  for dir in "$CUDA_HOME/lib64" $(wheel_dirs lib); do
    if compgen -G "$dir/lib$lib.so*" > /dev/null; then
      local so
      so=$(cd "$dir" && ls "lib$lib".so* | sort | head -1)
      echo "-L$dir -Xlinker -rpath -Xlinker $dir -l:$so"
      return
    fi
  done
  echo "-l$lib"
}

# A library's header: the toolkit's, else a wheel's beside torch ("-I DIR").
wheel_include() {
  local dir
  for dir in "$CUDA_HOME/include" $(wheel_dirs include); do
    if [[ -f $dir/$1 ]]; then echo "-I$dir"; return; fi
  done
}

# recipe NAME: builds $B/NAME, using $B/obj/NAME for intermediate files.
recipe() {
  local name=$1 out=$B/$1 obj=$B/obj/$1
  case $name in
    multi_tu)
      nv -c src/multi_tu/library.cu -o "$obj/library.o" &&
        ar rcs "$obj/libsteps.a" "$obj/library.o" &&
        nv "${LINK[@]}" src/multi_tu/main.cu src/multi_tu/scale.cu "$obj/libsteps.a" -o "$out" ;;
    rdc)
      nv -rdc=true -c src/rdc/main.cu -o "$obj/main.o" &&
        nv -rdc=true -c src/rdc/device_fn.cu -o "$obj/device_fn.o" &&
        nv -dlink "$obj/main.o" "$obj/device_fn.o" -o "$obj/dlink.o" &&
        g++ "$obj/main.o" "$obj/device_fn.o" "$obj/dlink.o" -L"$CUDA_HOME/lib64" \
          -Wl,-rpath,"$CUDA_HOME/lib64" -lcudadevrt "${HOST_CUDART[@]}" -o "$out" ;;
    driver_ptx)     nv -cudart none src/driver_ptx.cpp -o "$out" -lcuda ;;
    driver_graphs)  nv -cudart none src/driver_graphs.cpp -o "$out" -lcuda ;;
    # Host code in plain C++ (main.cpp, checked by check.sh without nvcc), kernels in kernels.cu.
    textures|copies_3d|graph_build|mem_pools|peer_functions)
                    nv "${LINK[@]}" -Xcompiler -Wno-deprecated-declarations "src/$name/main.cpp" "src/$name/kernels.cu" \
                      -o "$out" ;;
    green_ctx)      nv "${LINK[@]}" src/green_ctx/main.cpp src/green_ctx/kernels.cu -o "$out" -lcuda ;;
    fft)            nv "${LINK[@]}" src/fft.cu -o "$out" $(library_dir cufft) ;;
    rand)           nv "${LINK[@]}" src/rand.cu -o "$out" $(library_dir curand) ;;
    # Host code only (checked by check.sh); cuSolverSP and cuSolverRF are deprecated in 13.0.
    solver_sparse)  nv "${LINK[@]}" -Xcompiler -Wno-deprecated-declarations src/solver_sparse.cpp -o "$out" \
                      $(library_dir cusolver) $(library_dir cusparse) ;;
    sparse)         nv "${LINK[@]}" -Xcompiler -Wno-deprecated-declarations src/sparse.cpp -o "$out" \
                      $(library_dir cusparse) ;;
    blas_xt)        nv "${LINK[@]}" src/blas_xt.cpp -o "$out" $(library_dir cublas) ;;
    cudnn_legacy)   nv "${LINK[@]}" $(wheel_include cudnn.h) src/cudnn_legacy.cpp -o "$out" $(library_dir cudnn) ;;
    sparse_lt)      nv "${LINK[@]}" $(wheel_include cusparseLt.h) src/sparse_lt.cpp -o "$out" $(library_dir cusparseLt) ;;
    solver_lowlevel) nv "${LINK[@]}" -Xcompiler -Wno-deprecated-declarations src/solver_lowlevel.cpp -o "$out" \
                      $(library_dir cusolver) $(library_dir cusparse) ;;
    threads)        nv "${LINK[@]}" -Xcompiler -pthread src/threads.cu -o "$out" ;;
    user_objects)   nv "${LINK[@]}" src/user_objects.cu -o "$out" -lcuda ;;
    vmm)            nv "${LINK[@]}" src/vmm.cu -o "$out" -lcuda ;;
    compress_zstd)  nv "${LINK[@]}" -Xfatbin -compress-all src/compress.cu -o "$out" ;;
    compress_lz4)   nv "${LINK[@]}" -Xfatbin -compress-all --compress-mode=speed src/compress.cu -o "$out" ;;
    launch_default) nv "${LINK[@]}" src/launch_chevron.cu -o "$out" ;;
    launch_legacy)  nv "${LINK[@]}" -legacy-launch-seq src/launch_chevron.cu -o "$out" ;;
    *)              nv "${LINK[@]}" "src/$name.cu" -o "$out" ;;
  esac
}

selected=("$@")
[[ ${#selected[@]} -gt 0 ]] || selected=("${NAMES[@]}")
for name in "${selected[@]}"; do
  [[ " ${NAMES[*]} " == *" $name "* ]] || { echo "unknown program: $name" >&2; exit 2; }
done

mkdir -p "$B/obj"
for name in "${selected[@]}"; do
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
  (
    rm -rf "${B:?}/obj/$name" "${B:?}/$name"
    mkdir -p "$B/obj/$name"
    if (set -x; recipe "$name") >"$B/obj/$name/log" 2>&1; then echo ok; else echo FAILED; fi >"$B/obj/$name/status"
  ) &
done
wait

failed=()
for name in "${selected[@]}"; do
  if [[ $(cat "$B/obj/$name/status") == ok ]]; then
    printf 'ok      %s\n' "$name"
  else
    printf 'FAILED  %-16s log: %s\n' "$name" "$B/obj/$name/log"
    failed+=("$name")
  fi
done
if (( ${#failed[@]} )); then
  echo "${#failed[@]} of ${#selected[@]} builds failed: ${failed[*]}"
  exit 1
fi
echo "all ${#selected[@]} programs built in $B"
