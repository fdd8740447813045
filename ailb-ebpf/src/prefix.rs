//! The prefix map in the kernel: the keys a socket carries (`AILB_PREFIX` option, kept in
//! `AILB_SOCK_PREFIX`), the query the pick searches with, and what a connect records in
//! approximate mode (each key of the request -> the backend it got).

use core::{ffi::c_void, ptr};

use ailb_common::{
    abi::*,
    pick::{PrefixQuery, PrefixUse, PrefixVerdict},
    prefix::PREFIX_KEYS_MAX,
};
use aya_ebpf::helpers::generated::{bpf_loop, bpf_sk_storage_get};

use crate::maps::{PrefixScratch, AILB_PREFIX, AILB_PREFIX_SCRATCH, AILB_PREFIX_STATS, AILB_SOCK_PREFIX};

/// This socket's `AILB_SOCK_PREFIX` entry; with `create`, created (zeroed) when absent.
///
/// # Safety
/// `sk` must be a full socket of the program's context (PTR_TO_SOCKET), not NULL.
#[inline(always)]
pub(crate) unsafe fn sock_prefix(sk: *mut c_void, create: bool) -> Option<&'static mut SockPrefix> {
    let flags = if create { aya_ebpf::bindings::BPF_SK_STORAGE_GET_F_CREATE.into() } else { 0 };
    // SAFETY: the map pointer is the address of the BTF map definition, which the loader
    // relocates to the map; `sk` is valid per this function's contract.
    let p = unsafe { bpf_sk_storage_get(ptr::addr_of!(AILB_SOCK_PREFIX) as *mut c_void, sk, ptr::null_mut(), flags) }
        .cast::<SockPrefix>();
    // SAFETY: a non-null sk_storage value of this socket, valid for the program run; only this
    // socket's hooks touch it and they run under the socket lock.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// Reads the option's keys from the kernel's buffer `start..end` (`optlen` bytes) into
/// `keys`; the count, or `None` for a bad length or a key of 0.
#[inline(always)]
pub(crate) fn read_keys(
    start: *const u8,
    end: *const u8,
    optlen: i32,
    keys: &mut [u64; PREFIX_KEYS_MAX],
) -> Option<u32> {
    if optlen < 8 || optlen > (PREFIX_KEYS_MAX * 8) as i32 || optlen % 8 != 0 {
        return None;
    }
    let n = (optlen / 8) as usize;
    let mut i = 0usize;
    while i < PREFIX_KEYS_MAX {
        if i >= n {
            break;
        }
        let p = start.wrapping_add(i * 8);
        // wrapping_add: a plain pointer add, so the `p + 8 > end` comparison on the
        // buffer's pointer survives for the verifier.
        if p.wrapping_add(8) > end {
            return None;
        }
        // SAFETY: `p + 8 <= end`: eight bytes of the option buffer, read unaligned.
        let k = unsafe { ptr::read_unaligned(p.cast::<u64>()) };
        if k == 0 {
            return None;
        }
        // `get_mut`, not an index: no panic path may survive into the program.
        let Some(slot) = keys.get_mut(i) else { return None };
        *slot = k;
        i += 1;
    }
    Some(n as u32)
}

#[inline(always)]
pub(crate) fn scratch() -> Option<&'static mut PrefixScratch> {
    // SAFETY: this CPU's slot, valid for the run (see `PrefixScratch` on sharing it).
    AILB_PREFIX_SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// Copies up to [`PREFIX_KEYS_MAX`] keys into the slot.
#[inline(always)]
pub(crate) fn stage(s: &mut PrefixScratch, keys: &[u64]) {
    let mut i = 0;
    while i < PREFIX_KEYS_MAX {
        // `get`, not an index: no panic path may survive into the program.
        let Some(&k) = keys.get(i) else { break };
        s.keys[i] = k;
        i += 1;
    }
    s.count = i as u32;
}

/// The query for a connect of `sock` with `sp`'s keys to a model in `state`.
#[inline(always)]
pub(crate) fn query<'a>(sp: &'a SockPrefix, state: &ModelView, now_ns: u64) -> PrefixQuery<'a> {
    let n = if sp.count as usize > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX } else { sp.count as usize };
    PrefixQuery::for_connect(&sp.keys[..n], state, now_ns)
}

/// `bpf_loop` context of [`learn`]; the keys are in this CPU's `PrefixScratch` slot (the
/// connect programs' 512-byte stack has no room for a copy).
struct LearnCtx {
    count: u32,
    model: u32,
    backend: u32,
    tick: u32,
    ttl: u32,
}

