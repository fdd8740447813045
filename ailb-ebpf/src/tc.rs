//! `sched_cls` on the ingress of the `[daemon] interfaces` (`ailb_tc_ingress`): a TCP SYN
//! from a remote client to a VIP runs the pick ([`conntrack::open`]), the flow's packets are
//! rewritten both ways ([`nat`]) and forwarded to the FIB's next hop; IPv6 frames go to
//! `ailb_tc_ingress6` ([`tc6`], a tail call), the same for IPv6 VIPs and flows. Everything that is not TCP to a VIP or of a
//! known flow passes untouched, as does what cannot be parsed
//! (the stack drops it); a packet that matches a VIP or a flow but is malformed (bad header
//! lengths, bad IPv4 checksum, a fragment) is dropped, never rewritten.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::generated::bpf_ktime_get_ns,
    macros::classifier,
    programs::TcContext,
};

use ailb_common::abi::*;

use crate::{
    conntrack, tc6,
    tc_maps::{tc_config, tc_stats},
    IPPROTO_TCP,
};

pub(crate) const ETH_HLEN: u32 = 14;
const ETH_P_IP: u16 = 0x0800;
/// The longest IPv4 header (with options).
const MAX_IP_HLEN: u32 = 60;
/// What the linear part must hold to parse a packet: Ethernet, the longest IPv4 header and a
/// TCP header without options.
const PARSE_LEN: u32 = ETH_HLEN + MAX_IP_HLEN + 20;

pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_ACK: u8 = 0x10;

const IP_MF: u16 = 0x2000;
const IP_OFFSET: u16 = 0x1fff;

/// The fields of an IPv4 TCP packet the datapath uses; addresses and ports in network byte
/// order, as in the packet.
#[derive(Clone, Copy)]
pub(crate) struct Packet {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    /// Offset of the TCP header.
    pub l4: u32,
    pub flags: u8,
    pub ttl: u8,
    /// The first fragment of a fragmented datagram.
    pub fragment: bool,
    /// Header lengths and checksum checked ([`valid`]).
    pub valid: bool,
}

#[classifier]
pub fn ailb_tc_ingress(ctx: TcContext) -> i32 {
    if tc6::is_ipv6(&ctx) {
        return tc6::to_ingress6(&ctx);
    }
    try_ingress(&ctx)
}

#[inline(always)]
fn try_ingress(ctx: &TcContext) -> i32 {
    let Some(pkt) = parse(ctx) else {
        return TC_ACT_OK as i32;
    };
    let Some(cfg) = tc_config() else {
        return TC_ACT_OK as i32;
    };
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let step = conntrack::seen_step(cfg.idle_timeout_ns);
    // Masquerading, a packet to the NAT address is a reply (a VIP on the NAT address at a port
    // of the NAT range would be the only forward key it could also match, and the forward
    // entry is looked up after it): one lookup instead of a miss on the forward key first.
    let reply_first = cfg.mode == TC_MODE_MASQUERADE && pkt.daddr == cfg.nat_addr;
    if reply_first {
        if let Some(flow) = conntrack::lookup(&pkt, FLOW_REPLY) {
            if !pkt.valid {
                return malformed();
            }
            return conntrack::on_reply(ctx, &pkt, flow, now, step);
        }
    }
    if let Some(flow) = conntrack::lookup(&pkt, FLOW_FORWARD) {
        if !pkt.valid {
            return malformed();
        }
        let verdict = conntrack::on_forward(ctx, &pkt, flow, now, step);
        if verdict != conntrack::REOPEN {
            return verdict;
        }
    }
    if !reply_first {
        if let Some(flow) = conntrack::lookup(&pkt, FLOW_REPLY) {
            if !pkt.valid {
                return malformed();
            }
            return conntrack::on_reply(ctx, &pkt, flow, now, step);
        }
    }
    if let Some(service) = conntrack::vip(&pkt) {
        if pkt.flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN {
            if !pkt.valid {
                return malformed();
            }
            return conntrack::open(ctx, &pkt, &service, &cfg, now);
        }
        if pkt.fragment {
            return malformed();
        }
    }
    TC_ACT_OK as i32
}

