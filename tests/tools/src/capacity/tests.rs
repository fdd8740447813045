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
fn a_bad_rate_is_refused_naming_it() {
    let err = main(args(&["--rate", "0"])).unwrap_err().to_string();
    assert!(err.contains("--rate") && err.contains("not 0"), "{err}");
}

#[test]
fn synthetic_conflicts_with_a_trace() {
    let r = Args::try_parse_from(["ailb-fleet-model", "--synthetic", "--trace", "x.jsonl"]);
    assert!(r.is_err());
}
