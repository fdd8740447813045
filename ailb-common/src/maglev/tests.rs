use super::*;
use crate::abi::MAX_TABLE_SIZE;
use crate::hash::backend_key;
use proptest::prelude::*;

fn backends(n: u32) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| MaglevBackend { id: i, key: backend_key(0x7f00_0001u32.to_be() + i, 8000u16.to_be(), 42), weight: 1 })
        .collect()
}

fn counts(table: &[u32], n: usize) -> Vec<usize> {
    let mut c = vec![0usize; n];
    for &id in table {
        c[id as usize] += 1;
    }
    c
}

#[test]
fn sizes_are_prime_and_chosen_by_count() {
    for m in TABLE_SIZES {
        assert!(is_prime(m), "{m}");
    }
    // Up to 655 backends the smallest size with 100 slots each: one arena chunk up to 10,
    // two up to 20.
    assert_eq!(table_size_for(1), 1021);
    assert_eq!(table_size_for(10), 1021);
    assert_eq!(table_size_for(11), 2039);
    assert_eq!(table_size_for(20), 2039);
    assert_eq!(table_size_for(21), 4093);
    assert_eq!(table_size_for(40), 4093);
    assert_eq!(table_size_for(41), 16381);
    assert_eq!(table_size_for(1000), 65521);
    // Past 655 backends at least 64 slots each; 65,521 holds 1,023 of them.
    assert_eq!(table_size_for(1023), 65521);
    assert_eq!(table_size_for(1024), 131_101);
    assert_eq!(table_size_for(MAX_MEMBERS as usize), MAX_TABLE_SIZE);
    for n in [656usize, 2048, 4096, 8192, 16384] {
        assert!(table_size_for(n) as usize >= 64 * n, "{n} backends");
    }
    assert_eq!(build(&backends(3), 4096), Err(MaglevError::SizeNotPrime(4096)));
}

#[test]
fn every_slot_is_filled_and_empty_input_gives_empty_table() {
    let t = build(&backends(7), 4093).unwrap();
    assert!(t.iter().all(|&id| id < 7));
    let empty = build(&[], 4093).unwrap();
    assert!(empty.iter().all(|&id| id == NO_BACKEND));
    let zero = build(&[MaglevBackend { id: 1, key: 5, weight: 0 }], 4093).unwrap();
    assert!(zero.iter().all(|&id| id == NO_BACKEND));
}

#[test]
fn duplicates_are_rejected() {
    let b = [MaglevBackend { id: 1, key: 5, weight: 1 }, MaglevBackend { id: 2, key: 5, weight: 1 }];
    assert!(matches!(build(&b, 4093), Err(MaglevError::Duplicate { .. })));
    let b = [MaglevBackend { id: 1, key: 5, weight: 1 }, MaglevBackend { id: 1, key: 6, weight: 1 }];
    assert!(matches!(build(&b, 4093), Err(MaglevError::Duplicate { .. })));
}

/// Golden table: a change of algorithm changes every gateway's placement, so it must be
/// deliberate (and every gateway upgraded together).
#[test]
fn golden_small_table() {
    let b = [
        MaglevBackend { id: 10, key: 1, weight: 1 },
        MaglevBackend { id: 11, key: 2, weight: 2 },
        MaglevBackend { id: 12, key: 3, weight: 5 },
    ];
    let t = build(&b, 13).unwrap();
    assert_eq!(t, GOLDEN_13);
    let c = [10, 11, 12].map(|id| t.iter().filter(|&&x| x == id).count());
    // 13 slots by weights 1:2:5 = 1.6 : 3.25 : 8.1, each within the slack (1 slot here) of
    // floor / ceil of its exact share.
    assert!(c[0] <= 3 && (2..=5).contains(&c[1]) && (7..=10).contains(&c[2]), "{c:?}");
}
const GOLDEN_13: [u32; 13] = [12, 10, 11, 12, 12, 12, 12, 12, 11, 12, 12, 12, 12];

#[test]
fn identical_inputs_give_identical_bytes_in_any_order() {
    let mut b = backends(50);
    for (i, x) in b.iter_mut().enumerate() {
        x.weight = 1 + (i as u32 * 7) % 13;
    }
    let t1 = build(&b, 16381).unwrap();
    b.reverse();
    let t2 = build(&b, 16381).unwrap();
    assert_eq!(t1, t2);
}

/// Table shares within 1 percentage point of weight shares for M >= 100 N. The credit scheme
/// gives each backend floor or ceil of its exact share per round, so the error is a few slots
/// (<= 1% of M needs an error below M / 100 >= N slots).
fn assert_shares(weights: &[u32], m: u32) {
    let n = weights.len() as u32;
    let mut b = backends(n);
    for (x, &w) in b.iter_mut().zip(weights) {
        x.weight = w;
    }
    let t = build(&b, m).unwrap();
    let c = counts(&t, n as usize);
    let total_w: u64 = weights.iter().map(|&w| w as u64).sum();
    for (i, &w) in weights.iter().enumerate() {
        let share = c[i] as f64 / m as f64;
        let want = w as f64 / total_w as f64;
        assert!((share - want).abs() <= 0.01, "backend {i}: share {share:.5} want {want:.5} (M={m}, N={n})");
    }
}

