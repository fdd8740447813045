//! `ailb gateway`, the front door, spawned INSIDE a test's child cgroup, so that its upstream
//! connects are the ones the kernel's `connect4` steers; killed by pid on drop.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::client::spawn_in_cgroup;
use crate::{wait_until, CgroupGuard};

/// A running `ailb gateway --config F`, with its stderr in a temp file.
pub struct GatewayProcess {
    child: Child,
    log: tempfile::NamedTempFile,
    addr: SocketAddr,
}

impl GatewayProcess {
    /// Starts `bin gateway --config config` in `cg` and waits until `addr` (one of the
    /// config's `gateway.listen`) accepts connections. Panics, with the gateway's log, when it
    /// exits first or does not run inside `cg`.
    pub fn start(bin: &Path, config: &Path, cg: &CgroupGuard, addr: SocketAddr) -> Self {
        let log = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("gateway log file: {e}"));
        let stderr = log.reopen().unwrap_or_else(|e| panic!("gateway log file: {e}"));
        let mut cmd = Command::new(bin);
        cmd.args(["gateway", "--config"])
            .arg(config)
            .env("AILB_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = spawn_in_cgroup(&mut cmd, cg.path());
        let mut g = Self { child, log, addr };
        wait_until("the gateway to accept connections", Duration::from_secs(20), || {
            if let Ok(Some(status)) = g.child.try_wait() {
                panic!("ailb gateway exited with {status}:\n{}", g.log());
            }
            TcpStream::connect(addr).ok()
        });
        assert!(
            cg.procs().contains(&(g.child.id() as i32)),
            "the gateway (pid {}) must run inside the child cgroup",
            g.child.id()
        );
        g
    }

    /// The address it was started on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (its status), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Waits (10 s at most, then panics with the log) until its log holds `line`. The gateway
    /// binds its listening sockets before it sets up the rest, and logs as it does: a client can
    /// connect, and is served once the rest is in place, a moment before a line is written.
    pub fn wait_for_log(&self, line: &str) {
        let what = format!("the gateway to log {line:?}");
        ailb_sim::poll::wait_until_or(
            &what,
            Duration::from_secs(10),
            || self.log().contains(line).then_some(()),
            || self.log(),
        );
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child, which has not been waited for yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
