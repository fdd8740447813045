//! The soak's sampler, a thread that every [`PERIOD`] reads: the kernel's in-flight count
//! (`ailb status --json`, the sum of every backend's `inflight`) just before and just after
//! counting the open connections to the backends (`ss -tnpH state established`: sockets whose
//! peer is a simulator and whose owner is a process inside the child cgroup: a load worker or
//! the gateway; the agents' and this tool's own probes are outside it and not steered), how
//! many backends are live, and the RSS and open file descriptors of the daemon, the gateway
//! and every agent from `/proc`.

use std::collections::BTreeSet;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ailb_tests::status::ailb_status;
use serde::Serialize;
use serde_json::Value;

/// Time between samples.
pub const PERIOD: Duration = Duration::from_secs(2);

/// One process's footprint.
#[derive(Debug, Clone, Serialize)]
pub struct ProcSample {
    pub role: String,
    pub rss_kb: u64,
    pub fds: u64,
}

/// One sample.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t_s: f64,
    /// The kernel's in-flight sum before and after the connections were counted (`None`: the
    /// status could not be read).
    pub inflight_before: Option<u64>,
    pub inflight_after: Option<u64>,
    /// ESTABLISHED sockets from the cgroup's processes to the backends.
    pub open: u64,
    pub live: Option<u64>,
    pub procs: Vec<ProcSample>,
}

impl Sample {
    /// Whether the connections counted lie between the two in-flight reads (the count is
    /// not atomic with either: connections open and close meanwhile).
    pub fn consistent(&self) -> Option<bool> {
        let (a, b) = (self.inflight_before?, self.inflight_after?);
        Some((a.min(b)..=a.max(b)).contains(&self.open))
    }
    /// Whether both reads equal the count.
    pub fn equal(&self) -> Option<bool> {
        Some(self.inflight_before? == self.open && self.inflight_after? == self.open)
    }
}

/// What the sampler reads from, shared with the main thread (the pids change as processes
/// are killed and restarted).
pub struct Target {
    pub ailb: PathBuf,
    pub bpffs: PathBuf,
    pub backends: Vec<SocketAddrV4>,
    /// (role, pid) of the processes whose footprint is sampled.
    pub procs: Mutex<Vec<(String, u32)>>,
    /// Pids of the processes inside the cgroup that connect to the backends.
    pub clients: Mutex<Vec<u32>>,
}

/// The sampler thread; [`Sampler::stop`] returns its samples.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(target: Arc<Target>, t0: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    next += PERIOD;
                    out.push(take(&target, t0));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            out
        });
        Sampler { stop, thread }
    }

    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// One sample now.
pub fn take(t: &Target, t0: Instant) -> Sample {
    let t_s = t0.elapsed().as_secs_f64();
    let before = ailb_status(&t.ailb, &t.bpffs).ok();
    let clients: BTreeSet<u32> = t.clients.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
    let open = open_connections(&t.backends, &clients);
    let after = ailb_status(&t.ailb, &t.bpffs).ok();
    let procs = t.procs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Sample {
        t_s,
        inflight_before: before.as_ref().map(inflight_sum),
        inflight_after: after.as_ref().map(inflight_sum),
        open,
        live: after.as_ref().map(live_count),
        procs: procs.iter().filter_map(|(role, pid)| footprint(role, *pid)).collect(),
    }
}

/// The sum of every backend's `inflight`.
pub fn inflight_sum(status: &Value) -> u64 {
    backends(status).filter_map(|b| b["inflight"].as_u64()).sum()
}

fn live_count(status: &Value) -> u64 {
    backends(status).filter(|b| b["live"].as_bool() == Some(true)).count() as u64
}

fn backends(status: &Value) -> impl Iterator<Item = &Value> {
    status["models"].as_array().into_iter().flatten().flat_map(|m| m["backends"].as_array().into_iter().flatten())
}

/// ESTABLISHED TCP sockets whose peer is one of `backends` and whose owner is in `pids`.
pub fn open_connections(backends: &[SocketAddrV4], pids: &BTreeSet<u32>) -> u64 {
    let Ok(out) = Command::new("ss").args(["-tnpH", "state", "established"]).output() else {
        return 0;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let peers: BTreeSet<String> = backends.iter().map(ToString::to_string).collect();
    text.lines().filter(|l| counts(l, &peers, pids)).count() as u64
}

/// Whether an `ss -tnpH state established` line is a connection of `pids` to one of `peers`
/// (its fields: Recv-Q, Send-Q, local, peer, process).
fn counts(line: &str, peers: &BTreeSet<String>, pids: &BTreeSet<u32>) -> bool {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 5 || !peers.contains(f[3]) {
        return false;
    }
    f[4].split("pid=")
        .skip(1)
        .filter_map(|p| p.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .any(|pid: u32| pids.contains(&pid))
}

/// RSS (kB, `VmRSS`) and open fds of `pid`, `None` when it is gone.
fn footprint(role: &str, pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcSample { role: role.to_string(), rss_kb, fds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_counts_only_for_a_backend_peer_and_a_client_pid() {
        let peers: BTreeSet<String> = ["127.0.11.1:18300".to_string()].into();
        let pids: BTreeSet<u32> = [42].into();
        let l = "0      0      127.0.0.1:5000  127.0.11.1:18300 users:((\"ailb-soak\",pid=42,fd=7))";
        assert!(counts(l, &peers, &pids));
        assert!(!counts(&l.replace("pid=42", "pid=43"), &peers, &pids));
        assert!(!counts(&l.replace("18300 ", "18301 "), &peers, &pids));
        let shared = "0 0 127.0.0.1:5000 127.0.11.1:18300 users:((\"a\",pid=7,fd=1),(\"b\",pid=42,fd=3))";
        assert!(counts(shared, &peers, &pids));
    }
}
