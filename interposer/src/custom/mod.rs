//! Hand-written exports: what a spec cannot express (class `custom` or `local` in
//! specs/*.toml). The generated exports in generated/client call these by name, so a
//! missing one is a compile error.

pub mod arrays;
pub mod capture;
pub mod context;
pub mod cublas;
pub mod cublaslt;
pub mod cudart;
pub mod cudnn;
pub mod cufft;
pub mod cupti;
pub mod curand;
pub mod cusolver;
pub mod cusparse;
pub mod cusparselt;
pub mod driver;
pub mod entry;
pub mod export;
pub mod graphs;
pub mod handles;
pub mod ipc;
pub mod kernels;
pub mod libraries;
pub mod link;
pub mod loops;
pub mod memory;
pub mod nccl;
pub mod nvjitlink;
pub mod nvml;
pub mod nvrtc;
pub mod placed;
pub mod streams;
pub mod sync;

/// What every new connection asks before the program's first call
/// ([`crate::conn::on_connect`]): device 0's allocation window and the questions every
/// program asks once, sent without waiting, their answers taken where the program needs them.
fn connected(conn: &crate::conn::Conn) {
    placed::ask_early(conn);
    context::ask_early(conn);
}

// SAFETY: a constructor of this library that only stores a function pointer (no call into
// the program, nothing that needs the process set up).
#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER_CONNECTED: extern "C" fn() = {
    extern "C" fn register() {
        crate::conn::on_connect(connected);
    }
    register
};

/// A call whose record says its own size in its first word (NCCL's configuration: a
/// `size_t`; NVML's versioned records: the low 24 bits of `NVML_STRUCT_VERSION`), `raw_args`.
/// A program built against an older library holds a shorter record than the newest headers'
/// the call is described by: the record travels as a copy of the bytes it says it holds (at
/// most the newest size), the rest zero, and only those come back where the call writes it.
/// The server's library reads the size the program wrote.
///
/// # Safety
/// `args` are the call's arguments; the record argument is NULL or the program's record,
/// whose first word `own_size` reads.
pub(crate) unsafe fn call_with_own_size(
    ctx: &chidori_cuda::desc::Ctx,
    args: &[u64],
    own_size: fn(*const u8) -> usize,
) -> u64 {
    use chidori_protocol::desc::{Dir, Form, Wire};
    let desc = ctx.form(Form::Call);
    let record = desc.params.iter().enumerate().find_map(|(i, w)| match w {
        Wire::Buf { dir, record: Some(r), .. } => Some((i, *dir, *r)),
        _ => None,
    });
    let full = record.and_then(|(_, _, r)| chidori_cuda::structs::get(ctx.version, r)).map_or(0, |m| m.size as usize);
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        let Some((i, dir, p)) = record
            .and_then(|(i, dir, _)| Some((i, dir, *args.get(i)? as *mut u8)))
            .filter(|&(_, _, p)| !p.is_null() && full >= size_of::<u32>())
        else {
            // SAFETY: the caller's arguments, as the call is described.
            return unsafe { crate::runtime::call(desc, args) };
        };
        // SAFETY: per the contract.
        let (mut copy, n) = unsafe { own_size_copy(p, full, own_size) };
        let mut args = args.to_vec();
        args[i] = copy.as_mut_ptr() as u64;
        // SAFETY: the caller's arguments, the record in `copy`.
        let status = unsafe { crate::runtime::call(desc, &args) };
        if dir != Dir::In {
            // SAFETY: only the `n` bytes the program's record holds go back.
            unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), p, n) };
        }
        status
    })
}

/// `full` bytes: the record at `p` as far as `own_size` says (at least its first 4 bytes, at
/// most `full`), then zeros; and how many bytes came from the record.
///
/// # Safety
/// `p` points at a record whose first word is readable and says how many bytes it holds.
unsafe fn own_size_copy(p: *const u8, full: usize, own_size: fn(*const u8) -> usize) -> (Vec<u8>, usize) {
    let mut copy = vec![0u8; full];
    let n = own_size(p).clamp(size_of::<u32>(), full);
    // SAFETY: the program's record holds at least `n` bytes (no more than it says).
    unsafe { std::ptr::copy_nonoverlapping(p, copy.as_mut_ptr(), n) };
    (copy, n)
}
