//! Entry points for fuzz targets (`fuzz/fuzz_targets/*.rs`, one line each) and the
//! property tests that drive the same functions on stable Rust: the worker's streaming
//! frame reader, and its argument checks for every generated call descriptor, run against
//! the emulated backend through a [`Harness`] (a session without a socket).
//!
//! A call input is structured so that random bytes reach deep: two bytes pick the
//! descriptor, then each parameter takes a mode byte (a consistent length, NULL, a device
//! address, a live handle or allocation of the session, or a raw value) and eight bytes of
//! value; what is left fills the input buffers.

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::{DEVICE_LEN, Dir, Wire};
use chidori_protocol::frame::{self, Frame, Header, Kind};
use chidori_protocol::messages::{self, Call, NULL_LEN};

use crate::session::Harness;

/// GPU memory the fuzzed session may allocate (the emulated backend keeps it in host RAM).
pub const QUOTA: u64 = 256 << 20;

/// The emulated backend with the recorded H200 profile.
pub fn emulated_harness_backend() -> Arc<dyn crate::backend::Backend> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/nvidia-h200.json");
    let profile = crate::profile::load(&path).expect("the recorded device profile");
    Arc::new(crate::emulated::Emulated::new(profile))
}

/// A session over the emulated backend, with a [`QUOTA`].
pub fn emulated_harness() -> Harness {
    Harness::new(emulated_harness_backend(), Some(QUOTA))
}

/// One session shared by every input of a fuzzing process (state accumulates, as in a
/// real session).
pub fn shared_harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(emulated_harness)
}

/// Read frames from `data` as the worker reads its socket, in pieces whose sizes come from
/// the data, with timeouts in between, until the reader reports an error or the end.
pub fn frame_reader(data: &[u8]) {
    struct Pieces<'a> {
        data: &'a [u8],
        step: usize,
    }
    impl Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.step += 1;
            if self.data.is_empty() {
                return Ok(0);
            }
            if self.step.is_multiple_of(5) {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let n = (usize::from(self.data[0]) + 1).min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    let mut reader = Pieces { data, step: 0 };
    for _ in 0..64 {
        if crate::io::read_frame(&mut reader, Duration::ZERO).is_err() {
            break;
        }
    }
}

/// Take bytes from the front of an input, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else { return 0 };
        self.0 = rest;
        b
    }

    fn word(&mut self) -> u64 {
        let mut w = [0u8; 8];
        for b in &mut w {
            *b = self.byte();
        }
        u64::from_le_bytes(w)
    }
}

/// A Call frame built from `data` (see the module docs), or None for an empty input.
pub fn call_frame(harness: &Harness, data: &[u8]) -> Option<Frame> {
    if data.len() < 2 {
        return None;
    }
    let mut input = Input(data);
    let index = usize::from(u16::from_le_bytes([input.byte(), input.byte()])) % VARIANTS.len();
    let desc = VARIANTS[index];
    let n = desc.params.len();
    let mut args = vec![0u64; n];
    let mut modes = vec![0u8; n];
    for i in 0..n {
        modes[i] = input.byte();
        let raw = input.word();
        args[i] = match (modes[i] % 8, desc.params[i]) {
            // Small values: counts and enums that lengths are computed from.
            (0, _) => raw % 64,
            (1, Wire::Handle { kind, .. } | Wire::RecordHandle { kind, .. }) => {
                harness.live_handle(kind, raw).unwrap_or(raw)
            }
            (1 | 2, Wire::Device) | (2, Wire::Scalar { .. }) => harness.live_address(raw).unwrap_or(raw),
            _ => raw,
        };
    }
    let mut lens = vec![0u64; n];
    let mut bulk = Vec::new();
    for i in 0..n {
        let mode = modes[i] / 8 % 4;
        let len = match desc.params[i] {
            Wire::Buf { dir, elem, len, .. } => {
                let count = len.map_or(Some(1), |l| l.eval(&args)).unwrap_or(0);
                let bytes = count.saturating_mul(u64::from(elem)).min(1 << 16);
                if dir != Dir::Out && mode != 1 {
                    bulk.resize(bulk.len() + bytes as usize, input.byte());
                }
                bytes
            }
            Wire::Handles { len, .. } => {
                let bytes = len.eval(&args).unwrap_or(0).saturating_mul(8).min(1 << 12);
                if mode != 1 {
                    for _ in 0..bytes / 8 {
                        let word = input.word();
                        bulk.extend_from_slice(&word.to_le_bytes());
                    }
                }
                bytes
            }
            Wire::Scalar { dir, bytes, .. } => {
                if mode == 2 {
                    DEVICE_LEN
                } else {
                    if dir != Dir::Out && mode != 1 {
                        bulk.resize(bulk.len() + bytes as usize, input.byte());
                    }
                    u64::from(bytes)
                }
            }
            Wire::ByValRecord { bytes } => {
                bulk.resize(bulk.len() + bytes as usize, input.byte());
                u64::from(bytes)
            }
            Wire::OutHandle { .. } | Wire::NewRecordHandle { .. } => 8,
            Wire::Str => {
                let s = [b'x', input.byte() | 1, 0];
                bulk.extend_from_slice(&s);
                3
            }
            _ => 0,
        };
        lens[i] = match mode {
            1 => NULL_LEN,
            3 => input.word(),
            _ => len,
        };
    }
    let call = Call { args, lens };
    let header = Header::new(Kind::Call, desc.wire, 1, 1);
    let bytes = frame::to_vec(header, &messages::encode(&call), &[&bulk]).ok()?;
    Frame::decode(&bytes).ok().map(|(f, _)| f)
}

/// Run the call built from `data` on the shared harness. A refusal is fine; a panic or a
/// signal is the bug the fuzzer looks for.
pub fn call(data: &[u8]) {
    let harness = shared_harness();
    if let Some(frame) = call_frame(harness, data) {
        let _ = harness.run(&frame);
    }
}

/// Run `data` as a raw frame (any kind) on the shared harness.
pub fn raw_frame(data: &[u8]) {
    let _ = shared_harness().run_bytes(data);
}
