//! Ethernet / IPv4 / TCP frames and Ethernet / IPv6 / TCP frames for the TC fixtures, and
//! the checksums computed here from the RFC 791 / 793 / 8200 definitions (one's-complement
//! sum of 16-bit words, the TCP one over the pseudo-header), independently of the kernel's
//! incremental updates that the program uses.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_HLEN: usize = 14;
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// A frame to build: every field a test may want to make hostile.
#[derive(Clone, Debug)]
pub struct Frame {
    pub src: (Ipv4Addr, u16),
    pub dst: (Ipv4Addr, u16),
    pub flags: u8,
    pub ttl: u8,
    /// IPv4 options (a multiple of 4 bytes, at most 40).
    pub ip_options: Vec<u8>,
    pub payload: Vec<u8>,
    /// IPv4 flags and fragment offset (host order), e.g. 0x2000 for "more fragments".
    pub frag: u16,
    pub protocol: u8,
}

impl Frame {
    pub fn tcp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> Self {
        Self { src, dst, flags, ttl: 64, ip_options: Vec::new(), payload: Vec::new(), frag: 0, protocol: 6 }
    }

    /// The frame's bytes with correct checksums.
    pub fn build(&self) -> Vec<u8> {
        let ihl = 20 + self.ip_options.len();
        assert!(
            ihl <= 60 && self.ip_options.len().is_multiple_of(4),
            "IPv4 options: a multiple of 4 bytes, at most 40"
        );
        let tcp_len = 20 + self.payload.len();
        let tot_len = ihl + tcp_len;
        let mut f = vec![0u8; ETH_HLEN + tot_len];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[ETH_HLEN..];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&(tot_len as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6..8].copy_from_slice(&self.frag.to_be_bytes());
        ip[8] = self.ttl;
        ip[9] = self.protocol;
        ip[12..16].copy_from_slice(&self.src.0.octets());
        ip[16..20].copy_from_slice(&self.dst.0.octets());
        ip[20..ihl].copy_from_slice(&self.ip_options);
        let tcp = &mut ip[ihl..];
        tcp[0..2].copy_from_slice(&self.src.1.to_be_bytes());
        tcp[2..4].copy_from_slice(&self.dst.1.to_be_bytes());
        tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&(if self.flags & TCP_ACK != 0 { 2000u32 } else { 0 }).to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = self.flags;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
        tcp[20..].copy_from_slice(&self.payload);
        let csum = tcp_checksum(&f);
        f[ETH_HLEN + ihl + 16..ETH_HLEN + ihl + 18].copy_from_slice(&csum.to_be_bytes());
        let csum = ones_complement(&f[ETH_HLEN..ETH_HLEN + ihl]);
        f[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&csum.to_be_bytes());
        f
    }
}

