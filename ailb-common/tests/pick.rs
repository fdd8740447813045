//! The per-connection pick against in-memory maps: the same code the kernel runs.

use ailb_common::{
    hash::fmix64,
    pick::{load_bound, pick, pick_for, ClientFamily, Outcome, PickMaps, PickRequest, VecMaps},
    AffinityValue, Backend, GlobalConfig, ModelState, BACKEND_IPV6, BACKEND_LIVE, CONFIG_AFFINITY, CONFIG_ROUND_ROBIN,
    MEM_UNKNOWN, MODEL_AVAILABLE, NO_BACKEND, NO_CAP,
};
use proptest::prelude::*;

const MODEL: u32 = 3;

struct Fleet {
    maps: VecMaps,
    state: ModelState,
    cfg: GlobalConfig,
}

/// The in-memory maps, checking that the pick reads only the active row.
impl PickMaps for Fleet {
    fn backend(&self, id: u32) -> Option<Backend> {
        self.maps.backend(id)
    }
    fn inflight(&self, id: u32) -> u64 {
        self.maps.inflight(id)
    }
    fn inflight_mem(&self, id: u32) -> u64 {
        self.maps.inflight_mem(id)
    }
    fn table_entry(&self, pos: u32) -> Option<u32> {
        let slot = self.state.active_slot();
        let index = pos.checked_sub(slot.table_offset);
        assert!(index.is_some_and(|i| i < slot.size), "the pick must read the active table, not position {pos}");
        self.maps.table_entry(pos)
    }
    fn member(&self, pos: u32) -> Option<u32> {
        let slot = self.state.active_slot();
        let index = pos.checked_sub(slot.member_offset);
        assert!(index.is_some_and(|i| i < slot.members), "the pick must read the active members, not position {pos}");
        self.maps.member(pos)
    }
    fn prefix_holders(&self, model: u32, key: u64) -> Option<&ailb_common::PrefixHolders> {
        self.maps.prefix_holders(model, key)
    }
}

impl Fleet {
    /// Backends with these weights and free memory (MB), all live.
    fn new(weights: &[u32], free_mb: &[u32]) -> Self {
        let backends: Vec<Backend> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Backend {
                addr: 0x0b00_007f + ((i as u32) << 24),
                port: 8000u16.to_be(),
                model: MODEL,
                weight: w,
                cap: NO_CAP,
                free_mem_mb: free_mb.get(i).copied().unwrap_or(MEM_UNKNOWN),
                state: BACKEND_LIVE,
                ..Default::default()
            })
            .collect();
        let (maps, state) = VecMaps::one_model(MODEL, 1, backends);
        Self { maps, state, cfg: GlobalConfig::defaults() }
    }

    fn total(&self) -> u64 {
        self.maps.inflight.iter().sum()
    }

    fn req(&self, hash: u64) -> PickRequest {
        PickRequest {
            model: MODEL,
            hash,
            has_conversation: false,
            required_mem_mb: 0,
            affinity: None,
            now_ns: 1_000,
            model_inflight: self.total(),
            turn: 0,
            affinity_bounded: false,
        }
    }

    fn pick(&self, r: &PickRequest) -> ailb_common::pick::PickResult {
        pick(self, &self.state, &self.cfg, r)
    }
}

/// With short connections (nothing in flight) the picks follow the weights. 100,000
/// deterministic pseudo-random hashes: the sampling error of a share p is about
/// sqrt(p(1-p)/n) <= 0.16 percentage points, the table's own error under 0.3 points,
/// so 1 point is a bound with a wide margin, not a tuned threshold.
#[test]
fn unloaded_picks_follow_weights() {
    let f = Fleet::new(&[1, 2, 5], &[]);
    let mut counts = [0u32; 3];
    let n = 100_000u64;
    for i in 0..n {
        let r = f.pick(&f.req(fmix64(i)));
        assert_eq!(r.outcome, Outcome::Primary);
        counts[r.backend as usize] += 1;
    }
    for (i, want) in [0.125, 0.25, 0.625].iter().enumerate() {
        let got = counts[i] as f64 / n as f64;
        assert!((got - want).abs() < 0.01, "backend {i}: {got:.4} vs {want}");
    }
}

