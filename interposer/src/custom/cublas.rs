//! Hand-written cuBLAS functions: the client records each handle's pointer mode, which
//! decides whether scalars travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cublas as calls;
use chidori_cuda::calls::cudart as cudart_calls;
use chidori_cuda::desc::Ctx;

const SUCCESS: u32 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
const INVALID_VALUE: u32 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
const POINTER_MODE_DEVICE: u32 = chidori_cuda::consts::cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE;

use crate::custom::kernels::{Copy2d, copy_2d};
use crate::custom::memory::CopyForms;
use crate::state::CLIENT;

pub unsafe fn cublasCreate_v2(handle: *mut c_void) -> u32 {
    let s = super::handles::create_handle("cublasCreate_v2", &calls::cublasCreate_v2__call, handle, INVALID_VALUE);
    if s == SUCCESS && !handle.is_null() {
        // SAFETY: written by the reply.
        let h = unsafe { std::ptr::read_unaligned(handle as *const u64) };
        // A new handle has the default math mode.
        CLIENT.math_modes.insert(h, chidori_cuda::consts::cublasMath_t::CUBLAS_DEFAULT_MATH);
    }
    s
}

pub unsafe fn cublasSetMathMode(handle: *mut c_void, mode: u32) -> u32 {
    crate::guard::ffi("cublasSetMathMode", INVALID_VALUE, || {
        // SAFETY: values only.
        let s =
            unsafe { crate::runtime::call(&calls::cublasSetMathMode__call, &[handle as u64, u64::from(mode)]) } as u32;
        // Sent without waiting: a mode the library refuses surfaces at the next synchronizing
        // call; until then reads answer what was set, as they would after a success.
        CLIENT.math_modes.insert(handle as u64, mode);
        s
    })
}

pub unsafe fn cublasGetMathMode(handle: *mut c_void, mode: *mut c_void) -> u32 {
    crate::guard::ffi("cublasGetMathMode", INVALID_VALUE, || {
        crate::trace::local("cublasGetMathMode");
        if mode.is_null() {
            return INVALID_VALUE;
        }
        let known = CLIENT.math_modes.get(&(handle as u64));
        if let Some(m) = known {
            // SAFETY: the caller's cublasMath_t, checked non-null.
            unsafe { std::ptr::write_unaligned(mode as *mut u32, m) };
            return SUCCESS;
        }
        // SAFETY: as above.
        unsafe { crate::runtime::call(&calls::cublasGetMathMode__call, &[handle as u64, mode as u64]) as u32 }
    })
}

pub unsafe fn cublasSetPointerMode_v2(handle: *mut c_void, mode: u32) -> u32 {
    let desc = &calls::cublasSetPointerMode_v2__call;
    super::handles::set_pointer_mode("cublasSetPointerMode_v2", desc, handle, mode, POINTER_MODE_DEVICE, INVALID_VALUE)
}

// ---- The legacy API's allocator (cublas.h): cudaMalloc and cudaFree ----

/// cublasAlloc: `n` elements of `elem_size` bytes, by the client's cudaMalloc.
pub unsafe fn legacy_alloc(ctx: &Ctx, n: i32, elem_size: i32, device_ptr: *mut c_void) -> u32 {
    use chidori_cuda::consts::cublasStatus_t as s;
    crate::guard::ffi(ctx.name, s::CUBLAS_STATUS_INVALID_VALUE, || {
        let (Ok(n), Ok(size)) = (usize::try_from(n), usize::try_from(elem_size)) else {
            return s::CUBLAS_STATUS_INVALID_VALUE;
        };
        if n == 0 || size == 0 || device_ptr.is_null() {
            return s::CUBLAS_STATUS_INVALID_VALUE;
        }
        let Some(bytes) = n.checked_mul(size) else { return s::CUBLAS_STATUS_ALLOC_FAILED };
        // SAFETY: the caller's void**, as cudaMalloc's.
        match unsafe { super::cudart::cudaMalloc(device_ptr, bytes) } {
            0 => s::CUBLAS_STATUS_SUCCESS,
            _ => s::CUBLAS_STATUS_ALLOC_FAILED,
        }
    })
}

/// cublasFree: the client's cudaFree.
pub unsafe fn legacy_free(ctx: &Ctx, device_ptr: *mut c_void) -> u32 {
    use chidori_cuda::consts::cublasStatus_t as s;
    crate::guard::ffi(ctx.name, s::CUBLAS_STATUS_INVALID_VALUE, || {
        // SAFETY: a device address by value, as cudaFree's.
        match unsafe { super::cudart::cudaFree(device_ptr) } {
            0 => s::CUBLAS_STATUS_SUCCESS,
            _ => s::CUBLAS_STATUS_INTERNAL_ERROR,
        }
    })
}

