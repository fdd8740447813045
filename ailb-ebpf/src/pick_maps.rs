//! The pick's map access: [`PickMaps`] over the kernel maps, with the least-loaded member
//! scan run through `bpf_loop`.

use core::{
    ffi::c_void,
    ptr::{self, addr_of},
};

use ailb_common::{
    abi::*,
    pick::{
        prefix_verdict, uncached_need, Choose, ClientFamily, MemberScan, PickMaps, PrefixCtx, PrefixQuery,
        PrefixVerdict, Search, SEARCH_STEPS,
    },
    prefix::PREFIX_KEYS_MAX,
};
use aya_ebpf::helpers::generated::bpf_loop;

use crate::maps::{inflight_read, PrefixScratch, AILB_BACKENDS, AILB_MEMBERS, AILB_PREFIX, AILB_TABLES};

pub(crate) struct Maps;

impl PickMaps for Maps {
    #[inline(always)]
    fn backend(&self, id: u32) -> Option<Backend> {
        if id >= MAX_BACKENDS {
            return None;
        }
        // SAFETY: a non-null array map value pointer of the right type; a plain copy (a
        // concurrent userspace update may tear it, which the pick tolerates).
        AILB_BACKENDS.get_ptr(id).map(|p| unsafe { ptr::read(p) })
    }

    #[inline(always)]
    fn inflight(&self, id: u32) -> u64 {
        if id >= MAX_BACKENDS {
            return 0;
        }
        inflight_read(id)
    }

    #[inline(always)]
    fn inflight_mem(&self, id: u32) -> u64 {
        if id >= MAX_BACKENDS {
            return 0;
        }
        inflight_read(INFLIGHT_MEM_BASE + id)
    }

    #[inline(always)]
    fn table_entry(&self, pos: u32) -> Option<u32> {
        let (chunk, lane) = chunk_of(pos, TABLE_CHUNK);
        // The array lookup fails past the arena's size (set at load).
        let p = AILB_TABLES.get_ptr(chunk)?;
        // SAFETY: `p` is a valid TableChunk in the map and `lane < TABLE_CHUNK` (its length),
        // so the element pointer is in bounds.
        Some(unsafe { ptr::read(addr_of!((*p).slots).cast::<u32>().add(lane as usize)) })
    }

    #[inline(always)]
    fn member(&self, pos: u32) -> Option<u32> {
        let (chunk, lane) = chunk_of(pos, MEMBER_CHUNK);
        let p = AILB_MEMBERS.get_ptr(chunk)?;
        // SAFETY: `p` is a valid MemberChunk in the map and `lane < MEMBER_CHUNK` (its length).
        Some(unsafe { ptr::read(addr_of!((*p).ids).cast::<u32>().add(lane as usize)) })
    }

    #[inline(always)]
    fn prefix_holders(&self, model: u32, key: u64) -> Option<&PrefixHolders> {
        // SAFETY: a non-null LRU hash value pointer, valid for this run (RCU). Read in place,
        // not copied (the stack has no room): a concurrent update may tear it, which the
        // search tolerates, as every holder id is checked against the backends before use.
        AILB_PREFIX.get_ptr(PrefixKey { model, _pad: 0, key }).map(|p| unsafe { &*p })
    }

    #[inline(always)]
    fn prefix_maybe_held(&self, model: u32, key: u64) -> bool {
        crate::maps::prefix_maybe_held(model, key)
    }

    /// The prefix step, its loops run by `bpf_loop` over state kept in this CPU's
    /// `AILB_PREFIX_SCRATCH` slot ([`crate::prefix`]).
    #[inline(always)]
    fn prefix_step(&self, c: &PrefixCtx, q: &PrefixQuery<'_>) -> (PrefixVerdict, u32) {
        (PrefixVerdict::default(), prefix_step(c, q.keys).0)
    }

    /// The least-loaded scan through `bpf_loop`: the callback is verified once, where a
    /// 1024-iteration inline loop exceeds the verifier's 1M-instruction budget.
    #[inline(always)]
    fn scan_members(&self, offset: u32, members: u32, required_mem_mb: u32, family: ClientFamily) -> MemberScan {
        let mut ctx = ScanCtx { scan: MemberScan::for_family(family), offset, required_mem_mb };
        let n = if members > MAX_MEMBERS { MAX_MEMBERS } else { members };
        // SAFETY: `scan_member` has the callback signature bpf_loop expects and only uses
        // its context as the `ScanCtx` passed here, which outlives the call.
        unsafe {
            bpf_loop(n, scan_member as *mut c_void, ptr::from_mut(&mut ctx).cast(), 0);
        }
        ctx.scan
    }
}