/// A remote client's address (`affinity_bounded`) keeps its backend only under the load bound;
/// a conversation's entry keeps it through any load under the hard cap.
#[test]
fn a_client_address_entry_holds_only_under_the_load_bound() {
    let mut f = Fleet::new(&[1, 1, 1], &[]);
    let mut r = f.req(fmix64(7));
    r.has_conversation = true;
    r.affinity = Some(AffinityValue { backend: 1, _pad: 0, last_seen_ns: 900 });
    // Backend 1 holds 10 of the model's 12 connections: far over ceil(1.25 * 13 / 3) = 6.
    f.maps.inflight[..3].copy_from_slice(&[1, 10, 1]);
    r.model_inflight = f.total();
    let conversation = f.pick(&r);
    assert_eq!((conversation.outcome, conversation.backend), (Outcome::AffinityHit, 1));
    r.affinity_bounded = true;
    let client = f.pick(&r);
    assert!(client.affinity_break && client.backend != 1, "{client:?}");
    // At the bound's edge: 5 of 7 in flight, bound ceil(1.25 * 8 / 3) = 4: still over.
    f.maps.inflight[..3].copy_from_slice(&[1, 5, 1]);
    r.model_inflight = f.total();
    assert!(f.pick(&r).affinity_break);
    // Under it: 2 of 6, bound ceil(1.25 * 7 / 3) = 3.
    f.maps.inflight[..3].copy_from_slice(&[2, 2, 2]);
    r.model_inflight = f.total();
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
    // Without the load bound configured, the entry holds whatever the load.
    f.maps.inflight[..3].copy_from_slice(&[1, 10, 1]);
    r.model_inflight = f.total();
    f.cfg.flags &= !ailb_common::CONFIG_LOAD_BOUND;
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
}

#[test]
fn affinity_is_kept_while_usable_and_broken_otherwise() {
    let mut f = Fleet::new(&[1, 1, 1], &[80_000, 24_000, 24_000]);
    let mut r = f.req(fmix64(7));
    r.has_conversation = true;
    r.affinity = Some(AffinityValue { backend: 1, _pad: 0, last_seen_ns: 900 });
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
    assert_eq!(f.pick(&r).backend, 1);

    // Memory hint no longer fits: re-pick, counted as a break, onto the only backend that fits.
    r.required_mem_mb = 30_000;
    let p = f.pick(&r);
    assert!(p.affinity_break && p.backend == 0, "{p:?}");
    r.required_mem_mb = 0;

    // It would fit once its requests in flight finish, but not now. Active 100 ns ago
    // (last_seen 900, now 1000): waited for while the affinity wait is at least that long
    // (its prefix is likely still cached there).
    f.maps.backends[1].mem_capacity_mb = 24_000;
    f.maps.inflight_mem[1] = 20_000;
    r.required_mem_mb = 8_000;
    f.cfg.affinity_wait_ns = 100;
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
    // Active longer ago than the wait: not waited for (a break), taken by a backend with room now.
    f.cfg.affinity_wait_ns = 99;
    let p = f.pick(&r);
    assert!(p.affinity_break && p.backend != 1 && p.outcome != Outcome::Fallback, "{p:?}");
    // Never waiting (0) either.
    f.cfg.affinity_wait_ns = 0;
    assert!(f.pick(&r).affinity_break);
    // A hint it could never hold breaks the entry however recent.
    f.cfg.affinity_wait_ns = u64::MAX;
    r.required_mem_mb = 30_000;
    assert!(f.pick(&r).affinity_break);
    r.required_mem_mb = 8_000;
    f.cfg.affinity_wait_ns = 0;
    // Room again: the entry holds, whatever the wait.
    f.maps.inflight_mem[1] = 16_000;
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
    f.maps.inflight_mem[1] = 0;
    r.required_mem_mb = 0;

    // Backend drained (not live): break, and never the drained one.
    f.maps.backends[1].state = 0;
    let p = f.pick(&r);
    assert!(p.affinity_break && p.backend != 1, "{p:?}");
    f.maps.backends[1].state = BACKEND_LIVE;

    // Over its hard cap: break.
    f.maps.backends[1].cap = 2;
    f.maps.inflight[1] = 2;
    let p = f.pick(&r);
    assert!(p.affinity_break && p.backend != 1, "{p:?}");
    f.maps.backends[1].cap = NO_CAP;
    f.maps.inflight[1] = 0;

    // Backend of another model (id reused): break.
    f.maps.backends[1].model = MODEL + 1;
    assert!(f.pick(&r).affinity_break);
    f.maps.backends[1].model = MODEL;

    // Expired entry: a miss, not a break.
    f.cfg.affinity_ttl_ns = 50;
    let p = f.pick(&r);
    assert!(!p.affinity_break && p.outcome != Outcome::AffinityHit, "{p:?}");

    // A model's own TTL overrides the global one.
    f.state.affinity_ttl_ns = 10_000;
    assert_eq!(f.pick(&r).outcome, Outcome::AffinityHit);
    f.state.affinity_ttl_ns = 0;

    // Affinity off: the entry is ignored.
    f.cfg.affinity_ttl_ns = 0;
    f.cfg.flags &= !ailb_common::CONFIG_AFFINITY;
    assert_ne!(f.pick(&r).outcome, Outcome::AffinityHit);
}

