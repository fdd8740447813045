//! `ailb-compare --synthetic --seeds N`: the comparison repeated on N synthetic workloads
//! (`--shared-prefix --seeds N`: [`prefix`]).
//!
//! On the synthetic mix a run's tail and its utilisation spread are set by a handful of long
//! conversations (a tenth of them, each turn about 800 output tokens): which GPU each lands on,
//! and which ends last while the others idle. One seed is one draw of those, and one policy's
//! spread moves more from one seed to the next than two policies' differ on one seed. So the
//! goals are read over several seeds. Each seed's run is a whole comparison of its own
//! (`--out-dir/seed-S/`); `seeds.md` gives per seed every policy's P95s, failures and spread,
//! the clairvoyant placement's E2E P95 on the same requests and load (the fleet model,
//! [`ailb_sim::fleet_model`], in real time at `--time-scale`), each ailb row against that
//! seed's best peer, and the means over the seeds.
//!
//! The clairvoyant placement (each request to the GPU where it would finish first, knowing every
//! queue) is not a proof of optimality, but no balancer knows more: where 0.8 x the best peer's
//! E2E P95 is below its P95, the 0.8x goal asks for more than placement can give on that seed,
//! and the summary says so.

use std::fmt::Write as _;

use ailb_sim::fleet_model::{self, Placement};
use anyhow::Context;

use super::args::Args;
use super::outcome::Outcome;

/// The goal on E2E and TTFT P95 against the best peer.
pub const GOAL_RATIO: f64 = 0.8;

/// One policy's numbers on one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub title: String,
    /// A peer router (a candidate for the best peer).
    pub peer: bool,
    /// ailb, either way in (compared with the best peer).
    pub ailb: bool,
    pub ttft_p95_ms: Option<f64>,
    pub e2e_p95_ms: Option<f64>,
    pub failures: u64,
    pub requests: u64,
    /// Utilisation spread, points.
    pub spread: f64,
}

impl Row {
    pub fn of(o: &Outcome) -> Self {
        Row {
            title: o.policy.title().to_string(),
            peer: super::peers::binary(o.policy).is_some(),
            ailb: o.policy.is_ailb(),
            ttft_p95_ms: o.pct("ttft_ms", "p95"),
            e2e_p95_ms: o.pct("e2e_ms", "p95"),
            failures: o.failures(),
            requests: o.requests(),
            spread: o.util_spread() * 100.0,
        }
    }
}

/// One seed's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRun {
    pub seed: u64,
    /// The clairvoyant placement's E2E P95 on the same requests and load, real ms.
    pub clairvoyant_p95_ms: f64,
    pub rows: Vec<Row>,
    /// The rows as the prefix pick's section reads them.
    pub versus: Vec<today::Versus>,
}

impl SeedRun {
    /// The peer with the lowest E2E P95 on this seed.
    pub fn best_peer(&self) -> Option<&Row> {
        self.rows
            .iter()
            .filter(|r| r.peer)
            .filter_map(|r| r.e2e_p95_ms.map(|p| (p, r)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, r)| r)
    }
}

pub mod prefix;
pub mod today;

/// Runs the comparison once per seed, then writes and prints `seeds.md`.
pub fn main(args: &Args) -> anyhow::Result<()> {
    if args.shared_prefix {
        return prefix::main(args);
    }
    let profiles = fleet_model::fleet_profiles(args.a100, args.rtx3090);
    let runs = each_seed(args, |seed, one, specs, outs| {
        let clairvoyant = fleet_model::run(specs, &profiles, one.load, Placement::EarliestFinish);
        SeedRun {
            seed,
            clairvoyant_p95_ms: clairvoyant.e2e_percentile(0.95) * 1000.0 / one.time_scale,
            rows: outs.iter().map(Row::of).collect(),
            versus: outs.iter().map(today::Versus::of).collect(),
        }
    })?;
    write_summary(args, &markdown(args, &runs))
}

/// The whole comparison on each seed of `args` (its own `--out-dir/seed-S/`), each seed's
/// outcomes summed up by `summary` (given the seed, its arguments, its requests and outcomes).
fn each_seed<T>(
    args: &Args,
    mut summary: impl FnMut(u64, &Args, &[ailb_sim::replay::RequestSpec], &[Outcome]) -> T,
) -> anyhow::Result<Vec<T>> {
    let mut runs = Vec::new();
    for (k, seed) in (args.seed..args.seed + args.seeds).enumerate() {
        let mut one = args.clone();
        one.seed = seed;
        one.seeds = 1;
        one.json = None;
        one.out_dir = args.out_dir.join(format!("seed-{seed}"));
        eprintln!("ailb-compare: seed {seed} ({} of {}) -> {}", k + 1, args.seeds, one.out_dir.display());
        let specs = super::build_specs(&one)?;
        let (outs, _) = super::compare(&one, &specs)?;
        runs.push(summary(seed, &one, &specs, &outs));
    }
    Ok(runs)
}

