//! The pick's prefix step against in-memory maps (`VecMaps`): the same code the kernel runs.

use std::cell::Cell;
use std::collections::BTreeSet;

use ailb_common::{
    hash::fmix64,
    pick::{
        keys_wanted, pick_prefixed, uncached_need, ClientFamily, Outcome, PickMaps, PickRequest, PrefixQuery,
        PrefixUse, VecMaps,
    },
    prefix::{sent, text_keys},
    AffinityValue, Backend, GlobalConfig, ModelState, PrefixHolders, BACKEND_LIVE, MEM_UNKNOWN, MODEL_PREFIX_EVENTS,
    MODEL_PREFIX_LEARN, NO_CAP, PREFIX_SEEN_EXACT, PREFIX_TICK_SHIFT,
};
use proptest::prelude::*;

const MODEL: u32 = 2;
const NOW: u32 = 1_000;

/// In-memory maps that count the prefix map's lookups.
struct Fleet {
    maps: VecMaps,
    state: ModelState,
    cfg: GlobalConfig,
    lookups: Cell<u32>,
}

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
        self.maps.table_entry(pos)
    }
    fn member(&self, pos: u32) -> Option<u32> {
        self.maps.member(pos)
    }
    fn prefix_holders(&self, model: u32, key: u64) -> Option<&PrefixHolders> {
        self.lookups.set(self.lookups.get() + 1);
        self.maps.prefix_holders(model, key)
    }
    fn prefix_maybe_held(&self, model: u32, key: u64) -> bool {
        self.maps.prefix_maybe_held(model, key)
    }
}

impl Fleet {
    fn new(n: usize, flags: u32) -> Self {
        let backends = (0..n)
            .map(|i| Backend {
                addr: 0x0100_007f + ((i as u32) << 24),
                port: 8000u16.to_be(),
                model: MODEL,
                weight: 1,
                cap: NO_CAP,
                free_mem_mb: MEM_UNKNOWN,
                state: BACKEND_LIVE,
                ..Default::default()
            })
            .collect();
        let (maps, mut state) = VecMaps::one_model(MODEL, 0, backends);
        state.flags |= flags;
        Self { maps, state, cfg: GlobalConfig::defaults(), lookups: Cell::new(0) }
    }

    /// Records that backend `id` holds `keys` (exact, as the daemon writes from KV events).
    fn hold(&mut self, id: u32, keys: &[u64], seen: u32) {
        for &k in keys {
            let e = self.maps.prefix.entry((MODEL, k)).or_default();
            e.record(id, seen, NOW, 0);
        }
    }

    fn req(&self) -> PickRequest {
        PickRequest {
            model: MODEL,
            hash: 0x1234_5678_9abc_def0,
            has_conversation: false,
            required_mem_mb: 0,
            affinity: None,
            now_ns: 5_000,
            model_inflight: self.maps.inflight.iter().sum(),
            turn: 0,
            affinity_bounded: false,
        }
    }

    fn pick_with(&self, req: &PickRequest, keys: &[u64], ttl_ticks: u32) -> Picked {
        self.lookups.set(0);
        let q = PrefixQuery { keys, now_tick: NOW, ttl_ticks };
        let (r, prefix) = pick_prefixed(self, &self.state.view(), &self.cfg, req, ClientFamily::Ipv4, Some(&q));
        Picked { backend: r.backend, outcome: r.outcome, prefix }
    }

    fn pick(&self, keys: &[u64]) -> Picked {
        self.pick_with(&self.req(), keys, 0)
    }
}

/// A pick and the prefix step's verdict.
#[derive(Debug)]
struct Picked {
    backend: u32,
    outcome: Outcome,
    prefix: ailb_common::pick::PrefixVerdict,
}

/// The keys a prompt sends: `prefix::sent` over its text keys.
fn sent_keys(prompt: &[u8]) -> Vec<u64> {
    sent(&text_keys(prompt)).map(|(_, k)| k).collect()
}

fn prompt(system: &str, user: &str) -> Vec<u8> {
    format!("{}|{}", system.repeat(40), user).into_bytes()
}

#[test]
fn the_holder_of_the_whole_prompt_is_taken() {
    let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
    let p = prompt("You are a helpful assistant of tenant seven. ", "hello");
    let all = text_keys(&p);
    f.hold(2, &all, PREFIX_SEEN_EXACT);
    let keys = sent_keys(&p);
    let r = f.pick(&keys);
    assert_eq!((r.backend, r.outcome), (2, Outcome::Prefix));
    assert_eq!(r.prefix.usage, PrefixUse::Used);
    assert_eq!((r.prefix.found, r.prefix.sent), (keys.len() as u8, keys.len() as u8));
    assert!(f.lookups.get() <= ailb_common::pick::SEARCH_STEPS + 1, "{} lookups", f.lookups.get());
}

