//! The `ailb run` daemon as an RAII guard.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::status::{ailb_status, generation};
use crate::{run_cmd, TestConfig};

/// How long loading, pinning and attaching may take (2 slow cores, large maps).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Program names whose links are pinned under `<bpffs>/links/`.
const PROGRAMS: [&str; 4] = ["ailb_connect4", "ailb_connect6", "ailb_setsockopt", "ailb_sockops"];

/// How [`Daemon::start_with`] starts `ailb run`: under a wrapper command (e.g. `setpriv
/// --reuid=nobody ...`: the config's directory is then made readable to every user) and with
/// extra environment (e.g. `AILB_LOG=debug`).
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub wrapper: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A running `ailb run --config F`. On drop: stops it (by pid) if it still runs, runs
/// `ailb teardown --bpffs DIR` and asserts that the pin directory is gone.
pub struct Daemon {
    bin: PathBuf,
    dir: tempfile::TempDir,
    config_path: PathBuf,
    log_path: PathBuf,
    bpffs: PathBuf,
    child: Option<Child>,
    /// The last generation seen applied.
    generation: u64,
    torn_down: bool,
    launch: Launch,
    /// What `ailb teardown` runs under (empty: nothing).
    teardown_wrapper: Vec<String>,
}

impl Daemon {
    /// Writes `cfg`, spawns the daemon and waits until it has applied the config.
    /// Refuses to start over an existing pin directory (it may belong to someone else).
    pub fn start(bin: &Path, cfg: &TestConfig) -> Self {
        Self::start_with(bin, cfg, Launch::default())
    }

