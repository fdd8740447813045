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
    from_the_cache(&mut s, outs);
    oracle(&mut s, outs, workload);
    against_baselines(&mut s, outs);
    against_best_peer(&mut s, outs);
    router_cpu(&mut s, outs);
    weight_stability(&mut s, outs);
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
            let mut p = json!({
                "policy": o.policy.key(), "summary": o.summary, "e2e_p95_common_ms": common_p95(outs, o),
                "util_mean": o.util_mean(), "util_spread": o.util_spread(), "wall_s": o.wall_s,
                "util_mean_arrivals": o.window_mean(), "util_spread_arrivals": o.window_spread(),
                "window_s": o.window_s,
            });
            // Only where measured, so that a report of a run without a router reads as before.
            for (k, v) in [("router_cpu_s", o.router_cpu_s), ("daemon_cpu_s", o.daemon_cpu_s)] {
                if let Some(v) = v {
                    p[k] = json!(v);
                }
            }
            if let Some(w) = &o.weights {
                p["weights"] = json!(w);
            }
            if let Some((hit, asked)) = o.prefix_tokens {
                p["prefix_tokens"] = json!({"from_cache": hit, "prompt": asked, "share": o.cached_share()});
            }
            p
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

/// The trace a run replayed, as the report names it: the shipped Mooncake trace by its path in
/// the repository, any other by the path it was given.
fn trace_name(args: &Args) -> String {
    let path = args.trace.clone().unwrap_or_else(ailb_sim::replay::default_trace_path);
    let shipped = std::path::Path::new(ailb_sim::replay::SHIPPED_TRACE);
    let same = |a: &std::path::Path, b: &std::path::Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(&path, shipped) {
        "`tests/data/mooncake-conversation.jsonl.gz` (the Mooncake conversation trace shipped here)".to_string()
    } else {
        format!("`{}`", path.display())
    }
}

/// The title, the fleet and the workload.
fn setup(s: &mut String, args: &Args) {
    let described = if args.shared_prefix {
        let o = args.shared_prefix_opts();
        format!(
            "shared prefix, {} requests: {} tenants, each a system prompt of {} blocks of 512 tokens shared by its \
             users, every request a different user's question of {} block(s) (the last 128 to 512 tokens) under a \
             tenant drawn uniformly, about {} output tokens (uniform in half to 1.5 times), no conversation (no \
             session header, no conversation tag), Poisson arrivals at {} requests/s (seed {})",
            o.requests, o.tenants, o.system_blocks, o.question_blocks, o.output_tokens, o.requests_per_s, o.seed
        )
    } else if args.synthetic {
        format!("synthetic mix, {} requests, {} conversations/s (seed {})", args.limit, args.rate, args.seed)
    } else {
        format!("the trace {}, first {} requests", trace_name(args), args.limit)
    };
    let base = if args.synthetic || args.shared_prefix { "that rate" } else { "the trace's rate" };
    let _ = writeln!(s, "# Policies compared on one simulated fleet\n");
    let _ = writeln!(
        s,
        "Fleet: {} x A100-80GB + {} x RTX 3090 24GB (`ailb-sim`, 7B fp16 model), time scale x{}. \
         Workload: {described}, offered at {} x {base} (replay speed {}). Every policy gets a \
         freshly started fleet (empty KV caches) and a fresh `ailb run` (nginx: a fresh nginx and no ailb); the replay client runs in the \
         attached child cgroup.\n",
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.load,
        args.speed()
    );
    if args.ailb_keys_only {
        let _ = writeln!(
            s,
            "**`--ailb-keys-only`**: ailb's prefix policies make and send their keys, but their model has no \
             `prefix` mode: the kernel ignores the keys and the daemon follows no KV events (the cost of making the \
             keys alone).\n"
        );
    }
    if args.ailb_table_seed != 0 {
        let _ = writeln!(s, "{}\n", table_seed_line(args.ailb_table_seed));
    }
}

