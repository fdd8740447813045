//! The prefix step of the pick: the backend that holds the longest cached prefix of the
//! request, if one can take it now.
//!
//! A request carries at most [`PREFIX_KEYS_MAX`] keys of its prompt in order
//! ([`crate::prefix::sent`]). A backend that holds a block holds every block before it, so
//! "some live backend holds key `i`" is true for a leading run of the keys and false after:
//! a search from the end of the keys, then a binary search ([`Search`]), finds the last held
//! key in at most [`SEARCH_STEPS`] map lookups (1 for a prompt held whole, 2 when only its last
//! key is new). A key counts as held ([`held`]) when its entry names a fresh holder (see
//! [`PrefixHolders::fresh`]) that is a live, weighted member of the model the client can
//! reach, so a backend that left, or a learnt entry past the cache's lifetime, does not hide
//! a shorter prefix held elsewhere.
//!
//! Of the longest prefix's holders under their cap and load bound, one that has the memory the
//! request asks of it free now is taken, else one that will have it once idle ([`Choose`]);
//! among those, one whose engine reports the prefix held, then the one recorded most recently,
//! then the least loaded (in-flight / weight). Most recent first: a tenant whose requests
//! overflow gathers holders, and their caches evict the prompt in turn while the entries stay
//! fresh; the holder that got the prompt last is the likeliest to hold it still (an engine's
//! cache evicts the least recently used blocks). In `ailb-fleet-model`, with the lifetime set
//! from the caches' fill time (the daemon's policy), this cut the shared-prefix workload's
//! TTFT P95 on both fleets (`docs/prefix.md`). The request then waits there for memory
//! with its prompt cached, as a model server makes it wait rather than fail, where elsewhere
//! it would be prefilled whole (and cache the prompt a second time), waiting too if that
//! backend is as full. The load bound, not the memory, limits how many wait. It waits only
//! for a prefix of at least half the keys it sent ([`Choose::settle`]): a tenant's system
//! prompt is worth a queue, a preamble that many conversations share is not. When no key is
//! held, the weighted table places the request by its first key ([`placement_hash`]).
//! When no holder can take it, the pick goes on as without keys (the weighted table, bounded
//! load, memory fit), the table placing it by its longest prefix held ([`placement_hash`]),
//! and the verdict says why: every holder was at its bound ([`PrefixUse::OverruledLoad`]) or
//! some were under it but could not hold the request even idle
//! ([`PrefixUse::OverruledMemory`]). Holders of a shorter prefix are not tried: the table's
//! pick then finds the prefix's next backend, rather than crowding the next-best holder.
//!
//! The steps read only [`PrefixCtx`] (plain numbers), so the kernel can run the whole step as
//! a `bpf_loop` callback ([`PickMaps::prefix_step`]), as it does the member scan.

use super::{load_bound, sat_mul, ClientFamily, PickMaps};
use crate::abi::*;
use crate::prefix::PREFIX_KEYS_MAX;

/// The most lookups of a [`Search`] over [`PREFIX_KEYS_MAX`] keys: 5 from the end (keys 15,
/// 14, 12, 8, 0), then 3 of a binary search between keys 0 and 8.
pub const SEARCH_STEPS: u32 = 8;

/// The prefix inputs of one pick.
#[derive(Clone, Copy, Debug)]
pub struct PrefixQuery<'a> {
    /// The keys the socket carries, in prompt order (at most [`PREFIX_KEYS_MAX`] are read).
    pub keys: &'a [u64],
    /// [`prefix_tick`] of the connect.
    pub now_tick: u32,
    /// The model's learnt-entry lifetime in ticks ([`prefix_ttl_ticks`]); 0: none.
    pub ttl_ticks: u32,
}

impl<'a> PrefixQuery<'a> {
    /// The query of a connect at `now_ns` (`bpf_ktime_get_ns`) that carries `keys` to a
    /// model in `state`: at most [`PREFIX_KEYS_MAX`] keys are read, and a holder not exact
    /// (learnt in approximate mode, evicted in precise mode) counts for the model's
    /// `prefix_ttl_ns`; the engines' exact holders never age.
    #[inline(always)]
    pub fn for_connect(keys: &'a [u64], state: &ModelView, now_ns: u64) -> Self {
        let n = if keys.len() > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX } else { keys.len() };
        PrefixQuery { keys: &keys[..n], now_tick: prefix_tick(now_ns), ttl_ticks: state.prefix_ttl_ticks() }
    }
}

