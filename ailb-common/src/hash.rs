//! The conversation hash: FNV-1a 64 over the bytes, then the murmur3 `fmix64` finaliser so
//! that nearby ids spread over the whole Maglev table. It is defined here once; the kernel
//! feeds it byte by byte from the `setsockopt` buffer, `ailb hash` from its argument, so
//! every client language gets the same hash without a library.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// murmur3's 64-bit finaliser: a bijection with full avalanche.
#[inline(always)]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Incremental form for the kernel, which reads one byte at a time.
#[derive(Clone, Copy, Debug)]
pub struct ConversationHasher {
    state: u64,
}

impl Default for ConversationHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ConversationHasher {
    #[inline(always)]
    pub const fn new() -> Self {
        Self { state: FNV_OFFSET }
    }
    #[inline(always)]
    pub fn write_u8(&mut self, b: u8) {
        self.state = (self.state ^ b as u64).wrapping_mul(FNV_PRIME);
    }
    /// The hash; `len` (the number of bytes written) is mixed in so that trailing zero
    /// bytes are not ignored.
    #[inline(always)]
    pub fn finish(&self, len: u64) -> u64 {
        fmix64(self.state ^ len.rotate_left(56))
    }
}

/// The hash of a conversation id (or a model name): what the kernel stores for these bytes.
pub fn conversation_hash(bytes: &[u8]) -> u64 {
    let mut h = ConversationHasher::new();
    for &b in bytes {
        h.write_u8(b);
    }
    h.finish(bytes.len() as u64)
}

/// Stable identity of a backend (address and port in network byte order) for table ordering.
pub fn backend_key(addr_be: u32, port_be: u16, seed: u64) -> u64 {
    fmix64(((addr_be as u64) << 16 | port_be as u64) ^ fmix64(seed))
}

/// [`backend_key`] of an IPv6 backend: its 16 address bytes as `bpf_sock_addr::user_ip6`
/// holds them (four `u32` words), and the port in network byte order. The port is mixed in
/// after the address, not XORed into its bits: a port XORed into the last word made
/// `[..::2]:9001` and `[..::3]:9000` one key (a model with both could not be built).
pub fn backend_key6(addr: &[u32; 4], port_be: u16, seed: u64) -> u64 {
    let hi = (addr[0] as u64) << 32 | addr[1] as u64;
    let lo = (addr[2] as u64) << 32 | addr[3] as u64;
    fmix64(rehash(fmix64(hi) ^ lo) ^ port_be as u64 ^ fmix64(seed))
}

/// A second, independent hash used for probe steps and Maglev skips.
#[inline(always)]
pub fn rehash(h: u64) -> u64 {
    fmix64(h ^ 0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests;
