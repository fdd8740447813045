//! `ailb-fleet-model`: the capacity question behind the replay benchmark, answered in simulated
//! time (no kernel, no HTTP, no root): the trace's requests (or the synthetic mix's, with
//! `--synthetic`) at several offered loads go through each placement to the same GPU model
//! `ailb-sim` serves ([`ailb_sim::fleet_model`]), and the table shows where the fleet is
//! **stable** (a clairvoyant placement's tail does not grow when the run is twice as long) and
//! where round robin already is not.
//!
//! ```text
//! ailb-fleet-model [--limit N] [--loads 0.25,0.35,0.5,0.7,1.0] [--a100 2] [--rtx3090 4]
//!                  [--a100-weight 3] [--windows 10]
//!                  [--trace PATH | --synthetic [--rate R] [--seed S]
//!                   | --shared-prefix [--tenants 24] [--system-blocks 12] [--question-blocks 1] [--rate R] [--seed S]]
//!                  [--prefix-seeds N [--prefix-load-factor 2] [--prefix-ttl-s 60]
//!                   [--prefix-ttl-fill [--prefix-ttl-fill-factor 1]]]
//!                  [--out FILE.md] [--svg FILE.svg]
//! ```

pub mod plot;
mod report;

use std::path::{Path, PathBuf};

use ailb_sim::fleet_model::{fleet_profiles, Placement};
use ailb_sim::replay::shared_prefix::SharedPrefixOpts;
use ailb_sim::replay::synthetic::SyntheticOpts;
use ailb_sim::replay::{self, trace, RequestSpec, TraceSelect};
use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Offered load vs placement on a model of the simulated fleet (simulated time, seconds to run)")]
pub struct Args {
    /// Requests of the trace to replay (from its start); the stability check also runs 2 x N.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Offered loads, relative to the trace's own arrival rate (with `--synthetic`, to `--rate`).
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.35,0.5,0.7,1.0")]
    pub loads: Vec<f64>,
    #[arg(long, default_value_t = 2)]
    pub a100: usize,
    #[arg(long, default_value_t = 4)]
    pub rtx3090: usize,
    /// ailb's weight of an A100 against an RTX 3090's 1 (the comparison's GPU capability).
    #[arg(long, default_value_t = 3)]
    pub a100_weight: u32,
    /// ailb's `affinity_wait`, simulated seconds (the daemon's default, 20 s).
    #[arg(long, default_value_t = 20.0)]
    pub affinity_wait_s: f64,
    /// Mooncake trace, gzipped or plain (default: `$AILB_TRACE` or the one shipped in
    /// `tests/data/mooncake-conversation.jsonl.gz`).
    #[arg(long, conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// The synthetic mix of `ailb-compare --synthetic` instead of the trace (its stretches
    /// across the trace become runs with other seeds).
    #[arg(long)]
    pub synthetic: bool,
    /// The shared-prefix workload of `ailb-compare --shared-prefix` instead of the trace
    /// (`--tenants` tenants, each with a system prompt of `--system-blocks` blocks, no
    /// conversation; `--rate` requests per second at load 1; stretches become seeds).
    #[arg(long, conflicts_with_all = ["synthetic", "trace"])]
    pub shared_prefix: bool,
    /// `--shared-prefix`: tenants, each with a system prompt of its own.
    #[arg(long, default_value_t = 24)]
    pub tenants: usize,
    /// `--shared-prefix`: 512-token blocks of each tenant's system prompt.
    #[arg(long, default_value_t = 12)]
    pub system_blocks: u32,
    /// `--shared-prefix`: 512-token blocks of each user's question.
    #[arg(long, default_value_t = 1)]
    pub question_blocks: u32,
    /// New synthetic conversations (`--shared-prefix`: requests) per (simulated) second at
    /// load 1 (`ailb-compare`'s default).
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// Seed of the synthetic mix (the first run's; stretch k uses seed + k).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the report (Markdown) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write a plot (SVG) of every placement's E2E P95 against the load here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also compare the placements over this many stretches of `--limit` requests spread over
    /// the trace (synthetic: this many seeds), at each load where the fleet is stable (0: not).
    #[arg(long, default_value_t = 10)]
    pub windows: usize,
    /// Also compare ailb's pick with the prefix step (approximate mode, as `ailb-compare`'s
    /// `ailb-prefix` runs it) against the same pick without it, over this many stretches
    /// (synthetic: seeds) at every load of `--loads` (0: not).
    #[arg(long, default_value_t = 0)]
    pub prefix_seeds: usize,
    /// The prefix holders' load bound factor (the daemon's default, 2).
    #[arg(long, default_value_t = 2.0)]
    pub prefix_load_factor: f64,
    /// How long a learnt prefix counts, simulated seconds (the daemon's default, 60 s).
    #[arg(long, default_value_t = 60.0)]
    pub prefix_ttl_s: f64,
    /// A learnt prefix counts for this many times the fill time of the largest cache (its
    /// capacity in tokens over the prompt tokens per second it is sent, sampled each simulated
    /// second and smoothed over 30 s), at most `--prefix-ttl-s`, as the daemon sets it (the
    /// model's `prefix_ttl_fill`, default 1.25); 0: `--prefix-ttl-s` fixed.
    #[arg(long, default_value_t = ailb_userspace::policy::DEFAULT_PREFIX_TTL_FILL)]
    pub prefix_ttl_fill: f64,
}