/// The one's-complement of the one's-complement sum of `bytes` as big-endian 16-bit words
/// (an odd last byte padded with 0). Over a header whose checksum field is filled, 0 means
/// the checksum is right.
pub fn ones_complement(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in bytes.chunks(2) {
        let word =
            if chunk.len() == 2 { u16::from_be_bytes([chunk[0], chunk[1]]) } else { u16::from_be_bytes([chunk[0], 0]) };
        sum += word as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The TCP checksum of `frame` over its pseudo-header and segment (with the checksum field
/// as it is: 0 before building, and 0 from a frame whose checksum is right).
pub fn tcp_checksum(frame: &[u8]) -> u16 {
    let ip = &frame[ETH_HLEN..];
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let tot_len = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let segment = &ip[ihl..tot_len];
    let mut pseudo = Vec::with_capacity(12 + segment.len());
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, ip[9]]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(segment);
    ones_complement(&pseudo)
}

/// Both checksums of a frame are right.
pub fn checksums_ok(frame: &[u8]) -> bool {
    let ihl = ((frame[ETH_HLEN] & 0xf) as usize) * 4;
    ones_complement(&frame[ETH_HLEN..ETH_HLEN + ihl]) == 0 && tcp_checksum(frame) == 0
}

/// The addresses and ports of a frame: ((source, port), (destination, port)).
pub fn endpoints(frame: &[u8]) -> ((Ipv4Addr, u16), (Ipv4Addr, u16)) {
    let ip = &frame[ETH_HLEN..];
    let ihl = ((ip[0] & 0xf) as usize) * 4;
    let addr = |o: usize| Ipv4Addr::new(ip[o], ip[o + 1], ip[o + 2], ip[o + 3]);
    let port = |o: usize| u16::from_be_bytes([ip[ihl + o], ip[ihl + o + 1]]);
    ((addr(12), port(0)), (addr(16), port(2)))
}

/// An IPv6 extension header of a [`Frame6`], 8 bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext6 {
    /// Hop-by-hop options (one PadN option).
    HopByHop,
    /// Destination options (one PadN option).
    DestOpts,
    /// A routing header with no segments left.
    Routing,
    /// A fragment header: the offset in 8-byte units and the "more fragments" flag.
    Fragment { offset: u16, more: bool },
}

impl Ext6 {
    fn code(self) -> u8 {
        match self {
            Self::HopByHop => 0,
            Self::Routing => 43,
            Self::Fragment { .. } => 44,
            Self::DestOpts => 60,
        }
    }

    fn bytes(self, next: u8) -> [u8; 8] {
        match self {
            Self::HopByHop | Self::DestOpts => [next, 0, 1, 4, 0, 0, 0, 0],
            Self::Routing => [next, 0, 4, 0, 0, 0, 0, 0],
            Self::Fragment { offset, more } => {
                let o = (offset << 3) | u16::from(more);
                let [a, b] = o.to_be_bytes();
                [next, 0, a, b, 0, 0, 0x12, 0x34]
            }
        }
    }
}

/// An IPv6 TCP frame to build.
#[derive(Clone, Debug)]
pub struct Frame6 {
    pub src: (Ipv6Addr, u16),
    pub dst: (Ipv6Addr, u16),
    pub flags: u8,
    pub hop_limit: u8,
    /// Extension headers between the fixed header and TCP, in order.
    pub ext: Vec<Ext6>,
    pub payload: Vec<u8>,
}

pub const IP6_HLEN: usize = 40;

impl Frame6 {
    pub fn tcp(src: (Ipv6Addr, u16), dst: (Ipv6Addr, u16), flags: u8) -> Self {
        Self { src, dst, flags, hop_limit: 64, ext: Vec::new(), payload: Vec::new() }
    }

    /// The frame's bytes with a correct TCP checksum.
    pub fn build(&self) -> Vec<u8> {
        let ext_len = 8 * self.ext.len();
        let tcp_len = 20 + self.payload.len();
        let mut f = vec![0u8; ETH_HLEN + IP6_HLEN + ext_len + tcp_len];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        let ip = &mut f[ETH_HLEN..];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&((ext_len + tcp_len) as u16).to_be_bytes());
        ip[6] = self.ext.first().map_or(6, |e| e.code());
        ip[7] = self.hop_limit;
        ip[8..24].copy_from_slice(&self.src.0.octets());
        ip[24..40].copy_from_slice(&self.dst.0.octets());
        for (i, e) in self.ext.iter().enumerate() {
            let next = self.ext.get(i + 1).map_or(6, |n| n.code());
            ip[IP6_HLEN + 8 * i..IP6_HLEN + 8 * i + 8].copy_from_slice(&e.bytes(next));
        }
        let tcp = &mut ip[IP6_HLEN + ext_len..];
        tcp[0..2].copy_from_slice(&self.src.1.to_be_bytes());
        tcp[2..4].copy_from_slice(&self.dst.1.to_be_bytes());
        tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&(if self.flags & TCP_ACK != 0 { 2000u32 } else { 0 }).to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = self.flags;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
        tcp[20..].copy_from_slice(&self.payload);
        let csum = tcp6_checksum(&f);
        let at = ETH_HLEN + IP6_HLEN + ext_len + 16;
        f[at..at + 2].copy_from_slice(&csum.to_be_bytes());
        f
    }
}

/// The offset of the TCP header of an IPv6 frame built by [`Frame6`] (its 8-byte extension
/// headers walked).
fn tcp6_offset(frame: &[u8]) -> usize {
    let mut next = frame[ETH_HLEN + 6];
    let mut at = ETH_HLEN + IP6_HLEN;
    while next != 6 {
        next = frame[at];
        at += 8;
    }
    at
}

/// The TCP checksum of an IPv6 `frame` over its pseudo-header (RFC 8200 8.1: source,
/// destination, upper-layer length, next header 6) and segment; 0 when it is right.
pub fn tcp6_checksum(frame: &[u8]) -> u16 {
    let ip = &frame[ETH_HLEN..];
    let payload_len = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let at = tcp6_offset(frame);
    let segment = &frame[at..ETH_HLEN + IP6_HLEN + payload_len];
    let mut pseudo = Vec::with_capacity(40 + segment.len());
    pseudo.extend_from_slice(&ip[8..40]);
    pseudo.extend_from_slice(&(segment.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 6]);
    pseudo.extend_from_slice(segment);
    ones_complement(&pseudo)
}

/// The addresses and ports of an IPv6 frame: ((source, port), (destination, port)).
pub fn endpoints6(frame: &[u8]) -> ((Ipv6Addr, u16), (Ipv6Addr, u16)) {
    let ip = &frame[ETH_HLEN..];
    let addr = |o: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&ip[o..o + 16]).expect("16 bytes"));
    let tcp = tcp6_offset(frame);
    let port = |o: usize| u16::from_be_bytes([frame[tcp + o], frame[tcp + o + 1]]);
    ((addr(8), port(0)), (addr(24), port(2)))
}

#[cfg(test)]
mod tests;
