//! The per-connection pick, exactly as `cgroup/connect4` runs it (the eBPF program calls
//! [`pick`] with map-backed [`PickMaps`]; userspace tests call it with plain arrays).
//!
//! 1. Affinity: a remembered backend is reused if it is still live in this model, fits the
//!    memory hint and is under its hard cap (and the entry is younger than the TTL).
//! 2. Bounded-load probing of the weighted Maglev table: up to `probes` slots
//!    `(h + i * step) mod M`; the first backend whose in-flight count is under
//!    `ceil(c * (total + 1) * w / W)` (and its cap) and that fits the memory hint is taken.
//! 3. Otherwise the least loaded member (in-flight / weight) that fits and is under its cap.
//!    Without a memory filter such a member is always under its load bound: if every backend
//!    were at or over `c * (T + 1) * w / W`, the in-flight counts would sum to more than T.

use crate::abi::*;
use crate::hash::rehash;

/// Read access to the maps the pick needs. Implementations must be cheap: the kernel calls
/// these at most `probes + MAX_MEMBERS` times per connect.
pub trait PickMaps {
    fn backend(&self, id: u32) -> Option<Backend>;
    fn inflight(&self, id: u32) -> u64;
    /// Entry `index` of the Maglev table in `row` (see [`row_index`]).
    fn table_entry(&self, row: u32, index: u32) -> Option<u32>;
    /// Entry `index` of the member row `row`.
    fn member(&self, row: u32, index: u32) -> Option<u32>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    AffinityHit,
    /// The first probed slot was taken.
    Primary,
    /// A later probed slot was taken because earlier ones were over their bound.
    Spill,
    /// No probed slot qualified: the least loaded member was taken.
    Fallback,
    /// The model has no live backend.
    NoBackend,
    /// Live backends exist, but none fits the memory hint.
    NoFit,
}

#[derive(Clone, Copy, Debug)]
pub struct PickRequest {
    pub model: u32,
    /// Conversation hash, or a per-socket random value when `has_conversation` is false.
    pub hash: u64,
    pub has_conversation: bool,
    /// 0: no memory hint.
    pub required_mem_mb: u32,
    /// The affinity entry for `(model, hash)`, if any.
    pub affinity: Option<AffinityValue>,
    pub now_ns: u64,
    /// In-flight connections of the whole model.
    pub model_inflight: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PickResult {
    pub backend: u32,
    pub outcome: Outcome,
    /// An affinity entry existed but could not be honoured.
    pub affinity_break: bool,
}

/// `ceil(c * (total + 1) * w / W)` with `c = load_factor_milli / 1000`.
#[inline(always)]
pub fn load_bound(load_factor_milli: u32, total_inflight: u64, weight: u32, total_weight: u64) -> u64 {
    if total_weight == 0 {
        return 0;
    }
    let num = (load_factor_milli as u64)
        .saturating_mul(total_inflight.saturating_add(1))
        .saturating_mul(weight as u64);
    let den = 1000u64.saturating_mul(total_weight);
    num.div_ceil(den)
}

#[inline(always)]
fn affinity_usable<M: PickMaps>(maps: &M, req: &PickRequest, cfg: &GlobalConfig, aff: &AffinityValue) -> bool {
    let Some(b) = maps.backend(aff.backend) else {
        return false;
    };
    b.model == req.model
        && b.is_live()
        && b.weight > 0
        && b.fits(req.required_mem_mb)
        && b.under_cap(maps.inflight(aff.backend))
        && (cfg.affinity_ttl_ns == 0 || req.now_ns.saturating_sub(aff.last_seen_ns) <= cfg.affinity_ttl_ns)
}

/// Whether an affinity entry is older than the TTL (an expiry, not a break).
#[inline(always)]
fn affinity_expired(cfg: &GlobalConfig, req: &PickRequest, aff: &AffinityValue) -> bool {
    cfg.affinity_ttl_ns != 0 && req.now_ns.saturating_sub(aff.last_seen_ns) > cfg.affinity_ttl_ns
}

/// Picks a backend for one connection. Pure: the caller applies the result (affinity
/// write, sk_storage, counters).
#[inline(always)]
pub fn pick<M: PickMaps>(maps: &M, state: &ModelState, cfg: &GlobalConfig, req: &PickRequest) -> PickResult {
    let slot = state.active_slot();
    let row = row_index(req.model, state.active);
    let mut affinity_break = false;

    if state.flags & MODEL_AVAILABLE == 0 || slot.size == 0 || slot.members == 0 || slot.total_weight == 0 {
        return PickResult { backend: NO_BACKEND, outcome: Outcome::NoBackend, affinity_break: false };
    }

    // 1. Affinity.
    if cfg.flags & CONFIG_AFFINITY != 0 && req.has_conversation {
        if let Some(aff) = &req.affinity {
            if affinity_usable(maps, req, cfg, aff) {
                return PickResult { backend: aff.backend, outcome: Outcome::AffinityHit, affinity_break: false };
            }
            affinity_break = !affinity_expired(cfg, req, aff);
        }
    }

    // 2. Bounded-load probing.
    let size = slot.size as u64;
    let mut probes = cfg.probes;
    if probes == 0 {
        probes = 1;
    }
    if probes > MAX_PROBES {
        probes = MAX_PROBES;
    }
    let use_bound = cfg.flags & CONFIG_LOAD_BOUND != 0;
    let start = req.hash % size;
    let step = if size > 1 { 1 + rehash(req.hash) % (size - 1) } else { 1 };
    let mut i = 0u32;
    while i < MAX_PROBES {
        if i >= probes {
            break;
        }
        let index = ((start + i as u64 * step) % size) as u32;
        if let Some(id) = maps.table_entry(row, index) {
            if let Some(b) = maps.backend(id) {
                let inflight = maps.inflight(id);
                let bound_ok = !use_bound
                    || inflight < load_bound(cfg.load_factor_milli, req.model_inflight, b.weight, slot.total_weight);
                if b.is_live() && b.fits(req.required_mem_mb) && b.under_cap(inflight) && bound_ok {
                    let outcome = if i == 0 { Outcome::Primary } else { Outcome::Spill };
                    return PickResult { backend: id, outcome, affinity_break };
                }
            }
        }
        i += 1;
    }

    // 3. Least loaded member (in-flight / weight, compared by cross-multiplication).
    let mut best = NO_BACKEND;
    let mut best_load = 0u64;
    let mut best_weight = 1u64;
    let mut any_live = false;
    let members = slot.members;
    let mut j = 0u32;
    while j < MAX_MEMBERS {
        if j >= members {
            break;
        }
        if let Some(id) = maps.member(row, j) {
            if let Some(b) = maps.backend(id) {
                if b.is_live() && b.weight > 0 {
                    any_live = true;
                    let inflight = maps.inflight(id);
                    if b.fits(req.required_mem_mb) && b.under_cap(inflight) {
                        let w = b.weight as u64;
                        if best == NO_BACKEND || inflight.saturating_mul(best_weight) < best_load.saturating_mul(w) {
                            best = id;
                            best_load = inflight;
                            best_weight = w;
                        }
                    }
                }
            }
        }
        j += 1;
    }
    if best != NO_BACKEND {
        return PickResult { backend: best, outcome: Outcome::Fallback, affinity_break };
    }
    let outcome = if any_live { Outcome::NoFit } else { Outcome::NoBackend };
    PickResult { backend: NO_BACKEND, outcome, affinity_break }
}
