//! `cargo xtask wheel [--check-install]`: the `pip install chidori` wheel,
//! `target/wheels/chidori-<version>-py3-none-manylinux_2_28_x86_64.whl`.
//!
//! maturin packs it (`pyproject.toml`: `bindings = "bin"` for the `chidori` binary, which
//! lands in the scripts directory, plus the Python package of `python/chidori`), and
//! builds the binary with `--zig`: zig links against glibc 2.28's symbol versions, the
//! floor the tag promises. maturin builds one crate; libchidori.so is another
//! (`interposer/`), and the shims are assembled from `generated/shims` by a C compiler.
//! So this task first builds libchidori.so with cargo-zigbuild (the same zig front end),
//! assembles the shims, and stages them with the device profile into
//! `python/chidori/{lib,profiles}` (ignored by git, included by `pyproject.toml`).
//!
//! The two builds use separate target directories (`target/wheel-interposer` for
//! cargo-zigbuild's): each tool writes its own compiler wrappers, cargo sees different
//! `CC`/linker settings, and in one directory each build would redo the other's (same
//! artifact names, different fingerprints) on every run.
//!
//! Every ELF file in the finished wheel is checked against the floor ([`crate::glibc`]).
//! The tools (maturin, cargo-zigbuild, zig from the `ziglang` package) are installed by pip
//! into a venv under `target/wheel-tools`, once; later runs need no network.
//!
//! `--check-install` then installs the wheel the way users do (a fresh venv, and
//! `pip install --target DIR`) and runs CUDA calls through the installed `chidori run`
//! against the installed `chidori serve --backend emulated`.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use chidori_protocol::env;

use crate::glibc;

/// The build tools, pinned so that a wheel built later is built the same way.
pub const TOOLS: &[&str] = &["maturin==1.16.0", "cargo-zigbuild==0.24.0", "ziglang==0.17.1"];

/// The Rust target with the glibc floor, as cargo-zigbuild spells it.
const ZIG_TARGET: &str = "x86_64-unknown-linux-gnu.2.28";

/// The wheel's platform tag: the glibc floor and the architecture.
const PLATFORM_TAG: &str = "manylinux_2_28_x86_64";

/// The workspace version, which maturin writes into the wheel from the same Cargo.toml (a
/// pre-release would be spelled the PEP 440 way there, `0.2.0rc1`; none is used).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The device profile the emulated backend answers from by default.
const PROFILE: &str = "nvidia-h200.json";

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => root.join("target"),
    }
}

/// The venv of the build tools under the target directory.
pub struct Tools {
    bin: PathBuf,
}

impl Tools {
    /// Install [`TOOLS`] into `target/wheel-tools` unless the venv already has them.
    pub fn ensure(root: &Path) -> Result<Tools> {
        let venv = target_dir(root).join("wheel-tools");
        let bin = venv.join("bin");
        let stamp = venv.join("chidori-tools.txt");
        let wanted = TOOLS.join("\n");
        if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) && bin.join("maturin").is_file() {
            return Ok(Tools { bin });
        }
        eprintln!("wheel: installing {} into {}", TOOLS.join(" "), venv.display());
        if !bin.join("python3").is_file() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
                .context("creating the tools venv (Debian: apt-get install python3-venv)")?;
        }
        run(Command::new(bin.join("python3"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(TOOLS))
        .context("installing the wheel tools with pip")?;
        std::fs::write(&stamp, wanted)?;
        Ok(Tools { bin })
    }

    /// A command for a tool of the venv, with the venv first on PATH (where cargo-zigbuild
    /// and maturin find zig, as `python3 -m ziglang`).
    fn command(&self, tool: &str) -> Result<Command> {
        let mut cmd = Command::new(self.bin.join(tool));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.clone()];
        paths.extend(std::env::split_paths(&path));
        let path = std::env::join_paths(paths)
            .with_context(|| format!("{} cannot go on PATH (it holds a ':')", self.bin.display()))?;
        cmd.env("PATH", path);
        Ok(cmd)
    }
}

/// Run `cmd`, failing with its command line when it fails.
fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}

/// Run `cmd` and return its stdout; the error carries both outputs.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// The wheel's path for this version.
pub fn wheel_path(root: &Path) -> PathBuf {
    target_dir(root).join("wheels").join(format!("chidori-{VERSION}-py3-none-{PLATFORM_TAG}.whl"))
}

