//! The Markdown report and the JSON numbers of a comparison.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::args::Args;
use super::outcome::{common_p95, Outcome};
use super::policy::Policy;
use super::Workload;

/// The report: the setup, one row per policy, the oracle's prefix hits, ailb against the L4
/// baselines, how to read the figures, the GPUs one by one, failures and wall times.
pub fn markdown(args: &Args, outs: &[Outcome], workload: &Workload) -> String {
    let mut s = String::new();
    setup(&mut s, args);
    policy_table(&mut s, outs);
    oracle(&mut s, outs, workload);
    against_baselines(&mut s, outs);
    method(&mut s);
    per_gpu(&mut s, outs);
    failures_and_wall_times(&mut s, outs);
    s
}

/// The numbers of every policy, for `--json`.
pub fn json(outs: &[Outcome], workload: &Workload) -> Value {
    let v: Vec<Value> = outs
        .iter()
        .map(|o| {
            json!({
                "policy": o.policy.key(), "summary": o.summary, "e2e_p95_common_ms": common_p95(outs, o),
                "util_mean": o.util_mean(), "util_spread": o.util_spread(), "wall_s": o.wall_s,
                "util_mean_arrivals": o.window_mean(), "util_spread_arrivals": o.window_spread(),
                "window_s": o.window_s,
            })
        })
        .collect();
    json!({
        "policies": v,
        "oracle_prefix_hit_rate": workload.oracle_prefix_hit_rate,
        "unbounded_prefix_hit_rate": workload.unbounded_prefix_hit_rate,
    })
}

fn f1(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.0}"))
}

fn pct1(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{:.1} %", v * 100.0))
}

/// The title, the fleet and the workload.
fn setup(s: &mut String, args: &Args) {
    let described = if args.synthetic {
        format!("synthetic mix, {} requests, {} conversations/s (seed {})", args.limit, args.rate, args.seed)
    } else {
        format!("Mooncake conversation trace, first {} requests", args.limit)
    };
    let _ = writeln!(s, "# Policies compared on one simulated fleet\n");
    let _ = writeln!(
        s,
        "Fleet: {} x A100-80GB + {} x RTX 3090 24GB (`ailb-sim`, 7B fp16 model), time scale x{}. \
         Workload: {described}, offered at {} x the trace's rate (replay speed {}). Every policy gets a \
         freshly started fleet (empty KV caches) and a fresh `ailb run` (nginx: a fresh nginx and no ailb); the replay client runs in the \
         attached child cgroup.\n",
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.load,
        args.speed()
    );
}

/// One row per policy: latencies, failures, cache and affinity hits, throughput, utilisation.
fn policy_table(s: &mut String, outs: &[Outcome]) {
    let _ = writeln!(
        s,
        "| policy | TTFT p50 / p95 / p99 (ms) | E2E p50 / p95 / p99 (ms) | E2E p95, requests all served (ms) | \
         failures | prefix-cache hits | affinity hits | tokens/s | GPU util mean | util spread (max-min) | \
         util spread while arriving |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in outs {
        let _ = writeln!(
            s,
            "| {} | {} / {} / {} | {} / {} / {} | {} | {} of {} ({}) | {} | {} | {:.0} | {:.1} % | {:.1} pts | {:.1} pts |",
            o.policy.title(),
            f1(o.pct("ttft_ms", "p50")),
            f1(o.pct("ttft_ms", "p95")),
            f1(o.pct("ttft_ms", "p99")),
            f1(o.pct("e2e_ms", "p50")),
            f1(o.pct("e2e_ms", "p95")),
            f1(o.pct("e2e_ms", "p99")),
            f1(common_p95(outs, o)),
            o.failures(),
            o.requests(),
            pct1(o.summary["failure_rate"].as_f64()),
            pct1(o.summary["prefix_cache_hit_rate"].as_f64()),
            o.summary["affinity_hit_rate"].as_f64().map_or_else(|| "n/a".into(), |v| format!("{:.1} %", v * 100.0)),
            o.summary["token_throughput"].as_f64().unwrap_or(0.0),
            o.util_mean() * 100.0,
            o.util_spread() * 100.0,
            o.window_spread() * 100.0,
        );
    }
}

/// ailb's prefix-cache hits against the oracle placement's and the never-evicting caches'.
fn oracle(s: &mut String, outs: &[Outcome], workload: &Workload) {
    if let Some(a) =
        outs.iter().find(|o| o.policy == Policy::Ailb).and_then(|o| o.summary["prefix_cache_hit_rate"].as_f64())
    {
        let oracle = workload.oracle_prefix_hit_rate;
        let unbounded = workload.unbounded_prefix_hit_rate.unwrap_or(0.0);
        let bound = if unbounded > oracle * 1.1 {
            format!(
                "Caches that never evict would hold {:.1} % of the prompt tokens: no placement gets there, because a \
                 conversation's next turn comes after the GPUs have filled their KV pools many times over (see \
                 `ailb-fleet-model`).",
                unbounded * 100.0
            )
        } else {
            format!(
                "Caches that never evict would hold {:.1} % of the prompt tokens: here the GPUs' own caches keep a \
                 conversation's prefix until its next turn, so the oracle placement gets as much.",
                unbounded * 100.0
            )
        };
        let _ = writeln!(
            s,
            "\nPrefix-cache hits of the oracle placement (every request sent to the GPU that holds the longest \
             cached run of its conversation's blocks, same GPUs, same caches, same load; computed in simulated \
             time by `ailb_sim::fleet_model`, the model `ailb-sim` serves): {:.1} %; ailb reaches {:.0} % of it \
             (the goal: >= 90 %). {bound}",
            oracle * 100.0,
            if oracle > 0.0 { a / oracle * 100.0 } else { 0.0 },
        );
    }
}

