//! Remote IPv6 clients' flows in `AILB_FLOWS6`: the same three entries per flow, lifecycle
//! and exactly-once uncount as [`crate::conntrack`] (whose pick, counters and refusals they
//! share), with IPv6 keys. The pick reaches the model's IPv6 backends only.

use core::ptr;

use ailb_common::{
    abi::*,
    hash::{fmix64, rehash},
    pick::{ClientFamily, Outcome},
};
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};

use crate::{
    connect4::count_pick,
    conntrack::{count_full, count_open, pick_remote, refuse_syn, uncount, Client, BPF_NOEXIST_FLAG, MAP_FULL},
    maps::{backend_addr6, AILB_SERVICES6},
    nat6,
    packet::{Packet6, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    tc_maps::{nat_addr6, nat_cursor, nat_cursor_advance, open6_scratch, tc_stats, Open6, AILB_FLOWS6, NAT_CURSOR_V6},
};

pub(crate) use crate::conntrack::REOPEN;

/// The key of `pkt` as it arrives, of `kind`.
#[inline(always)]
fn key_of(pkt: &Packet6, kind: u32) -> FlowKey6 {
    FlowKey6 { src_addr: pkt.saddr, dst_addr: pkt.daddr, src_port: pkt.sport, dst_port: pkt.dport, kind }
}

/// The `kind` entry matching `pkt`, valid for this run (RCU).
#[inline(always)]
pub(crate) fn lookup(pkt: &Packet6, kind: u32) -> Option<*mut Flow6> {
    AILB_FLOWS6.get_ptr_mut(key_of(pkt, kind))
}

/// The IPv6 VIP `pkt` is addressed to, if any.
#[inline(always)]
pub(crate) fn vip(pkt: &Packet6) -> Option<Service> {
    let service = AILB_SERVICES6.get_ptr(ServiceKey6 { addr: pkt.daddr, port: pkt.dport, _pad: 0 })?;
    // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
    Some(unsafe { ptr::read(service) })
}

/// A client -> VIP packet of a known flow (its own subprogram, as the IPv4 one).
#[inline(never)]
pub(crate) fn on_forward(ctx: &TcContext, pkt: &Packet6, entry: *mut Flow6, now: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    let fk = key_of(pkt, FLOW_FORWARD);
    if pkt.flags & (TCP_SYN | TCP_ACK) == TCP_SYN && flow.flags != 0 {
        let _ = remove_flow(&fk, &flow.peer, &flow);
        return REOPEN;
    }
    // SAFETY: as above; a racing writer can only store another recent time.
    unsafe { (*entry).last_seen_ns = now };
    let verdict = nat6::rewrite_and_forward(ctx, pkt, &flow);
    track_close(pkt, &fk, &flow.peer, &flow, FLOW_FIN_CLIENT);
    verdict
}

/// A backend -> client packet of a known flow.
#[inline(never)]
pub(crate) fn on_reply(ctx: &TcContext, pkt: &Packet6, entry: *mut Flow6, now: u64) -> i32 {
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    let flow = unsafe { ptr::read(entry) };
    // SAFETY: as above; a racing writer can only store another recent time.
    unsafe { (*entry).last_seen_ns = now };
    let verdict = nat6::rewrite_and_forward(ctx, pkt, &flow);
    track_close(pkt, &flow.peer, &key_of(pkt, FLOW_REPLY), &flow, FLOW_FIN_BACKEND);
    verdict
}

/// The close as the packets show it, as `conntrack::track_close`.
#[inline(always)]
fn track_close(pkt: &Packet6, fk: &FlowKey6, rk: &FlowKey6, flow: &Flow6, fin: u32) {
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

/// Adds `fin` to the flags of entry `key` with a one-byte store, as the IPv4 one.
#[inline(always)]
fn note_fin(key: &FlowKey6, fin: u32) {
    if let Some(p) = AILB_FLOWS6.get_ptr_mut(*key) {
        // SAFETY: a non-null hash map value pointer, valid for this run.
        unsafe { crate::conntrack::set_fin_byte(ptr::addr_of_mut!((*p).flags), fin) };
    }
}

/// Uncounts the flow of forward key `fk` if it is still counted (the delete of its
/// `FLOW_COUNT` entry succeeds for one caller only). Returns whether this call uncounted it.
#[inline(always)]
pub(crate) fn uncount_once(fk: &FlowKey6, flow: &Flow6) -> bool {
    let ck = FlowKey6 { kind: FLOW_COUNT, ..*fk };
    if AILB_FLOWS6.remove(ck).is_err() {
        return false;
    }
    uncount(flow.backend, flow.model, flow.counted_mem_mb);
    true
}

/// Uncounts the flow and removes its entries. Returns whether this call uncounted it.
#[inline(always)]
pub(crate) fn remove_flow(fk: &FlowKey6, rk: &FlowKey6, flow: &Flow6) -> bool {
    let uncounted = uncount_once(fk, flow);
    let _ = AILB_FLOWS6.remove(*fk);
    let _ = AILB_FLOWS6.remove(*rk);
    uncounted
}

/// 64 bits of an IPv6 address for the hashes (the four words mixed, none dropped).
#[inline(always)]
fn addr_bits(a: &[u32; 4]) -> u64 {
    (((a[0] as u64) << 32) | a[1] as u64) ^ rehash(((a[2] as u64) << 32) | a[3] as u64)
}

/// A SYN to an IPv6 `service`: the pick among its IPv6 backends, the flow's entries, the
/// counts (the SYN is then rewritten by [`on_forward`], see [`OPENED`]). The entries are built in
/// the per-CPU [`Open6`] slot: with 40-byte keys and 104-byte values they do not fit the
/// BPF stack next to the pick.
#[inline(never)]
pub(crate) fn open(pkt: &Packet6, service: &Service, cfg: &TcConfig, now: u64) -> i32 {
    let client_bits = addr_bits(&pkt.saddr);
    let ports = (pkt.sport as u64) << 16 | pkt.dport as u64;
    let conn_hash = fmix64(client_bits ^ ports ^ rehash(addr_bits(&pkt.daddr)));
    let client = Client { addr: fmix64(client_bits), space: AFFINITY_SPACE_CLIENT6, conn_hash };
    let (res, backend, model, tcm, entry) = match pick_remote(service, &client, ClientFamily::Ipv6Only, now) {
        Ok(p) => p,
        Err(verdict) => return verdict,
    };
    let (Some(backend_addr), Some(o)) = (backend_addr6(res.backend), open6_scratch()) else {
        return refuse_syn(Outcome::NoBackend);
    };
    o.fk = key_of(pkt, FLOW_FORWARD);
    // The reply entry's value first; the same slot then becomes the forward entry's.
    o.flow = Flow6 {
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
        peer: o.fk,
    };
    o.rk = FlowKey6 {
        src_addr: backend_addr,
        dst_addr: pkt.saddr,
        src_port: backend.port,
        dst_port: pkt.sport,
        kind: FLOW_REPLY,
    };
    if !insert_reply(cfg, o) {
        return TC_ACT_SHOT as i32;
    }
    if cfg.mode == TC_MODE_MASQUERADE {
        o.flow.src_addr = o.rk.dst_addr;
        o.flow.src_port = o.rk.dst_port;
    } else {
        o.flow.src_addr = pkt.saddr;
        o.flow.src_port = pkt.sport;
    }
    o.flow.dst_addr = backend_addr;
    o.flow.dst_port = backend.port;
    o.flow.peer = o.rk;
    if let Err(e) = AILB_FLOWS6.insert(&o.fk, &o.flow, BPF_NOEXIST_FLAG) {
        let _ = AILB_FLOWS6.remove(&o.rk);
        count_full(e);
        return TC_ACT_SHOT as i32;
    }
    o.fk.kind = FLOW_COUNT;
    let counted = AILB_FLOWS6.insert(&o.fk, &o.flow, BPF_NOEXIST_FLAG);
    o.fk.kind = FLOW_FORWARD;
    if let Err(e) = counted {
        let _ = AILB_FLOWS6.remove(&o.fk);
        let _ = AILB_FLOWS6.remove(&o.rk);
        count_full(e);
        return TC_ACT_SHOT as i32;
    }
    count_open(o.flow.backend, o.flow.model, o.flow.counted_mem_mb);
    entry.remember(&res, now);
    count_pick(&res);
    OPENED
}

/// What [`open`] returns once the flow is open: the caller then handles the SYN as the
/// flow's first packet ([`on_forward`]). The rewrite and FIB lookup are not made in `open`'s
/// frame, which with the pick would pass the 512 bytes of stack the frames share.
pub(crate) const OPENED: i32 = -2;

/// Inserts the flow's reply entry (`o.flow` at `o.rk`), as the IPv4 `insert_reply`: routed,
/// the backend answers the client; masquerading, the IPv6 NAT address at the first of
/// [`NAT_PROBES`] ports from the IPv6 cursor that no other flow to this backend holds
/// (`o.rk` then holds it). Whether it was inserted.
#[inline(always)]
fn insert_reply(cfg: &TcConfig, o: &mut Open6) -> bool {
    if cfg.mode != TC_MODE_MASQUERADE {
        return match AILB_FLOWS6.insert(&o.rk, &o.flow, BPF_NOEXIST_FLAG) {
            Ok(()) => true,
            Err(e) => {
                count_full(e);
                false
            }
        };
    }
    if cfg.port_min == 0 || cfg.port_max < cfg.port_min {
        return false;
    }
    let min = cfg.port_min as u64;
    let range = (cfg.port_max as u64) - min + 1;
    o.rk.dst_addr = nat_addr6();
    let base = nat_cursor(NAT_CURSOR_V6);
    let mut i = 0u64;
    while i < NAT_PROBES as u64 {
        let p = (min + base.wrapping_add(i) % range) as u16;
        o.rk.dst_port = p.to_be();
        match AILB_FLOWS6.insert(&o.rk, &o.flow, BPF_NOEXIST_FLAG) {
            Ok(()) => {
                nat_cursor_advance(NAT_CURSOR_V6, i + 1);
                return true;
            }
            Err(MAP_FULL) => {
                count_full(MAP_FULL);
                return false;
            }
            Err(_) => {}
        }
        i += 1;
    }
    if let Some(s) = tc_stats() {
        s.nat_exhausted += 1;
    }
    false
}
