//! Reference programs for measuring the TC datapath's per-packet cost, never attached by the
//! daemon: `ailb-tc-bench` puts them in front of `ailb_tc_ingress` on the same tcx ingress
//! (each returns `TCX_NEXT`, so the chain goes on and the packet is untouched), where the
//! kernel's BPF statistics time each one on the same packets. Each adds one stage of the real
//! program's established-packet path to the one before:
//! * `ailb_tc_floor_pass`: nothing (the cost of running a program at all, statistics included);
//! * `ailb_tc_floor_lookup`: the parse (with the IPv4 header checksum) and the flow lookups of
//!   an established packet (forward key, then reply key);
//! * `ailb_tc_floor_fib`: and a FIB lookup of the matched flow's destination;
//! * `ailb_tc_floor_rewrite`: and the rewrite's checksum and store helpers, each writing back
//!   the value already there (the same calls as a rewrite, the packet left as it was).

use core::{mem, ptr};

use ailb_common::abi::{Flow, FlowKey, FLOW_FORWARD, FLOW_REPLY};
use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_F_PSEUDO_HDR},
    helpers::generated::bpf_fib_lookup,
    macros::classifier,
    programs::TcContext,
};

use crate::{
    nat::{TCP_CSUM, TCP_DPORT, TCP_SPORT},
    packet::{self, Packet, ETH_HLEN},
    tc_maps::AILB_FLOWS,
    AF_INET, IPPROTO_TCP,
};

/// `TCX_NEXT`: the next program of the tcx chain runs.
const TCX_NEXT: i32 = -1;
const IP_CSUM: usize = (ETH_HLEN + 10) as usize;
const IP_SADDR: usize = (ETH_HLEN + 12) as usize;
const IP_DADDR: usize = (ETH_HLEN + 16) as usize;

#[classifier]
pub fn ailb_tc_floor_pass(_ctx: TcContext) -> i32 {
    TCX_NEXT
}

#[classifier]
pub fn ailb_tc_floor_lookup(ctx: TcContext) -> i32 {
    let _ = flow_of(&ctx);
    TCX_NEXT
}

#[classifier]
pub fn ailb_tc_floor_fib(ctx: TcContext) -> i32 {
    if let Some((_, flow)) = flow_of(&ctx) {
        fib(&ctx, &flow);
    }
    TCX_NEXT
}

#[classifier]
pub fn ailb_tc_floor_rewrite(ctx: TcContext) -> i32 {
    if let Some((pkt, flow)) = flow_of(&ctx) {
        fib(&ctx, &flow);
        same_value_rewrite(&ctx, &pkt);
    }
    TCX_NEXT
}

/// The packet and its flow entry (a copy), looked up as `ailb_tc_ingress` does for an
/// established packet.
#[inline(always)]
fn flow_of(ctx: &TcContext) -> Option<(Packet, Flow)> {
    let pkt = packet::parse(ctx)?;
    let key =
        |kind| FlowKey { src_addr: pkt.saddr, dst_addr: pkt.daddr, src_port: pkt.sport, dst_port: pkt.dport, kind };
    let entry = AILB_FLOWS.get_ptr(key(FLOW_FORWARD)).or_else(|| AILB_FLOWS.get_ptr(key(FLOW_REPLY)))?;
    // SAFETY: a non-null hash map value pointer, valid for this run; copied at once.
    Some((pkt, unsafe { ptr::read(entry) }))
}

/// The FIB lookup `nat::forward` makes for `flow`'s rewritten packet; the answer is discarded.
#[inline(always)]
fn fib(ctx: &TcContext, flow: &Flow) {
    // SAFETY: all-zero is a valid `bpf_fib_lookup` (plain integers and unions of them).
    let mut fib: FibParams = unsafe { mem::zeroed() };
    fib.family = AF_INET as u8;
    fib.l4_protocol = IPPROTO_TCP as u8;
    fib.sport = flow.src_port;
    fib.dport = flow.dst_port;
    // `tot_len` stays 0, as in the real program (`nat.rs`, `forward`).
    // SAFETY: reading the context's ingress ifindex.
    fib.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    fib.__bindgen_anon_3.ipv4_src = flow.src_addr;
    fib.__bindgen_anon_4.ipv4_dst = flow.dst_addr;
    // SAFETY: `fib` is a valid, writable parameter block of the size passed; the context is
    // this program's skb.
    let _ =
        unsafe { bpf_fib_lookup(ctx.skb.skb.cast(), ptr::from_mut(&mut fib), mem::size_of::<FibParams>() as i32, 0) };
}

/// The helper calls of a masquerade rewrite (both addresses and both ports, as `nat::rewrite`
/// makes per changed field: TCP checksum, IPv4 checksum for an address, store), each
/// replacing a value by itself.
#[inline(always)]
fn same_value_rewrite(ctx: &TcContext, pkt: &Packet) {
    let csum = (pkt.l4 + TCP_CSUM) as usize;
    for (at, addr) in [(IP_SADDR, pkt.saddr), (IP_DADDR, pkt.daddr)] {
        let _ = ctx.l4_csum_replace(csum, addr as u64, addr as u64, (BPF_F_PSEUDO_HDR | 4) as u64);
        let _ = ctx.l3_csum_replace(IP_CSUM, addr as u64, addr as u64, 4);
        let _ = ctx.store(at, &addr, 0);
    }
    for (at, port) in [(TCP_SPORT, pkt.sport), (TCP_DPORT, pkt.dport)] {
        let _ = ctx.l4_csum_replace(csum, port as u64, port as u64, 2);
        let _ = ctx.store((pkt.l4 + at) as usize, &port, 0);
    }
}
