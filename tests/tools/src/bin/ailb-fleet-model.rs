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

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use ailb_sim::fleet_model::{fleet_profiles, run, Placement, RunResult};
use ailb_sim::replay::{self, trace, RequestSpec, TraceSelect};
use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Offered load vs placement on a model of the simulated fleet (simulated time, seconds to run)")]
struct Args {
    /// Requests of the trace to replay (from its start); the stability check also runs 2 x N.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Offered loads, relative to the trace's own arrival rate.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.35,0.5,0.7,1.0")]
    loads: Vec<f64>,
    #[arg(long, default_value_t = 2)]
    a100: usize,
    #[arg(long, default_value_t = 4)]
    rtx3090: usize,
    /// ailb's weight of an A100 against an RTX 3090's 1 (the comparison's GPU capability).
    #[arg(long, default_value_t = 3)]
    a100_weight: u32,
    /// ailb's `affinity_wait`, simulated seconds (the daemon's default, 20 s).
    #[arg(long, default_value_t = 20.0)]
    affinity_wait_s: f64,
    /// Mooncake trace (default: `$AILB_TRACE` or `../shared/traces/mooncake-conversation.jsonl`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Also write the report (Markdown) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write a plot (SVG) of every placement's E2E P95 against the load here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Also compare the placements over this many stretches of `--limit` requests spread over
    /// the trace, at each load where the fleet is stable (0: not).
    #[arg(long, default_value_t = 10)]
    windows: usize,
}

/// One placement's E2E P95 (simulated seconds) per load, at N and at 2 x N requests.
struct Curve {
    label: String,
    short: Vec<f64>,
    long: Vec<f64>,
}

/// E2E P95 against offered load, log scale: solid at N requests, dashed at 2 x N. Where the two
/// part, the placement is past what the fleet (or the placement) can carry.
fn svg(loads: &[f64], curves: &[Curve], n: usize) -> String {
    let (w, h, ml, mr, mt, mb) = (760.0, 440.0, 64.0, 230.0, 20.0, 46.0);
    let vals: Vec<f64> =
        curves.iter().flat_map(|c| c.short.iter().chain(&c.long)).copied().filter(|v| *v > 0.0).collect();
    let lo = vals.iter().copied().fold(f64::MAX, f64::min).max(0.1).log10().floor();
    let hi = vals.iter().copied().fold(1.0, f64::max).log10().ceil().max(lo + 1.0);
    let (lmin, lmax) = (loads.iter().copied().fold(f64::MAX, f64::min), loads.iter().copied().fold(0.0, f64::max));
    let span = if lmax > lmin { lmax - lmin } else { 1.0 };
    let x = |l: f64| ml + (l - lmin) / span * (w - ml - mr);
    let y = |v: f64| h - mb - (v.max(0.1).log10() - lo) / (hi - lo) * (h - mb - mt);
    let colors = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{ml}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{ml}\" y1=\"{mt}\" x2=\"{ml}\" y2=\"{b}\" stroke=\"black\"/>\n",
        b = h - mb,
        r = w - mr,
    );
    for &l in loads {
        let _ = writeln!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{l}</text>", x(l), h - mb + 16.0);
    }
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        let _ = writeln!(
            s,
            "<line x1=\"{ml}\" y1=\"{py:.1}\" x2=\"{r}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>",
            ml - 6.0,
            y(v) + 4.0,
            py = y(v),
            r = w - mr,
        );
        e += 1.0;
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">offered load (x the trace's rate); y: E2E P95, simulated s (log)</text>",
        (w - mr + ml) / 2.0,
        h - 8.0
    );
    for (k, c) in curves.iter().enumerate() {
        let color = colors[k % colors.len()];
        for (vals, dash) in [(&c.short, ""), (&c.long, " stroke-dasharray=\"5,4\"")] {
            let pts: Vec<String> =
                loads.iter().zip(vals.iter()).map(|(l, v)| format!("{:.1},{:.1}", x(*l), y(*v))).collect();
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash}/>",
                pts.join(" ")
            );
        }
        let ly = mt + 14.0 + k as f64 * 18.0;
        let lx = w - mr + 12.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{}\">{}</text>",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            c.label
        );
    }
    let ly = mt + 14.0 + curves.len() as f64 * 18.0 + 8.0;
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{ly}\">solid: {n} requests</text>\n<text x=\"{}\" y=\"{}\">dashed: {} requests</text>\n</svg>",
        w - mr + 12.0,
        w - mr + 12.0,
        ly + 16.0,
        2 * n
    );
    s
}

/// A placement's tail grows by less than this when the run is twice as long: stable.
const STABLE_GROWTH: f64 = 1.25;

/// The parsed trace with its conversation ids.
struct Trace {
    requests: Vec<trace::TraceRequest>,
    conversations: Vec<String>,
}

