//! The shared secret of a server: 32 random bytes as hex, kept in a file of mode 0600 on
//! the server (`chidori serve` makes it on first start) and presented by clients in their
//! Hello, inside TLS. The server compares in constant time.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `$XDG_CONFIG_HOME/chidori`, else `~/.config/chidori` (else `/tmp/chidori-config`).
pub fn config_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/tmp/chidori-config"));
    base.join("chidori")
}

/// The token in `path` (surrounding whitespace removed).
pub fn read(path: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.trim().to_owned();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    Ok(token)
}

/// Whether `given` is `expected`, in time that depends on neither (both are hashed first,
/// so their lengths are hidden too).
pub fn matches(expected: &str, given: &str) -> bool {
    let a = Sha256::digest(expected.as_bytes());
    let b = Sha256::digest(given.as_bytes());
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0 && !expected.is_empty()
}

/// The token a client presents: `CHIDORI_TOKEN`, else the file named by
/// `CHIDORI_TOKEN_FILE`. None: no token (a plaintext session, for servers that allow it).
pub fn from_env() -> Result<Option<String>, String> {
    use chidori_protocol::env;
    if let Ok(t) = std::env::var(env::TOKEN)
        && !t.trim().is_empty()
    {
        return Ok(Some(t.trim().to_owned()));
    }
    match std::env::var_os(env::TOKEN_FILE) {
        Some(p) if !p.is_empty() => read(Path::new(&p)).map(Some),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_content() {
        assert!(matches("abc", "abc"));
        assert!(!matches("abc", "abd"));
        assert!(!matches("abc", "ab"));
        assert!(!matches("", ""), "an empty expected token matches nothing");
    }
}