/// What `--ailb-table-seed` changes, for the reports of a run with one.
pub fn table_seed_line(seed: u64) -> String {
    format!(
        "**`--ailb-table-seed {seed}`**: every ailb gateway lays out its weighted tables with `[balancer] seed = {seed}` \
         (the default is 0): the same pick, with a fresh draw of which backend each hash lands on."
    )
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

/// The prompt tokens the GPUs served from their prefix caches, by their own count, with TTFT and
/// failures, per policy; then ailb's best against the best peer's on each (the goal of the
/// prefix-aware pick: at least the best peer's tokens from the cache, TTFT P95 at most 0.8 x the
/// best peer's, failures no more than ailb's without it). Only when the GPUs' counters were read.
fn from_the_cache(s: &mut String, outs: &[Outcome]) {
    if outs.iter().all(|o| o.prefix_tokens.is_none()) {
        return;
    }
    cache_table(s, outs);
    prefix_pick_counters(s, outs);
    front_door_counters(s, outs);
    let peers: Vec<&Outcome> = outs.iter().filter(|o| super::peers::binary(o.policy).is_some()).collect();
    let ailbs: Vec<&Outcome> = outs.iter().filter(|o| o.policy.is_ailb()).collect();
    if peers.is_empty() || ailbs.is_empty() {
        return;
    }
    best_against_best_peer(s, &ailbs, &peers);
    failures_against_today(s, outs);
}

/// Per policy: its prompt tokens from the cache (over the prompts it served, and over the most
/// any policy served), TTFT and failures.
fn cache_table(s: &mut String, outs: &[Outcome]) {
    let _ = writeln!(
        s,
        "\nPrompt tokens from the cache (the simulated GPUs' own counters, `prefix_hit_tokens` over \
         `prefix_query_tokens`, summed over the fleet). The GPUs count only the prompts they served, so a policy \
         that fails requests divides by less; the second column divides every policy's cached tokens by the same \
         count, the most prompt tokens any policy's GPUs served (every prompt offered, where a policy served all): \
         a failed request's prompt came from no cache.\n\n\
         | policy | prompt tokens from the cache (of the prompts served) | of the most prompts served | TTFT p50 / p95 \
         (ms) | failures |\n|---|---:|---:|---:|---:|"
    );
    let most = most_prompt_tokens_served(outs);
    for o in outs {
        let tokens = o
            .prefix_tokens
            .map_or_else(|| "n/a".to_string(), |(h, q)| format!("{} ({:.0} of {:.0})", pct1(o.cached_share()), h, q));
        let _ = writeln!(
            s,
            "| {} | {tokens} | {} | {} / {} | {} of {} |",
            o.policy.title(),
            pct1(share_of_most_served(o, most)),
            f1(o.pct("ttft_ms", "p50")),
            f1(o.pct("ttft_ms", "p95")),
            o.failures(),
            o.requests()
        );
    }
}

/// The most prompt tokens any policy's GPUs served: every prompt offered, where a policy served
/// all; `None` when no policy's GPUs were read.
fn most_prompt_tokens_served<'a>(outs: impl IntoIterator<Item = &'a Outcome>) -> Option<f64> {
    outs.into_iter().filter_map(|o| o.prefix_tokens.map(|(_, q)| q)).filter(|&q| q > 0.0).max_by(f64::total_cmp)
}

/// A policy's tokens from the cache over the most prompt tokens any policy served.
fn share_of_most_served(o: &Outcome, most: Option<f64>) -> Option<f64> {
    let (h, _) = o.prefix_tokens?;
    most.map(|q| h / q)
}

/// The kernel's prefix pick counters of the policies that read them, and what they predicted
/// cached against what the GPUs served from their caches.
fn prefix_pick_counters(s: &mut String, outs: &[Outcome]) {
    for o in outs.iter().filter(|o| !o.prefix_counters.is_empty()) {
        let c = |k: &str| o.prefix_counters.get(k).copied().unwrap_or(0.0);
        let (predicted, how) = predicted_cached(o.policy, &c);
        let _ = writeln!(
            s,
            "\n{}: the kernel's prefix pick (`ailb_prefix_*` at the end): {:.0} connects with keys, {:.0} found a \
             holder, {:.0} used one, {:.0} overruled by load, {:.0} by memory; keys found {:.0} of {:.0} sent{}; {:.0} \
             entries; {:.0} lookups in the map ({:.2} per connect, the filter in front of it sparing the others). \
             Predicted cached ({how}): {}; the GPUs report {} of the prompt tokens \
             served from their caches.",
            o.policy.title(),
            c("lookups"),
            c("found"),
            c("used"),
            c("overruled_load"),
            c("overruled_memory"),
            c("keys_found"),
            c("keys_sent"),
            if o.policy.prefix_mode() == Some("precise") {
                format!(" ({:.0} of them held by an engine's report, the rest by evicted holders)", c("keys_exact"))
            } else {
                String::new()
            },
            c("entries"),
            c("map_lookups"),
            c("map_lookups") / c("lookups").max(1.0),
            pct1(predicted),
            pct1(o.cached_share())
        );
    }
}

