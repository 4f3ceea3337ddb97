//! The export surface of the built shims: every function declared in a supported header
//! is exported by the shim of its SONAME with the right version node; everything stock
//! torch 2.11+cu130 imports is exported; each runtime shim exports every symbol the real
//! libcudart of each version it serves exports; and a C program linked against each shim
//! loads with every symbol bound and gets the documented status codes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use xtask::model::Disposition;

/// Exports of every shim: SONAME → set of "name@node" / "name" (default definitions only).
fn shim_exports() -> BTreeMap<String, BTreeSet<String>> {
    let dir = chidori_tests::shim_dir();
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "libchidori.so" {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let mut set = BTreeSet::new();
        for (sym, node, default) in xtask::elf::versioned_exports(&bytes).unwrap() {
            if !default {
                continue;
            }
            set.insert(match node {
                Some(n) if n != name || !sym.is_empty() => format!("{sym}@{n}"),
                _ => sym,
            });
        }
        out.insert(name, set);
    }
    out
}

fn shared(path: &str) -> String {
    let p = chidori_tests::root().join("../shared").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_header_function_is_exported_with_its_version_node() {
    let exports = shim_exports();
    let all = xtask::ir::load_all(&chidori_tests::root()).unwrap();
    let mut missing = Vec::new();
    let mut checked = 0;
    for (cuda, libs) in &all {
        for ir in libs.values() {
            let meta = ir.meta();
            let shim = exports.get(&meta.soname).unwrap_or_else(|| panic!("no shim for {}", meta.soname));
            for f in ir.functions.keys() {
                checked += 1;
                let want = if meta.version_nodes.is_empty() { f.clone() } else { format!("{f}@{}", meta.soname) };
                if !shim.contains(&want) {
                    missing.push(format!("CUDA {cuda}: {want} not in {}", meta.soname));
                }
            }
        }
    }
    assert!(checked > 20_000, "checked {checked}");
    assert!(missing.is_empty(), "{} missing, first: {:?}", missing.len(), &missing[..missing.len().min(20)]);
}

#[test]
fn everything_torch_2_11_imports_is_exported() {
    let exports = shim_exports();
    let unversioned_home = |sym: &str| -> &str {
        if sym.starts_with("nccl") {
            "libnccl.so.2"
        } else if sym.starts_with("cusparseLt") {
            "libcusparseLt.so.0"
        } else if sym.starts_with("cuFile") {
            "libcufile.so.0"
        } else if sym.starts_with("nvml") {
            "libnvidia-ml.so.1"
        } else {
            "libcuda.so.1"
        }
    };
    let mut missing = Vec::new();
    let mut count = 0;
    for line in shared("data/torch-2.11-cu130-imports.txt").lines() {
        let Some((_, sym)) = line.split_once(' ') else { continue };
        count += 1;
        let ok = match sym.split_once('@') {
            Some((_, node)) => exports.get(node).is_some_and(|s| s.contains(sym)),
            None => exports.get(unversioned_home(sym)).is_some_and(|s| s.contains(sym)),
        };
        if !ok {
            missing.push(sym.to_owned());
        }
    }
    assert_eq!(count, 843);
    assert!(missing.is_empty(), "torch imports not exported: {missing:?}");
}

#[test]
fn runtime_shims_export_every_real_cudart_symbol() {
    let exports = shim_exports();
    for version in ["11.8.89", "12.1.105", "12.6.77", "12.8.90", "13.0.96", "13.1.80"] {
        let node = match &version[..2] {
            "11" => "libcudart.so.11.0",
            "12" => "libcudart.so.12",
            _ => "libcudart.so.13",
        };
        let shim = &exports[node];
        let real = shared(&format!("data/real-cudart-{version}-exports.txt"));
        let missing: Vec<_> =
            real.lines().map(|l| l.trim().replace("@@", "@")).filter(|s| !s.is_empty() && !shim.contains(s)).collect();
        assert!(missing.is_empty(), "{node} lacks real cudart {version} exports: {missing:?}");
    }
}

/// Per shim: one forwarded function and one NOT_SUPPORTED stub returning the status type,
/// with the codes they must answer while no server is configured.
fn probes() -> Vec<(String, Vec<(String, i64)>)> {
    let model = xtask::codegen::build_model(&chidori_tests::root()).unwrap();
    let mut out = Vec::new();
    for lib in &model.libraries {
        for shim in &lib.shims {
            let newest = shim.versions.last().unwrap();
            let mut calls = Vec::new();
            let mut forwarded = false;
            let mut unsupported = false;
            for f in lib.functions.values() {
                let Some(v) = xtask::emit::variant_for(f, newest) else { continue };
                if !v.ret_is_status || f.hidden {
                    continue;
                }
                match &v.disposition {
                    Disposition::Forward { .. } if !forwarded => {
                        forwarded = true;
                        calls.push((f.name.clone(), v.codes.unavailable));
                    }
                    Disposition::Unsupported { .. } if !unsupported => {
                        unsupported = true;
                        calls.push((f.name.clone(), v.codes.not_supported));
                    }
                    _ => {}
                }
            }
            out.push((shim.soname.clone(), calls));
        }
    }
    out
}

#[test]
fn programs_linked_against_each_shim_load_and_get_the_documented_status() {
    let lib_dir = chidori_tests::shim_dir();
    let scratch = chidori_tests::scratch("load");
    let mut checked = 0;
    for (soname, calls) in probes() {
        let mut c = String::from("#include <stdio.h>\n#include <dlfcn.h>\n");
        for (name, _) in &calls {
            // Called without arguments: with no server configured, exports answer before
            // reading any.
            let _ = writeln!(c, "extern int {name}(void);");
        }
        c.push_str("int main(void) {\n");
        for (name, _) in &calls {
            let _ = writeln!(c, "  printf(\"{name} %d\\n\", {name}());");
        }
        // The same library opened by SONAME with RTLD_NOW must be the already-loaded shim.
        let _ =
            writeln!(c, "  if (!dlopen(\"{soname}\", RTLD_NOW)) {{ printf(\"dlopen %s\\n\", dlerror()); return 1; }}");
        c.push_str("  return 0;\n}\n");
        let stem = soname.replace('.', "_");
        let source = scratch.join(format!("{stem}.c"));
        std::fs::write(&source, c).unwrap();
        let exe = scratch.join(&stem);
        chidori_tests::cc(
            &source,
            &exe,
            &[
                &format!("-L{}", lib_dir.display()),
                &format!("-l:{soname}"),
                &format!("-Wl,-rpath,{}", lib_dir.display()),
                "-ldl",
            ],
        );
        let stdout = chidori_tests::run(
            Command::new(&exe).env("LD_BIND_NOW", "1").env_remove("CHIDORI_SERVER").env("CHIDORI_LOG", "off"),
        );
        for (name, code) in &calls {
            let got = stdout.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap_or("<none>");
            assert_eq!(got, code.to_string(), "{soname}: {name}");
            checked += 1;
        }
        verify_binding(&exe, &soname, lib_dir);
    }
    assert!(checked >= 30, "only {checked} calls checked");
}

/// The program's references carry the shim's version node (what torch's do).
fn verify_binding(exe: &Path, soname: &str, _lib_dir: &Path) {
    let bytes = std::fs::read(exe).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let versioned = chidori_cuda::libraries::LIBRARIES
        .iter()
        .flat_map(|l| l.shims.iter())
        .find(|s| s.soname == soname)
        .and_then(|s| s.node)
        .is_some();
    if versioned {
        assert!(text.contains(soname), "{} has no reference to version node {soname}", exe.display());
    }
}
