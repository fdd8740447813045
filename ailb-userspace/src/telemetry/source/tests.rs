use std::time::{Duration, Instant};

use super::{PrefixWindow, PromptRate};

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

#[test]
fn the_prompt_rate_is_smoothed_over_its_window() {
    let t0 = Instant::now();
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    let mut r = PromptRate::new(Duration::from_secs(30));
    assert_eq!(r.update(at(0.0), Some(1000.0)), None, "one sample is no rate");
    // 3,000 tokens in a second: the first rate is taken as it is.
    assert_eq!(r.update(at(1.0), Some(4000.0)), Some(3000.0));
    // Nothing for a second: it moves by 1 - exp(-1/30) of the way to 0.
    let want = 3000.0 * (-1.0f64 / 30.0).exp();
    let got = r.update(at(2.0), Some(4000.0)).expect("a rate");
    assert!((got - want).abs() < 1e-6, "{got} against {want}");
    // A restarted server's counter went back: a new interval, the rate kept.
    assert_eq!(r.update(at(3.0), Some(10.0)), Some(got));
    let after = r.update(at(4.0), Some(10.0 + 300.0)).expect("a rate");
    assert!(after < got && after > 300.0, "{after}");
    // The counter gone (or not a count): no rate until two samples again.
    assert_eq!(r.update(at(5.0), None), None);
    assert_eq!(r.update(at(6.0), Some(f64::NAN)), None);
    assert_eq!(r.update(at(7.0), Some(0.0)), None);
    assert_eq!(r.update(at(8.0), Some(500.0)), Some(500.0));
    // A shorter window follows the last interval more closely.
    let mut fast = PromptRate::new(Duration::from_millis(100));
    fast.update(at(0.0), Some(0.0));
    fast.update(at(1.0), Some(3000.0));
    let quiet = fast.update(at(2.0), Some(3000.0)).expect("a rate");
    assert!(quiet < 1.0, "{quiet}");
}
