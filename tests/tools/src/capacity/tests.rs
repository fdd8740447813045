use super::*;

fn args(extra: &[&str]) -> Args {
    Args::parse_from([&["ailb-fleet-model", "--synthetic", "--limit", "60", "--loads", "1"], extra].concat())
}

#[test]
fn synthetic_stretches_are_the_mix_with_successive_seeds() {
    let w = Workload::Synthetic { rate: 5.0, seed: 7 };
    let first = w.specs(0, 3, 60);
    assert_eq!(first.len(), 60);
    let again = SyntheticOpts { requests: 60, conversations_per_s: 5.0, seed: 7, ..Default::default() };
    let want = replay::synthetic_specs(&again, trace::DEFAULT_KV_MB_PER_TOKEN, replay::DEFAULT_MODEL);
    assert_eq!(first, want, "stretch 0 is the mix of --seed itself");
    assert_ne!(w.specs(1, 3, 60), first, "stretch 1 has another seed");
}

#[test]
fn the_synthetic_report_names_its_workload_and_rate() {
    let a = args(&["--rate", "2.5"]);
    let w = Workload::Synthetic { rate: a.rate, seed: a.seed };
    let (short, long) = (w.specs(0, 1, a.limit), w.specs(0, 1, a.limit * 2));
    let mut md = String::new();
    report::intro(&mut md, &a, &w, &short, &long);
    assert!(md.contains("--limit 60 --synthetic"), "{md}");
    assert!(md.contains("the synthetic mix (`--synthetic`, 2.5 new conversations/s at load 1, seed 1), 60 requests"));
    assert!(!md.contains("Mooncake"), "{md}");
}

#[test]
fn a_bad_setting_is_refused_naming_it() {
    for (flag, value) in [
        ("--rate", "0"),
        ("--prefix-load-factor", "0.5"),
        ("--prefix-ttl-s", "0"),
        ("--prefix-ttl-fill", "inf"),
        ("--prefix-ttl-fill", "101"),
    ] {
        let err = main(args(&[flag, value])).unwrap_err().to_string();
        assert!(err.contains(flag) && err.contains(&format!("not {value}")), "{flag} {value}: {err}");
    }
}

#[test]
fn synthetic_conflicts_with_a_trace() {
    let r = Args::try_parse_from(["ailb-fleet-model", "--synthetic", "--trace", "x.jsonl"]);
    assert!(r.is_err());
}

#[test]
fn shared_prefix_stretches_are_the_workload_with_successive_seeds() {
    let a = Args::parse_from(["ailb-fleet-model", "--shared-prefix", "--limit", "40", "--tenants", "3", "--seed", "5"]);
    let opts = SharedPrefixOpts { requests: 40, tenants: 3, seed: 5, requests_per_s: a.rate, ..Default::default() };
    let w = Workload::SharedPrefix(opts.clone());
    let want = replay::shared_prefix_specs(&opts, trace::DEFAULT_KV_MB_PER_TOKEN, replay::DEFAULT_MODEL);
    assert_eq!(w.specs(0, 2, 40), want, "stretch 0 is the workload of --seed itself");
    assert_ne!(w.specs(1, 2, 40), want, "stretch 1 has another seed");
    assert!(Args::try_parse_from(["ailb-fleet-model", "--shared-prefix", "--synthetic"]).is_err());
}

/// The prefix step's section: one row per load, the ratios of the step's P95s to the pick's
/// without it; a tenant's requests meet where their prompt is cached, so the step reads more of
/// the prompts from the caches. The row ends with SMG `cache_aware` modelled on the same requests.
#[test]
fn the_prefix_step_section_compares_the_pick_with_and_without_it() {
    let a = Args::parse_from([
        "ailb-fleet-model",
        "--shared-prefix",
        "--limit",
        "80",
        "--tenants",
        "4",
        "--a100",
        "0",
        "--rtx3090",
        "4",
        "--loads",
        "0.5,1",
        "--prefix-seeds",
        "2",
    ]);
    let w = Workload::SharedPrefix(SharedPrefixOpts {
        requests: 80,
        tenants: 4,
        requests_per_s: a.rate,
        seed: 1,
        ..Default::default()
    });
    let mut md = String::new();
    report::prefix_step(&mut md, &w, &a);
    assert!(md.contains("## The prefix step against the same pick without it"), "{md}");
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| 0.5 |") || l.starts_with("| 1 |")).collect();
    assert_eq!(rows.len(), 2, "{md}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (with, without) = cells[6].split_once('/').expect("the cache column: with / without");
        let pct = |s: &str| s.trim().trim_end_matches('%').trim().parse::<f64>().expect("a percentage");
        assert!(pct(with) > pct(without), "{row}");
        // SMG's cache-aware policy, modelled, on the same requests: its ratios and cache share.
        assert_eq!(cells[7].split(", ").count(), 3, "{row}");
        assert!((0.0..=100.0).contains(&pct(cells[8])), "{row}");
    }
}
