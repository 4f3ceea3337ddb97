//! The glibc floor of a manylinux wheel, checked on every ELF file it holds.
//!
//! A wheel tagged `manylinux_2_28` promises to load on any Linux with glibc 2.28 or newer.
//! That holds when no ELF file in it needs a glibc symbol version newer than 2.28
//! (`GLIBC_2.29`, …, or a glibc-private node such as `GLIBC_PRIVATE` or
//! `GLIBC_ABI_DT_RELR`), needs only libraries every such system has or that the wheel
//! carries beside it, and finds those through `$ORIGIN`-relative paths only: an RPATH or
//! RUNPATH naming a directory of the build machine would load whatever lies there on the
//! user's.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use object::elf;
use object::read::elf::{Dyn, ElfFile64};
use object::{Endianness, Object, ObjectSymbol};

/// The newest glibc version a `manylinux_2_28` file may need.
pub const FLOOR: (u32, u32) = (2, 28);

/// Libraries every manylinux system provides: glibc's part of PEP 600's list. Not
/// libgcc_s and libstdc++, whose own symbol versions (GCC_*, GLIBCXX_*) have floors this
/// check does not know: nothing here needs them (zig links its unwinder statically), and a
/// file that starts to fails here until the check learns them.
const SYSTEM_LIBRARIES: &[&str] =
    &["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1", "ld-linux-x86-64.so.2"];

/// What one ELF file needs of the system.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// DT_NEEDED entries.
    pub libraries: Vec<String>,
    /// Version nodes needed, by library (`libc.so.6` → `GLIBC_2.28`), with the symbols
    /// bound to each.
    pub versions: BTreeMap<(String, String), BTreeSet<String>>,
    /// DT_RPATH and DT_RUNPATH entries, split at `:`.
    pub search_paths: Vec<String>,
}

impl Needs {
    /// The newest `GLIBC_2.x` version needed, if any.
    pub fn newest_glibc(&self) -> Option<(u32, u32, u32)> {
        self.versions.keys().filter_map(|(_, node)| glibc_version(node)).max()
    }
}

/// Read what `bytes` (a 64-bit ELF file) needs.
pub fn needs(bytes: &[u8]) -> Result<Needs> {
    let file = ElfFile64::<Endianness>::parse(bytes).context("parsing ELF")?;
    let endian = file.endian();
    let data = file.data();
    let sections = file.elf_section_table();
    let mut out = Needs::default();
    if let Some((dynamic, link)) = sections.dynamic(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        for entry in dynamic {
            let tag = entry.tag(endian);
            if tag == elf::DT_NEEDED || tag == elf::DT_RPATH || tag == elf::DT_RUNPATH {
                let value = String::from_utf8_lossy(entry.string(endian, strings)?).into_owned();
                if tag == elf::DT_NEEDED {
                    out.libraries.push(value);
                } else {
                    out.search_paths.extend(value.split(':').map(str::to_owned));
                }
            }
        }
    }
    // Every (library, node) pair needed, also those no symbol names (the linker records a
    // node for an ABI the file relies on, as GLIBC_ABI_DT_RELR).
    if let Some((mut verneeds, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((verneed, mut auxs)) = verneeds.next()? {
            let library = String::from_utf8_lossy(verneed.file(endian, strings)?).into_owned();
            while let Some(aux) = auxs.next()? {
                let node = String::from_utf8_lossy(aux.name(endian, strings)?).into_owned();
                out.versions.entry((library.clone(), node)).or_default();
            }
        }
    }
    // The symbols bound to each node, for the report.
    if let Some(table) = sections.versions(endian, data)? {
        for symbol in file.dynamic_symbols().filter(|s| s.is_undefined()) {
            let index = table.version_index(endian, symbol.index()).index();
            let Ok(Some(version)) = table.version(index) else { continue };
            let Some(library) = version.file() else { continue };
            let key =
                (String::from_utf8_lossy(library).into_owned(), String::from_utf8_lossy(version.name()).into_owned());
            out.versions.entry(key).or_default().insert(symbol.name().unwrap_or("<unnamed>").to_owned());
        }
    }
    Ok(out)
}

/// `GLIBC_2.28` → (2, 28, 0), `GLIBC_2.2.5` → (2, 2, 5); None for other names.
pub fn glibc_version(node: &str) -> Option<(u32, u32, u32)> {
    let mut parts = node.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor, patch))
}

/// Whether a version node of glibc is one a system with glibc `floor` has.
pub fn node_allowed(node: &str, floor: (u32, u32)) -> bool {
    match glibc_version(node) {
        Some((major, minor, _)) => (major, minor) <= floor,
        // GLIBC_PRIVATE, GLIBC_ABI_DT_RELR (2.36), …: not a promise of an older glibc.
        None => !node.starts_with("GLIBC_"),
    }
}

/// Whether an RPATH/RUNPATH entry stays inside the installed files.
pub fn search_path_allowed(entry: &str) -> bool {
    entry.starts_with("$ORIGIN") || entry.starts_with("${ORIGIN}")
}

