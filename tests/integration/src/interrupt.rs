//! A long-running tool run as a child and interrupted: its stderr read line by line (to wait for
//! readiness from its own output), a signal sent to its pid, its exit awaited with a deadline,
//! and what it left behind looked for. The steps shared by the tests that check that a tool
//! tears down what it started on Ctrl-C or SIGTERM.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child whose stderr is read line by line.
pub struct Watched {
    child: Child,
    lines: Receiver<String>,
    reader: Option<JoinHandle<String>>,
}

impl Watched {
    /// Spawns `cmd` with no stdin, stdout discarded and stderr read.
    pub fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        Self { child, lines, reader: Some(reader) }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a line of its stderr contains `needle`; false after `timeout` without one.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    /// Kills it (SIGKILL to its pid only) and panics with `why` and its stderr.
    pub fn fail(mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("{why}:\n{}", self.log());
    }

    /// Sends `signal` to its pid and waits up to `timeout` for it to exit: its status and its
    /// whole stderr. Panics (after SIGKILL) if it outlives the deadline.
    pub fn interrupt(mut self, signal: libc::c_int, timeout: Duration) -> (ExitStatus, String) {
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, signal) }, 0, "kill({signal})");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return (st, self.log());
            }
            if Instant::now() >= deadline {
                self.fail(&format!("it did not exit within {timeout:?} of signal {signal}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&mut self) -> String {
        self.reader.take().map(|r| r.join().unwrap_or_default()).unwrap_or_default()
    }
}

/// The pids of `root`'s descendants now (from `/proc/*/stat`), each with its command line.
pub fn descendants(root: u32) -> Vec<(u32, String)> {
    let mut parent = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.insert(pid, ppid);
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&c, &pp) in &parent {
            if pp == p {
                out.push((c, cmdline(c).unwrap_or_default()));
                frontier.push(c);
            }
        }
    }
    out
}

/// Those of `procs` still running: the same pid with the same command line.
pub fn still_running(procs: &[(u32, String)]) -> Vec<(u32, String)> {
    procs.iter().filter(|(p, c)| cmdline(*p).as_ref() == Some(c)).cloned().collect()
}

fn cmdline(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline")).ok().map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
}

/// The pin directories and cgroups named `name` (the harness names them `ailb-test-<what>-<pid>`)
/// that exist now: what a tool left behind.
pub fn leftovers(name: impl Fn(&str) -> bool) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(crate::BPFFS_MOUNT)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| name(&e.file_name().to_string_lossy()))
        .map(|e| e.path().display().to_string())
        .collect();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for m in mounts.lines().filter(|l| l.split_whitespace().nth(2) == Some("cgroup2")) {
        if let Some(dir) = m.split_whitespace().nth(1) {
            for e in std::fs::read_dir(Path::new(dir)).into_iter().flatten().flatten() {
                if name(&e.file_name().to_string_lossy()) {
                    left.push(e.path().display().to_string());
                }
            }
        }
    }
    left
}
