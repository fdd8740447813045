//! `ailb-fleet-model`: the capacity question behind the replay benchmark, answered in simulated
//! time (no kernel, no HTTP, no root): the trace's requests at several offered loads go through
//! each placement to the same GPU model `ailb-sim` serves ([`ailb_sim::fleet_model`]), and the
//! table shows where the fleet is **stable** (a clairvoyant placement's tail does not grow when
//! the run is twice as long) and where round robin already is not.
//!
//! ```text
//! ailb-fleet-model [--limit N] [--loads 0.25,0.35,0.5,0.7,1.0] [--a100 2] [--rtx3090 4]
//!                  [--a100-weight 3] [--windows 10] [--trace PATH] [--out FILE.md] [--svg FILE.svg]
//! ```

pub mod plot;
mod report;

use std::path::{Path, PathBuf};

use ailb_sim::fleet_model::{fleet_profiles, Placement};
use ailb_sim::replay::{self, trace, RequestSpec, TraceSelect};
use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Offered load vs placement on a model of the simulated fleet (simulated time, seconds to run)")]
pub struct Args {
    /// Requests of the trace to replay (from its start); the stability check also runs 2 x N.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Offered loads, relative to the trace's own arrival rate.
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
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Also write the report (Markdown) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write a plot (SVG) of every placement's E2E P95 against the load here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also compare the placements over this many stretches of `--limit` requests spread over
    /// the trace, at each load where the fleet is stable (0: not).
    #[arg(long, default_value_t = 10)]
    pub windows: usize,
}

/// A placement's tail grows by less than this when the run is twice as long: stable.
const STABLE_GROWTH: f64 = 1.25;

/// `ailb-fleet-model`: the tables (printed, and written to `--out`) and the plot (`--svg`).
pub fn main(args: Args) -> anyhow::Result<()> {
    if args.limit == 0 || args.a100 + args.rtx3090 == 0 || args.loads.iter().any(|l| !(*l > 0.0 && l.is_finite())) {
        bail!("--limit, the fleet and every --loads value must be positive");
    }
    let path = args.trace.clone().unwrap_or_else(replay::default_trace_path);
    let tr = Trace::load(&path)?;
    let short = tr.specs(0, args.limit);
    let long = tr.specs(0, args.limit * 2);
    let placements = [
        Placement::RoundRobin,
        Placement::LeastConnections,
        Placement::Ailb { a100_weight: args.a100_weight, load_factor: 1.25, affinity_wait_s: args.affinity_wait_s },
        Placement::EarliestFinish,
        Placement::CacheOracle,
    ];
    let mut md = String::new();
    report::intro(&mut md, &args, &short, &long);
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let (curves, stable_loads) = report::loads(&mut md, &args, &profiles, &placements, (&short, &long));
    if args.windows > 0 {
        report::windows(&mut md, &tr, &args, &stable_loads, &placements);
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

    /// Start times of `n` windows spread evenly over the trace (the first at its start).
    fn window_starts(&self, n: usize) -> Vec<u64> {
        let span = self.requests.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
        (0..n as u64).map(|w| span * w / n as u64).collect()
    }
}