/// The kernel's prefix step (`PickMaps::prefix_step`): the searches and the choice
/// among the longest prefix's holders, each a `bpf_loop` over the slot's state, and the
/// verdict counted. The holder chosen, or [`NO_BACKEND`], the memory it was asked for (the
/// request's uncached share, [`uncached_need`]), and how many keys were found held.
#[inline(always)]
pub(crate) fn prefix_step(c: &PrefixCtx, keys: &[u64]) -> (u32, u32, u32) {
    let Some(s) = crate::prefix::scratch() else {
        return (NO_BACKEND, 0, 0);
    };
    crate::prefix::stage(s, keys);
    s.c = *c;
    let first = s.count > 0 && crate::maps::prefix_maybe_held(c.model, s.keys[0]);
    s.search = Search::after_first(s.count, first);
    s.slots = 0;
    s.choose = Choose::new();
    s.map_lookups = 0;
    let mut unused = 0u64;
    // SAFETY: `filter_step` and `search_step` have the callback signature bpf_loop expects
    // and ignore their context.
    unsafe {
        bpf_loop(SEARCH_STEPS, filter_step as *mut c_void, ptr::from_mut(&mut unused).cast(), 0);
    }
    let Some(s) = crate::prefix::scratch() else {
        return (NO_BACKEND, 0, 0);
    };
    // The map search, in the keys before the end the filter found (`PickMaps::prefix_search`).
    s.search = Search::new(s.search.lo);
    // SAFETY: as above.
    unsafe {
        bpf_loop(SEARCH_STEPS, search_step as *mut c_void, ptr::from_mut(&mut unused).cast(), 0);
    }
    let Some(s) = crate::prefix::scratch() else {
        return (NO_BACKEND, 0, 0);
    };
    let found = s.search.lo;
    if found != 0 {
        s.c.required_mem_mb = uncached_need(s.c.required_mem_mb, found, s.count);
        // The search copied the longest prefix's entry and counted its slots when it found
        // it held: no second lookup, and no calls for the empty slots after the last holder.
        // SAFETY: as above, for `choose_step`.
        unsafe {
            bpf_loop(s.slots, choose_step as *mut c_void, ptr::from_mut(&mut unused).cast(), 0);
        }
    }
    let Some(s) = crate::prefix::scratch() else {
        return (NO_BACKEND, 0, 0);
    };
    s.choose.settle(found, s.count);
    crate::prefix::count(c.model, &prefix_verdict(s.count, found, &s.choose), s.map_lookups);
    (s.choose.chosen, s.c.required_mem_mb, found)
}

/// The scratch slot, the search's next probe and its key; `None` when the search is over.
#[inline(always)]
fn next_probe() -> Option<(&'static mut PrefixScratch, u32, u64)> {
    let s = crate::prefix::scratch()?;
    let mid = s.search.mid()?;
    // The mask bounds the index for the verifier (mid < count <= PREFIX_KEYS_MAX already).
    let key = s.keys[mid as usize & (PREFIX_KEYS_MAX - 1)];
    Some((s, mid, key))
}

/// `bpf_loop` callback: one step of the search over the filter.
#[inline(never)]
extern "C" fn filter_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some((s, mid, key)) = next_probe() else {
        return 1;
    };
    s.search.record(mid, crate::maps::prefix_maybe_held(s.c.model, key));
    0
}

/// `bpf_loop` callback: one step of the search over the map.
#[inline(never)]
extern "C" fn search_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some((s, mid, key)) = next_probe() else {
        return 1;
    };
    s.map_lookups += 1;
    // `held`, keeping the entry: the last one found held is the longest prefix's, which the
    // choice reads (each lookup of this search is a likely cache miss in a big map).
    let held = match Maps.prefix_holders(s.c.model, key) {
        Some(h) if h.any_fresh(s.c.now_tick, s.c.ttl_ticks) => {
            s.holders = *h;
            s.slots = h.slots() as u32;
            true
        }
        _ => false,
    };
    s.search.record(mid, held);
    0
}

/// `bpf_loop` callback: holder `index` of the longest prefix's entry.
#[inline(never)]
extern "C" fn choose_step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = crate::prefix::scratch() else {
        return 1;
    };
    s.choose.step(&Maps, &s.c, &s.holders, index as usize & (PREFIX_HOLDERS - 1));
    0
}

/// `bpf_loop` context of [`Maps::scan_members`].
struct ScanCtx {
    scan: MemberScan,
    /// Arena position of the member list.
    offset: u32,
    required_mem_mb: u32,
}

/// `bpf_loop` callback: member `index` of the scan. Returns 0 to continue, 1 to stop.
#[inline(never)]
extern "C" fn scan_member(index: u64, ctx: *mut c_void) -> i64 {
    if index >= MAX_MEMBERS as u64 {
        return 1;
    }
    // SAFETY: bpf_loop passes back the `ScanCtx` pointer given in `scan_members` (on the
    // caller's stack, alive for the whole loop).
    let ctx = unsafe { &mut *ctx.cast::<ScanCtx>() };
    ctx.scan.step(&Maps, ctx.offset, index as u32, ctx.required_mem_mb);
    0
}
