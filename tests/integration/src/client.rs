//! Spawning `ailb-testclient` (optionally inside the child cgroup) and reading its results.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::CgroupGuard;

/// One connection as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnResult {
    pub i: usize,
    pub conversation: Option<String>,
    /// Peer address after connect (the backend the kernel sent the connection to).
    pub backend: Option<String>,
    /// The body the server replied with (its own address).
    pub reply: Option<String>,
    pub ok: bool,
    /// connect() errno when it failed.
    pub errno: Option<i32>,
    pub error: Option<String>,
}

impl ConnResult {
    fn from_json(v: &Value) -> Self {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Self {
            i: v["i"].as_u64().unwrap_or_else(|| panic!("client line without i: {v}")) as usize,
            conversation: s("conversation"),
            backend: s("backend"),
            reply: s("reply"),
            ok: v["ok"].as_bool().unwrap_or(false),
            errno: v.get("errno").and_then(Value::as_i64).map(|e| e as i32),
            error: s("error"),
        }
    }
}

/// Options of `ailb-testclient connect`.
#[derive(Clone, Debug)]
pub struct ConnectOpts {
    pub vip: String,
    pub count: usize,
    /// Connection i is tagged with conversation `<prefix>-<i % conversations>`.
    pub conversations: Option<usize>,
    pub prefix: String,
    pub memory_mb: Option<u32>,
    pub model: Option<String>,
    /// Close with SO_LINGER 0 (an RST instead of a FIN).
    pub linger0: bool,
    /// An IPv6 VIP's socket is `IPV6_V6ONLY` (it cannot reach an IPv4 backend).
    pub v6only: bool,
    /// Deadline for the whole run (or, with hold, until `HOLDING`).
    pub timeout: Duration,
    /// Connection i sends the prefix keys of a prompt of tenant `i % tenants` (`--tenants`),
    /// whose system prompt has this many bytes.
    pub tenants: Option<(usize, usize)>,
}

impl ConnectOpts {
    pub fn new(vip: &str, count: usize) -> Self {
        Self {
            vip: vip.to_owned(),
            count,
            conversations: None,
            prefix: "conv".into(),
            memory_mb: None,
            model: None,
            linger0: false,
            v6only: false,
            timeout: Duration::from_secs(120),
            tenants: None,
        }
    }

    pub fn conversations(mut self, n: usize, prefix: &str) -> Self {
        self.conversations = Some(n);
        self.prefix = prefix.to_owned();
        self
    }

    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = Some(mb);
        self
    }

    pub fn linger0(mut self) -> Self {
        self.linger0 = true;
        self
    }

    pub fn v6only(mut self) -> Self {
        self.v6only = true;
        self
    }

    /// Connection i carries the prefix keys of tenant `i % tenants`'s prompt.
    pub fn tenants(mut self, tenants: usize, prompt_bytes: usize) -> Self {
        self.tenants = Some((tenants, prompt_bytes));
        self
    }

    fn args(&self, hold: bool) -> Vec<String> {
        let mut a = vec!["connect".into(), "--vip".into(), self.vip.clone(), "--count".into(), self.count.to_string()];
        if let Some(c) = self.conversations {
            a.extend(["--conversations".into(), c.to_string(), "--prefix".into(), self.prefix.clone()]);
        }
        if let Some(m) = self.memory_mb {
            a.extend(["--memory-mb".into(), m.to_string()]);
        }
        if let Some(m) = &self.model {
            a.extend(["--model".into(), m.clone()]);
        }
        if hold {
            a.push("--hold".into());
        }
        if self.linger0 {
            a.push("--linger0".into());
        }
        if self.v6only {
            a.push("--v6only".into());
        }
        if let Some((t, b)) = self.tenants {
            a.extend(["--tenants".into(), t.to_string(), "--prompt-bytes".into(), b.to_string()]);
        }
        a
    }
}

/// The client binary and how to spawn it.
pub struct TestClient {
    bin: PathBuf,
    /// A command the client runs under (e.g. `nsenter --net=NS --`); empty: none.
    wrapper: Vec<String>,
}

