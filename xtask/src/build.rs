//! `cargo xtask build`: the eBPF object (nightly, bpfel-unknown-none, build-std=core), copied to
//! `target/bpf/ailb.bpf.o`, then the `ailb` binary that embeds it.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use crate::util::{self, say, Step};

const EBPF_DIR: &str = "ailb-ebpf";
const BPF_TARGET: &str = "bpfel-unknown-none";
/// BTF (for BTF maps such as sk_storage and readable `bpftool map dump`), for the BPF target only:
/// a global RUSTFLAGS would also reach the host build scripts that build-std compiles.
const BPF_RUSTFLAGS: &str = "-C debuginfo=2 -C link-arg=--btf";

pub(crate) fn build(release: bool) -> Result<()> {
    build_ebpf()?;
    build_userspace(release)
}

pub(crate) fn build_ebpf() -> Result<()> {
    let root = util::workspace_root();
    let crate_dir = root.join(EBPF_DIR);
    let manifest = crate_dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "the eBPF crate is missing: {} does not exist (ailb-ebpf/ must be a cargo package \
             named `ailb-ebpf` with one binary target)",
            manifest.display()
        );
    }

    let object = util::bpf_object_path();
    let stamp = object.with_file_name(".ailb.bpf.o.stamp");
    let inputs = ebpf_inputs(&root)?;
    if let (true, Some(built)) = (object.is_file(), mtime(&stamp)) {
        if inputs.iter().all(|(_, t)| *t <= built) {
            say!("eBPF object is up to date: {}", object.display());
            return Ok(());
        }
    }

    let ebpf_target = crate_dir.join("target");
    let step = Step::start(format!("building eBPF object (nightly, {BPF_TARGET})"));
    util::run(
        util::cargo_nightly()
            .current_dir(&crate_dir)
            .args(["build", "--release", "--target", BPF_TARGET, "-Z", "build-std=core"])
            // The object is read back from the crate's own target dir below, also when a
            // CARGO_TARGET_DIR set for the workspace would send the build elsewhere.
            .arg("--target-dir")
            .arg(&ebpf_target)
            .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS", BPF_RUSTFLAGS),
    )
    .context(
        "building the eBPF crate failed (the nightly toolchain with rust-src and bpf-linker are \
         needed: `cargo xtask setup` installs them)",
    )?;

    let bin = ebpf_bin_name(&crate_dir)?;
    let built = ebpf_target.join(BPF_TARGET).join("release").join(&bin);
    let bytes = std::fs::read(&built).with_context(|| format!("reading the eBPF object {}", built.display()))?;
    if !bytes.starts_with(b"\x7fELF") {
        bail!("{} is not an ELF object", built.display());
    }
    let dir = object.parent().context("object path has no parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Rewrite only on change: the userspace build script re-embeds (and cargo recompiles
    // `ailb`) whenever the object's mtime moves.
    if std::fs::read(&object).ok().as_deref() != Some(&bytes[..]) {
        std::fs::write(&object, &bytes).with_context(|| format!("writing {}", object.display()))?;
    }
    std::fs::write(&stamp, b"").with_context(|| format!("writing {}", stamp.display()))?;
    step.done();
    say!("eBPF object: {} ({} bytes)", object.display(), bytes.len());
    Ok(())
}

pub(crate) fn build_userspace(release: bool) -> Result<()> {
    let profile = if release { "release" } else { "debug" };
    let step = Step::start(format!("building ailb ({profile})"));
    let mut cmd = util::cargo();
    cmd.args(["build", "-p", "ailb-userspace"]);
    if release {
        cmd.arg("--release");
    }
    util::run(&mut cmd).context("building ailb-userspace")?;
    step.done();
    say!("ailb: {}", util::ailb_bin(profile).display());
    Ok(())
}

/// The binary target of the eBPF package, from `cargo metadata`.
fn ebpf_bin_name(crate_dir: &Path) -> Result<String> {
    let out = util::output(util::cargo_nightly().current_dir(crate_dir).args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
    ]))
    .context("reading the eBPF crate's metadata")?;
    let meta: serde_json::Value = serde_json::from_str(&out).context("parsing `cargo metadata` output")?;
    let bins: Vec<String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")))
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    match &bins[..] {
        [one] => Ok(one.clone()),
        [] => bail!("the eBPF crate in {} has no binary target", crate_dir.display()),
        many => bail!(
            "the eBPF crate in {} has several binary targets ({}); expected one",
            crate_dir.display(),
            many.join(", ")
        ),
    }
}

/// Every file the eBPF object depends on: the eBPF crate (without its target dir) and
/// ailb-common's sources and manifest, with their modification times.
fn ebpf_inputs(root: &Path) -> Result<Vec<(PathBuf, SystemTime)>> {
    let mut files = Vec::new();
    walk(&root.join(EBPF_DIR), &mut files)?;
    walk(&root.join("ailb-common/src"), &mut files)?;
    walk(&root.join("ailb-common/Cargo.toml"), &mut files)?;
    Ok(files)
}

fn walk(path: &Path, out: &mut Vec<(PathBuf, SystemTime)>) -> Result<()> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if meta.is_dir() {
        if path.file_name().is_some_and(|n| n == "target") {
            return Ok(());
        }
        for entry in std::fs::read_dir(path).with_context(|| format!("reading {}", path.display()))? {
            walk(&entry?.path(), out)?;
        }
    } else {
        out.push((path.to_path_buf(), meta.modified()?));
    }
    Ok(())
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
