use super::*;

#[test]
fn article_utilisation_examples() {
    let c = PolicyConfig::default();
    // 80 % lowers the weight, 40 % keeps it, 25 % raises it.
    assert!(UtilBand::initial(80.0, &c).factor(&c) < 1.0);
    assert_eq!(UtilBand::initial(40.0, &c).factor(&c), 1.0);
    assert!(UtilBand::initial(25.0, &c).factor(&c) > 1.0);
}

#[test]
fn hovering_at_a_threshold_does_not_flip_the_band() {
    let c = PolicyConfig::default();
    for start in [69.0, 71.0, 29.0, 31.0] {
        let first = UtilBand::initial(start, &c);
        let mut band = first;
        let mut ewma = None;
        for i in 0..100 {
            let sample = if i % 2 == 0 { start + 2.0 } else { start };
            let s = smooth(ewma, sample, c.util_smoothing);
            ewma = Some(s);
            band = band.next(s, &c);
            assert_eq!(band, first, "start {start}, sample {i} = {sample}, smoothed {s}");
        }
    }
}

#[test]
fn bands_change_past_the_margin() {
    let c = PolicyConfig::default();
    assert_eq!(UtilBand::Neutral.next(75.0, &c), UtilBand::Neutral);
    assert_eq!(UtilBand::Neutral.next(75.1, &c), UtilBand::High);
    assert_eq!(UtilBand::High.next(65.1, &c), UtilBand::High);
    assert_eq!(UtilBand::High.next(64.9, &c), UtilBand::Neutral);
    assert_eq!(UtilBand::High.next(10.0, &c), UtilBand::Low);
    assert_eq!(UtilBand::Low.next(35.1, &c), UtilBand::Neutral);
    assert_eq!(UtilBand::Low.next(34.9, &c), UtilBand::Low);
}

#[test]
fn one_spike_does_not_down_weight() {
    let c = PolicyConfig::default();
    let s = smooth(Some(50.0), 100.0, c.util_smoothing);
    assert_eq!(UtilBand::Neutral.next(s, &c), UtilBand::Neutral, "smoothed {s}");
}

#[test]
fn load_factor_examples() {
    let c = PolicyConfig::default();
    assert_eq!(load_factor(0.0, 0.0, 1.0, &c), 1.0);
    assert!(load_factor(2.0, 0.0, 1.0, &c) > load_factor(5.0, 0.0, 1.0, &c));
    assert_eq!(load_factor(2.0, 0.0, 1.0, &c), 1.0 / 3.0);
    // One queued request costs as much as two running ones.
    assert_eq!(load_factor(0.0, 1.0, 1.0, &c), load_factor(2.0, 0.0, 1.0, &c));
    let f = load_factor(1e6, 1e6, 1.0, &PolicyConfig { load_scale: 0.01, queue_weight: 100.0, ..c.clone() });
    assert!(f > 0.0 && f.is_finite());
    // A capability that is not a positive number counts as 1.
    for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        assert_eq!(load_factor(2.0, 0.0, bad, &c), 1.0 / 3.0);
    }
}

/// Loads in proportion to the capabilities keep the capability ratio of the weights: a
/// capability-3 GPU with 30 requests and a capability-1 GPU with 10 get the same factor, so
/// their composed weights stay 3 : 1. (Against `load_scale` alone they were 3/31 : 1/11, the
/// bigger GPU below the smaller one.)
#[test]
fn load_counts_against_capability() {
    let c = PolicyConfig::default();
    let big = 3.0 * load_factor(30.0, 0.0, 3.0, &c);
    let small = 1.0 * load_factor(10.0, 0.0, 1.0, &c);
    assert!((big / small - 3.0).abs() < 1e-12, "{big} : {small}");
    // More than its share still lowers the bigger GPU below its capability ratio.
    let over = 3.0 * load_factor(60.0, 0.0, 3.0, &c);
    assert!(over / small < 3.0);
}
