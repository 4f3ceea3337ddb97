//! libchidori.so: the client core.
//!
//! The shim libraries (`libcudart.so.13`, `libcuda.so.1`, … built from generated/shims)
//! define the symbols applications bind to and jump into the `__chidori_*` exports here,
//! which come from `generated/client` (included below, since they call into this crate).
//! Invariant: nothing in this library loads or calls a real NVIDIA library.

pub mod ahead;
pub mod conn;
pub mod content;
pub mod custom;
pub mod fatbin;
pub mod guard;
pub mod lanes;
pub mod learned;
pub mod loader;
pub mod log;
pub mod mirror;
pub mod modules;
pub mod origin;
pub mod registry;
pub mod runtime;
pub mod scalars;
pub mod state;
pub mod trace;
pub mod unsupported;

#[rustfmt::skip] // generated: printed by prettyplease, never reformatted
#[path = "../../generated/client/mod.rs"]
pub mod exports;
