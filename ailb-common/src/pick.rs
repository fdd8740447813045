//! The per-connection pick, exactly as `cgroup/connect4` runs it (the eBPF program calls
//! [`pick`] with map-backed [`PickMaps`]; userspace tests call it with plain arrays).
//!
//! "Fits now" is [`Backend::fits_now`]: the free memory the daemon wrote, and at most the
//! backend's idle capacity less the memory hints of its connections in flight
//! ([`PickMaps::inflight_mem`]), which the kernel counts at connect and close.
//!
//! 1. Affinity: a remembered backend is reused if it is still live in this model, is under its
//!    hard cap, the entry is younger than the TTL, and it fits the memory hint now, or fits it
//!    when idle and the conversation was active (connected or closed) within
//!    `GlobalConfig::affinity_wait_ns`: then its prefix is likely still cached there, and the
//!    request waits in that server's queue for it. An older conversation's prefix is likely
//!    evicted (on the Mooncake trace the next turn comes a median 72 s later, after the GPUs'
//!    caches have turned over many times), so queueing behind a full server for it only
//!    lengthens the tail (fleet model, `docs/replay.md`); it is placed afresh.
//! 2. Bounded-load probing of the weighted Maglev table: up to `probes` slots
//!    `(h + i * step) mod M`; the first backend whose in-flight count is under
//!    `ceil(c * (total + 1) * w / W)` (and its cap) and that fits the memory hint is taken.
//!    (With `CONFIG_ROUND_ROBIN`, a baseline, step 2 is instead "the member whose turn it is".)
//! 3. Otherwise the least loaded member (in-flight / weight) that fits and is under its cap.
//!    Without a memory filter such a member is always under its load bound: if every backend
//!    were at or over `c * (T + 1) * w / W`, the in-flight counts would sum to more than T.
//! 4. If no member fits the memory hint now, the request waits in the queue of a member that
//!    fits it when idle (`Backend::mem_capacity_mb`): the one where it should finish first,
//!    estimated as `(hinted MB in flight + its own) / (capacity x weight)` (see
//!    [`MemberScan::later`]). Only a hint that no member could ever hold is refused (`NoFit`).
//!
//! A model's table may hold backends of both families. The client's family
//! ([`ClientFamily`], [`pick_for`]) decides which it can reach: an IPv4 socket only IPv4
//! backends, an IPv6 socket both (an IPv4 backend through its v4-mapped address). A backend
//! it cannot reach is skipped at every step like one that does not fit (a probe that lands
//! on one is spent), and an affinity entry naming one is not used (a break, unless expired).
//! The load bound keeps the model's whole in-flight count and weight, so the same bound
//! serves both families. When all `probes` slots hold unreachable backends (about `q^probes`
//! of an IPv4 client's picks, `q` the IPv6 backends' share of the weight: 6 % at half the
//! weight and 4 probes), the member scan (step 3) decides, which spreads by load but with
//! nothing in flight takes the first member. Not spending a probe on such a slot (probing
//! up to [`MAX_PROBES`] slots for `probes` reachable ones) made the TC program, which
//! inlines the same pick, too large for the verifier.

use crate::abi::*;
use crate::hash::rehash;

mod member_scan;
mod prefix;
#[cfg(feature = "std")]
mod vec_maps;
pub use member_scan::MemberScan;
pub use prefix::{
    held, keys_wanted, placement_hash, search as prefix_search, uncached_need, verdict as prefix_verdict, Choose,
    PrefixCtx, PrefixQuery, PrefixUse, PrefixVerdict, Search, SEARCH_STEPS,
};
#[cfg(feature = "std")]
pub use vec_maps::VecMaps;

