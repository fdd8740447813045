//! Harness for the privileged integration tests of the ailb kernel data plane.
//!
//! Every test builds its own world out of RAII guards, declared in this order so that they
//! drop in reverse: [`CgroupGuard`] (a child cgroup under the cgroup2 mount), the
//! [`BackendServer`]s (real HTTP-ish servers on 127.0.0.x), the [`Daemon`] (`ailb run` with a
//! config that attaches to that child cgroup and pins under a per-test bpffs dir), and clients
//! spawned inside the child cgroup through [`TestClient`]. Helpers `panic!` with a message that
//! says what was expected and what was seen; nothing sleeps to wait, everything polls with a
//! deadline ([`wait_until`]).
//!
//! The tests need root, the `ailb` binary (`AILB_BIN` or `target/debug/ailb`) and the eBPF
//! object embedded in it: `cargo xtask test` provides all three.

pub mod agent_harness;
pub mod backend;
pub mod bpfstats;
pub mod cgroup;
pub mod client;
pub mod config;
pub mod daemon;
pub mod gateway;
pub mod http;
pub mod interrupt;
pub mod nacos;
pub mod netns;
pub mod packet;
pub mod remote;
pub mod sim;
pub mod status;
pub mod vllm;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use ailb_sim::wait_until;
pub use backend::BackendServer;
pub use cgroup::{cgroup2_mount, CgroupGuard};
pub use client::{ConnResult, ConnectOpts, HeldClients, TestClient};
pub use config::{BackendCfg, TestConfig};
pub use daemon::{Daemon, Launch};
pub use gateway::GatewayProcess;
pub use sim::SimServer;

/// Path of the `ailb-testclient` binary of this package. A macro because
/// `CARGO_BIN_EXE_*` is only set when the integration tests themselves are compiled.
#[macro_export]
macro_rules! client_bin {
    () => {
        env!("CARGO_BIN_EXE_ailb-testclient")
    };
}

/// The default pin directory of the daemon (tests that use it live in one test binary).
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/ailb";
/// Where bpffs is (or gets) mounted.
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// The `ailb` binary under test: `$AILB_BIN`, else `<workspace>/target/debug/ailb`.
pub fn ailb_bin() -> PathBuf {
    let path = match std::env::var_os("AILB_BIN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/ailb"),
    };
    if !path.is_file() {
        panic!(
            "ailb binary not found at {} (set AILB_BIN or build it with the eBPF object embedded: \
             run the suite with `cargo xtask test`)",
            path.display()
        );
    }
    path
}

/// A binary of another package of this workspace (`ailb-sim`'s, `ailb-tools`'), which
/// `CARGO_BIN_EXE_*` names only for the package's own binaries: it lies in the profile directory
/// that holds this test executable (`target/debug/deps/<test>` -> `target/debug/<name>`). Panics,
/// naming the path and the command that builds it, when it is absent (`cargo xtask test` builds
/// these binaries before it runs the integration tests).
pub fn workspace_bin(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("finding this test executable: {e}"));
    let mut dir = exe.parent().unwrap_or_else(|| panic!("{} has no parent directory", exe.display())).to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.is_file() {
        panic!(
            "{name} not found at {} (build it with `cargo build -p {package} --bin {name}`; \
             `cargo xtask test` does)",
            path.display()
        );
    }
    path
}

/// Reports `test` skipped, with its reason, where the test output shows it. libtest keeps what a
/// passing test prints with `eprintln!` to itself, and its summary would say `ok`; this line
/// goes to the process's own stderr, so the log of `cargo xtask test` carries it.
pub fn report_skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}

