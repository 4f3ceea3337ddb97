//! Entry points for fuzz targets and property tests: whatever the bytes, decoding a frame
//! and every message either side may receive fails cleanly (an error), never panics, reads
//! out of bounds or allocates what a header merely claims.

use crate::frame::Frame;
use crate::messages::{
    self, AsyncError, Call, Goodbye, Hello, HostCallback, HostCallbackDone, Launch, Progress, Refuse, Reply, Service,
    ServiceReply, Welcome,
};

/// Decode `data` as a frame and its archive as every message the server receives.
pub fn server_messages(data: &[u8]) {
    let Ok((frame, _)) = Frame::decode(data) else { return };
    let _ = messages::decode::<Hello>(&frame, "hello");
    let _ = messages::access::<Call>(&frame, "call");
    let _ = messages::decode::<Call>(&frame, "call");
    let _ = messages::decode::<Launch>(&frame, "launch");
    let _ = messages::decode::<Service>(&frame, "service");
    let _ = messages::decode::<HostCallbackDone>(&frame, "callback done");
    let _ = messages::decode::<Goodbye>(&frame, "goodbye");
}

/// Decode `data` as a frame and its archive as every message the client receives, and
/// split its bulk by lengths taken from the data itself.
pub fn client_messages(data: &[u8]) {
    let Ok((frame, _)) = Frame::decode(data) else { return };
    let _ = messages::decode::<Welcome>(&frame, "welcome");
    let _ = messages::decode::<Refuse>(&frame, "refusal");
    let _ = messages::decode::<AsyncError>(&frame, "async error");
    let _ = messages::decode::<HostCallback>(&frame, "host callback");
    let _ = messages::decode::<ServiceReply>(&frame, "service reply");
    let _ = messages::decode::<Progress>(&frame, "progress");
    if let Ok(reply) = messages::access::<Reply>(&frame, "reply") {
        let lens: Vec<u64> = reply.lens.iter().map(|l| l.to_native()).collect();
        let _ = frame.split_bulk(lens);
    }
    let lens: Vec<u64> = data.chunks(8).take(8).map(|c| c.iter().map(|&b| u64::from(b)).sum()).collect();
    let _ = frame.split_bulk(lens);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::frame::{Header, Kind, to_vec};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_bytes_decode_cleanly(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            server_messages(&data);
            client_messages(&data);
        }

        #[test]
        fn arbitrary_archives_behind_valid_headers_decode_cleanly(kind in 1u8..=15, archive in proptest::collection::vec(any::<u8>(), 0..400),
                                                                   bulk in proptest::collection::vec(any::<u8>(), 0..64)) {
            let Some(kind) = Kind::from_u8(kind) else { return Ok(()) };
            let bytes = to_vec(Header::new(kind, 1, 1, 1), &archive, &[&bulk]).unwrap();
            server_messages(&bytes);
            client_messages(&bytes);
        }
    }
}
