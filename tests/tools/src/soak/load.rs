//! The soak's load: the Mooncake trace, looped for as long as the run lasts, its conversations
//! split between the entry points by a hash of their id (workers are re-execs of `ailb-soak`):
//! the socket ABI (tagged connects to the VIP) and the front door (plain HTTP to `ailb
//! gateway`, the conversation as `X-Session-ID`), one worker each inside the child cgroup; and,
//! with the TC stream ([`Split::tc_lanes`] > 0), remote clients: plain HTTP from the client
//! namespace to a TC VIP, outside the cgroup, one worker per lane (a client address of its
//! own), the TC conversations split between the lanes by the same hash. Each loop's
//! conversations get ids of their own (`<loop>-<id>`), so that a conversation's turns are
//! those of one pass through the trace.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ailb_sim::replay::{self, trace, RequestSpec, RunOpts, TraceSelect};
use anyhow::Context;
use serde_json::{json, Value};

use super::fleet::MODEL;
use ailb_sim::BLOCK_TOKENS;

/// An entry point of the soak's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    Abi,
    FrontDoor,
    /// Remote clients through the TC datapath.
    Tc,
}

impl Entry {
    pub fn key(self) -> &'static str {
        match self {
            Self::Abi => "abi",
            Self::FrontDoor => "front-door",
            Self::Tc => "tc",
        }
    }
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "abi" => Ok(Self::Abi),
            "front-door" => Ok(Self::FrontDoor),
            "tc" => Ok(Self::Tc),
            other => anyhow::bail!("unknown entry point {other:?} (abi, front-door, tc)"),
        }
    }
    pub fn title(self) -> &'static str {
        match self {
            Self::Abi => "socket ABI",
            Self::FrontDoor => "front door",
            Self::Tc => "TC (remote clients)",
        }
    }
}

/// How the conversations are split between the entry points: the socket ABI and the front
/// door alone (`tc_lanes` 0), or a third each with the TC stream's share split again between
/// `tc_lanes` client addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Split {
    pub tc_lanes: usize,
    /// The most KV blocks (prompt plus output, [`BLOCK_TOKENS`] each) a TC request may need: the
    /// smallest GPU's pool. The TC path sees no request, only its SYN, so it cannot keep a long
    /// context off a GPU that cannot hold it; the TC share's longer requests are not sent
    /// (0: no limit).
    pub tc_max_blocks: u64,
}

impl Split {
    /// The entry points that get conversations.
    pub fn entries(self) -> Vec<Entry> {
        if self.tc_lanes == 0 {
            vec![Entry::Abi, Entry::FrontDoor]
        } else {
            vec![Entry::Abi, Entry::FrontDoor, Entry::Tc]
        }
    }

    /// Whether a request of `entry` is sent: all but the TC share's that need more than
    /// [`Split::tc_max_blocks`].
    pub fn sends(self, entry: Entry, s: &RequestSpec) -> bool {
        entry != Entry::Tc || self.tc_max_blocks == 0 || blocks(s) <= self.tc_max_blocks
    }

    /// The entry point of a conversation, and its lane (0 but for the TC stream).
    pub fn of(self, conversation: &str) -> (Entry, usize) {
        let h = fnv(conversation);
        let entries = self.entries();
        let entry = entries[(h % entries.len() as u64) as usize];
        let lane = if entry == Entry::Tc { ((h / 3) % self.tc_lanes as u64) as usize } else { 0 };
        (entry, lane)
    }
}

/// What one worker does.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    pub entry: Entry,
    /// The VIP (socket ABI) or the gateway's address (front door).
    pub target: SocketAddrV4,
    /// Trace seconds per real second (`load x time scale`).
    pub speed: f64,
    /// Real seconds of arrivals.
    pub duration_s: f64,
    /// Client threads (requests in flight at most).
    pub concurrency: usize,
    /// One request's limit, seconds.
    pub timeout_s: f64,
    /// Its JSON report.
    pub out: PathBuf,
}

/// A whole number hash of a conversation id (FNV-1a), which picks its entry point.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The KV blocks a request holds while it runs (as the simulator counts them).
pub fn blocks(s: &RequestSpec) -> u64 {
    (u64::from(s.prompt_tokens) + u64::from(s.max_tokens)).div_ceil(BLOCK_TOKENS).max(1)
}

/// The TC share's requests under `split` for `duration_s` at `speed` that are not sent (they
/// need more than [`Split::tc_max_blocks`]), and the TC share's requests in all.
pub fn tc_left_out(split: Split, speed: f64, duration_s: f64) -> anyhow::Result<(usize, usize)> {
    let all = Split { tc_max_blocks: 0, ..split };
    let (mut out, mut total) = (0, 0);
    for lane in 0..split.tc_lanes {
        let specs = specs_of(Entry::Tc, lane, all, speed, duration_s)?;
        total += specs.len();
        out += specs.iter().filter(|s| !split.sends(Entry::Tc, s)).count();
    }
    Ok((out, total))
}

/// The entry point of a conversation when only the socket ABI and the front door get load.
pub fn entry_of(conversation: &str) -> Entry {
    Split::default().of(conversation).0
}

/// The requests of `entry` for `duration_s` real seconds at `speed`, split between the socket
/// ABI and the front door.
pub fn specs(entry: Entry, speed: f64, duration_s: f64) -> anyhow::Result<Vec<RequestSpec>> {
    specs_of(entry, 0, Split::default(), speed, duration_s)
}

