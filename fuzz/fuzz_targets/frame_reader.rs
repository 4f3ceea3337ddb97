//! The worker's streaming frame reader, fed arbitrary bytes in pieces with timeouts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chidori_worker::fuzz::frame_reader(data));
