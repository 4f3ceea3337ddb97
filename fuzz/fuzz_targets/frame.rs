//! Frame decoding on arbitrary bytes: decoding a frame and every message a peer may send
//! must fail cleanly (an error), never panic, read out of bounds or allocate absurdly.
#![no_main]

use chidori_protocol::frame::Frame;
use chidori_protocol::messages::{self, Call, Hello, HostCallbackDone, Launch, Reply, Service};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((frame, _)) = Frame::decode(data) else { return };
    let _ = messages::access::<Call>(&frame, "call");
    let _ = messages::access::<Reply>(&frame, "reply");
    let _ = messages::decode::<Hello>(&frame, "hello");
    let _ = messages::decode::<Launch>(&frame, "launch");
    let _ = messages::decode::<Service>(&frame, "service");
    let _ = messages::decode::<HostCallbackDone>(&frame, "callback done");
    let _ = frame.split_bulk([1u64, 2, 3]);
});