/// What the prefix step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefixUse {
    /// No keys, or the model has no prefix mode: not searched.
    #[default]
    NotAsked,
    /// No live backend holds the first key sent.
    NotHeld,
    /// A holder of the longest prefix was taken.
    Used,
    /// Every holder was at its cap or load bound.
    OverruledLoad,
    /// Some holder was under its bound but none could hold the request, even idle, or one
    /// could only once idle and the prefix it holds is too short to wait for
    /// ([`Choose::settle`]).
    OverruledMemory,
    /// No holder of the longest prefix is a live member of the model now (it left, or is
    /// drained): the pick went on without the prefix.
    Gone,
}

/// The prefix step's verdict, reported with the pick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixVerdict {
    pub usage: PrefixUse,
    /// How many of the keys sent are held (the longest held prefix, in keys sent).
    pub found: u8,
    /// How many keys were searched (at most [`PREFIX_KEYS_MAX`]). Bytes, not words: the
    /// verdict rides in every `PickResult`, in the TC program's stack too, which has no 16
    /// bytes to spare.
    pub sent: u8,
    /// Some holder of the longest prefix found is exact ([`PrefixHolders::exact`]): an engine
    /// reports it held now (precise mode). False where its holders were learnt (approximate
    /// mode) or evicted ([`PrefixHolders::evict`]).
    pub exact: bool,
}

/// Everything the prefix steps read besides the maps and the keys: plain numbers, so that a
/// `bpf_loop` callback can take it as its context.
#[derive(Clone, Copy, Debug)]
pub struct PrefixCtx {
    pub model: u32,
    pub required_mem_mb: u32,
    pub now_tick: u32,
    pub ttl_ticks: u32,
    /// The holders' load bound factor (`GlobalConfig::prefix_load_factor_milli`).
    pub load_factor_milli: u32,
    pub use_bound: bool,
    pub family: ClientFamily,
    pub model_inflight: u64,
    pub total_weight: u64,
}

impl PrefixCtx {
    /// The context of a connect to `model` asking for `required_mem_mb` (0: no hint), with
    /// `model_inflight` connections in flight to the model: the one constructor, used by the
    /// pure pick and the kernel alike, so that both read the same settings (the holders' own
    /// load factor above all: 0 in the config means the table's).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &GlobalConfig,
        model: u32,
        required_mem_mb: u32,
        family: ClientFamily,
        q: &PrefixQuery<'_>,
        model_inflight: u64,
        total_weight: u64,
    ) -> Self {
        Self {
            model,
            required_mem_mb,
            now_tick: q.now_tick,
            ttl_ticks: q.ttl_ticks,
            load_factor_milli: if cfg.prefix_load_factor_milli != 0 {
                cfg.prefix_load_factor_milli
            } else {
                cfg.load_factor_milli
            },
            use_bound: cfg.flags & CONFIG_LOAD_BOUND != 0,
            family,
            model_inflight,
            total_weight,
        }
    }
}

/// Whether `key`'s entry names a fresh holder. Membership and liveness are checked only
/// when choosing among the longest prefix's holders: checked at every step, they made the
/// search too costly for the kernel's verifier. A backend that leaves must therefore leave
/// the map too: the daemon removes a retired backend from every entry of its model, and
/// precise mode removes what the engine evicts; until then a holder that cannot take requests
/// can hide a shorter prefix held elsewhere ([`PrefixUse::Gone`]).
#[inline(always)]
pub fn held<M: PickMaps>(maps: &M, c: &PrefixCtx, key: u64) -> bool {
    maps.prefix_holders(c.model, key).is_some_and(|h| h.any_fresh(c.now_tick, c.ttl_ticks))
}

/// The search's state: a search from the end of the keys (an exponential search), then a
/// binary search between the last key found held and the first found not held. Invariant:
/// keys `..lo` are held, keys `hi..` are not.
///
/// Why from the end: what a request shares with what is cached usually ends near its own end.
/// A conversation's next turn is its whole history plus a new message; a tenant's request is a
/// long system prompt plus a short question. Counting `d` keys from the last key held to the
/// end, the search takes `2 * ceil(log2(d + 1))` lookups at most, plus one: 1 for a prompt held
/// whole, 2 when only its last key is new. Each lookup in a big map is a likely cache miss (a
/// few hundred ns on a VM), and a binary search always takes 4 or 5 over 16 keys. The price is
/// a boundary far from the end: up to [`SEARCH_STEPS`] (8) lookups over 16 keys, against 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Search {
    pub lo: u32,
    pub hi: u32,
    /// The number of keys searched.
    pub end: u32,
    /// While no key was found held, the next probe's distance from `end` (1, 2, 4, ...);
    /// 0 once one was (a binary search in `lo..hi` then).
    pub gap: u32,
}

