use super::*;

#[test]
fn ids_are_positions_and_keys_are_the_contracts() {
    for (i, s) in ALL.iter().enumerate() {
        assert_eq!(s.id, i, "{}", s.key);
        assert!(keys::ALL.contains(&s.key), "{} is not a contract key", s.key);
        assert!(s.range.lo < s.range.hi, "{}", s.key);
    }
    let mut seen: Vec<&str> = ALL.iter().map(|s| s.key).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), COUNT, "a key twice");
}

#[test]
fn every_threshold_is_positive_by_default() {
    let t = Thresholds::default();
    for s in ALL {
        assert!((s.threshold)(&t, 1.0) > 0.0, "{}", s.key);
    }
}
