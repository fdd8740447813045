use super::*;
use core::mem::size_of;

#[test]
fn layouts_have_no_implicit_padding() {
    assert_eq!(size_of::<ServiceKey>(), 8);
    assert_eq!(size_of::<ServiceKey6>(), 20);
    assert_eq!(size_of::<BackendAddr6>(), 16);
    assert_eq!(size_of::<Service>(), 8);
    assert_eq!(size_of::<Backend>(), 32);
    assert_eq!(size_of::<TableSlot>(), 32);
    assert_eq!(size_of::<ModelState>(), 8 + 2 * 32 + 64 + 8 + 8);
    assert_eq!(size_of::<PrefixKey>(), 16);
    assert_eq!(size_of::<PrefixHolders>(), 64);
    assert_eq!(size_of::<SockPrefix>(), 8 + 16 * 8);
    assert_eq!(size_of::<PrefixStats>(), 10 * 8);
    assert_eq!(size_of::<FilterLine>(), 64);
    assert_eq!(size_of::<AffinityKey>(), 16);
    assert_eq!(size_of::<AffinityValue>(), 16);
    assert_eq!(size_of::<SockState>(), 40);
    assert_eq!(size_of::<GlobalConfig>(), 48);
    assert_eq!(size_of::<Stats>(), 13 * 8);
    assert_eq!(size_of::<BackendStats>(), 7 * 8);
    assert_eq!(size_of::<TableChunk>(), TABLE_CHUNK as usize * 4);
    assert_eq!(size_of::<MemberChunk>(), MEMBER_CHUNK as usize * 4);
}

#[test]
fn v4_mapped_addresses_round_trip() {
    // 127.0.0.1 in network order, and ::ffff:127.0.0.1 as the kernel's four words.
    let v4 = u32::from_ne_bytes([127, 0, 0, 1]);
    let mapped = v4_to_mapped(v4);
    let bytes: [u8; 16] = core::array::from_fn(|i| mapped[i / 4].to_ne_bytes()[i % 4]);
    assert_eq!(bytes, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1]);
    assert_eq!(v4_mapped(&mapped), Some(v4));
    assert_eq!(v4_mapped(&[0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]), None, "::1 is not mapped");
    assert_eq!(v4_mapped(&[0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xfe]), v4]), None);
}

#[test]
fn prefix_holders_record_refresh_and_age() {
    let mut h = PrefixHolders::EMPTY;
    assert!(h.is_empty());
    assert!(h.record(3, 100, 100, 10));
    assert!(!h.record(3, 100, 100, 10), "the same stamp changes nothing");
    assert!(h.record(3, 105, 105, 10), "a later stamp refreshes");
    assert_eq!(h.ids.iter().filter(|&&i| i == 3).count(), 1);
    assert!(h.fresh(0, 115, 10));
    assert!(!h.fresh(0, 116, 10), "older than the lifetime");
    assert!(h.fresh(0, 1_000_000, 0), "no lifetime: fresh until evicted");
    // Fill every slot; the next one takes slot (id + seen) % 8 = (99 + 130) % 8 = 5.
    for id in 10..17 {
        assert!(h.record(id, 100 + id, 120, 100));
    }
    assert!(h.record(99, 130, 130, 100));
    assert_eq!(h.ids[5], 99);
    assert_eq!(h.ids.iter().filter(|&&i| i != NO_BACKEND).count(), PREFIX_HOLDERS);
    // An expired slot is taken before any fresh one.
    h.seen[2] = 1;
    assert!(h.record(98, 131, 131, 100));
    assert_eq!(h.ids[2], 98);
    assert!(h.remove(99));
    assert!(!h.remove(99));
}

#[test]
fn exact_holders_are_not_aged_or_displaced_by_learnt_ones() {
    let mut h = PrefixHolders::EMPTY;
    for id in 0..PREFIX_HOLDERS as u32 {
        assert!(h.record(id, PREFIX_SEEN_EXACT, 5, 1));
    }
    assert!((0..PREFIX_HOLDERS).all(|i| h.fresh(i, u32::MAX - 1, 1)));
    assert!(!h.record(50, 7, 7, 1), "a learnt holder does not displace an exact one");
    assert!(!h.record(51, PREFIX_SEEN_EXACT, 7, 1), "a full exact entry keeps its holders");
    assert!(!h.record(2, 9, 9, 1), "a learnt stamp does not downgrade an exact holder");
    assert_eq!(h.seen[2], PREFIX_SEEN_EXACT);
}

#[test]
fn an_evicted_holder_is_stamped_and_stored_again_exact() {
    let mut h = PrefixHolders::EMPTY;
    assert!(h.record(4, PREFIX_SEEN_EXACT, 10, 60));
    assert!(h.record(5, 12, 12, 60), "a learnt holder beside it");
    assert!(h.exact(0) && !h.exact(1));
    assert!(h.evict(4, 20));
    assert!(!h.evict(4, 21), "evicted once");
    assert!(!h.evict(5, 21), "only an exact holder is evicted");
    assert!(!h.evict(9, 21), "not a holder");
    assert_eq!((h.ids[0], h.seen[0]), (4, 20));
    assert!(!h.exact(0));
    assert!(h.fresh(0, 80, 60) && !h.fresh(0, 81, 60), "counted for the lifetime");
    // Stored again: exact again, in its own slot.
    assert!(h.record(4, PREFIX_SEEN_EXACT, 30, 60));
    assert!(h.exact(0));
    // An evicted holder past the lifetime gives its slot to a block stored by another.
    assert!(h.evict(4, 30));
    for id in 10..16 {
        assert!(h.record(id, PREFIX_SEEN_EXACT, 31, 60));
    }
    assert!(h.record(77, PREFIX_SEEN_EXACT, 200, 60));
    assert_eq!(h.ids[0], 77, "{h:?}");
    // A stamp never reads as exact.
    let mut g = PrefixHolders::EMPTY;
    assert!(g.record(1, PREFIX_SEEN_EXACT, 0, 0));
    assert!(g.evict(1, PREFIX_SEEN_EXACT));
    assert!(!g.exact(0));
}

#[test]
fn prefix_ticks_round_up() {
    assert_eq!(prefix_ttl_ticks(0), 0);
    assert_eq!(prefix_ttl_ticks(1), 1);
    assert_eq!(prefix_ttl_ticks(1 << PREFIX_TICK_SHIFT), 1);
    assert_eq!(prefix_ttl_ticks((1 << PREFIX_TICK_SHIFT) + 1), 2);
    assert_eq!(prefix_tick(3 << PREFIX_TICK_SHIFT), 3);
    assert_eq!(prefix_ttl_ticks(60_000_000_000), 895, "a minute is 895 ticks of 67.1 ms");
}