impl TestClient {
    /// `bin` is `ailb_tests::client_bin!()` in an integration test.
    pub fn new(bin: &str) -> Self {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            panic!("ailb-testclient binary not found at {}", bin.display());
        }
        Self { bin, wrapper: Vec::new() }
    }

    /// Runs the client under `wrapper` (a command and its arguments, the client's command
    /// line appended), e.g. `nsenter --net=/run/netns/NAME --` to connect from a namespace.
    pub fn wrapped(mut self, wrapper: Vec<String>) -> Self {
        self.wrapper = wrapper;
        self
    }

    fn command(&self) -> Command {
        match self.wrapper.split_first() {
            Some((w, args)) => {
                let mut c = Command::new(w);
                c.args(args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        }
    }

    /// Runs `connect` to completion and returns one result per connection, in order.
    /// Panics if a successful connection's peer address and the server's reply disagree.
    pub fn connect(&self, cgroup: Option<&CgroupGuard>, opts: &ConnectOpts) -> Vec<ConnResult> {
        let mut cmd = self.command();
        cmd.args(opts.args(false));
        let mut proc = ClientProcess::spawn(cmd, cgroup.map(CgroupGuard::path), false);
        let lines = proc.read_until_exit(opts.timeout);
        let results = parse_results(&lines, opts.count);
        check_consistent(&results);
        results
    }

    /// Runs `connect --hold`: returns once every connection was tried and the open ones are
    /// held; [`HeldClients::release`] closes them.
    pub fn hold(&self, cgroup: Option<&CgroupGuard>, opts: &ConnectOpts) -> HeldClients {
        let mut cmd = self.command();
        cmd.args(opts.args(true));
        let mut proc = ClientProcess::spawn(cmd, cgroup.map(CgroupGuard::path), true);
        let mut lines = Vec::new();
        let deadline = Instant::now() + opts.timeout;
        loop {
            let line = proc.next_line(deadline).unwrap_or_else(|| {
                panic!(
                    "ailb-testclient --hold exited or timed out before HOLDING ({} lines so far); stderr: {}",
                    lines.len(),
                    proc.stderr()
                )
            });
            if line.starts_with("HOLDING") {
                break;
            }
            lines.push(line);
        }
        let results = parse_results(&lines, opts.count);
        check_consistent(&results);
        HeldClients { proc, results }
    }

    /// Runs `sockopt-hostile` and returns its lines keyed by `case`.
    pub fn hostile(&self, cgroup: Option<&CgroupGuard>, vip: &str) -> BTreeMap<String, Value> {
        let mut cmd = self.command();
        cmd.args(["sockopt-hostile", "--vip", vip]);
        let mut proc = ClientProcess::spawn(cmd, cgroup.map(CgroupGuard::path), false);
        let lines = proc.read_until_exit(Duration::from_secs(30));
        lines
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("client line {l:?}: {e}"));
                (v["case"].as_str().unwrap_or_else(|| panic!("line without case: {l}")).to_owned(), v)
            })
            .collect()
    }
}

/// A `probe` client kept running: each [`Prober::pick`] is one tagged connection, closed once
/// connected, and the backend the kernel gave it.
pub struct Prober {
    proc: ClientProcess,
}

/// One probe's tags (each optional, as the front door sets them).
#[derive(Debug, Clone, Default)]
pub struct ProbeTags {
    pub model: Option<String>,
    pub conversation: Option<String>,
    pub memory_mb: Option<u32>,
    pub keys: Vec<u64>,
}

impl Prober {
    /// The backend a connection to the VIP with `tags` got, or the error.
    pub fn pick(&mut self, tags: &ProbeTags) -> Result<String, String> {
        let line = serde_json::json!({"model": tags.model, "conversation": tags.conversation,
                                      "memory_mb": tags.memory_mb, "keys": tags.keys})
        .to_string();
        let stdin = self.proc.stdin.as_mut().expect("the prober's stdin");
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).unwrap_or_else(|e| panic!("probe stdin: {e}"));
        let out = self
            .proc
            .next_line(Instant::now() + Duration::from_secs(10))
            .unwrap_or_else(|| panic!("the prober gave no answer to {line}; stderr: {}", self.proc.stderr()));
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("probe line {out:?}: {e}"));
        match (v["backend"].as_str(), v["error"].as_str()) {
            (Some(b), None) => Ok(b.to_string()),
            (_, Some(e)) => Err(e.to_string()),
            (None, None) => Err(format!("connect failed: errno {}", v["errno"])),
        }
    }
}

impl TestClient {
    /// Starts a `probe` client for `vip` (in `cgroup`).
    pub fn prober(&self, cgroup: Option<&CgroupGuard>, vip: &str) -> Prober {
        let mut cmd = self.command();
        cmd.args(["probe", "--vip", vip]);
        Prober { proc: ClientProcess::spawn(cmd, cgroup.map(CgroupGuard::path), true) }
    }
}

/// Connections held open by a `--hold` client.
pub struct HeldClients {
    proc: ClientProcess,
    results: Vec<ConnResult>,
}

impl HeldClients {
    pub fn results(&self) -> &[ConnResult] {
        &self.results
    }

    /// Asks the client to close every connection and waits (bounded) for it to exit.
    pub fn release(mut self) {
        if let Some(mut stdin) = self.proc.stdin.take() {
            let _ = stdin.write_all(b"close\n");
        }
        let _ = self.proc.read_until_exit(Duration::from_secs(30));
    }
}

/// A spawned client; killed by pid on drop if it is still running.
struct ClientProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    desc: String,
}

