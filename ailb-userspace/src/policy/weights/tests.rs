use super::*;

fn map(ws: &[u32]) -> BTreeMap<SocketAddr, u32> {
    ws.iter().enumerate().map(|(i, &w)| (SocketAddr::new([10, 0, 0, i as u8 + 1].into(), 80), w)).collect()
}

#[test]
fn whole_weights_pass_unchanged_others_scale_to_1000() {
    assert_eq!(quantise(&[1.0, 2.0, 5.0]), [1, 2, 5]);
    assert_eq!(quantise(&[65535.0]), [65535]);
    assert_eq!(quantise(&[1.0 / 6.0, 1.0 / 3.0]), [500, 1000]);
    assert_eq!(quantise(&[1.0, 2.5]), [400, 1000]);
    assert_eq!(quantise(&[65535.0 * 2.0, 1.0]), [1000, 1], "below 1/1000 of the largest: weight 1");
    assert_eq!(quantise(&[1e-14, 6.6e7]), [1, 1000]);
    assert_eq!(quantise(&[]), Vec::<u32>::new());
}

#[test]
fn min_change_compares_shares() {
    assert!(within_min_change(&map(&[1, 2, 3]), &map(&[333, 667, 1000]), 0.1));
    assert!(within_min_change(&map(&[1000, 1000]), &map(&[1000, 900]), 0.1), "shares .5/.5 -> .526/.474");
    assert!(!within_min_change(&map(&[1000, 1000]), &map(&[1000, 500]), 0.1));
    assert!(!within_min_change(&map(&[1000, 1000]), &map(&[1000, 1000, 1000]), 0.1), "new backend");
    assert!(!within_min_change(&map(&[]), &map(&[]), 0.1));
    assert!(!within_min_change(&map(&[5, 5]), &map(&[5, 6]), 0.0), "0: every change is emitted");
}
