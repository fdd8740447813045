//! `ailb-compare --shared-prefix --seeds N`: the shared-prefix race repeated on N workloads.
//!
//! Where every GPU's KV pool is full (a fleet of one GPU type with more tenants' system prompts
//! than it can cache), which tenant a request draws, and when, decides which prompts are still
//! cached; one run's TTFT P95 and cache share then move by more between runs than two good
//! routers differ in one run. So the goals are read over several seeds, each a whole comparison
//! of its own (`--out-dir/seed-S/`). The goals are those of the single run's report: ailb's best
//! prompt-token share from the cache at least the best peer's (over the prompts each served, and
//! over the same count), ailb's best TTFT P95 at most 0.8 x the best peer's.

use std::fmt::Write as _;

use super::super::args::Args;
use super::super::outcome::Outcome;
use super::{mean, ms, ratio, x, GOAL_RATIO};

/// One policy's numbers on one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub title: String,
    /// A peer router (a candidate for the best peer).
    pub peer: bool,
    /// ailb, either way in.
    pub ailb: bool,
    /// Prompt tokens from the GPUs' caches over the prompt tokens they served.
    pub cached: Option<f64>,
    /// The same tokens from the caches over the most prompt tokens any policy of the seed served.
    pub cached_of_most: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub failures: u64,
    pub requests: u64,
}

/// One seed's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRun {
    pub seed: u64,
    pub rows: Vec<Row>,
    /// The rows as the prefix pick's section reads them.
    pub versus: Vec<super::today::Versus>,
}

impl SeedRun {
    /// One seed's rows from its outcomes.
    pub fn of(seed: u64, outs: &[Outcome]) -> Self {
        let most =
            outs.iter().filter_map(|o| o.prefix_tokens.map(|(_, q)| q)).filter(|&q| q > 0.0).max_by(f64::total_cmp);
        let rows = outs
            .iter()
            .map(|o| Row {
                title: o.policy.title().to_string(),
                peer: super::super::peers::binary(o.policy).is_some(),
                ailb: o.policy.is_ailb(),
                cached: o.cached_share(),
                cached_of_most: o.prefix_tokens.zip(most).map(|((h, _), q)| h / q),
                ttft_p95_ms: o.pct("ttft_ms", "p95"),
                failures: o.failures(),
                requests: o.requests(),
            })
            .collect();
        SeedRun { seed, rows, versus: outs.iter().map(super::today::Versus::of).collect() }
    }

    /// The best value of `v` over the rows `pick` selects (the highest or the lowest), with its row.
    fn best(&self, pick: fn(&Row) -> bool, v: fn(&Row) -> Option<f64>, higher: bool) -> Option<(f64, &Row)> {
        self.rows.iter().filter(|r| pick(r)).filter_map(|r| v(r).map(|x| (x, r))).max_by(|a, b| {
            if higher {
                a.0.total_cmp(&b.0)
            } else {
                b.0.total_cmp(&a.0)
            }
        })
    }
}

/// A goal read on every seed: ailb's best against the best peer's.
struct Goal {
    what: &'static str,
    value: fn(&Row) -> Option<f64>,
    /// A higher value is better.
    higher: bool,
    met: fn(f64) -> bool,
    goal: &'static str,
    show: fn(f64) -> String,
}

fn share(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

fn latency(v: f64) -> String {
    format!("{v:.0} ms")
}

const GOALS: [Goal; 3] = [
    Goal {
        what: "prompt tokens from the cache",
        value: |r| r.cached,
        higher: true,
        met: |q| q >= 1.0,
        goal: ">= 1.00x",
        show: share,
    },
    Goal {
        what: "prompt tokens from the cache, over the most prompts served",
        value: |r| r.cached_of_most,
        higher: true,
        met: |q| q >= 1.0,
        goal: ">= 1.00x",
        show: share,
    },
    Goal {
        what: "TTFT P95",
        value: |r| r.ttft_p95_ms,
        higher: false,
        met: |q| q <= GOAL_RATIO,
        goal: "<= 0.80x",
        show: latency,
    },
];

/// Runs the shared-prefix comparison once per seed, then writes and prints `seeds.md`.
pub fn main(args: &Args) -> anyhow::Result<()> {
    let runs = super::each_seed(args, |seed, _, _, outs| SeedRun::of(seed, outs))?;
    super::write_summary(args, &markdown(args, &runs))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), share)
}

