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
//! ```
//!
//! `--untagged` sends the same requests without the conversation and memory tags, as a client
//! of an L4 or L7 balancer that knows neither would (for baselines).

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::Duration;

use ailb_sim::replay::{self, synthetic::SyntheticOpts, trace, RunOpts, TraceSelect};

const USAGE: &str = "usage: ailb-replay [--trace PATH | --synthetic] [--vip A:P] [--speed X] [--limit N] \
[--start-ms MS] [--concurrency N] [--timeout-s S] [--deadline-s S] [--kv-mb-per-token MB] [--model NAME] \
[--seed N] [--rate CONV_PER_S] [--common-share F] [--out FILE] [--parse-only] [--quiet] [--untagged]";

struct Args {
    trace: PathBuf,
    synthetic: bool,
    vip: SocketAddrV4,
    speed: f64,
    limit: Option<usize>,
    start_ms: u64,
    concurrency: usize,
    timeout_s: f64,
    deadline_s: f64,
    kv_mb_per_token: f64,
    model: String,
    seed: u64,
    rate: f64,
    common_share: f64,
    out: Option<PathBuf>,
    parse_only: bool,
    quiet: bool,
    untagged: bool,
}

fn value<T: std::str::FromStr>(it: &mut impl Iterator<Item = String>, flag: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|e| format!("{flag}: invalid value {v:?}: {e}"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        trace: replay::default_trace_path(),
        synthetic: false,
        vip: "127.77.0.1:80".parse().expect("constant address"),
        speed: 1.0,
        limit: None,
        start_ms: 0,
        concurrency: 256,
        timeout_s: 120.0,
        deadline_s: 600.0,
        kv_mb_per_token: trace::DEFAULT_KV_MB_PER_TOKEN,
        model: replay::DEFAULT_MODEL.to_string(),
        seed: 1,
        rate: SyntheticOpts::default().conversations_per_s,
        common_share: trace::DEFAULT_COMMON_SHARE,
        out: None,
        parse_only: false,
        quiet: false,
        untagged: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--trace" => a.trace = value(&mut it, &flag)?,
            "--synthetic" => a.synthetic = true,
            "--vip" => a.vip = value(&mut it, &flag)?,
            "--speed" => a.speed = value(&mut it, &flag)?,
            "--limit" => a.limit = Some(value(&mut it, &flag)?),
            "--start-ms" => a.start_ms = value(&mut it, &flag)?,
            "--concurrency" => a.concurrency = value(&mut it, &flag)?,
            "--timeout-s" => a.timeout_s = value(&mut it, &flag)?,
            "--deadline-s" => a.deadline_s = value(&mut it, &flag)?,
            "--kv-mb-per-token" => a.kv_mb_per_token = value(&mut it, &flag)?,
            "--model" => a.model = value(&mut it, &flag)?,
            "--seed" => a.seed = value(&mut it, &flag)?,
            "--rate" => a.rate = value(&mut it, &flag)?,
            "--common-share" => a.common_share = value(&mut it, &flag)?,
            "--out" => a.out = Some(value(&mut it, &flag)?),
            "--parse-only" => a.parse_only = true,
            "--quiet" => a.quiet = true,
            "--untagged" => a.untagged = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let positive = |name: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(format!("{name}: must be a positive number, got {v}"))
        }
    };
    positive("--speed", a.speed)?;
    positive("--timeout-s", a.timeout_s)?;
    positive("--deadline-s", a.deadline_s)?;
    positive("--rate", a.rate)?;
    if !(a.kv_mb_per_token.is_finite() && a.kv_mb_per_token >= 0.0) {
        return Err(format!("--kv-mb-per-token: must be >= 0, got {}", a.kv_mb_per_token));
    }
    if !(0.0..=1.0).contains(&a.common_share) {
        return Err(format!("--common-share: must be in 0..=1, got {}", a.common_share));
    }
    if !a.vip.ip().is_loopback() {
        return Err(format!("--vip: {} is not a loopback address (the replay stays on this host)", a.vip));
    }
    if a.concurrency == 0 {
        return Err("--concurrency: must be at least 1".to_string());
    }
    Ok(a)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("ailb-replay: {e}");
        std::process::exit(2);
    });
    let specs = if args.synthetic {
        let opts = SyntheticOpts {
            requests: args.limit.unwrap_or(SyntheticOpts::default().requests),
            conversations_per_s: args.rate,
            seed: args.seed,
            ..SyntheticOpts::default()
        };
        replay::synthetic_specs(&opts, args.kv_mb_per_token, &args.model)
    } else {
        let file = std::fs::File::open(&args.trace).unwrap_or_else(|e| {
            eprintln!("ailb-replay: opening trace {}: {e} (set --trace or AILB_TRACE)", args.trace.display());
            std::process::exit(1);
        });
        let (requests, issues) = trace::parse(std::io::BufReader::new(file));
        for issue in issues.iter().take(20) {
            eprintln!("ailb-replay: {}: skipped {issue}", args.trace.display());
        }
        if issues.len() > 20 {
            eprintln!("ailb-replay: ... and {} more bad lines", issues.len() - 20);
        }
        let (convs, stats) = trace::conversations(&requests, args.common_share);
        eprintln!("ailb-replay: {}: {} bad lines; {stats}", args.trace.display(), issues.len());
        let sel = TraceSelect {
            start_ms: args.start_ms,
            limit: args.limit,
            kv_mb_per_token: args.kv_mb_per_token,
            model: args.model.clone(),
        };
        replay::trace_specs(&requests, &convs, &sel)
    };
    let mut specs = specs;
    if args.untagged {
        for s in &mut specs {
            s.conversation.clear();
            s.memory_mb = 0;
        }
    }
    let span_s = specs.last().map_or(0.0, |s| s.at_ms as f64 / 1000.0 / args.speed);
    eprintln!("ailb-replay: {} requests over {span_s:.1} s to {}", specs.len(), args.vip);
    if args.parse_only {
        return;
    }
    let opts = RunOpts {
        vip: args.vip,
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
