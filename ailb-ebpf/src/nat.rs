//! The rewrite of a flow's packet, for both families ([`Family`]): addresses and ports, with
//! the checksums updated incrementally (`bpf_l3_csum_replace` / `bpf_l4_csum_replace`), so a
//! packet whose TCP checksum was wrong stays wrong and its receiver drops it; then its
//! forwarding: a FIB lookup for the new destination, then a redirect to the next hop's
//! interface with the TTL or hop limit decremented, or the gateway's own stack when the FIB
//! has no answer to redirect by. The IPv4 address and TTL steps are here; the IPv6 ones are
//! in [`crate::nat6`].

use core::{mem, ptr};

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_F_PSEUDO_HDR, TC_ACT_OK,
        TC_ACT_SHOT,
    },
    helpers::generated::{bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh},
    programs::TcContext,
};

use crate::{
    family::{Family, Side},
    packet::ETH_HLEN,
    tc_maps::tc_stats,
    AF_INET, IPPROTO_TCP,
};

const IP_CSUM: u32 = ETH_HLEN + 10;
const IP_TTL: u32 = ETH_HLEN + 8;
const IP_SADDR: u32 = ETH_HLEN + 12;
const IP_DADDR: u32 = ETH_HLEN + 16;
/// Offsets inside the TCP header.
pub(crate) const TCP_SPORT: u32 = 0;
pub(crate) const TCP_DPORT: u32 = 2;
pub(crate) const TCP_CSUM: u32 = 16;

/// Rewrites `pkt` to `flow`'s addresses and ports and forwards it. A helper failing midway
/// (it cannot on a packet `parse` accepted) drops the packet rather than pass it half-written.
#[inline(always)]
pub(crate) fn rewrite_and_forward<F: Family>(ctx: &TcContext, pkt: &F::Pkt, flow: &F::Flow) -> i32 {
    if rewrite::<F>(ctx, pkt, flow).is_err() {
        return TC_ACT_SHOT as i32;
    }
    forward::<F>(ctx, pkt, flow)
}

#[inline(always)]
fn rewrite<F: Family>(ctx: &TcContext, pkt: &F::Pkt, flow: &F::Flow) -> Result<(), i64> {
    let l4 = F::l4(pkt);
    let csum = l4 + TCP_CSUM;
    let (sport, dport) = F::ports(pkt);
    let (src, src_port) = F::flow_src(flow);
    let (dst, dst_port) = F::flow_dst(flow);
    if src != F::saddr(pkt) {
        F::replace_addr(ctx, csum, Side::Src, F::saddr(pkt), src)?;
    }
    if dst != F::daddr(pkt) {
        F::replace_addr(ctx, csum, Side::Dst, F::daddr(pkt), dst)?;
    }
    if src_port != sport {
        replace_port(ctx, csum, l4 + TCP_SPORT, sport, src_port)?;
    }
    if dst_port != dport {
        replace_port(ctx, csum, l4 + TCP_DPORT, dport, dst_port)?;
    }
    Ok(())
}

/// An IPv4 address at the `side`'s offset: both checksums (the TCP one through its
/// pseudo-header), then the bytes.
#[inline(always)]
pub(crate) fn replace_addr4(ctx: &TcContext, tcp_csum: u32, side: Side, old: u32, new: u32) -> Result<(), i64> {
    let at = if side == Side::Src { IP_SADDR } else { IP_DADDR };
    ctx.l4_csum_replace(tcp_csum as usize, old as u64, new as u64, (BPF_F_PSEUDO_HDR | 4) as u64)?;
    ctx.l3_csum_replace(IP_CSUM as usize, old as u64, new as u64, 4)?;
    ctx.store(at as usize, &new, 0)
}

/// The FIB lookup's family and addresses for an IPv4 packet from `src` to `dst`.
#[inline(always)]
pub(crate) fn fib_addrs4(fib: &mut FibParams, src: u32, dst: u32) {
    fib.family = AF_INET as u8;
    fib.__bindgen_anon_3.ipv4_src = src;
    fib.__bindgen_anon_4.ipv4_dst = dst;
}

