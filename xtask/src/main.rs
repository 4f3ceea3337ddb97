//! `cargo xtask <command>`: see `cargo xtask --help`.

use anyhow::Result;
use clap::{Parser, Subcommand};

use xtask::{headers, irgen, lock, project_root};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Chidori build tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch the locked NVIDIA wheels and extract their headers into target/cuda-headers.
    Headers {
        /// One CUDA version (default: all in headers/cuda.lock.toml).
        #[arg(long)]
        cuda: Option<String>,
        /// Only the small runtime wheels (cuda.h, cuda_runtime_api.h, …) the C probes need.
        #[arg(long)]
        runtime_only: bool,
        /// Keep large wheels after extraction.
        #[arg(long)]
        keep_wheels: bool,
    },
    /// Stage 1: bindgen over the cached headers → generated/ir (needs libclang).
    Ir {
        #[arg(long)]
        cuda: Option<String>,
        #[arg(long)]
        all: bool,
        /// Only this library.
        #[arg(long)]
        library: Option<String>,
    },
    /// Stage 2: generated/ir + specs → generated/ (pure Rust; no libclang, no network).
    Gen {
        /// Regenerate only this CUDA version's per-version files.
        #[arg(long)]
        cuda: Option<String>,
        /// Regenerate everything.
        #[arg(long)]
        all: bool,
        /// Fail if the committed output is stale instead of writing.
        #[arg(long)]
        check: bool,
    },
    /// Build release artifacts into target/dist (bin/chidori, lib/libchidori.so, the shims).
    Dist {
        /// Cargo profile.
        #[arg(long, default_value = "release")]
        profile: String,
    },
    /// Build the `pip install chidori` wheel into target/wheels (binary, libchidori.so, the
    /// shims, the device profile, the Python package) with the manylinux_2_28 glibc floor,
    /// and check every ELF file in it against that floor.
    Wheel {
        /// Then install it into a fresh venv and with `pip install --target`, and run a CUDA
        /// program through the installed `chidori run` against the installed emulated
        /// `chidori serve`.
        #[arg(long)]
        check_install: bool,
        /// Check this wheel instead of building one (with --check-install: install it).
        #[arg(long, value_name = "WHEEL")]
        prebuilt: Option<std::path::PathBuf>,
    },
    /// Per library and CUDA version: exported, forwarded, hand-written, NOT_SUPPORTED; and
    /// the functions torch imports that still answer NOT_SUPPORTED.
    Coverage {
        /// Also list every NOT_SUPPORTED export of this library at this CUDA version, with
        /// its reason (`--list cudart@13.0`).
        #[arg(long, value_name = "LIBRARY@CUDA")]
        list: Vec<String>,
    },
    /// The version-translation matrix: C programs built against each CUDA version's headers,
    /// run through `chidori run` (an emulated server unless --server is given).
    Matrix {
        /// Use this server instead of starting an emulated one.
        #[arg(long)]
        server: Option<String>,
        /// Device profile the results are checked against (default: the committed H200 one).
        #[arg(long)]
        profile: Option<std::path::PathBuf>,
        /// Only this CUDA version.
        #[arg(long)]
        cuda: Option<String>,
        /// Where the programs are built (or, with --prebuilt, found).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Only build the programs.
        #[arg(long)]
        build_only: bool,
        /// Do not build; run the programs already in --dir.
        #[arg(long)]
        prebuilt: bool,
        /// The chidori binary (default: target/dist/bin/chidori).
        #[arg(long)]
        chidori: Option<std::path::PathBuf>,
    },
    /// Check the conventions: reasons for hand-written and NOT_SUPPORTED spec entries,
    /// module docs, `// SAFETY:` comments, workspace dependencies.
    Tidy,
    /// Print what the model makes of every function (development aid).
    Stats,
}

