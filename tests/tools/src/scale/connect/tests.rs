use super::median_interval;

#[test]
fn the_median_interval_is_the_binomial_order_statistics() {
    // n = 15: P(B <= 3) = 0.0176 <= 0.025 < P(B <= 4) = 0.059, so the 4th smallest and
    // the 4th largest, with coverage 1 - 2 x 0.0176 = 0.9648.
    let xs: Vec<f64> = (1..=15).rev().map(f64::from).collect();
    let (lo, hi, cov) = median_interval(&xs, 0.95).unwrap();
    assert_eq!((lo, hi), (4.0, 12.0));
    assert!((cov - 0.96484375).abs() < 1e-9, "{cov}");
    // n = 7: P(B <= 0) = 0.0078, P(B <= 1) = 0.0625: the extremes.
    let (lo, hi, _) = median_interval(&[3.0, 1.0, 2.0, 7.0, 5.0, 6.0, 4.0], 0.95).unwrap();
    assert_eq!((lo, hi), (1.0, 7.0));
    // Five values cannot give 95 %: P(B <= 0) = 1/32 > 0.025.
    assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95), None);
}