/// What the front door's own counters say: the requests that opened a connection (a kernel
/// pick, so prefix keys made) and those sent on a kept one, and the time its keys took.
fn front_door_counters(s: &mut String, outs: &[Outcome]) {
    for o in outs {
        let Some(f) = &o.front_door else { continue };
        let keys = if f.keys_made > 0.0 {
            let p95 =
                f.keys_quantile_at_most(0.95).map_or_else(|| "over 0.8 s".into(), |le| format!("{:.2} ms", le * 1e3));
            format!(
                "; prefix keys made for {:.0} of them (`ailb_gateway_prefix_keys_seconds`), {:.3} ms on average, P95 at \
                 most {p95}",
                f.keys_made,
                f.keys_s * 1e3 / f.keys_made
            )
        } else {
            String::new()
        };
        let withheld = if f.withheld_placed + f.withheld_asked > 0.0 {
            format!(
                "; {:.0} later turns opened theirs with the keys withheld (`ailb_gateway_prefix_keys_withheld`): {:.0} \
                 placed by the kernel without them, {:.0} asked for them",
                f.withheld_placed + f.withheld_asked,
                f.withheld_placed,
                f.withheld_asked
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "\n{}: the front door opened {:.0} upstream connections (each a kernel pick) and sent {:.0} requests on \
             kept ones{keys}{withheld}.",
            o.policy.title(),
            f.fresh,
            f.kept
        );
    }
}

/// What the router predicted cached, over the keys sent (every k-th block's and the last, so a
/// share of the prompt in blocks), and how it was counted: in precise mode the keys an engine
/// reports held (a holder evicted within the lifetime predicts nothing cached), else every
/// key found.
pub fn predicted_cached(policy: Policy, c: &dyn Fn(&str) -> f64) -> (Option<f64>, &'static str) {
    let (found, how) = if policy.prefix_mode() == Some("precise") {
        (c("keys_exact"), "keys an engine reports held over keys sent")
    } else {
        (c("keys_found"), "keys found over keys sent")
    };
    ((c("keys_sent") > 0.0).then(|| found / c("keys_sent")), how)
}

/// The best value of `v` among `rows` (the highest, or the lowest), with its policy.
fn best_by(rows: &[&Outcome], v: &dyn Fn(&Outcome) -> Option<f64>, higher: bool) -> Option<(f64, Policy)> {
    rows.iter().filter_map(|o| v(o).map(|x| (x, o.policy))).max_by(|a, b| {
        if higher {
            a.0.total_cmp(&b.0)
        } else {
            b.0.total_cmp(&a.0)
        }
    })
}

/// One goal line: ailb's best `a` over the best peer's `b`, and whether the ratio meets the goal.
fn goal_line(
    what: &str,
    a: Option<(f64, Policy)>,
    b: Option<(f64, Policy)>,
    goal: &str,
    met: &dyn Fn(f64) -> bool,
) -> String {
    match (a, b) {
        (Some((x, pa)), Some((y, pb))) if y > 0.0 => format!(
            "- {what}: ailb's best {} ({}) against the best peer's {} ({}): {:.2}x; goal {goal}: {}.",
            fmt_what(what, x),
            pa.title(),
            fmt_what(what, y),
            pb.title(),
            x / y,
            if met(x / y) { "met" } else { "not met" }
        ),
        _ => format!("- {what}: n/a (not measured for both)."),
    }
}

/// A figure read from one policy's outcome.
type Measure<'a> = dyn Fn(&Outcome) -> Option<f64> + 'a;

/// ailb's best rows against the best peer's: the prompt tokens from the cache, over the prompts
/// each served and over the same count for all (at least as many), and TTFT P95 (at most 0.8 x).
fn best_against_best_peer(s: &mut String, ailbs: &[&Outcome], peers: &[&Outcome]) {
    let most = most_prompt_tokens_served(ailbs.iter().chain(peers).copied());
    let served = |o: &Outcome| o.cached_share();
    let same_count = |o: &Outcome| share_of_most_served(o, most);
    let ttft = |o: &Outcome| o.pct("ttft_ms", "p95");
    let _ = writeln!(s, "\nailb's best against the best peer's:\n");
    let shares: [(&str, &Measure); 2] = [
        ("prompt tokens from the cache", &served),
        ("prompt tokens from the cache, over the most prompts served", &same_count),
    ];
    for (what, share) in shares {
        let line = goal_line(what, best_by(ailbs, share, true), best_by(peers, share, true), ">= 1.00x", &|r| r >= 1.0);
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "{}",
        goal_line("TTFT p95", best_by(ailbs, &ttft, false), best_by(peers, &ttft, false), "<= 0.80x", &|r| r <= 0.8)
    );
}

/// Each prefix-aware ailb row's failures against ailb's without the prefix pick (the same
/// side: the socket ABI or the front door): no more.
fn failures_against_today(s: &mut String, outs: &[Outcome]) {
    for o in outs.iter().filter(|o| o.policy.prefix_mode().is_some()) {
        let today = if o.policy.behind_front_door().is_some() { Policy::AilbGateway } else { Policy::Ailb };
        if let Some(t) = outs.iter().find(|x| x.policy == today) {
            let _ = writeln!(
                s,
                "- failures, {}: {} against {} of {} (today's); goal no more: {}.",
                o.policy.title(),
                o.failures(),
                t.failures(),
                t.policy.title(),
                if o.failures() <= t.failures() { "met" } else { "not met" }
            );
        }
    }
}

/// A value of [`from_the_cache`]'s lines: a share in percent, a latency in ms.
fn fmt_what(what: &str, v: f64) -> String {
    if what.starts_with("prompt") {
        format!("{:.1} %", v * 100.0)
    } else {
        format!("{v:.0} ms")
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

/// `x / y` as a ratio ("0.72x"), "n/a" without both or when `y` is 0.
fn ratio(x: Option<f64>, y: Option<f64>) -> String {
    match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
        _ => "n/a".into(),
    }
}

/// ailb in full against round robin and random L4.
fn against_baselines(s: &mut String, outs: &[Outcome]) {
    let get = |p: Policy| outs.iter().find(|o| o.policy == p);
    for base in [Policy::RoundRobin, Policy::Random] {
        let (Some(a), Some(r)) = (get(Policy::Ailb), get(base)) else { continue };
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

/// Every ailb row (socket ABI and front door) against the best peer router that ran: the one
/// with the lowest E2E P95.
fn against_best_peer(s: &mut String, outs: &[Outcome]) {
    let best = outs
        .iter()
        .filter(|o| super::peers::binary(o.policy).is_some())
        .filter_map(|o| o.pct("e2e_ms", "p95").map(|p| (p, o)))
        .min_by(|x, y| x.0.total_cmp(&y.0));
    let Some((_, b)) = best else { return };
    for a in outs.iter().filter(|o| o.policy.is_ailb()) {
        let _ = writeln!(
            s,
            "\n{} / best peer ({}): TTFT p95 {}, E2E p95 {}, E2E p95 over the requests all served {}, failures {} \
             vs {}, spread {:.1} vs {:.1} points.",
            a.policy.title(),
            b.policy.title(),
            ratio(a.pct("ttft_ms", "p95"), b.pct("ttft_ms", "p95")),
            ratio(a.pct("e2e_ms", "p95"), b.pct("e2e_ms", "p95")),
            ratio(common_p95(outs, a), common_p95(outs, b)),
            a.failures(),
            b.failures(),
            a.util_spread() * 100.0,
            b.util_spread() * 100.0,
        );
    }
}

/// CPU per 1,000 requests of each policy's userspace router, once a run measured one: the
/// kernel-only policies pick in the kernel, on no process's time.
fn router_cpu(s: &mut String, outs: &[Outcome]) {
    if outs.iter().all(|o| o.router_cpu_s.is_none()) {
        return;
    }
    let per_k = |cpu: f64, o: &Outcome| cpu * 1000.0 / o.requests().max(1) as f64;
    let rows: Vec<String> = outs
        .iter()
        .map(|o| match o.router_cpu_s {
            Some(c) => format!("{} {:.2} s", o.policy.title(), per_k(c, o)),
            None if o.policy.userspace_router() => format!("{} n/a (not read)", o.policy.title()),
            None => format!("{} 0 (kernel pick)", o.policy.title()),
        })
        .collect();
    let _ = writeln!(
        s,
        "\nRouter CPU per 1,000 requests (user + system time of the router process on the request path during \
         the replay, `/proc/PID/stat`): {}.",
        rows.join(", ")
    );
    let daemon: Vec<String> = outs
        .iter()
        .filter_map(|o| o.daemon_cpu_s.map(|c| format!("{} {:.2} s", o.policy.title(), per_k(c, o))))
        .collect();
    if !daemon.is_empty() {
        let _ = writeln!(
            s,
            "\n`ailb run` CPU per 1,000 requests, off the request path (it reads telemetry and writes the maps the \
             kernel picks from; the agents on the GPU nodes are not counted): {}.",
            daemon.join(", ")
        );
    }
}

/// ailb's weights over each run: table swaps and per-backend weight changes.
fn weight_stability(s: &mut String, outs: &[Outcome]) {
    let rows: Vec<(&Outcome, &super::weights::WeightStats)> =
        outs.iter().filter_map(|o| o.weights.as_ref().map(|w| (o, w))).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n### ailb's weights during the replay\n\n`ailb run`'s `/metrics` once a second (`ailb_backend_weight` per \
         backend, `ailb_table_rebuilds_total`): a table swap moves the conversations whose slots change hands.\n\n\
         | policy | samples | table swaps | per minute | weight changes per backend (mean / max) | weights seen per backend |\n\
         | --- | --- | --- | --- | --- | --- |"
    );
    for (o, w) in rows {
        let (mean, max) = w.changes();
        let ranges: Vec<String> =
            w.backends
                .iter()
                .map(|(b, r)| {
                    if r.min == r.max {
                        format!("{b} {:.0}", r.min)
                    } else {
                        format!("{b} {:.0}-{:.0}", r.min, r.max)
                    }
                })
                .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.1} | {mean:.1} / {max} | {} |",
            o.policy.title(),
            w.samples,
            w.rebuilds,
            w.rebuilds_per_min,
            ranges.join(", ")
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
/// ran (their command lines, PORT being the policy's own), and a row for each one that is not
/// installed.
pub fn peers(outs: &[Outcome], not_run: &[(Policy, String)]) -> String {
    let ran: Vec<Policy> = outs.iter().map(|o| o.policy).filter(|p| super::peers::binary(*p).is_some()).collect();
    if ran.is_empty() && not_run.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n## Peer routers\n\n| policy | settings |\n|---|---|\n");
    for p in ran {
        let workers = ["http://GPU...".to_string()];
        let offset = super::peers::METRICS_PORT_OFFSET;
        let at = |ip: [u8; 4], port| std::net::SocketAddrV4::new(ip.into(), port);
        let args = super::peers::args(p, at([127, 0, 10, 250], 0), at([127, 0, 10, 249], offset), &workers);
        let line = args
            .join(" ")
            .replace("--port 0", "--port PORT")
            .replace(&format!("--prometheus-port {offset}"), &format!("--prometheus-port PORT+{offset}"));
        let bin = super::peers::binary(p).unwrap_or_default();
        let _ = writeln!(s, "| {} | `{bin} {line}`, defaults otherwise |", p.title());
    }
    for (p, why) in not_run {
        let _ = writeln!(s, "| {} | {why} |", p.title());
    }
    s
}

#[cfg(test)]
mod tests;
