//! Generator tests: committed output is fresh, goldens (small header + spec → expected
//! IR, exports, call descriptors and shim), and spec errors.

use std::collections::BTreeMap;
use std::path::Path;

use xtask::ir::{AllIr, Meta};
use xtask::libraries::Libraries;
use xtask::model::Model;

#[test]
fn committed_generated_code_is_fresh() {
    // The same check as `cargo xtask gen --check`: a plain `cargo test` fails on drift.
    if let Err(e) = xtask::codegen::run(&chidori_tests::root(), None, xtask::codegen::Mode::Check) {
        panic!("{e:#}");
    }
}

/// A fixture's `library.toml` (`[fixture] versioned = …` and one `[[library]]`) and its
/// `spec.toml`.
fn load_fixture(dir: &Path) -> (Libraries, bool, xtask::spec::SpecFile) {
    let text = std::fs::read_to_string(dir.join("library.toml")).expect("library.toml");
    let versioned = text.contains("versioned = true");
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("[fixture]") && !l.starts_with("versioned"))
        .collect::<Vec<_>>()
        .join("\n");
    let libraries: Libraries = toml_from_str(&body);
    let spec_text = std::fs::read_to_string(dir.join("spec.toml")).unwrap_or_default();
    let spec = toml_spec(&spec_text);
    (libraries, versioned, spec)
}

fn toml_from_str(text: &str) -> Libraries {
    let dir = chidori_tests::scratch("fixture-lib");
    std::fs::create_dir_all(dir.join("specs")).unwrap();
    std::fs::write(dir.join("specs/libraries.toml"), text).unwrap();
    Libraries::load(&dir).expect("fixture library.toml")
}

fn toml_spec(text: &str) -> xtask::spec::SpecFile {
    let dir = chidori_tests::scratch("fixture-spec");
    std::fs::create_dir_all(dir.join("specs")).unwrap();
    std::fs::write(dir.join("specs/fixture.toml"), text).unwrap();
    xtask::spec::load(&dir, "fixture").expect("fixture spec.toml")
}

/// Build the model of one fixture: every `versions/<cuda>/` holds that version's headers.
fn fixture_model(dir: &Path) -> (Model, BTreeMap<String, String>) {
    let (libraries, versioned, spec) = load_fixture(dir);
    let lib = libraries.libraries[0].clone();
    let stub = chidori_tests::root().join("headers/stub");
    let mut all = AllIr::new();
    let mut irs = BTreeMap::new();
    for entry in std::fs::read_dir(dir.join("versions")).expect("versions/") {
        let entry = entry.unwrap();
        let cuda = entry.file_name().to_string_lossy().into_owned();
        let (mut ir, headers) =
            xtask::irgen::declarations(&entry.path(), &stub, &lib).expect("bindgen").expect("headers present");
        let soname = lib.soname.clone().expect("fixture soname");
        ir.meta = Some(Meta {
            cuda: cuda.clone(),
            library: lib.name.clone(),
            libclang: String::new(),
            bindgen: String::new(),
            headers,
            version_nodes: if versioned { vec![soname.clone()] } else { vec![] },
            soname,
            real_exports: vec![],
        });
        irs.insert(cuda.clone(), ir.to_jsonl().unwrap());
        all.entry(cuda).or_default().insert(lib.name.clone(), ir);
    }
    let specs = BTreeMap::from([(lib.name.clone(), spec)]);
    (Model::build_with_specs(&all, &libraries, specs).expect("model"), irs)
}

fn check_golden(dir: &Path, name: &str, actual: &str, failures: &mut Vec<String>) {
    let path = dir.join("expected").join(name);
    if std::env::var_os("UPDATE_GOLDENS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .map(|n| {
                format!(
                    "line {}:\n  expected: {}\n  got:      {}",
                    n + 1,
                    expected.lines().nth(n).unwrap_or(""),
                    actual.lines().nth(n).unwrap_or("")
                )
            })
            .unwrap_or_else(|| "lengths differ".into());
        failures.push(format!("{}: {line}\n(rerun with UPDATE_GOLDENS=1 to accept)", path.display()));
    }
}

#[test]
fn goldens() {
    let fixtures = chidori_tests::root().join("tests/fixtures/gen");
    let mut failures = Vec::new();
    let mut cases = 0;
    for entry in std::fs::read_dir(&fixtures).expect("tests/fixtures/gen") {
        let dir = entry.unwrap().path();
        cases += 1;
        let (model, irs) = fixture_model(&dir);
        for (cuda, ir) in &irs {
            check_golden(&dir, &format!("ir-{cuda}.jsonl"), ir, &mut failures);
        }
        let lib = &model.libraries[0];
        let outputs = xtask::emit::emit(&model, None).expect("emit");
        for (path, text) in outputs {
            let wanted = [
                format!("generated/client/{}.rs", lib.lib.name),
                "generated/cuda/src/calls.rs".to_owned(),
                "generated/cuda/src/types.rs".to_owned(),
                "generated/worker/src/lib.rs".to_owned(),
            ];
            let shim = path.strip_prefix("generated/shims/").filter(|p| *p != "index.txt");
            if wanted.contains(&path) || shim.is_some() {
                let name = path.rsplit('/').next().unwrap();
                check_golden(&dir, name, &text, &mut failures);
            }
        }
    }
    assert!(cases >= 2, "expected at least two fixtures in {}", fixtures.display());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_spec_naming_an_unknown_function_is_an_error() {
    let dir = chidori_tests::root().join("tests/fixtures/gen/basic");
    let (libraries, _, _) = load_fixture(&dir);
    let mut all = AllIr::new();
    // Build from the fixture's IR with a spec naming a function no header declares.
    let lib = libraries.libraries[0].clone();
    let stub = chidori_tests::root().join("headers/stub");
    let (mut ir, _) = xtask::irgen::declarations(&dir.join("versions/12.6"), &stub, &lib).unwrap().unwrap();
    ir.meta = Some(Meta {
        cuda: "12.6".into(),
        library: lib.name.clone(),
        libclang: String::new(),
        bindgen: String::new(),
        headers: BTreeMap::new(),
        soname: lib.soname.clone().unwrap(),
        version_nodes: vec![],
        real_exports: vec![],
    });
    all.entry("12.6".into()).or_default().insert(lib.name.clone(), ir);
    let spec = toml_spec("[function.miniNoSuchFunction]\nclass = \"sync\"\n");
    let err = Model::build_with_specs(&all, &libraries, BTreeMap::from([(lib.name.clone(), spec)]))
        .err()
        .expect("an unknown function must be refused");
    assert!(format!("{err:#}").contains("miniNoSuchFunction"), "{err:#}");
    let spec = toml_spec("[function.miniSetValue]\nparams = { nosuchparam = \"in\" }\n");
    let err = Model::build_with_specs(&all, &libraries, BTreeMap::from([(lib.name.clone(), spec)]))
        .err()
        .expect("an unknown parameter must be refused");
    assert!(format!("{err:#}").contains("nosuchparam"), "{err:#}");
    // An async create needs a kind the client names: a reply would carry the handle.
    let spec = toml_spec("[function.miniStreamCreate]\nclass = \"async\"\n");
    let model = Model::build_with_specs(&all, &libraries, BTreeMap::from([(lib.name.clone(), spec)])).unwrap();
    let err = xtask::emit::emit(&model, None).expect_err("an async create of an unnamed kind must be refused");
    assert!(format!("{err:#}").contains("miniStreamCreate"), "{err:#}");
}
