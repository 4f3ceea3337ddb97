//! One connection's throughput over loopback, one direction, 1 GiB in 8 MiB writes: plain
//! TCP, rustls's buffered connection at both ends (what `Secure` was), and `Secure` (rustls's
//! handshake, then this crate's records). Sender and receiver are two threads of this
//! process, so the numbers are what two cores carry; run with
//! `cargo bench -p chidori-tls --bench one_connection`.

use std::io::{IoSlice, Read, Write};
use std::time::Instant;

mod common;

const TOTAL: usize = 1 << 30;
const CHUNK: usize = 8 << 20;

/// Receive TOTAL bytes from `r` in another thread while `send` writes them; GB/s.
fn run(mut r: impl Read + Send + 'static, send: impl FnOnce(&[u8])) -> f64 {
    let receiving = std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        while got < TOTAL {
            r.read_exact(&mut buf).expect("read");
            got += buf.len();
        }
    });
    let data = vec![7u8; CHUNK];
    let t = Instant::now();
    send(&data);
    receiving.join().expect("receiver");
    TOTAL as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    for round in 1..=3 {
        let (a, b) = common::pair();
        let plain = run(b, |data| {
            let mut a = &a;
            for _ in 0..TOTAL / CHUNK {
                a.write_all(data).expect("write");
            }
        });

        let (config, fingerprint) = common::server_config(chidori_tls::provider());
        let pins = chidori_tls::pin::Pins { explicit: Some(fingerprint), file: None };
        let (mut a, mut b) = common::pair();
        let server = std::thread::spawn(move || {
            let secure = chidori_tls::server_handshake(&mut b, config).expect("server handshake");
            secure.reader(b)
        });
        let client = chidori_tls::client_handshake(&mut a, "localhost:1", &pins).expect("client handshake");
        let records = run(server.join().expect("server"), |data| {
            for _ in 0..TOTAL / CHUNK {
                client.send(&a, &[IoSlice::new(data)]).expect("send");
            }
        });

        // The same client configuration (the pinned certificate), on rustls's buffered API.
        let (config, fingerprint) = common::server_config(chidori_tls::provider());
        let pins = chidori_tls::pin::Pins { explicit: Some(fingerprint), file: None };
        let (a, b) = common::pair();
        let (client_config, _) = pins.client_config("localhost:1");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
        let mut sender =
            rustls::StreamOwned::new(rustls::ClientConnection::new(client_config, name).expect("client"), a);
        let receiver = rustls::StreamOwned::new(rustls::ServerConnection::new(config).expect("server"), b);
        let buffered = run(receiver, |data| {
            for _ in 0..TOTAL / CHUNK {
                sender.write_all(data).expect("write");
            }
            sender.flush().expect("flush");
        });
        println!(
            "round {round}: plain TCP {plain:.2} GB/s, rustls buffered {buffered:.2} GB/s, chidori records {records:.2} GB/s"
        );
    }
}
