//! `ailb_tc_reclaim` (`sched_cls`, never attached): the daemon's housekeeping runs it with
//! `BPF_PROG_TEST_RUN` to remove the flows idle for `TcConfig::idle_timeout_ns`. It runs in
//! the kernel because the in-flight counters change by atomic adds, which userspace cannot
//! make on a map value; the uncount is exactly once for the same reason as at a FIN (the
//! `FLOW_COUNT` delete). Both families' flows (`AILB_FLOWS`, then `AILB_FLOWS6`), with one
//! callback written over [`Family`]. Returns the
//! number of flows removed.

use core::{ffi::c_void, ptr};

use ailb_common::abi::*;
use aya_ebpf::{
    helpers::generated::{bpf_for_each_map_elem, bpf_ktime_get_ns},
    macros::classifier,
    programs::TcContext,
};

use crate::{
    conntrack::V4,
    conntrack6::V6,
    family::Family,
    flows::{remove_flow, uncount_once},
    tc_maps::{tc_stats, AILB_TC_CONFIG},
};

struct Reclaim {
    now: u64,
    timeout: u64,
    removed: u32,
}

#[classifier]
pub fn ailb_tc_reclaim(_ctx: TcContext) -> i32 {
    let Some(cfg) = AILB_TC_CONFIG.get_ptr(0) else {
        return 0;
    };
    // SAFETY: a non-null array map value pointer; one field copied.
    let timeout = unsafe { ptr::read(cfg).idle_timeout_ns };
    if timeout == 0 {
        return 0;
    }
    // SAFETY: no arguments.
    let mut r = Reclaim { now: unsafe { bpf_ktime_get_ns() }, timeout, removed: 0 };
    // SAFETY: the map pointer is the BTF map definition's address (relocated by the loader);
    // `reclaim_one` has the callback signature for a hash map and uses its context only as
    // the `Reclaim` passed here, which outlives the call.
    unsafe { bpf_for_each_map_elem(V4::map_ptr(), reclaim_one::<V4> as *mut c_void, ptr::from_mut(&mut r).cast(), 0) };
    // SAFETY: as above, for the IPv6 flows and their callback.
    unsafe { bpf_for_each_map_elem(V6::map_ptr(), reclaim_one::<V6> as *mut c_void, ptr::from_mut(&mut r).cast(), 0) };
    if let Some(s) = tc_stats() {
        s.flows_reclaimed += r.removed as u64;
    }
    r.removed as i32
}

/// Counts a flow uncounted by the reclaim (not by a FIN or RST before).
#[inline(always)]
fn count_idle_end() {
    if let Some(s) = tc_stats() {
        s.ended_idle += 1;
    }
}

/// Whether an entry last seen at `seen` is idle.
#[inline(always)]
fn idle(r: &Reclaim, seen: u64) -> bool {
    r.now > seen && r.now - seen >= r.timeout
}

/// `bpf_for_each_map_elem` callback: one entry of family `F`'s flow map. A forward entry is
/// removed with its flow when neither side sent a packet within the timeout; a reply entry whose
/// forward entry is gone (an open that failed half-way) when itself idle; a count entry whose
/// forward entry is gone is uncounted. Returns 0: go on.
#[inline(never)]
extern "C" fn reclaim_one<F: Family>(
    _map: *mut c_void,
    key: *const F::Key,
    value: *mut F::Flow,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: the kernel passes this element's key and value and the context given above.
    let (key, flow, r) = unsafe { (ptr::read(key), ptr::read(value), &mut *ctx.cast::<Reclaim>()) };
    let peer = F::peer(&flow);
    let kind = F::kind(&key);
    if kind == FLOW_FORWARD {
        let peer_seen = match F::get(peer) {
            // SAFETY: a non-null hash map value pointer, valid for this run.
            Some(p) => unsafe { *F::last_seen_ptr(p) },
            None => 0,
        };
        let seen = if peer_seen > F::last_seen(&flow) { peer_seen } else { F::last_seen(&flow) };
        if idle(r, seen) {
            if remove_flow::<F>(&key, peer, &flow) {
                count_idle_end();
            }
            r.removed += 1;
        }
    } else if kind == FLOW_REPLY {
        if F::get(peer).is_none() && idle(r, F::last_seen(&flow)) {
            let _ = F::remove(&key);
        }
    } else {
        let fk = F::with_kind(&key, FLOW_FORWARD);
        if F::get(&fk).is_none() && uncount_once::<F>(&fk, &flow) {
            count_idle_end();
        }
    }
    0
}
