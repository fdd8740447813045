use proptest::prelude::*;

use super::{Full, Queues};

#[test]
fn the_highest_band_goes_first_and_a_band_is_first_come_first_served_for_one_tenant() {
    let mut q = Queues::new(3, vec![1], 10, 10);
    q.push(0, 0, 10, "low").unwrap();
    q.push(0, 2, 10, "high-1").unwrap();
    q.push(0, 1, 10, "mid").unwrap();
    q.push(0, 2, 10, "high-2").unwrap();
    let order: Vec<_> = std::iter::from_fn(|| q.pop().map(|(_, e)| e.value)).collect();
    assert_eq!(order, ["high-1", "high-2", "mid", "low"]);
    assert!(q.is_empty());
}

#[test]
fn peek_names_what_pop_takes() {
    let mut q = Queues::new(2, vec![1, 1], 10, 10);
    q.push(1, 0, 5, 'a').unwrap();
    q.push(0, 1, 5, 'b').unwrap();
    let (place, e) = q.peek().unwrap();
    let (id, value) = (e.id, e.value);
    let (popped, e) = q.pop().unwrap();
    assert_eq!((place, id, value), (popped, e.id, e.value));
}

/// Tenants that always wait are served tokens in the ratio of their weights. Each pop serves
/// one request, so after N pops the served tokens are off the ideal share by at most one
/// request's cost per tenant: with 3,000 pops of costs up to 100 the bound is far below 10 %.
#[test]
fn backlogged_tenants_share_tokens_by_weight() {
    let weights = vec![1, 2, 5];
    let mut q = Queues::new(1, weights.clone(), 10_000, 10_000);
    let costs = [7u64, 100, 31];
    for (t, &c) in costs.iter().enumerate() {
        for _ in 0..2_000 {
            q.push(t, 0, c, ()).unwrap();
        }
    }
    let mut served = [0u64; 3];
    for _ in 0..3_000 {
        let (p, e) = q.pop().unwrap();
        served[p.tenant] += e.cost;
    }
    let total: u64 = served.iter().sum();
    let wsum: u32 = weights.iter().sum();
    for (t, &w) in weights.iter().enumerate() {
        let share = served[t] as f64 / total as f64;
        let want = f64::from(w) / f64::from(wsum);
        assert!((share / want - 1.0).abs() < 0.1, "tenant {t}: share {share:.3}, weight share {want:.3}");
    }
}

/// Within the lag, tenants' requests go in arrival order whatever the weights; without it the
/// heavier tenant's newer requests go first.
#[test]
fn within_the_lag_requests_go_in_arrival_order() {
    let arrivals = [1usize, 1, 0, 1, 0, 0, 1, 0];
    let order = |lag| {
        let mut q = Queues::new(1, vec![3, 1], 100, 100).with_lag(lag);
        for (n, &t) in arrivals.iter().enumerate() {
            q.push(t, 0, 10, n).unwrap();
        }
        std::iter::from_fn(|| q.pop().map(|(_, e)| e.value)).collect::<Vec<_>>()
    };
    assert_eq!(order(1000), (0..arrivals.len()).collect::<Vec<_>>());
    assert_eq!(order(0), [0, 2, 4, 5, 7, 1, 3, 6], "by weight: tenant 0's four, then tenant 1's");
}

/// A tenant more than the lag ahead of the least served waiting one waits for it: its lead
/// stays within the lag plus one request.
#[test]
fn past_the_lag_the_tenant_ahead_waits() {
    let mut q = Queues::new(1, vec![1, 1], 100, 100).with_lag(20);
    for n in 0..10 {
        q.push(0, 0, 10, n).unwrap();
    }
    for n in 10..20 {
        q.push(1, 0, 10, n).unwrap();
    }
    let tenants: Vec<usize> = std::iter::from_fn(|| q.pop().map(|(p, _)| p.tenant)).collect();
    assert_eq!(tenants[..5], [0, 0, 0, 1, 0], "{tenants:?}");
    let mut served = [0i64; 2];
    for &t in &tenants[..16] {
        served[t] += 1;
        assert!((served[0] - served[1]).abs() <= 3, "{tenants:?}");
    }
}

/// Backlogged tenants share by weight with a lag too: it shifts the shares once, by its tokens.
#[test]
fn backlogged_tenants_share_by_weight_with_a_lag() {
    let mut q = Queues::new(1, vec![1, 3], 10_000, 10_000).with_lag(100);
    for _ in 0..2_000 {
        q.push(0, 0, 10, ()).unwrap();
        q.push(1, 0, 10, ()).unwrap();
    }
    let mut served = [0u64; 2];
    for _ in 0..2_000 {
        served[q.pop().unwrap().0.tenant] += 1;
    }
    let share = served[1] as f64 / 2_000.0;
    assert!((share / 0.75 - 1.0).abs() < 0.02, "tenant 1's share {share:.3}");
}