#[test]
fn unavailable_model_and_no_fit_are_refused() {
    let mut f = Fleet::new(&[1, 1], &[4_000, 6_000]);
    let mut r = f.req(1);
    r.required_mem_mb = 8_000;
    let p = f.pick(&r);
    assert_eq!((p.backend, p.outcome), (NO_BACKEND, Outcome::NoFit));
    r.required_mem_mb = 5_000;
    assert_eq!(f.pick(&r).backend, 1);
    f.state.flags = 0;
    assert_eq!(f.pick(&r).outcome, Outcome::NoBackend);
    f.state.flags = MODEL_AVAILABLE;
    for b in &mut f.maps.backends {
        b.state = 0;
    }
    assert_eq!(f.pick(&r).outcome, Outcome::NoBackend);
}

#[test]
fn a_hint_no_backend_has_free_now_waits_where_it_should_finish_first() {
    // Free now 1000 / 2000 / 3000 MB; when idle 10000 / 1500 / 12000 MB; weights 1 / 1 / 2.
    let mut f = Fleet::new(&[1, 1, 2], &[1_000, 2_000, 3_000]);
    for (b, cap) in f.maps.backends.iter_mut().zip([10_000, 1_500, 12_000]) {
        b.mem_capacity_mb = cap;
    }
    let mut r = f.req(7);
    r.required_mem_mb = 5_000;
    f.maps.inflight = vec![1, 0, 6];
    r.model_inflight = 7;
    // (hinted MB in flight + 5000) / (capacity x weight): 14000 / 10000 = 1.4 against
    // 11000 / 24000 = 0.46. The third, although its connections per weight (6 / 2) are three
    // times the first's, holds less memory per capacity and is twice as fast; the second never fits.
    f.maps.inflight_mem = vec![9_000, 0, 6_000];
    let p = f.pick(&r);
    assert_eq!((p.backend, p.outcome), (2, Outcome::Fallback));
    // A longer memory queue there: 35000 / 24000 = 1.46 > 1.4, the first.
    f.maps.inflight_mem = vec![9_000, 0, 30_000];
    assert_eq!(f.pick(&r).backend, 0);
    // A capacity that is not known counts as the request's own size: 35000 / 10000 > 1.4.
    f.maps.backends[2].mem_capacity_mb = MEM_UNKNOWN;
    f.maps.inflight_mem = vec![9_000, 0, 30_000];
    assert_eq!(f.pick(&r).backend, 0);
    f.maps.backends[2].mem_capacity_mb = 12_000;
    f.maps.inflight_mem = vec![0; 3];
    // Something fits now: the normal pick, no waiting.
    r.required_mem_mb = 2_500;
    assert_eq!(f.pick(&r).backend, 2);
    // Larger than any backend ever holds: refused.
    r.required_mem_mb = 13_000;
    assert_eq!(f.pick(&r).outcome, Outcome::NoFit);
    // Capacity 0 means no fallback (the static default).
    for b in &mut f.maps.backends {
        b.mem_capacity_mb = 0;
    }
    r.required_mem_mb = 5_000;
    assert_eq!(f.pick(&r).outcome, Outcome::NoFit);
}

