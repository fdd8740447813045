//! Replay of an LLM workload against a model VIP: the Mooncake conversation trace
//! ([`trace`]), a synthetic mix ([`synthetic`]) or tenants' shared system prompts
//! ([`shared_prefix`]), sent by a bounded pool of client threads
//! ([`client`]) at time-scaled arrival times, summarised by [`stats`].
//!
//! Every request tags its socket with its conversation and its memory need through the ailb
//! client ABI before connecting (unless [`RequestSpec::tag_socket`] is off); without ailb
//! (`ENOPROTOOPT`) it connects untagged. The prompt goes as text ([`crate::text`]), the
//! conversation as the `X-Session-ID` header.

pub mod client;
pub mod shared_prefix;
pub mod stats;
pub mod synthetic;
pub mod trace;

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use client::{RequestRecord, RequestSpec};
pub use stats::{percentile, Percentiles, Summary};
pub use trace::{ParseIssue, TraceRequest};

/// Default model name sent in the request body.
pub const DEFAULT_MODEL: &str = "sim-7b";

/// The Mooncake conversation trace shipped in the repository (gzipped; see `tests/data/README.md`).
pub const SHIPPED_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake-conversation.jsonl.gz");

/// The trace file: `$AILB_TRACE` (gzipped or plain JSON lines), else [`SHIPPED_TRACE`]. Read it
/// with [`trace::load`].
pub fn default_trace_path() -> PathBuf {
    match std::env::var_os("AILB_TRACE").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(SHIPPED_TRACE),
    }
}

/// Which trace requests to replay and how to tag them.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSelect {
    /// Skip requests before this trace time; the first replayed one is sent at `at_ms` 0.
    pub start_ms: u64,
    /// At most this many requests.
    pub limit: Option<usize>,
    pub kv_mb_per_token: f64,
    pub model: String,
}

impl Default for TraceSelect {
    fn default() -> Self {
        Self {
            start_ms: 0,
            limit: None,
            kv_mb_per_token: trace::DEFAULT_KV_MB_PER_TOKEN,
            model: DEFAULT_MODEL.to_string(),
        }
    }
}

/// The requests to send for a parsed trace, with conversation ids from
/// [`trace::conversations`] (computed over the whole trace, before the selection).
pub fn trace_specs(requests: &[TraceRequest], conversations: &[String], sel: &TraceSelect) -> Vec<RequestSpec> {
    let mut picked: Vec<(&TraceRequest, &String)> =
        requests.iter().zip(conversations).filter(|(r, _)| r.timestamp_ms >= sel.start_ms).collect();
    picked.sort_by_key(|(r, _)| (r.timestamp_ms, r.line));
    picked.truncate(sel.limit.unwrap_or(usize::MAX));
    picked
        .into_iter()
        .enumerate()
        .map(|(index, (r, conv))| RequestSpec {
            index,
            line: Some(r.line),
            at_ms: r.timestamp_ms - sel.start_ms,
            conversation: conv.clone(),
            memory_mb: trace::memory_mb(r.input_length, r.output_length, sel.kv_mb_per_token),
            prompt_tokens: r.input_length,
            max_tokens: r.output_length,
            hash_ids: r.hash_ids.clone(),
            message_ends: Vec::new(),
            model: sel.model.clone(),
            tag_socket: true,
            prefix_keys: false,
        })
        .collect()
}

/// A generated request (no trace line) as the replay sends it: tagged, its memory need from
/// its lengths.
struct Generated {
    at_ms: u64,
    conversation: String,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
    message_ends: Vec<u32>,
}

fn generated_specs(requests: Vec<Generated>, kv_mb_per_token: f64, model: &str) -> Vec<RequestSpec> {
    requests
        .into_iter()
        .enumerate()
        .map(|(index, r)| RequestSpec {
            index,
            line: None,
            at_ms: r.at_ms,
            memory_mb: trace::memory_mb(r.input_length, r.output_length, kv_mb_per_token),
            conversation: r.conversation,
            prompt_tokens: r.input_length,
            max_tokens: r.output_length,
            hash_ids: r.hash_ids,
            message_ends: r.message_ends,
            model: model.to_string(),
            tag_socket: true,
            prefix_keys: false,
        })
        .collect()
}

