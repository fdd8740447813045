//! Remote clients' flows in `AILB_FLOWS` (three entries per flow; layout and invariants:
//! `ailb_common::abi::tc`): a SYN to a VIP opens one with the pick, each packet refreshes
//! its entry, the first FIN or an RST uncounts it, an RST or the ACK after both FINs removes
//! it, and `ailb_tc_reclaim` removes the idle ones.

use core::ptr;

use ailb_common::{
    abi::*,
    hash::{fmix64, rehash},
    pick::{pick_with_prefix, ClientFamily, Outcome, PickMaps, PickRequest, PickResult},
};
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};

use crate::{
    connect4::{count_pick, AffinityEntry},
    maps::{inflight_add, inflight_read, stats, turn_take, AILB_CONFIG, AILB_SERVICES},
    nat,
    packet::{Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    pick_maps::Maps,
    tc_maps::{model_state, nat_cursor, nat_cursor_advance, tc_model, tc_stats, AILB_FLOWS, NAT_CURSOR_V4},
};

/// `-E2BIG`: a full hash map refuses an insert with it.
pub(crate) const MAP_FULL: i32 = -7;

/// The key of `pkt` as it arrives, of `kind`.
#[inline(always)]
fn key_of(pkt: &Packet, kind: u32) -> FlowKey {
    FlowKey { src_addr: pkt.saddr, dst_addr: pkt.daddr, src_port: pkt.sport, dst_port: pkt.dport, kind }
}

/// The `kind` entry matching `pkt`, valid for this run (RCU).
#[inline(always)]
pub(crate) fn lookup(pkt: &Packet, kind: u32) -> Option<*mut Flow> {
    AILB_FLOWS.get_ptr_mut(key_of(pkt, kind))
}

/// The VIP `pkt` is addressed to, if any.
#[inline(always)]
pub(crate) fn vip(pkt: &Packet) -> Option<Service> {
    let key = ServiceKey { addr: pkt.daddr, port: pkt.dport, _pad: 0 };
    let service = AILB_SERVICES.get_ptr(key)?;
    // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
    Some(unsafe { ptr::read(service) })
}

/// What [`on_forward`] returns when the packet is a SYN that reuses the address and port of
/// a closing flow: that flow is removed and the SYN opens a new one.
pub(crate) const REOPEN: i32 = -1;

/// A client -> VIP packet of a known flow. A function of its own (a BPF subprogram, with its
/// own stack frame) so that its locals and the open path's do not add up in one frame.
#[inline(never)]
pub(crate) fn on_forward(ctx: &TcContext, pkt: &Packet, entry: *mut Flow, now: u64, step: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    let fk = key_of(pkt, FLOW_FORWARD);
    if pkt.flags & (TCP_SYN | TCP_ACK) == TCP_SYN && flow.flags != 0 {
        let _ = remove_flow(&fk, &flow.peer, &flow);
        return REOPEN;
    }
    touch(entry, &flow, now, step);
    let verdict = nat::rewrite_and_forward(ctx, pkt, &flow);
    track_close(pkt, &fk, &flow.peer, &flow, FLOW_FIN_CLIENT);
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
fn touch(entry: *mut Flow, flow: &Flow, now: u64, step: u64) {
    if now.wrapping_sub(flow.last_seen_ns) >= step {
        // SAFETY: a non-null hash map value pointer, valid for this run; a racing writer can
        // only store another recent time.
        unsafe { (*entry).last_seen_ns = now };
    }
}

/// A backend -> client packet of a known flow (its own subprogram, as [`on_forward`]).
#[inline(never)]
pub(crate) fn on_reply(ctx: &TcContext, pkt: &Packet, entry: *mut Flow, now: u64, step: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    touch(entry, &flow, now, step);
    let verdict = nat::rewrite_and_forward(ctx, pkt, &flow);
    track_close(pkt, &flow.peer, &key_of(pkt, FLOW_REPLY), &flow, FLOW_FIN_BACKEND);
    verdict
}

/// The close of a flow as its packets show it: an RST ends it; a FIN uncounts it (the load
/// bound stops seeing it as soon as either side closes, as sock_ops does for local
/// connections) and is noted in both entries; the first packet without FIN after both FINs
/// (the last ACK) removes it. `flow` is the entry the packet matched, `fin` its side's flag.
#[inline(always)]
fn track_close(pkt: &Packet, fk: &FlowKey, rk: &FlowKey, flow: &Flow, fin: u32) {
    let both = FLOW_FIN_CLIENT | FLOW_FIN_BACKEND;
    if pkt.flags & TCP_RST != 0 {
        if remove_flow(fk, rk, flow) {
            if let Some(s) = tc_stats() {
                s.ended_rst += 1;
            }
        }
    } else if pkt.flags & TCP_FIN != 0 {
        if flow.flags & fin == 0 {
            note_fin(fk, fin);
            note_fin(rk, fin);
        }
        let _ = uncount_once(fk, flow);
    } else if flow.flags & both == both {
        let _ = remove_flow(fk, rk, flow);
    }
}

/// Adds `fin` to the flags of entry `key`: one byte of its own set to 1
/// ([`flow_fin_byte`]), not a read-modify-write of the word, so that the other side's FIN noted
/// on another CPU at the same moment is not overwritten (both sides closing at once is common:
/// a client that closes as soon as it has read a whole answer, a server that closes after
/// writing it).
#[inline(always)]
fn note_fin(key: &FlowKey, fin: u32) {
    if let Some(p) = AILB_FLOWS.get_ptr_mut(*key) {
        // SAFETY: a non-null hash map value pointer, valid for this run; the byte is inside
        // `flags` (`flow_fin_byte` is 0 or 1 of its 4).
        unsafe { set_fin_byte(ptr::addr_of_mut!((*p).flags), fin) };
    }
}

/// Sets `fin`'s byte of the flags word at `flags` to 1.
///
/// # Safety
/// `flags` must point to a writable `u32`.
#[inline(always)]
pub(crate) unsafe fn set_fin_byte(flags: *mut u32, fin: u32) {
    // SAFETY: per this function's contract; `flow_fin_byte` of a `FLOW_FIN_*` is below 4.
    unsafe { ptr::write_volatile(flags.cast::<u8>().add(flow_fin_byte(fin)), 1) };
}

/// Uncounts the flow of forward key `fk` if it is still counted: the delete of its
/// `FLOW_COUNT` entry succeeds for one caller only. Returns whether this call uncounted it.
#[inline(always)]
pub(crate) fn uncount_once(fk: &FlowKey, flow: &Flow) -> bool {
    let ck = FlowKey { kind: FLOW_COUNT, ..*fk };
    if AILB_FLOWS.remove(ck).is_err() {
        return false;
    }
    uncount(flow.backend, flow.model, flow.counted_mem_mb);
    true
}

/// Takes a flow of `backend` and `model` holding `mem_mb` out of the in-flight counters.
#[inline(always)]
pub(crate) fn uncount(backend: u32, model: u32, mem_mb: u32) {
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
pub(crate) fn remove_flow(fk: &FlowKey, rk: &FlowKey, flow: &Flow) -> bool {
    let uncounted = uncount_once(fk, flow);
    let _ = AILB_FLOWS.remove(*fk);
    let _ = AILB_FLOWS.remove(*rk);
    uncounted
}

/// Counts a SYN the pick refused, and drops it (a remote client has no `connect()` to fail).
#[inline(always)]
pub(crate) fn refuse_syn(outcome: Outcome) -> i32 {
    if let Some(s) = stats() {
        if outcome == Outcome::NoFit {
            s.no_fit += 1;
        } else {
            s.no_backend += 1;
        }
    }
    if let Some(s) = tc_stats() {
        s.refused += 1;
    }
    TC_ACT_SHOT as i32
}

/// A SYN to `service`: the pick, the flow's entries, the counts, then the SYN rewritten and
/// forwarded. Dropped when the pick refuses it, the flow table is full or no NAT port is free.
/// Its own subprogram, as [`on_forward`].
#[inline(never)]
pub(crate) fn open(ctx: &TcContext, pkt: &Packet, service: &Service, cfg: &TcConfig, now: u64) -> i32 {
    let conn_hash =
        fmix64(((pkt.saddr as u64) << 32 | (pkt.sport as u64) << 16 | pkt.dport as u64) ^ rehash(pkt.daddr as u64));
    let client = Client { addr: pkt.saddr as u64, space: AFFINITY_SPACE_CLIENT, conn_hash };
    let (res, backend, model, tcm, entry) = match pick_remote(service, &client, ClientFamily::Ipv4, now) {
        Ok(p) => p,
        Err(verdict) => return verdict,
    };
    let fk = key_of(pkt, FLOW_FORWARD);
    let reply = Flow {
        src_addr: pkt.daddr,
        dst_addr: pkt.saddr,
        src_port: pkt.dport,
        dst_port: pkt.sport,
        backend: res.backend,
        model,
        counted_mem_mb: tcm.required_mem_mb,
        flags: 0,
        _pad: 0,
        last_seen_ns: now,
        peer: fk,
    };
    let Some(rk) = insert_reply(pkt, cfg, &backend, &reply) else {
        return TC_ACT_SHOT as i32;
    };
    let (src_addr, src_port) =
        if cfg.mode == TC_MODE_MASQUERADE { (rk.dst_addr, rk.dst_port) } else { (pkt.saddr, pkt.sport) };
    let forward = Flow { src_addr, dst_addr: backend.addr, src_port, dst_port: backend.port, peer: rk, ..reply };
    if let Err(e) = AILB_FLOWS.insert(fk, forward, BPF_NOEXIST_FLAG) {
        // Full, or the same SYN opened the flow on another CPU meanwhile (its retransmission
        // will find that flow).
        let _ = AILB_FLOWS.remove(rk);
        count_full(e);
        return TC_ACT_SHOT as i32;
    }
    if let Err(e) = AILB_FLOWS.insert(FlowKey { kind: FLOW_COUNT, ..fk }, forward, BPF_NOEXIST_FLAG) {
        let _ = AILB_FLOWS.remove(fk);
        let _ = AILB_FLOWS.remove(rk);
        count_full(e);
        return TC_ACT_SHOT as i32;
    }
    count_open(forward.backend, forward.model, forward.counted_mem_mb);
    entry.remember(&res, now);
    count_pick(&res);
    nat::rewrite_and_forward(ctx, pkt, &forward)
}

/// A remote client as the pick sees it: the affinity key of its address (in `space`), and the
/// hash of its connection for a model without client-address affinity.
pub(crate) struct Client {
    pub addr: u64,
    pub space: u32,
    pub conn_hash: u64,
}

/// The pick for a SYN from `client` to `service`, among the backends `family` reaches: the
/// result, the backend, the model, its remote-client settings and the affinity entry to
/// remember the pick in; `Err(verdict)` when refused (counted). Shared by both families'
/// open paths.
#[inline(always)]
pub(crate) fn pick_remote(
    service: &Service,
    client: &Client,
    family: ClientFamily,
    now: u64,
) -> Result<(PickResult, Backend, u32, TcModel, AffinityEntry), i32> {
    // A shared VIP picks its model from a socket hint, which a remote client cannot send.
    if service.flags & SERVICE_SHARED != 0 || service.model >= MAX_MODELS {
        return Err(refuse_syn(Outcome::NoBackend));
    }
    let model = service.model;
    let (Some(gcfg), Some(state)) = (AILB_CONFIG.get_ptr(0), model_state(model)) else {
        return Err(refuse_syn(Outcome::NoBackend));
    };
    // SAFETY: a non-null array map value pointer; copied.
    let gcfg = unsafe { ptr::read(gcfg) };
    let tcm = tc_model(model);
    let by_client = tcm.affinity == TC_AFFINITY_CLIENT_ADDR;
    let hash = if by_client { fmix64(client.addr) } else { client.conn_hash };
    let used = by_client && gcfg.flags & CONFIG_AFFINITY != 0;
    let entry = AffinityEntry::lookup(model, client.space, client.addr, used);
    let affinity = entry.value();
    let turn = if gcfg.flags & CONFIG_ROUND_ROBIN != 0 && affinity.is_none() { turn_take(model) } else { 0 };
    let req = PickRequest {
        model,
        hash,
        has_conversation: by_client,
        required_mem_mb: tcm.required_mem_mb,
        affinity,
        now_ns: now,
        model_inflight: inflight_read(INFLIGHT_MODEL_BASE + model),
        turn,
        affinity_bounded: by_client,
    };
    let res = pick_with_prefix(&Maps, state, &gcfg, &req, family, None);
    if res.backend >= MAX_BACKENDS {
        return Err(refuse_syn(res.outcome));
    }
    let Some(backend) = Maps.backend(res.backend) else {
        return Err(refuse_syn(Outcome::NoBackend));
    };
    Ok((res, backend, model, tcm, entry))
}

pub(crate) const BPF_NOEXIST_FLAG: u64 = aya_ebpf::bindings::BPF_NOEXIST as u64;

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

/// Inserts the flow's reply entry and returns its key: routed, the backend answers the
/// client itself; masquerading, the backend answers the NAT address at a port of the range
/// that no other flow to this backend holds (the first of [`NAT_PROBES`] consecutive ports from
/// the shared cursor that a no-exist insert accepts, so two SYNs never share one).
#[inline(always)]
fn insert_reply(pkt: &Packet, cfg: &TcConfig, backend: &Backend, reply: &Flow) -> Option<FlowKey> {
    let mut rk = FlowKey {
        src_addr: backend.addr,
        dst_addr: pkt.saddr,
        src_port: backend.port,
        dst_port: pkt.sport,
        kind: FLOW_REPLY,
    };
    if cfg.mode != TC_MODE_MASQUERADE {
        return match AILB_FLOWS.insert(rk, *reply, BPF_NOEXIST_FLAG) {
            Ok(()) => Some(rk),
            Err(e) => {
                count_full(e);
                None
            }
        };
    }
    let min = cfg.port_min as u64;
    let range = (cfg.port_max as u64).saturating_sub(min) + 1;
    if cfg.port_min == 0 || cfg.port_max < cfg.port_min {
        return None;
    }
    rk.dst_addr = cfg.nat_addr;
    // One cursor for all CPUs, not a hash of the client's address and port nor a cursor per
    // CPU: a port freed at a flow's close is taken again only after the cursor has gone round
    // the whole range. The backend holds the closed connection in TIME_WAIT (60 s on Linux)
    // when it closed first, and answers a new SYN on the same (backend, NAT address, port)
    // with the old connection's ACK: the client resets and retransmits its SYN a second
    // later, as a new flow. Hashed ports hit that about once in sixteen connections of a burst
    // (8,000 connections over 10,000 ports opened 8,492 flows); per-CPU cursors, whose walks
    // overlap, about once in thirty (8,250). The cursor moves past the port taken.
    let base = nat_cursor(NAT_CURSOR_V4);
    let mut i = 0u64;
    while i < NAT_PROBES as u64 {
        let port = (min + base.wrapping_add(i) % range) as u16;
        rk.dst_port = port.to_be();
        match AILB_FLOWS.insert(rk, *reply, BPF_NOEXIST_FLAG) {
            Ok(()) => {
                nat_cursor_advance(NAT_CURSOR_V4, i + 1);
                return Some(rk);
            }
            Err(MAP_FULL) => {
                count_full(MAP_FULL);
                return None;
            }
            Err(_) => {}
        }
        i += 1;
    }
    if let Some(s) = tc_stats() {
        s.nat_exhausted += 1;
    }
    None
}
