//! What differs between the IPv4 and IPv6 TC paths, as one trait: the packet, the flow key and
//! entry, the flow map, the VIP map, and the address-specific steps of the rewrite (an address
//! with its checksums, the FIB lookup's addresses, the hop count). The flows' lifecycle ([`crate::flows`]),
//! the rewrite ([`crate::nat`]) and the reclaim ([`crate::reclaim`]) are written once over it;
//! each family implements it beside its open path ([`crate::conntrack`] for IPv4,
//! [`crate::conntrack6`] for IPv6).
//!
//! Why the open paths (the pick, then the flow's three entries and its NAT port) stay one per
//! family: the IPv6 one builds its 40-byte keys and 104-byte entries in a per-CPU slot (they do
//! not fit the BPF stack next to the pick) and returns before the rewrite, while the IPv4 one
//! builds them on the stack and rewrites in the same frame. Written once over this trait, the
//! inserts took the IPv4 open's frame from 320 to 408-472 bytes (however the keys were passed),
//! past the 352 that the ingress program's 160 leave of the verifier's 512 for a call chain.
//!
//! Every method is `#[inline(always)]` in the implementations: the generic code compiles to what
//! each family's own code was, with the same subprograms (`#[inline(never)]` in the generic
//! callers), so the verifier sees the same programs.

use ailb_common::abi::Service;
use aya_ebpf::{bindings::bpf_fib_lookup as FibParams, programs::TcContext};

/// Which address of a packet a rewrite replaces.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Src,
    Dst,
}

/// One address family of the TC path (see the module's text).
pub(crate) trait Family: 'static {
    /// An address in network byte order (`u32`, or the 16 bytes as four words).
    type Addr: Copy + PartialEq;
    /// The parsed packet (`crate::packet::Packet` or `Packet6`).
    type Pkt;
    /// The flow map's key and entry (`FlowKey` / `Flow`, `FlowKey6` / `Flow6`).
    type Key: Copy;
    type Flow: Copy;

    // The packet.
    fn saddr(pkt: &Self::Pkt) -> &Self::Addr;
    fn daddr(pkt: &Self::Pkt) -> &Self::Addr;
    /// Source and destination ports, network byte order.
    fn ports(pkt: &Self::Pkt) -> (u16, u16);
    /// The TCP header's offset.
    fn l4(pkt: &Self::Pkt) -> u32;
    /// The TCP flags.
    fn tcp_flags(pkt: &Self::Pkt) -> u8;
    /// The key of `pkt` as it arrives, of `kind` (`FLOW_*`).
    fn key_of(pkt: &Self::Pkt, kind: u32) -> Self::Key;

    // The key and the entry.
    fn kind(key: &Self::Key) -> u32;
    fn with_kind(key: &Self::Key, kind: u32) -> Self::Key;
    fn flow_src(flow: &Self::Flow) -> (&Self::Addr, u16);
    fn flow_dst(flow: &Self::Flow) -> (&Self::Addr, u16);
    /// The entry's backend, model and the memory hint counted for it.
    fn counted(flow: &Self::Flow) -> (u32, u32, u32);
    /// `FLOW_FIN_*` seen.
    fn flags(flow: &Self::Flow) -> u32;
    fn last_seen(flow: &Self::Flow) -> u64;
    fn peer(flow: &Self::Flow) -> &Self::Key;
    /// The flags word and the last-seen time of the entry at `entry` (a map value).
    fn flags_ptr(entry: *mut Self::Flow) -> *mut u32;
    fn last_seen_ptr(entry: *mut Self::Flow) -> *mut u64;

    // The maps.
    fn get(key: &Self::Key) -> Option<*mut Self::Flow>;
    /// Whether an entry was there to remove.
    fn remove(key: &Self::Key) -> bool;
    /// The flow map's definition, for `bpf_for_each_map_elem`.
    fn map_ptr() -> *mut core::ffi::c_void;
    /// The VIP `pkt` is addressed to, if any (a copy).
    fn vip(pkt: &Self::Pkt) -> Option<Service>;

    // The rewrite's address-specific steps.
    /// Replaces the `side` address `old` with `new` in the packet, with the checksums it is
    /// part of (`tcp_csum`: the TCP checksum's offset).
    fn replace_addr(ctx: &TcContext, tcp_csum: u32, side: Side, old: &Self::Addr, new: &Self::Addr) -> Result<(), i64>;
    /// Fills the FIB lookup's family and addresses for a packet going from `src` to `dst`.
    fn fib_addrs(fib: &mut FibParams, src: &Self::Addr, dst: &Self::Addr);
    /// The packet's hop count (TTL or hop limit).
    fn hops(pkt: &Self::Pkt) -> u8;
    /// Writes the hop count decremented (with the IPv4 header checksum).
    fn decrement_hops(ctx: &TcContext, pkt: &Self::Pkt) -> Result<(), i64>;
}