#[test]
fn round_robin_takes_members_in_turn_and_skips_dead_ones() {
    let mut f = Fleet::new(&[1, 5, 1, 9], &[]);
    f.cfg.flags = CONFIG_ROUND_ROBIN;
    let picks: Vec<u32> = (0..8u64)
        .map(|turn| {
            let r = f.pick(&PickRequest { turn, ..f.req(fmix64(turn)) });
            assert_eq!(r.outcome, Outcome::Primary);
            r.backend
        })
        .collect();
    assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3], "weights are not used: each member in turn");
    // A member that died since the table was written: the table pick decides instead.
    f.maps.backends[2].state = 0;
    let r = f.pick(&PickRequest { turn: 2, ..f.req(7) });
    assert_ne!(r.backend, 2);
    assert_ne!(r.backend, NO_BACKEND);
    // An affinity entry still wins when affinity is on.
    f.cfg.flags = CONFIG_ROUND_ROBIN | CONFIG_AFFINITY;
    let aff = AffinityValue { backend: 3, _pad: 0, last_seen_ns: 900 };
    let r = f.pick(&PickRequest { turn: 0, has_conversation: true, affinity: Some(aff), ..f.req(7) });
    assert_eq!((r.backend, r.outcome), (3, Outcome::AffinityHit));
}