// ---- Host <-> GPU helpers ----
//
// cublasSet/Get{Vector,Matrix}{,Async}{,_64} copy between a strided host array and a strided
// GPU array: 2D copies (a vector is a matrix of one-element rows), made with the client's
// cudaMemcpy2D{,Async}, which read or write only the elements the arguments name.

const MAPPING_ERROR: u32 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_MAPPING_ERROR;
const H2D: u32 = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyHostToDevice;
const D2H: u32 = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToHost;

static MEMCPY2D: CopyForms = CopyForms {
    h2d: &cudart_calls::cudaMemcpy2D__h2d,
    d2h: &cudart_calls::cudaMemcpy2D__d2h,
    d2d: &cudart_calls::cudaMemcpy2D__d2d,
};
static MEMCPY2D_ASYNC: CopyForms = CopyForms {
    h2d: &cudart_calls::cudaMemcpy2DAsync__h2d,
    d2h: &cudart_calls::cudaMemcpy2DAsync__d2h,
    d2d: &cudart_calls::cudaMemcpy2DAsync__d2d,
};

/// `rows` elements of `elem` bytes in each of `cols` columns, `src_ld` / `dst_ld` elements
/// apart.
struct Strided {
    rows: i64,
    cols: i64,
    elem: i64,
    src: *mut c_void,
    src_ld: i64,
    dst: *mut c_void,
    dst_ld: i64,
}

fn copy_strided(name: &'static str, m: Strided, kind: u32, stream: Option<*mut c_void>) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        if m.rows < 0 || m.cols < 0 || m.elem <= 0 || m.src_ld < m.rows.max(1) || m.dst_ld < m.rows.max(1) {
            return INVALID_VALUE;
        }
        if m.rows == 0 || m.cols == 0 {
            return SUCCESS;
        }
        let bytes = |n: i64| n.checked_mul(m.elem).and_then(|b| usize::try_from(b).ok());
        let (Some(width), Some(spitch), Some(dpitch), Ok(height)) =
            (bytes(m.rows), bytes(m.src_ld), bytes(m.dst_ld), usize::try_from(m.cols))
        else {
            return INVALID_VALUE;
        };
        let c = Copy2d { dst: m.dst as u64, dpitch, src: m.src as u64, spitch, width, height };
        // SAFETY: the caller's arrays hold what the arguments name (the cuBLAS contract); the
        // 2D copy touches only those bytes.
        let s = unsafe {
            match stream {
                None => copy_2d(&MEMCPY2D, c, kind, &[]),
                Some(st) => copy_2d(&MEMCPY2D_ASYNC, c, kind, &[st as u64]),
            }
        };
        if s == chidori_cuda::consts::cudaError::cudaSuccess { SUCCESS } else { MAPPING_ERROR }
    })
}

/// A vector helper; with `stream`, its Async form.
macro_rules! vector_copy {
    ($name:ident, $int:ty, $kind:expr $(, $stream:ident)?) => {
        pub unsafe fn $name(
            n: $int,
            elemSize: $int,
            x: *mut c_void,
            incx: $int,
            y: *mut c_void,
            incy: $int,
            $($stream: *mut c_void,)?
        ) -> u32 {
            let (n, e, ix, iy) = (i64::from(n), i64::from(elemSize), i64::from(incx), i64::from(incy));
            let m = Strided { rows: 1, cols: n, elem: e, src: x, src_ld: ix, dst: y, dst_ld: iy };
            copy_strided(stringify!($name), m, $kind, None $(.or(Some($stream)))?)
        }
    };
}

vector_copy!(cublasSetVector, i32, H2D);
vector_copy!(cublasGetVector, i32, D2H);
vector_copy!(cublasSetVector_64, i64, H2D);
vector_copy!(cublasGetVector_64, i64, D2H);
vector_copy!(cublasSetVectorAsync, i32, H2D, stream);
vector_copy!(cublasGetVectorAsync, i32, D2H, stream);
vector_copy!(cublasSetVectorAsync_64, i64, H2D, stream);
vector_copy!(cublasGetVectorAsync_64, i64, D2H, stream);

