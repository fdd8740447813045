//! `ailb-replay`: replays the Mooncake conversation trace (or a synthetic mix of short
//! questions and long generations) against a model VIP, tagging every connection with its
//! conversation and memory need through the ailb client ABI, and reports TTFT and end-to-end
//! latency percentiles, failure rate, token throughput, prefix-cache and affinity hit rates.
//!
//! ```text
//! ailb-replay [--trace PATH | --synthetic] [--vip 127.77.0.1:80] [--speed X] [--limit N]
//!             [--start-ms MS] [--concurrency N] [--timeout-s S] [--deadline-s S]
//!             [--kv-mb-per-token MB] [--model NAME] [--seed N] [--rate CONV_PER_S]
//!             [--common-share F] [--out FILE] [--parse-only] [--quiet] [--untagged]
//!             [--gateway 127.0.0.1:8080]
//! ```
//!
//! `--untagged` sends the same requests without the conversation and memory tags, as a client
//! of an L4 or L7 balancer that knows neither would (for baselines). `--gateway ADDR` sends
//! them, untagged too, as plain HTTP to the front door `ailb gateway` at ADDR, as an unchanged
//! OpenAI client would: the model in the body, the conversation as `X-Session-ID`; the gateway
//! tags its own upstream connections.

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::Duration;

use ailb_sim::replay::{self, synthetic::SyntheticOpts, trace, RequestSpec, RunOpts, TraceSelect};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

#[derive(Debug, Parser)]
#[command(
    name = "ailb-replay",
    about = "Replays the Mooncake conversation trace (or a synthetic mix) against a model VIP through the ailb client ABI"
)]
struct Args {
    /// The Mooncake trace, JSON lines, gzipped or plain (default: `$AILB_TRACE`, else the one
    /// shipped in the repository, `tests/data/mooncake-conversation.jsonl.gz`).
    #[arg(long, conflicts_with = "synthetic")]
    trace: Option<PathBuf>,
    /// The synthetic mix of short questions and long generations instead of the trace.
    #[arg(long)]
    synthetic: bool,
    /// The model's VIP (a loopback address: the replay stays on this host).
    #[arg(long, default_value = "127.77.0.1:80", conflicts_with = "gateway")]
    vip: SocketAddrV4,
    /// Send every request as plain HTTP, with no socket tag, to the front door `ailb gateway`
    /// at this address (loopback) instead of the VIP.
    #[arg(long, conflicts_with = "untagged")]
    gateway: Option<SocketAddrV4>,
    /// Time scale: 2 sends the trace twice as fast.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// At most this many requests (synthetic: this many, default 500).
    #[arg(long)]
    limit: Option<usize>,
    /// Skip the trace's requests before this time (ms); the first replayed one is sent at once.
    #[arg(long, default_value_t = 0)]
    start_ms: u64,
    /// Client threads, so at most this many requests in flight.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Limit of one request, seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout_s: f64,
    /// Limit of the whole replay, seconds: requests not sent by then count as failures.
    #[arg(long, default_value_t = 600.0)]
    deadline_s: f64,
    /// KV-cache MB per token of the served model, for each request's memory tag.
    #[arg(long, default_value_t = trace::DEFAULT_KV_MB_PER_TOKEN)]
    kv_mb_per_token: f64,
    /// Model name sent in the request body.
    #[arg(long, default_value = replay::DEFAULT_MODEL)]
    model: String,
    /// Seed of the synthetic mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// New synthetic conversations per second.
    #[arg(long, default_value_t = SyntheticOpts::default().conversations_per_s)]
    rate: f64,
    /// A block in more than this share of the trace's requests is a common prefix (a system
    /// prompt), not part of one conversation, when grouping turns into conversations.
    #[arg(long, default_value_t = trace::DEFAULT_COMMON_SHARE)]
    common_share: f64,
    /// Also write every request's record and the summary as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Parse and select the requests, print what would be sent, and exit.
    #[arg(long)]
    parse_only: bool,
    /// No progress line every second.
    #[arg(long)]
    quiet: bool,
    /// Send no conversation or memory tag (a client of an L4 or L7 balancer).
    #[arg(long)]
    untagged: bool,
}

