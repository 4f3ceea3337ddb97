//! Certificate pinning on the client: the server's certificate is accepted when its
//! SHA-256 fingerprint is the one the user gave (`--fingerprint`, `CHIDORI_FINGERPRINT`)
//! or, without one, the one remembered for that server in `known_servers` under the
//! client's config directory; a server seen for the first time is remembered (trust on
//! first use, as SSH's `known_hosts`). A changed certificate is refused with what to do.
//!
//! The handshake's signatures are still verified with the certificate's key, so only the
//! holder of the pinned certificate's private key passes. This also holds for a certificate
//! from a public CA given with `chidori serve --tls-cert`: it is pinned like a self-signed
//! one (no CA chain is consulted), and renewing it changes its fingerprint.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

/// `sha256:` and the lowercase hex SHA-256 of a certificate (DER).
pub fn fingerprint(cert_der: &[u8]) -> String {
    let digest = Sha256::digest(cert_der);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A fingerprint as users may write it (with or without `sha256:`, colons, upper case)
/// in the form [`fingerprint`] produces. None: not a SHA-256 fingerprint.
pub fn normalize(text: &str) -> Option<String> {
    let text = text.trim();
    let hex = text.strip_prefix("sha256:").or_else(|| text.strip_prefix("SHA256:")).unwrap_or(text);
    let hex: String = hex.chars().filter(|c| *c != ':').map(|c| c.to_ascii_lowercase()).collect();
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("sha256:{hex}"))
}

/// The certificate a server presented did not match its pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub server: String,
    pub presented: String,
    pub expected: String,
    /// Where the expected fingerprint came from: the known-servers file and line, or None
    /// when it was given explicitly.
    pub from: Option<(PathBuf, usize)>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Mismatch { server, presented, expected, from } = self;
        match from {
            Some((file, line)) => write!(
                f,
                "the Chidori server at {server} presented certificate {presented}, but {} (line {line}) pins {expected} \
                 for it. Someone may be intercepting the connection; if the server's certificate was replaced on \
                 purpose, check the fingerprint `chidori serve` prints on the server, then delete that line (or pass \
                 --fingerprint {presented})",
                file.display()
            ),
            None => write!(
                f,
                "the Chidori server at {server} presented certificate {presented}, not {expected} as given with \
                 --fingerprint / CHIDORI_FINGERPRINT. Someone may be intercepting the connection, or the fingerprint \
                 is out of date: compare it with the line `chidori serve` prints on the server"
            ),
        }
    }
}

/// What the client knows about server certificates.
#[derive(Debug, Clone)]
pub struct Pins {
    /// Given explicitly: only this fingerprint passes, and nothing is written.
    pub explicit: Option<String>,
    /// The known-servers file (None: remember nothing).
    pub file: Option<PathBuf>,
}

/// What one handshake's verifier saw.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    state: Arc<Mutex<VerdictState>>,
}

#[derive(Debug, Default)]
struct VerdictState {
    presented: Option<String>,
    expected: Option<(String, Option<(PathBuf, usize)>)>,
}

impl Verdict {
    fn lock(&self) -> std::sync::MutexGuard<'_, VerdictState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fingerprint the server presented (after the handshake got that far).
    pub fn presented(&self) -> Option<String> {
        self.lock().presented.clone()
    }

    /// The mismatch, if the handshake failed on the pin.
    pub fn mismatch(&self) -> Option<Mismatch> {
        let s = self.lock();
        let (expected, from) = s.expected.clone()?;
        let presented = s.presented.clone()?;
        (presented != expected).then(|| Mismatch { server: String::new(), presented, expected, from })
    }
}