/// Read access to the maps the pick needs. Implementations must be cheap: the kernel calls
/// these at most `probes + MAX_MEMBERS` times per connect.
///
/// Tables and member lists are read by arena position: entry `i` of the active slot's table
/// is `table_entry(slot.table_offset + i)`, member `j` is `member(slot.member_offset + j)`.
pub trait PickMaps {
    fn backend(&self, id: u32) -> Option<Backend>;
    fn inflight(&self, id: u32) -> u64;
    /// The memory hints (MB) of the connections in flight to backend `id`, summed.
    fn inflight_mem(&self, id: u32) -> u64;
    /// Slot `pos` of the table arena (`AILB_TABLES`).
    fn table_entry(&self, pos: u32) -> Option<u32>;
    /// Id `pos` of the member arena (`AILB_MEMBERS`).
    fn member(&self, pos: u32) -> Option<u32>;
    /// The `AILB_PREFIX` entry of block `key` of `model` (read only when the connect carries
    /// prefix keys and the model has a prefix mode).
    fn prefix_holders(&self, model: u32, key: u64) -> Option<&PrefixHolders>;

    /// Whether block `key` of `model` may be in `AILB_PREFIX`: false only if it is not
    /// (`AILB_PREFIX_FILTER`, a superset of the map's keys). The default has no filter.
    #[inline(always)]
    fn prefix_maybe_held(&self, _model: u32, _key: u64) -> bool {
        true
    }

    /// The prefix step's search over `keys`; `lo` of the result is the number of keys held.
    /// Two [`Search`]es of at most [`SEARCH_STEPS`] steps each: the first over the filter
    /// ([`Self::prefix_maybe_held`], no map lookup; the first key, then from the end,
    /// [`Search::after_first`]), which ends at or after the held run's end, the second over
    /// the map, in the keys before that end. Without false positives
    /// the second takes one lookup (the run's last key), or none when the filter holds no
    /// key. The default is a plain loop; the eBPF side runs the steps through `bpf_loop`.
    #[inline(always)]
    fn prefix_search(&self, c: &PrefixCtx, keys: &[u64]) -> Search
    where
        Self: Sized,
    {
        let maybe = |k: u64| self.prefix_maybe_held(c.model, k);
        let first = keys.first().is_some_and(|&k| maybe(k));
        let end = Search::after_first(keys.len() as u32, first).run(keys, maybe).lo;
        Search::new(end).run(keys, |k| held(self, c, k))
    }

    /// The whole prefix step: the verdict, and the holder to take ([`NO_BACKEND`]: none).
    /// The default runs [`prefix`]'s search here. The eBPF side keeps the search's state in
    /// a per-CPU map, counts the verdict itself and returns a default one: a verdict carried
    /// into the rest of the pick multiplied the states the verifier explored there.
    #[inline(always)]
    fn prefix_step(&self, c: &PrefixCtx, q: &PrefixQuery<'_>) -> (PrefixVerdict, u32)
    where
        Self: Sized,
    {
        prefix::search(self, c, q)
    }

    /// The choice among the holders of `key` ([`Choose`]). The default is a plain loop; the
    /// eBPF side runs it in a `bpf_loop` callback.
    #[inline(always)]
    fn prefix_choose(&self, c: &PrefixCtx, key: u64) -> Choose
    where
        Self: Sized,
    {
        Choose::all(self, c, key)
    }

    /// Step 3: [`MemberScan::step`] over members `0..members` of the list at arena position
    /// `offset`, in order. The
    /// default is a plain bounded loop; the eBPF side overrides it with `bpf_loop`, because
    /// the verifier cannot walk a [`MAX_MEMBERS`]-iteration loop within its instruction budget.
    #[inline(always)]
    fn scan_members(&self, offset: u32, members: u32, required_mem_mb: u32, family: ClientFamily) -> MemberScan
    where
        Self: Sized,
    {
        let mut scan = MemberScan::for_family(family);
        let mut j = 0u32;
        while j < MAX_MEMBERS {
            if j >= members {
                break;
            }
            scan.step(self, offset, j, required_mem_mb);
            j += 1;
        }
        scan
    }
}

/// The address family of the connecting socket, which decides the backends it can reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientFamily {
    /// `cgroup/connect4` (and the TC datapath's IPv4 packets): IPv4 backends only.
    Ipv4,
    /// `cgroup/connect6`: IPv6 backends, and IPv4 ones through their v4-mapped address (a
    /// dual-stack socket; on an `IPV6_V6ONLY` socket the connect to such a backend fails).
    Ipv6,
    /// The TC datapath's IPv6 packets: IPv6 backends only (the packet is rewritten, not
    /// re-sent from a dual-stack socket, and there is no NAT64).
    Ipv6Only,
}