impl Search {
    /// A search over `n` keys (at most [`PREFIX_KEYS_MAX`]).
    #[inline(always)]
    pub fn new(n: u32) -> Self {
        let n = if n as usize > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX as u32 } else { n };
        Self { lo: 0, hi: n, end: n, gap: 1 }
    }

    /// A search over `n` keys whose first key was checked already: over none if it is not
    /// held, else from the end of the keys with key 0 known held. The filter's search starts
    /// so ([`PickMaps::prefix_search`]): a prompt nobody holds, the commonest kind, then costs
    /// one probe instead of five.
    #[inline(always)]
    pub fn after_first(n: u32, first_held: bool) -> Self {
        let mut s = Self::new(if first_held { n } else { 0 });
        if s.hi > 0 {
            s.lo = 1;
        }
        s
    }

    /// One step: the key to look up next, or `None` when the search is over.
    #[inline(always)]
    pub fn mid(&self) -> Option<u32> {
        if self.lo >= self.hi {
            return None;
        }
        if self.gap == 0 {
            return Some((self.lo + self.hi) / 2);
        }
        // `end - gap`, not below `lo`; below `hi`, the previous probe (or `end`).
        let p = self.end.saturating_sub(self.gap);
        Some(if p < self.lo { self.lo } else { p })
    }

    /// Records whether key `mid` is held.
    #[inline(always)]
    pub fn record(&mut self, mid: u32, held: bool) {
        if held {
            self.lo = mid + 1;
            self.gap = 0;
        } else {
            self.hi = mid;
            // Doubled while searching from the end (at most 32: the probe is then key 0).
            if self.gap != 0 && self.gap <= PREFIX_KEYS_MAX as u32 {
                self.gap *= 2;
            }
        }
    }

    /// One step over `keys`, `held` telling whether a key is held; false when the search was
    /// already over.
    #[inline(always)]
    pub fn step(&mut self, keys: &[u64], held: impl FnOnce(u64) -> bool) -> bool {
        let Some(mid) = self.mid() else {
            return false;
        };
        let Some(&key) = keys.get(mid as usize) else {
            return false;
        };
        self.record(mid, held(key));
        true
    }

    /// Runs the search over `keys` to its end, at most [`SEARCH_STEPS`] steps.
    #[inline(always)]
    pub fn run(mut self, keys: &[u64], mut held: impl FnMut(u64) -> bool) -> Self {
        let mut i = 0;
        while i < SEARCH_STEPS && self.step(keys, &mut held) {
            i += 1;
        }
        self
    }
}

/// The choice among the longest prefix's holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choose {
    /// The holder taken (in the order [`Choose::step`] says), or [`NO_BACKEND`].
    pub chosen: u32,
    pub load: u64,
    pub weight: u64,
    /// The chosen holder has the memory free now (else it has it only once idle, and the
    /// request waits there).
    pub fits_now: bool,
    /// Some holder under its bound could not hold the request, even idle (or only once idle,
    /// for a prefix too short to wait for: [`Choose::settle`]).
    pub lacked_memory: bool,
    /// Some holder is a live member the client can reach.
    pub any_live: bool,
    /// The chosen holder is exact ([`PrefixHolders::exact`]): its engine reports the prefix held.
    pub exact: bool,
    /// Ticks since the chosen holder was recorded (0 for an exact one).
    pub age: u32,
    /// Some fresh holder of the entry is exact.
    pub any_exact: bool,
}

impl Default for Choose {
    fn default() -> Self {
        Self::new()
    }
}

impl Choose {
    #[inline(always)]
    pub const fn new() -> Self {
        Self {
            chosen: NO_BACKEND,
            load: 0,
            weight: 1,
            fits_now: false,
            lacked_memory: false,
            any_live: false,
            exact: false,
            age: 0,
            any_exact: false,
        }
    }

