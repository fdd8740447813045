//! Small helpers shared by the subcommands: progress lines, running commands with context,
//! paths of the workspace.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Prints one progress line, `[xtask] ...`.
macro_rules! say {
    ($($arg:tt)*) => {
        println!("[xtask] {}", format_args!($($arg)*))
    };
}
pub(crate) use say;

/// A long step: prints `[xtask] <what>...` when it starts and the elapsed seconds when it ends.
pub(crate) struct Step {
    what: String,
    start: Instant,
}

impl Step {
    pub(crate) fn start(what: impl Into<String>) -> Self {
        let what = what.into();
        say!("{what}...");
        Step { what, start: Instant::now() }
    }

    pub(crate) fn done(self) {
        say!("{}: done in {:.1}s", self.what, self.start.elapsed().as_secs_f64());
    }
}

/// The workspace root (the directory that holds the root `Cargo.toml`).
pub(crate) fn workspace_root() -> PathBuf {
    // xtask/ is one level below the root; this is fixed at compile time.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in a subdirectory of the workspace")
        .to_path_buf()
}

/// The cargo target directory of the workspace (`CARGO_TARGET_DIR` or `<root>/target`).
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// Where `cargo xtask build` puts the eBPF object; `ailb-userspace/build.rs` embeds it from here.
pub(crate) fn bpf_object_path() -> PathBuf {
    workspace_root().join("target").join("bpf").join("ailb.bpf.o")
}

/// The `ailb` binary of a profile ("debug" or "release").
pub(crate) fn ailb_bin(profile: &str) -> PathBuf {
    target_dir().join(profile).join("ailb")
}

/// Free bytes on the file system that holds `path` (for unprivileged users), or `None` when it
/// cannot be read.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is a writable statvfs that the call fills
    // when it returns 0; it is read only then.
    let st = unsafe {
        if libc::statvfs(c.as_ptr(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Says how much disk is left where the build writes, so that a build that dies for want of it
/// (a linker's SIGBUS, "No space left on device") is recognised from the log alone.
pub(crate) fn say_disk(when: &str) {
    let dir = target_dir();
    let at = if dir.exists() { dir } else { workspace_root() };
    match free_bytes(&at) {
        Some(b) => say!("disk {when}: {:.1} GB free at {}", b as f64 / 1e9, at.display()),
        None => say!("disk {when}: free space at {} unreadable", at.display()),
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The cargo that runs us (stable, through the rustup proxy), or `cargo` from PATH.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// `cargo +nightly ...` through the rustup proxy on PATH. `CARGO` points at the stable
/// toolchain's cargo binary, which does not understand `+nightly`, so this uses the proxy.
pub(crate) fn cargo_nightly() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly");
    // An outer `cargo run` may have pinned the toolchain for its children.
    cmd.env_remove("RUSTUP_TOOLCHAIN");
    cmd.current_dir(workspace_root());
    cmd
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio; fails when it cannot start or exits non-zero.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let desc = describe(cmd);
    let status = cmd.status().with_context(|| format!("failed to start `{desc}`"))?;
    if !status.success() {
        bail!("`{desc}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and captures its output; fails when it cannot start or exits non-zero.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let desc = describe(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("failed to start `{desc}`"))?;
    if !out.status.success() {
        bail!("`{desc}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command, capturing output, and returns it whatever the exit status (None if it
/// could not be started at all, e.g. the program is missing).
pub(crate) fn probe<S: AsRef<OsStr>>(program: S, args: &[&str]) -> Option<Output> {
    Command::new(program).args(args).stdin(Stdio::null()).output().ok()
}

/// Finds a program on PATH, and in the sbin directories that a non-login root shell may lack.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path).chain(extra).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// The cgroup2 mount point, from /proc/mounts (never hard-coded: it is /sys/fs/cgroup on most
/// hosts and /sys/fs/cgroup/unified on hybrid layouts).
pub(crate) fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_src, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(dir))
        })
        .next()
        .context("no cgroup2 filesystem in /proc/mounts: ailb attaches to a cgroup v2")
}

/// Whether a filesystem of type `fstype` is mounted exactly at `dir`.
pub(crate) fn mounted_at(dir: &str, fstype: &str) -> Result<bool> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    Ok(mounts.lines().any(|line| {
        let mut f = line.split_whitespace();
        matches!((f.next(), f.next(), f.next()), (Some(_), Some(d), Some(t)) if d == dir && t == fstype)
    }))
}

/// Builds the release binaries `bins` of `packages` in one cargo run (the tools find each other
/// next to themselves, so they must land in one target directory), into `target_dir()/release`.
pub(crate) fn build_release_bins(packages: &[&str], bins: &[&str]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["build", "--quiet", "--release"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    for b in bins {
        cmd.args(["--bin", b]);
    }
    run(&mut cmd).with_context(|| format!("building {}", bins.join(", ")))
}