impl ClientFamily {
    /// Whether a socket of this family can connect to `b`.
    #[inline(always)]
    pub fn reaches(self, b: &Backend) -> bool {
        match self {
            ClientFamily::Ipv4 => !b.is_ipv6(),
            ClientFamily::Ipv6 => true,
            ClientFamily::Ipv6Only => b.is_ipv6(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    AffinityHit,
    /// A backend that holds the request's longest cached prefix was taken.
    Prefix,
    /// The first probed slot was taken.
    Primary,
    /// A later probed slot was taken because earlier ones were over their bound.
    Spill,
    /// No probed slot qualified: the member scan chose (steps 3 and 4).
    Fallback,
    /// The model has no live backend.
    NoBackend,
    /// Live backends exist, but none fits the memory hint.
    NoFit,
}

#[derive(Clone, Copy, Debug)]
pub struct PickRequest {
    pub model: u32,
    /// The weighted table's hash: the conversation's, or a per-socket random value when
    /// `has_conversation` is false; for a connect with prefix keys, its longest held prefix's
    /// or its first key's ([`placement_hash`]). Affinity is looked up by the conversation's.
    pub hash: u64,
    pub has_conversation: bool,
    /// 0: no memory hint.
    pub required_mem_mb: u32,
    /// The affinity entry for `(model, hash)`, if any.
    pub affinity: Option<AffinityValue>,
    pub now_ns: u64,
    /// In-flight connections of the whole model.
    pub model_inflight: u64,
    /// With [`CONFIG_ROUND_ROBIN`]: the model's turn counter before this connect.
    pub turn: u64,
    /// The affinity entry is a remote client's address, not a conversation: it holds only while
    /// its backend is under the load bound (with [`CONFIG_LOAD_BOUND`]). One address carries
    /// many conversations, so holding it through any load would pile them on one backend; a
    /// conversation's entry holds through load, for the prefix its backend has cached.
    pub affinity_bounded: bool,
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
    let num = sat_mul(sat_mul(load_factor_milli as u64, total_inflight.saturating_add(1)), weight as u64);
    let den = sat_mul(1000, total_weight);
    if den == 0 {
        // Unreachable (total_weight > 0); spelled out so no divide-by-zero panic path remains.
        return 0;
    }
    num.div_ceil(den)
}

/// Saturating `a * b` built from 32-bit halves: `u64::saturating_mul` (and the
/// `b > u64::MAX / a` idiom, which LLVM folds back into it) lowers to a 128-bit multiply,
/// a `__multi3` call that the BPF backend cannot emit.
#[inline(always)]
pub fn sat_mul(a: u64, b: u64) -> u64 {
    let (ah, al) = (a >> 32, a & 0xffff_ffff);
    let (bh, bl) = (b >> 32, b & 0xffff_ffff);
    if ah != 0 && bh != 0 {
        return u64::MAX;
    }
    // One of ah, bh is 0, so this is one product of two 32-bit values: no overflow.
    let cross = ah * bl + al * bh;
    if cross > 0xffff_ffff {
        return u64::MAX;
    }
    let lo = al * bl;
    let r = (cross << 32).wrapping_add(lo);
    if r < lo {
        u64::MAX
    } else {
        r
    }
}

#[inline(always)]
fn affinity_usable<M: PickMaps>(
    maps: &M,
    req: &PickRequest,
    family: ClientFamily,
    (ttl_ns, wait_ns): (u64, u64),
    aff: &AffinityValue,
) -> bool {
    let Some(b) = maps.backend(aff.backend) else {
        return false;
    };
    b.model == req.model
        && family.reaches(&b)
        && b.is_live()
        && b.weight > 0
        && b.under_cap(maps.inflight(aff.backend))
        && (ttl_ns == 0 || req.now_ns.saturating_sub(aff.last_seen_ns) <= ttl_ns)
        // It fits now, or it will and the prefix is likely still cached (module docs, step 1).
        && (req.required_mem_mb == 0
            || b.fits_now(req.required_mem_mb, maps.inflight_mem(aff.backend))
            || (b.fits_when_idle(req.required_mem_mb) && req.now_ns.saturating_sub(aff.last_seen_ns) <= wait_ns))
}

/// Whether `id` is under its load bound (always, without [`CONFIG_LOAD_BOUND`]).
#[inline(always)]
fn under_bound<M: PickMaps>(maps: &M, cfg: &GlobalConfig, req: &PickRequest, total_weight: u64, id: u32) -> bool {
    cfg.flags & CONFIG_LOAD_BOUND == 0
        || maps.backend(id).is_some_and(|b| {
            maps.inflight(id) < load_bound(cfg.load_factor_milli, req.model_inflight, b.weight, total_weight)
        })
}

/// Whether an affinity entry is older than the TTL (an expiry, not a break).
#[inline(always)]
fn affinity_expired(ttl_ns: u64, req: &PickRequest, aff: &AffinityValue) -> bool {
    ttl_ns != 0 && req.now_ns.saturating_sub(aff.last_seen_ns) > ttl_ns
}

/// The model's own affinity TTL when it has one, else the global one.
#[inline(always)]
pub fn affinity_ttl_ns(state: &ModelView, cfg: &GlobalConfig) -> u64 {
    if state.affinity_ttl_ns != 0 {
        state.affinity_ttl_ns
    } else {
        cfg.affinity_ttl_ns
    }
}

/// Picks a backend for one IPv4 connection ([`pick_for`] with [`ClientFamily::Ipv4`]).
#[inline(always)]
pub fn pick<M: PickMaps>(maps: &M, state: &ModelState, cfg: &GlobalConfig, req: &PickRequest) -> PickResult {
    pick_for(maps, state, cfg, req, ClientFamily::Ipv4)
}

/// Picks a backend for one connection from a socket of `family`, among the backends it can
/// reach, without prefix keys ([`pick_prefixed`]).
#[inline(always)]
pub fn pick_for<M: PickMaps>(
    maps: &M,
    state: &ModelState,
    cfg: &GlobalConfig,
    req: &PickRequest,
    family: ClientFamily,
) -> PickResult {
    pick_with_prefix(maps, &state.view(), cfg, req, family, None)
}

/// Picks a backend for one connection from a socket of `family`, among the backends it can
/// reach; a connect that carries prefix keys (`prefix`) to a model with a prefix mode
/// ([`MODEL_PREFIX_LEARN`], [`MODEL_PREFIX_EVENTS`]) tries the holders of its longest cached
/// prefix after affinity ([`prefix`]'s docs). Pure: the caller applies the result (affinity
/// write, sk_storage, counters).
#[inline(always)]
pub fn pick_prefixed<M: PickMaps>(
    maps: &M,
    state: &ModelView,
    cfg: &GlobalConfig,
    req: &PickRequest,
    family: ClientFamily,
    prefix: Option<&PrefixQuery<'_>>,
) -> (PickResult, PrefixVerdict) {
    let step = match prefix {
        Some(q) if state.flags & (MODEL_PREFIX_LEARN | MODEL_PREFIX_EVENTS) != 0 && !q.keys.is_empty() => {
            let c = PrefixCtx::new(
                cfg,
                req.model,
                req.required_mem_mb,
                family,
                q,
                req.model_inflight,
                state.slot.total_weight,
            );
            Some(maps.prefix_step(&c, q))
        }
        _ => None,
    };
    // Placed by the longest prefix held, or the first key ([`placement_hash`]), as the kernel does.
    let placed = step
        .zip(prefix)
        .and_then(|((v, _), q)| placement_hash(q.keys, v.found as u32))
        .map(|hash| PickRequest { hash, ..*req });
    let req = placed.as_ref().unwrap_or(req);
    let res = pick_with_prefix(maps, state, cfg, req, family, step.map(|(_, chosen)| chosen));
    (res, step.map(|(v, _)| v).unwrap_or_default())
}

/// [`pick_prefixed`] with the prefix step already taken (the holder `PickMaps::prefix_step`
/// chose, [`NO_BACKEND`] for none; `None` when the connect carries no keys or the model has
/// no prefix mode). The kernel takes the step before the pick, where fewer of the verifier's
/// states reach it. The step's verdict stays out of [`PickResult`]: the TC program, which
/// inlines this pick, has no stack to spare for it.
#[inline(always)]
pub fn pick_with_prefix<M: PickMaps>(
    maps: &M,
    state: &ModelView,
    cfg: &GlobalConfig,
    req: &PickRequest,
    family: ClientFamily,
    prefix: Option<u32>,
) -> PickResult {
    let slot = &state.slot;
    let mut affinity_break = false;

    if state.flags & MODEL_AVAILABLE == 0 || slot.size == 0 || slot.members == 0 || slot.total_weight == 0 {
        return PickResult { backend: NO_BACKEND, outcome: Outcome::NoBackend, affinity_break: false };
    }

    // 1. Affinity.
    if cfg.flags & CONFIG_AFFINITY != 0 && req.has_conversation {
        if let Some(aff) = &req.affinity {
            let ttl_ns = affinity_ttl_ns(state, cfg);
            if affinity_usable(maps, req, family, (ttl_ns, cfg.affinity_wait_ns), aff)
                && (!req.affinity_bounded || under_bound(maps, cfg, req, slot.total_weight, aff.backend))
            {
                return PickResult { backend: aff.backend, outcome: Outcome::AffinityHit, affinity_break: false };
            }
            affinity_break = !affinity_expired(ttl_ns, req, aff);
        }
    }

    // 1b. The longest cached prefix.
    if let Some(chosen) = prefix {
        // Checked again here, whatever the step's implementation: a holder taken must be a
        // live member of this model that the client reaches.
        if chosen != NO_BACKEND
            && maps.backend(chosen).is_some_and(|b| b.model == req.model && b.is_live() && family.reaches(&b))
        {
            return PickResult { backend: chosen, outcome: Outcome::Prefix, affinity_break };
        }
    }

    // Round robin (a baseline): the member whose turn it is, if still live.
    if cfg.flags & CONFIG_ROUND_ROBIN != 0 {
        let index = (req.turn % slot.members as u64) as u32;
        if let Some(id) = maps.member(slot.member_offset.wrapping_add(index)) {
            if maps.backend(id).is_some_and(|b| b.is_live() && family.reaches(&b)) {
                return PickResult { backend: id, outcome: Outcome::Primary, affinity_break };
            }
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
        if let Some(id) = maps.table_entry(slot.table_offset.wrapping_add(index)) {
            if let Some(b) = maps.backend(id) {
                let inflight = maps.inflight(id);
                let bound_ok = !use_bound
                    || inflight < load_bound(cfg.load_factor_milli, req.model_inflight, b.weight, slot.total_weight);
                if b.is_live()
                    && family.reaches(&b)
                    && b.under_cap(inflight)
                    && bound_ok
                    && (req.required_mem_mb == 0 || b.fits_now(req.required_mem_mb, maps.inflight_mem(id)))
                {
                    let outcome = if i == 0 { Outcome::Primary } else { Outcome::Spill };
                    return PickResult { backend: id, outcome, affinity_break };
                }
            }
        }
        i += 1;
    }

    // 3. Least loaded member.
    let scan = maps.scan_members(slot.member_offset, slot.members, req.required_mem_mb, family);
    let best = scan.best;
    let any_live = scan.any_live;
    if best != NO_BACKEND {
        return PickResult { backend: best, outcome: Outcome::Fallback, affinity_break };
    }
    // 4. No member has the memory free now: queue where it should finish first, on one that
    //    will have it (a model server makes such a request wait for KV cache, it does not fail it).
    if scan.later != NO_BACKEND {
        return PickResult { backend: scan.later, outcome: Outcome::Fallback, affinity_break };
    }
    let outcome = if any_live { Outcome::NoFit } else { Outcome::NoBackend };
    PickResult { backend: NO_BACKEND, outcome, affinity_break }
}

#[cfg(test)]
mod tests;