    /// Considers holder slot `i` of `h`.
    #[inline(always)]
    pub fn step<M: PickMaps>(&mut self, maps: &M, c: &PrefixCtx, h: &PrefixHolders, i: usize) {
        if i >= PREFIX_HOLDERS || !h.fresh(i, c.now_tick, c.ttl_ticks) {
            return;
        }
        let id = h.ids[i];
        let exact = h.exact(i);
        self.any_exact |= exact;
        let Some(b) = maps.backend(id) else {
            return;
        };
        if b.model != c.model || !b.is_live() || b.weight == 0 || !c.family.reaches(&b) {
            return;
        }
        self.any_live = true;
        let inflight = maps.inflight(id);
        let bound_ok =
            !c.use_bound || inflight < load_bound(c.load_factor_milli, c.model_inflight, b.weight, c.total_weight);
        if !b.under_cap(inflight) || !bound_ok {
            return;
        }
        let fits_now = c.required_mem_mb == 0 || b.fits_now(c.required_mem_mb, maps.inflight_mem(id));
        if !fits_now && !b.fits_when_idle(c.required_mem_mb) {
            self.lacked_memory = true;
            return;
        }
        // One that fits now before one that fits once idle; then one whose engine reports the
        // prefix held before an evicted one; then the one recorded most recently (in ticks);
        // then the least loaded.
        let age = if exact { 0 } else { c.now_tick.wrapping_sub(h.seen[i]) };
        let same = fits_now == self.fits_now && exact == self.exact;
        let better = self.chosen == NO_BACKEND
            || (fits_now && !self.fits_now)
            || (fits_now == self.fits_now && exact && !self.exact)
            || (same && age < self.age)
            || (same && age == self.age && sat_mul(inflight, self.weight) < sat_mul(self.load, b.weight as u64));
        if better {
            self.chosen = id;
            self.load = inflight;
            self.weight = b.weight as u64;
            self.fits_now = fits_now;
            self.exact = exact;
            self.age = age;
        }
    }

    /// The choice once every holder was considered, for a longest prefix of `found` of the
    /// `sent` keys: a holder that has the memory only once idle is given up
    /// ([`PrefixUse::OverruledMemory`]) unless it holds at least half the keys sent. The
    /// request would wait in its queue for the prefill of the prefix saved; where that prefix
    /// is a short preamble many prompts share (a common system prompt on the Mooncake trace),
    /// the wait costs more than the prefill it saves, and a backend with the memory free now
    /// is better. In `ailb-fleet-model`, which runs this pick, waiting for such preambles put
    /// the trace's TTFT P95 at 1.10x the pick's without keys over 100 stretches (load 0.25
    /// and 0.4); settled so, 1.02x and 0.98x, while the shared-prefix workload, whose tenants'
    /// prompts are 12 of 13 blocks, kept every gain of waiting (60 % of its prompt tokens
    /// from the caches, against 14 % when a holder is never waited for).
    #[inline(always)]
    pub fn settle(&mut self, found: u32, sent: u32) {
        if self.chosen != NO_BACKEND && !self.fits_now && found.saturating_mul(2) < sent {
            self.chosen = NO_BACKEND;
            self.lacked_memory = true;
        }
    }

    /// Every holder of `key`'s entry (the default of [`PickMaps::prefix_choose`]).
    #[inline(always)]
    pub fn all<M: PickMaps>(maps: &M, c: &PrefixCtx, key: u64) -> Self {
        let mut choose = Self::new();
        if let Some(h) = maps.prefix_holders(c.model, key) {
            let mut i = 0;
            while i < PREFIX_HOLDERS {
                choose.step(maps, c, h, i);
                i += 1;
            }
        }
        choose
    }
}

/// The prefix step: the verdict, and the backend to take if a holder can take the request.
#[inline(always)]
pub fn search<M: PickMaps>(maps: &M, c: &PrefixCtx, q: &PrefixQuery<'_>) -> (PrefixVerdict, u32) {
    let n = if q.keys.len() > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX } else { q.keys.len() };
    let found = maps.prefix_search(c, &q.keys[..n]).lo;
    if found == 0 {
        return (verdict(n as u32, 0, &Choose::new()), NO_BACKEND);
    }
    let Some(&key) = q.keys.get(found as usize - 1) else {
        return (verdict(n as u32, 0, &Choose::new()), NO_BACKEND);
    };
    let c = PrefixCtx { required_mem_mb: uncached_need(c.required_mem_mb, found, n as u32), ..*c };
    let mut choose = maps.prefix_choose(&c, key);
    choose.settle(found, n as u32);
    (verdict(n as u32, found, &choose), choose.chosen)
}

