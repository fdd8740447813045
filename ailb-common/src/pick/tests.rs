use super::*;
use proptest::prelude::*;

#[test]
fn sat_mul_edges() {
    for &(a, b) in &[
        (0u64, 0u64),
        (0, u64::MAX),
        (1, u64::MAX),
        (2, u64::MAX / 2),
        (2, u64::MAX / 2 + 1),
        (1 << 32, 1 << 32),
        ((1 << 32) - 1, (1 << 32) - 1),
        ((1 << 32) - 1, (1 << 32) + 1),
        (u64::MAX, u64::MAX),
        (0xffff_ffff, 0x1_0000_0001),
        (0x1_0000_0000, 0xffff_ffff),
    ] {
        assert_eq!(sat_mul(a, b), a.saturating_mul(b), "{a} * {b}");
        assert_eq!(sat_mul(b, a), b.saturating_mul(a), "{b} * {a}");
    }
}

proptest! {
    #[test]
    fn sat_mul_is_saturating_mul(a in any::<u64>(), b in any::<u64>(), sa in 0u32..64, sb in 0u32..64) {
        let (a, b) = (a >> sa, b >> sb);
        prop_assert_eq!(sat_mul(a, b), a.saturating_mul(b));
    }
}