#[test]
fn the_longest_held_prefix_wins_over_a_shorter_one() {
    let mut f = Fleet::new(3, MODEL_PREFIX_EVENTS);
    // 16 blocks sent one each (16 * 64 bytes).
    let p: Vec<u8> = (0..16 * 64).map(|i| b'a' + (i % 23) as u8).collect();
    let all = text_keys(&p);
    assert_eq!(all.len(), 16);
    f.hold(0, &all[..3], PREFIX_SEEN_EXACT);
    f.hold(1, &all[..11], PREFIX_SEEN_EXACT);
    let r = f.pick(&all);
    assert_eq!((r.backend, r.prefix.found), (1, 11));
}

#[test]
fn a_holder_that_left_is_never_taken() {
    let mut f = Fleet::new(3, MODEL_PREFIX_EVENTS);
    let p: Vec<u8> = (0..16 * 64).map(|i| b'a' + (i % 19) as u8).collect();
    let all = text_keys(&p);
    f.hold(0, &all[..5], PREFIX_SEEN_EXACT);
    f.hold(1, &all, PREFIX_SEEN_EXACT);
    f.maps.backends[1].state = 0;
    // Its entries hide the shorter prefix until the daemon removes it from the map (it does
    // when the backend is retired): the verdict says so, and the table decides.
    let r = f.pick(&all);
    assert_eq!((r.prefix.usage, r.prefix.found), (PrefixUse::Gone, 16));
    assert_ne!(r.backend, 1);
    // Another model's backend is no holder either.
    f.maps.backends[1].state = BACKEND_LIVE;
    f.maps.backends[1].model = MODEL + 1;
    let r = f.pick(&all);
    assert_eq!((r.prefix.usage, r.outcome == Outcome::Prefix), (PrefixUse::Gone, false), "{r:?}");
    // Removed from the map, the live shorter prefix is found.
    for k in &all {
        if let Some(h) = f.maps.prefix.get_mut(&(MODEL, *k)) {
            h.remove(1);
        }
    }
    f.maps.prefix.retain(|_, h| !h.is_empty());
    let r = f.pick(&all);
    assert_eq!((r.backend, r.prefix.found, r.outcome), (0, 5, Outcome::Prefix));
}

#[test]
fn learnt_entries_age_out_and_exact_ones_do_not() {
    let mut f = Fleet::new(2, MODEL_PREFIX_LEARN);
    let p = prompt("Old tenant prompt. ", "x");
    let keys = sent_keys(&p);
    f.hold(1, &text_keys(&p), NOW - 100);
    assert_eq!(f.pick_with(&f.req(), &keys, 50).prefix.usage, PrefixUse::NotHeld, "100 ticks old, lifetime 50");
    assert_eq!(f.pick_with(&f.req(), &keys, 200).outcome, Outcome::Prefix);
    let mut g = Fleet::new(2, MODEL_PREFIX_EVENTS);
    g.hold(1, &text_keys(&p), PREFIX_SEEN_EXACT);
    assert_eq!(g.pick_with(&g.req(), &keys, 50).outcome, Outcome::Prefix);
}

#[test]
fn an_evicted_holder_counts_for_the_lifetime_and_an_exact_one_comes_first() {
    let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
    let p = prompt("Tenant whose prompt a small pool evicted. ", "q");
    let all = text_keys(&p);
    let keys = sent_keys(&p);
    f.hold(1, &all, PREFIX_SEEN_EXACT);
    for &k in &all {
        assert!(f.maps.prefix.get_mut(&(MODEL, k)).expect("held").evict(1, NOW - 10));
    }
    // Evicted 10 ticks ago, lifetime 50: still its tenant's backend, though no engine
    // reports the prompt held, so none of it counts as predicted cached.
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome, r.prefix.usage), (1, Outcome::Prefix, PrefixUse::Used), "{r:?}");
    assert_eq!(r.prefix.found as usize, keys.len());
    assert!(!r.prefix.exact, "{r:?}");
    // Past the lifetime it is no holder: placed as a prompt nobody holds.
    assert_eq!(f.pick_with(&f.req(), &keys, 5).prefix.usage, PrefixUse::NotHeld);
    // An engine that reports the prompt held comes before the evicted holder, though busier.
    f.hold(3, &all, PREFIX_SEEN_EXACT);
    f.maps.inflight = vec![2, 2, 2, 3];
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome), (3, Outcome::Prefix), "{r:?}");
    assert!(r.prefix.exact, "{r:?}");
    // At its bound the exact holder yields to the evicted one.
    f.maps.inflight = vec![0, 0, 0, 8];
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome), (1, Outcome::Prefix), "{r:?}");
    // A precise model's query reads the model's lifetime, as an approximate model's does.
    let view = ModelState { prefix_ttl_ns: 50 << PREFIX_TICK_SHIFT, ..f.state }.view();
    assert_eq!(PrefixQuery::for_connect(&keys, &view, (NOW as u64) << PREFIX_TICK_SHIFT).ttl_ticks, 50);
    let off = ModelState { prefix_ttl_ns: 50 << PREFIX_TICK_SHIFT, flags: 0, ..f.state }.view();
    assert_eq!(PrefixQuery::for_connect(&keys, &off, 0).ttl_ticks, 0);
}