/// Build the wheel and check it; its path.
pub fn build(root: &Path) -> Result<PathBuf> {
    let started = Instant::now();
    let tools = Tools::ensure(root)?;
    let target = target_dir(root);

    // libchidori.so with the glibc floor, in its own target directory (see the module docs).
    let interposer_target = target.join("wheel-interposer");
    run(tools.command("cargo-zigbuild")?.current_dir(root).env("CARGO_TARGET_DIR", &interposer_target).args([
        "zigbuild",
        "--release",
        "--target",
        ZIG_TARGET,
        "-p",
        "chidori-interposer",
    ]))
    .context("building libchidori.so with cargo-zigbuild")?;
    let built = interposer_target.join("x86_64-unknown-linux-gnu/release");

    // The package data: libchidori.so, the shims, the -lcuda name, the profile.
    let package = root.join("python/chidori");
    let lib = package.join("lib");
    let profiles = package.join("profiles");
    for dir in [&lib, &profiles] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(built.join("libchidori.so"), lib.join("libchidori.so")).context("copying libchidori.so")?;
    // Line tables are most of its size (maturin strips the binary itself).
    if !Command::new("strip").arg("--strip-debug").arg(lib.join("libchidori.so")).status().is_ok_and(|s| s.success()) {
        bail!("`strip --strip-debug` failed on libchidori.so (binutils is needed)");
    }
    crate::dist::build_shims(root, &lib)?;
    // pip installs no symlinks from a wheel, so the name programs link with -lcuda is a copy
    // of the shim (a 140 KiB one).
    std::fs::copy(lib.join("libcuda.so.1"), lib.join("libcuda.so"))?;
    std::fs::copy(root.join("worker/profiles").join(PROFILE), profiles.join(PROFILE))?;

    run(tools
        .command("maturin")?
        .current_dir(root)
        .args(["build", "--release", "--zig", "--quiet", "--out"])
        .arg(target.join("wheels")))
    .context("packing the wheel with maturin")?;
    let wheel = wheel_path(root);
    ensure!(wheel.is_file(), "maturin did not write {}", wheel.display());
    print!("{}", check(root, &wheel)?);
    eprintln!("wheel: {} in {:.0} s", wheel.display(), started.elapsed().as_secs_f64());
    Ok(wheel)
}

/// The files a complete wheel holds (beyond the dist-info), as paths inside it.
fn expected_files(root: &Path) -> Result<Vec<String>> {
    let mut files = vec![
        format!("chidori-{VERSION}.data/scripts/chidori"),
        "chidori/__init__.py".to_owned(),
        "chidori/__main__.py".to_owned(),
        "chidori/py.typed".to_owned(),
        "chidori/lib/libchidori.so".to_owned(),
        "chidori/lib/libcuda.so".to_owned(),
        format!("chidori/profiles/{PROFILE}"),
    ];
    let index = std::fs::read_to_string(root.join("generated/shims/index.txt"))?;
    for line in index.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let soname = line.split_whitespace().next().context("empty index line")?;
        files.push(format!("chidori/lib/{soname}"));
    }
    Ok(files)
}

/// Check `wheel`: every expected file is there, and every ELF file keeps the glibc floor.
/// The report lists each ELF file with the newest glibc version it needs.
pub fn check(root: &Path, wheel: &Path) -> Result<String> {
    let file = std::fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(file).with_context(|| format!("reading {}", wheel.display()))?;
    let names: BTreeSet<String> = archive.file_names().map(str::to_owned).collect();
    let missing: Vec<String> = expected_files(root)?.into_iter().filter(|f| !names.contains(f)).collect();
    ensure!(missing.is_empty(), "{} lacks {}", wheel.display(), missing.join(", "));

    let mut report = format!(
        "{}: {} files, {:.1} MiB; glibc floor {}.{}:\n",
        wheel.file_name().unwrap_or_default().to_string_lossy(),
        names.len(),
        std::fs::metadata(wheel)?.len() as f64 / (1024.0 * 1024.0),
        glibc::FLOOR.0,
        glibc::FLOOR.1
    );
    let mut failures = Vec::new();
    let mut elf_files = 0;
    for name in &names {
        let mut entry = archive.by_name(name)?;
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut bytes).with_context(|| format!("reading {name} from the wheel"))?;
        if !bytes.starts_with(b"\x7fELF") {
            continue;
        }
        elf_files += 1;
        let directory = name.rsplit_once('/').map_or("", |(d, _)| d);
        let beside: BTreeSet<String> = names
            .iter()
            .filter_map(|n| n.strip_prefix(directory)?.strip_prefix('/'))
            .filter(|n| !n.contains('/'))
            .map(str::to_owned)
            .collect();
        let needs = glibc::needs(&bytes).with_context(|| format!("reading {name}"))?;
        let newest = needs.newest_glibc().map_or("none".to_owned(), |(a, b, c)| {
            if c == 0 { format!("GLIBC_{a}.{b}") } else { format!("GLIBC_{a}.{b}.{c}") }
        });
        let violations = glibc::violations(&needs, glibc::FLOOR, &beside);
        let paths = if needs.search_paths.is_empty() {
            String::new()
        } else {
            format!(", rpath {}", needs.search_paths.join(":"))
        };
        report.push_str(&format!(
            "  {name:<58} newest {newest:<12}{paths}{}\n",
            if violations.is_empty() { "" } else { "  FAILS" }
        ));
        failures.extend(violations.into_iter().map(|v| format!("{name}: {v}")));
    }
    ensure!(elf_files > 0, "{} holds no ELF file", wheel.display());
    if !failures.is_empty() {
        bail!("{report}the wheel breaks its manylinux_2_28 tag:\n  {}", failures.join("\n  "));
    }
    report.push_str(&format!("  all {elf_files} ELF files keep the floor; none searches outside $ORIGIN\n"));
    Ok(report)
}