/// ailb's load bound factor in the model (the daemon's default `load_factor`).
const AILB_LOAD_FACTOR: f64 = 1.25;

/// A placement's tail grows by less than this when the run is twice as long: stable.
const STABLE_GROWTH: f64 = 1.25;

/// `ailb-fleet-model`: the tables (printed, and written to `--out`) and the plot (`--svg`).
pub fn main(args: Args) -> anyhow::Result<()> {
    if args.limit == 0 || args.a100 + args.rtx3090 == 0 || args.loads.iter().any(|l| !(*l > 0.0 && l.is_finite())) {
        bail!("--limit, the fleet and every --loads value must be positive");
    }
    if !(args.prefix_load_factor >= 1.0 && args.prefix_load_factor.is_finite()) {
        bail!("--prefix-load-factor must be a finite number of at least 1, not {}", args.prefix_load_factor);
    }
    if !(args.prefix_ttl_s > 0.0 && args.prefix_ttl_s.is_finite()) {
        bail!("--prefix-ttl-s must be a finite number of seconds above 0, not {}", args.prefix_ttl_s);
    }
    if !(args.prefix_ttl_fill >= 0.0 && args.prefix_ttl_fill <= ailb_userspace::policy::MAX_PREFIX_TTL_FILL) {
        bail!(
            "--prefix-ttl-fill must be a factor from 0 (the lifetime fixed) to {}, not {}",
            ailb_userspace::policy::MAX_PREFIX_TTL_FILL,
            args.prefix_ttl_fill
        );
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        bail!("--rate must be a positive number of conversations per second, not {}", args.rate);
    }
    let tr = if args.synthetic {
        Workload::Synthetic { rate: args.rate, seed: args.seed }
    } else if args.shared_prefix {
        let opts = SharedPrefixOpts {
            requests: args.limit,
            tenants: args.tenants,
            system_blocks: args.system_blocks,
            question_blocks: args.question_blocks,
            requests_per_s: args.rate,
            seed: args.seed,
            ..Default::default()
        };
        opts.validate().map_err(|e| anyhow::anyhow!("--shared-prefix: {e}"))?;
        Workload::SharedPrefix(opts)
    } else {
        Workload::Trace(Trace::load(&args.trace.clone().unwrap_or_else(replay::default_trace_path))?)
    };
    let short = tr.specs(0, 1, args.limit);
    let long = tr.specs(0, 1, args.limit * 2);
    let placements = [
        Placement::RoundRobin,
        Placement::LeastConnections,
        Placement::Ailb {
            a100_weight: args.a100_weight,
            load_factor: AILB_LOAD_FACTOR,
            affinity_wait_s: args.affinity_wait_s,
        },
        report::SMG_CACHE_AWARE,
        Placement::EarliestFinish,
        Placement::CacheOracle,
    ];
    let mut md = String::new();
    report::intro(&mut md, &args, &tr, &short, &long);
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let (curves, stable_loads) = report::loads(&mut md, &args, &profiles, &placements, (&short, &long));
    if args.windows > 0 {
        report::windows(&mut md, &tr, &args, &stable_loads, &placements);
    }
    if args.prefix_seeds > 0 {
        report::prefix_step(&mut md, &tr, &args);
    }
    print!("{md}");
    if let Some(out) = &args.out {
        std::fs::write(out, &md).with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, plot::svg(&args.loads, &curves, short.len())?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Where the requests come from.
enum Workload {
    Trace(Trace),
    /// The synthetic mix at `rate` new conversations per second, from `seed`.
    Synthetic {
        rate: f64,
        seed: u64,
    },
    /// The shared-prefix workload with these options (the first run's seed; stretch k uses
    /// seed + k).
    SharedPrefix(SharedPrefixOpts),
}

impl Workload {
    /// `limit` requests of stretch `k` of `n`: from `k/n` of the trace's length on, or the
    /// synthetic mix with seed `seed + k`.
    fn specs(&self, k: usize, n: usize, limit: usize) -> Vec<RequestSpec> {
        match self {
            Workload::Trace(t) => t.specs(t.window_start(k, n), limit),
            Workload::Synthetic { rate, seed } => {
                let opts = SyntheticOpts {
                    requests: limit,
                    conversations_per_s: *rate,
                    seed: seed + k as u64,
                    ..Default::default()
                };
                replay::synthetic_specs(&opts, trace::DEFAULT_KV_MB_PER_TOKEN, replay::DEFAULT_MODEL)
            }
            Workload::SharedPrefix(o) => {
                let opts = SharedPrefixOpts { requests: limit, seed: o.seed + k as u64, ..o.clone() };
                replay::shared_prefix_specs(&opts, trace::DEFAULT_KV_MB_PER_TOKEN, replay::DEFAULT_MODEL)
            }
        }
    }

    /// What the requests are, for the report: "the Mooncake trace's first" or "the synthetic
    /// mix's" (then the count).
    fn describe(&self) -> String {
        match self {
            Workload::Trace(_) => "the Mooncake trace's first".into(),
            Workload::Synthetic { rate, seed } => {
                format!("the synthetic mix (`--synthetic`, {rate} new conversations/s at load 1, seed {seed}),")
            }
            Workload::SharedPrefix(o) => format!(
                "the shared-prefix workload (`--shared-prefix`, {} tenants with {}-block system prompts, {}-block \
                 questions, {} requests/s at load 1, seed {}),",
                o.tenants, o.system_blocks, o.question_blocks, o.requests_per_s, o.seed
            ),
        }
    }

    /// "the trace's arrival rate" or "the synthetic rate".
    fn rate_name(&self) -> &'static str {
        match self {
            Workload::Trace(_) => "the trace's arrival rate",
            Workload::Synthetic { .. } | Workload::SharedPrefix(_) => "`--rate`",
        }
    }
}

/// The parsed trace with its conversation ids.
struct Trace {
    requests: Vec<trace::TraceRequest>,
    conversations: Vec<String>,
}

impl Trace {
    fn load(path: &Path) -> anyhow::Result<Trace> {
        let (requests, issues) = trace::load(path)?;
        if requests.is_empty() {
            bail!("trace {}: no valid request ({} bad lines)", path.display(), issues.len());
        }
        let (conversations, _) = trace::conversations(&requests, trace::DEFAULT_COMMON_SHARE);
        Ok(Trace { requests, conversations })
    }

    /// `limit` requests from trace time `start_ms` on.
    fn specs(&self, start_ms: u64, limit: usize) -> Vec<RequestSpec> {
        let sel = TraceSelect { start_ms, limit: Some(limit), ..Default::default() };
        replay::trace_specs(&self.requests, &self.conversations, &sel)
    }

    /// Start time of window `k` of `n` spread evenly over the trace (the first at its start).
    fn window_start(&self, k: usize, n: usize) -> u64 {
        let span = self.requests.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
        span * k as u64 / n.max(1) as u64
    }
}

#[cfg(test)]
mod tests;