/// Counts a dropped malformed packet.
#[inline(always)]
pub(crate) fn malformed() -> i32 {
    if let Some(s) = tc_stats() {
        s.malformed += 1;
    }
    TC_ACT_SHOT as i32
}

/// The packet's IPv4 and TCP fields; `None` for anything else (not IPv4, not TCP, a later
/// fragment, too short to hold the ports).
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Option<Packet> {
    let len = ctx.len();
    if ctx.data_end() - ctx.data() < PARSE_LEN as usize && len > (ctx.data_end() - ctx.data()) as u32 {
        // A failed pull leaves the linear part as it was; the bounds checks below decide.
        let _ = ctx.pull_data(if len < PARSE_LEN { len } else { PARSE_LEN });
    }
    let data = ctx.data();
    let end = ctx.data_end();
    if data + (ETH_HLEN as usize) + 20 > end {
        return None;
    }
    // SAFETY (all reads below): each is inside [data, end), checked just before.
    let proto = u16::from_be(unsafe { read::<u16>(data + 12) });
    if proto != ETH_P_IP {
        return None;
    }
    let ip = data + ETH_HLEN as usize;
    // SAFETY: `ip + 20 <= end`, checked above.
    let (ver_ihl, tot_len, frag, ttl, l4proto, saddr, daddr) = unsafe {
        (
            read::<u8>(ip),
            u16::from_be(read::<u16>(ip + 2)),
            u16::from_be(read::<u16>(ip + 6)),
            read::<u8>(ip + 8),
            read::<u8>(ip + 9),
            read::<u32>(ip + 12),
            read::<u32>(ip + 16),
        )
    };
    let ihl = ((ver_ihl & 0xf) as u32) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 || frag & IP_OFFSET != 0 || l4proto as u32 != IPPROTO_TCP {
        return None;
    }
    let l4 = ETH_HLEN + ihl;
    let tcp = data + l4 as usize;
    if tcp + 20 > end {
        return None;
    }
    // SAFETY: `tcp + 20 <= end`, checked above.
    let (sport, dport, doff, flags) =
        unsafe { (read::<u16>(tcp), read::<u16>(tcp + 2), read::<u8>(tcp + 12), read::<u8>(tcp + 13)) };
    let doff = ((doff >> 4) as u32) * 4;
    let fragment = frag & IP_MF != 0;
    let lengths_ok = doff >= 20 && (tot_len as u32) >= ihl + doff && ETH_HLEN + tot_len as u32 <= len;
    let valid = lengths_ok && !fragment && ip_checksum_ok(ctx, ip, ihl);
    Some(Packet { saddr, daddr, sport, dport, l4, flags, ttl, fragment, valid })
}

/// Whether the IPv4 header of `ihl` bytes at `ip` sums to 0xffff (its checksum is right).
/// The fixed 20 bytes are read in place (the caller checked `ip + 20 <= end`); options, rare,
/// through `bpf_skb_load_bytes`, whose offsets the verifier does not need to follow.
#[inline(always)]
fn ip_checksum_ok(ctx: &TcContext, ip: usize, ihl: u32) -> bool {
    let mut sum: u32 = 0;
    let mut i = 0usize;
    while i < 20 {
        // SAFETY: `i + 2 <= 20` and `ip + 20 <= end` (checked by the caller).
        sum += unsafe { read::<u16>(ip + i) } as u32;
        i += 2;
    }
    let mut j = 20u32;
    while j < MAX_IP_HLEN {
        if j >= ihl {
            break;
        }
        match ctx.load::<u16>((ETH_HLEN + j) as usize) {
            Ok(w) => sum += w as u32,
            Err(_) => return false,
        }
        j += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum == 0xffff
}

/// An unaligned read of a `T` at packet address `at`.
///
/// # Safety
/// `[at, at + size_of::<T>())` must be inside the packet's linear data, checked against
/// `data_end` by the caller.
#[inline(always)]
pub(crate) unsafe fn read<T: Copy>(at: usize) -> T {
    // SAFETY: per this function's contract.
    unsafe { core::ptr::read_unaligned(at as *const T) }
}
