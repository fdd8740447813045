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
    assert_eq!(size_of::<ModelState>(), 8 + 2 * 32 + 64 + 8);
    assert_eq!(size_of::<AffinityKey>(), 16);
    assert_eq!(size_of::<AffinityValue>(), 16);
    assert_eq!(size_of::<SockState>(), 40);
    assert_eq!(size_of::<GlobalConfig>(), 40);
    assert_eq!(size_of::<Stats>(), 12 * 8);
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