/// The program `--check-install` runs through `chidori run`: CUDA calls through the
/// `libcudart.so.13` shim with ctypes, then what the `chidori` package says about them.
const CHECK_PROGRAM: &str = r#"
import ctypes, json, os
import chidori

cudart = ctypes.CDLL("libcudart.so.13")
count = ctypes.c_int(-1)
assert cudart.cudaGetDeviceCount(ctypes.byref(count)) == 0, "cudaGetDeviceCount failed"
size = 1 << 20
device = ctypes.c_void_p()
assert cudart.cudaMalloc(ctypes.byref(device), ctypes.c_size_t(size)) == 0, "cudaMalloc failed"
# Random bytes: a link the client finds slow gets compressed copies, and the server keeps
# uploads it has seen; neither may shrink what the totals must show.
sent = (ctypes.c_ubyte * size).from_buffer_copy(os.urandom(size))
back = (ctypes.c_ubyte * size)()
assert cudart.cudaMemcpy(device, sent, ctypes.c_size_t(size), 1) == 0, "cudaMemcpy H2D failed"
assert cudart.cudaMemcpy(back, device, ctypes.c_size_t(size), 2) == 0, "cudaMemcpy D2H failed"
assert bytes(back) == bytes(sent), "the copy came back different"
assert cudart.cudaFree(device) == 0, "cudaFree failed"
print(json.dumps({
    "devices": count.value,
    "version": chidori.__version__,
    "is_remote": chidori.is_remote(),
    "server": chidori.server(),
    "stats": chidori.stats(),
}))
"#;