/// The requests to send for a synthetic workload.
pub fn synthetic_specs(opts: &synthetic::SyntheticOpts, kv_mb_per_token: f64, model: &str) -> Vec<RequestSpec> {
    let requests = synthetic::generate(opts).into_iter().map(|r| Generated {
        at_ms: r.at_ms,
        conversation: r.conversation,
        input_length: r.input_length,
        output_length: r.output_length,
        hash_ids: r.hash_ids,
        message_ends: r.message_ends,
    });
    generated_specs(requests.collect(), kv_mb_per_token, model)
}

/// The requests to send for the shared-prefix workload: no conversation (each request is its
/// own, so no `X-Session-ID` and no conversation tag), the memory need as for the others.
pub fn shared_prefix_specs(
    opts: &shared_prefix::SharedPrefixOpts,
    kv_mb_per_token: f64,
    model: &str,
) -> Vec<RequestSpec> {
    let requests = shared_prefix::generate(opts).into_iter().map(|r| Generated {
        at_ms: r.at_ms,
        conversation: String::new(),
        input_length: r.input_length,
        output_length: r.output_length,
        hash_ids: r.hash_ids,
        message_ends: Vec::new(),
    });
    generated_specs(requests.collect(), kv_mb_per_token, model)
}

/// Makes `specs` those of a client that knows no ailb tags (of an L4 or L7 balancer, or of
/// the front door `ailb gateway`): no socket tag, no memory need. The conversation stays: it
/// is the `X-Session-ID` header an L7 router or the gateway reads.
pub fn untag(specs: &mut [RequestSpec]) {
    for s in specs {
        s.tag_socket = false;
        s.prefix_keys = false;
        s.memory_mb = 0;
    }
}

/// The prefix-cache hit rate of an oracle placement: every request served where all earlier
/// prompts are cached, in a cache that never evicts. A request's cached tokens are the leading
/// run of its 512-token blocks that were part of an earlier request's prompt, keyed as the
/// simulator keys the text ([`crate::text::cache_keys`]: a partial block matches only the same
/// block cut at the same length; the simulator always computes at least one token), over all
/// prompt tokens. An upper bound for any placement.
pub fn oracle_prefix_hit_rate(specs: &[RequestSpec]) -> Option<f64> {
    let mut seen = std::collections::HashSet::new();
    let (mut cached, mut prompt) = (0u64, 0u64);
    for s in specs {
        let p = s.prompt_tokens as u64;
        let keys = crate::text::cache_keys(&s.hash_ids, p);
        let run = keys.iter().take_while(|h| seen.contains(*h)).count() as u64;
        cached += (run * 512).min(p.saturating_sub(1));
        prompt += p;
        seen.extend(keys);
    }
    (prompt > 0).then(|| cached as f64 / prompt as f64)
}

/// How to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOpts {
    pub vip: SocketAddrV4,
    /// Time scale: 2.0 sends the trace twice as fast. Must be > 0.
    pub speed: f64,
    /// Client threads, so at most this many requests in flight; a request whose arrival time
    /// comes while all are busy waits (its `sent_ms` shows by how much).
    pub concurrency: usize,
    /// Limit of one request.
    pub request_timeout: Duration,
    /// Limit of the whole replay: requests not sent by then are recorded as failures.
    pub deadline: Duration,
    /// Print a progress line to stderr every second.
    pub progress: bool,
}

