//! The tables of `ailb-fleet-model`: the setup, every placement at every load, and the
//! comparison over stretches spread across the trace.

use std::fmt::Write as _;
use std::time::Instant;

use ailb_sim::fleet_model::{fleet_profiles, run, Placement, RunResult};
use ailb_sim::replay::{self, RequestSpec};
use ailb_sim::GpuProfile;

use super::plot::Curve;
use super::{Args, Workload, STABLE_GROWTH};
use crate::compare::peers::{SMG_BALANCE_ABS, SMG_BALANCE_REL, SMG_DEFAULT_CACHE_THRESHOLD};

/// The title and how to read the table, for `short` requests (and `long` for the stability
/// check).
pub(super) fn intro(md: &mut String, args: &Args, w: &Workload, short: &[RequestSpec], long: &[RequestSpec]) {
    let unbounded = replay::oracle_prefix_hit_rate(short).unwrap_or(0.0);
    let _ = writeln!(
        md,
        "# Offered load vs placement, in simulated time\n\n\
         `ailb-fleet-model --limit {}{}`: {} x A100-80GB + {} x RTX 3090 (the `ailb-sim` presets), {} \
         {} requests (and {} for the stability check) at each load x {}. Latencies \
         are simulated seconds (the real comparison runs the same model 20x faster). ailb: the kernel's pick \
         (`ailb_common::pick`) with weights {}:1, load factor 1.25, affinity and memory fit (free memory: the KV \
         pool less the memory hints in flight, as the kernel counts them), without connection latency. Prefix-cache hits: the share of prompt tokens found cached, and in brackets against \
         the prefix-cache oracle at the same load (every request sent to the GPU holding the longest cached run \
         of its prompt: the placement that always returns a conversation to its cache); with caches \
         that never evict, {:.1} % would be cached.\n\n\
         Stable: the tail (E2E P95) at {} requests is under {STABLE_GROWTH}x the tail at {}; an unstable \
         placement's queue grows for as long as the run lasts, so its P95 measures the run's length.\n",
        args.limit,
        if args.synthetic {
            " --synthetic"
        } else if args.shared_prefix {
            " --shared-prefix"
        } else {
            ""
        },
        args.a100,
        args.rtx3090,
        w.describe(),
        short.len(),
        long.len(),
        w.rate_name(),
        args.a100_weight,
        unbounded * 100.0,
        long.len(),
        short.len(),
    );
}

/// The table: every placement at every load of `--loads`, on `short` and `long` requests; then
/// the loads at which the clairvoyant placement is stable. Returns the plot's curves and those
/// loads.
pub(super) fn loads(
    md: &mut String,
    args: &Args,
    profiles: &[GpuProfile],
    placements: &[Placement],
    (short, long): (&[RequestSpec], &[RequestSpec]),
) -> (Vec<Curve>, Vec<f64>) {
    let t0 = Instant::now();
    let _ = writeln!(
        md,
        "| load | placement | E2E p50 / p95 (s) | p95 vs round robin | TTFT p95 (s) | failures | util spread | \
         prefix hits (vs oracle) | affinity hits | p95 at {} requests | stable |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        long.len()
    );
    let mut stable_loads = Vec::new();
    let mut curves: Vec<Curve> = placements
        .iter()
        .map(|p| Curve { placement: *p, label: p.label(), short: Vec::new(), long: Vec::new() })
        .collect();
    for &load in &args.loads {
        let mut rr_p95 = None;
        // Every placement's runs first: the rows compare prefix hits with the oracle's.
        let runs: Vec<(RunResult, RunResult)> =
            placements.iter().map(|p| (run(short, profiles, load, *p), run(long, profiles, load, *p))).collect();
        let oracle = placements
            .iter()
            .zip(&runs)
            .find(|(p, _)| **p == Placement::CacheOracle)
            .map_or(0.0, |(_, (r, _))| r.prefix_hit_rate);
        for (k, (p, (r, l))) in placements.iter().zip(&runs).enumerate() {
            let p95 = r.e2e_percentile(0.95);
            curves[k].short.push(p95);
            curves[k].long.push(l.e2e_percentile(0.95));
            let rr = *rr_p95.get_or_insert(p95);
            let stable = l.e2e_percentile(0.95) < STABLE_GROWTH * p95;
            if *p == Placement::EarliestFinish && stable {
                stable_loads.push(load);
            }
            let _ = writeln!(
                md,
                "| {load} | {} | {:.1} / {:.1} | {:.2}x | {:.1} | {} of {} | {:.0} pts | {:.1} % ({:.0} %) | {:.0} % | {:.1} | {} |",
                p.label(),
                r.e2e_percentile(0.5),
                p95,
                p95 / rr,
                r.ttft_percentile(0.95),
                r.failures(),
                r.outcomes.len(),
                r.utilisation_spread() * 100.0,
                r.prefix_hit_rate * 100.0,
                if oracle > 0.0 { r.prefix_hit_rate / oracle * 100.0 } else { 0.0 },
                r.affinity_hit_rate * 100.0,
                l.e2e_percentile(0.95),
                if stable { "yes" } else { "**no**" },
            );
        }
        eprintln!("ailb-fleet-model: load {load} done ({:.1} s)", t0.elapsed().as_secs_f64());
    }
    let _ = writeln!(
        md,
        "\nLoads at which the clairvoyant placement is stable (the fleet has the capacity): {}.",
        if stable_loads.is_empty() {
            "none".to_string()
        } else {
            stable_loads.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(", ")
        }
    );
    (curves, stable_loads)
}

