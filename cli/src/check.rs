//! `chidori run`'s preflight: connect, shake hands, and turn every failure into a message a
//! user can act on before the program starts.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Result, bail};
use chidori_protocol::frame::{self, FrameError, HEADER_LEN, Header, Kind};
use chidori_protocol::messages::{self, Goodbye, Hello, Refuse, Welcome};
use chidori_protocol::{PROTOCOL_VERSION, env};

pub fn address(server: &str) -> String {
    if server.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        server.to_owned()
    } else {
        format!("{server}:{}", env::DEFAULT_PORT)
    }
}

/// Handshake with `server`, then say goodbye (the program opens its own session).
pub fn check(server: &str) -> Result<Welcome> {
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
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        schema: chidori_cuda::calls::SCHEMA_HASH,
        client_version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        host: "chidori run".to_owned(),
        program: "preflight".to_owned(),
    };
    stream.write_all(&frame::to_vec(Header::new(Kind::Hello, 0, 0, 0), &messages::encode(&hello), &[])?)?;
    let mut head = [0u8; HEADER_LEN];
    if stream.read_exact(&mut head).is_err() {
        bail!("the Chidori server at {addr} closed the connection during the handshake (see its log)");
    }
    let header = match Header::decode(&head) {
        Ok(h) => h,
        Err(FrameError::Version { got }) => bail!(
            "the Chidori server at {addr} speaks protocol {got}, this client {PROTOCOL_VERSION}: install the same Chidori release on both machines"
        ),
        Err(e) => bail!("{addr} did not answer like a Chidori server: {e}"),
    };
    let mut rest = vec![0u8; header.archive_len as usize + header.bulk_len as usize];
    stream.read_exact(&mut rest)?;
    let mut bytes = head.to_vec();
    bytes.extend_from_slice(&rest);
    let (frame, _) = frame::Frame::decode(&bytes)?;
    match header.kind {
        Kind::Welcome => {
            let welcome: Welcome = messages::decode(&frame, "welcome")?;
            let bye = Goodbye { reason: "preflight done".into() };
            let _ =
                stream.write_all(&frame::to_vec(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[])?);
            if welcome.devices.is_empty() {
                bail!("the Chidori server at {addr} has no GPU");
            }
            Ok(welcome)
        }
        Kind::Refuse => {
            let refuse: Refuse = messages::decode(&frame, "refusal")?;
            bail!("the Chidori server at {addr} refused: {}", refuse.message)
        }
        other => bail!("the Chidori server at {addr} answered {other:?} to the handshake"),
    }
}
