//! Calls of every generated descriptor with arguments built from the input, run by a
//! session (no socket) on the emulated backend: the worker's argument checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chidori_worker::fuzz::call(data));