#[test]
fn shares_follow_weights() {
    assert_shares(&[1, 2, 5], 4093);
    assert_shares(&[1; 40], 4093);
    assert_shares(&(1..=100).collect::<Vec<_>>(), 16381);
    assert_shares(&(0..600).map(|i| 1 + i % 10).collect::<Vec<_>>(), 65521);
}

/// Removing one of N equal backends moves at most 2/N of the slots (Maglev's bound is about
/// 1/N for the removed backend's own slots plus a small reshuffle of the rest).
fn assert_removal_disruption(n: u32) {
    let m = table_size_for(n as usize);
    let all = backends(n);
    let t1 = build(&all, m).unwrap();
    let removed = n / 2;
    let rest: Vec<_> = all.iter().copied().filter(|b| b.id != removed).collect();
    let t2 = build(&rest, m).unwrap();
    let moved = t1.iter().zip(&t2).filter(|(a, b)| a != b).count();
    let limit = 2.0 / n as f64;
    let frac = moved as f64 / m as f64;
    assert!(frac <= limit, "N={n}: {frac:.5} of slots moved, limit {limit:.5}");
    assert!(t2.iter().all(|&id| id != removed));
}

#[test]
fn removal_moves_at_most_two_over_n_10() {
    assert_removal_disruption(10);
}
#[test]
fn removal_moves_at_most_two_over_n_100() {
    assert_removal_disruption(100);
}
#[test]
fn removal_moves_at_most_two_over_n_1000() {
    assert_removal_disruption(1000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn prop_table_is_full_and_deterministic(ws in proptest::collection::vec(1u32..1000, 1..60), seed in any::<u64>()) {
        let b: Vec<_> = ws.iter().enumerate().map(|(i, &w)| MaglevBackend {
            id: i as u32, key: backend_key(i as u32, 80, seed), weight: w }).collect();
        let m = table_size_for(b.len());
        let t1 = build(&b, m).unwrap();
        let mut rev = b.clone();
        rev.reverse();
        prop_assert_eq!(&t1, &build(&rev, m).unwrap());
        prop_assert!(t1.iter().all(|&id| (id as usize) < b.len()));
        let total_w: u64 = ws.iter().map(|&w| w as u64).sum();
        let c = counts(&t1, b.len());
        for (i, &w) in ws.iter().enumerate() {
            let share = c[i] as f64 / m as f64;
            let want = w as f64 / total_w as f64;
            prop_assert!((share - want).abs() <= 0.01, "{} {} {}", i, share, want);
        }
    }
}

/// The fill as first written: every backend visited every round, one look per credit of
/// `w_max`. [`build`] skips the idle visits and finishes the last slots by claims; both must
/// give byte-identical tables.
fn reference_build(backends: &[MaglevBackend], size: u32) -> Result<Vec<u32>, MaglevError> {
    let order = key_order(backends, size)?;
    let m = size as u64;
    let mut table = vec![NO_BACKEND; size as usize];
    if order.is_empty() {
        return Ok(table);
    }
    let (floors, caps) = capacities(&order, m);
    let offset: Vec<u64> = order.iter().map(|b| b.key % m).collect();
    let skip: Vec<u64> = order.iter().map(|b| 1 + rehash(b.key) % (m - 1).max(1)).collect();
    let slot_of = |i: usize, rank: u64| ((offset[i] + rank * skip[i]) % m) as usize;
    let w_max = order.iter().map(|b| b.weight as u64).max().unwrap_or(1);
    // `owner` holds indices into `order` while building.
    let mut owner = vec![usize::MAX; size as usize];
    let mut next = vec![0u64; order.len()];
    let mut credit = vec![0u64; order.len()];
    let mut got = vec![0u64; order.len()];
    let mut filled = 0u64;
    // Rank-synchronous rounds: every backend looks at as many of its next preferred slots as
    // its weight earns (w / w_max per round) and takes those still free while under its
    // capacity. A backend walks its whole permutation at most once (next < m), and the
    // capacities add up to at least m, so the loop ends with every slot filled.
    while filled < m {
        for (i, b) in order.iter().enumerate() {
            credit[i] += b.weight as u64;
            while credit[i] >= w_max {
                credit[i] -= w_max;
                if got[i] >= caps[i] || next[i] >= m {
                    continue;
                }
                let c = slot_of(i, next[i]);
                next[i] += 1;
                if owner[c] == usize::MAX {
                    owner[c] = i;
                    got[i] += 1;
                    filled += 1;
                }
            }
        }
    }
    // Repair: the slack lets some backends end above their exact share, so a slow (light)
    // backend can end more than `slack` below it. Each backend below its floor takes back, in
    // its own preference order, slots of backends that are above theirs. Since the floors
    // add up to at most m, this ends with every backend at or above its floor.
    for i in 0..order.len() {
        let mut rank = 0u64;
        while got[i] < floors[i] && rank < m {
            let c = slot_of(i, rank);
            rank += 1;
            let o = owner[c];
            if o != i && got[o] > floors[o] {
                owner[c] = i;
                got[o] -= 1;
                got[i] += 1;
            }
        }
    }
    for (t, &o) in table.iter_mut().zip(&owner) {
        *t = order[o].id;
    }
    Ok(table)
}

fn weighted(weights: &[u32], salt: u32) -> Vec<MaglevBackend> {
    weights
        .iter()
        .enumerate()
        .map(|(i, &w)| MaglevBackend {
            id: i as u32,
            key: backend_key(
                0x0a00_0000u32.wrapping_add((i as u32).wrapping_mul(7919)).wrapping_add(salt),
                8000u16.to_be(),
                0,
            ),
            weight: w,
        })
        .collect()
}

#[test]
fn fast_fill_matches_the_reference_on_wide_weight_ranges() {
    // Policy-like weights (33..1000), extreme ratios (a calendar turn wraps), and equal ones.
    let cases: Vec<Vec<u32>> = vec![
        (0..90).map(|i| 33 + (i * 131) % 968).collect(),
        vec![1, 1_000_000, 3, 70_000, 5],
        vec![1; 300],
        vec![u32::MAX, 1, u32::MAX / 3],
    ];
    for (n, w) in cases.iter().enumerate() {
        let b = weighted(w, n as u32);
        for m in [13, 4093, 16381] {
            if m < 16 && w.len() > 4 {
                continue;
            }
            assert_eq!(build(&b, m).unwrap(), reference_build(&b, m).unwrap(), "case {n}, m {m}");
        }
    }
}

/// The dense fill plays a short period of rounds from its schedule (the weights' common
/// divisor shortens it) and visits every backend each round when the period is too long: the
/// reference's bytes either way.
#[test]
fn dense_fill_matches_the_reference_scheduled_and_visiting() {
    let scheduled: Vec<u32> = (0..16).map(|j| 6 * (1 + j % 3)).collect();
    let visiting: Vec<u32> = (0..100).map(|j| 5000 + 37 * j).collect();
    let as_u64 = |w: &[u32]| w.iter().map(|&w| u64::from(w)).collect::<Vec<u64>>();
    let order = super::schedule(&as_u64(&scheduled), 18).expect("a period of 3 rounds");
    assert_eq!(order.len(), 31, "weights 1..3 after the divisor 6: 6 x 1 + 5 x 2 + 5 x 3 looks a period");
    assert!(super::schedule(&as_u64(&visiting), 8663).is_none(), "a period too long to schedule");
    for (n, w) in [scheduled, visiting].iter().enumerate() {
        let b = weighted(w, n as u32);
        for m in [4093, 16381] {
            assert_eq!(build(&b, m).unwrap(), reference_build(&b, m).unwrap(), "case {n}, m {m}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn fast_fill_matches_the_reference(weights in prop::collection::vec(0u32..5000, 1..120), salt: u32, big in any::<bool>()) {
        let b = weighted(&weights, salt);
        let m = if big { 16381 } else { 4093 };
        prop_assert_eq!(build(&b, m).unwrap(), reference_build(&b, m).unwrap());
    }

    /// Narrow weights (at most 8x apart) take the dense fill, which the wide draws above
    /// rarely reach: the same bytes as the reference there too.
    #[test]
    fn dense_fill_matches_the_reference(
        low in 1u32..400,
        spread in prop::collection::vec(0u32..=7, 1..70),
        salt: u32,
        big in any::<bool>(),
    ) {
        let weights: Vec<u32> = spread.iter().map(|&s| low + s * low / 7).collect();
        let b = weighted(&weights, salt);
        let m = if big { 16381 } else { 4093 };
        prop_assert_eq!(build(&b, m).unwrap(), reference_build(&b, m).unwrap());
    }
}

#[test]
fn the_largest_member_count_fills_the_largest_table_within_the_slack() {
    let n = MAX_MEMBERS;
    let m = table_size_for(n as usize);
    let t = build(&backends(n), m).unwrap();
    let c = counts(&t, n as usize);
    let exact = m as f64 / n as f64;
    // Slack clamp(M / N / 16, 1, 8) = 4 slots, and the repair pass lifts any backend below it.
    for (id, &got) in c.iter().enumerate() {
        assert!((got as f64 - exact).abs() <= 5.0, "backend {id}: {got} slots, exact {exact:.1}");
    }
}
