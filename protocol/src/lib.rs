//! Chidori's wire protocol.
//!
//! [`desc`] holds the types of the generated call descriptors: for every forwarded
//! function, how each parameter travels. Client and worker interpret the same tables.

pub mod desc;
pub mod env;