impl Args {
    /// Rejects values no replay can use (clap has checked the types).
    fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name}: must be a positive number, got {v}"))
            }
        };
        positive("--speed", self.speed)?;
        positive("--timeout-s", self.timeout_s)?;
        positive("--deadline-s", self.deadline_s)?;
        positive("--rate", self.rate)?;
        if !(self.kv_mb_per_token.is_finite() && self.kv_mb_per_token >= 0.0) {
            return Err(format!("--kv-mb-per-token: must be >= 0, got {}", self.kv_mb_per_token));
        }
        if !(0.0..=1.0).contains(&self.common_share) {
            return Err(format!("--common-share: must be in 0..=1, got {}", self.common_share));
        }
        if !self.vip.ip().is_loopback() {
            return Err(format!("--vip: {} is not a loopback address (the replay stays on this host)", self.vip));
        }
        if let Some(g) = self.gateway.filter(|g| !g.ip().is_loopback()) {
            return Err(format!("--gateway: {g} is not a loopback address (the replay stays on this host)"));
        }
        if self.concurrency == 0 {
            return Err("--concurrency: must be at least 1".to_string());
        }
        Ok(())
    }
}

/// The requests to send: the synthetic mix, or the trace's (its bad lines reported).
fn specs(args: &Args) -> Vec<RequestSpec> {
    if args.synthetic {
        let opts = SyntheticOpts {
            requests: args.limit.unwrap_or(SyntheticOpts::default().requests),
            conversations_per_s: args.rate,
            seed: args.seed,
            ..SyntheticOpts::default()
        };
        return replay::synthetic_specs(&opts, args.kv_mb_per_token, &args.model);
    }
    let path = args.trace.clone().unwrap_or_else(replay::default_trace_path);
    let (requests, issues) = trace::load(&path).unwrap_or_else(|e| {
        let cause = std::error::Error::source(&e).map(|c| format!(": {c}")).unwrap_or_default();
        eprintln!("ailb-replay: {e}{cause} (set --trace or AILB_TRACE)");
        std::process::exit(1);
    });
    for issue in issues.iter().take(20) {
        eprintln!("ailb-replay: {}: skipped {issue}", path.display());
    }
    if issues.len() > 20 {
        eprintln!("ailb-replay: ... and {} more bad lines", issues.len() - 20);
    }
    let (convs, stats) = trace::conversations(&requests, args.common_share);
    eprintln!("ailb-replay: {}: {} bad lines; {stats}", path.display(), issues.len());
    let sel = TraceSelect {
        start_ms: args.start_ms,
        limit: args.limit,
        kv_mb_per_token: args.kv_mb_per_token,
        model: args.model.clone(),
    };
    replay::trace_specs(&requests, &convs, &sel)
}

fn main() {
    let args = Args::parse();
    if let Err(e) = args.validate() {
        Args::command().error(ErrorKind::ValueValidation, e).exit();
    }
    let mut specs = specs(&args);
    if args.untagged || args.gateway.is_some() {
        replay::untag(&mut specs);
    }
    let target = args.gateway.unwrap_or(args.vip);
    let span_s = specs.last().map_or(0.0, |s| s.at_ms as f64 / 1000.0 / args.speed);
    let what = if args.gateway.is_some() { "the gateway" } else { "the VIP" };
    eprintln!("ailb-replay: {} requests over {span_s:.1} s to {what} {target}", specs.len());
    if args.parse_only {
        return;
    }
    let opts = RunOpts {
        vip: target,
        speed: args.speed,
        concurrency: args.concurrency,
        request_timeout: Duration::from_secs_f64(args.timeout_s),
        deadline: Duration::from_secs_f64(args.deadline_s),
        progress: !args.quiet,
    };
    let (records, summary) = replay::run(&specs, &opts);
    println!("{summary}");
    if let Some(out) = &args.out {
        let json = replay::report_json(&summary, &records);
        if let Err(e) = std::fs::write(out, format!("{json:#}\n")) {
            eprintln!("ailb-replay: writing {}: {e}", out.display());
            std::process::exit(1);
        }
    }
}
