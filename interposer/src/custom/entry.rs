//! Driver entry points by name: `cuGetProcAddress{,_v2}` and
//! `cudaGetDriverEntryPoint{,ByVersion}` hand out the shims' own driver functions, chosen
//! from the generated `cudaTypedefs.h` table (`chidori_cuda::procs::PROCS`) by the version
//! and per-thread flag asked for, so that code holding them (c10's DriverAPI, cudart
//! itself) calls through Chidori. No round trip.

use std::ffi::{CStr, c_char, c_void};

use chidori_cuda::procs::PROCS;

/// CUdriverProcAddressQueryResult / cudaDriverEntryPointQueryResult (same values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    Success = 0,
    SymbolNotFound = 1,
    VersionNotSufficient = 2,
}

/// The exported symbol that serves `base` for a caller of `version` (e.g. 12080), with the
/// per-thread-default-stream variant if `per_thread` and one exists.
pub fn symbol_for(base: &str, version: u32, per_thread: bool) -> Result<&'static str, Query> {
    let mut known = false;
    let mut best: Option<&'static chidori_cuda::procs::ProcEntry> = None;
    for e in PROCS.iter().filter(|e| e.base == base) {
        known = true;
        if e.version > version || (e.per_thread && !per_thread) {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => (e.version, e.per_thread) > (b.version, b.per_thread),
        };
        if better {
            best = Some(e);
        }
    }
    match best {
        Some(e) => Ok(e.symbol),
        None if known => Err(Query::VersionNotSufficient),
        None => Err(Query::SymbolNotFound),
    }
}

/// Address of an exported driver function of the libcuda.so.1 shim (the process's driver).
fn address(symbol: &str) -> Option<*mut c_void> {
    let name = std::ffi::CString::new(symbol).ok()?;
    // SAFETY: dlopen with RTLD_NOLOAD only finds an already loaded library; dlsym reads a
    // NUL-terminated name. Neither is given pointers Chidori does not own.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        let handle = if lib.is_null() { libc::RTLD_DEFAULT } else { lib };
        let f = libc::dlsym(handle, name.as_ptr());
        if !lib.is_null() {
            libc::dlclose(lib);
        }
        (!f.is_null()).then_some(f)
    }
}

/// Resolve `symbol` for a caller of `version`: the function, or why there is none.
///
/// # Safety
/// `symbol` must be null or a NUL-terminated string.
pub unsafe fn resolve(symbol: *const c_char, version: u32, per_thread: bool) -> Result<*mut c_void, Query> {
    if symbol.is_null() {
        return Err(Query::SymbolNotFound);
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().map_err(|_| Query::SymbolNotFound)?;
    let exported = match symbol_for(name, version, per_thread) {
        Ok(s) => s,
        // Not in cudaTypedefs.h (a newer or private name): an export of that exact name.
        Err(Query::SymbolNotFound) => name,
        Err(e) => return Err(e),
    };
    address(exported).ok_or(Query::SymbolNotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_variant_the_caller_knows() {
        // cuMemAlloc is cuMemAlloc_v2 since 3.2.
        assert_eq!(symbol_for("cuMemAlloc", 12080, false), Ok("cuMemAlloc_v2"));
        assert_eq!(symbol_for("cuNoSuchFunction", 13000, false), Err(Query::SymbolNotFound));
    }

    #[test]
    fn per_thread_variants_only_when_asked() {
        let legacy = symbol_for("cuMemcpyAsync", 13000, false).unwrap();
        let per_thread = symbol_for("cuMemcpyAsync", 13000, true).unwrap();
        assert!(!legacy.ends_with("_ptsz"), "{legacy}");
        assert!(per_thread.ends_with("_ptsz"), "{per_thread}");
    }

    #[test]
    fn a_function_newer_than_the_caller_is_version_not_sufficient() {
        // cuMemCreate arrived in 10.2.
        assert_eq!(symbol_for("cuMemCreate", 10000, false), Err(Query::VersionNotSufficient));
        assert!(symbol_for("cuMemCreate", 12080, false).is_ok());
    }
}

// ---- The exported functions ----

const SUCCESS: u32 = chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE;
const NOT_FOUND: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_FOUND;
/// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM and _LEGACY_STREAM (the runtime's
/// cudaEnablePerThreadDefaultStream and cudaEnableLegacyStream are macros of the same values).
const PER_THREAD: u64 =
    chidori_cuda::consts::CUdriverProcAddress_flags_enum::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as u64;
const LEGACY: u64 = chidori_cuda::consts::CUdriverProcAddress_flags_enum::CU_GET_PROC_ADDRESS_LEGACY_STREAM as u64;

/// # Safety
/// Pointers as `cuGetProcAddress_v2` documents; `status` may be null.
unsafe fn get_proc(
    name: &'static str,
    symbol: *const c_char,
    pfn: *mut c_void,
    version: u32,
    per_thread: bool,
    status: *mut c_void,
    not_found: u32,
) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        crate::trace::local(name);
        if pfn.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: per the contract.
        let result = unsafe { resolve(symbol, version, per_thread) };
        let (f, query) = match result {
            Ok(f) => (f, Query::Success),
            Err(q) => (std::ptr::null_mut(), q),
        };
        // SAFETY: the caller's void** and (optional) query-result enum.
        unsafe {
            std::ptr::write_unaligned(pfn as *mut *mut c_void, f);
            if !status.is_null() {
                std::ptr::write_unaligned(status as *mut u32, query as u32);
            }
        }
        if query != Query::Success && !symbol.is_null() {
            // SAFETY: checked non-null; a NUL-terminated name per the contract.
            let asked = unsafe { CStr::from_ptr(symbol) }.to_string_lossy().into_owned();
            crate::log::once_owned(&format!("get-proc-{asked}"), || {
                tracing::debug!("{name}: no {asked} for CUDA {version} ({query:?})")
            });
        }
        if query == Query::Success { SUCCESS } else { not_found }
    })
}

