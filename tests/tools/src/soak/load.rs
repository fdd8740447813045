//! The soak's load: the Mooncake trace, looped for as long as the run lasts, its conversations
//! split between the two entry points by a hash of their id (one worker each, re-execs of
//! `ailb-soak` inside the child cgroup): the socket ABI (tagged connects to the VIP) and the
//! front door (plain HTTP to `ailb gateway`, the conversation as `X-Session-ID`). Each loop's
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

/// An entry point of the soak's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    Abi,
    FrontDoor,
}

impl Entry {
    pub fn key(self) -> &'static str {
        match self {
            Self::Abi => "abi",
            Self::FrontDoor => "front-door",
        }
    }
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "abi" => Ok(Self::Abi),
            "front-door" => Ok(Self::FrontDoor),
            other => anyhow::bail!("unknown entry point {other:?} (abi, front-door)"),
        }
    }
    pub fn title(self) -> &'static str {
        match self {
            Self::Abi => "socket ABI",
            Self::FrontDoor => "front door",
        }
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

/// The entry point of a conversation.
pub fn entry_of(conversation: &str) -> Entry {
    if fnv(conversation).is_multiple_of(2) {
        Entry::Abi
    } else {
        Entry::FrontDoor
    }
}

/// The requests of `entry` for `duration_s` real seconds at `speed`: the trace looped, each
/// pass `span` trace ms after the previous one (the trace's length plus one second).
pub fn specs(entry: Entry, speed: f64, duration_s: f64) -> anyhow::Result<Vec<RequestSpec>> {
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
            if s.at_ms + offset >= end_ms || entry_of(&conversation) != entry {
                continue;
            }
            out.push(RequestSpec { at_ms: s.at_ms + offset, conversation, ..s.clone() });
        }
    }
    out.sort_by_key(|s| s.at_ms);
    for (i, s) in out.iter_mut().enumerate() {
        s.index = i;
    }
    if entry == Entry::FrontDoor {
        replay::untag(&mut out);
    }
    Ok(out)
}

/// Milliseconds since the Unix epoch now.
pub fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

/// The worker (inside the cgroup): sends its requests and writes `{"start_unix_ms", "requests"}`.
pub fn run_worker(p: &WorkerPlan) -> anyhow::Result<()> {
    let specs = specs(p.entry, p.speed, p.duration_s)?;
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

/// The worker's command line: this binary again.
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
mod tests {
    use super::*;

    #[test]
    fn the_entry_points_split_the_conversations() {
        let abi = (0..1000).filter(|i| entry_of(&format!("0-c{i}")) == Entry::Abi).count();
        assert!((400..=600).contains(&abi), "{abi} of 1000 to the socket ABI");
    }
}
