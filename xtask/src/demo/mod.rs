//! `cargo xtask run --simple`: the loopback demo of the daemon's embedded default config (the
//! default `cargo xtask run` is the fleet demo, [`full`]).
//!
//! Three loopback backends, `ailb run` (no --config), a client in the child cgroup `ailb-demo`
//! that connects to the VIP, and a live table from `ailb status --json` every 2 s. Everything it
//! starts is stopped by pid, the pins are removed (`ailb teardown`) and the cgroup is removed,
//! also when a step fails (the [`Demo`] guard).

mod backends;
pub(crate) mod client;
pub(crate) mod full;
mod table;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::util::{self, say};
use crate::{build, setup};

// The embedded default config of `ailb run` (ailb-userspace/src/config/default.toml) uses
// exactly these; keep them in step.
pub(crate) const VIP: &str = "127.77.0.1:8000";
const BACKENDS: [&str; 3] = ["127.0.0.11:18001", "127.0.0.12:18002", "127.0.0.13:18003"];
/// Relative to the cgroup2 mount; the daemon creates it and attaches there (never the root).
const CGROUP: &str = "ailb-demo";
/// The default pin directory; the daemon pins one link per program under `links/`.
const BPFFS_DIR: &str = "/sys/fs/bpf/ailb";

/// Connections per second the demo client opens.
const CLIENT_RATE: u32 = 20;
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const TABLE_EVERY: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(100);

pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub(crate) fn install_stop_handler() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_stop_signal as extern "C" fn(libc::c_int);
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let prev = unsafe { libc::signal(sig, handler as libc::sighandler_t) };
        if prev == libc::SIG_ERR {
            return Err(io::Error::last_os_error()).context("installing the SIGINT/SIGTERM handler");
        }
    }
    Ok(())
}

