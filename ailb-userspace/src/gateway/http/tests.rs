use proptest::prelude::*;

use super::*;

fn valid_byte_by_byte(v: &[u8]) -> bool {
    v.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[test]
fn every_byte_at_every_place_of_a_word_is_judged_as_byte_by_byte() {
    for len in [1, 7, 8, 9, 16, 17] {
        for at in 0..len {
            for b in 0..=255u8 {
                let mut v = vec![b'a'; len];
                v[at] = b;
                assert_eq!(valid_value(&v), valid_byte_by_byte(&v), "byte {b:#04x} at {at} of {len}");
            }
        }
    }
}

proptest! {
    #[test]
    fn values_are_judged_as_byte_by_byte(v in proptest::collection::vec(
        prop_oneof![
            Just(0u8), Just(9), Just(0x1f), Just(0x20), Just(b'a'), Just(0x7e), Just(0x7f), Just(0x80), Just(0xff),
            any::<u8>(),
        ],
        0..40,
    )) {
        prop_assert_eq!(valid_value(&v), valid_byte_by_byte(&v));
    }
}