#[test]
fn load_bound_matches_its_formula() {
    // ceil(1.25 * (7 + 1) * 2 / 8) = ceil(2.5) = 3
    assert_eq!(load_bound(1250, 7, 2, 8), 3);
    assert_eq!(load_bound(1250, 0, 1, 8), 1);
    assert_eq!(load_bound(1000, 9, 5, 5), 10);
    assert_eq!(load_bound(1250, 0, 1, 0), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Long-held connections placed one after another: after every placement each backend is
    /// within its bound ceil(c * T * w / W), T the total in flight (this connection included).
    /// Holds for any weights because the least-loaded fallback is always under its bound.
    #[test]
    fn held_connections_never_exceed_the_bound(
        weights in proptest::collection::vec(1u32..50, 1..12),
        conns in 1usize..400,
        seed in any::<u64>(),
        c in 1050u32..3000,
    ) {
        let mut f = Fleet::new(&weights, &[]);
        f.cfg.load_factor_milli = c;
        let total_w: u64 = weights.iter().map(|&w| w as u64).sum();
        for i in 0..conns {
            let r = f.req(fmix64(seed ^ i as u64));
            let p = f.pick(&r);
            prop_assert!(p.backend != NO_BACKEND);
            f.maps.inflight[p.backend as usize] += 1;
            let t = f.total();
            for (b, &w) in weights.iter().enumerate() {
                let bound = load_bound(c, t - 1, w, total_w);
                prop_assert!(f.maps.inflight[b] <= bound, "backend {} has {} > bound {} (T={})", b, f.maps.inflight[b], bound, t);
            }
        }
    }

    /// A memory hint never lands on a backend with less free memory while one that fits exists.
    #[test]
    fn memory_hint_is_respected(
        free in proptest::collection::vec(1_000u32..100_000, 1..10),
        need in 1u32..100_000,
        held in proptest::collection::vec(0u64..20, 10),
        hash in any::<u64>(),
    ) {
        let weights = vec![1; free.len()];
        let mut f = Fleet::new(&weights, &free);
        for (i, h) in held.iter().enumerate().take(free.len()) {
            f.maps.inflight[i] = *h;
        }
        let mut r = f.req(hash);
        r.required_mem_mb = need;
        let p = f.pick(&r);
        if free.iter().any(|&m| m >= need) {
            prop_assert!(p.backend != NO_BACKEND);
            prop_assert!(free[p.backend as usize] >= need, "picked {} MB for {} MB", free[p.backend as usize], need);
        } else {
            prop_assert_eq!(p.outcome, Outcome::NoFit);
        }
    }

    /// Same maps, same request: same answer (the kernel and `ailb explain` must agree).
    #[test]
    fn pick_is_deterministic(weights in proptest::collection::vec(1u32..100, 1..20), hash in any::<u64>()) {
        let f = Fleet::new(&weights, &[]);
        let r = f.req(hash);
        prop_assert_eq!(f.pick(&r), f.pick(&r));
    }
}

/// The memory hints in flight count against a backend's idle capacity at once: a burst of
/// hinted connects to one backend spreads before the daemon writes new free memory; when no
/// backend has room now, the request queues on one that holds it when idle.
#[test]
fn memory_in_flight_counts_against_capacity() {
    let mut f = Fleet::new(&[1, 1], &[24_000, 24_000]);
    for b in &mut f.maps.backends {
        b.mem_capacity_mb = 24_000;
    }
    let mut r = f.req(fmix64(3));
    r.required_mem_mb = 8_000;
    let first = f.pick(&r).backend as usize;
    let other = 1 - first;
    // Two 8 GB requests in flight on the first: 8 GB left, still fits.
    f.maps.inflight[first] = 2;
    f.maps.inflight_mem[first] = 16_000;
    f.cfg.load_factor_milli = 100_000; // no load bound in the way
    let r2 = PickRequest { model_inflight: f.total(), ..r };
    assert_eq!(f.pick(&r2).backend as usize, first);
    // A third: nothing left there now (the written free memory still says 24 GB).
    f.maps.inflight[first] = 3;
    f.maps.inflight_mem[first] = 24_000;
    let r3 = PickRequest { model_inflight: f.total(), ..r };
    let got = f.pick(&r3);
    assert_eq!(got.backend as usize, other, "{got:?}");
    // Both full: it waits where its memory queue is shorter, (20000 + 8000) / 24000 against
    // (24000 + 8000) / 24000.
    f.maps.inflight[other] = 1;
    f.maps.inflight_mem[other] = 20_000;
    let r4 = PickRequest { model_inflight: f.total(), ..r };
    let got = f.pick(&r4);
    assert_eq!((got.backend as usize, got.outcome), (other, Outcome::Fallback), "{got:?}");
    // An unhinted connect ignores the memory counters.
    let r5 = PickRequest { required_mem_mb: 0, model_inflight: f.total(), ..r };
    assert_ne!(f.pick(&r5).outcome, Outcome::NoFit);
    // free_now_mb: the smaller of the written free memory and capacity less the hints.
    let b = Backend { free_mem_mb: 10_000, mem_capacity_mb: 24_000, ..Default::default() };
    assert_eq!(b.free_now_mb(0), 10_000);
    assert_eq!(b.free_now_mb(20_000), 4_000);
    assert_eq!(b.free_now_mb(30_000), 0);
    let unknown = Backend { free_mem_mb: MEM_UNKNOWN, mem_capacity_mb: 0, ..Default::default() };
    assert_eq!(unknown.free_now_mb(1 << 40), MEM_UNKNOWN);
    let cap_only = Backend { free_mem_mb: MEM_UNKNOWN, mem_capacity_mb: 24_000, ..Default::default() };
    assert_eq!(cap_only.free_now_mb(4_000), 20_000);
}

/// A mixed model (weights 1:2:5, the weight-5 backend IPv6): an IPv4 client never gets the
/// IPv6 backend and splits 1:2 over the others; an IPv6 client reaches all three, 1:2:5.
#[test]
fn the_client_family_decides_which_backends_a_pick_reaches() {
    let mut f = Fleet::new(&[1, 2, 5], &[]);
    f.maps.backends[2].state |= BACKEND_IPV6;
    let n = 100_000u64;
    let (mut v4, mut v6) = ([0u32; 3], [0u32; 3]);
    let (mut probed, mut fallbacks) = ([0u32; 3], 0u32);
    for i in 0..n {
        let r = f.req(fmix64(i));
        let p4 = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv4);
        assert_ne!(p4.backend, NO_BACKEND, "{p4:?}");
        v4[p4.backend as usize] += 1;
        match p4.outcome {
            Outcome::Primary | Outcome::Spill => probed[p4.backend as usize] += 1,
            Outcome::Fallback => fallbacks += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
        let p6 = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv6);
        v6[p6.backend as usize] += 1;
    }
    assert_eq!(v4[2], 0, "an IPv4 client reached the IPv6 backend");
    // The picks the probes decide split 1:2. The rest are the hashes whose 4 probed slots
    // all hold the IPv6 backend (about q^4 = (5/8)^4 = 15.3 % of them; the slots of one
    // hash are distinct, so not quite independent draws: 2 points of slack), which the
    // member scan, with nothing in flight, gives to the first member.
    // The table's own shares (each within the fill's slack of 1:2:5) are what the hashes
    // sample.
    let slots: Vec<f64> = (0..3u32)
        .map(|b| f.maps.table.iter().filter(|&&id| id == b).count() as f64 / f.maps.table.len() as f64)
        .collect();
    for (got, want) in slots.iter().zip([0.125, 0.25, 0.625]) {
        assert!((got - want).abs() < 0.01, "table shares {slots:?}");
    }
    let share = probed[0] as f64 / (probed[0] + probed[1]) as f64;
    let want = slots[0] / (slots[0] + slots[1]);
    assert!((share - want).abs() < 0.01, "IPv4 probed split {probed:?}, table {want:.4}");
    let q4 = (5.0f64 / 8.0).powi(f.cfg.probes as i32);
    let fell = fallbacks as f64 / n as f64;
    assert!((fell - q4).abs() < 0.02, "IPv4 fallbacks {fell:.4} vs {q4:.4}");
    assert_eq!(v4[0], probed[0] + fallbacks, "fallbacks go to the first member: {v4:?} {probed:?}");
    for (i, want) in slots.iter().enumerate() {
        let got = v6[i] as f64 / n as f64;
        assert!((got - want).abs() < 0.01, "IPv6 client, backend {i}: {got:.4} vs {want:.4}");
    }
    // `pick` is the IPv4 client's pick.
    let r = f.req(fmix64(3));
    assert_eq!(f.pick(&r), pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv4));
}