fn versions(cuda: Option<String>) -> Result<Vec<String>> {
    Ok(match cuda {
        Some(v) => vec![v],
        None => lock::Lock::load(&project_root())?.versions(),
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.command {
        Command::Headers { cuda, runtime_only, keep_wheels } => {
            let selection = if runtime_only { headers::Selection::RuntimeOnly } else { headers::Selection::All };
            headers::fetch(&root, &versions(cuda)?, selection, keep_wheels)
        }
        Command::Ir { cuda, all, library } => {
            if cuda.is_none() && !all {
                anyhow::bail!("say which version: --cuda 12.6, or --all");
            }
            irgen::run(&root, &versions(cuda)?, library.as_deref())
        }
        Command::Gen { cuda, all, check } => {
            if cuda.is_some() && all {
                anyhow::bail!("--cuda and --all exclude each other");
            }
            let mode = if check { xtask::codegen::Mode::Check } else { xtask::codegen::Mode::Write };
            xtask::codegen::run(&root, cuda.as_deref(), mode)
        }
        Command::Dist { profile } => xtask::dist::run(&root, &profile).map(|_| ()),
        Command::Wheel { check_install, prebuilt } => {
            let wheel = match prebuilt {
                Some(wheel) => {
                    print!("{}", xtask::wheel::check(&root, &wheel)?);
                    wheel
                }
                None => xtask::wheel::build(&root)?,
            };
            if check_install { xtask::wheel::check_install(&root, &wheel) } else { Ok(()) }
        }
        Command::Tidy => xtask::tidy::run(&root),
        Command::Coverage { list } => {
            let model = xtask::codegen::build_model(&root)?;
            print!("{}", xtask::coverage::report(&root, &model)?);
            for which in list {
                let (library, cuda) = which
                    .split_once('@')
                    .ok_or_else(|| anyhow::anyhow!("--list wants LIBRARY@CUDA (cudart@13.0), got {which}"))?;
                print!("{}", xtask::coverage::unsupported(&model, library, cuda)?);
            }
            Ok(())
        }
        Command::Matrix { server, profile, cuda, dir, build_only, prebuilt, chidori } => {
            let (dist_chidori, lib, dist_profile) = xtask::matrix::dist_paths(&root);
            let chidori = chidori.unwrap_or(dist_chidori);
            let profile = profile.unwrap_or(dist_profile);
            let dir = dir.unwrap_or_else(|| root.join("target/matrix"));
            let versions = match cuda {
                Some(v) => vec![v],
                None => xtask::matrix::versions(&root)?,
            };
            if !prebuilt {
                xtask::matrix::build(&root, &versions, &dir, &lib)?;
            }
            if build_only {
                return Ok(());
            }
            let emulated;
            let server = match server {
                Some(s) => s,
                None => {
                    emulated = xtask::matrix::EmulatedServer::start(&chidori, &profile)?;
                    emulated.address.clone()
                }
            };
            let rows = xtask::matrix::run(&root, &dir, &versions, &chidori, None, &server, &profile)?;
            print!("{}", xtask::matrix::table(&rows));
            if rows.iter().all(|r| r.ok()) { Ok(()) } else { anyhow::bail!("the version matrix has failures") }
        }
        Command::Stats => {
            let all = xtask::ir::load_all(&root)?;
            let libs = xtask::libraries::Libraries::load(&root)?;
            let model = xtask::model::Model::build(&root, &all, &libs)?;
            for l in &model.libraries {
                let mut n = [0usize; 4];
                let mut variants = 0;
                for f in l.functions.values() {
                    variants += f.variants.len();
                    for v in &f.variants {
                        let i = match v.disposition {
                            xtask::model::Disposition::Forward { .. } => 0,
                            xtask::model::Disposition::GeneratedLocal { .. } => 1,
                            xtask::model::Disposition::Custom { .. } => 2,
                            xtask::model::Disposition::Unsupported { .. } => 3,
                        };
                        n[i] += 1;
                    }
                }
                if std::env::var_os("STATS_VARIANTS").is_some() {
                    for f in l.functions.values().filter(|f| f.variants.len() > 1) {
                        let groups: Vec<_> = f.variants.iter().map(|v| v.versions.join(",")).collect();
                        println!("  multi {} {:?}", f.name, groups);
                    }
                }
                println!(
                    "{:<10} fns {:>4} variants {:>4} fwd {:>4} genlocal {:>3} custom {:>3} unsup {:>4}",
                    l.lib.name,
                    l.functions.len(),
                    variants,
                    n[0],
                    n[1],
                    n[2],
                    n[3]
                );
                for s in &l.shims {
                    println!(
                        "    {:<22} node {:?} versions {:?} exports {} undeclared {}",
                        s.soname,
                        s.node,
                        s.versions,
                        s.exports.len(),
                        l.undeclared[&s.soname].len()
                    );
                }
            }
            println!("procs {}", model.procs.len());
            Ok(())
        }
    }
}
