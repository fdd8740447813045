use super::*;
use clap::Parser;

fn row(title: &str, peer: bool, e2e: f64, spread: f64) -> Row {
    Row {
        title: title.into(),
        peer,
        ailb: !peer && title.starts_with("ailb"),
        ttft_p95_ms: Some(e2e / 10.0),
        e2e_p95_ms: Some(e2e),
        failures: 0,
        requests: 1000,
        spread,
    }
}

fn runs() -> Vec<SeedRun> {
    vec![
        SeedRun {
            seed: 1,
            clairvoyant_p95_ms: 4000.0,
            rows: vec![
                row("ailb", false, 4100.0, 40.0),
                row("round robin L4", false, 20000.0, 80.0),
                row("peer a", true, 5000.0, 50.0),
                row("peer b", true, 6000.0, 10.0),
            ],
            versus: Vec::new(),
        },
        SeedRun {
            seed: 2,
            clairvoyant_p95_ms: 4500.0,
            rows: vec![
                row("ailb", false, 4600.0, 60.0),
                row("peer a", true, 7000.0, 70.0),
                row("peer b", true, 5000.0, 20.0),
            ],
            versus: Vec::new(),
        },
    ]
}

#[test]
fn the_best_peer_is_the_peer_with_the_lowest_e2e_p95() {
    let r = runs();
    assert_eq!(r[0].best_peer().unwrap().title, "peer a", "round robin is not a peer, however it ranks");
    assert_eq!(r[1].best_peer().unwrap().title, "peer b");
    let none =
        SeedRun { seed: 3, clairvoyant_p95_ms: 1.0, rows: vec![row("ailb", false, 1.0, 1.0)], versus: Vec::new() };
    assert!(none.best_peer().is_none());
}

#[test]
fn the_summary_gives_per_seed_ratios_and_their_means() {
    let args = Args::parse_from(["ailb-compare", "--synthetic", "--seeds", "2", "--load", "2", "--time-scale", "5"]);
    let md = markdown(&args, &runs());
    // Seed 1: 4100 / 5000 = 0.82x (peer a); clairvoyant 4000 / 5000 = 0.80x, not over 0.8.
    assert!(md.contains("| 1 | ailb | peer a | 0.82x | 0.82x | 0.80x | 0 / 0 | 40.0 / 50.0 pts |"), "{md}");
    // Seed 2: 4600 / 5000 = 0.92x (peer b); clairvoyant 4500 / 5000 = 0.90x: beyond the goal.
    assert!(md.contains("| 2 | ailb | peer b | 0.92x | 0.92x | 0.90x | 0 / 0 | 60.0 / 20.0 pts |"), "{md}");
    // Means: (0.82 + 0.92) / 2 = 0.87; spreads (40 + 60) / 2 against (50 + 20) / 2.
    assert!(md.contains("| ailb | 0.87x | 0.87x | 0 of 2 | 1 of 2 | 0 / 0 | 50.0 / 35.0 pts |"), "{md}");
    assert!(md.contains("| 1 | clairvoyant placement (fleet model) | | 4000 | 1.00x | | |"), "{md}");
    assert!(md.contains("| 2 | ailb | 460 | 4600 | 1.02x | 0 of 1000 | 60.0 pts |"), "{md}");
}

#[test]
fn several_seeds_need_a_workload_with_seeds() {
    let args = Args::parse_from(["ailb-compare", "--seeds", "3"]);
    assert!(args.validate().unwrap_err().to_string().contains("--seeds"));
    let args = Args::parse_from(["ailb-compare", "--synthetic", "--seeds", "0"]);
    assert!(args.validate().is_err());
    assert!(Args::parse_from(["ailb-compare", "--synthetic", "--seeds", "3"]).validate().is_ok());
    assert!(Args::parse_from(["ailb-compare", "--shared-prefix", "--seeds", "3"]).validate().is_ok());
}
