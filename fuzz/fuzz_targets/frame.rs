//! Frame decoding on arbitrary bytes, and every message the server receives: an error,
//! never a panic, an out-of-bounds read or an allocation a header merely claims.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chidori_protocol::fuzz::server_messages(data));
