//! What the TLS benches share: a server's configuration and a loopback pair.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

/// A server configuration with a fresh self-signed certificate, as `chidori serve
/// --secure` makes it (TLS 1.3, no tickets, secrets extractable for `chidori_tls`'s
/// records), offering `provider`'s suites; and the certificate's fingerprint.
pub fn server_config(provider: Arc<rustls::crypto::CryptoProvider>) -> (Arc<rustls::ServerConfig>, String) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("a certificate");
    let der = made.cert.der().clone();
    let fingerprint = chidori_tls::pin::fingerprint(&der);
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(chidori_tls::VERSIONS)
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .expect("the key fits");
    config.send_tls13_tickets = 0;
    config.enable_secret_extraction = true;
    (Arc::new(config), fingerprint)
}

/// Two ends of a loopback TCP connection.
pub fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    (a, b)
}
