//! Hand-written NCCL functions.
#![allow(clippy::missing_safety_doc)]

use chidori_protocol::desc::{Ctx, Form};

/// ncclScalarDevice and ncclScalarHostImmediate.
const SCALAR_DEVICE: u64 = chidori_cuda::consts::ncclScalarResidence_t::ncclScalarDevice as u64;
const SCALAR_HOST_IMMEDIATE: u64 = chidori_cuda::consts::ncclScalarResidence_t::ncclScalarHostImmediate as u64;

/// ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) (`raw_args`): the
/// residence says whether the scalar is a device address or a host value that travels
/// with the call (the library reads it at once).
pub unsafe fn pre_mul_sum(ctx: &Ctx, args: &[u64]) -> u64 {
    let invalid = ctx.codes.invalid_value as u64;
    let form = match args.get(3).copied() {
        Some(SCALAR_DEVICE) => Form::Device,
        Some(SCALAR_HOST_IMMEDIATE) => Form::Call,
        _ => return invalid,
    };
    crate::guard::ffi(ctx.name, invalid, || {
        // SAFETY: the caller's arguments, as the form the residence names describes them.
        unsafe { crate::runtime::call(ctx.form(form), args) }
    })
}

/// ncclCommInitRankConfig and ncclCommSplit (`raw_args`): the configuration starts with its
/// own size (`NCCL_CONFIG_INITIALIZER`), and travels as long as that says
/// ([`super::call_with_own_size`]).
pub unsafe fn config_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    // SAFETY: the caller's arguments; a configuration's first field is its size.
    unsafe { super::call_with_own_size(ctx, args, config_size) }
}

/// A configuration's size: its first field, a `size_t`.
fn config_size(p: *const u8) -> usize {
    // SAFETY: `call_with_own_size` passes a non-null record whose first word is readable.
    unsafe { std::ptr::read_unaligned(p as *const usize) }
}

/// NCCL's text buffer is 1024 bytes (the text is cut there, as NCCL cuts it).
const LAST_ERROR_BYTES: usize = 1024;

/// The copy of the worker's last-error text the program is handed: one buffer for the
/// process, overwritten by each ask, as NCCL's own (a pointer the program kept reads the
/// newest text, never freed memory).
struct LastError(std::cell::UnsafeCell<[u8; LAST_ERROR_BYTES]>);

// SAFETY: written only under LAST_ERROR_LOCK; the program reads it as it reads NCCL's buffer
// (a read racing a later ask may see a mix of two texts, as with NCCL).
unsafe impl Sync for LastError {}

static LAST_ERROR: LastError = LastError(std::cell::UnsafeCell::new([0; LAST_ERROR_BYTES]));
static LAST_ERROR_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// ncclGetLastError(comm): the text of the worker's NCCL (where the program's NCCL calls
/// ran), or what kept Chidori from asking it.
pub unsafe fn last_error(ctx: &Ctx, comm: *mut std::ffi::c_void) -> *mut std::ffi::c_void {
    let text = crate::guard::ffi(ctx.name, String::new(), || {
        crate::trace::local(ctx.name);
        let conn = match crate::conn::get() {
            Ok(conn) => conn,
            Err(e) => return format!("Chidori: no connection to the server to ask NCCL's last error: {e}"),
        };
        let request = chidori_protocol::messages::Service::NcclLastError { comm: comm as u64 };
        match conn.service(&request, &[]) {
            Ok(chidori_protocol::messages::ServiceReply::Name(text)) => text,
            Ok(chidori_protocol::messages::ServiceReply::Error { message, .. }) => {
                format!("Chidori: the server could not give NCCL's last error: {message}")
            }
            Ok(_) => "Chidori: the server answered NCCL's last error with something else".to_owned(),
            Err(e) => format!("Chidori: asking the server for NCCL's last error failed: {e}"),
        }
    });
    let _held = LAST_ERROR_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let buffer = LAST_ERROR.0.get().cast::<u8>();
    // At most 1023 bytes of the text (an interior NUL ends it early, as C reads it), then NUL.
    let bytes = text.as_bytes();
    let len = bytes.len().min(LAST_ERROR_BYTES - 1);
    // SAFETY: the buffer is LAST_ERROR_BYTES long and written only under the lock; len + 1
    // bytes fit.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer, len);
        *buffer.add(len) = 0;
    }
    buffer.cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 80-byte configuration of NCCL 2.27 (size 80 first), ending where the next page
    /// is inaccessible: the copy for 2.32's 120-byte record reads none of that page.
    #[test]
    fn an_older_configuration_is_copied_as_far_as_its_size_says() {
        // SAFETY: two fresh anonymous pages, the second made inaccessible, unmapped at the end.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let base = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            assert_eq!(libc::mprotect((base as *mut u8).add(page).cast(), page, libc::PROT_NONE), 0);
            let config = (base as *mut u8).add(page - 80);
            std::ptr::write_bytes(config, 0x5a, 80);
            std::ptr::write_unaligned(config as *mut usize, 80);
            let (copy, _) = super::super::own_size_copy(config, 120, config_size);
            assert_eq!(copy.len(), 120);
            assert_eq!(usize::from_ne_bytes(copy[..8].try_into().unwrap()), 80);
            assert!(copy[8..80].iter().all(|&b| b == 0x5a) && copy[80..].iter().all(|&b| b == 0));
            // A size past the record the call is described by is cut there (120 bytes, up to
            // the inaccessible page).
            let longer = config.sub(40);
            std::ptr::write_unaligned(longer as *mut usize, 1 << 20);
            let (copy, _) = super::super::own_size_copy(longer, 120, config_size);
            assert_eq!(usize::from_ne_bytes(copy[..8].try_into().unwrap()), 1 << 20);
            assert_eq!(copy[119], 0x5a);
            libc::munmap(base, 2 * page);
        }
    }
}
