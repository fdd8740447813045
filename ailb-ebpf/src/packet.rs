//! The packets the TC programs handle, parsed: the fields of an IPv4 ([`Packet`]) or IPv6
//! ([`Packet6`]) TCP segment that the flows and the rewrite use, with the checks that make a
//! packet `valid`. Below the programs (`tc.rs`, `tc6.rs`) and the flows and rewrites they
//! dispatch to (`conntrack*.rs`, `nat*.rs`): it uses none of them.

use aya_ebpf::programs::TcContext;

use crate::IPPROTO_TCP;

pub(crate) const ETH_HLEN: u32 = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
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

/// The IPv6 fixed header.
const IP6_HLEN: u32 = 40;
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

/// Whether the frame is IPv6, from the skb's protocol (one context load, no packet access:
/// what an IPv4 packet pays for the IPv6 path).
#[inline(always)]
pub(crate) fn is_ipv6(ctx: &TcContext) -> bool {
    // SAFETY: reading a field of this program's skb context.
    unsafe { (*ctx.skb.skb).protocol == ETH_P_IPV6.to_be() as u32 }
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
unsafe fn read<T: Copy>(at: usize) -> T {
    // SAFETY: per this function's contract.
    unsafe { core::ptr::read_unaligned(at as *const T) }
}

/// Parses the frame into `pkt`: its IPv6 and TCP fields; `None` for anything else (not
/// version 6, a next header that is not TCP after the extension headers walked, a later
/// fragment, too short).
#[inline(always)]
pub(crate) fn parse6(ctx: &TcContext, pkt: &mut Packet6) -> Option<()> {
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
