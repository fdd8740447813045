use super::PrefixWindow;

#[test]
fn the_prefix_hit_rate_is_taken_over_the_window_between_scrapes() {
    let mut w = PrefixWindow::default();
    assert_eq!(w.update(None), None);
    // First scrape: the rate since the server started.
    assert_eq!(w.update(Some((2944.0, 6000.0))), Some(2944.0 / 6000.0));
    // 1,000 tokens looked up, 900 found: 0.9 for this window, whatever came before.
    assert_eq!(w.update(Some((3844.0, 7000.0))), Some(0.9));
    // Nothing looked up since: the last rate stands.
    assert_eq!(w.update(Some((3844.0, 7000.0))), Some(0.9));
    // The counters went back (a restart): the new counters as they are.
    assert_eq!(w.update(Some((10.0, 100.0))), Some(0.1));
    // No counters (the scrape lacked them): unknown, and the window starts again.
    assert_eq!(w.update(None), None);
    assert_eq!(w.update(Some((50.0, 100.0))), Some(0.5));
    assert_eq!(w.update(Some((f64::NAN, 100.0))), None);
}
