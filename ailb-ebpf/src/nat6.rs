//! The IPv6 steps of the rewrite ([`crate::nat`] does the rest for both families). IPv6 has no
//! header checksum: an address change reaches only the TCP checksum, through its pseudo-header,
//! as one difference of the 16 bytes (`bpf_csum_diff`) applied with `bpf_l4_csum_replace` and
//! the pseudo-header flag (so a checksum-offloaded packet gets the right partial sum). A segment
//! whose checksum was wrong stays wrong. The FIB lookup is AF_INET6; the hop limit is
//! decremented without a checksum.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_F_PSEUDO_HDR},
    helpers::generated::bpf_csum_diff,
    programs::TcContext,
};

use crate::{family::Side, packet::ETH_HLEN, AF_INET6};

const IP6_HOP_LIMIT: u32 = ETH_HLEN + 7;
const IP6_SADDR: u32 = ETH_HLEN + 8;
const IP6_DADDR: u32 = ETH_HLEN + 24;

/// An IPv6 address at the `side`'s offset: the TCP checksum through its pseudo-header, then
/// the bytes.
#[inline(always)]
pub(crate) fn replace_addr6(
    ctx: &TcContext,
    tcp_csum: u32,
    side: Side,
    old: &[u32; 4],
    new: &[u32; 4],
) -> Result<(), i64> {
    let at = if side == Side::Src { IP6_SADDR } else { IP6_DADDR };
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

/// The FIB lookup's family and addresses for a packet from `src` to `dst`.
#[inline(always)]
pub(crate) fn fib_addrs6(fib: &mut FibParams, src: &[u32; 4], dst: &[u32; 4]) {
    fib.family = AF_INET6 as u8;
    fib.__bindgen_anon_3.ipv6_src = *src;
    fib.__bindgen_anon_4.ipv6_dst = *dst;
}

/// The hop limit `hops` - 1, written (IPv6 has no header checksum).
#[inline(always)]
pub(crate) fn decrement_hop_limit(ctx: &TcContext, hops: u8) -> Result<(), i64> {
    ctx.store(IP6_HOP_LIMIT as usize, &(hops - 1), 0)
}