/// Every way `needs` breaks the floor, as readable lines; `beside`: the file names the
/// wheel holds in the same directory (libraries it may need through `$ORIGIN`).
pub fn violations(needs: &Needs, floor: (u32, u32), beside: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for ((library, node), symbols) in &needs.versions {
        if !node_allowed(node, floor) {
            let symbols: Vec<&str> = symbols.iter().map(String::as_str).collect();
            out.push(format!(
                "needs {node} of {library} (newer than glibc {}.{}){}",
                floor.0,
                floor.1,
                if symbols.is_empty() { String::new() } else { format!(" for {}", symbols.join(", ")) }
            ));
        }
    }
    for entry in &needs.search_paths {
        if !search_path_allowed(entry) {
            out.push(format!("searches `{entry}` for libraries (only $ORIGIN-relative paths may ship)"));
        }
    }
    for library in &needs.libraries {
        if !SYSTEM_LIBRARIES.contains(&library.as_str()) && !beside.contains(library) {
            out.push(format!("needs {library}, which neither manylinux systems nor the wheel provide"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    #[test]
    fn glibc_nodes_are_compared_with_the_floor() {
        let check = |node: &str, allowed: bool| assert_eq!(node_allowed(node, FLOOR), allowed, "{node}");
        check("GLIBC_2.2.5", true);
        check("GLIBC_2.17", true);
        check("GLIBC_2.28", true);
        check("GLIBC_2.29", false);
        check("GLIBC_2.34", false);
        check("GLIBC_3.0", false);
        check("GLIBC_PRIVATE", false);
        check("GLIBC_ABI_DT_RELR", false);
        check("GCC_3.0", true);
        check("libchidori.so", true);
        assert_eq!(glibc_version("GLIBC_2.2.5"), Some((2, 2, 5)));
        assert_eq!(glibc_version("GLIBC_2"), None);
        assert_eq!(glibc_version("GLIBC_2.28.1.1"), None);
    }

    #[test]
    fn only_origin_relative_search_paths_may_ship() {
        let check = |entry: &str, allowed: bool| assert_eq!(search_path_allowed(entry), allowed, "{entry}");
        check("$ORIGIN", true);
        check("$ORIGIN/../lib", true);
        check("${ORIGIN}/lib", true);
        check("/work/wt-wheel/target/release", false);
        check("", false);
        check("lib", false);
    }

    /// Compile `source` into a shared library with the host's C compiler (glibc 2.36 on the
    /// machines this runs on, so `close_range`, new in 2.34, binds to GLIBC_2.34).
    fn library(name: &str, source: &str, flags: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("chidori-glibc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, source).unwrap();
        let out = dir.join(format!("lib{name}.so"));
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&src)
            .args(flags)
            .status()
            .expect("running the C compiler");
        assert!(status.success(), "compiling {name}");
        out
    }

    fn violations_of(path: &Path) -> Vec<String> {
        let needs = needs(&std::fs::read(path).unwrap()).unwrap();
        violations(&needs, FLOOR, &BTreeSet::from(["libchidori.so".to_owned()]))
    }

    #[test]
    fn an_old_enough_library_passes() {
        let lib = library("old", "#include <stdlib.h>\nvoid *f(void) { return malloc(4); }\n", &["-Wl,-rpath,$ORIGIN"]);
        let needs = needs(&std::fs::read(&lib).unwrap()).unwrap();
        assert!(needs.libraries.contains(&"libc.so.6".to_owned()), "{needs:?}");
        assert_eq!(needs.search_paths, ["$ORIGIN"]);
        assert!(needs.newest_glibc().is_some_and(|v| (v.0, v.1) <= FLOOR), "{needs:?}");
        assert_eq!(violations_of(&lib), Vec::<String>::new());
    }

    #[test]
    fn a_newer_symbol_is_named() {
        let lib = library(
            "new",
            "#define _GNU_SOURCE\n#include <unistd.h>\nint f(void) { return close_range(3, 4, 0); }\n",
            &[],
        );
        let found = violations_of(&lib);
        assert!(
            found.iter().any(|v| v.contains("GLIBC_2.34") && v.contains("close_range") && v.contains("libc.so.6")),
            "{found:?}"
        );
    }

    #[test]
    fn a_build_machine_path_is_refused() {
        for dtags in ["-Wl,--disable-new-dtags", "-Wl,--enable-new-dtags"] {
            let lib = library("rpath", "int f(void) { return 1; }\n", &["-Wl,-rpath,$ORIGIN:/work/build/lib", dtags]);
            let found = violations_of(&lib);
            assert_eq!(found.len(), 1, "{dtags}: {found:?}");
            assert!(found[0].contains("/work/build/lib"), "{found:?}");
        }
    }

    #[test]
    fn a_library_the_wheel_does_not_carry_is_refused() {
        let dependency = library("dependency", "int g(void) { return 1; }\n", &[]);
        let dir = format!("-L{}", dependency.parent().unwrap().display());
        let lib = library("needs", "int g(void);\nint f(void) { return g(); }\n", &[&dir, "-ldependency"]);
        let found = violations_of(&lib);
        assert!(found.iter().any(|v| v.contains("libdependency.so")), "{found:?}");
    }
}