/// The P95 ratios of each placement against round robin and against the clairvoyant bound
/// over `windows` stretches of `limit` requests spread over the trace, at each load: the
/// first `limit` requests alone (the table above, the real comparison) are one sample of a
/// chaotic system, where one burst decides a tail.
pub(super) fn windows(md: &mut String, tr: &Workload, args: &Args, loads: &[f64], placements: &[Placement]) {
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let n = args.windows;
    let (title, stretches) = match tr {
        Workload::Trace(_) => ("Across the trace", format!("starting at {n} equally spaced times of the trace")),
        Workload::Synthetic { seed, .. } => {
            ("Across seeds", format!("of the synthetic mix with seeds {seed} to {}", seed + n as u64 - 1))
        }
        Workload::SharedPrefix(o) => (
            "Across seeds",
            format!("of the shared-prefix workload with seeds {} to {}", o.seed, o.seed + n as u64 - 1),
        ),
    };
    let _ = writeln!(
        md,
        "\n## {title}\n\n{n} stretches of {} requests, {stretches} (the \
         first is the table's), at each load where the clairvoyant placement is stable: every placement's E2E P95 \
         against round robin's and against the clairvoyant bound's on the same stretch, mean and worst (largest) \
         over the stretches, and its failures summed.\n\n\
         | load | placement | p95 vs round robin, mean / worst | p95 vs clairvoyant, mean / worst | failures |\n\
         |---:|---|---:|---:|---:|",
        args.limit,
    );
    for &load in loads {
        // Per placement: (ratios to round robin, ratios to the bound, failures).
        let mut rows: Vec<(Vec<f64>, Vec<f64>, usize)> = vec![(Vec::new(), Vec::new(), 0); placements.len()];
        for k in 0..n {
            let specs = tr.specs(k, n, args.limit);
            let results: Vec<RunResult> = placements.iter().map(|p| run(&specs, &profiles, load, *p)).collect();
            let p95 = |want: Placement| {
                placements.iter().zip(&results).find(|(p, _)| **p == want).map(|(_, r)| r.e2e_percentile(0.95))
            };
            let (Some(rr), Some(bound)) = (p95(Placement::RoundRobin), p95(Placement::EarliestFinish)) else {
                return;
            };
            for (row, r) in rows.iter_mut().zip(&results) {
                let own = r.e2e_percentile(0.95);
                row.0.push(own / rr);
                row.1.push(own / bound);
                row.2 += r.failures();
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        for (p, (to_rr, to_bound, failures)) in placements.iter().zip(&rows) {
            if matches!(p, Placement::RoundRobin | Placement::EarliestFinish) {
                continue;
            }
            let _ = writeln!(
                md,
                "| {load} | {} | {:.2}x / {:.2}x | {:.2}x / {:.2}x | {failures} of {} |",
                p.label(),
                mean(to_rr),
                worst(to_rr),
                mean(to_bound),
                worst(to_bound),
                args.limit * n,
            );
        }
        eprintln!("ailb-fleet-model: {n} stretches at load {load} done");
    }
}

/// ailb's pick with the prefix step (approximate) against the same pick without it, over
/// `--prefix-seeds` stretches (synthetic: seeds) at every load of `--loads`: TTFT P95 and E2E
/// P95 per stretch, summarised as the median and geometric mean of the ratios and the ratio of
/// the summed P95s. One stretch of an overloaded fleet is one sample of a chaotic system: a
/// stretch whose P95 is one second without the step and ten with it reads 10x, which an
/// arithmetic mean of a few ratios cannot absorb.
pub(super) fn prefix_step(md: &mut String, tr: &Workload, args: &Args) {
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let n = args.prefix_seeds;
    let plain = Placement::Ailb {
        a100_weight: args.a100_weight,
        load_factor: super::AILB_LOAD_FACTOR,
        affinity_wait_s: args.affinity_wait_s,
    };
    let prefixed = Placement::AilbPrefix {
        a100_weight: args.a100_weight,
        load_factor: super::AILB_LOAD_FACTOR,
        affinity_wait_s: args.affinity_wait_s,
        prefix_load_factor: args.prefix_load_factor,
        prefix_ttl_s: args.prefix_ttl_s,
        ttl_fill_factor: (args.prefix_ttl_fill > 0.0).then_some(args.prefix_ttl_fill),
    };
    let stretches = match tr {
        Workload::Trace(_) => format!("{n} stretches of {} requests spread over the trace", args.limit),
        Workload::Synthetic { seed, .. } => {
            format!(
                "{} requests of the synthetic mix with each seed from {seed} to {}",
                args.limit,
                seed + n as u64 - 1
            )
        }
        Workload::SharedPrefix(o) => format!(
            "{} requests of the shared-prefix workload with each seed from {} to {}",
            args.limit,
            o.seed,
            o.seed + n as u64 - 1
        ),
    };
    let _ = writeln!(
        md,
        "\n## The prefix step against the same pick without it\n\n\
         ailb's kernel pick with the prefix step in approximate mode (each request carries the text keys its socket \
         sends, each pick records them for the backend chosen, a holder's load bound {}, a learnt prefix counting \
         {}) against the same pick without it, on {stretches}, at each load. Per stretch, each P95 with the step \
         over without it; then the median and geometric mean of those ratios, the ratio of the P95s summed over the \
         stretches, the stretches at or under 1.00x and the largest ratio; and the prompt tokens from the caches, \
         mean over the stretches, with and without. The last two columns set the step against SMG's `cache_aware` \
         policy as the races run it (balance thresholds {SMG_BALANCE_ABS} and {SMG_BALANCE_REL}, cache threshold \
         {SMG_DEFAULT_CACHE_THRESHOLD}), modelled from its source on the same GPUs: TTFT P95 with the step over \
         SMG's, and SMG's prompt tokens from the caches.\n\n\
         | load | TTFT P95 with / without: median, geometric mean, of the sums | at or under 1.00x | largest | \
         E2E P95: median, geometric mean, of the sums | from the cache, with / without | TTFT P95 with / SMG \
         cache-aware (modelled): median, geometric mean, of the sums | SMG from the cache |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|",
        args.prefix_load_factor,
        if args.prefix_ttl_fill > 0.0 {
            format!(
                "{} x the fill time of the largest cache, its capacity in tokens over the prompt tokens per second \
                 it is sent, at most {} s",
                args.prefix_ttl_fill, args.prefix_ttl_s
            )
        } else {
            format!("{} s", args.prefix_ttl_s)
        },
    );
    for &load in &args.loads {
        let t0 = Instant::now();
        let mut ttft = Ratios::default();
        let mut e2e = Ratios::default();
        let mut to_smg = Ratios::default();
        let (mut cached_with, mut cached_without, mut cached_smg) = (0.0, 0.0, 0.0);
        for k in 0..n {
            let specs = tr.specs(k, n, args.limit);
            let with = run(&specs, &profiles, load, prefixed);
            let without = run(&specs, &profiles, load, plain);
            ttft.push(with.ttft_percentile(0.95), without.ttft_percentile(0.95));
            e2e.push(with.e2e_percentile(0.95), without.e2e_percentile(0.95));
            cached_with += with.prefix_hit_rate / n as f64;
            cached_without += without.prefix_hit_rate / n as f64;
            let smg = run(&specs, &profiles, load, SMG_CACHE_AWARE);
            to_smg.push(with.ttft_percentile(0.95), smg.ttft_percentile(0.95));
            cached_smg += smg.prefix_hit_rate / n as f64;
        }
        let _ = writeln!(
            md,
            "| {load} | {} | {} of {n} | {:.2}x | {} | {:.1} % / {:.1} % | {} | {:.1} % |",
            ttft.summary(),
            ttft.at_or_under_one(),
            ttft.largest(),
            e2e.summary(),
            cached_with * 100.0,
            cached_without * 100.0,
            to_smg.summary(),
            cached_smg * 100.0,
        );
        eprintln!(
            "ailb-fleet-model: the prefix step over {n} stretches at load {load} done ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    }
}

/// SMG's `cache_aware` in the model, with the settings `ailb-compare` gives it.
pub(super) const SMG_CACHE_AWARE: Placement = Placement::SmgCacheAware {
    balance_abs: SMG_BALANCE_ABS,
    balance_rel: SMG_BALANCE_REL,
    cache_threshold: SMG_DEFAULT_CACHE_THRESHOLD,
};

/// Per-stretch pairs of a P95 with the prefix step and another placement's.
#[derive(Default)]
struct Ratios {
    pairs: Vec<(f64, f64)>,
}

impl Ratios {
    fn push(&mut self, with: f64, without: f64) {
        if with > 0.0 && without > 0.0 {
            self.pairs.push((with, without));
        }
    }

    fn ratios(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self.pairs.iter().map(|(a, b)| a / b).collect();
        r.sort_by(f64::total_cmp);
        r
    }

    /// "median, geometric mean, of the sums", each as `0.00x`.
    fn summary(&self) -> String {
        let r = self.ratios();
        let Some(median) = crate::frontdoor::report::median(&r) else {
            return "none".into();
        };
        let geo = crate::frontdoor::report::geometric_mean(&r).unwrap_or(f64::NAN);
        let sums = self.pairs.iter().map(|p| p.0).sum::<f64>() / self.pairs.iter().map(|p| p.1).sum::<f64>();
        format!("{median:.2}x, {geo:.2}x, {sums:.2}x")
    }

    fn at_or_under_one(&self) -> usize {
        self.pairs.iter().filter(|(a, b)| a <= b).count()
    }

    fn largest(&self) -> f64 {
        self.ratios().last().copied().unwrap_or(0.0)
    }
}