impl Trace {
    fn load(path: &PathBuf) -> anyhow::Result<Trace> {
        let file = std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
        let (requests, issues) = trace::parse(std::io::BufReader::new(file));
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

/// The P95 ratios of each placement against round robin and against the clairvoyant bound
/// over `windows` stretches of `limit` requests spread over the trace, at each load: the
/// first `limit` requests alone (the table above, the real comparison) are one sample of a
/// chaotic system, where one burst decides a tail.
fn windows_report(md: &mut String, tr: &Trace, args: &Args, loads: &[f64], placements: &[Placement]) {
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let starts = tr.window_starts(args.windows);
    let _ = writeln!(
        md,
        "\n## Across the trace\n\n{} stretches of {} requests, starting at {} equally spaced times of the trace (the \
         first is the table's), at each load where the clairvoyant placement is stable: every placement's E2E P95 \
         against round robin's and against the clairvoyant bound's on the same stretch, mean and worst (largest) \
         over the stretches, and its failures summed.\n\n\
         | load | placement | p95 vs round robin, mean / worst | p95 vs clairvoyant, mean / worst | failures |\n\
         |---:|---|---:|---:|---:|",
        starts.len(),
        args.limit,
        starts.len(),
    );
    for &load in loads {
        // Per placement: (ratios to round robin, ratios to the bound, failures).
        let mut rows: Vec<(Vec<f64>, Vec<f64>, usize)> = vec![(Vec::new(), Vec::new(), 0); placements.len()];
        for &start in &starts {
            let specs = tr.specs(start, args.limit);
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
                args.limit * starts.len(),
            );
        }
        eprintln!("ailb-fleet-model: {} stretches at load {load} done", starts.len());
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.limit == 0 || args.a100 + args.rtx3090 == 0 || args.loads.iter().any(|l| !(*l > 0.0 && l.is_finite())) {
        bail!("--limit, the fleet and every --loads value must be positive");
    }
    let path = args.trace.clone().unwrap_or_else(replay::default_trace_path);
    let tr = Trace::load(&path)?;
    let short = tr.specs(0, args.limit);
    let long = tr.specs(0, args.limit * 2);
    let profiles = fleet_profiles(args.a100, args.rtx3090);
    let placements = [
        Placement::RoundRobin,
        Placement::LeastConnections,
        Placement::Ailb { a100_weight: args.a100_weight, load_factor: 1.25, affinity_wait_s: args.affinity_wait_s },
        Placement::EarliestFinish,
        Placement::CacheOracle,
    ];
    let unbounded = replay::oracle_prefix_hit_rate(&short).unwrap_or(0.0);
    let t0 = Instant::now();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Offered load vs placement, in simulated time\n\n\
         `ailb-fleet-model --limit {}`: {} x A100-80GB + {} x RTX 3090 (the `ailb-sim` presets), the Mooncake trace's \
         first {} requests (and {} for the stability check) at each load x the trace's arrival rate. Latencies \
         are simulated seconds (the real comparison runs the same model 20x faster). ailb: the kernel's pick \
         (`ailb_common::pick`) with weights {}:1, load factor 1.25, affinity and memory fit (free memory: the KV \
         pool less the memory hints in flight, as the kernel counts them), without connection latency. Prefix-cache hits: the share of prompt tokens found cached, and in brackets against \
         the prefix-cache oracle at the same load (every request sent to the GPU holding the longest cached run \
         of its prompt, the issue's \"placement that always returns a conversation to its cache\"); with caches \
         that never evict, {:.1} % would be cached.\n\n\
         Stable: the tail (E2E P95) at {} requests is under {STABLE_GROWTH}x the tail at {}; an unstable \
         placement's queue grows for as long as the run lasts, so its P95 measures the run's length.\n",
        args.limit,
        args.a100,
        args.rtx3090,
        short.len(),
        long.len(),
        args.a100_weight,
        unbounded * 100.0,
        long.len(),
        short.len(),
    );
    let _ = writeln!(
        md,
        "| load | placement | E2E p50 / p95 (s) | p95 vs round robin | TTFT p95 (s) | failures | util spread | \
         prefix hits (vs oracle) | affinity hits | p95 at {} requests | stable |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        long.len()
    );
    let mut stable_loads = Vec::new();
    let mut curves: Vec<Curve> =
        placements.iter().map(|p| Curve { label: p.label(), short: Vec::new(), long: Vec::new() }).collect();
    for &load in &args.loads {
        let mut rr_p95 = None;
        // Every placement's runs first: the rows compare prefix hits with the oracle's.
        let runs: Vec<(RunResult, RunResult)> =
            placements.iter().map(|p| (run(&short, &profiles, load, *p), run(&long, &profiles, load, *p))).collect();
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
    if args.windows > 0 {
        windows_report(&mut md, &tr, &args, &stable_loads, &placements);
    }
    print!("{md}");
    if let Some(out) = &args.out {
        std::fs::write(out, &md).with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&args.loads, &curves, short.len()))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