/// A TCP port at `at`: the TCP checksum, then the bytes.
#[inline(always)]
fn replace_port(ctx: &TcContext, tcp_csum: u32, at: u32, old: u16, new: u16) -> Result<(), i64> {
    ctx.l4_csum_replace(tcp_csum as usize, old as u64, new as u64, 2)?;
    ctx.store(at as usize, &new, 0)
}

/// Sends the rewritten packet on: to the FIB's next hop (MACs from the FIB, or from the
/// neighbour table through `bpf_redirect_neigh`), else to the gateway's stack, which routes
/// it (a destination on the gateway itself, forwarding disabled, no route: the stack's rules).
#[inline(always)]
fn forward<F: Family>(ctx: &TcContext, pkt: &F::Pkt, flow: &F::Flow) -> i32 {
    // SAFETY: all-zero is a valid `bpf_fib_lookup` (plain integers and unions of them).
    let mut fib: FibParams = unsafe { mem::zeroed() };
    fib.l4_protocol = IPPROTO_TCP as u8;
    let (src, src_port) = F::flow_src(flow);
    let (dst, dst_port) = F::flow_dst(flow);
    fib.sport = src_port;
    fib.dport = dst_port;
    // `tot_len` stays 0, so the kernel checks the skb itself against the egress MTU
    // (`is_skb_forwardable`), which passes a GSO packet whose segments fit. A GSO packet's own
    // IP length is that of all its segments, past the MTU: given it, the lookup answers
    // "fragmentation needed" and the packet would go to the stack, which does not forward a
    // packet whose source is the gateway's NAT address.
    // SAFETY: reading the context's ingress ifindex.
    fib.ifindex = unsafe { (*ctx.skb.skb).ingress_ifindex };
    F::fib_addrs(&mut fib, src, dst);
    // SAFETY: `fib` is a valid, writable parameter block of the size passed; the context is
    // this program's skb.
    let rc =
        unsafe { bpf_fib_lookup(ctx.skb.skb.cast(), ptr::from_mut(&mut fib), mem::size_of::<FibParams>() as i32, 0) };
    send_by_fib(ctx, rc as u32, &fib, F::hops(pkt), || F::decrement_hops(ctx, pkt))
}

/// After the FIB lookup (`rc`, `fib`), for both families: to the stack without a usable answer
/// or with no hop left (`hops`: the TTL or hop limit), else the hop count decremented by
/// `decrement` and the packet redirected to the next hop; a failed write drops it.
#[inline(always)]
fn send_by_fib(
    ctx: &TcContext,
    rc: u32,
    fib: &FibParams,
    hops: u8,
    decrement: impl FnOnce() -> Result<(), i64>,
) -> i32 {
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || hops <= 1 {
        if let Some(s) = tc_stats() {
            s.to_stack += 1;
        }
        return TC_ACT_OK as i32;
    }
    if decrement().is_err() {
        return TC_ACT_SHOT as i32;
    }
    let verdict = if rc == BPF_FIB_LKUP_RET_SUCCESS {
        if ctx.store(0, &fib.dmac, 0).is_err() || ctx.store(6, &fib.smac, 0).is_err() {
            return TC_ACT_SHOT as i32;
        }
        // SAFETY: plain integer arguments.
        unsafe { bpf_redirect(fib.ifindex, 0) }
    } else {
        // SAFETY: no neighbour parameters (NULL, 0): the kernel resolves the next hop from
        // the packet's destination on that interface.
        unsafe { bpf_redirect_neigh(fib.ifindex, ptr::null_mut(), 0, 0) }
    };
    if let Some(s) = tc_stats() {
        s.redirected += 1;
    }
    verdict as i32
}

/// TTL - 1, with the IPv4 checksum. The helper takes the 16-bit word at 8 (TTL, protocol) as
/// it lies in memory; the protocol byte is the same before and after, so it is left 0.
#[inline(always)]
pub(crate) fn decrement_ttl(ctx: &TcContext, ttl: u8) -> Result<(), i64> {
    let new = ttl - 1;
    let (from, to) = (u16::from_ne_bytes([ttl, 0]), u16::from_ne_bytes([new, 0]));
    ctx.l3_csum_replace(IP_CSUM as usize, from as u64, to as u64, 2)?;
    ctx.store(IP_TTL as usize, &new, 0)
}
