//! What opening records costs the receiving side alone, per cipher suite and read size: a
//! client sends 512 MiB of records over loopback, the server side keeps the ciphertext as it
//! came, then one thread opens it through [`chidori_tls::SecureReader`] from memory, reading
//! 16 KiB at a time (records opened in the reader's buffer and copied out) or 8 MiB (opened
//! in the caller's buffer). Sealing is timed too (sealing and writing to the socket while
//! another thread drains it). Run with `cargo bench -p chidori-tls --bench receive`.

use std::io::{IoSlice, Read};
use std::sync::Arc;
use std::time::Instant;

mod common;

const TOTAL: usize = 512 << 20;
const CHUNK: usize = 8 << 20;

/// The ciphertext of TOTAL bytes as the server received it, its reader's connection, and
/// the sealing rate (GB/s).
fn capture(suites: Vec<rustls::SupportedCipherSuite>) -> (Vec<u8>, Arc<chidori_tls::Secure>, f64) {
    // The server offers `suites` only (the client offers AES-128-GCM first).
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = suites;
    let (config, fingerprint) = common::server_config(Arc::new(provider));
    let pins = chidori_tls::pin::Pins { explicit: Some(fingerprint), file: None };
    let (mut a, mut b) = common::pair();
    let server = std::thread::spawn(move || {
        let secure = chidori_tls::server_handshake(&mut b, config).expect("server handshake");
        let mut wire = Vec::with_capacity(TOTAL + TOTAL / 500);
        b.read_to_end(&mut wire).expect("read");
        (wire, secure)
    });
    let client = chidori_tls::client_handshake(&mut a, "localhost:1", &pins).expect("client handshake");
    let data = vec![7u8; CHUNK];
    let t = Instant::now();
    for _ in 0..TOTAL / CHUNK {
        client.send(&a, &[IoSlice::new(&data)]).expect("send");
    }
    let sealed = TOTAL as f64 / t.elapsed().as_secs_f64() / 1e9;
    drop(a);
    let (wire, secure) = server.join().expect("server");
    (wire, secure, sealed)
}

fn main() {
    use rustls::crypto::ring::cipher_suite::{TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384};
    for round in 1..=2 {
        for (suite, name) in [(TLS13_AES_128_GCM_SHA256, "AES-128-GCM"), (TLS13_AES_256_GCM_SHA384, "AES-256-GCM")] {
            for read in [16 << 10, CHUNK] {
                let (wire, secure, sealed) = capture(vec![suite]);
                let mut reader = secure.reader(std::io::Cursor::new(wire));
                let mut buf = vec![0u8; read];
                let (mut got, t) = (0, Instant::now());
                while got < TOTAL {
                    let n = reader.read(&mut buf).expect("open");
                    assert!(n > 0, "the records ended early");
                    got += n;
                }
                let opened = TOTAL as f64 / t.elapsed().as_secs_f64() / 1e9;
                println!(
                    "round {round}: {name}, reads of {:>4} KiB: opened {opened:.2} GB/s (one thread, from memory); sealed and sent {sealed:.2} GB/s",
                    read >> 10
                );
            }
        }
    }
}