/// Sends `specs` (sorted by `at_ms`) and returns every request's record (in index order) and
/// the summary. Always returns within about `deadline` + `request_timeout`.
pub fn run(specs: &[RequestSpec], opts: &RunOpts) -> (Vec<RequestRecord>, Summary) {
    let start = Instant::now();
    let hard_end = start + opts.deadline;
    let records: Arc<Mutex<Vec<RequestRecord>>> = Arc::new(Mutex::new(Vec::with_capacity(specs.len())));
    let finished = Arc::new(AtomicBool::new(false));
    let (tx, rx) = sync_channel::<RequestSpec>(0);
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..opts.concurrency.max(1) {
        let (rx, records, vip, timeout) = (rx.clone(), records.clone(), opts.vip, opts.request_timeout);
        workers.push(std::thread::spawn(move || loop {
            let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
            let Ok(spec) = next else { break };
            let sent_ms = start.elapsed().as_secs_f64() * 1000.0;
            let left = hard_end.saturating_duration_since(Instant::now());
            let mut rec = client::send(vip, &spec, timeout.min(left).max(Duration::from_millis(1)));
            rec.sent_ms = sent_ms;
            records.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
        }));
    }
    let progress = opts.progress.then(|| {
        let (records, finished, total) = (records.clone(), finished.clone(), specs.len());
        std::thread::spawn(move || {
            let mut next = Instant::now() + Duration::from_secs(1);
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                if Instant::now() < next {
                    continue;
                }
                next += Duration::from_secs(1);
                let recs = records.lock().unwrap_or_else(|p| p.into_inner());
                let fails = recs.iter().filter(|r| !r.ok()).count();
                let e2e: Vec<f64> = recs.iter().filter(|r| r.ok()).map(|r| r.e2e_ms).collect();
                let p95 = percentile(&e2e, 95.0).map_or_else(|| "-".to_string(), |p| format!("{p:.0} ms"));
                eprintln!(
                    "[replay {:>6.1}s] {}/{total} done, {fails} failed, e2e p95 {p95}",
                    start.elapsed().as_secs_f64(),
                    recs.len()
                );
            }
        })
    });
    let speed = if opts.speed > 0.0 { opts.speed } else { 1.0 };
    let mut unsent = Vec::new();
    for spec in specs {
        let due = start + Duration::from_secs_f64(spec.at_ms as f64 / 1000.0 / speed);
        if due >= hard_end {
            unsent.push(spec);
            continue;
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        // Blocks while every worker is busy (bounded concurrency).
        if tx.send(spec.clone()).is_err() {
            unsent.push(spec);
        }
    }
    drop(tx);
    for w in workers {
        let _ = w.join();
    }
    finished.store(true, Ordering::Relaxed);
    if let Some(p) = progress {
        let _ = p.join();
    }
    let wall_s = start.elapsed().as_secs_f64();
    let mut recs = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    for spec in unsent {
        recs.push(RequestRecord {
            error: Some(format!("not sent: replay deadline of {:?} reached", opts.deadline)),
            ..RequestRecord::for_spec(spec)
        });
    }
    recs.sort_by_key(|r| r.index);
    let summary = Summary::from_records(&recs, wall_s);
    (recs, summary)
}

/// The JSON report: the summary and every request's record.
pub fn report_json(summary: &Summary, records: &[RequestRecord]) -> serde_json::Value {
    let p = |p: &Option<Percentiles>| p.map(|p| serde_json::json!({"p50": p.p50, "p95": p.p95, "p99": p.p99}));
    serde_json::json!({
        "summary": {
            "requests": summary.requests, "failures": summary.failures, "failure_rate": summary.failure_rate(),
            "ttft_ms": p(&summary.ttft_ms), "e2e_ms": p(&summary.e2e_ms),
            "token_throughput": summary.token_throughput, "output_tokens": summary.output_tokens,
            "wall_s": summary.wall_s, "prefix_cache_hit_rate": summary.prefix_cache_hit_rate,
            "affinity_hit_rate": summary.affinity_hit_rate,
        },
        "requests": records.iter().map(RequestRecord::to_json).collect::<Vec<_>>(),
    })
}