#[test]
fn the_holder_recorded_most_recently_comes_before_a_less_loaded_one() {
    let mut f = Fleet::new(4, MODEL_PREFIX_LEARN);
    let p = prompt("Tenant whose overflow left it three holders. ", "q");
    let all = text_keys(&p);
    let keys = sent_keys(&p);
    f.hold(0, &all, NOW - 30);
    f.hold(2, &all, NOW - 3);
    f.hold(3, &all, NOW - 12);
    // The most recent holder is the busiest, under the holders' bound: ceil(2 * 10 / 4) = 5.
    f.maps.inflight = vec![2, 2, 3, 2];
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome, r.prefix.usage), (2, Outcome::Prefix, PrefixUse::Used), "{r:?}");
    // At its bound (ceil(2 * 10 / 4) = 5), the next most recent is taken, not the less
    // loaded oldest.
    f.maps.inflight = vec![1, 0, 6, 2];
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome), (3, Outcome::Prefix), "{r:?}");
    // Recorded in the same tick: the less loaded.
    f.hold(0, &all, NOW - 3);
    f.maps.inflight = vec![2, 2, 3, 2];
    let r = f.pick_with(&f.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome), (0, Outcome::Prefix), "{r:?}");
    // An exact holder still comes before every learnt one, and exact ones by their load.
    let mut g = Fleet::new(4, MODEL_PREFIX_EVENTS);
    g.hold(1, &all, PREFIX_SEEN_EXACT);
    g.hold(2, &all, PREFIX_SEEN_EXACT);
    g.hold(3, &all, PREFIX_SEEN_EXACT);
    for &k in &all {
        assert!(g.maps.prefix.get_mut(&(MODEL, k)).expect("held").evict(3, NOW));
    }
    g.maps.inflight = vec![0, 1, 0, 0];
    let r = g.pick_with(&g.req(), &keys, 50);
    assert_eq!((r.backend, r.outcome), (2, Outcome::Prefix), "{r:?}");
    assert!(r.prefix.exact, "{r:?}");
}

#[test]
fn a_holder_at_its_load_bound_is_overruled() {
    let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
    let p = prompt("Busy tenant. ", "q");
    f.hold(3, &text_keys(&p), PREFIX_SEEN_EXACT);
    // 8 in flight on backend 3, nothing elsewhere: bound ceil(1.25 * 9 / 4) = 3.
    f.maps.inflight[3] = 8;
    let r = f.pick(&sent_keys(&p));
    assert_ne!(r.backend, 3);
    assert_ne!(r.outcome, Outcome::Prefix);
    assert_eq!(r.prefix.usage, PrefixUse::OverruledLoad);
    assert!(r.prefix.found > 0);
}

/// The backends that `tenant`'s requests reach, one request per socket hash, each with a
/// question of its own.
fn homes(f: &Fleet, tenant: u32, usage: Option<PrefixUse>) -> BTreeSet<u32> {
    (1..=16u64)
        .map(|h| {
            let keys = sent_keys(&prompt(&format!("Tenant {tenant}. "), &format!("question {h}")));
            let r = f.pick_with(&PickRequest { hash: fmix64(h), ..f.req() }, &keys, 0);
            assert!(matches!(r.outcome, Outcome::Primary | Outcome::Spill), "{r:?}");
            if let Some(usage) = usage {
                assert_eq!(r.prefix.usage, usage, "{r:?}");
            }
            r.backend
        })
        .collect()
}

#[test]
fn a_prompt_nobody_holds_is_placed_by_its_first_key() {
    let f = Fleet::new(8, MODEL_PREFIX_EVENTS);
    let mut all = BTreeSet::new();
    for t in 0..16 {
        let got = homes(&f, t, Some(PrefixUse::NotHeld));
        assert_eq!(got.len(), 1, "tenant {t}, nothing held: its requests reached {got:?}");
        all.extend(got);
    }
    assert!(all.len() >= 4, "16 tenants placed by their first keys on 8 backends landed on {all:?}");
    // Without a prefix mode the same requests are placed by their own hashes.
    let off = Fleet::new(8, 0);
    assert!(homes(&off, 0, None).len() > 1);
}

