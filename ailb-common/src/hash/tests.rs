use super::*;

#[test]
fn ipv6_backend_keys_of_nearby_addresses_and_ports_differ() {
    // Addresses ..::1 to ..::256 of one /64 (the last word as user_ip6 holds it: the
    // bytes in network order read as a native u32), each on 32 ports around 9000.
    let mut keys = [0u64; 256 * 32];
    for i in 0..256u32 {
        let addr = [0xfd00_0a1bu32.to_be(), 2u32.to_be(), 0, (i + 1).to_be()];
        for p in 0..32u16 {
            keys[(i * 32 + p as u32) as usize] = backend_key6(&addr, (8990 + p).to_be(), 7);
        }
    }
    keys.sort_unstable();
    assert!(keys.windows(2).all(|w| w[0] != w[1]), "two addresses and ports share a key");
}

const GOLDEN_HELLO: u64 = 2797699151107936019;

/// Golden values: a change here changes every client's placement, so it must be deliberate.
#[test]
fn golden_hashes() {
    assert_eq!(conversation_hash(b""), fmix64(FNV_OFFSET));
    let a = conversation_hash(b"conversation-1");
    let b = conversation_hash(b"conversation-2");
    assert_ne!(a, b);
    assert_ne!(conversation_hash(b"a"), conversation_hash(b"a\0"));
    // Fixed so that a change of algorithm fails loudly (README prints this value too).
    assert_eq!(conversation_hash(b"hello"), GOLDEN_HELLO);
}

#[test]
fn incremental_equals_slice() {
    let mut h = ConversationHasher::new();
    for b in b"abc" {
        h.write_u8(*b);
    }
    assert_eq!(h.finish(3), conversation_hash(b"abc"));
}
