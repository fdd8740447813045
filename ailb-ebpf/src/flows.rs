//! Remote clients' flows, for both families ([`Family`]): three entries per flow in the
//! family's flow map (layout and invariants: `ailb_common::abi::tc`). A SYN to a VIP opens one
//! with the pick (the family's open path: [`crate::conntrack`], [`crate::conntrack6`]), each
//! packet refreshes its entry, the first FIN or an RST uncounts it, an RST or the ACK after both
//! FINs removes it, and `ailb_tc_reclaim` removes the idle ones ([`crate::reclaim`]). The
//! in-flight counts of the flows, opened and closed, are here too.

use core::ptr;

use ailb_common::abi::*;
use aya_ebpf::programs::TcContext;

use crate::{
    family::Family,
    maps::inflight_add,
    nat,
    packet::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    tc_maps::tc_stats,
};

/// `-E2BIG`: a full hash map refuses an insert with it.
pub(crate) const MAP_FULL: i32 = -7;

/// The `kind` entry matching `pkt`, valid for this run (RCU).
#[inline(always)]
pub(crate) fn lookup<F: Family>(pkt: &F::Pkt, kind: u32) -> Option<*mut F::Flow> {
    F::get(&F::key_of(pkt, kind))
}

/// What [`on_forward`] returns when the packet is a SYN that reuses the address and port of
/// a closing flow: that flow is removed and the SYN opens a new one.
pub(crate) const REOPEN: i32 = -1;

/// A client -> VIP packet of a known flow. A function of its own (a BPF subprogram, with its
/// own stack frame) so that its locals and the open path's do not add up in one frame.
#[inline(never)]
pub(crate) fn on_forward<F: Family>(ctx: &TcContext, pkt: &F::Pkt, entry: *mut F::Flow, now: u64, step: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    let fk = F::key_of(pkt, FLOW_FORWARD);
    if F::tcp_flags(pkt) & (TCP_SYN | TCP_ACK) == TCP_SYN && F::flags(&flow) != 0 {
        let _ = remove_flow::<F>(&fk, F::peer(&flow), &flow);
        return REOPEN;
    }
    touch::<F>(entry, &flow, now, step);
    let verdict = nat::rewrite_and_forward::<F>(ctx, pkt, &flow);
    track_close::<F>(pkt, &fk, F::peer(&flow), &flow, FLOW_FIN_CLIENT);
    verdict
}

/// A backend -> client packet of a known flow (its own subprogram, as [`on_forward`]).
#[inline(never)]
pub(crate) fn on_reply<F: Family>(ctx: &TcContext, pkt: &F::Pkt, entry: *mut F::Flow, now: u64, step: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    touch::<F>(entry, &flow, now, step);
    let verdict = nat::rewrite_and_forward::<F>(ctx, pkt, &flow);
    track_close::<F>(pkt, F::peer(&flow), &F::key_of(pkt, FLOW_REPLY), &flow, FLOW_FIN_BACKEND);
    verdict
}

/// How far a flow entry's `last_seen_ns` may lag its last packet: a sixteenth of the idle
/// timeout, at most a second (and a second when flows never idle out). The entry is written
/// only when its time has moved by at least that much, not at every packet: an entry shared by
/// the packets of both CPUs stays in their caches unwritten, and the reclaim, which takes a
/// flow as idle after `idle_timeout_ns` without a write, can end it at most a sixteenth early.
#[inline(always)]
pub(crate) fn seen_step(idle_timeout_ns: u64) -> u64 {
    const SECOND: u64 = 1_000_000_000;
    let step = idle_timeout_ns >> 4;
    if idle_timeout_ns == 0 || step > SECOND {
        SECOND
    } else {
        step
    }
}

/// Notes a packet of the flow at `entry` (its copy `flow`) at `now`, when the entry's time is
/// at least `step` old ([`seen_step`]).
#[inline(always)]
fn touch<F: Family>(entry: *mut F::Flow, flow: &F::Flow, now: u64, step: u64) {
    if now.wrapping_sub(F::last_seen(flow)) >= step {
        // SAFETY: a non-null hash map value pointer, valid for this run; a racing writer can
        // only store another recent time.
        unsafe { *F::last_seen_ptr(entry) = now };
    }
}