#[test]
fn a_prefix_whose_holders_are_at_their_bound_overflows_to_one_next_backend() {
    // Each tenant's prompt is held by backend 3 alone, at its bound.
    let mut busy = Fleet::new(8, MODEL_PREFIX_EVENTS);
    for t in 0..16 {
        let held = text_keys(&prompt(&format!("Tenant {t}. "), ""));
        busy.hold(3, &held[..2], PREFIX_SEEN_EXACT);
    }
    busy.maps.inflight[3] = 8;
    let mut all = BTreeSet::new();
    for t in 0..16 {
        // Every request of the tenant, whatever its socket, overflows to the same backend,
        // which then caches the prompt once: placed by the longest prefix held.
        let got = homes(&busy, t, Some(PrefixUse::OverruledLoad));
        assert_eq!(got.len(), 1, "tenant {t}, its holder at its bound: its requests reached {got:?}");
        assert!(!got.contains(&3), "tenant {t}: {got:?}");
        all.extend(got);
    }
    // Each prefix has a next backend of its own: the tenants' overflow is spread.
    assert!(all.len() >= 4, "16 tenants overflowing from one holder landed on {all:?}");
    // A prefix held but gone (its holder drained) is placed the same way.
    busy.maps.backends[3].state = 0;
    let got = homes(&busy, 0, Some(PrefixUse::Gone));
    assert_eq!(got.len(), 1, "tenant 0, its holder gone: {got:?}");
}

#[test]
fn a_holder_may_have_a_looser_bound_than_the_table() {
    let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
    f.cfg.prefix_load_factor_milli = 2000;
    let p = prompt("Tenant with a long system prompt. ", "q");
    f.hold(3, &text_keys(&p), PREFIX_SEEN_EXACT);
    // 3 in flight on the holder, 1 on each other backend (6 in all): at the table's bound
    // ceil(1.25 * 7 / 4) = 3, under the holders' ceil(2 * 7 / 4) = 4.
    f.maps.inflight = vec![1, 1, 1, 3];
    let r = f.pick(&sent_keys(&p));
    assert_eq!((r.backend, r.outcome), (3, Outcome::Prefix), "{r:?}");
    // The same with the holders' factor at 0, which means the table's: overruled.
    f.cfg.prefix_load_factor_milli = 0;
    let r = f.pick(&sent_keys(&p));
    assert_ne!(r.backend, 3);
    assert_eq!(r.prefix.usage, PrefixUse::OverruledLoad);
    // Set to the table's own factor explicitly: the same.
    f.cfg.prefix_load_factor_milli = f.cfg.load_factor_milli;
    assert_eq!(f.pick(&sent_keys(&p)).prefix.usage, PrefixUse::OverruledLoad);
}

/// Two backends, 0 holding the whole of `p` with `holder_free_mb` free now and
/// `holder_capacity_mb` when idle, 1 holding nothing with plenty; an 8,000 MB request for `p`.
fn memory_case(holder_free_mb: u32, holder_capacity_mb: u32) -> (Picked, u32) {
    let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
    f.maps.backends[0].free_mem_mb = holder_free_mb;
    f.maps.backends[0].mem_capacity_mb = holder_capacity_mb;
    f.maps.backends[1].free_mem_mb = 40_000;
    f.maps.backends[1].mem_capacity_mb = 40_000;
    let p = prompt("Big requests. ", "q");
    f.hold(0, &text_keys(&p), PREFIX_SEEN_EXACT);
    let mut req = f.req();
    req.required_mem_mb = 8_000;
    let keys = sent_keys(&p);
    let n = keys.len() as u32;
    (f.pick_with(&req, &keys, 0), uncached_need(8_000, n, n))
}

#[test]
fn a_holder_is_asked_only_for_what_it_does_not_cache() {
    // The whole prompt is held: its holder needs the last key interval's share of the hint.
    let (r, need) = memory_case(4_000, 4_000);
    assert!(need < 4_000, "need {need}");
    assert_eq!(r.prefix.usage, PrefixUse::Used, "{r:?}");
    assert_eq!(r.backend, 0);
}

#[test]
fn a_holder_that_cannot_hold_the_request_even_idle_is_overruled_and_the_fit_decides() {
    let (r, holder_need) = memory_case(100, 100);
    assert!(holder_need > 100, "need {holder_need}");
    assert_eq!(r.prefix.usage, PrefixUse::OverruledMemory);
    assert_eq!(r.backend, 1);
}