/// The requests of `entry`'s `lane` under `split` for `duration_s` real seconds at `speed`: the
/// trace looped, each pass `span` trace ms after the previous one (the trace's length plus one
/// second). Only the socket ABI's are tagged.
pub fn specs_of(
    entry: Entry,
    lane: usize,
    split: Split,
    speed: f64,
    duration_s: f64,
) -> anyhow::Result<Vec<RequestSpec>> {
    let (requests, _issues) = trace::load(&replay::default_trace_path())?;
    let (convs, _stats) = trace::conversations(&requests, trace::DEFAULT_COMMON_SHARE);
    let sel = TraceSelect { model: MODEL.to_string(), ..Default::default() };
    let base = replay::trace_specs(&requests, &convs, &sel);
    let span = base.iter().map(|s| s.at_ms).max().unwrap_or(0) + 1000;
    let end_ms = (duration_s * speed * 1000.0) as u64;
    let mut out = Vec::new();
    for pass in 0.. {
        let offset = pass * span;
        if offset >= end_ms {
            break;
        }
        for s in &base {
            let conversation = format!("{pass}-{}", s.conversation);
            if s.at_ms + offset >= end_ms || split.of(&conversation) != (entry, lane) || !split.sends(entry, s) {
                continue;
            }
            out.push(RequestSpec { at_ms: s.at_ms + offset, conversation, ..s.clone() });
        }
    }
    out.sort_by_key(|s| s.at_ms);
    for (i, s) in out.iter_mut().enumerate() {
        s.index = i;
    }
    if entry != Entry::Abi {
        replay::untag(&mut out);
    }
    Ok(out)
}

/// Milliseconds since the Unix epoch now.
pub fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

/// The worker: sends its requests (those of `lane` under `split`) and writes
/// `{"start_unix_ms", "requests"}`.
pub fn run_worker(p: &WorkerPlan, split: Split, lane: usize) -> anyhow::Result<()> {
    let specs = specs_of(p.entry, lane, split, p.speed, p.duration_s)?;
    let opts = RunOpts {
        vip: p.target,
        speed: p.speed,
        concurrency: p.concurrency,
        request_timeout: Duration::from_secs_f64(p.timeout_s),
        deadline: Duration::from_secs_f64(p.duration_s + p.timeout_s),
        progress: false,
    };
    let start_unix_ms = unix_ms();
    let (records, _summary) = replay::run(&specs, &opts);
    let v = json!({
        "start_unix_ms": start_unix_ms,
        "requests": records.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
    });
    std::fs::write(&p.out, v.to_string()).with_context(|| format!("writing {}", p.out.display()))
}

/// The worker's command line: this binary again, its conversations those of `lane` under
/// `split`.
pub fn command_of(p: &WorkerPlan, split: Split, lane: usize) -> anyhow::Result<Command> {
    let mut cmd = command(p)?;
    cmd.args(["--worker-tc-lanes", &split.tc_lanes.to_string(), "--worker-lane", &lane.to_string()])
        .args(["--worker-tc-max-blocks", &split.tc_max_blocks.to_string()]);
    Ok(cmd)
}

/// The worker's command line: this binary again (the socket ABI and the front door only).
pub fn command(p: &WorkerPlan) -> anyhow::Result<Command> {
    let me = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(me);
    cmd.args(["--load-worker", p.entry.key(), "--target", &p.target.to_string()])
        .args(["--worker-speed", &p.speed.to_string(), "--worker-duration-s", &p.duration_s.to_string()])
        .args(["--worker-concurrency", &p.concurrency.to_string(), "--worker-timeout-s", &p.timeout_s.to_string()])
        .arg("--worker-out")
        .arg(&p.out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Ok(cmd)
}

/// One request as the analysis sees it, its times in seconds since the soak started.
#[derive(Debug, Clone)]
pub struct Rec {
    pub entry: Entry,
    pub conversation: String,
    pub sent_s: f64,
    pub end_s: f64,
    pub ok: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub backend: Option<String>,
    pub e2e_ms: f64,
    /// How late the client sent it after its planned time (every thread busy), ms.
    pub late_ms: f64,
    /// The answer's `Retry-After`, seconds.
    pub retry_after: Option<u32>,
}

/// The records of a worker's report at `path`, on the clock of `t0_unix_ms`.
pub fn read(path: &Path, entry: Entry, t0_unix_ms: f64, speed: f64) -> anyhow::Result<Vec<Rec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).context("parsing a worker's report")?;
    let start_s = (v["start_unix_ms"].as_f64().unwrap_or(t0_unix_ms) - t0_unix_ms) / 1000.0;
    let reqs = v["requests"].as_array().context("a worker's report without requests")?;
    Ok(reqs
        .iter()
        .map(|r| {
            let sent_s = start_s + r["sent_ms"].as_f64().unwrap_or(0.0) / 1000.0;
            let e2e_ms = r["e2e_ms"].as_f64().unwrap_or(0.0);
            let status = r["status"].as_u64().map(|s| s as u16);
            let error = r["error"].as_str().map(str::to_string);
            let planned_s = start_s + r["at_ms"].as_f64().unwrap_or(0.0) / 1000.0 / speed;
            Rec {
                entry,
                conversation: r["conversation"].as_str().unwrap_or_default().to_string(),
                sent_s,
                end_s: sent_s + e2e_ms / 1000.0,
                ok: error.is_none() && status == Some(200),
                status,
                error,
                backend: r["backend"].as_str().map(str::to_string),
                e2e_ms,
                late_ms: ((sent_s - planned_s) * 1000.0).max(0.0),
                retry_after: r["retry_after"].as_u64().and_then(|s| u32::try_from(s).ok()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests;
