//! The soak's sampler, a thread that every [`PERIOD`] takes a sample: the kernel's in-flight
//! count and the open connections to the backends, how many backends are live, and the RSS and
//! open file descriptors of the daemon, the gateway and every agent from `/proc`.
//!
//! The in-flight count and the connections cannot be read at one instant, and about 27
//! connections a second open and close. So a sample is one listing of the connections (`ss
//! -tnH state established cgroup PATH`: sockets of the child cgroup whose peer is a simulator,
//! a load worker's or the gateway's upstream ones; the agents' and this tool's own probes are
//! outside the cgroup and not steered) between two reads of the kernel's counters (the pinned
//! `AILB_INFLIGHT`, every backend id the daemon has listed in this run, summed; microseconds
//! each), taken again, up to [`MAX_TRIES`] times, until both reads equal the listing's count:
//! then at the instant the listing began and at the one it ended the counters and the open
//! connections were the same. A sample that never agrees keeps its last try, and how far apart
//! it was.
//!
//! With the TC stream the listing also counts the remote clients' connections: ESTABLISHED
//! sockets in the client namespace whose peer is a TC VIP (`ss -N NETNS`), one per TC flow the
//! kernel counts (from the SYN through to the first FIN or RST it forwards).
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ailb_common::maps;
use ailb_tests::status::ailb_status;
use aya::maps::{Array, Map, MapData};
use serde::Serialize;
use serde_json::Value;

/// Time between samples.
pub const PERIOD: Duration = Duration::from_secs(2);
/// Listings tried per sample for one whose count both counter reads around it equal.
pub const MAX_TRIES: u32 = 100;

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
    /// The kernel's in-flight sum just before and just after the last listing (`None`: the
    /// counters could not be read).
    pub inflight_before: Option<u64>,
    pub inflight_after: Option<u64>,
    /// ESTABLISHED sockets from the cgroup's processes to the backends, and of the remote
    /// clients to the TC VIPs, in the last listing.
    pub open: u64,
    /// Of `open`, the remote clients' (`None`: no TC stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_tc: Option<u64>,
    /// Listings taken: the sample ended at the first whose count both reads equal, or after
    /// [`MAX_TRIES`].
    pub tries: u32,
    pub live: Option<u64>,
    /// The active tables' digests (`model=digest`, comma-separated), to tell a table the
    /// telemetry moved from one a fault changed (`None`: the status could not be read).
    pub tables: Option<String>,
    /// Each backend's in-flight count (`ailb status`, read once per sample, not with the
    /// listing): where the connections are, e.g. how many the remote clients' affinity holds on
    /// one backend.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub inflight_by_backend: BTreeMap<String, u64>,
    pub procs: Vec<ProcSample>,
}

impl Sample {
    /// Whether the connections counted lie between the two in-flight reads (the count is
    /// not atomic with either: connections open and close meanwhile).
    pub fn consistent(&self) -> Option<bool> {
        let (a, b) = (self.inflight_before?, self.inflight_after?);
        Some((a.min(b)..=a.max(b)).contains(&self.open))
    }
    /// Whether both reads equal the count: the counters agreed with the open connections.
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

/// The remote clients whose connections the listing counts too.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The client namespace's name (`ip netns`), for `ss -N`.
    pub netns: String,
    /// The TC VIPs, as `ss` prints a peer.
    pub vips: BTreeSet<String>,
}