/// A matrix helper; with `stream`, its Async form.
macro_rules! matrix_copy {
    ($name:ident, $int:ty, $kind:expr $(, $stream:ident)?) => {
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(
            rows: $int,
            cols: $int,
            elemSize: $int,
            A: *mut c_void,
            lda: $int,
            B: *mut c_void,
            ldb: $int,
            $($stream: *mut c_void,)?
        ) -> u32 {
            let (r, c, e) = (i64::from(rows), i64::from(cols), i64::from(elemSize));
            let m =
                Strided { rows: r, cols: c, elem: e, src: A, src_ld: i64::from(lda), dst: B, dst_ld: i64::from(ldb) };
            copy_strided(stringify!($name), m, $kind, None $(.or(Some($stream)))?)
        }
    };
}

matrix_copy!(cublasSetMatrix, i32, H2D);
matrix_copy!(cublasGetMatrix, i32, D2H);
matrix_copy!(cublasSetMatrix_64, i64, H2D);
matrix_copy!(cublasGetMatrix_64, i64, D2H);
matrix_copy!(cublasSetMatrixAsync, i32, H2D, stream);
matrix_copy!(cublasGetMatrixAsync, i32, D2H, stream);
matrix_copy!(cublasSetMatrixAsync_64, i64, H2D, stream);
matrix_copy!(cublasGetMatrixAsync_64, i64, D2H, stream);

// ---- cuBLASXt: matrices in the program's host memory ----

/// The matrices of a cuBLASXt routine `name` with arguments `args`, as (parameter, bytes
/// the routine reads or writes): column-major, `ld × (columns - 1) + rows` elements each, of
/// the routine's type (S, D, C, Z). None for a routine this does not know.
fn xt_matrices(name: &str, args: &[u64]) -> Option<Vec<(usize, u64)>> {
    const OP_N: u64 = chidori_cuda::consts::cublasOperation_t::CUBLAS_OP_N as u64;
    const LEFT: u64 = chidori_cuda::consts::cublasSideMode_t::CUBLAS_SIDE_LEFT as u64;
    let rest = name.strip_prefix("cublasXt")?;
    let elem = match rest.as_bytes().first()? {
        b'S' => 4,
        b'D' | b'C' => 8,
        b'Z' => 16,
        _ => return None,
    };
    let a = |i: usize| args.get(i).copied().unwrap_or(0);
    // (parameter, rows, columns, leading dimension): a dense matrix's extent.
    let dense = |(param, rows, cols, ld): (usize, u64, u64, u64)| -> (usize, u64) {
        let elements = match cols {
            0 => Some(0),
            _ => ld.checked_mul(cols - 1).and_then(|e| e.checked_add(rows)),
        };
        (param, elements.and_then(|e| e.checked_mul(elem)).unwrap_or(u64::MAX))
    };
    let matrices = match &rest[1..] {
        "gemm" => {
            let (m, n, k) = (a(3), a(4), a(5));
            let (a_rows, a_cols) = if a(1) == OP_N { (m, k) } else { (k, m) };
            let (b_rows, b_cols) = if a(2) == OP_N { (k, n) } else { (n, k) };
            vec![dense((7, a_rows, a_cols, a(8))), dense((9, b_rows, b_cols, a(10))), dense((12, m, n, a(13)))]
        }
        "symm" | "hemm" => {
            let (m, n) = (a(3), a(4));
            let order = if a(1) == LEFT { m } else { n };
            vec![dense((6, order, order, a(7))), dense((8, m, n, a(9))), dense((11, m, n, a(12)))]
        }
        "syrk" | "herk" => {
            let (n, k) = (a(3), a(4));
            let (rows, cols) = if a(2) == OP_N { (n, k) } else { (k, n) };
            vec![dense((6, rows, cols, a(7))), dense((9, n, n, a(10)))]
        }
        "syr2k" | "her2k" | "syrkx" | "herkx" => {
            let (n, k) = (a(3), a(4));
            let (rows, cols) = if a(2) == OP_N { (n, k) } else { (k, n) };
            vec![dense((6, rows, cols, a(7))), dense((8, rows, cols, a(9))), dense((11, n, n, a(12)))]
        }
        "trsm" | "trmm" => {
            let (m, n) = (a(5), a(6));
            let order = if a(1) == LEFT { m } else { n };
            let mut v = vec![dense((8, order, order, a(9))), dense((10, m, n, a(11)))];
            if &rest[1..] == "trmm" {
                v.push(dense((12, m, n, a(13))));
            }
            v
        }
        "spmm" => {
            let (m, n) = (a(3), a(4));
            let order = if a(1) == LEFT { m } else { n };
            // The packed triangle: order × (order + 1) / 2 elements.
            let packed = order.checked_mul(order + 1).map(|e| e / 2).and_then(|e| e.checked_mul(elem));
            vec![(6, packed.unwrap_or(u64::MAX)), dense((7, m, n, a(8))), dense((10, m, n, a(11)))]
        }
        _ => return None,
    };
    Some(matrices)
}

