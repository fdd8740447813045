//! Each prefix-aware ailb row against ailb without the prefix pick, the same way in (the socket
//! ABI or the front door), per seed and on the mean: the goal "no worse than today" on TTFT P95,
//! and what the prefix pick adds to the prompt tokens read from the caches.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::super::outcome::Outcome;
use super::super::policy::Policy;
use super::{mean, ratio, x};
use crate::frontdoor::report::{geometric_mean, median};

/// What this section reads of one policy's outcome on one seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Versus {
    pub policy: Policy,
    pub ttft_p95_ms: Option<f64>,
    /// Prompt tokens from the GPUs' caches over the prompt tokens they served.
    pub cached: Option<f64>,
    /// Per conversation, the GPU of its first turn ([`Outcome::first_turns`]).
    pub first_turns: BTreeMap<String, String>,
}

impl Versus {
    pub fn of(o: &Outcome) -> Self {
        Versus {
            policy: o.policy,
            ttft_p95_ms: o.pct("ttft_ms", "p95"),
            cached: o.cached_share(),
            first_turns: o.first_turns.clone(),
        }
    }
}

/// ailb without the prefix pick, the same way in as `p` (a prefix-aware ailb policy).
pub fn today_of(p: Policy) -> Option<Policy> {
    p.prefix_mode()?;
    Some(if p.behind_front_door().is_some() { Policy::AilbGateway } else { Policy::Ailb })
}

/// The section over `runs` (each seed's number and rows); nothing where no seed ran a prefix
/// row with its counterpart.
pub fn section(s: &mut String, runs: &[(u64, &[Versus])]) {
    // Every prefix row of every seed with its counterpart of that seed.
    let pairs: Vec<(u64, &Versus, &Versus)> = runs
        .iter()
        .flat_map(|(seed, rows)| {
            rows.iter().filter_map(move |r| {
                let t = today_of(r.policy).and_then(|t| rows.iter().find(|o| o.policy == t))?;
                Some((*seed, r, t))
            })
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let pct = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{:.1} %", v * 100.0));
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.0}"));
    let _ = write!(
        s,
        "\n## The prefix pick against ailb without it, the same way in\n\n\
         The goal \"no worse than today\": TTFT P95 at most 1.00x ailb's without the prefix pick. First turns \
         placed alike: the conversations whose first turn went to the same GPU with the prefix pick as without \
         it, of those both served. A first turn whose prompt the map holds nothing of is placed by the hash of \
         its first key rather than of its conversation: a different draw of the same table, so where few are \
         placed alike the two rows differ by that draw as well as by the prefix pick.\n\n\
         | seed | policy | without the prefix pick | TTFT P95 | ratio | from the cache (with / without) | \
         first turns placed alike |\n\
         |---:|---|---|---:|---:|---:|---:|\n"
    );
    let mut policies: Vec<Policy> = Vec::new();
    for (seed, r, t) in &pairs {
        if !policies.contains(&r.policy) {
            policies.push(r.policy);
        }
        let _ = writeln!(
            s,
            "| {seed} | {} | {} | {} / {} ms | {} | {} / {} | {} |",
            r.policy.title(),
            t.policy.title(),
            ms(r.ttft_p95_ms),
            ms(t.ttft_p95_ms),
            x(ratio(r.ttft_p95_ms, t.ttft_p95_ms)),
            pct(r.cached),
            pct(t.cached),
            placed_alike(&r.first_turns, &t.first_turns)
        );
    }
    // The median, the geometric mean and the ratio of the summed P95s beside the mean: on an
    // overloaded fleet one seed can read 10x (a P95 of 1 s against 10 s), which moves a mean of
    // a few ratios by more than the effect looked for; and two equally good picks that place
    // differently read q as often as 1/q, whose plain mean is above 1.
    s.push_str(
        "\n| policy | TTFT P95 / without (mean) | median | geometric mean | of the sums | seeds at or under 1.00x | \
         from the cache, with / without (mean) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in policies {
        let of_p = || pairs.iter().filter(|(_, r, _)| r.policy == p);
        let ttft: Vec<f64> = of_p().filter_map(|(_, r, t)| ratio(r.ttft_p95_ms, t.ttft_p95_ms)).collect();
        let cache: Vec<f64> = of_p().filter_map(|(_, r, t)| ratio(r.cached, t.cached)).collect();
        let both: Vec<(f64, f64)> = of_p().filter_map(|(_, r, t)| r.ttft_p95_ms.zip(t.ttft_p95_ms)).collect();
        let sums = ratio(Some(both.iter().map(|b| b.0).sum()), Some(both.iter().map(|b| b.1).sum()));
        let met = ttft.iter().filter(|&&q| q <= 1.0).count();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {met} of {} | {} |",
            p.title(),
            x(mean(&ttft)),
            x(median(&ttft)),
            x(geometric_mean(&ttft)),
            x(sums),
            ttft.len(),
            x(mean(&cache))
        );
    }
}