#[test]
fn a_holder_with_the_memory_only_once_idle_is_waited_for() {
    // 40,000 MB when idle, 100 free now: the request waits at the holder for its prompt's cache
    // rather than being prefilled whole on backend 1.
    let (r, _) = memory_case(100, 40_000);
    assert_eq!((r.backend, r.outcome, r.prefix.usage), (0, Outcome::Prefix, PrefixUse::Used), "{r:?}");

    // Two holders: the one with the memory free now is taken, even though it is more loaded.
    let p = prompt("Big requests. ", "q");
    let mut f = Fleet::new(3, MODEL_PREFIX_EVENTS);
    for b in 0..3 {
        f.maps.backends[b].free_mem_mb = if b == 0 { 100 } else { 40_000 };
        f.maps.backends[b].mem_capacity_mb = 40_000;
    }
    f.hold(0, &text_keys(&p), PREFIX_SEEN_EXACT);
    f.hold(1, &text_keys(&p), PREFIX_SEEN_EXACT);
    f.maps.inflight = vec![0, 1, 0];
    let mut req = f.req();
    req.required_mem_mb = 8_000;
    let r = f.pick_with(&req, &sent_keys(&p), 0);
    assert_eq!((r.backend, r.prefix.usage), (1, PrefixUse::Used), "{r:?}");
}

#[test]
fn a_holder_with_the_memory_only_once_idle_is_not_waited_for_a_short_preamble() {
    // Backend 0 holds only the preamble the prompt shares with others (3 of its 14 keys sent),
    // with the memory only once idle: the request goes where it fits now.
    let preamble = "A preamble every conversation starts with. ".repeat(10);
    let p = format!("{preamble}{}", "This conversation's own history, much longer. ".repeat(30)).into_bytes();
    let keys = sent_keys(&p);
    let shared = text_keys(preamble.as_bytes());
    let held = keys.iter().filter(|k| shared.contains(k)).count();
    assert!(held > 0 && held * 2 < keys.len(), "{held} of {} keys sent are the preamble's", keys.len());
    let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
    f.maps.backends[0].free_mem_mb = 100;
    f.maps.backends[0].mem_capacity_mb = 40_000;
    f.maps.backends[1].free_mem_mb = 40_000;
    f.maps.backends[1].mem_capacity_mb = 40_000;
    f.hold(0, &shared, PREFIX_SEEN_EXACT);
    let mut req = f.req();
    req.required_mem_mb = 8_000;
    let r = f.pick_with(&req, &keys, 0);
    assert_eq!((r.backend, r.prefix.usage), (1, PrefixUse::OverruledMemory), "{r:?}");
    assert_eq!(r.prefix.found as usize, held);

    // Holding the prompt up to half its keys sent, it is waited for.
    let all = text_keys(&p);
    let half = ailb_common::prefix::sent_positions(all.len()).nth(keys.len() / 2 - 1).expect("a sent key");
    f.hold(0, &all[..=half], PREFIX_SEEN_EXACT);
    let r = f.pick_with(&req, &keys, 0);
    assert_eq!((r.backend, r.prefix.usage), (0, PrefixUse::Used), "{r:?}");
    assert_eq!(r.prefix.found as usize * 2, keys.len(), "{r:?}");
    // And with the memory free now, even the preamble's holder is taken.
    f.maps.backends[0].free_mem_mb = 40_000;
    let mut g = Fleet::new(2, MODEL_PREFIX_EVENTS);
    g.maps.backends = f.maps.backends.clone();
    g.hold(0, &shared, PREFIX_SEEN_EXACT);
    let r = g.pick_with(&req, &keys, 0);
    assert_eq!((r.backend, r.prefix.usage), (0, PrefixUse::Used), "{r:?}");
}

#[test]
fn the_uncached_need_is_the_hint_less_the_held_share() {
    assert_eq!(uncached_need(8_000, 0, 16), 8_000, "nothing held");
    assert_eq!(uncached_need(8_000, 17, 16), 8_000, "an impossible count asks for all");
    assert_eq!(uncached_need(1_700, 16, 16), 100, "held whole: one interval of 17");
    assert_eq!(uncached_need(1_700, 8, 16), 900);
    assert_eq!(uncached_need(10, 15, 16), 2, "rounded up");
    assert_eq!(uncached_need(0, 5, 16), 0);
}

#[test]
fn a_model_without_a_prefix_mode_is_not_searched() {
    let mut f = Fleet::new(2, 0);
    let p = prompt("Anything. ", "q");
    f.hold(1, &text_keys(&p), PREFIX_SEEN_EXACT);
    let r = f.pick(&sent_keys(&p));
    assert_eq!(r.prefix.usage, PrefixUse::NotAsked);
    assert_eq!(f.lookups.get(), 0);
}

