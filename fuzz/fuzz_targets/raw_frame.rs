//! Arbitrary bytes as one Call, Launch or Service frame, run by a session (no socket) on
//! the emulated backend.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chidori_worker::fuzz::raw_frame(data));