/// A cuBLASXt routine (`cublasXt<t>gemm`, `symm`, `syrk`, `trsm`, …): its matrices may be
/// the program's host memory, which the library tiles onto the GPU itself. Each host matrix
/// becomes memory the server mirrors (`crate::mirror::around_library_call`), whose address
/// the server's library is given, so it reads and writes it there; the call waits, as cuBLASXt does with
/// host matrices, and what it wrote comes back into the program's memory before it returns.
/// The routine keeps no pointer to its matrices: the mirrors this call alone holds go after
/// it (pinned memory and stand-ins a graph also holds stay). Device matrices pass as they are.
pub unsafe fn xt(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, u64::from(INVALID_VALUE), || {
        let desc = ctx.form(chidori_protocol::desc::Form::Call);
        let arrays: Vec<(u64, u64)> = xt_matrices(ctx.name, args)
            .unwrap_or_default()
            .into_iter()
            .map(|(param, bytes)| (args.get(param).copied().unwrap_or(0), bytes))
            .collect();
        let owner = crate::mirror::call_owner();
        // SAFETY: the program's arguments, as the routine defines them.
        let status = crate::mirror::around_library_call(ctx.name, owner, &arrays, || unsafe {
            crate::runtime::call(desc, args)
        });
        crate::mirror::release(owner);
        status
    })
}

#[cfg(test)]
mod tests {
    use super::xt_matrices;
    use chidori_cuda::calls::cublas as calls;
    use chidori_protocol::desc::{Dir, Wire};

    #[test]
    fn rotm_parameter_arrays_follow_the_pointer_mode_as_five_scalars() {
        // The handle (parameter 0) holds the pointer mode; host mode sends or returns all five.
        assert!(matches!(
            calls::cublasSrotm_v2.params[6],
            Wire::Scalar { dir: Dir::In, bytes: 20, mode: 0, size: None }
        ));
        assert!(matches!(
            calls::cublasDrotmg_v2.params[5],
            Wire::Scalar { dir: Dir::Out, bytes: 40, mode: 0, size: None }
        ));
        assert!(matches!(
            calls::cublasDrotmg_v2.params[1],
            Wire::Scalar { dir: Dir::InOut, bytes: 8, mode: 0, size: None }
        ));
    }

    #[test]
    fn cublas_xt_matrices_span_their_columns() {
        // Sgemm 70×40 · 40×50, leading dimensions 80, 40, 70: A is 80 × 39 + 70 floats.
        let args = [0, 0, 0, 70, 50, 40, 0, 0xa0, 80, 0xb0, 40, 0, 0xc0, 70];
        assert_eq!(
            xt_matrices("cublasXtSgemm", &args),
            Some(vec![(7, (80 * 39 + 70) * 4), (9, (40 * 49 + 40) * 4), (12, (70 * 49 + 70) * 4)])
        );
        // Transposed A (k × m stored): 40 rows, 70 columns.
        let mut t = args;
        t[1] = 1;
        assert_eq!(xt_matrices("cublasXtSgemm", &t).unwrap()[0], (7, (80 * 69 + 40) * 4));
        // Ztrsm on the right: A is n × n, 16 bytes each; B is m × n.
        let trsm = [0, 1, 0, 0, 0, 3, 5, 0, 0xa0, 5, 0xb0, 3];
        assert_eq!(xt_matrices("cublasXtZtrsm", &trsm), Some(vec![(8, (5 * 4 + 5) * 16), (10, (3 * 4 + 3) * 16)]));
        // A packed triangle, an empty matrix, an unknown routine, a size past the address space.
        let spmm = [0, 0, 0, 4, 2, 0, 0xa0, 0xb0, 4, 0, 0xc0, 4];
        assert_eq!(xt_matrices("cublasXtDspmm", &spmm).unwrap()[0], (6, 10 * 8));
        assert_eq!(xt_matrices("cublasXtSsyrk", &[0, 0, 0, 0, 0, 0, 0xa0, 1, 0, 0xc0, 1]), Some(vec![(6, 0), (9, 0)]));
        assert_eq!(xt_matrices("cublasXtSgemv", &args), None);
        let huge = [0, 0, 0, u64::MAX, 2, 2, 0, 0xa0, u64::MAX, 0xb0, 2, 0, 0xc0, u64::MAX];
        assert_eq!(xt_matrices("cublasXtSgemm", &huge).unwrap()[0].1, u64::MAX);
    }
}