#[test]
fn conversation_affinity_comes_first() {
    let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
    let p = prompt("Shared. ", "q");
    f.hold(1, &text_keys(&p), PREFIX_SEEN_EXACT);
    let mut req = f.req();
    req.has_conversation = true;
    req.affinity = Some(AffinityValue { backend: 0, _pad: 0, last_seen_ns: 4_000 });
    let r = f.pick_with(&req, &sent_keys(&p), 0);
    assert_eq!((r.backend, r.outcome), (0, Outcome::AffinityHit));
}

#[test]
fn withheld_keys_are_wanted_only_where_the_pick_would_read_them() {
    let outcomes = [
        Outcome::AffinityHit,
        Outcome::Prefix,
        Outcome::Primary,
        Outcome::Spill,
        Outcome::Fallback,
        Outcome::NoBackend,
        Outcome::NoFit,
    ];
    for o in outcomes {
        assert!(!keys_wanted(0, o), "{o:?}: a model without a prefix mode reads no keys");
        assert!(keys_wanted(MODEL_PREFIX_LEARN, o), "{o:?}: a learning model records every connect's keys");
        assert!(keys_wanted(MODEL_PREFIX_LEARN | MODEL_PREFIX_EVENTS, o), "{o:?}");
        assert_eq!(keys_wanted(MODEL_PREFIX_EVENTS, o), o != Outcome::AffinityHit, "{o:?}");
    }
}

proptest! {
    /// Each backend holds a leading run of the prompt's blocks (as an engine caches); the
    /// search finds the longest run among usable holders, measured in keys sent, in at most
    /// `SEARCH_STEPS` lookups (and one to choose), and takes a backend that holds every key found.
    #[test]
    fn the_search_finds_the_longest_held_run(
        blocks in 1usize..200,
        held in proptest::collection::vec(0usize..200, 4),
        live in proptest::collection::vec(any::<bool>(), 4),
    ) {
        let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
        let p: Vec<u8> = (0..blocks * 64).map(|i| (i * 7 % 251) as u8).collect();
        let all = text_keys(&p);
        for (id, &h) in held.iter().enumerate() {
            f.hold(id as u32, &all[..h.min(blocks)], PREFIX_SEEN_EXACT);
            if !live[id] {
                f.maps.backends[id].state = 0;
            }
        }
        let sent: Vec<(usize, u64)> = sent(&all).collect();
        let keys: Vec<u64> = sent.iter().map(|&(_, k)| k).collect();
        // The daemon removes a backend that is no live member from the map: so do we.
        for (id, l) in live.iter().enumerate() {
            if !l {
                for h in f.maps.prefix.values_mut() {
                    h.remove(id as u32);
                }
            }
        }
        f.maps.prefix.retain(|_, h| !h.is_empty());
        let best_blocks = (0..4).filter(|&i| live[i]).map(|i| held[i].min(blocks)).max().unwrap_or(0);
        // Keys sent whose block is within the longest run.
        let expected = sent.iter().filter(|&&(pos, _)| pos < best_blocks).count() as u8;
        let r = f.pick(&keys);
        // The search's steps, and one more read of the longest held key's entry to choose.
        prop_assert!(f.lookups.get() <= ailb_common::pick::SEARCH_STEPS + 1);
        prop_assert_eq!(r.prefix.found, expected);
        if expected > 0 {
            prop_assert_eq!(r.outcome, Outcome::Prefix);
            // The backend taken holds every key found (the search resolves only keys sent).
            let last_found = sent[expected as usize - 1].0;
            prop_assert!(live[r.backend as usize] && held[r.backend as usize].min(blocks) > last_found);
        } else if live.iter().any(|&l| l) {
            prop_assert_eq!(r.prefix.usage, PrefixUse::NotHeld);
        }
    }
}

/// Drives a `Search` over `n` keys of which the first `found` are held; the result and the
/// number of lookups.
fn search_held_run(n: u32, found: u32) -> (u32, u32) {
    let mut s = ailb_common::pick::Search::new(n);
    let mut lookups = 0;
    while let Some(mid) = s.mid() {
        assert!(mid < n, "probe {mid} of {n} keys");
        lookups += 1;
        assert!(lookups <= ailb_common::pick::SEARCH_STEPS, "more than SEARCH_STEPS lookups for {found} of {n}");
        s.record(mid, mid < found);
    }
    (s.lo, lookups)
}

