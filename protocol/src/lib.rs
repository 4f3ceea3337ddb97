//! Chidori's wire protocol.
//!
//! A connection carries frames: a fixed 32-byte [`frame::Header`] outside any archive
//! (magic, protocol version, message kind, call id, thread, sequence, lengths), then an rkyv
//! archive of the kind's message ([`messages`]), then raw bulk bytes (buffer contents of a
//! call or reply, kept out of the archive so large copies are written straight from and
//! read straight into place). Every archive is validated (bytecheck) before use.
//!
//! [`desc`] holds the types of the generated call descriptors: for every forwarded
//! function, how each parameter travels. Client and worker interpret the same tables.

pub mod codec;
pub mod desc;
pub mod env;
pub mod frame;
pub mod fuzz;
pub mod messages;
pub mod mirror;
pub mod pack;
pub mod read;
pub mod resume;
pub mod sock;

/// Re-exported so both sides use the same rkyv.
pub use rkyv;

/// Bumped on any incompatible change to frames or messages (31: a mirror pull's dense
/// changes travel as bitmaps, `MirrorChanges::mask`; 30: module loads named by
/// the client, `Service::LoadModuleNamed`, their images pulled from the client where the
/// server lacks them, `Kind::NeedModule`/`Kind::ModuleImage`; 29: captures begun without
/// waiting, named by the client, `Service::CaptureNamed`, and frees of placed memory on
/// an idle device without an answer, `Service::WindowFree`; 28: module loads behind the
/// calls, `Service::LoadModuleBehind`; 27: the nodes of the graph a
/// capture's end made, `GraphList::Ended`; 26: allocation windows, the
/// client placing device allocations itself; 25: batch memory operation
/// graph nodes; 23: mirror pulls come in pages
/// of packed runs; 22: library records the program
/// holds travel by id ([`desc::Wire::RecordHandle`]), user objects, NCCL's last error as a
/// service; 21: a scalar in device pointer mode may carry its width, [`desc::device_len`]; a
/// compile brings back LTO, OptiX and NVVM IR and the precompiled header's status).
pub const PROTOCOL_VERSION: u16 = 31;
