//! The rewrite of an IPv6 flow's packet and its forwarding, as [`crate::nat`] for IPv4. IPv6
//! has no header checksum: an address change reaches only the TCP checksum, through its
//! pseudo-header, as one difference of the 16 bytes (`bpf_csum_diff`) applied with
//! `bpf_l4_csum_replace` and the pseudo-header flag (so a checksum-offloaded packet gets the
//! right partial sum). A segment whose checksum was wrong stays wrong. The FIB lookup is
//! AF_INET6; the hop limit is decremented without a checksum.

use core::{mem, ptr};

use ailb_common::abi::Flow6;
use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_F_PSEUDO_HDR, TC_ACT_SHOT},
    helpers::generated::{bpf_csum_diff, bpf_fib_lookup},
    programs::TcContext,
};

use crate::{
    nat::{replace_port, send_by_fib, TCP_CSUM, TCP_DPORT, TCP_SPORT},
    packet::{Packet6, ETH_HLEN},
    AF_INET6, IPPROTO_TCP,
};

const IP6_HOP_LIMIT: u32 = ETH_HLEN + 7;
const IP6_SADDR: u32 = ETH_HLEN + 8;
const IP6_DADDR: u32 = ETH_HLEN + 24;

/// Rewrites `pkt` to `flow`'s addresses and ports and forwards it; a helper failing midway
/// drops the packet rather than pass it half-written.
#[inline(always)]
pub(crate) fn rewrite_and_forward(ctx: &TcContext, pkt: &Packet6, flow: &Flow6) -> i32 {
    if rewrite(ctx, pkt, flow).is_err() {
        return TC_ACT_SHOT as i32;
    }
    forward(ctx, pkt, flow)
}

#[inline(always)]
fn rewrite(ctx: &TcContext, pkt: &Packet6, flow: &Flow6) -> Result<(), i64> {
    let csum = pkt.l4 + TCP_CSUM;
    if flow.src_addr != pkt.saddr {
        replace_addr(ctx, csum, IP6_SADDR, &pkt.saddr, &flow.src_addr)?;
    }
    if flow.dst_addr != pkt.daddr {
        replace_addr(ctx, csum, IP6_DADDR, &pkt.daddr, &flow.dst_addr)?;
    }
    if flow.src_port != pkt.sport {
        replace_port(ctx, csum, pkt.l4 + TCP_SPORT, pkt.sport, flow.src_port)?;
    }
    if flow.dst_port != pkt.dport {
        replace_port(ctx, csum, pkt.l4 + TCP_DPORT, pkt.dport, flow.dst_port)?;
    }
    Ok(())
}

/// An IPv6 address at `at`: the TCP checksum through its pseudo-header, then the bytes.
#[inline(always)]
fn replace_addr(ctx: &TcContext, tcp_csum: u32, at: u32, old: &[u32; 4], new: &[u32; 4]) -> Result<(), i64> {
    // SAFETY: both point to 16 readable bytes (the sizes passed), on the stack or in a map
    // value; the helper only reads them (its pointers are read-only memory arguments).
    let diff = unsafe { bpf_csum_diff(old.as_ptr().cast_mut(), 16, new.as_ptr().cast_mut(), 16, 0) };
    if diff < 0 {
        return Err(diff);
    }
    // Size 0: `to` is a checksum difference to add.
    ctx.l4_csum_replace(tcp_csum as usize, 0, diff as u64, BPF_F_PSEUDO_HDR as u64)?;
    ctx.store(at as usize, new, 0)
}

/// Sends the rewritten packet on, as the IPv4 `forward`: the FIB's next hop (AF_INET6), or
/// the gateway's stack without a usable answer or with the hop limit spent.
#[inline(always)]
fn forward(ctx: &TcContext, pkt: &Packet6, flow: &Flow6) -> i32 {
    // SAFETY: all-zero is a valid `bpf_fib_lookup` (plain integers and unions of them).
    let mut fib: FibParams = unsafe { mem::zeroed() };
    fib.family = AF_INET6 as u8;
    fib.l4_protocol = IPPROTO_TCP as u8;
    fib.sport = flow.src_port;
    fib.dport = flow.dst_port;
    // `tot_len` stays 0, so the kernel checks the skb itself against the egress MTU
    // (`is_skb_forwardable`), which passes a GSO packet whose segments fit. A GSO packet's own
    // IP length is that of all its segments, past the MTU: given it, the lookup answers
    // "fragmentation needed" and the packet would go to the stack, which does not forward a
    // packet whose source is the gateway's NAT address.
    // SAFETY: reading the context's ingress ifindex.
    fib.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    fib.__bindgen_anon_3.ipv6_src = flow.src_addr;
    fib.__bindgen_anon_4.ipv6_dst = flow.dst_addr;
    // SAFETY: `fib` is a valid, writable parameter block of the size passed; the context is
    // this program's skb.
    let rc =
        unsafe { bpf_fib_lookup(ctx.skb.skb.cast(), ptr::from_mut(&mut fib), mem::size_of::<FibParams>() as i32, 0) };
    send_by_fib(ctx, rc as u32, &fib, pkt.hop_limit, || ctx.store(IP6_HOP_LIMIT as usize, &(pkt.hop_limit - 1), 0))
}