fn per_thread(flags: u64, ptsz: bool) -> bool {
    flags & PER_THREAD != 0 || (ptsz && flags & LEGACY == 0)
}

pub mod driver {
    //! `cuGetProcAddress{,_v2}`.
    #![allow(non_snake_case, clippy::missing_safety_doc)]
    use std::ffi::c_void;

    pub unsafe fn cuGetProcAddress(symbol: *mut c_void, pfn: *mut c_void, cudaVersion: i32, flags: u64) -> u32 {
        let v = u32::try_from(cudaVersion).unwrap_or(0);
        // SAFETY: the caller's arguments, as documented.
        unsafe {
            super::get_proc(
                "cuGetProcAddress",
                symbol as _,
                pfn,
                v,
                super::per_thread(flags, false),
                std::ptr::null_mut(),
                super::NOT_FOUND,
            )
        }
    }

    pub unsafe fn cuGetProcAddress_v2(
        symbol: *mut c_void,
        pfn: *mut c_void,
        cudaVersion: i32,
        flags: u64,
        symbolStatus: *mut c_void,
    ) -> u32 {
        let v = u32::try_from(cudaVersion).unwrap_or(0);
        // SAFETY: the caller's arguments, as documented.
        unsafe {
            super::get_proc(
                "cuGetProcAddress",
                symbol as _,
                pfn,
                v,
                super::per_thread(flags, false),
                symbolStatus,
                super::NOT_FOUND,
            )
        }
    }
}

pub mod cudart {
    //! `cudaGetDriverEntryPoint{,ByVersion}`: the version is that of the runtime the caller
    //! was built against (its SONAME's), unless given. A symbol the driver lacks is
    //! reported through `driverStatus` with cudaSuccess (12.0+), as c10 expects; 11.8 has
    //! no status and answers cudaErrorSymbolNotFound.
    #![allow(non_snake_case, clippy::missing_safety_doc)]
    use std::ffi::c_void;

    use chidori_cuda::desc::Ctx;

    use super::{NOT_FOUND, SUCCESS, get_proc, per_thread};

    fn entry(symbol: *mut c_void, f: *mut c_void, version: u32, flags: u64, status: *mut c_void, ptsz: bool) -> u32 {
        let not_found = if status.is_null() { NOT_FOUND } else { SUCCESS };
        // SAFETY: the caller's arguments, as documented.
        let s = unsafe {
            get_proc("cudaGetDriverEntryPoint", symbol as _, f, version, per_thread(flags, ptsz), status, not_found)
        };
        crate::state::set_last_error(s);
        s
    }

    /// The version of the runtime a caller of `ctx`'s export was built against: the newest
    /// its soname stands for (11.8 and 12.8; 13.0 for libcudart.so.13).
    pub fn runtime_version(ctx: &Ctx) -> u32 {
        match ctx.version.split('.').next() {
            Some("11") => 11080,
            Some("12") => 12080,
            _ => 13000,
        }
    }

    /// cudaGetDriverEntryPoint of 11.8 and its `_ptsz` form (no driver status).
    pub unsafe fn entry_point_3(ctx: &Ctx, symbol: *mut c_void, f: *mut c_void, flags: u64) -> u32 {
        entry(symbol, f, runtime_version(ctx), flags, std::ptr::null_mut(), ctx.per_thread())
    }

    /// cudaGetDriverEntryPoint of 12.x and 13.x and its `_ptsz` form.
    pub unsafe fn entry_point_4(
        ctx: &Ctx,
        symbol: *mut c_void,
        f: *mut c_void,
        flags: u64,
        status: *mut c_void,
    ) -> u32 {
        entry(symbol, f, runtime_version(ctx), flags, status, ctx.per_thread())
    }

    pub unsafe fn cudaGetDriverEntryPointByVersion(
        symbol: *mut c_void,
        funcPtr: *mut c_void,
        cudaVersion: u32,
        flags: u64,
        driverStatus: *mut c_void,
    ) -> u32 {
        entry(symbol, funcPtr, cudaVersion, flags, driverStatus, false)
    }

    pub unsafe fn cudaGetDriverEntryPointByVersion_ptsz(
        symbol: *mut c_void,
        funcPtr: *mut c_void,
        cudaVersion: u32,
        flags: u64,
        driverStatus: *mut c_void,
    ) -> u32 {
        entry(symbol, funcPtr, cudaVersion, flags, driverStatus, true)
    }
}
