//! The bench's sandbox and process helpers: a network namespace, commands run in it (or in the
//! bench's cgroup), children stopped by pid.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::CgroupGuard;

/// A network namespace with `lo` up, deleted on drop.
pub(super) struct Netns {
    pub(super) name: String,
}

impl Netns {
    pub(super) fn new() -> Self {
        let name = format!("ailb-bench-{}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]), "ip netns add");
        let ns = Self { name };
        run(Command::new("ip").args(["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"]), "lo up");
        ns
    }

    /// `ip netns exec NS program args...`.
    pub(super) fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]).args(args);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Runs `cmd` to completion, inside `cgroup` when given (moved in between fork and exec).
pub(crate) fn output_in(mut cmd: Command, cgroup: Option<&CgroupGuard>) -> std::process::Output {
    let Some(cg) = cgroup else {
        return cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = spawn_in_cgroup(&mut cmd, cg.path());
    child.wait_with_output().unwrap_or_else(|e| panic!("waiting for {cmd:?}: {e}"))
}

/// A child process killed (by its pid) on drop.
pub(super) struct Proc(pub(super) Child);

impl Drop for Proc {
    /// SIGTERM first, so that a master process (nginx) stops its own workers; SIGKILL only if
    /// it is still there after 5 s. Both by the child's pid.
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child, not reaped yet.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion and returns its stdout; panics, naming `what`, when it fails.
pub(super) fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what}: {cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls until a TCP connect to `addr` succeeds from inside the namespace (deadline 10 s).
pub(super) fn wait_listening(ns: &Netns, addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (host, port) = addr.split_once(':').expect("addr");
    while Instant::now() < deadline {
        let ok = Command::new("ip")
            .args(["netns", "exec", &ns.name, "bash", "-c", &format!("exec 3<>/dev/tcp/{host}/{port}")])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {addr} in {} after 10 s", ns.name);
}

/// A kernel config value from /proc/config.gz (`None`: not set or unknown).
pub(super) fn kernel_config(key: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}