#[test]
fn the_search_from_the_end_takes_one_lookup_for_a_prompt_held_whole_and_two_for_a_new_last_key() {
    assert_eq!(search_held_run(16, 16), (16, 1));
    assert_eq!(search_held_run(16, 15), (15, 2));
    assert_eq!(search_held_run(13, 12), (12, 2));
    // Its worst case over 16 keys: the boundary half-way.
    assert_eq!(search_held_run(16, 8), (8, 8));
    assert_eq!(search_held_run(16, 0), (0, 5));
    assert_eq!(search_held_run(0, 0), (0, 0));

    // Through the pick, with the choice's read of the longest prefix's entry.
    let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
    let p: Vec<u8> = (0..16 * 64).map(|i| b'a' + (i % 23) as u8).collect();
    let all = text_keys(&p);
    f.hold(1, &all[..15], PREFIX_SEEN_EXACT);
    let r = f.pick(&sent_keys(&p));
    assert_eq!((r.backend, r.prefix.found), (1, 15));
    assert_eq!(f.lookups.get(), 3);
}

proptest! {
    /// Over any number of keys and any held run, the search finds the run, in at most
    /// `SEARCH_STEPS` lookups and `2 * ceil(log2(d + 1)) + 1`, `d` keys from its end.
    #[test]
    fn the_search_costs_grow_with_the_distance_from_the_end(n in 0u32..=16, found_frac in 0.0f64..=1.0) {
        let found = (n as f64 * found_frac).round() as u32;
        let (lo, lookups) = search_held_run(n, found);
        prop_assert_eq!(lo, found);
        let d = n - found;
        let bound = 2 * (u32::BITS - d.leading_zeros()) + 1;
        prop_assert!(lookups <= bound, "{} lookups for {} of {} keys (bound {})", lookups, found, n, bound);
    }
}

/// The map's keys as the filter's: exactly the keys held, no false positive.
fn exact_filter(f: &mut Fleet) {
    f.maps.prefix_filter = Some(f.maps.prefix.keys().copied().collect());
}

#[test]
fn with_the_filter_the_search_looks_up_one_key_or_none() {
    let p: Vec<u8> = (0..16 * 64).map(|i| b'a' + (i % 23) as u8).collect();
    let all = text_keys(&p);
    let keys = sent_keys(&p);
    assert_eq!(keys.len(), 16);
    // (blocks held, keys found, map lookups: the search's and the choice's read).
    for (held, found, lookups) in [(16, 16, 2), (15, 15, 2), (8, 8, 2), (1, 1, 2), (0, 0, 0)] {
        let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
        f.hold(1, &all[..held], PREFIX_SEEN_EXACT);
        exact_filter(&mut f);
        let r = f.pick(&keys);
        assert_eq!(r.prefix.found, found, "{held} blocks held");
        assert_eq!(f.lookups.get(), lookups, "{held} blocks held");
        if found > 0 {
            assert_eq!(r.backend, 1);
        }
    }
}

#[test]
fn a_key_that_tests_positive_without_being_held_costs_lookups_not_the_answer() {
    let p: Vec<u8> = (0..16 * 64).map(|i| b'a' + (i % 23) as u8).collect();
    let all = text_keys(&p);
    let keys = sent_keys(&p);
    let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
    f.hold(1, &all[..8], PREFIX_SEEN_EXACT);
    exact_filter(&mut f);
    // Blocks 8..16 were held and evicted since the filter's last rebuild.
    f.maps.prefix_filter.as_mut().unwrap().extend(all[8..].iter().map(|&k| (MODEL, k)));
    let r = f.pick(&keys);
    assert_eq!((r.backend, r.prefix.found), (1, 8));
    // The filter sends the search to key 15; the map search from there takes its 8 steps.
    assert_eq!(f.lookups.get(), 8 + 1);
}

proptest! {
    /// With a filter that holds every held key and any others (positives of keys never held,
    /// or held and removed since), the search finds what it finds without one, in at most
    /// `SEARCH_STEPS` map lookups; with an exact filter, in at most one.
    #[test]
    fn the_filter_never_changes_what_the_search_finds(
        blocks in 1usize..200,
        held in 0usize..200,
        extra in proptest::collection::vec(0usize..200, 0..6),
    ) {
        let mut f = Fleet::new(2, MODEL_PREFIX_EVENTS);
        let p: Vec<u8> = (0..blocks * 64).map(|i| (i * 7 % 251) as u8).collect();
        let all = text_keys(&p);
        f.hold(0, &all[..held.min(blocks)], PREFIX_SEEN_EXACT);
        let keys: Vec<u64> = sent(&all).map(|(_, k)| k).collect();
        let plain = f.pick(&keys);
        exact_filter(&mut f);
        let exact = f.pick(&keys);
        prop_assert_eq!(exact.prefix, plain.prefix);
        prop_assert!(f.lookups.get() <= 2, "{} lookups with an exact filter", f.lookups.get());
        for e in extra {
            f.maps.prefix_filter.as_mut().unwrap().insert((MODEL, all[e % blocks]));
        }
        let loose = f.pick(&keys);
        prop_assert_eq!(loose.prefix, plain.prefix);
        prop_assert!(f.lookups.get() <= ailb_common::pick::SEARCH_STEPS + 1);
    }
}

