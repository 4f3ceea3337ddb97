//! Struct maps against reality: a C probe compiled with gcc against each CUDA version's
//! runtime headers prints `sizeof`/`offsetof` of every mapped runtime and driver record;
//! the generated maps must agree field by field.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::process::Command;

use chidori_cuda::structs;

/// Records of `cuda` declared by the runtime or driver headers (the ones the probe sees).
fn runtime_records(cuda: &str) -> BTreeSet<String> {
    let all = xtask::ir::load_all(&chidori_tests::root()).expect("IR");
    let mut out = BTreeSet::new();
    for lib in ["cudart", "driver"] {
        if let Some(ir) = all.get(cuda).and_then(|v| v.get(lib)) {
            out.extend(ir.records.keys().cloned());
        }
    }
    out
}

/// `sizeof`/`offsetof` as gcc computes them: record → (size, field → (offset, size)).
type Measured = BTreeMap<String, (u64, BTreeMap<String, (u64, u64)>)>;

fn probe(cuda: &str, maps: &[&structs::StructMap]) -> Measured {
    let include = chidori_tests::runtime_headers(cuda);
    let stub = chidori_tests::root().join("headers/stub");
    let dir = chidori_tests::scratch(&format!("probe-{cuda}"));
    let mut bare = BTreeSet::new();
    for attempt in 0..2 {
        // The IR also holds the legacy records cuda.h declares for its own implementation.
        let mut c = String::from(
            "#define __CUDA_API_VERSION_INTERNAL\n#include <stddef.h>\n#include <stdio.h>\n#include <cuda.h>\n#include <cuda_runtime_api.h>\nint main(void) {\n",
        );
        for m in maps {
            let ty = if bare.contains(m.name) {
                m.name.to_owned()
            } else {
                format!("{} {}", if m.union { "union" } else { "struct" }, m.name)
            };
            let _ = writeln!(c, "  printf(\"S {} %zu\\n\", sizeof({ty}));", m.name);
            for f in m.fields.iter().filter(|f| !f.name.starts_with("__bindgen") && !f.name.starts_with('_')) {
                let _ = writeln!(
                    c,
                    "  printf(\"F {} {} %zu %zu\\n\", offsetof({ty}, {f}), sizeof((({ty}*)0)->{f}));",
                    m.name,
                    f.name,
                    f = f.name
                );
            }
        }
        c.push_str("  return 0;\n}\n");
        let source = dir.join("probe.c");
        std::fs::write(&source, &c).unwrap();
        let exe = dir.join("probe");
        let out = Command::new("cc")
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-I{}", include.display()))
            .arg(format!("-I{}", stub.display()))
            .arg("-w")
            .output()
            .expect("cc");
        if !out.status.success() {
            // Records declared as `typedef struct { … } Name;` have no tag: retry them bare.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let before = bare.len();
            for m in maps {
                let tagged =
                    |kw: &str| ["'", "\u{2019}"].iter().any(|q| stderr.contains(&format!("{kw} {}{q}", m.name)));
                if tagged("struct") || tagged("union") {
                    bare.insert(m.name);
                }
            }
            assert!(attempt == 0 && bare.len() > before, "probe for CUDA {cuda} does not compile:\n{stderr}");
            continue;
        }
        let text = chidori_tests::run(&mut Command::new(&exe));
        let mut measured = Measured::new();
        for line in text.lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["S", name, size] => {
                    measured.entry((*name).to_owned()).or_default().0 = size.parse().unwrap();
                }
                ["F", name, field, offset, size] => {
                    measured
                        .entry((*name).to_owned())
                        .or_default()
                        .1
                        .insert((*field).to_owned(), (offset.parse().unwrap(), size.parse().unwrap()));
                }
                _ => panic!("bad probe line {line}"),
            }
        }
        return measured;
    }
    unreachable!()
}

#[test]
fn struct_maps_match_gcc_for_every_version() {
    let mut failures = Vec::new();
    let mut checked_fields = 0;
    for (cuda, maps) in structs::BY_VERSION {
        let records = runtime_records(cuda);
        let maps: Vec<&structs::StructMap> = maps.iter().filter(|m| records.contains(m.name)).collect();
        assert!(maps.iter().any(|m| m.name == "cudaDeviceProp"), "no cudaDeviceProp map for {cuda}");
        let measured = probe(cuda, &maps);
        for m in &maps {
            let (size, fields) = &measured[m.name];
            if *size != u64::from(m.size) {
                failures.push(format!("{cuda} {}: size {} in the map, {size} by gcc", m.name, m.size));
            }
            for f in m.fields.iter().filter(|f| !f.name.starts_with('_')) {
                checked_fields += 1;
                match fields.get(f.name) {
                    Some((offset, fsize)) if *offset == u64::from(f.offset) && *fsize == u64::from(f.size) => {}
                    Some((offset, fsize)) => failures.push(format!(
                        "{cuda} {}.{}: map says offset {} size {}, gcc {offset} {fsize}",
                        m.name, f.name, f.offset, f.size
                    )),
                    None => failures.push(format!("{cuda} {}.{}: not probed", m.name, f.name)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    assert!(checked_fields > 1000, "only {checked_fields} fields checked");
}

/// The cudaDeviceProp layouts recorded in the research notes (compiled offsetof per version).
#[test]
fn cuda_device_prop_matches_the_recorded_offsets() {
    let notes = chidori_tests::root().join("../shared/notes/cuda-internals-data/cudaDeviceProp-offsets-by-version.txt");
    let text = std::fs::read_to_string(&notes).expect("the shared notes are beside the project");
    let mut current: Option<String> = None;
    let mut compared = 0;
    let mut failures = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("### ") {
            // "12.6.77" → "12.6"; versions Chidori does not generate are skipped.
            let v: Vec<&str> = v.trim().split('.').collect();
            let short = format!("{}.{}", v[0], v.get(1).unwrap_or(&"0"));
            current = structs::get(&short, "cudaDeviceProp").map(|_| short);
            continue;
        }
        let Some(cuda) = &current else { continue };
        let map = structs::get(cuda, "cudaDeviceProp").unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["sizeof", size] => {
                compared += 1;
                if size.parse::<u32>().unwrap() != map.size {
                    failures.push(format!("{cuda}: sizeof {size} vs map {}", map.size));
                }
            }
            [offset, size, name] => {
                compared += 1;
                match map.fields.iter().find(|f| f.name == *name) {
                    Some(f) if f.offset == offset.parse::<u32>().unwrap() && f.size == size.parse::<u32>().unwrap() => {
                    }
                    other => failures.push(format!("{cuda} {name}: notes {offset}/{size}, map {other:?}")),
                }
            }
            _ => {}
        }
    }
    assert!(compared > 300, "compared only {compared} lines");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