    /// [`Self::start`] under `launch`'s wrapper and environment.
    pub fn start_with(bin: &Path, cfg: &TestConfig, launch: Launch) -> Self {
        let bpffs = PathBuf::from(&cfg.bpffs);
        if bpffs.exists() {
            panic!(
                "pin directory {} already exists: another ailb (or a crashed test) owns it; \
                 refusing to touch it (remove it with `ailb teardown --bpffs {}` if it is stale)",
                bpffs.display(),
                bpffs.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("ailb-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temp dir: {e}"));
        let config_path = dir.path().join("ailb.toml");
        let log_path = dir.path().join("daemon.log");
        let mut d = Self {
            bin: bin.to_owned(),
            dir,
            config_path,
            log_path,
            bpffs,
            child: None,
            generation: 0,
            torn_down: false,
            launch,
            teardown_wrapper: Vec::new(),
        };
        if !d.launch.wrapper.is_empty() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("chmod 0755 {}: {e}", d.dir.path().display()));
        }
        d.write_config(&cfg.to_toml());
        d.spawn();
        d.wait_applied(None);
        d
    }

    pub fn bpffs(&self) -> &Path {
        &self.bpffs
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// `ailb status --json`; panics (with the daemon log) if it fails.
    pub fn status(&self) -> Value {
        ailb_status(&self.bin, &self.bpffs).unwrap_or_else(|e| {
            panic!("ailb status --bpffs {}: {e}\ndaemon log:\n{}", self.bpffs.display(), self.log())
        })
    }

    /// Whether the daemon process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// Polls `status` until every backend's and every model's `inflight` is exactly 0, or
    /// panics after `timeout` with the last values seen.
    pub fn wait_inflight_zero(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status();
            let backends = crate::status::inflight_by_address(&st);
            let models = crate::status::model_inflight(&st);
            let mem = crate::status::inflight_mem_by_address(&st);
            if backends.values().all(|&n| n == 0) && models.values().all(|&n| n == 0) && mem.values().all(|&n| n == 0) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "in-flight counts did not return to 0 within {timeout:?} after every connection \
                     closed: backends {backends:?}, models {models:?}, memory hints (MB) {mem:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Rewrites the config, sends SIGHUP and waits until a newer generation is applied.
    pub fn reload(&mut self, cfg: &TestConfig) {
        self.write_config(&cfg.to_toml());
        let before = self.generation;
        self.signal(libc::SIGHUP);
        self.wait_applied(Some(before));
    }

    /// Rewrites the config with arbitrary text and sends SIGHUP without waiting for anything
    /// (for invalid configs, which the daemon must reject and keep running on the old one).
    pub fn reload_raw(&mut self, text: &str) {
        self.write_config(text);
        self.signal(libc::SIGHUP);
    }

    /// SIGKILL by pid (the fail-static case: pins and links stay) and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().unwrap_or_else(|| panic!("kill9: the daemon is not running"));
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        if r != 0 {
            panic!("kill -9 {}: {}", child.id(), std::io::Error::last_os_error());
        }
        wait_child(&mut child, Duration::from_secs(10), "the killed daemon");
    }

    /// Starts a new daemon with the same config (it reopens the pins) and waits until it has
    /// applied a generation newer than the last one seen.
    pub fn restart(&mut self) {
        if self.is_running() {
            panic!("restart: the daemon is still running (pid {:?})", self.pid());
        }
        let before = self.generation;
        self.spawn();
        self.wait_applied(Some(before));
    }

    /// Runs `ailb teardown --bpffs DIR` now (stopping the daemon first if it runs) and asserts
    /// it succeeded and removed the directory. Returns its output.
    pub fn teardown(&mut self) -> Output {
        self.stop();
        self.torn_down = true;
        let out = run_cmd(self.teardown_command().arg("--bpffs").arg(&self.bpffs), Duration::from_secs(30));
        if !out.status.success() {
            panic!(
                "ailb teardown --bpffs {} failed ({}): {}\ndaemon log:\n{}",
                self.bpffs.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        if self.bpffs.exists() {
            panic!(
                "ailb teardown exited 0 but {} still exists, containing {:?}",
                self.bpffs.display(),
                list_dir(&self.bpffs)
            );
        }
        out
    }

    fn write_config(&self, text: &str) {
        // Write-then-rename so that a SIGHUP never sees a half-written file.
        let tmp = self.dir.path().join("ailb.toml.tmp");
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
        std::fs::rename(&tmp, &self.config_path)
            .unwrap_or_else(|e| panic!("renaming to {}: {e}", self.config_path.display()));
    }

    /// Runs `ailb teardown` under `wrapper` (e.g. `nsenter --net=NS --`, where the daemon ran:
    /// a clsact filter is removed through netlink, in its interface's network namespace).
    pub fn set_teardown_wrapper(&mut self, wrapper: Vec<String>) {
        self.teardown_wrapper = wrapper;
    }

    fn teardown_command(&self) -> Command {
        let mut c = wrapped(&self.teardown_wrapper, &self.bin);
        c.arg("teardown");
        c
    }

    fn command(&self) -> Command {
        wrapped(&self.launch.wrapper, &self.bin)
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log_path.display()));
        let log2 = log.try_clone().unwrap_or_else(|e| panic!("dup log fd: {e}"));
        let child = self
            .command()
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {} run: {e}", self.bin.display()));
        self.child = Some(child);
    }

    fn signal(&mut self, sig: libc::c_int) {
        if !self.is_running() {
            panic!("the daemon is not running (cannot send signal {sig}); log:\n{}", self.log());
        }
        let pid = self.pid().expect("running daemon has a pid");
        // SAFETY: kill(2) on the pid of our own, still running (unreaped) child.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            panic!("kill -{sig} {pid}: {}", std::io::Error::last_os_error());
        }
    }

    /// Polls until the daemon runs, its three links are pinned and `status` reports a
    /// generation newer than `before` (any generation >= 1 when `None`).
    fn wait_applied(&mut self, before: Option<u64>) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                panic!("the daemon exited ({st}) before applying its config; log:\n{}", self.log());
            }
            let last;
            let links_ok = PROGRAMS.iter().all(|p| self.bpffs.join("links").join(p).exists());
            match ailb_status(&self.bin, &self.bpffs) {
                Ok(v) => {
                    let g = generation(&v);
                    let newer = match before {
                        Some(b) => g > b,
                        None => g >= 1,
                    };
                    if newer && links_ok {
                        self.generation = g;
                        return;
                    }
                    last = format!("generation {g} (waiting for > {before:?}), links pinned: {links_ok}");
                }
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                panic!(
                    "the daemon did not apply its config within {READY_TIMEOUT:?}: {last}\n\
                     pins: {:?}\nlog:\n{}",
                    list_dir(&self.bpffs),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM (fail-static exit, pins stay), SIGKILL after 5 s.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            // SAFETY: kill(2) on the pid of our own, still running (unreaped) child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = child.try_wait() {
                eprintln!("the daemon ignored SIGTERM for 5 s; killing it");
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.torn_down {
            self.stop();
            return;
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log ({}) ----\n{}\n---- end of daemon log ----", self.bpffs.display(), self.log());
            self.stop();
            let _ = run_cmd(self.teardown_command().arg("--bpffs").arg(&self.bpffs), Duration::from_secs(30));
            if self.bpffs.exists() {
                eprintln!("teardown left {} behind: {:?}", self.bpffs.display(), list_dir(&self.bpffs));
            }
            return;
        }
        self.teardown();
    }
}

/// `bin` run under `wrapper` (a command and its arguments; empty: none).
fn wrapped(wrapper: &[String], bin: &Path) -> Command {
    match wrapper.split_first() {
        Some((w, args)) => {
            let mut c = Command::new(w);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

fn wait_child(child: &mut Child, timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => panic!("{what} (pid {}) did not exit within {timeout:?}", child.id()),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }
}

/// Names under `dir` (recursively, relative), for failure messages.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            if p.is_dir() && out.len() < 1000 {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}