pub(crate) fn run(duration: Option<u64>, daemon_args: &[OsString]) -> Result<()> {
    if !util::is_root() {
        bail!("cargo xtask run needs root: it loads eBPF programs and creates a cgroup; run with sudo");
    }
    setup::setup()?;
    build::build(true)?;

    let ailb = util::ailb_bin("release");
    let mount = util::cgroup2_mount()?;
    let cgroup = mount.join(CGROUP);
    install_stop_handler()?;

    backends::start(&BACKENDS)?;
    say!("backends listening: {}", BACKENDS.join(", "));

    // Pins left by an earlier run make `ailb status` succeed before the new daemon has applied
    // its config: then wait for a newer generation.
    let stale_generation = table::status(&ailb).ok().and_then(|v| v["generation"].as_u64());
    if let Some(g) = stale_generation {
        say!("pins from an earlier run found (generation {g}); the daemon will reopen them");
    }

    let log_path = util::target_dir().join("ailb-demo.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut demo = Demo { ailb, mount, cgroup, daemon: None, client: None, log_path };

    demo.start_daemon(daemon_args, log, stale_generation)?;
    demo.start_client()?;
    match duration {
        Some(d) => say!("running for {d} s (Ctrl-C stops earlier)"),
        None => say!("running until Ctrl-C"),
    }
    demo.watch(duration)?;
    drop(demo); // stop the children, teardown, remove the cgroup
    Ok(())
}

/// Polls until `ailb status --json` answers (with a generation newer than a stale one) and the
/// three program links are pinned: the maps are written before the programs are attached, so a
/// status answer alone does not mean connections are balanced yet.
fn wait_ready(ailb: &Path, daemon: &mut Guarded, stale: Option<u64>) -> Result<serde_json::Value> {
    let links = Path::new(BPFFS_DIR).join("links");
    let attached = || ailb_common::abi::programs::ALL.iter().all(|p| links.join(p).exists());
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(st) = daemon.try_wait()? {
            bail!("`ailb run` exited during start-up ({st})");
        }
        let last = match table::status(ailb) {
            Ok(_) if !attached() => format!("programs not attached yet (no links in {})", links.display()),
            Ok(v) => match (stale, v["generation"].as_u64()) {
                (None, _) => return Ok(v),
                (Some(old), Some(g)) if g > old => return Ok(v),
                (Some(old), g) => format!("generation {g:?}, waiting for one above {old}"),
            },
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() >= deadline {
            bail!("ailb did not become ready within {READY_TIMEOUT:?}: {last}");
        }
        if STOP.load(Ordering::SeqCst) {
            bail!("interrupted while waiting for ailb");
        }
        std::thread::sleep(POLL);
    }
}

/// A child process stopped by pid (SIGTERM, then SIGKILL) when dropped.
struct Guarded {
    name: &'static str,
    child: Option<Child>,
}

impl Guarded {
    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(c) => c.try_wait().with_context(|| format!("waiting for {}", self.name)),
            None => Ok(None),
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // The child is not reaped yet, so its pid cannot have been reused.
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of our own unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                say!("stopped {} (pid {pid})", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        say!("{} (pid {pid}) ignored SIGTERM; killing it", self.name);
        if let Err(e) = child.kill().and_then(|()| child.wait().map(drop)) {
            say!("killing {} (pid {pid}): {e}", self.name);
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Everything the demo set up; dropping it undoes it in order.
struct Demo {
    ailb: PathBuf,
    mount: PathBuf,
    cgroup: PathBuf,
    daemon: Option<Guarded>,
    client: Option<Guarded>,
    log_path: PathBuf,
}

impl Demo {
    /// Starts `ailb run` with `daemon_args`, its output to `log`, and waits until it is ready
    /// (with a generation above `stale`, pins from an earlier run); prints its first table.
    fn start_daemon(&mut self, daemon_args: &[OsString], log: std::fs::File, stale: Option<u64>) -> Result<()> {
        let daemon = Command::new(&self.ailb)
            .arg("run")
            .args(daemon_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log file handle")?)
            .stderr(log)
            // Own process group: a terminal Ctrl-C reaches only xtask, which stops things in order.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {} run", self.ailb.display()))?;
        say!("started `ailb run` (pid {}), log: {}", daemon.id(), self.log_path.display());
        let daemon = self.daemon.insert(Guarded { name: "ailb run", child: Some(daemon) });

        let status = wait_ready(&self.ailb, daemon, stale).map_err(|e| self.with_log_tail(e))?;
        say!("ailb is ready (generation {})", status["generation"]);
        print!("{}", table::render(&status, 0));
        Ok(())
    }

    /// Starts the demo client in the cgroup ([`Self::spawn_client`]) and keeps it guarded.
    fn start_client(&mut self) -> Result<()> {
        let client = self.spawn_client()?;
        say!(
            "client (pid {}) in cgroup {}: {CLIENT_RATE} connections/s to {VIP}, half of them tagged conv-N",
            client.id(),
            self.cgroup.display()
        );
        self.client = Some(Guarded { name: "demo client", child: Some(client) });
        Ok(())
    }

    /// Until a stop signal or `duration` (seconds): a table every [`TABLE_EVERY`], and an error
    /// (with the daemon's log tail) if the daemon or the client exits; then the last table.
    fn watch(&mut self, duration: Option<u64>) -> Result<()> {
        let started = Instant::now();
        let mut next_table = started + TABLE_EVERY;
        loop {
            if STOP.load(Ordering::SeqCst) {
                say!("stopping (signal)");
                break;
            }
            if duration.is_some_and(|d| started.elapsed() >= Duration::from_secs(d)) {
                say!("stopping: --duration reached");
                break;
            }
            let mut exited = None;
            for guard in [&mut self.daemon, &mut self.client].into_iter().flatten() {
                if let Some(st) = guard.try_wait()? {
                    exited = Some(anyhow::anyhow!("{} exited unexpectedly ({st})", guard.name));
                }
            }
            if let Some(e) = exited {
                return Err(self.with_log_tail(e));
            }
            if Instant::now() >= next_table {
                next_table += TABLE_EVERY;
                match table::status(&self.ailb) {
                    Ok(v) => print!("{}", table::render(&v, started.elapsed().as_secs())),
                    Err(e) => say!("status: {e:#}"),
                }
            }
            std::thread::sleep(POLL);
        }
        if let Ok(v) = table::status(&self.ailb) {
            print!("{}", table::render(&v, started.elapsed().as_secs()));
        }
        Ok(())
    }

    /// Starts the load generator (this binary, `demo-client`) inside the demo cgroup: the child
    /// writes its own pid to `cgroup.procs` between fork and exec, so it never connects from
    /// outside the cgroup.
    fn spawn_client(&self) -> Result<Child> {
        if !self.cgroup.is_dir() {
            bail!("ailb is ready but the cgroup {} does not exist", self.cgroup.display());
        }
        let procs_path = self.cgroup.join("cgroup.procs");
        let procs = OpenOptions::new()
            .write(true)
            .open(&procs_path)
            .with_context(|| format!("opening {}", procs_path.display()))?;
        let fd = procs.as_raw_fd();
        let exe = std::env::current_exe().context("finding the xtask binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["demo-client", "--vip", VIP, "--rate"])
            .arg(CLIENT_RATE.to_string())
            .stdin(Stdio::null())
            .process_group(0);
        // SAFETY: the hook runs between fork and exec and only calls getpid and write (both
        // async-signal-safe) on a stack buffer; `procs` outlives the spawn below.
        unsafe { cmd.pre_exec(move || join_cgroup(fd)) };
        let child = cmd.spawn().context("starting the demo client in the cgroup")?;
        drop(procs);

        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap_or_default();
        let want = format!("0::/{CGROUP}");
        if !own.lines().any(|l| l == want) {
            // Stop it before anything else: it must not run outside the cgroup.
            drop(Guarded { name: "demo client", child: Some(child) });
            bail!("the demo client is not in {CGROUP} (its /proc/PID/cgroup: {})", own.trim());
        }
        Ok(child)
    }

    fn with_log_tail(&self, e: anyhow::Error) -> anyhow::Error {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        anyhow::anyhow!("{e:#}\n--- last lines of {} ---\n{tail}", self.log_path.display())
    }

    fn remove_cgroup(&self) {
        if self.cgroup == self.mount || !self.cgroup.starts_with(&self.mount) || !self.cgroup.is_dir() {
            return;
        }
        // The kernel can take a moment to empty the cgroup after its last process is reaped.
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match std::fs::remove_dir(&self.cgroup) {
                Ok(()) => {
                    say!("removed cgroup {}", self.cgroup.display());
                    return;
                }
                Err(e) if Instant::now() >= deadline => {
                    let procs = std::fs::read_to_string(self.cgroup.join("cgroup.procs")).unwrap_or_default();
                    say!(
                        "could not remove cgroup {}: {e} (processes still in it: {})",
                        self.cgroup.display(),
                        procs.split_whitespace().collect::<Vec<_>>().join(" ")
                    );
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(c) = &mut self.client {
            c.stop();
        }
        if let Some(d) = &mut self.daemon {
            d.stop();
            match Command::new(&self.ailb).arg("teardown").stdin(Stdio::null()).status() {
                Ok(st) if st.success() => say!("ailb teardown: done"),
                Ok(st) => say!("ailb teardown failed ({st})"),
                Err(e) => say!("ailb teardown could not run: {e}"),
            }
        }
        self.remove_cgroup();
    }
}

/// Between fork and exec: write our pid to the pre-opened `cgroup.procs`.
fn join_cgroup(fd: RawFd) -> io::Result<()> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut buf = [0u8; 10];
    let digits = decimal(pid, &mut buf);
    // SAFETY: `digits` is a valid buffer of `digits.len()` bytes; `fd` is open (closed on exec).
    let n = unsafe { libc::write(fd, digits.as_ptr().cast(), digits.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `n` in decimal, in `buf` (no allocation: this runs between fork and exec).
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests;