/// An affinity entry naming a backend the client cannot reach is not used (a break); the
/// same entry holds for a client that can. A model with only IPv6 backends has no backend
/// for an IPv4 client, also when its fallback scans the members.
#[test]
fn affinity_and_fallback_skip_a_backend_of_the_other_family() {
    let mut f = Fleet::new(&[1, 1, 1], &[]);
    f.maps.backends[1].state |= BACKEND_IPV6;
    let mut r = f.req(fmix64(11));
    r.has_conversation = true;
    r.affinity = Some(AffinityValue { backend: 1, _pad: 0, last_seen_ns: 900 });
    let p6 = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv6);
    assert_eq!((p6.backend, p6.outcome), (1, Outcome::AffinityHit));
    let p4 = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv4);
    assert!(p4.affinity_break && p4.backend != 1 && p4.backend != NO_BACKEND, "{p4:?}");

    // Every probe over its bound: the member scan chooses, still never the IPv6 backend.
    f.cfg.probes = 1;
    f.maps.inflight = vec![50, 0, 50];
    r.affinity = None;
    r.model_inflight = 100;
    for h in 0..64 {
        r.hash = fmix64(h);
        let p = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv4);
        assert!(p.backend == 0 || p.backend == 2, "{p:?}");
    }

    for b in &mut f.maps.backends {
        b.state |= BACKEND_IPV6;
    }
    let p = pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv4);
    assert_eq!((p.backend, p.outcome), (NO_BACKEND, Outcome::NoBackend));
    assert_ne!(pick_for(&f, &f.state, &f.cfg, &r, ClientFamily::Ipv6).backend, NO_BACKEND);
}

/// The TC datapath's IPv6 client (`Ipv6Only`, no NAT64) reaches the model's IPv6 backends
/// only, split by their weights; a model without one has no backend for it.
#[test]
fn an_ipv6_only_client_never_gets_an_ipv4_backend() {
    let mut f = Fleet::new(&[1, 2, 5], &[]);
    f.maps.backends[1].state |= BACKEND_IPV6;
    f.maps.backends[2].state |= BACKEND_IPV6;
    let n = 20_000u64;
    let mut got = [0u32; 3];
    for i in 0..n {
        let p = pick_for(&f, &f.state, &f.cfg, &f.req(fmix64(i)), ClientFamily::Ipv6Only);
        assert_ne!(p.backend, NO_BACKEND, "{p:?}");
        got[p.backend as usize] += 1;
    }
    assert_eq!(got[0], 0, "an IPv6-only client reached the IPv4 backend: {got:?}");
    let share = got[1] as f64 / n as f64;
    // Probes that land on the IPv4 backend's slots are spent: (1/8)^4 of the picks fall back
    // to the member scan, which takes the first reachable member; 2:5 otherwise.
    assert!((share - 2.0 / 7.0).abs() < 0.02, "IPv6 backends 2:5 split {got:?}");
    for b in &mut f.maps.backends {
        b.state &= !BACKEND_IPV6;
    }
    let p = pick_for(&f, &f.state, &f.cfg, &f.req(fmix64(7)), ClientFamily::Ipv6Only);
    assert_eq!((p.backend, p.outcome), (NO_BACKEND, Outcome::NoBackend));
}
