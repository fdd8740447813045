//! `ailb_tc_ingress6`, the IPv6 half of `ailb_tc_ingress`, which tail-calls it for IPv6
//! frames (`AILB_TC_PROGS`): a TCP SYN from a remote IPv6 client to an IPv6 VIP
//! (`AILB_SERVICES6`) opens a flow in `AILB_FLOWS6` ([`conntrack6`]) with the pick among the
//! model's IPv6 backends (no NAT64), and the flow's packets are rewritten both ways and
//! forwarded ([`nat6`]). A program of its own rather than a subprogram: the IPv6 open path
//! (40-byte keys, 104-byte entries, the pick) does not fit in the 512 bytes of BPF stack
//! under the IPv4 program's frame, and the verifier's instruction budget is per program, so
//! the IPv4 program is verified and runs as before (one more branch, for non-IPv4 frames
//! only). While the daemon has not filled `AILB_TC_PROGS` the tail call fails and IPv6
//! frames pass untouched. The parsed packet lives in a per-CPU slot ([`pkt6_scratch`]), so
//! that this program's own frame stays small under the open path's.
//!
//! Extension headers and fragments: the hop-by-hop, routing and destination-options headers
//! and the fragment header are walked (up to [`MAX_EXT_HEADERS`]) to find the ports; a packet
//! that carries any of them and matches a VIP or a flow is dropped and counted `malformed`,
//! never rewritten (a routing header's final destination is not the address in the fixed
//! header, and a fragment's ports are only in the first one). Later fragments (no ports),
//! other next headers (ESP, AH, no next header, UDP, ...) and packets too short to hold the
//! ports pass untouched, as in the IPv4 path; so does every IPv6 packet in masquerade mode
//! while no IPv6 NAT address is configured.

use aya_ebpf::{bindings::TC_ACT_OK, helpers::generated::bpf_ktime_get_ns, macros::classifier, programs::TcContext};

use ailb_common::abi::*;

