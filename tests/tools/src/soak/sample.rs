//! The soak's sampler, a thread that every [`PERIOD`] reads: the kernel's in-flight count
//! (`ailb status --json`, the sum of every backend's `inflight`) just before and just after
//! counting the open connections to the backends (`ss -tnH state established cgroup PATH`:
//! sockets of the child cgroup, whose peer is a simulator: a load worker's or the gateway's
//! upstream ones; the agents' and this tool's own probes are outside it and not steered), how
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
    /// The child cgroup's path below the cgroup2 mount (`/ailb-test-soak-123`), as `ss` filters.
    pub cgroup: String,
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
    let open = open_connections(&t.backends, &t.cgroup);
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

/// ESTABLISHED TCP sockets of `cgroup` whose peer is one of `backends`.
pub fn open_connections(backends: &[SocketAddrV4], cgroup: &str) -> u64 {
    let Ok(out) = Command::new("ss").args(["-tnH", "state", "established", "cgroup", cgroup]).output() else {
        return 0;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let peers: BTreeSet<String> = backends.iter().map(ToString::to_string).collect();
    text.lines().filter(|l| counts(l, &peers)).count() as u64
}

/// Whether an `ss -tnH state established` line is a connection to one of `peers` (its fields:
/// Recv-Q, Send-Q, local, peer).
fn counts(line: &str, peers: &BTreeSet<String>) -> bool {
    line.split_whitespace().nth(3).is_some_and(|p| peers.contains(p))
}

/// The path of `cg` below the cgroup2 mount, as `ss`'s `cgroup` filter takes it.
pub fn cgroup_filter(cg: &ailb_tests::CgroupGuard) -> String {
    let mount = ailb_tests::cgroup2_mount();
    format!("/{}", cg.path().strip_prefix(&mount).unwrap_or(cg.path()).display())
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
    fn a_line_counts_only_for_a_backend_peer() {
        let peers: BTreeSet<String> = ["127.0.11.1:18300".to_string()].into();
        let l = "0      0      127.0.0.1:5000  127.0.11.1:18300";
        assert!(counts(l, &peers));
        assert!(!counts(&l.replace("18300", "18301"), &peers));
        assert!(!counts("0 0 127.0.11.1:18300 127.0.0.1:5000", &peers), "the server's end");
    }
}
