/* Natively: do the version queries that take a library handle accept NULL? (bench/2026-12-06-h100-session32.md, call 4: cuBLAS's does, cuSPARSE's answers invalid value.) */
#include <stdio.h>
#include <cublas_v2.h>
#include <cusparse.h>
int main(void) {
    int v = -1;
    cublasStatus_t b = cublasGetVersion(NULL, &v);
    printf("cublasGetVersion_v2(NULL) status %d version %d\n", (int)b, v);
    v = -1;
    cusparseStatus_t s = cusparseGetVersion(NULL, &v);
    printf("cusparseGetVersion(NULL) status %d version %d\n", (int)s, v);
    return 0;
}
