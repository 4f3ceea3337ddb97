//! `headers/cuda.lock.toml`: which NVIDIA PyPI wheels carry the headers of each CUDA version.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Lock {
    pub cuda: Vec<CudaVersion>,
}

#[derive(Debug, Deserialize)]
pub struct CudaVersion {
    pub version: String,
    #[serde(rename = "wheel")]
    pub wheels: Vec<Wheel>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Wheel {
    pub name: String,
    pub version: String,
    /// The exact file `pip download` must produce; its platform tags are passed to pip.
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

impl Wheel {
    /// The platform tags in the file name (`manylinux2014_x86_64.manylinux_2_17_x86_64`
    /// is two tags), which pip needs to select exactly this file.
    pub fn platform_tags(&self) -> Vec<String> {
        let stem = self.file.trim_end_matches(".whl");
        let platform = stem.rsplit('-').next().unwrap_or_default();
        platform.split('.').map(str::to_owned).collect()
    }
}

impl Lock {
    pub fn load(root: &Path) -> Result<Lock> {
        let path = root.join("headers/cuda.lock.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let lock: Lock = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        for cuda in &lock.cuda {
            for wheel in &cuda.wheels {
                if wheel.sha256.len() != 64 || !wheel.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                    bail!("{}: wheel {} has a malformed sha256", path.display(), wheel.file);
                }
            }
        }
        Ok(lock)
    }

    pub fn versions(&self) -> Vec<String> {
        self.cuda.iter().map(|c| c.version.clone()).collect()
    }

    pub fn version(&self, version: &str) -> Result<&CudaVersion> {
        self.cuda.iter().find(|c| c.version == version).with_context(|| {
            format!("CUDA {version} is not in headers/cuda.lock.toml (known: {})", self.versions().join(", "))
        })
    }
}
