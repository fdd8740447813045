//! The prefix step of the pick: the backend that holds the longest cached prefix of the
//! request, if one can take it now.
//!
//! A request carries at most [`PREFIX_KEYS_MAX`] keys of its prompt in order
//! ([`crate::prefix::sent`]). A backend that holds a block holds every block before it, so
//! "some live backend holds key `i`" is true for a leading run of the keys and false after:
//! a binary search finds the last held key in at most [`SEARCH_STEPS`] map lookups. A key
//! counts as held when its entry names a fresh holder (see [`PrefixHolders::fresh`]) that is
//! a live, weighted member of the model the client can reach, so a backend that left, or a
//! learnt entry past the cache's lifetime, does not hide a shorter prefix held elsewhere.
//!
//! Of the longest prefix's holders, the least loaded (in-flight / weight) that is under its
//! cap and load bound and fits the memory hint now is taken. When none can take it, the
//! pick goes on as without keys (the weighted table, bounded load, memory fit), and the
//! verdict says why: every holder was at its bound ([`PrefixUse::OverruledLoad`]) or some
//! were under it but lacked the memory ([`PrefixUse::OverruledMemory`]). Holders of a
//! shorter prefix are not tried: the table's pick then spreads the load, as it does for a
//! request without keys, rather than crowding the next-best holder.

use super::{load_bound, sat_mul, ClientFamily, PickMaps, PickRequest};
use crate::abi::*;
use crate::prefix::PREFIX_KEYS_MAX;

/// Lookups of a binary search over [`PREFIX_KEYS_MAX`] keys: `ceil(log2(16 + 1))`.
pub const SEARCH_STEPS: u32 = 5;

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
    /// Some holder was under its bound but none had the memory hint free now.
    OverruledMemory,
}

/// The prefix step's verdict, reported with the pick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixVerdict {
    pub usage: PrefixUse,
    /// How many of the keys sent are held (the longest held prefix, in keys sent).
    pub found: u32,
    /// How many keys were searched.
    pub sent: u32,
}

/// Whether backend `id` counts as a holder for this request.
#[inline(always)]
fn usable_holder<M: PickMaps>(maps: &M, req: &PickRequest, family: ClientFamily, id: u32) -> bool {
    maps.backend(id).is_some_and(|b| b.model == req.model && b.is_live() && b.weight > 0 && family.reaches(&b))
}

/// The entry of `key` if it names a usable fresh holder.
#[inline(always)]
fn held<M: PickMaps>(
    maps: &M,
    req: &PickRequest,
    family: ClientFamily,
    q: &PrefixQuery<'_>,
    key: u64,
) -> Option<PrefixHolders> {
    let h = maps.prefix_holders(req.model, key)?;
    let mut i = 0;
    while i < PREFIX_HOLDERS {
        if h.fresh(i, q.now_tick, q.ttl_ticks) && usable_holder(maps, req, family, h.ids[i]) {
            return Some(h);
        }
        i += 1;
    }
    None
}

/// The prefix step: the verdict, and the backend to take if a holder can take the request.
#[inline(always)]
pub(super) fn search<M: PickMaps>(
    maps: &M,
    cfg: &GlobalConfig,
    req: &PickRequest,
    family: ClientFamily,
    q: &PrefixQuery<'_>,
    total_weight: u64,
) -> (PrefixVerdict, u32) {
    let n = if q.keys.len() > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX } else { q.keys.len() };
    let mut verdict = PrefixVerdict { usage: PrefixUse::NotHeld, found: 0, sent: n as u32 };
    // Invariant: keys[..lo] are held (the last one's entry in `best`), keys[hi..] are not.
    let (mut lo, mut hi) = (0usize, n);
    let mut best = PrefixHolders::EMPTY;
    let mut step = 0;
    while step < SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = (lo + hi) / 2;
        let Some(&key) = q.keys.get(mid) else { break };
        match held(maps, req, family, q, key) {
            Some(h) => {
                best = h;
                lo = mid + 1;
            }
            None => hi = mid,
        }
        step += 1;
    }
    if lo == 0 {
        return (verdict, NO_BACKEND);
    }
    verdict.found = lo as u32;

    let use_bound = cfg.flags & CONFIG_LOAD_BOUND != 0;
    let (mut chosen, mut chosen_load, mut chosen_weight) = (NO_BACKEND, 0u64, 1u64);
    let mut lacked_memory = false;
    let mut i = 0;
    while i < PREFIX_HOLDERS {
        let id = best.ids[i];
        if best.fresh(i, q.now_tick, q.ttl_ticks) && usable_holder(maps, req, family, id) {
            if let Some(b) = maps.backend(id) {
                let inflight = maps.inflight(id);
                let bound_ok = !use_bound
                    || inflight < load_bound(cfg.load_factor_milli, req.model_inflight, b.weight, total_weight);
                if b.under_cap(inflight) && bound_ok {
                    if req.required_mem_mb != 0 && !b.fits_now(req.required_mem_mb, maps.inflight_mem(id)) {
                        lacked_memory = true;
                    } else if chosen == NO_BACKEND
                        || sat_mul(inflight, chosen_weight) < sat_mul(chosen_load, b.weight as u64)
                    {
                        chosen = id;
                        chosen_load = inflight;
                        chosen_weight = b.weight as u64;
                    }
                }
            }
        }
        i += 1;
    }
    verdict.usage = if chosen != NO_BACKEND {
        PrefixUse::Used
    } else if lacked_memory {
        PrefixUse::OverruledMemory
    } else {
        PrefixUse::OverruledLoad
    };
    (verdict, chosen)
}
