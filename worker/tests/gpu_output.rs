//! What the worker's standard output receives (a kernel's printf, written by the driver at
//! a synchronization) goes to the client as an Output frame before the reply of the call
//! that waited. Its own test binary: it redirects this process's standard output.

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::Form;
use chidori_protocol::frame::{self, Frame, HEADER_LEN, Header, Kind};
use chidori_protocol::messages::{self, Call};
use chidori_worker::fuzz;

fn malloc_frame() -> Frame {
    let desc =
        VARIANTS.iter().rev().find(|d| d.name == "cudaMalloc" && d.form == Some(Form::Call)).expect("cudaMalloc");
    let call = Call { args: vec![0, 256], lens: vec![8, 0] };
    let bytes = frame::to_vec(Header::new(Kind::Call, desc.wire, 1, 1), &messages::encode(&call), &[]).unwrap();
    Frame::decode(&bytes).unwrap().0
}

#[test]
fn output_written_before_a_reply_goes_ahead_of_it_once() {
    // SAFETY: keeps a copy of the test's standard output, restored at the end.
    let saved = unsafe { libc::dup(1) };
    assert!(saved >= 0);
    chidori_worker::output::capture().expect("capture");
    let harness = fuzz::emulated_harness();
    let frame = malloc_frame();

    // A reply with nothing printed: its size alone.
    let before = harness.replied();
    harness.run(&frame).unwrap();
    let reply_only = harness.replied() - before;

    // Something printed (as the driver would, through the C stream) before the next reply.
    let text = b"device: thread 0 says 42\n";
    // SAFETY: writes a live buffer to standard output.
    assert_eq!(unsafe { libc::write(1, text.as_ptr().cast(), text.len()) }, text.len() as isize);
    let before = harness.replied();
    harness.run(&frame).unwrap();
    let with_output = harness.replied() - before;
    assert_eq!(
        with_output,
        reply_only + (HEADER_LEN + text.len()) as u64,
        "an Output frame of the bytes, then the reply"
    );
    assert_eq!(harness.last_reply().map(|f| f.header.kind), Some(Kind::Reply), "the reply comes last");

    // Sent once: the next reply is alone again.
    let before = harness.replied();
    harness.run(&frame).unwrap();
    assert_eq!(harness.replied() - before, reply_only);

    // SAFETY: restores the test's standard output.
    unsafe { libc::dup2(saved, 1) };
}
