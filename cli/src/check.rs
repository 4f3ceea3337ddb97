//! `chidori run`'s preflight: connect, shake hands (TLS and the token where the client has
//! a token), and turn every failure into a message a user can act on before the program
//! starts.

use std::io::{IoSlice, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use chidori_protocol::frame::{self, Frame, FrameError, Header, Kind};
use chidori_protocol::messages::{self, Goodbye, Hello, Refuse, RefuseReason, Welcome};
use chidori_protocol::{PROTOCOL_VERSION, env};
use chidori_tls::pin::Pins;
use chidori_tls::{HandshakeError, Secure, SecureReader};

pub fn address(server: &str) -> String {
    if server.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        server.to_owned()
    } else {
        format!("{server}:{}", env::DEFAULT_PORT)
    }
}

/// How the client proves itself and checks the server.
pub struct ClientAuth {
    /// The server's token (None: a plaintext session, which only loopback servers allow).
    pub token: Option<String>,
    pub pins: Pins,
}

/// The preflight's connection: plain, or TLS over the socket.
enum Link {
    Plain(TcpStream),
    Tls { sock: TcpStream, secure: Arc<Secure>, reader: SecureReader<TcpStream> },
}

impl Link {
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Link::Plain(s) => s.write_all(bytes),
            Link::Tls { sock, secure, .. } => secure.send(sock, &[IoSlice::new(bytes)]),
        }
    }

    fn read(&mut self) -> Result<Frame, FrameError> {
        match self {
            Link::Plain(s) => chidori_tls::read_plain_frame(s),
            Link::Tls { reader, .. } => chidori_tls::read_plain_frame(reader),
        }
    }
}

/// What a refusal means for the user.
fn refused(addr: &str, frame: &Frame) -> anyhow::Error {
    match messages::decode::<Refuse>(frame, "refusal") {
        Ok(Refuse { reason: RefuseReason::Busy, message }) => {
            anyhow::anyhow!("the Chidori server at {addr} is busy: {message}")
        }
        Ok(Refuse { reason: RefuseReason::Unauthorized, message }) => {
            anyhow::anyhow!("the Chidori server at {addr} did not accept this client: {message}")
        }
        Ok(refuse) => anyhow::anyhow!("the Chidori server at {addr} refused: {}", refuse.message),
        Err(e) => anyhow::anyhow!("the Chidori server at {addr} answered with a bad refusal: {e}"),
    }
}

/// Handshake with `server`, then say goodbye (the program opens its own session). Returns
/// the server's welcome and, with TLS, the fingerprint of the certificate it presented.
pub fn check(server: &str, auth: &ClientAuth) -> Result<(Welcome, Option<String>)> {
    let mut session = open(server, auth, "preflight")?;
    session.close("preflight done");
    Ok((session.welcome, session.fingerprint))
}

/// A session of the `chidori` binary itself (the preflight, the server's nvidia-smi).
pub struct Session {
    pub addr: String,
    link: Link,
    pub welcome: Welcome,
    /// With TLS, the fingerprint of the certificate the server presented.
    pub fingerprint: Option<String>,
}

impl Session {
    /// Send one frame.
    pub fn send(&mut self, header: Header, archive: &[u8]) -> Result<()> {
        self.link.send(&frame::to_vec(header, archive, &[])?)?;
        Ok(())
    }

    /// The next frame the server sends.
    pub fn read(&mut self) -> Result<Frame> {
        self.link.read().map_err(|e| anyhow::anyhow!("the Chidori server at {} stopped answering: {e}", self.addr))
    }

    /// Say goodbye and close the connection.
    pub fn close(&mut self, reason: &str) {
        let bye = Goodbye { reason: reason.into() };
        if let Ok(bytes) = frame::to_vec(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[]) {
            let _ = self.link.send(&bytes);
        }
        if let Link::Tls { sock, secure, .. } = &self.link {
            secure.close(sock);
        }
    }
}

/// Connect to `server` and shake hands as `program`: a session, or an error that says what
/// to do.
pub fn open(server: &str, auth: &ClientAuth, program: &str) -> Result<Session> {
    let addr = address(server);
    let target = addr
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("cannot resolve the Chidori server {addr}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("the Chidori server {addr} has no address"))?;
    let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5)).map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the Chidori server at {addr}: {e}. Is `chidori serve` running there, and port {} open?",
            target.port()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut fingerprint = None;
    let mut link = match &auth.token {
        None => Link::Plain(stream),
        Some(_) => match chidori_tls::client_handshake(&mut stream, &addr, &auth.pins) {
            Ok(secure) => {
                fingerprint = secure_fingerprint(&auth.pins, &addr);
                let reader = secure.reader(stream.try_clone()?);
                Link::Tls { sock: stream, secure, reader }
            }
            Err(HandshakeError::Refused(frame)) => return Err(refused(&addr, &frame)),
            Err(HandshakeError::Pin(mismatch)) => bail!("{mismatch}"),
            Err(HandshakeError::Tls(e)) => bail!(
                "the TLS handshake with the Chidori server at {addr} failed: {e}. Does it use TLS? (A server \
                 listening on loopback does not, unless started with --secure: then run without --token)"
            ),
            Err(HandshakeError::Frame(e)) => bail!("{addr} did not answer like a Chidori server: {e}"),
        },
    };
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        schema: chidori_cuda::calls::SCHEMA_HASH,
        client_version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        host: "chidori run".to_owned(),
        program: program.to_owned(),
        token: auth.token.clone().unwrap_or_default(),
        resume: false,
        content: None,
        visible_devices: None,
    };
    link.send(&frame::to_vec(Header::new(Kind::Hello, 0, 0, 0), &messages::encode(&hello), &[])?)?;
    let frame = match link.read() {
        Ok(f) => f,
        Err(FrameError::Version { got }) => bail!(
            "the Chidori server at {addr} speaks protocol {got}, this client {PROTOCOL_VERSION}: install the same Chidori release on both machines"
        ),
        Err(FrameError::Truncated(_)) => {
            bail!("the Chidori server at {addr} closed the connection during the handshake (see its log)")
        }
        Err(e) => bail!("{addr} did not answer like a Chidori server: {e}"),
    };
    match frame.header.kind {
        Kind::Welcome => {
            let welcome: Welcome = messages::decode(&frame, "welcome")?;
            let mut session = Session { addr, link, welcome, fingerprint };
            if session.welcome.devices.is_empty() {
                session.close("no GPU");
                bail!("the Chidori server at {} has no GPU", session.addr);
            }
            Ok(session)
        }
        Kind::Refuse => Err(refused(&addr, &frame)),
        other => bail!("the Chidori server at {addr} answered {other:?} to the handshake"),
    }
}

/// The fingerprint the client now trusts for `addr`: the explicit one, or the one pinned.
fn secure_fingerprint(pins: &Pins, addr: &str) -> Option<String> {
    pins.explicit.clone().or_else(|| pins.known(addr).map(|(f, _)| f))
}
