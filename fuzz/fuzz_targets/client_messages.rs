//! Every message the client receives (welcome, replies and their bulk split, refusals,
//! host callbacks, service replies), decoded from arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chidori_protocol::fuzz::client_messages(data));
