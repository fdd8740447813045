//! Ethernet / IPv4 / TCP frames for the TC fixtures, and the checksums computed here from
//! the RFC 791 / 793 definitions (one's-complement sum of 16-bit words, the TCP one over the
//! pseudo-header), independently of the kernel's incremental updates that the program uses.

use std::net::Ipv4Addr;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_frame_has_right_checksums_and_a_flipped_byte_breaks_them() {
        let f = Frame::tcp((Ipv4Addr::new(10, 0, 0, 2), 40000), (Ipv4Addr::new(10, 0, 1, 1), 80), TCP_SYN).build();
        assert!(checksums_ok(&f));
        // The RFC 1071 example: words 0001 f203 f4f5 f6f7 sum to ddf2, complemented 220d.
        assert_eq!(ones_complement(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
        let mut bad = f.clone();
        bad[ETH_HLEN + 20 + 4] ^= 1;
        assert!(!checksums_ok(&bad));
    }
}