/// ailb in full against round robin and random L4.
fn against_baselines(s: &mut String, outs: &[Outcome]) {
    let get = |p: Policy| outs.iter().find(|o| o.policy == p);
    for base in [Policy::RoundRobin, Policy::Random] {
        let (Some(a), Some(r)) = (get(Policy::Ailb), get(base)) else { continue };
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "n/a".into(),
        };
        let fr = |o: &Outcome| o.summary["failure_rate"].as_f64();
        let _ = writeln!(
            s,
            "\nailb / {}: E2E p95 {}, E2E p95 over the requests all served {}, TTFT p95 {}, failure rate {} \
             ({} vs {} failures); GPU utilisation spread {:.1} vs {:.1} points.",
            base.title(),
            ratio(a.pct("e2e_ms", "p95"), r.pct("e2e_ms", "p95")),
            ratio(common_p95(outs, a), common_p95(outs, r)),
            ratio(a.pct("ttft_ms", "p95"), r.pct("ttft_ms", "p95")),
            ratio(fr(a), fr(r)),
            a.failures(),
            r.failures(),
            a.util_spread() * 100.0,
            r.util_spread() * 100.0,
        );
    }
}

/// How to read the figures above.
fn method(s: &mut String) {
    let _ = writeln!(
        s,
        "\nLatencies are of the successful requests; a policy that fails the largest requests drops them from \
         its own percentiles, so the column \"requests all served\" takes P95 over the requests that every \
         policy served. Affinity hits: the share of a conversation's later turns served by the same GPU as \
         the turn before (`ailb-sim` names itself in `x-ailb-backend`). Only ailb's sockets carry the conversation and memory \
         tags; the others connect untagged, as to an L4 or L7 balancer that knows neither. GPU utilisation: `/sim/state` `utilization` (the busy \
         share of the last sampling interval, as NVML's) sampled every 250 ms from the first request to the last answer, mean per GPU, then mean and max - min over the GPUs (the \
         spread: a GPU left with a long queue works on alone while others idle). \"While arriving\" takes only the samples up to \
         the last planned arrival: near 0 for every policy when the offered load saturates all GPUs in that window.\n"
    );
}

/// Every GPU under every policy.
fn per_gpu(s: &mut String, outs: &[Outcome]) {
    let _ = writeln!(s, "Per GPU (sampled utilisation mean / busy share since start / prefix-cache hit share):\n");
    let _ = write!(s, "| GPU |");
    for o in outs {
        let _ = write!(s, " {} |", o.policy.title());
    }
    let _ = writeln!(s, "\n|---|{}", "---:|".repeat(outs.len()));
    if let Some(first) = outs.first() {
        for (i, g) in first.gpus.iter().enumerate() {
            let _ = write!(s, "| {} {} |", g.host(), g.profile);
            for o in outs {
                if let Some(g) = o.gpus.get(i) {
                    let _ =
                        write!(s, " {:.0} % / {:.0} % / {} |", g.util_mean * 100.0, g.busy * 100.0, pct1(g.prefix_hit));
                }
            }
            let _ = writeln!(s);
        }
    }
}

/// Failures by kind and wall time, per policy.
fn failures_and_wall_times(s: &mut String, outs: &[Outcome]) {
    let _ = writeln!(s, "\nFailures by kind: {}.", {
        outs.iter()
            .map(|o| {
                let kinds: Vec<String> = o.failure_kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
                format!("{}: {}", o.policy.title(), if kinds.is_empty() { "none".into() } else { kinds.join(", ") })
            })
            .collect::<Vec<_>>()
            .join("; ")
    });
    let _ = writeln!(s, "\nWall time per policy: {}.", {
        outs.iter().map(|o| format!("{} {:.1} s", o.policy.title(), o.wall_s)).collect::<Vec<_>>().join(", ")
    });
}

/// The peer routers' section, empty when the run asked for none: the settings of those that
/// ran (their command lines, the port being the policy's own), and a row for each one that is
/// not installed.
pub fn peers(outs: &[Outcome], not_run: &[(Policy, String)]) -> String {
    let ran: Vec<Policy> = outs.iter().map(|o| o.policy).filter(|p| super::peers::binary(*p).is_some()).collect();
    if ran.is_empty() && not_run.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n## Peer routers\n\n| policy | settings |\n|---|---|\n");
    for p in ran {
        let workers = ["http://GPU...".to_string()];
        let at = |ip: [u8; 4]| std::net::SocketAddrV4::new(ip.into(), 0);
        let args = super::peers::args(p, at([127, 0, 10, 250]), at([127, 0, 10, 249]), &workers);
        let line = args.join(" ").replace("-port 0", "-port PORT");
        let bin = super::peers::binary(p).unwrap_or_default();
        let _ = writeln!(s, "| {} | `{bin} {line}`, defaults otherwise |", p.title());
    }
    for (p, why) in not_run {
        let _ = writeln!(s, "| {} | {why} |", p.title());
    }
    s
}