/// The tiny model's folder (its tokenizer and chat template) that `cargo xtask setup` makes
/// under `~/.cache/ailb/models/tiny-llama`, or `AILB_TINY_MODEL_DIR`; `None` when it has no
/// `tokenizer.json`.
pub fn tiny_model_dir() -> Option<PathBuf> {
    let dir = match (std::env::var_os("AILB_TINY_MODEL_DIR"), std::env::var_os("HOME")) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(home)) => PathBuf::from(home).join(".cache/ailb/models/tiny-llama"),
        (None, None) => return None,
    };
    dir.join("tokenizer.json").exists().then_some(dir)
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Panics unless the test runs as root (loading eBPF, cgroups and bpffs all need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        panic!(
            "this privileged integration test must run as root (euid is {euid}); \
             run it through `cargo xtask test` (which uses sudo) or as root"
        );
    }
}

/// Mounts bpffs at [`BPFFS_MOUNT`] when no bpf filesystem is mounted there (a fresh machine).
pub fn ensure_bpffs() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_else(|e| panic!("reading /proc/mounts: {e}"));
    let mounted = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == BPFFS_MOUNT && f[2] == "bpf"
    });
    if mounted {
        return;
    }
    let out = run_cmd(Command::new("mount").args(["-t", "bpf", "bpf", BPFFS_MOUNT]), Duration::from_secs(10));
    if !out.status.success() {
        panic!(
            "bpffs is not mounted at {BPFFS_MOUNT} and `mount -t bpf bpf {BPFFS_MOUNT}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Everything a privileged test needs before it starts: root, the binary, bpffs.
/// Returns the `ailb` binary path.
pub fn preflight() -> PathBuf {
    require_root();
    let bin = ailb_bin();
    ensure_bpffs();
    bin
}

/// `ailb-test-<name>-<pid>`: unique per test and per run, so that concurrent or stale runs
/// never share a cgroup or a pin directory.
pub fn unique_name(name: &str) -> String {
    format!("ailb-test-{name}-{}", std::process::id())
}

/// A per-test pin directory `/sys/fs/bpf/ailb-test-<name>-<pid>`.
pub fn test_bpffs(name: &str) -> String {
    format!("{BPFFS_MOUNT}/{}", unique_name(name))
}

/// A config with the contract's defaults that pins under [`test_bpffs`] and attaches to `cg`.
pub fn base_config(name: &str, cg: &CgroupGuard) -> TestConfig {
    let cgroup = cg.path().to_str().unwrap_or_else(|| panic!("cgroup path {:?} is not UTF-8", cg.path()));
    TestConfig::new(&test_bpffs(name), cgroup)
}

/// Runs a command to completion with a deadline, capturing stdout and stderr. Panics if it
/// cannot be spawned or outlives `timeout` (it is killed by pid first).
pub fn run_cmd(cmd: &mut Command, timeout: Duration) -> Output {
    try_run_cmd(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_cmd`] that reports a timeout as `Err` (after killing the command by pid) instead of
/// panicking, for callers that must clean up first.
pub fn try_run_cmd(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {desc}: {e}"));
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = t_err.join().unwrap_or_default();
                return Err(format!(
                    "{desc} did not exit within {timeout:?}; stderr so far:\n{}",
                    String::from_utf8_lossy(&stderr)
                ));
            }
            Err(e) => panic!("waiting for {desc}: {e}"),
        }
    };
    Ok(Output { status, stdout: t_out.join().unwrap_or_default(), stderr: t_err.join().unwrap_or_default() })
}

/// How far, in percentage points, a share `p` (0..1) of `n` independent picks may fall from
/// what it should be: `slack_pp` (how far the table itself may be from the weights, 0 when
/// compared with the table's own shares) plus 4.5 standard deviations of the sampling noise,
/// `sqrt(p(1-p)/n)`. A split that is right fails this about once in 150,000 draws per share;
/// one that ignores weights of 1:2:5 misses it by far at any count a test uses.
pub fn share_tolerance_pp(p: f64, n: usize, slack_pp: f64) -> f64 {
    slack_pp + 4.5 * 100.0 * (p * (1.0 - p) / n.max(1) as f64).sqrt()
}

/// Percentage of `part` in `total`.
pub fn percent(part: usize, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}
