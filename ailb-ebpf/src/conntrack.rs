//! The IPv4 family of the TC path: its [`Family`] (packets, `AILB_FLOWS`, `AILB_SERVICES`,
//! the IPv4 rewrite steps) and its open path, a SYN to a VIP: the pick, the flow's three
//! entries ([`crate::flows`]), then the SYN rewritten and forwarded. The pick for a remote
//! client ([`pick_remote`]) and the refusal of a SYN are shared with the IPv6 open path.

use core::ptr;

use ailb_common::{
    abi::*,
    hash::{fmix64, rehash},
    pick::{pick_with_prefix, ClientFamily, Outcome, PickMaps, PickRequest, PickResult},
};
use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, TC_ACT_SHOT},
    programs::TcContext,
};

use crate::{
    connect4::{count_pick, AffinityEntry},
    family::{Family, Side},
    flows::{count_full, count_open, MAP_FULL},
    maps::{inflight_read, stats, turn_take, AILB_CONFIG, AILB_SERVICES},
    nat,
    packet::Packet,
    pick_maps::Maps,
    tc_maps::{model_state, nat_cursor, nat_cursor_advance, tc_model, tc_stats, AILB_FLOWS, NAT_CURSOR_V4},
};

/// The IPv4 family.
pub(crate) struct V4;

/// `BPF_NOEXIST`: an insert that refuses an existing key.
pub(crate) const BPF_NOEXIST_FLAG: u64 = aya_ebpf::bindings::BPF_NOEXIST as u64;

impl Family for V4 {
    type Addr = u32;
    type Pkt = Packet;
    type Key = FlowKey;
    type Flow = Flow;

    #[inline(always)]
    fn saddr(pkt: &Packet) -> &u32 {
        &pkt.saddr
    }
    #[inline(always)]
    fn daddr(pkt: &Packet) -> &u32 {
        &pkt.daddr
    }
    #[inline(always)]
    fn ports(pkt: &Packet) -> (u16, u16) {
        (pkt.sport, pkt.dport)
    }
    #[inline(always)]
    fn l4(pkt: &Packet) -> u32 {
        pkt.l4
    }
    #[inline(always)]
    fn tcp_flags(pkt: &Packet) -> u8 {
        pkt.flags
    }
    #[inline(always)]
    fn key_of(pkt: &Packet, kind: u32) -> FlowKey {
        FlowKey { src_addr: pkt.saddr, dst_addr: pkt.daddr, src_port: pkt.sport, dst_port: pkt.dport, kind }
    }
    #[inline(always)]
    fn kind(key: &FlowKey) -> u32 {
        key.kind
    }
    #[inline(always)]
    fn with_kind(key: &FlowKey, kind: u32) -> FlowKey {
        FlowKey { kind, ..*key }
    }
    #[inline(always)]
    fn flow_src(flow: &Flow) -> (&u32, u16) {
        (&flow.src_addr, flow.src_port)
    }
    #[inline(always)]
    fn flow_dst(flow: &Flow) -> (&u32, u16) {
        (&flow.dst_addr, flow.dst_port)
    }
    #[inline(always)]
    fn counted(flow: &Flow) -> (u32, u32, u32) {
        (flow.backend, flow.model, flow.counted_mem_mb)
    }
    #[inline(always)]
    fn flags(flow: &Flow) -> u32 {
        flow.flags
    }
    #[inline(always)]
    fn last_seen(flow: &Flow) -> u64 {
        flow.last_seen_ns
    }
    #[inline(always)]
    fn peer(flow: &Flow) -> &FlowKey {
        &flow.peer
    }
    #[inline(always)]
    fn flags_ptr(entry: *mut Flow) -> *mut u32 {
        // SAFETY: a field's address, no access.
        unsafe { ptr::addr_of_mut!((*entry).flags) }
    }
    #[inline(always)]
    fn last_seen_ptr(entry: *mut Flow) -> *mut u64 {
        // SAFETY: a field's address, no access.
        unsafe { ptr::addr_of_mut!((*entry).last_seen_ns) }
    }
    #[inline(always)]
    fn get(key: &FlowKey) -> Option<*mut Flow> {
        AILB_FLOWS.get_ptr_mut(key)
    }
    #[inline(always)]
    fn remove(key: &FlowKey) -> bool {
        AILB_FLOWS.remove(key).is_ok()
    }
    #[inline(always)]
    fn map_ptr() -> *mut core::ffi::c_void {
        ptr::addr_of!(AILB_FLOWS).cast_mut().cast()
    }
    #[inline(always)]
    fn vip(pkt: &Packet) -> Option<Service> {
        let key = ServiceKey { addr: pkt.daddr, port: pkt.dport, _pad: 0 };
        let service = AILB_SERVICES.get_ptr(key)?;
        // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
        Some(unsafe { ptr::read(service) })
    }
    #[inline(always)]
    fn replace_addr(ctx: &TcContext, tcp_csum: u32, side: Side, old: &u32, new: &u32) -> Result<(), i64> {
        nat::replace_addr4(ctx, tcp_csum, side, *old, *new)
    }
    #[inline(always)]
    fn fib_addrs(fib: &mut FibParams, src: &u32, dst: &u32) {
        nat::fib_addrs4(fib, *src, *dst)
    }
    #[inline(always)]
    fn hops(pkt: &Packet) -> u8 {
        pkt.ttl
    }
    #[inline(always)]
    fn decrement_hops(ctx: &TcContext, pkt: &Packet) -> Result<(), i64> {
        nat::decrement_ttl(ctx, pkt.ttl)
    }
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
/// Its own subprogram, as [`crate::flows::on_forward`].
#[inline(never)]
pub(crate) fn open(ctx: &TcContext, pkt: &Packet, service: &Service, cfg: &TcConfig, now: u64) -> i32 {
    let conn_hash =
        fmix64(((pkt.saddr as u64) << 32 | (pkt.sport as u64) << 16 | pkt.dport as u64) ^ rehash(pkt.daddr as u64));
    let client = Client { addr: pkt.saddr as u64, space: AFFINITY_SPACE_CLIENT, conn_hash };
    let (res, backend, model, tcm, entry) = match pick_remote(service, &client, ClientFamily::Ipv4, now) {
        Ok(p) => p,
        Err(verdict) => return verdict,
    };
    let fk = V4::key_of(pkt, FLOW_FORWARD);
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
    nat::rewrite_and_forward::<V4>(ctx, pkt, &forward)
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

/// Inserts the flow's reply entry and returns its key: routed, the backend answers the
/// client itself; masquerading, the backend answers the NAT address at a port of the range
/// that no other flow to this backend holds (the first of [`NAT_PROBES`] consecutive ports from
/// the shared cursor that a no-exist insert accepts, so two SYNs never share one). Written for
/// IPv4 only, not over [`Family`]: generic, with the key built by the caller, the open path's
/// frame grew from 320 to 456 bytes, past what the ingress program's 160 leave of the 512.
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
