//! `ailb-compare`'s outputs (the Markdown report, both SVG plots, the `--json` numbers) for a
//! fixed set of made-up outcomes, byte for byte against `golden/`: a change of the report's
//! format shows here first. Pure: no root, no fleet, no clock.
//!
//! After an intended change of the format, `AILB_BLESS=1 cargo test -p ailb-tools --test
//! compare_report` rewrites the golden files; review their diff.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ailb_tools::compare::args::Args;
use ailb_tools::compare::outcome::{GpuOutcome, Outcome};
use ailb_tools::compare::policy::Policy;
use ailb_tools::compare::real::client::Record;
use ailb_tools::compare::real::report as real_report;
use ailb_tools::compare::real::workload::Kind;
use ailb_tools::compare::real::{Row, Setup};
use ailb_tools::compare::weights::{WeightSample, WeightStats};
use ailb_tools::compare::{peers, plot_data, plots, report, Workload};
use clap::Parser;
use serde_json::{json, Value};

/// A policy's made-up outcome: 20 requests, a few of them failed, latencies scaled by `k`, two
/// GPUs of which one misses some samples.
fn outcome(policy: Policy, k: f64, fails: u64) -> Outcome {
    let e2e_by_index: BTreeMap<u64, f64> =
        (0..20u64).filter(|i| (*i as f64 * k) as u64 % 7 != 3).map(|i| (i, 10.0 + i as f64 * 37.5 * k)).collect();
    let mut e2e_sorted: Vec<f64> = e2e_by_index.values().copied().collect();
    e2e_sorted.sort_by(f64::total_cmp);
    let mut failure_kinds = BTreeMap::new();
    if fails > 0 {
        failure_kinds.insert("HTTP 400".to_string(), fails as usize);
        failure_kinds.insert("timed out".to_string(), 1);
    }
    let affinity = if k > 1.0 { Value::Null } else { json!(0.9) };
    Outcome {
        policy,
        summary: json!({"requests": 20, "failures": fails, "failure_rate": fails as f64 / 20.0,
            "ttft_ms": {"p50": 12.5 * k, "p95": 99.0 * k, "p99": 150.25 * k},
            "e2e_ms": {"p50": 300.0 * k, "p95": 700.5 * k, "p99": 800.0 * k},
            "prefix_cache_hit_rate": 0.42 / k, "affinity_hit_rate": affinity,
            "token_throughput": 1234.5 * k}),
        e2e_sorted,
        e2e_by_index,
        gpus: vec![
            GpuOutcome {
                addr: "127.0.10.1:18100".into(),
                profile: "a100-80gb",
                util_mean: 0.5 * k,
                busy: 0.6,
                prefix_hit: Some(0.3),
            },
            GpuOutcome {
                addr: "127.0.10.2:18100".into(),
                profile: "rtx3090-24gb",
                util_mean: 0.25,
                busy: 0.3 * k,
                prefix_hit: None,
            },
        ],
        prefix_tokens: None,
        prefix_counters: BTreeMap::new(),
        front_door: None,
        failure_kinds,
        util_series: (0..30)
            .map(|t| (t as f64 * 0.25, vec![(t as f64 / 30.0) * k, if t % 5 == 0 { f64::NAN } else { 0.5 }]))
            .collect(),
        window_s: 5.0,
        wall_s: 12.3 * k,
        router_cpu_s: None,
        daemon_cpu_s: None,
        weights: (policy == Policy::Ailb).then(|| {
            let at = |a: f64, r: f64| WeightSample {
                weights: [("127.0.10.1:18100".to_string(), a), ("127.0.10.2:18100".to_string(), 500.0)]
                    .into_iter()
                    .collect(),
                rebuilds: r,
            };
            WeightStats::of(&[at(1000.0, 4.0), at(667.0, 5.0), at(1000.0, 6.0)], 30.0).expect("three samples")
        }),
        first_turns: BTreeMap::new(),
    }
}

