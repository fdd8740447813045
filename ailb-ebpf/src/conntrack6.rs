//! The IPv6 family of the TC path: its [`Family`] (packets, `AILB_FLOWS6`, `AILB_SERVICES6`,
//! the IPv6 rewrite steps of [`crate::nat6`]) and its open path, with the same three entries
//! per flow, lifecycle and exactly-once uncount as IPv4 ([`crate::flows`]) and the same pick,
//! among the model's IPv6 backends only.

use core::ptr;

use ailb_common::{
    abi::*,
    hash::{fmix64, rehash},
    pick::{ClientFamily, Outcome},
};
use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, TC_ACT_SHOT},
    programs::TcContext,
};

use crate::{
    connect4::count_pick,
    conntrack::{pick_remote, refuse_syn, Client, BPF_NOEXIST_FLAG},
    family::{Family, Side},
    flows::{count_full, count_open, MAP_FULL},
    maps::{backend_addr6, AILB_SERVICES6},
    nat6,
    packet::Packet6,
    tc_maps::{nat_addr6, nat_cursor, nat_cursor_advance, open6_scratch, tc_stats, Open6, AILB_FLOWS6, NAT_CURSOR_V6},
};

/// The IPv6 family.
pub(crate) struct V6;

impl Family for V6 {
    type Addr = [u32; 4];
    type Pkt = Packet6;
    type Key = FlowKey6;
    type Flow = Flow6;

    #[inline(always)]
    fn saddr(pkt: &Packet6) -> &[u32; 4] {
        &pkt.saddr
    }
    #[inline(always)]
    fn daddr(pkt: &Packet6) -> &[u32; 4] {
        &pkt.daddr
    }
    #[inline(always)]
    fn ports(pkt: &Packet6) -> (u16, u16) {
        (pkt.sport, pkt.dport)
    }
    #[inline(always)]
    fn l4(pkt: &Packet6) -> u32 {
        pkt.l4
    }
    #[inline(always)]
    fn tcp_flags(pkt: &Packet6) -> u8 {
        pkt.flags
    }
    #[inline(always)]
    fn key_of(pkt: &Packet6, kind: u32) -> FlowKey6 {
        FlowKey6 { src_addr: pkt.saddr, dst_addr: pkt.daddr, src_port: pkt.sport, dst_port: pkt.dport, kind }
    }
    #[inline(always)]
    fn kind(key: &FlowKey6) -> u32 {
        key.kind
    }
    #[inline(always)]
    fn with_kind(key: &FlowKey6, kind: u32) -> FlowKey6 {
        FlowKey6 { kind, ..*key }
    }
    #[inline(always)]
    fn flow_src(flow: &Flow6) -> (&[u32; 4], u16) {
        (&flow.src_addr, flow.src_port)
    }
    #[inline(always)]
    fn flow_dst(flow: &Flow6) -> (&[u32; 4], u16) {
        (&flow.dst_addr, flow.dst_port)
    }
    #[inline(always)]
    fn counted(flow: &Flow6) -> (u32, u32, u32) {
        (flow.backend, flow.model, flow.counted_mem_mb)
    }
    #[inline(always)]
    fn flags(flow: &Flow6) -> u32 {
        flow.flags
    }
    #[inline(always)]
    fn last_seen(flow: &Flow6) -> u64 {
        flow.last_seen_ns
    }
    #[inline(always)]
    fn peer(flow: &Flow6) -> &FlowKey6 {
        &flow.peer
    }
    #[inline(always)]
    fn flags_ptr(entry: *mut Flow6) -> *mut u32 {
        // SAFETY: a field's address, no access.
        unsafe { ptr::addr_of_mut!((*entry).flags) }
    }
    #[inline(always)]
    fn last_seen_ptr(entry: *mut Flow6) -> *mut u64 {
        // SAFETY: a field's address, no access.
        unsafe { ptr::addr_of_mut!((*entry).last_seen_ns) }
    }
    #[inline(always)]
    fn get(key: &FlowKey6) -> Option<*mut Flow6> {
        AILB_FLOWS6.get_ptr_mut(key)
    }
    #[inline(always)]
    fn remove(key: &FlowKey6) -> bool {
        AILB_FLOWS6.remove(key).is_ok()
    }
    #[inline(always)]
    fn map_ptr() -> *mut core::ffi::c_void {
        ptr::addr_of!(AILB_FLOWS6).cast_mut().cast()
    }
    #[inline(always)]
    fn vip(pkt: &Packet6) -> Option<Service> {
        let service = AILB_SERVICES6.get_ptr(ServiceKey6 { addr: pkt.daddr, port: pkt.dport, _pad: 0 })?;
        // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
        Some(unsafe { ptr::read(service) })
    }
    #[inline(always)]
    fn replace_addr(ctx: &TcContext, tcp_csum: u32, side: Side, old: &[u32; 4], new: &[u32; 4]) -> Result<(), i64> {
        nat6::replace_addr6(ctx, tcp_csum, side, old, new)
    }
    #[inline(always)]
    fn fib_addrs(fib: &mut FibParams, src: &[u32; 4], dst: &[u32; 4]) {
        nat6::fib_addrs6(fib, src, dst)
    }
    #[inline(always)]
    fn hops(pkt: &Packet6) -> u8 {
        pkt.hop_limit
    }
    #[inline(always)]
    fn decrement_hops(ctx: &TcContext, pkt: &Packet6) -> Result<(), i64> {
        nat6::decrement_hop_limit(ctx, pkt.hop_limit)
    }
}

/// 64 bits of an IPv6 address for the hashes (the four words mixed, none dropped).
#[inline(always)]
fn addr_bits(a: &[u32; 4]) -> u64 {
    (((a[0] as u64) << 32) | a[1] as u64) ^ rehash(((a[2] as u64) << 32) | a[3] as u64)
}

/// A SYN to an IPv6 `service`: the pick among its IPv6 backends, the flow's entries, the
/// counts (the SYN is then rewritten as the flow's first packet, see [`OPENED`]). The entries are built in
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
    o.fk = V6::key_of(pkt, FLOW_FORWARD);
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
/// flow's first packet ([`crate::flows::on_forward`]). The rewrite and FIB lookup are not made in `open`'s
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
