//! `specs/libraries.toml`: the NVIDIA libraries Chidori replaces, the headers that declare
//! their API, and the status codes its generated exports answer with.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Libraries {
    #[serde(rename = "library")]
    pub libraries: Vec<Library>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Library {
    /// Short key: IR file names, spec file names and generated module names use it.
    pub name: String,
    pub title: String,
    /// Regex over header file names (relative to the include directory) whose function
    /// declarations belong to this library.
    pub headers: String,
    /// Bindgen passes; the union of their functions is the library's API. A name declared by
    /// two passes must have the same signature in both.
    #[serde(rename = "pass")]
    pub passes: Vec<Pass>,
    /// Regex over the file names of the real shared library inside the wheels; its SONAME,
    /// version node and exports are recorded in the IR.
    pub real_library: Option<String>,
    /// Regex selecting the real library's exports that are API (not internal kernels).
    pub exports: String,
    /// SONAME when no wheel carries the real library (the driver ships with the kernel driver).
    pub soname: Option<String>,
    /// The status type most functions return, and the names of its notable values.
    pub status: String,
    pub success: String,
    pub not_supported: String,
    /// What every export answers while no server is reachable.
    pub unavailable: String,
    /// What the worker answers for a handle the session never created.
    pub invalid_handle: String,
    /// A bad argument: what hand-written code answers for one.
    pub invalid_value: String,
    /// Whether a non-const pointer to a scalar may be inferred to be a host output. False for
    /// libraries (cuBLAS, cuSPARSE, …) whose scalar pointers are usually device arrays.
    #[serde(default = "yes")]
    pub infer_scalar_out: bool,
    /// Whether functions the spec does not list may be forwarded by inference at all (false
    /// for libraries whose calls name client-side resources, such as cuFile's files).
    #[serde(default = "yes")]
    pub forward_by_default: bool,
    /// Why a function such a library's spec does not list is not forwarded (what
    /// `cargo xtask coverage` and the log say).
    pub unlisted_reason: Option<String>,
    /// Parse `cudaTypedefs.h` for the `cuGetProcAddress` table.
    #[serde(default)]
    pub proc_table: bool,
    /// Regex over declared names that carry the header's version (nvJitLink's header renames
    /// `nvJitLinkCreate` to `__nvJitLinkCreate_13_0`): its first capture is the stable name,
    /// the function's key in the spec, and the unversioned export (what programs that
    /// `dlsym` it get) is the same function.
    pub versioned_names: Option<String>,
    /// Functions of the C library the shim also exports (each shim is preloaded, so its
    /// definitions come before the C library's), each dispatched by the named core function:
    /// `dlopen` keeps the machine's own video-engine libraries out of a Chidori program.
    #[serde(default)]
    pub dispatch: std::collections::BTreeMap<String, String>,
    /// `versioned_names` compiled once (checked by [`Libraries::load`]).
    #[serde(skip)]
    versioned_re: std::sync::OnceLock<Option<regex::Regex>>,
}

impl Library {
    /// The stable name of a versioned declaration (`__nvJitLinkCreate_13_0` →
    /// `nvJitLinkCreate`), None for other names.
    pub fn stable_name(&self, name: &str) -> Option<String> {
        let re = self
            .versioned_re
            .get_or_init(|| self.versioned_names.as_deref().and_then(|r| regex::Regex::new(r).ok()))
            .as_ref()?;
        Some(re.captures(name)?.get(1)?.as_str().to_owned())
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pass {
    pub include: Vec<String>,
    #[serde(default)]
    pub defines: Vec<String>,
    /// Parse as C++ (for headers such as cusparseLt.h that include C++ standard headers).
    #[serde(default)]
    pub cplusplus: bool,
}

impl Libraries {
    pub fn load(root: &Path) -> Result<Libraries> {
        let path = root.join("specs/libraries.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let libs: Libraries = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let mut seen = std::collections::HashSet::new();
        for lib in &libs.libraries {
            if !seen.insert(lib.name.clone()) {
                bail!("{}: library {} is declared twice", path.display(), lib.name);
            }
            regex::Regex::new(&lib.headers).with_context(|| format!("library {}: bad headers regex", lib.name))?;
            if let Some(v) = &lib.versioned_names {
                let re = regex::Regex::new(v).with_context(|| format!("library {}: bad versioned_names", lib.name))?;
                if re.captures_len() < 2 {
                    bail!("library {}: versioned_names needs a capture (the stable name)", lib.name);
                }
            }
            if lib.real_library.is_none() && lib.soname.is_none() {
                bail!("library {}: needs real_library or soname", lib.name);
            }
        }
        Ok(libs)
    }

    pub fn get(&self, name: &str) -> Result<&Library> {
        self.libraries.iter().find(|l| l.name == name).with_context(|| format!("no library named {name}"))
    }
}