fn outcomes() -> Vec<Outcome> {
    vec![
        outcome(Policy::RoundRobin, 1.7, 3),
        outcome(Policy::Random, 1.3, 0),
        outcome(Policy::Ailb, 0.5, 0),
        outcome(Policy::Nginx, 1.1, 1),
    ]
}

/// Caches that never evict hold much more than the oracle (`a`), or about as much (`b`): the
/// report explains each differently.
fn workloads() -> [(&'static str, Workload); 2] {
    [
        ("a", Workload { window_s: 5.0, unbounded_prefix_hit_rate: Some(0.6), oracle_prefix_hit_rate: 0.4 }),
        ("b", Workload { window_s: 5.0, unbounded_prefix_hit_rate: Some(0.41), oracle_prefix_hit_rate: 0.4 }),
    ]
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

/// `actual` must equal the golden file `name` (or replaces it under `AILB_BLESS=1`).
fn check(name: &str, actual: &str) {
    let path = golden(name);
    if std::env::var_os("AILB_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    if want != actual {
        let line = want.lines().zip(actual.lines()).position(|(w, a)| w != a).map_or(0, |i| i + 1);
        panic!(
            "{name} differs from {} (first at line {line}; AILB_BLESS=1 rewrites it):\n--- golden\n{want}\n--- now\n{actual}",
            path.display()
        );
    }
}

#[test]
fn the_markdown_report_is_unchanged() {
    let outs = outcomes();
    let runs = [("trace", vec!["ailb-compare"]), ("synth", vec!["ailb-compare", "--synthetic", "--load", "1.0"])];
    for (name, argv) in runs {
        let args = Args::parse_from(argv.iter().chain(&["--limit", if name == "trace" { "1000" } else { "300" }]));
        for (w, workload) in workloads() {
            check(&format!("compare-{name}-{w}.md"), &report::markdown(&args, &outs, &workload));
        }
    }
}

#[test]
fn the_plots_are_unchanged() {
    let outs = outcomes();
    check("compare-cdf.svg", &plots::cdf_svg(&outs).expect("the CDF"));
    check("compare-util.svg", &plots::util_svg(&outs).expect("the utilisation plot"));
}

/// The plots' saved data (`ailb-compare --replot`) is what was drawn, to its rounding (E2E to
/// the microsecond, utilisation to 1e-4, NaN samples as null), and draws the same plots as
/// the outcomes it was read into.
#[test]
fn the_saved_plot_data_redraws_the_plots() {
    let outs = outcomes();
    let dir = tempfile::tempdir().expect("a temp dir");
    plot_data::save(dir.path(), &outs).expect("saving");
    plot_data::replot(dir.path()).expect("redrawing");
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect(name);
    let saved: plot_data::PlotData = serde_json::from_str(&read(plot_data::FILE)).expect("the data");
    assert_eq!(saved, plot_data::PlotData::of(&outs));
    let back = saved.outcomes().expect("the outcomes");
    assert!(read("replay-cdf.svg") == plots::cdf_svg(&back).expect("the CDF"), "the CDF drawn again differs");
    let util = plots::util_svg(&back).expect("the utilisation plot");
    assert!(read("replay-util.svg") == util, "the utilisation plot drawn again differs");
    assert_eq!(back.len(), outs.len());
    for (b, o) in back.iter().zip(&outs) {
        assert_eq!((b.policy, b.requests(), b.window_s), (o.policy, o.requests(), o.window_s));
        assert_eq!(b.e2e_sorted.len(), o.e2e_sorted.len());
        assert!(b.e2e_sorted.iter().zip(&o.e2e_sorted).all(|(x, y)| (x - y).abs() <= 5e-4), "E2E to the microsecond");
        for ((tb, rb), (to, ro)) in b.util_series.iter().zip(&o.util_series) {
            assert!((tb - to).abs() <= 5e-4);
            for (x, y) in rb.iter().zip(ro) {
                assert!(x.is_nan() == y.is_nan() && (x.is_nan() || (x - y).abs() <= 5e-5), "{x} against {y}");
            }
        }
        assert_eq!(b.util_mean(), o.util_mean());
    }
    assert_eq!(saved.policies[0].util_series[0].1[1], None, "a missed sample is saved as null");
}

#[test]
fn the_json_numbers_are_unchanged() {
    let (_, workload) = workloads().into_iter().next().expect("a workload");
    check("compare.json", &format!("{:#}\n", report::json(&outcomes(), &workload)));
}

/// ailb through the socket ABI and through its front door beside three peer routers and nginx,
/// with the routers' CPU read: the lines against the best peer (the lowest E2E P95 of the three,
/// vllm's here), the CPU per 1,000 requests, and the routers' command lines.
#[test]
fn the_lines_against_the_peers_are_unchanged() {
    let with_cpu = |mut o: Outcome, router: Option<f64>, daemon: Option<f64>| {
        o.router_cpu_s = router;
        o.daemon_cpu_s = daemon;
        o
    };
    let outs = vec![
        outcome(Policy::RoundRobin, 1.7, 3),
        with_cpu(outcome(Policy::Ailb, 0.5, 0), None, Some(0.04)),
        with_cpu(outcome(Policy::AilbGateway, 0.6, 0), Some(0.3), Some(0.05)),
        with_cpu(outcome(Policy::VllmCacheAware, 0.9, 2), Some(0.5), None),
        with_cpu(outcome(Policy::SglangCacheAware, 1.2, 2), Some(0.7), None),
        with_cpu(outcome(Policy::SmgCacheAware, 1.0, 2), Some(0.6), None),
        with_cpu(outcome(Policy::Nginx, 1.1, 1), None, None),
    ];
    let args = Args::parse_from(["ailb-compare", "--limit", "1000"]);
    let (_, workload) = workloads().into_iter().next().expect("a workload");
    let mut md = report::markdown(&args, &outs, &workload);
    md.push_str(&report::peers(&outs, &[(Policy::SglangRoundRobin, "not installed (made up)".to_string())]));
    check("compare-peers.md", &md);
    let best = "ailb / best peer (vllm-router cache-aware): TTFT p95 0.56x, E2E p95 0.56x,";
    assert!(md.contains(best), "{md}");
    assert!(md.contains("ailb (front door) / best peer (vllm-router cache-aware): TTFT p95 0.67x"), "{md}");
    assert!(md.contains("round robin L4 0 (kernel pick)"), "{md}");
    assert!(md.contains("nginx L7 round robin n/a (not read)"), "{md}");
    assert!(md.contains("ailb (front door) 15.00 s"), "0.3 s over 20 requests: {md}");
}

/// With the GPUs' counters read, the report gives every policy's prompt tokens from the cache
/// and ailb's best against the best peer's on each, with the goal met or not.
#[test]
fn the_tokens_from_the_cache_and_the_goal_lines() {
    let with_tokens = |mut o: Outcome, hit: f64| {
        o.prefix_tokens = Some((hit, 10_000.0));
        o
    };
    let outs = vec![
        with_tokens(outcome(Policy::RoundRobin, 1.7, 3), 2_000.0),
        with_tokens(outcome(Policy::AilbGateway, 1.0, 1), 3_000.0),
        {
            let mut o = with_tokens(outcome(Policy::AilbPrefix, 0.5, 0), 7_000.0);
            o.prefix_counters = [
                ("lookups", 20.0),
                ("found", 18.0),
                ("used", 15.0),
                ("overruled_load", 3.0),
                ("keys_sent", 260.0),
                ("map_lookups", 19.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            o
        },
        {
            let mut o = with_tokens(outcome(Policy::AilbGatewayPrefix, 0.6, 2), 7_500.0);
            o.front_door = Some(ailb_tools::compare::front_door::FrontDoorStats {
                fresh: 12.0,
                kept: 8.0,
                keys_made: 12.0,
                keys_s: 0.006,
                keys_buckets: vec![(0.0004, 11.0), (0.0008, 12.0), (f64::INFINITY, 12.0)],
                withheld_placed: 5.0,
                withheld_asked: 1.0,
            });
            o
        },
        with_tokens(outcome(Policy::SmgCacheAware, 1.0, 2), 8_000.0),
        with_tokens(outcome(Policy::VllmCacheAware, 0.9, 2), 6_000.0),
    ];
    let args = Args::parse_from(["ailb-compare", "--shared-prefix", "--limit", "20"]);
    let (_, workload) = workloads().into_iter().next().expect("a workload");
    let md = report::markdown(&args, &outs, &workload);
    for row in [
        "| ailb, prefix approximate | 70.0 % (7000 of 10000) | 70.0 % | 6 / 50 | 0 of 20 |",
        "| SMG cache-aware | 80.0 % (8000 of 10000) | 80.0 % | 12 / 99 | 2 of 20 |",
    ] {
        assert!(md.contains(row), "{row} in {md}");
    }
    // The best of ailb's rows on each measure against the best peer's on it.
    let lines = [
        "- prompt tokens from the cache: ailb's best 75.0 % (ailb (front door), prefix approximate) against the \
         best peer's 80.0 % (SMG cache-aware): 0.94x; goal >= 1.00x: not met.",
        "- TTFT p95: ailb's best 50 ms (ailb, prefix approximate) against the best peer's 89 ms (vllm-router \
         cache-aware): 0.56x; goal <= 0.80x: met.",
        "- failures, ailb, prefix approximate: 0 against 0 of ailb (today's)",
        "- failures, ailb (front door), prefix approximate: 2 against 1 of ailb (front door) (today's); goal no more: not met.",
    ];
    for l in &lines[..2] {
        assert!(md.contains(l), "{l} in {md}");
    }
    assert!(!md.contains(lines[2]), "no ailb row without prefix ran: no failure line for the socket ABI's: {md}");
    assert!(md.contains(lines[3]), "{} in {md}", lines[3]);
    assert!(md.contains("shared prefix, 20 requests: 8 tenants"), "{md}");
    let counters = "ailb, prefix approximate: the kernel's prefix pick (`ailb_prefix_*` at the end): 20 connects \
                    with keys, 18 found a holder, 15 used one, 3 overruled by load, 0 by memory; keys found 0 of 260 \
                    sent; 0 entries; 19 lookups in the map (0.95 per connect, the filter in front of it sparing the \
                    others). Predicted cached (keys found over keys sent): 0.0 %; the GPUs report 70.0 % of the prompt \
                    tokens served from their caches.";
    assert!(md.contains(counters), "{counters} in {md}");
    assert_eq!(md.matches("the kernel's prefix pick").count(), 1, "only where the counters were read");
    let front = "ailb (front door), prefix approximate: the front door opened 12 upstream connections (each a \
                 kernel pick) and sent 8 requests on kept ones; prefix keys made for 12 of them \
                 (`ailb_gateway_prefix_keys_seconds`), 0.500 ms on average, P95 at most 0.80 ms; 6 later turns opened \
                 theirs with the keys withheld (`ailb_gateway_prefix_keys_withheld`): 5 placed by the kernel without \
                 them, 1 asked for them.";
    assert!(md.contains(front), "{front} in {md}");
    assert_eq!(md.matches("the front door opened").count(), 1, "only where the front door's counters were read");
}

/// A made-up request record of the real-engine race: request `i` of a run whose latencies are
/// scaled by `k`; every seventh failed.
fn record(i: usize, k: f64) -> Record {
    let failed = i % 7 == 6;
    Record {
        index: i,
        status: Some(if failed { 503 } else { 200 }),
        error: failed.then(|| format!("HTTP 503 after {} ms: `overloaded`", 10 * i)),
        ttft_ms: (!failed).then_some((20.0 + i as f64 * 3.5) * k),
        e2e_ms: (80.0 + i as f64 * 11.0) * k,
        prompt_tokens: Some(400 + i as u64),
        cached_tokens: Some((i as u64 * 37) % 400),
        completion_tokens: Some(16),
        tagged: true,
    }
}

/// A made-up row of the real-engine race.
fn real_row(workload: Kind, policy: Policy, k: f64, hit: f64) -> Row {
    let prefix = matches!(policy, Policy::AilbGatewayPrecise | Policy::AilbGatewayApprox)
        .then(|| json!({"mode": "precise", "entries": 12, "keys_sent": 40, "keys_found": 31, "keys_exact": 29}));
    // SMG over gRPC: no per-server counts (the servers have no /metrics), its index's intake.
    let grpc = policy.grpc_workers();
    Row {
        workload,
        policy,
        records: (0..20).map(|i| record(i, k)).collect(),
        wall_s: 9.5 * k,
        queried_tokens: 8_000.0,
        hit_tokens: hit,
        per_server: if grpc { vec![] } else { vec![11, 9] },
        router_cpu_s: peers::binary(policy).map(|_| 1.25 * k),
        exclusions: policy.is_ailb().then_some(1),
        prefix,
        router_kv_events: grpc.then_some((42.0, 310.0)),
    }
}

/// The real-engine race's Markdown report (`real-engine.md`) for made-up rows of both
/// workloads, byte for byte but for its first lines, which name this process's command line
/// and this machine.
#[test]
fn the_real_engine_report_is_unchanged() {
    let args = Args::parse_from(["ailb-compare", "--engine", "vllm"]);
    let setup = Setup {
        servers: 2,
        block_size: Some(128),
        kv_blocks: Some(300),
        ready_s: vec![120.5, 131.0],
        rss_mib: vec![4100, 4200],
        grpc_ready_s: Some(170.4),
        workloads: vec![
            (Kind::SharedPrefix, "20 requests of 4 tenants (made up)".to_string(), 20),
            (Kind::Trace, "20 requests of the trace (made up)".to_string(), 20),
        ],
        not_run: vec![(Policy::VllmCacheAware, "not installed (made up)".to_string())],
    };
    let mut rows = Vec::new();
    for kind in [Kind::SharedPrefix, Kind::Trace] {
        rows.push(real_row(kind, Policy::RoundRobin, 1.5, 2_000.0));
        rows.push(real_row(kind, Policy::AilbGatewayPrecise, 1.0, 6_000.0));
        rows.push(real_row(kind, Policy::TenantPinned, 0.9, 6_400.0));
        rows.push(real_row(kind, Policy::SmgPrefixHash, 1.2, 5_000.0));
        rows.push(real_row(kind, Policy::SmgKvEvents, 1.1, 5_800.0));
    }
    let md = real_report::markdown(&args, &setup, &rows);
    let md: String =
        md.split_inclusive('\n').filter(|l| !l.starts_with("Command: ") && !l.starts_with("Machine: ")).collect();
    check("compare-real.md", &md);
}

/// A peer that fails requests counts fewer prompt tokens: over the prompts it served its share
/// can lead where over the most prompts any policy served (here all) it trails.
/// The report gives both, each with its goal line.
#[test]
fn the_tokens_from_the_cache_over_the_most_prompts_served() {
    let with_tokens = |mut o: Outcome, hit: f64, query: f64| {
        o.prefix_tokens = Some((hit, query));
        o
    };
    let outs = vec![
        with_tokens(outcome(Policy::AilbPrefix, 0.5, 0), 370.0, 10_000.0),
        with_tokens(outcome(Policy::SmgCacheAware, 1.0, 9), 350.0, 7_000.0),
    ];
    let args = Args::parse_from(["ailb-compare", "--limit", "20"]);
    let (_, workload) = workloads().into_iter().next().expect("a workload");
    let md = report::markdown(&args, &outs, &workload);
    for l in [
        "| SMG cache-aware | 5.0 % (350 of 7000) | 3.5 % |",
        "- prompt tokens from the cache: ailb's best 3.7 % (ailb, prefix approximate) against the best peer's 5.0 % \
         (SMG cache-aware): 0.74x; goal >= 1.00x: not met.",
        "- prompt tokens from the cache, over the most prompts served: ailb's best 3.7 % (ailb, prefix approximate) \
         against the best peer's 3.5 % (SMG cache-aware): 1.06x; goal >= 1.00x: met.",
    ] {
        assert!(md.contains(l), "{l} in {md}");
    }
}
