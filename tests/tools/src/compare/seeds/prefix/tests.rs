use super::*;
use clap::Parser;

fn row(title: &str, peer: bool, cached: f64, of_most: f64, ttft: f64) -> Row {
    Row {
        title: title.into(),
        peer,
        ailb: title.starts_with("ailb"),
        cached: Some(cached),
        cached_of_most: Some(of_most),
        ttft_p95_ms: Some(ttft),
        failures: u64::from(peer),
        requests: 2000,
    }
}

fn runs() -> Vec<SeedRun> {
    vec![
        SeedRun {
            seed: 1,
            rows: vec![
                row("ailb, prefix approximate", false, 0.58, 0.58, 500.0),
                row("ailb (front door), prefix approximate", false, 0.59, 0.59, 600.0),
                // Not a peer: never the best peer, however it ranks.
                row("round robin L4", false, 0.90, 0.90, 10.0),
                row("SMG cache-aware", true, 0.57, 0.57, 550.0),
                row("SMG prefix hash", true, 0.60, 0.50, 1500.0),
            ],
            versus: Vec::new(),
        },
        SeedRun {
            seed: 2,
            rows: vec![
                row("ailb, prefix approximate", false, 0.55, 0.55, 400.0),
                row("SMG cache-aware", true, 0.50, 0.50, 600.0),
            ],
            versus: Vec::new(),
        },
    ]
}

#[test]
fn each_goal_takes_ailbs_best_against_the_best_peers_per_seed_and_over_the_seeds() {
    let args = Args::parse_from(["ailb-compare", "--shared-prefix", "--seeds", "2", "--a100", "0", "--rtx3090", "6"]);
    let md = markdown(&args, &runs());
    // Seed 1: the front door's 59 % against SMG prefix hash's 60 % (not round robin's 90 %).
    assert!(
        md.contains(
            "| 1 | prompt tokens from the cache | 59.0 % (ailb (front door), prefix approximate) | 60.0 % (SMG prefix \
             hash) | 0.98x | no |"
        ),
        "{md}"
    );
    // Over the same count SMG cache-aware is the best peer (57 % against prefix hash's 50 %).
    assert!(md.contains("| 1 | prompt tokens from the cache, over the most prompts served | 59.0 % (ailb (front door), prefix approximate) | 57.0 % (SMG cache-aware) | 1.04x | yes |"), "{md}");
    // TTFT: the lowest of each side, 500 against 550 ms.
    assert!(
        md.contains("| 1 | TTFT P95 | 500 ms (ailb, prefix approximate) | 550 ms (SMG cache-aware) | 0.91x | no |"),
        "{md}"
    );
    assert!(
        md.contains("| 2 | TTFT P95 | 400 ms (ailb, prefix approximate) | 600 ms (SMG cache-aware) | 0.67x | yes |"),
        "{md}"
    );
    // Means: cache (0.98 + 1.10) / 2 = 1.04 met on the mean in one seed of two;
    // TTFT (0.909 + 0.667) / 2 = 0.79.
    assert!(md.contains("| prompt tokens from the cache (>= 1.00x) | 1.04x (met on the mean) | 1 of 2 |"), "{md}");
    assert!(md.contains("| TTFT P95 (<= 0.80x) | 0.79x (met on the mean) | 1 of 2 |"), "{md}");
    assert!(md.contains("| 2 | SMG cache-aware | 50.0 % | 50.0 % | 600 | 1 of 2000 |"), "{md}");
    assert!(md.contains("SMG cache-aware 2 of 4000"), "{md}");
    assert!(md.contains("Fleet: 0 x A100-80GB + 6 x RTX 3090 24GB"), "{md}");
}

#[test]
fn without_a_peer_there_is_nothing_to_compare() {
    let args = Args::parse_from(["ailb-compare", "--shared-prefix", "--seeds", "1"]);
    let runs = vec![SeedRun {
        seed: 1,
        rows: vec![row("ailb, prefix approximate", false, 0.5, 0.5, 100.0)],
        versus: Vec::new(),
    }];
    assert!(markdown(&args, &runs).contains("nothing to compare"));
}