use crate::{
    conntrack6,
    tc::{malformed, read, ETH_HLEN, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    tc_maps::{nat_addr6, pkt6_scratch, tc_config, AILB_TC_PROGS},
    IPPROTO_TCP,
};

pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
/// The IPv6 fixed header.
pub(crate) const IP6_HLEN: u32 = 40;
/// Extension headers walked before the TCP header is given up on (the packet then passes).
pub(crate) const MAX_EXT_HEADERS: u32 = 4;

const NEXTHDR_HOP: u8 = 0;
const NEXTHDR_ROUTING: u8 = 43;
const NEXTHDR_FRAGMENT: u8 = 44;
const NEXTHDR_DEST: u8 = 60;
/// Fragment header: the offset's bits (the low three are flags).
const IP6_FRAG_OFFSET: u16 = 0xfff8;

/// The fields of an IPv6 TCP packet the datapath uses; addresses (as `ServiceKey6::addr`) and
/// ports in network byte order, as in the packet.
#[derive(Clone, Copy)]
pub(crate) struct Packet6 {
    pub saddr: [u32; 4],
    pub daddr: [u32; 4],
    pub sport: u16,
    pub dport: u16,
    /// Offset of the TCP header.
    pub l4: u32,
    pub flags: u8,
    pub hop_limit: u8,
    /// IPv6 payload length, host order.
    pub payload_len: u16,
    /// The packet carries extension headers (a fragment header among them, or not).
    pub ext: bool,
    /// Lengths checked, no extension header ([`parse6`]).
    pub valid: bool,
}

/// An IPv6 frame goes to `ailb_tc_ingress6` (a tail call through `AILB_TC_PROGS`); while
/// the slot is empty the tail call fails and returns here, and the frame passes. A
/// subprogram of its own, called before the IPv4 parser: anywhere else, or inlined, the
/// call took 8 more bytes of the ingress program's frame, which with the IPv4 open path's
/// frame is at the 512-byte limit (160 + 320 + the member scan's 32).
#[inline(never)]
pub(crate) fn to_ingress6(ctx: &TcContext) -> i32 {
    // SAFETY: the context is this program's; the slot holds a sched_cls program or nothing.
    unsafe { AILB_TC_PROGS.tail_call(ctx, TC_PROG_IPV6) };
    // A successful tail call never comes back here: the called program's verdict is this
    // function's return value, which the ingress program returns. The compiler does not know
    // that, and would fold this function's result to the constant below in the caller
    // (every IPv6 verdict then read as `TC_ACT_OK`, drops included); `black_box` keeps the
    // returned value opaque.
    core::hint::black_box(TC_ACT_OK as i32)
}

/// Whether the frame is IPv6, from the skb's protocol (one context load, no packet access:
/// what an IPv4 packet pays for the IPv6 path).
#[inline(always)]
pub(crate) fn is_ipv6(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of this program's skb context.
    unsafe { (*ctx.skb.skb).protocol == ETH_P_IPV6.to_be() as u32 }
}

#[classifier]
pub fn ailb_tc_ingress6(ctx: TcContext) -> i32 {
    ingress6(&ctx)
}

/// An IPv6 frame: the same dispatch as the IPv4 one (a flow's packet, a reply, a SYN to a
/// VIP), on `AILB_FLOWS6` and `AILB_SERVICES6`.
#[inline(always)]
fn ingress6(ctx: &TcContext) -> i32 {
    let Some(cfg) = tc_config() else {
        return TC_ACT_OK as i32;
    };
    if cfg.mode == TC_MODE_MASQUERADE && nat_addr6() == [0; 4] {
        return TC_ACT_OK as i32;
    }
    let Some(pkt) = pkt6_scratch() else {
        return TC_ACT_OK as i32;
    };
    if parse6(ctx, pkt).is_none() {
        return TC_ACT_OK as i32;
    }
    let pkt: &Packet6 = pkt;
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(flow) = conntrack6::lookup(pkt, FLOW_FORWARD) {
        if !pkt.valid {
            return malformed();
        }
        let verdict = conntrack6::on_forward(ctx, pkt, flow, now);
        if verdict != conntrack6::REOPEN {
            return verdict;
        }
    }
    if let Some(flow) = conntrack6::lookup(pkt, FLOW_REPLY) {
        if !pkt.valid {
            return malformed();
        }
        return conntrack6::on_reply(ctx, pkt, flow, now);
    }
    if let Some(service) = conntrack6::vip(pkt) {
        if pkt.flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN {
            if !pkt.valid {
                return malformed();
            }
            let verdict = conntrack6::open(pkt, &service, &cfg, now);
            if verdict != conntrack6::OPENED {
                return verdict;
            }
            return match conntrack6::lookup(pkt, FLOW_FORWARD) {
                Some(flow) => conntrack6::on_forward(ctx, pkt, flow, now),
                // Removed meanwhile (an RST of the same flow on another CPU): it passes
                // untouched, as a packet of no flow.
                None => TC_ACT_OK as i32,
            };
        }
        if pkt.ext {
            return malformed();
        }
    }
    TC_ACT_OK as i32
}

/// Parses the frame into `pkt`: its IPv6 and TCP fields; `None` for anything else (not
/// version 6, a next header that is not TCP after the extension headers walked, a later
/// fragment, too short).
#[inline(always)]
fn parse6(ctx: &TcContext, pkt: &mut Packet6) -> Option<()> {
    let data = ctx.data();
    let end = ctx.data_end();
    let ip = data + ETH_HLEN as usize;
    if ip + IP6_HLEN as usize > end {
        return None;
    }
    // SAFETY (all reads of this block): inside `[ip, ip + 40)`, checked above.
    let (vtc, payload_len, mut next, hop_limit) = unsafe {
        for i in 0..4 {
            pkt.saddr[i] = read::<u32>(ip + 8 + 4 * i);
            pkt.daddr[i] = read::<u32>(ip + 24 + 4 * i);
        }
        (read::<u8>(ip), u16::from_be(read::<u16>(ip + 4)), read::<u8>(ip + 6), read::<u8>(ip + 7))
    };
    if vtc >> 4 != 6 {
        return None;
    }
    let mut l4 = ETH_HLEN + IP6_HLEN;
    let mut ext = false;
    let mut n = 0;
    while n < MAX_EXT_HEADERS {
        if next == IPPROTO_TCP as u8 {
            break;
        }
        // Extension headers through `bpf_skb_load_bytes`: their offsets vary, which the
        // verifier need not follow.
        let hdr = ctx.load::<[u8; 4]>(l4 as usize).ok()?;
        match next {
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST => l4 += (hdr[1] as u32 + 1) * 8,
            NEXTHDR_FRAGMENT => {
                if u16::from_be_bytes([hdr[2], hdr[3]]) & IP6_FRAG_OFFSET != 0 {
                    return None;
                }
                l4 += 8;
            }
            _ => return None,
        }
        ext = true;
        next = hdr[0];
        n += 1;
    }
    if next != IPPROTO_TCP as u8 {
        return None;
    }
    let (sport, dport, doff, flags) = if !ext {
        let tcp = data + l4 as usize;
        if tcp + 20 > end {
            return None;
        }
        // SAFETY: `tcp + 20 <= end`, checked above.
        unsafe { (read::<u16>(tcp), read::<u16>(tcp + 2), read::<u8>(tcp + 12), read::<u8>(tcp + 13)) }
    } else {
        let h = ctx.load::<[u8; 14]>(l4 as usize).ok()?;
        (u16::from_ne_bytes([h[0], h[1]]), u16::from_ne_bytes([h[2], h[3]]), h[12], h[13])
    };
    let doff = ((doff >> 4) as u32) * 4;
    let valid =
        !ext && doff >= 20 && payload_len as u32 >= doff && ETH_HLEN + IP6_HLEN + payload_len as u32 <= ctx.len();
    (pkt.sport, pkt.dport, pkt.l4, pkt.flags, pkt.valid) = (sport, dport, l4, flags, valid);
    (pkt.hop_limit, pkt.payload_len, pkt.ext) = (hop_limit, payload_len, ext);
    Some(())
}