/// The summary of `runs` (one per seed, in order).
pub fn markdown(args: &Args, runs: &[SeedRun]) -> String {
    let mut s = String::new();
    let seeds: Vec<String> = runs.iter().map(|r| r.seed.to_string()).collect();
    let _ = writeln!(
        s,
        "# Policies compared over {} seeds of the shared-prefix workload\n\n\
         Fleet: {} x A100-80GB + {} x RTX 3090 24GB (`ailb-sim`), time scale x{}. Workload: {} requests per seed, \
         {} tenants, a system prompt of {} blocks of 512 tokens each, questions of {} block(s), {} requests/s offered \
         at {} x, seeds {}. Each seed's full report is in `seed-S/replay.md`. Prompt tokens from the cache are the \
         simulated GPUs' own counters; \"of the most served\" divides by the most prompt tokens any policy of that \
         seed served.\n",
        runs.len(),
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.limit,
        args.tenants,
        args.system_blocks,
        args.question_blocks,
        args.rate,
        args.load,
        seeds.join(", ")
    );
    s.push_str(
        "| seed | policy | from the cache (of the prompts served) | of the most served | TTFT P95 (ms) | failures |\n\
         |---:|---|---:|---:|---:|---:|\n",
    );
    for run in runs {
        for r in &run.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} of {} |",
                run.seed,
                r.title,
                pct(r.cached),
                pct(r.cached_of_most),
                ms(r.ttft_p95_ms),
                r.failures,
                r.requests
            );
        }
    }
    against_best_peer(&mut s, runs);
    let versus: Vec<(u64, &[super::today::Versus])> = runs.iter().map(|r| (r.seed, r.versus.as_slice())).collect();
    super::today::section(&mut s, &versus);
    s
}

/// Per goal and seed, ailb's best against the best peer's; then per goal the mean of the ratios
/// and the seeds that met it.
fn against_best_peer(s: &mut String, runs: &[SeedRun]) {
    let peer = |r: &Row| r.peer;
    let ailb = |r: &Row| r.ailb;
    if runs.iter().all(|run| !run.rows.iter().any(peer) || !run.rows.iter().any(ailb)) {
        s.push_str("\nNo seed ran both ailb and a peer router: nothing to compare.\n");
        return;
    }
    s.push_str(
        "\n## ailb's best against the best peer's, per seed\n\n\
         | seed | goal | ailb's best | the best peer's | ratio | met |\n\
         |---:|---|---|---|---:|---|\n",
    );
    let mut summary = Vec::new();
    for goal in &GOALS {
        let (mut ratios, mut met) = (Vec::new(), 0);
        for run in runs {
            let (Some((a, ra)), Some((b, rb))) =
                (run.best(ailb, goal.value, goal.higher), run.best(peer, goal.value, goal.higher))
            else {
                continue;
            };
            let Some(q) = ratio(Some(a), Some(b)) else { continue };
            ratios.push(q);
            let ok = (goal.met)(q);
            met += usize::from(ok);
            let _ = writeln!(
                s,
                "| {} | {} | {} ({}) | {} ({}) | {} | {} |",
                run.seed,
                goal.what,
                (goal.show)(a),
                ra.title,
                (goal.show)(b),
                rb.title,
                x(Some(q)),
                if ok { "yes" } else { "no" }
            );
        }
        summary.push((goal, mean(&ratios), met, ratios.len()));
    }
    s.push_str(
        "\n**Over the seeds** (the mean of the per-seed ratios):\n\n\
         | goal | mean ratio | seeds that met it |\n|---|---:|---:|\n",
    );
    for (goal, m, met, n) in summary {
        let verdict = match m {
            Some(m) if (goal.met)(m) => "met on the mean",
            Some(_) => "not met on the mean",
            None => "n/a",
        };
        let _ = writeln!(s, "| {} ({}) | {} ({verdict}) | {met} of {n} |", goal.what, goal.goal, x(m));
    }
    failures(s, runs);
}

/// Every policy's failures summed over the seeds.
fn failures(s: &mut String, runs: &[SeedRun]) {
    let mut titles: Vec<&str> = Vec::new();
    for r in runs.iter().flat_map(|r| &r.rows) {
        if !titles.contains(&r.title.as_str()) {
            titles.push(&r.title);
        }
    }
    let _ = writeln!(s, "\nFailures over the seeds: {}.", {
        let each: Vec<String> = titles
            .iter()
            .map(|t| {
                let (f, n) = runs
                    .iter()
                    .flat_map(|r| &r.rows)
                    .filter(|r| r.title == *t)
                    .fold((0, 0), |(f, n), r| (f + r.failures, n + r.requests));
                format!("{t} {f} of {n}")
            })
            .collect();
        each.join(", ")
    });
}

#[cfg(test)]
mod tests;