/// Writes `md` as `--out-dir/seeds.md` and prints it.
fn write_summary(args: &Args, md: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    let path = args.out_dir.join("seeds.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    Ok(())
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn x(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.2}x"))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.0}"))
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The summary of `runs` (one per seed, in order).
pub fn markdown(args: &Args, runs: &[SeedRun]) -> String {
    let mut s = String::new();
    let seeds: Vec<String> = runs.iter().map(|r| r.seed.to_string()).collect();
    let _ = writeln!(
        s,
        "# Policies compared over {} seeds of the synthetic mix\n\n\
         Fleet: {} x A100-80GB + {} x RTX 3090 24GB (`ailb-sim`), time scale x{}, load {}, {} requests per seed, \
         seeds {}. Each seed's full report is in `seed-S/replay.md`. Times are real milliseconds; the clairvoyant \
         placement's E2E P95 comes from the fleet model on the same requests and load (each request sent where it \
         would finish first, knowing every queue: what placement alone can do).\n",
        runs.len(),
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.load,
        args.limit,
        seeds.join(", ")
    );
    if args.ailb_table_seed != 0 {
        let _ = writeln!(s, "{}\n", super::report::table_seed_line(args.ailb_table_seed));
    }
    s.push_str(
        "| seed | policy | TTFT P95 (ms) | E2E P95 (ms) | E2E P95 / clairvoyant | failures | util spread |\n\
         |---:|---|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        let _ = writeln!(
            s,
            "| {} | clairvoyant placement (fleet model) | | {:.0} | 1.00x | | |",
            run.seed, run.clairvoyant_p95_ms
        );
        for r in &run.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} of {} | {:.1} pts |",
                run.seed,
                r.title,
                ms(r.ttft_p95_ms),
                ms(r.e2e_p95_ms),
                x(ratio(r.e2e_p95_ms, Some(run.clairvoyant_p95_ms))),
                r.failures,
                r.requests,
                r.spread
            );
        }
    }
    against_best_peer(&mut s, runs);
    let versus: Vec<(u64, &[today::Versus])> = runs.iter().map(|r| (r.seed, r.versus.as_slice())).collect();
    today::section(&mut s, &versus);
    s
}

/// Each ailb row against its seed's best peer, then the means over the seeds.
fn against_best_peer(s: &mut String, runs: &[SeedRun]) {
    if runs.iter().all(|r| r.best_peer().is_none()) {
        s.push_str("\nNo peer router ran: nothing to compare ailb with.\n");
        return;
    }
    let _ = write!(
        s,
        "\n## Against the best peer of each seed\n\n\
         The best peer: the peer router with the lowest E2E P95 on that seed. \"Clairvoyant / best peer\": the \
         lowest E2E ratio placement can reach there: where it is over {GOAL_RATIO}x, no placement reaches the goal on \
         that seed.\n\n\
         | seed | ailb | best peer | TTFT P95 | E2E P95 | clairvoyant / best peer | failures (ailb / peer) | spread (ailb / peer) |\n\
         |---:|---|---|---:|---:|---:|---:|---:|\n"
    );
    let mut titles: Vec<&str> = Vec::new();
    for r in runs.iter().flat_map(|r| &r.rows).filter(|r| r.ailb) {
        if !titles.contains(&r.title.as_str()) {
            titles.push(&r.title);
        }
    }
    for run in runs {
        let Some(b) = run.best_peer() else { continue };
        for a in run.rows.iter().filter(|r| r.ailb) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} / {} | {:.1} / {:.1} pts |",
                run.seed,
                a.title,
                b.title,
                x(ratio(a.ttft_p95_ms, b.ttft_p95_ms)),
                x(ratio(a.e2e_p95_ms, b.e2e_p95_ms)),
                x(ratio(Some(run.clairvoyant_p95_ms), b.e2e_p95_ms)),
                a.failures,
                b.failures,
                a.spread,
                b.spread
            );
        }
    }
    let _ = write!(
        s,
        "\n**Means over the seeds** (of the per-seed ratios; failures summed):\n\n\
         | ailb | TTFT P95 / best peer | E2E P95 / best peer | seeds with E2E at or under {GOAL_RATIO}x | seeds where the clairvoyant placement is over {GOAL_RATIO}x | failures (ailb / peer) | spread (ailb / peer) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n"
    );
    for title in titles {
        let (mut ttft, mut e2e, mut spread_a, mut spread_b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut met, mut beyond, mut seeds, mut fail_a, mut fail_b) = (0, 0, 0, 0, 0);
        for run in runs {
            let (Some(b), Some(a)) = (run.best_peer(), run.rows.iter().find(|r| r.ailb && r.title == title)) else {
                continue;
            };
            seeds += 1;
            ttft.extend(ratio(a.ttft_p95_ms, b.ttft_p95_ms));
            if let Some(r) = ratio(a.e2e_p95_ms, b.e2e_p95_ms) {
                e2e.push(r);
                met += usize::from(r <= GOAL_RATIO);
            }
            beyond += usize::from(ratio(Some(run.clairvoyant_p95_ms), b.e2e_p95_ms).is_some_and(|r| r > GOAL_RATIO));
            fail_a += a.failures;
            fail_b += b.failures;
            spread_a.push(a.spread);
            spread_b.push(b.spread);
        }
        let pts = |v: &[f64]| mean(v).map_or_else(|| "n/a".into(), |m| format!("{m:.1}"));
        let _ = writeln!(
            s,
            "| {title} | {} | {} | {met} of {seeds} | {beyond} of {seeds} | {fail_a} / {fail_b} | {} / {} pts |",
            x(mean(&ttft)),
            x(mean(&e2e)),
            pts(&spread_a),
            pts(&spread_b)
        );
    }
}

#[cfg(test)]
mod tests;
