//! The server's secrets: the token clients present, and the TLS certificate and key. On
//! first start `chidori serve` makes them (mode 0600) under the user's config directory:
//! a token of 32 random bytes as hex, and a self-signed certificate whose fingerprint
//! clients pin. An operator may give a certificate of their own (`--tls-cert/--tls-key`).
//!
//! TLS terminates in the session worker (see ARCHITECTURE.md, "Security"): the supervisor
//! passes each connection on as it came, and the worker runs the handshake and checks the
//! token before it creates its CUDA backend.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use chidori_tls::rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the server keeps its token, certificate and key.
#[derive(Clone, Debug)]
pub struct SecretFiles {
    pub token: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl SecretFiles {
    /// The files under `~/.config/chidori` (or `$XDG_CONFIG_HOME/chidori`), where not given.
    pub fn with_defaults(token: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>) -> SecretFiles {
        let dir = chidori_tls::token::config_dir();
        SecretFiles {
            token: token.unwrap_or_else(|| dir.join("token")),
            cert: cert.unwrap_or_else(|| dir.join("server.crt")),
            key: key.unwrap_or_else(|| dir.join("server.key")),
        }
    }

    /// Make what is missing: the token, and (when neither file exists) a self-signed
    /// certificate and its key. Returns the token and the certificate's fingerprint.
    pub fn ensure(&self) -> Result<(String, String)> {
        let token = if self.token.exists() {
            chidori_tls::token::read(&self.token).map_err(anyhow::Error::msg)?
        } else {
            let token = random_hex(32)?;
            write_private(&self.token, format!("{token}\n").as_bytes())
                .with_context(|| format!("writing the token file {}", self.token.display()))?;
            tracing::info!("made a new token in {}", self.token.display());
            token
        };
        match (self.cert.exists(), self.key.exists()) {
            (true, true) => {}
            (false, false) => {
                let names = vec!["chidori".to_owned(), "localhost".to_owned()];
                let made = rcgen::generate_simple_self_signed(names).context("generating a TLS certificate")?;
                write_private(&self.key, made.signing_key.serialize_pem().as_bytes())
                    .with_context(|| format!("writing the TLS key {}", self.key.display()))?;
                write_private(&self.cert, made.cert.pem().as_bytes())
                    .with_context(|| format!("writing the TLS certificate {}", self.cert.display()))?;
                tracing::info!("made a self-signed TLS certificate in {}", self.cert.display());
            }
            (true, false) => bail!(
                "{} exists but its key {} does not: give both, or neither",
                self.cert.display(),
                self.key.display()
            ),
            (false, true) => bail!(
                "{} exists but its certificate {} does not: give both, or neither",
                self.key.display(),
                self.cert.display()
            ),
        }
        let (chain, _) = load_identity(&self.cert, &self.key)?;
        let fingerprint =
            chidori_tls::pin::fingerprint(chain.first().context("the certificate file holds no certificate")?);
        Ok((token, fingerprint))
    }
}

/// `n` random bytes from the TLS provider's secure random source.
pub fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; n];
    chidori_tls::provider().secure_random.fill(&mut bytes).map_err(|_| anyhow::anyhow!("no secure random source"))?;
    Ok(bytes)
}

/// `n` random bytes as lowercase hex.
fn random_hex(n: usize) -> Result<String> {
    Ok(random_bytes(n)?.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write a file only its owner can read (made 0600 before anything is in it).
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(bytes)?;
    Ok(())
}

/// The certificate chain and key in PEM files.
pub fn load_identity(cert: &Path, key: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading the TLS certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing the TLS certificate {} (PEM)", cert.display()))?;
    if chain.is_empty() {
        bail!("{} holds no PEM certificate", cert.display());
    }
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the TLS key {} (PEM)", key.display()))?;
    Ok((chain, key))
}

/// What a secure session worker needs: its TLS configuration and the expected token.
#[derive(Clone)]
pub struct Security {
    pub tls: Arc<rustls::ServerConfig>,
    pub token: String,
    /// Where the token is kept (named in refusals).
    pub token_file: PathBuf,
}

impl Security {
    pub fn load(files: &SecretFiles) -> Result<Security> {
        let token = chidori_tls::token::read(&files.token).map_err(anyhow::Error::msg)?;
        let (chain, key) = load_identity(&files.cert, &files.key)?;
        let mut config = rustls::ServerConfig::builder_with_provider(chidori_tls::provider())
            .with_protocol_versions(chidori_tls::VERSIONS)
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("the TLS certificate and key do not fit together")?;
        // One connection per session, never resumed: no tickets to send (or to answer).
        config.send_tls13_tickets = 0;
        // After the handshake the records are chidori_tls's own: it needs the keys.
        config.enable_secret_extraction = true;
        Ok(Security { tls: Arc::new(config), token, token_file: files.token.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("chidori-auth-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files = SecretFiles { token: dir.join("token"), cert: dir.join("c.pem"), key: dir.join("k.pem") };
        let (token, fingerprint) = files.ensure().unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(files.ensure().unwrap(), (token.clone(), fingerprint), "a second start reuses them");
        for f in [&files.token, &files.cert, &files.key] {
            assert_eq!(std::fs::metadata(f).unwrap().permissions().mode() & 0o777, 0o600, "{}", f.display());
        }
        let security = Security::load(&files).unwrap();
        assert_eq!(security.token, token);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