/// The hash the weighted table places a connect by when the prefix step took no holder,
/// in place of its conversation's or its socket's: the hash of its longest prefix held
/// (key `found - 1` of its `keys`), or of its first key when `found` is 0; `None` without
/// keys (the connect's own hash stands).
///
/// Nothing held: every request whose prompt starts with the same block gets the same backend
/// (bounded load permitting), so a prompt nobody caches (a tenant's first request, or one whose
/// blocks every engine evicted) lands where the next request of that prompt will look for it,
/// on every gateway alike, and not on a random backend per connect, each prefilling the prompt
/// once more.
///
/// Held, but every holder at its bound (or short of memory, or gone): the requests of that
/// prefix overflow along one probe sequence of the table, to the same next backend while it is
/// under the table's bound, which then caches the prefix once and becomes its second holder
/// (the choice among holders then takes the less loaded). Placed by the connect's own hash,
/// each overflowing request would go to a random backend and prefill the prefix there,
/// evicting other prompts, so a hot prefix would spread its copies over the fleet. The cost:
/// where the longest prefix held is a preamble many prompts share and its few holders are at
/// their bound, those prompts overflow along one probe sequence too; the table's bound, not
/// the hash, then spreads them, a backend at a time.
#[inline(always)]
pub fn placement_hash(keys: &[u64], found: u32) -> Option<u64> {
    let i = if found == 0 { 0 } else { found as usize - 1 };
    keys.get(i).map(|&k| crate::hash::fmix64(k))
}

/// Whether a connect that withheld its prefix keys until asked (`AILB_PREFIX_ON_REQUEST`), to
/// a model with prefix flags `model_flags`, whose pick without keys came out as `outcome`,
/// must be refused for them (`ENOKEY`): the pick would have read them. A model that learns
/// from picks ([`MODEL_PREFIX_LEARN`]) records every connect's keys, so it always wants them; a
/// model fed by its engines' events ([`MODEL_PREFIX_EVENTS`]) reads them only when affinity did
/// not decide (the prefix step comes after it, and so does the table's placement by
/// [`placement_hash`]); a model without a prefix mode never reads them. So a connect that goes
/// ahead without its keys gets the backend it would have got with them.
#[inline(always)]
pub const fn keys_wanted(model_flags: u32, outcome: super::Outcome) -> bool {
    model_flags & MODEL_PREFIX_LEARN != 0
        || (model_flags & MODEL_PREFIX_EVENTS != 0 && !matches!(outcome, super::Outcome::AffinityHit))
}

/// The memory a holder of the longest prefix found needs for a request whose hint is
/// `required` MB, when `found` of the `sent` keys are held: the hint covers the whole prompt
/// (and its output), but the holder already caches the prompt up to its last key held, so it
/// is asked only for the share after it. That share is counted in key intervals with one
/// interval more than were sent, so that even a prompt held whole asks for
/// `1 / (sent + 1)` of its hint (its output is not cached anywhere), rounded up. Asked for
/// the whole hint, a holder whose free memory had fallen below it lost every later request
/// of its tenant to another backend, which then cached the prompt a second time.
#[inline(always)]
pub const fn uncached_need(required: u32, found: u32, sent: u32) -> u32 {
    if found == 0 || found > sent {
        return required;
    }
    let n = sent as u64 + 1;
    ((required as u64 * (n - found as u64)).div_ceil(n)) as u32
}

/// The verdict of a search of `sent` keys that found `found` held and chose as `choose` says.
#[inline(always)]
pub fn verdict(sent: u32, found: u32, choose: &Choose) -> PrefixVerdict {
    let usage = if found == 0 {
        PrefixUse::NotHeld
    } else if choose.chosen != NO_BACKEND {
        PrefixUse::Used
    } else if choose.lacked_memory {
        PrefixUse::OverruledMemory
    } else if choose.any_live {
        PrefixUse::OverruledLoad
    } else {
        // No live member holds it (or the entry was evicted since the search).
        PrefixUse::Gone
    };
    // Both at most PREFIX_KEYS_MAX (16).
    PrefixVerdict {
        usage,
        found: found.min(255) as u8,
        sent: sent.min(255) as u8,
        exact: found != 0 && choose.any_exact,
    }
}