/// The close of a flow as its packets show it: an RST ends it; a FIN uncounts it (the load
/// bound stops seeing it as soon as either side closes, as sock_ops does for local
/// connections) and is noted in both entries; the first packet without FIN after both FINs
/// (the last ACK) removes it. `flow` is the entry the packet matched, `fin` its side's flag.
#[inline(always)]
fn track_close<F: Family>(pkt: &F::Pkt, fk: &F::Key, rk: &F::Key, flow: &F::Flow, fin: u32) {
    let both = FLOW_FIN_CLIENT | FLOW_FIN_BACKEND;
    let flags = F::tcp_flags(pkt);
    if flags & TCP_RST != 0 {
        if remove_flow::<F>(fk, rk, flow) {
            if let Some(s) = tc_stats() {
                s.ended_rst += 1;
            }
        }
    } else if flags & TCP_FIN != 0 {
        if F::flags(flow) & fin == 0 {
            note_fin::<F>(fk, fin);
            note_fin::<F>(rk, fin);
        }
        let _ = uncount_once::<F>(fk, flow);
    } else if F::flags(flow) & both == both {
        let _ = remove_flow::<F>(fk, rk, flow);
    }
}

/// Adds `fin` to the flags of entry `key`: one byte of its own set to 1
/// ([`flow_fin_byte`]), not a read-modify-write of the word, so that the other side's FIN noted
/// on another CPU at the same moment is not overwritten (both sides closing at once is common:
/// a client that closes as soon as it has read a whole answer, a server that closes after
/// writing it).
#[inline(always)]
fn note_fin<F: Family>(key: &F::Key, fin: u32) {
    if let Some(p) = F::get(key) {
        // SAFETY: a non-null hash map value pointer, valid for this run; the byte is inside
        // the flags word (`flow_fin_byte` of a `FLOW_FIN_*` is below 4).
        unsafe { ptr::write_volatile(F::flags_ptr(p).cast::<u8>().add(flow_fin_byte(fin)), 1) };
    }
}

/// Uncounts the flow of forward key `fk` if it is still counted: the delete of its
/// `FLOW_COUNT` entry succeeds for one caller only. Returns whether this call uncounted it.
#[inline(always)]
pub(crate) fn uncount_once<F: Family>(fk: &F::Key, flow: &F::Flow) -> bool {
    if !F::remove(&F::with_kind(fk, FLOW_COUNT)) {
        return false;
    }
    let (backend, model, mem_mb) = F::counted(flow);
    uncount(backend, model, mem_mb);
    true
}

/// Takes a flow of `backend` and `model` holding `mem_mb` out of the in-flight counters.
#[inline(always)]
fn uncount(backend: u32, model: u32, mem_mb: u32) {
    if backend < MAX_BACKENDS && model < MAX_MODELS {
        inflight_add(backend, u64::MAX);
        inflight_add(INFLIGHT_MODEL_BASE + model, u64::MAX);
        if mem_mb != 0 {
            inflight_add(INFLIGHT_MEM_BASE + backend, (mem_mb as u64).wrapping_neg());
        }
    }
    if let Some(s) = tc_stats() {
        s.flows_closed += 1;
    }
}

/// Uncounts the flow and removes its entries. Returns whether this call uncounted it (it was
/// still counted: no FIN had been seen).
#[inline(always)]
pub(crate) fn remove_flow<F: Family>(fk: &F::Key, rk: &F::Key, flow: &F::Flow) -> bool {
    let uncounted = uncount_once::<F>(fk, flow);
    let _ = F::remove(fk);
    let _ = F::remove(rk);
    uncounted
}

/// Counts a refused insert when the map was full.
#[inline(always)]
pub(crate) fn count_full(err: i32) {
    if err == MAP_FULL {
        if let Some(s) = tc_stats() {
            s.flows_full += 1;
        }
    }
}

/// Counts a new flow in flight at its backend and model, with the model's memory hint.
#[inline(always)]
pub(crate) fn count_open(backend: u32, model: u32, mem_mb: u32) {
    if backend < MAX_BACKENDS && model < MAX_MODELS {
        inflight_add(backend, 1);
        inflight_add(INFLIGHT_MODEL_BASE + model, 1);
        if mem_mb != 0 {
            inflight_add(INFLIGHT_MEM_BASE + backend, mem_mb as u64);
        }
    }
    if let Some(s) = tc_stats() {
        s.flows_opened += 1;
    }
}