/// The sampler thread; [`Sampler::stop`] returns its samples.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(target: Arc<Target>, t0: Instant) -> Self {
        Self::start_with(target, t0, None)
    }

    /// A sampler that also counts `remote`'s connections.
    pub fn start_with(target: Arc<Target>, t0: Instant, remote: Option<Remote>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut ids = BTreeSet::new();
            let mut next = Instant::now();
            while !s.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    next += PERIOD;
                    out.push(take_with(&target, t0, &mut ids, remote.as_ref()));
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

/// One sample now. `ids`: every backend id listed by the daemon so far in this run (a removed
/// backend's connections stay counted under its id until they close); this sample's are added.
pub fn take(t: &Target, t0: Instant, ids: &mut BTreeSet<u32>) -> Sample {
    take_with(t, t0, ids, None)
}

/// One sample now, counting `remote`'s connections too.
pub fn take_with(t: &Target, t0: Instant, ids: &mut BTreeSet<u32>, remote: Option<&Remote>) -> Sample {
    let t_s = t0.elapsed().as_secs_f64();
    let status = ailb_status(&t.ailb, &t.bpffs).ok();
    ids.extend(status.iter().flat_map(|s| backends(s).filter_map(|b| b["id"].as_u64()).map(|id| id as u32)));
    let counters = inflight_map(&t.bpffs);
    let read = || counters.as_ref().and_then(|m| ids.iter().map(|id| m.get(id, 0).ok()).sum::<Option<u64>>());
    let tc = std::cell::Cell::new(None);
    let list = || {
        let r = remote.map(remote_connections);
        tc.set(r);
        open_connections(&t.backends, &t.cgroup) + r.unwrap_or(0)
    };
    let (before, open, after, tries) = agreeing(read, list);
    let procs = t.procs.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Sample {
        t_s,
        inflight_before: before,
        inflight_after: after,
        open,
        open_tc: tc.get(),
        tries,
        live: status.as_ref().map(live_count),
        tables: status.as_ref().map(table_digests),
        inflight_by_backend: status.as_ref().map(inflight_by_backend).unwrap_or_default(),
        procs: procs.iter().filter_map(|(role, pid)| footprint(role, *pid)).collect(),
    }
}

/// Reads the counters, lists the connections and reads the counters again until both reads
/// equal the listing's count, [`MAX_TRIES`] times at most: (before, listed, after, tries) of
/// the last try.
fn agreeing(
    mut read: impl FnMut() -> Option<u64>,
    mut list: impl FnMut() -> u64,
) -> (Option<u64>, u64, Option<u64>, u32) {
    let mut tries = 0;
    loop {
        tries += 1;
        let before = read();
        let open = list();
        let after = read();
        if (before == Some(open) && after == Some(open)) || tries == MAX_TRIES {
            return (before, open, after, tries);
        }
    }
}

/// The pinned in-flight counters (`None`: not pinned, or not readable).
fn inflight_map(bpffs: &Path) -> Option<Array<MapData, u64>> {
    let md = MapData::from_pin(bpffs.join(maps::INFLIGHT)).ok()?;
    Map::from_map_data(md).ok()?.try_into().ok()
}

/// The sum of every backend's `inflight`.
pub fn inflight_sum(status: &Value) -> u64 {
    backends(status).filter_map(|b| b["inflight"].as_u64()).sum()
}

/// Every backend's `inflight`, by address.
pub fn inflight_by_backend(status: &Value) -> BTreeMap<String, u64> {
    backends(status).filter_map(|b| Some((b["address"].as_str()?.to_string(), b["inflight"].as_u64()?))).fold(
        BTreeMap::new(),
        |mut m, (a, n)| {
            *m.entry(a).or_default() += n;
            m
        },
    )
}

/// `model=digest` of every model, comma-separated.
pub fn table_digests(status: &Value) -> String {
    let models = status["models"].as_array().into_iter().flatten();
    models
        .map(|m| format!("{}={}", m["name"].as_str().unwrap_or("?"), m["table_digest"].as_str().unwrap_or("-")))
        .collect::<Vec<_>>()
        .join(",")
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

/// ESTABLISHED TCP sockets in `r`'s namespace whose peer is one of its VIPs.
pub fn remote_connections(r: &Remote) -> u64 {
    let Ok(out) = Command::new("ss").args(["-N", &r.netns, "-tnH", "state", "established"]).output() else {
        return 0;
    };
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| counts(l, &r.vips)).count() as u64
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
mod tests;