/// The check's scratch directory under the target directory, emptied.
fn scratch(root: &Path) -> Result<PathBuf> {
    let dir = target_dir(root).join("wheel-check");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Install `wheel` as users do and use it: the commands, the package, and a CUDA program
/// run through `chidori run` against an emulated `chidori serve`, all from the install.
pub fn check_install(root: &Path, wheel: &Path) -> Result<()> {
    let started = Instant::now();
    let dir = scratch(root)?;
    // Away from the checkout, so that `import chidori` can only mean the installed one.
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    let program = work.join("check.py");
    std::fs::write(&program, CHECK_PROGRAM)?;

    // A fresh venv, offline: the wheel needs nothing else.
    let venv = dir.join("venv");
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("creating a venv (Debian: apt-get install python3-venv)")?;
    let python = venv.join("bin/python");
    output(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--disable-pip-version-check"])
            .arg(wheel),
    )
    .context("installing the wheel into a fresh venv")?;
    let chidori = venv.join("bin/chidori");
    let version = output(Command::new(&chidori).arg("--version"))?;
    ensure!(version.trim() == format!("chidori {VERSION}"), "`chidori --version` printed {version:?}");
    println!("check-install: {} --version: {}", chidori.display(), version.trim());
    let mut passed = 1;
    let help = output(Command::new(&python).args(["-m", "chidori", "--help"]).current_dir(&work))?;
    ensure!(help.contains("serve") && help.contains("run"), "`python -m chidori --help` printed:\n{help}");
    println!("check-install: python -m chidori --help: {}", help.lines().next().unwrap_or_default());
    passed += 1;
    let imported = output(
        Command::new(&python)
            .args([
                "-c",
                "import chidori; print(chidori.__version__, chidori.is_remote(), chidori.server(), chidori.stats())",
            ])
            .current_dir(&work)
            .env_remove(env::SERVER),
    )?;
    ensure!(
        imported.trim() == format!("{VERSION} False None {{}}"),
        "outside `chidori run`, the package said {imported:?}"
    );
    println!("check-install: import chidori: {}", imported.trim());
    passed += 1;
    let tests = root.join("python/tests");
    let unittest = Command::new(&python)
        .args(["-m", "unittest", "discover", "-s"])
        .arg(&tests)
        .arg("-t")
        .arg(&tests)
        .current_dir(&work)
        .env_remove(env::SERVER)
        .stdin(Stdio::null())
        .output()
        .context("running python/tests")?;
    let report = String::from_utf8_lossy(&unittest.stderr);
    ensure!(unittest.status.success(), "python/tests failed against the installed package:\n{report}");
    println!("check-install: python/tests: {}", report.lines().rfind(|l| l.starts_with("Ran ")).unwrap_or("ran"));
    passed += 1;

    // Both sides from the venv: serve finds its profile and run its shims in the package.
    let server =
        crate::matrix::EmulatedServer::start_with(&chidori, None).context("starting the venv's chidori serve")?;
    let result = output(
        Command::new(&chidori)
            .args(["run", "-s", &server.address, "--"])
            .arg(&python)
            .arg(&program)
            .current_dir(&work)
            .env_remove(env::LIB_DIR),
    )
    .context("running a program through the venv's chidori run")?;
    check_program_output(&result, &server.address)?;
    println!("check-install: venv: chidori run -- python check.py: {}", result.trim());
    passed += 1;

    // `pip install --target DIR`, the offline install on a GPU machine: DIR/bin/chidori.
    let target = dir.join("target-install");
    output(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&target)
            .arg(wheel),
    )
    .context("installing the wheel with pip install --target")?;
    let target_chidori = target.join("bin/chidori");
    let version = output(
        Command::new(&python).args(["-m", "chidori", "--version"]).current_dir(&work).env("PYTHONPATH", &target),
    )?;
    ensure!(version.trim() == format!("chidori {VERSION}"), "`python -m chidori --version` of DIR printed {version:?}");
    passed += 1;
    let result = output(
        Command::new(&target_chidori)
            .args(["run", "-s", &server.address, "--"])
            .arg(&python)
            .arg(&program)
            .current_dir(&work)
            .env("PYTHONPATH", &target)
            .env_remove(env::LIB_DIR),
    )
    .context("running a program through chidori run of a pip install --target")?;
    check_program_output(&result, &server.address)?;
    println!("check-install: pip install --target DIR: python -m chidori and DIR/bin/chidori run work too");
    passed += 1;
    drop(server);
    // The closing line in the form test runners end with (a failed check ended the task
    // above with its error).
    println!("check-install: done in {:.0} s", started.elapsed().as_secs_f64());
    println!("check-install: {passed} passed, 0 failed");
    Ok(())
}

/// What the check program must have seen: the emulated H200, a remote process that knows
/// its server, and counts for the calls it made.
fn check_program_output(stdout: &str, server: &str) -> Result<()> {
    let line = stdout.lines().last().context("the check program printed nothing")?;
    let seen: serde_json::Value = serde_json::from_str(line).with_context(|| format!("parsing {line:?}"))?;
    ensure!(seen["devices"] == 1, "expected the profile's one device: {line}");
    ensure!(seen["version"] == VERSION, "chidori.__version__ is not {VERSION}: {line}");
    ensure!(seen["is_remote"] == true, "chidori.is_remote() is false under chidori run: {line}");
    ensure!(seen["server"] == server, "chidori.server() is not {server}: {line}");
    let stats = &seen["stats"];
    for function in ["cudaGetDeviceCount", "cudaMalloc", "cudaMemcpy", "cudaFree"] {
        ensure!(stats[function]["calls"].as_u64().is_some_and(|n| n >= 1), "no {function} in chidori.stats(): {line}");
    }
    let total = &stats["total"];
    let at_least = |key: &str, n: u64| total[key].as_u64().is_some_and(|v| v >= n);
    ensure!(
        at_least("bytes_sent", 1 << 20) && at_least("bytes_received", 1 << 20) && at_least("round_trips", 1),
        "the totals miss the 1 MiB sent and received: {line}"
    );
    Ok(())
}