/// Approximate mode: records `keys` for `backend`, which now caches the request's prompt.
/// Through `bpf_loop`: the per-key update (a lookup, an in-place record or an insert) is
/// verified once instead of sixteen times.
#[inline(always)]
pub(crate) fn learn(sp: &SockPrefix, model: u32, backend: u32, ttl_ns: u64, now_ns: u64) {
    let count = if sp.count as usize > PREFIX_KEYS_MAX { PREFIX_KEYS_MAX as u32 } else { sp.count };
    let Some(s) = scratch() else {
        return;
    };
    s.keys = sp.keys;
    let mut ctx = LearnCtx { count, model, backend, tick: prefix_tick(now_ns), ttl: prefix_ttl_ticks(ttl_ns) };
    // SAFETY: `learn_key` has the callback signature bpf_loop expects and only uses its
    // context as the `LearnCtx` passed here, which outlives the call.
    unsafe {
        bpf_loop(count, learn_key as *mut c_void, ptr::from_mut(&mut ctx).cast(), 0);
    }
}

/// `bpf_loop` callback: records key `index`. Returns 0 to continue, 1 to stop.
#[inline(never)]
extern "C" fn learn_key(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `LearnCtx` pointer given in `learn` (on the caller's
    // stack, alive for the whole loop).
    let ctx = unsafe { &mut *ctx.cast::<LearnCtx>() };
    if index >= PREFIX_KEYS_MAX as u64 || index >= ctx.count as u64 {
        return 1;
    }
    let Some(s) = scratch() else {
        return 1;
    };
    let k = s.keys[index as usize & (PREFIX_KEYS_MAX - 1)];
    let key = PrefixKey { model: ctx.model, _pad: 0, key: k };
    // Before the entry: a search that finds the key in the filter then finds it in the map.
    crate::maps::prefix_filter_add(ctx.model, k);
    match AILB_PREFIX.get_ptr_mut(key) {
        Some(p) => {
            // SAFETY: a non-null LRU hash value pointer, valid for this run (RCU). Another
            // CPU recording the same key at once may lose one of the two holders: the next
            // pick of that prefix records it again.
            if unsafe { (*p).record(ctx.backend, ctx.tick, ctx.tick, ctx.ttl) } {
                count_learned(ctx.model);
            }
        }
        None => {
            let mut h = PrefixHolders::EMPTY;
            h.ids[0] = ctx.backend;
            h.seen[0] = ctx.tick;
            // An LRU map evicts the least recently used entry when full; BPF_NOEXIST keeps an
            // entry another CPU created meanwhile (this key is then recorded next time).
            if AILB_PREFIX.insert(key, h, 1).is_ok() {
                count_learned(ctx.model);
            }
        }
    }
    0
}

/// Counts a prefix search's verdict in the model's counters. Branch-free: a `match` on the
/// verdict became a computed field offset the verifier could not bound.
#[inline(always)]
pub(crate) fn count(model: u32, v: &PrefixVerdict, map_lookups: u32) {
    if model >= MAX_MODELS {
        return;
    }
    // SAFETY: a per-CPU array slot, only touched by programs on this CPU; valid for the run.
    let Some(s) = AILB_PREFIX_STATS.get_ptr_mut(model).map(|p| unsafe { &mut *p }) else {
        return;
    };
    s.lookups += 1;
    s.keys_sent += v.sent as u64;
    s.keys_found += v.found as u64;
    s.keys_exact += u64::from(v.exact) * v.found as u64;
    s.found += u64::from(v.found > 0);
    s.used += u64::from(v.usage == PrefixUse::Used);
    s.overruled_load += u64::from(v.usage == PrefixUse::OverruledLoad);
    s.overruled_memory += u64::from(v.usage == PrefixUse::OverruledMemory);
    s.map_lookups += map_lookups as u64;
}

/// Counts a key learnt for a model (in the learning callback itself: a count carried in the
/// callback's context would differ on every iteration, and the verifier would walk each).
#[inline(always)]
fn count_learned(model: u32) {
    if model >= MAX_MODELS {
        return;
    }
    // SAFETY: as in `count`.
    if let Some(s) = AILB_PREFIX_STATS.get_ptr_mut(model).map(|p| unsafe { &mut *p }) {
        s.learned += 1;
    }
}