impl Pins {
    /// The default: `known_servers` in the client's config directory, and the
    /// fingerprint of `CHIDORI_FINGERPRINT` when set.
    pub fn from_env() -> Result<Pins, String> {
        let explicit = match std::env::var(chidori_protocol::env::FINGERPRINT) {
            Ok(v) if !v.trim().is_empty() => Some(normalize(&v).ok_or_else(|| {
                format!(
                    "{} is not a SHA-256 fingerprint (sha256:<64 hex digits>): {v}",
                    chidori_protocol::env::FINGERPRINT
                )
            })?),
            _ => None,
        };
        Ok(Pins { explicit, file: Some(crate::token::config_dir().join("known_servers")) })
    }

    /// The pin for `server` from the file: (fingerprint, line number).
    pub fn known(&self, server: &str) -> Option<(String, usize)> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        text.lines().enumerate().find_map(|(i, line)| {
            let mut words = line.split_whitespace();
            (words.next() == Some(server)).then(|| words.next().and_then(normalize).map(|f| (f, i + 1)))?
        })
    }

    /// A TLS client configuration whose verifier enforces the pin of `server`, and the
    /// verdict it records.
    pub fn client_config(&self, server: &str) -> (Arc<rustls::ClientConfig>, Verdict) {
        let verdict = Verdict::default();
        let expected = match &self.explicit {
            Some(f) => Some((f.clone(), None)),
            None => self.known(server).map(|(f, line)| (f, self.file.clone().map(|file| (file, line)))),
        };
        verdict.lock().expected = expected;
        let provider = crate::provider();
        let verifier = Arc::new(PinVerifier { verdict: verdict.clone(), provider: provider.clone() });
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(crate::VERSIONS)
            .expect("the ring provider supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // After the handshake the records are this crate's (`records`): it needs the keys.
        config.enable_secret_extraction = true;
        (Arc::new(config), verdict)
    }

    /// After a handshake passed: remember a server seen for the first time.
    pub fn confirm(&self, server: &str, verdict: &Verdict) -> Result<(), String> {
        let s = verdict.lock();
        let (Some(presented), None) = (&s.presented, &s.expected) else { return Ok(()) };
        let Some(file) = &self.file else { return Ok(()) };
        remember(file, server, presented)
            .map_err(|e| format!("cannot record the certificate of {server} in {}: {e}", file.display()))?;
        note_pinned(server, presented, file);
        Ok(())
    }
}

/// Say on stderr that a new server was pinned (the interposer and the CLI both do).
fn note_pinned(server: &str, presented: &str, file: &Path) {
    eprintln!("chidori: first connection to {server}: pinned its certificate {presented} in {}", file.display());
}

fn remember(file: &Path, server: &str, fingerprint: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(file)?;
    writeln!(f, "{server} {fingerprint}")
}

#[derive(Debug)]
struct PinVerifier {
    verdict: Verdict,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = fingerprint(end_entity);
        let mut s = self.verdict.lock();
        s.presented = Some(presented.clone());
        match &s.expected {
            Some((expected, _)) if *expected != presented => {
                Err(rustls::Error::General(format!("certificate {presented} is not the pinned {expected}")))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_normalize() {
        let f = fingerprint(b"cert");
        assert!(f.starts_with("sha256:") && f.len() == 7 + 64);
        assert_eq!(normalize(&f).as_deref(), Some(f.as_str()));
        let upper = f.trim_start_matches("sha256:").to_uppercase();
        assert_eq!(normalize(&upper).as_deref(), Some(f.as_str()));
        assert_eq!(normalize("sha256:abc"), None);
    }

    #[test]
    fn known_servers_are_found_by_address() {
        let dir = std::env::temp_dir().join(format!("chidori-pins-{}", std::process::id()));
        let file = dir.join("known_servers");
        let pins = Pins { explicit: None, file: Some(file.clone()) };
        assert_eq!(pins.known("gpu:43211"), None);
        let a = fingerprint(b"a");
        let b = fingerprint(b"b");
        remember(&file, "gpu:43211", &a).unwrap();
        remember(&file, "other:1", &b).unwrap();
        assert_eq!(pins.known("gpu:43211"), Some((a, 1)));
        assert_eq!(pins.known("other:1"), Some((b, 2)));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