/// "k of n": of the `n` conversations whose first turn both runs placed, the `k` placed on the
/// same GPU; "n/a" when none (a workload without conversations).
fn placed_alike(with: &BTreeMap<String, String>, without: &BTreeMap<String, String>) -> String {
    let (same, both) = with
        .iter()
        .filter_map(|(c, g)| without.get(c).map(|h| g == h))
        .fold((0, 0), |(same, both), alike| (same + usize::from(alike), both + 1));
    if both == 0 {
        return "n/a".into();
    }
    format!("{same} of {both}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: Policy, ttft: f64, cached: f64) -> Versus {
        Versus { policy, ttft_p95_ms: Some(ttft), cached: Some(cached), first_turns: BTreeMap::new() }
    }

    fn turns(of: &[(&str, &str)]) -> BTreeMap<String, String> {
        of.iter().map(|(c, g)| (c.to_string(), g.to_string())).collect()
    }

    #[test]
    fn the_first_turns_placed_alike_are_counted_over_the_conversations_both_placed() {
        let with = turns(&[("a", "127.0.10.1"), ("b", "127.0.10.2"), ("c", "127.0.10.3"), ("d", "127.0.10.4")]);
        // "d" went unplaced without the map (failed): not counted; "e" only without it.
        let without = turns(&[("a", "127.0.10.1"), ("b", "127.0.10.5"), ("c", "127.0.10.3"), ("e", "127.0.10.1")]);
        assert_eq!(placed_alike(&with, &without), "2 of 3");
        assert_eq!(placed_alike(&with, &BTreeMap::new()), "n/a", "no conversations: nothing to count");

        let mut r = row(Policy::AilbPrefix, 900.0, 0.3);
        r.first_turns = with;
        let mut t = row(Policy::Ailb, 1000.0, 0.25);
        t.first_turns = without;
        let mut s = String::new();
        section(&mut s, &[(1, &[t, r])]);
        assert!(s.contains("| 900 / 1000 ms | 0.90x | 30.0 % / 25.0 % | 2 of 3 |"), "{s}");
    }

    #[test]
    fn each_prefix_row_is_read_against_the_same_way_in_without_it() {
        let one = [
            row(Policy::Ailb, 1000.0, 0.25),
            row(Policy::AilbPrefix, 900.0, 0.30),
            row(Policy::AilbGateway, 1000.0, 0.25),
            row(Policy::AilbGatewayPrefix, 1200.0, 0.25),
            row(Policy::SmgCacheAware, 1.0, 0.9),
        ];
        let two = [row(Policy::Ailb, 1000.0, 0.20), row(Policy::AilbPrefix, 1100.0, 0.22)];
        let mut s = String::new();
        section(&mut s, &[(1, &one), (2, &two)]);
        assert!(
            s.contains("| 1 | ailb, prefix approximate | ailb | 900 / 1000 ms | 0.90x | 30.0 % / 25.0 % | n/a |"),
            "{s}"
        );
        assert!(
            s.contains("| 2 | ailb, prefix approximate | ailb | 1100 / 1000 ms | 1.10x | 22.0 % / 20.0 % | n/a |"),
            "{s}"
        );
        // Means: TTFT (0.9 + 1.1) / 2 = 1.00, no worse on one seed of two; cache (1.2 + 1.1) / 2.
        // The median of two is their mean; the geometric mean sqrt(0.99); the sums 2000 / 2000.
        assert!(s.contains("| ailb, prefix approximate | 1.00x | 1.00x | 0.99x | 1.00x | 1 of 2 | 1.15x |"), "{s}");
        assert!(
            s.contains("| ailb (front door), prefix approximate | 1.20x | 1.20x | 1.20x | 1.20x | 0 of 1 | 1.00x |"),
            "{s}"
        );

        // One seed at 10x: the mean follows it, the median and the sums much less.
        let runs: Vec<[Versus; 2]> = [(1000.0, 1000.0), (900.0, 1000.0), (1000.0, 100.0)]
            .map(|(with, without)| [row(Policy::Ailb, without, 0.2), row(Policy::AilbPrefix, with, 0.2)])
            .to_vec();
        let mut skewed = String::new();
        section(&mut skewed, &[(1, &runs[0]), (2, &runs[1]), (3, &runs[2])]);
        // Mean (1.0 + 0.9 + 10.0) / 3 = 3.97; median 1.00; geometric mean 9^(1/3) = 2.08; sums
        // 2900 / 2100 = 1.38.
        assert!(
            skewed.contains("| ailb, prefix approximate | 3.97x | 1.00x | 2.08x | 1.38x | 2 of 3 | 1.00x |"),
            "{skewed}"
        );

        // Two draws of the same noise, 2x one way and 2x the other: the mean reads 1.25x, the
        // geometric mean 1.00x.
        let draws: Vec<[Versus; 2]> = [(2000.0, 1000.0), (500.0, 1000.0)]
            .map(|(with, without)| [row(Policy::Ailb, without, 0.2), row(Policy::AilbPrefix, with, 0.2)])
            .to_vec();
        let mut even = String::new();
        section(&mut even, &[(1, &draws[0]), (2, &draws[1])]);
        assert!(
            even.contains("| ailb, prefix approximate | 1.25x | 1.25x | 1.00x | 1.25x | 1 of 2 | 1.00x |"),
            "{even}"
        );
        assert!(!s.contains("| 1 | SMG"), "peers have no counterpart: {s}");

        let mut none = String::new();
        section(&mut none, &[(1, &[row(Policy::AilbPrefix, 1.0, 0.1)])]);
        assert!(none.is_empty(), "no counterpart ran: {none}");
    }
}
