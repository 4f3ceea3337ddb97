//! The server side of Chidori.
//!
//! * [`supervisor`]: `chidori serve`. Listens, checks each client's protocol version, and
//!   hands the connection to a freshly spawned session worker process. It never creates a
//!   CUDA context.
//! * [`session`]: one worker process per client connection: validates every frame,
//!   checks handles against the session's typed tables, executes calls on one executor
//!   thread per client thread, answers heartbeats. Its exit frees everything the session
//!   held on the GPU.
//! * [`backend`]: what executes calls: [`real`] (the NVIDIA libraries, loaded at run time)
//!   or [`emulated`] (a recorded device profile and host memory, for tests without a GPU).
//! * [`memory`]: the session's device memory, against which every device address a call
//!   passes is checked; [`ipc`]: what sessions of one server share by CUDA IPC; [`auth`]:
//!   the server's token and TLS identity.
//! * [`mirror`]: host memory at the client's pinned addresses, for kernels handed a
//!   pointer to the client's pinned memory.
//! * [`output`]: the worker's standard output (what kernels `printf`), sent to the client
//!   before each reply.

pub mod adapt;
pub mod auth;
pub mod backend;
pub mod cache;
pub mod call_checks;
pub mod content;
pub mod emulated;
pub mod fatal;
pub mod fuzz;
pub mod handles;
pub mod held;
pub mod io;
pub mod ipc;
pub mod lanes;
pub mod loader;
pub mod memory;
pub mod mirror;
pub mod nvjitlink;
pub mod nvrtc;
pub mod output;
pub mod processes;
pub mod profile;
pub mod real;
pub mod records;
pub mod resume;
pub mod session;
pub mod smi;
pub mod supervisor;
pub mod tables;
pub mod told;
pub mod user_objects;
pub mod visible;
pub mod windows;
