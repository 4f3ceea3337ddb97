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