#[test]
fn a_tenant_idle_for_a_while_gets_no_credit_for_it() {
    let mut q = Queues::new(1, vec![1, 1], 1000, 1000);
    for _ in 0..100 {
        q.push(0, 0, 10, 0).unwrap();
    }
    for _ in 0..50 {
        q.pop().unwrap();
    }
    // Tenant 1 arrives late: it alternates with tenant 0 instead of taking 50 in a row.
    for _ in 0..10 {
        q.push(1, 0, 10, 1).unwrap();
    }
    let next: Vec<_> = (0..6).map(|_| q.pop().unwrap().1.value).collect();
    assert_eq!(next.iter().filter(|&&v| v == 1).count(), 3, "{next:?}");
}

#[test]
fn a_full_queue_evicts_the_newest_of_the_lowest_band_and_refuses_when_none_is_lower() {
    let mut q = Queues::new(3, vec![1, 1], 3, 3);
    q.push(0, 0, 1, "low-old").unwrap();
    q.push(1, 0, 1, "low-new").unwrap();
    q.push(0, 1, 1, "mid").unwrap();
    let (_, evicted) = q.push(1, 2, 1, "high").unwrap();
    let (place, e) = evicted.expect("the lowest band gives way");
    assert_eq!((place.band, place.tenant, e.value), (0, 1, "low-new"));
    // Full with bands 0, 1 and 2: another band 0 request has nothing below it.
    assert_eq!(q.push(0, 0, 1, "low-3").unwrap_err(), (Full::Queue, "low-3"));
    assert_eq!(q.len(), 3);
}

#[test]
fn a_tenant_at_its_bound_evicts_only_its_own_lower_requests() {
    let mut q = Queues::new(2, vec![1, 1], 10, 2);
    q.push(1, 0, 1, "other-low").unwrap();
    q.push(0, 0, 1, "own-low").unwrap();
    q.push(0, 1, 1, "own-high").unwrap();
    let (_, evicted) = q.push(0, 1, 1, "own-high-2").unwrap();
    assert_eq!(evicted.unwrap().1.value, "own-low");
    assert_eq!(q.push(0, 1, 1, "own-high-3").unwrap_err().0, Full::Tenant);
    assert_eq!(q.len(), 3);
}

#[test]
fn a_request_that_gives_up_is_removed() {
    let mut q = Queues::new(1, vec![1], 10, 10);
    let (a, _) = q.push(0, 0, 1, 'a').unwrap();
    q.push(0, 0, 1, 'b').unwrap();
    assert_eq!(q.remove(a).unwrap().value, 'a');
    assert!(q.remove(a).is_none(), "only once");
    assert_eq!(q.pop().unwrap().1.value, 'b');
    assert!(q.is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Push { tenant: usize, band: u8, cost: u64 },
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 0..4u8, 1..1000u64).prop_map(|(tenant, band, cost)| Op::Push { tenant, band, cost }),
        1 => Just(Op::Pop),
    ]
}

proptest! {
    /// Whatever arrives: the length and every tenant's stay within their bounds, a pop takes from
    /// the highest waiting band, and a request is refused for room only when nothing of a lower
    /// band waits (what it could have evicted).
    #[test]
    fn bounds_hold_and_no_higher_band_is_refused_while_a_lower_one_waits(ops in proptest::collection::vec(op(), 1..300)) {
        let mut q = Queues::new(4, vec![1, 2, 3], 16, 8);
        let mut waiting: Vec<Vec<usize>> = vec![vec![0; 4]; 3];
        for op in ops {
            match op {
                Op::Push { tenant, band, cost } => {
                    let lower_all = q.waiting_below(band);
                    let lower_own: usize = waiting[tenant][..usize::from(band)].iter().sum();
                    match q.push(tenant, band, cost, ()) {
                        Ok((_, evicted)) => {
                            waiting[tenant][usize::from(band)] += 1;
                            if let Some((p, _)) = evicted {
                                prop_assert!(p.band < band);
                                waiting[p.tenant][usize::from(p.band)] -= 1;
                            }
                        }
                        Err((Full::Queue, ())) => prop_assert_eq!(lower_all, 0),
                        Err((Full::Tenant, ())) => prop_assert_eq!(lower_own, 0),
                    }
                }
                Op::Pop => {
                    let highest = (0..4u8).rev().find(|&b| waiting.iter().any(|t| t[usize::from(b)] > 0));
                    match q.pop() {
                        Some((p, _)) => {
                            prop_assert_eq!(Some(p.band), highest);
                            waiting[p.tenant][usize::from(p.band)] -= 1;
                        }
                        None => prop_assert_eq!(highest, None),
                    }
                }
            }
            prop_assert!(q.len() <= 16);
            for t in &waiting {
                prop_assert!(t.iter().sum::<usize>() <= 8);
            }
            prop_assert_eq!(q.len(), waiting.iter().flatten().sum::<usize>());
        }
    }
}
