#!/usr/bin/env bash
# Checks the syntax of the suite's plain C++ host code with g++ against a CUDA include
# directory, without nvcc (the kernels in kernels.cu need nvcc and are not checked here).
#
#   bash check.sh [INCLUDE_DIR]    default: ../../target/cuda-headers/13.0/include
set -eu
cd "$(dirname "$0")"
INCLUDE=${1:-../../target/cuda-headers/13.0/include}
[[ -f $INCLUDE/cuda_runtime.h ]] || { echo "no cuda_runtime.h in $INCLUDE (cargo xtask headers --cuda 13.0 --runtime-only)" >&2; exit 2; }
status=0
# FILE or FILE:HEADER, where the library programs need a header the runtime wheels lack (the
# full `cargo xtask headers --cuda 13.0` has it); without it they are skipped.
for entry in src/textures/main.cpp src/copies_3d/main.cpp src/graph_build/main.cpp src/mem_pools/main.cpp \
             src/peer_functions/main.cpp src/green_ctx/main.cpp src/driver_graphs.cpp src/solver_sparse.cpp:cusolverSp.h \
             src/sparse.cpp:cusparse.h src/blas_xt.cpp:cublasXt.h \
             src/solver_lowlevel.cpp:cusolverSp_LOWLEVEL_PREVIEW.h src/cudnn_legacy.cpp:cudnn.h \
             src/sparse_lt.cpp:cusparseLt.h; do
  file=${entry%%:*}
  header=${entry#"$file"}
  header=${header#:}
  if [[ -n $header && ! -f $INCLUDE/$header ]]; then
    echo "skipped $file (no $header in $INCLUDE)"
    continue
  fi
  if g++ -std=c++17 -fsyntax-only -Wall -Werror -Wno-deprecated-declarations -I "$INCLUDE" -I ../../headers/stub \
       -I check -Isrc "$file"; then
    echo "ok      $file"
  else
    echo "FAILED  $file"
    status=1
  fi
done
exit $status