#[test]
fn a_key_sets_three_bits_in_one_line_within_the_generation() {
    use ailb_common::{filter_entries, filter_lines, FilterLine, FilterProbe, DEFAULT_PREFIX_ENTRIES};
    let lines = filter_lines(DEFAULT_PREFIX_ENTRIES);
    // 12 bits per entry: 262,144 entries in 6,144 lines of 512 bits (384 KiB a generation).
    assert_eq!(lines, 6_144);
    assert_eq!(filter_entries(lines), 12_289);
    let mut line = FilterLine::default();
    let mut used = std::collections::BTreeSet::new();
    for key in 1..=2_000u64 {
        let p = FilterProbe::new(MODEL, key.wrapping_mul(0x9e37_79b9_7f4a_7c15), lines);
        assert!(p.line < lines);
        assert!(p.entry(lines, 0) >= 1 && p.entry(lines, 1) == p.entry(lines, 0) + lines);
        used.insert(p.line);
        if key == 1 {
            assert!(!line.holds(&p));
            line.add(&p);
            assert!(line.holds(&p));
            let bits: u32 = line.words.iter().map(|w| w.count_ones()).sum();
            assert!((1..=3).contains(&bits));
        }
    }
    // 2,000 keys spread over most of the lines, not a few.
    assert!(used.len() > 1_500, "{} lines used", used.len());
    // Another model's same key is elsewhere.
    assert_ne!(FilterProbe::new(1, 42, lines), FilterProbe::new(2, 42, lines));
}

#[test]
fn the_filter_search_after_the_first_key_finds_every_run_within_the_steps() {
    for n in 0..=16u32 {
        for found in 0..=n {
            let mut s = ailb_common::pick::Search::after_first(n, found > 0);
            let mut probes = 0;
            while let Some(mid) = s.mid() {
                assert!(mid > 0 && mid < n, "probe {mid} of {n} keys (key 0 is checked before)");
                probes += 1;
                s.record(mid, mid < found);
            }
            assert_eq!(s.lo, found, "{found} of {n}");
            assert!(probes <= ailb_common::pick::SEARCH_STEPS, "{probes} probes for {found} of {n}");
            // Nothing held: the first key's probe alone.
            if found == 0 {
                assert_eq!(probes, 0);
            }
        }
    }
}

proptest! {
    /// On a model fed by its engines' events, a connect whose pick without keys is decided by
    /// affinity gets the same backend with any keys, held anywhere, in any load and memory
    /// state: so withholding them until asked (`AILB_PREFIX_ON_REQUEST`) changes no pick.
    #[test]
    fn an_affinity_hit_without_keys_is_the_pick_with_them(
        held in proptest::collection::vec(0usize..40, 4),
        inflight in proptest::collection::vec(0u64..6, 4),
        free in proptest::collection::vec(prop_oneof![Just(MEM_UNKNOWN), 0u32..4000], 4),
        capacity in proptest::collection::vec(prop_oneof![Just(0u32), Just(MEM_UNKNOWN), 1000u32..5000], 4),
        cap in proptest::collection::vec(prop_oneof![Just(NO_CAP), 1u32..6], 4),
        affine in 0u32..4,
        age_ns in 0u64..20_000_000_000,
        mem in prop_oneof![Just(0u32), 1u32..3000],
    ) {
        let mut f = Fleet::new(4, MODEL_PREFIX_EVENTS);
        let p: Vec<u8> = (0..40 * 64).map(|i| (i * 13 % 251) as u8).collect();
        let all = text_keys(&p);
        for id in 0..4 {
            f.hold(id as u32, &all[..held[id]], PREFIX_SEEN_EXACT);
            f.maps.inflight[id] = inflight[id];
            f.maps.backends[id].free_mem_mb = free[id];
            f.maps.backends[id].mem_capacity_mb = capacity[id];
            f.maps.backends[id].cap = cap[id];
        }
        let mut req = f.req();
        req.model_inflight = inflight.iter().sum();
        req.has_conversation = true;
        req.required_mem_mb = mem;
        req.now_ns = 30_000_000_000;
        req.affinity = Some(AffinityValue { backend: affine, _pad: 0, last_seen_ns: req.now_ns - age_ns });
        let without = f.pick_with(&req, &[], 0);
        let with = f.pick_with(&req, &sent_keys(&p), 0);
        if !keys_wanted(f.state.flags, without.outcome) {
            prop_assert_eq!(without.outcome, Outcome::AffinityHit);
            prop_assert_eq!((with.backend, with.outcome), (without.backend, without.outcome));
        }
    }
}