impl ClientProcess {
    fn spawn(mut cmd: Command, cgroup: Option<&Path>, keep_stdin: bool) -> Self {
        let desc = format!("{cmd:?}");
        cmd.stdin(if keep_stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cgroup {
            Some(cg) => spawn_in_cgroup(&mut cmd, cg),
            None => cmd.spawn().unwrap_or_else(|e| panic!("spawning {desc}: {e}")),
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Self { stdin: child.stdin.take(), child, lines: rx, stderr: Some(stderr), desc }
    }

    /// The next stdout line, or `None` at EOF or the deadline.
    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(left).ok()
    }

    /// Collects every remaining stdout line until the process exits successfully.
    fn read_until_exit(&mut self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut lines = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => lines.push(l),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{} did not finish within {timeout:?} ({} lines read)", self.desc, lines.len())
                }
            }
        }
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => panic!("{} closed stdout but did not exit within {timeout:?}", self.desc),
                Err(e) => panic!("waiting for {}: {e}", self.desc),
            }
        };
        if !status.success() {
            let stderr = self.stderr();
            panic!("{} failed ({status}); stderr:\n{stderr}", self.desc);
        }
        lines
    }

    fn stderr(&mut self) -> String {
        match self.stderr.take() {
            Some(t) if t.is_finished() => t.join().unwrap_or_default(),
            Some(t) => {
                self.stderr = Some(t);
                "(still running)".into()
            }
            None => String::new(),
        }
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill(); // SIGKILL to this child's pid only
            let _ = self.child.wait();
        }
    }
}

/// Spawns `cmd` with the child moving itself into `cgroup` between fork and exec, so that
/// its very first socket is already under the attached programs.
pub fn spawn_in_cgroup(cmd: &mut Command, cgroup: &Path) -> Child {
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(cgroup.join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("opening {}/cgroup.procs: {e}", cgroup.display()));
    let fd = procs.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe getpid() and write(2) on a stack buffer and an fd that stays open
    // (owned by `procs`, alive until spawn returns; close-on-exec, so not leaked).
    unsafe {
        cmd.pre_exec(move || {
            let mut buf = [0u8; 20];
            let n = format_pid(libc::getpid() as u32, &mut buf);
            let start = buf.len() - n;
            if libc::write(fd, buf[start..].as_ptr().cast(), n) != n as isize {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {cmd:?} in cgroup {}: {e}", cgroup.display()));
    drop(procs);
    child
}

/// Writes `pid` in decimal at the end of `buf`, returns the number of digits (no allocation:
/// it runs between fork and exec).
pub fn format_pid(mut pid: u32, buf: &mut [u8; 20]) -> usize {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    buf.len() - i
}

fn parse_results(lines: &[String], count: usize) -> Vec<ConnResult> {
    let results: Vec<ConnResult> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| ConnResult::from_json(&serde_json::from_str(l).unwrap_or_else(|e| panic!("client line {l:?}: {e}"))))
        .collect();
    if results.len() != count {
        panic!("ailb-testclient printed {} results, expected {count}", results.len());
    }
    results
}

/// The kernel's routing decision (peer address) and the server that answered must agree.
fn check_consistent(results: &[ConnResult]) {
    for r in results.iter().filter(|r| r.ok) {
        if r.backend != r.reply {
            panic!("connection {}: peer address {:?} but the server that replied is {:?}", r.i, r.backend, r.reply);
        }
    }
}

/// Connections per backend address (successful ones only).
pub fn count_by_backend(results: &[ConnResult]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in results.iter().filter(|r| r.ok) {
        *m.entry(r.backend.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    m
}

/// Backends each conversation reached (successful connections only).
pub fn backends_by_conversation(results: &[ConnResult]) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.ok) {
        if let (Some(c), Some(b)) = (&r.conversation, &r.backend) {
            m.entry(c.clone()).or_default().insert(b.clone());
        }
    }
    m
}

/// The one backend each conversation reached; panics unless every connection succeeded and
/// every conversation stayed on one backend (`phase` names the run in the message).
pub fn one_backend_per_conversation(results: &[ConnResult], phase: &str) -> BTreeMap<String, String> {
    assert_all_ok(results, phase);
    backends_by_conversation(results)
        .into_iter()
        .map(|(c, set)| {
            assert_eq!(set.len(), 1, "{phase}: conversation {c} reached several backends: {set:?}");
            (c, set.into_iter().next().expect("one"))
        })
        .collect()
}

/// Panics unless every connection succeeded (with the first few failures in the message).
pub fn assert_all_ok(results: &[ConnResult], what: &str) {
    let failed: Vec<&ConnResult> = results.iter().filter(|r| !r.ok).collect();
    if !failed.is_empty() {
        panic!(
            "{what}: {} of {} connections failed; first failures: {:?}",
            failed.len(),
            results.len(),
            &failed[..failed.len().min(5)]
        );
    }
}

#[cfg(test)]
mod tests;
