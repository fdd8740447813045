//! The factors of a backend's weight, as pure functions of the metadata, the config and
//! (for the GPU utilisation) what the policy remembers from earlier samples.

use serde::Serialize;

use super::config::PolicyConfig;

/// Which utilisation band a backend is in; the band, not the raw utilisation, picks the factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UtilBand {
    /// Below `util_low`: up-weighted.
    Low,
    #[default]
    Neutral,
    /// Above `util_high`: down-weighted.
    High,
}

impl UtilBand {
    /// The band of a first sample: plain thresholds (with no earlier band there is nothing
    /// to oscillate around).
    pub fn initial(util: f64, c: &PolicyConfig) -> Self {
        if util > c.util_high {
            UtilBand::High
        } else if util < c.util_low {
            UtilBand::Low
        } else {
            UtilBand::Neutral
        }
    }

    /// The next band: it changes only when `util` crosses a threshold by more than
    /// `util_hysteresis` (enter High above `high + h`, leave it below `high - h`; the same
    /// around `low`), so a utilisation that hovers at a threshold does not flip the factor.
    pub fn next(self, util: f64, c: &PolicyConfig) -> Self {
        let h = c.util_hysteresis;
        if util > c.util_high + h {
            return UtilBand::High;
        }
        if util < c.util_low - h {
            return UtilBand::Low;
        }
        match self {
            UtilBand::High if util < c.util_high - h => UtilBand::Neutral,
            UtilBand::Low if util > c.util_low + h => UtilBand::Neutral,
            band => band,
        }
    }

    pub fn factor(self, c: &PolicyConfig) -> f64 {
        match self {
            UtilBand::Low => c.util_up_factor,
            UtilBand::Neutral => 1.0,
            UtilBand::High => c.util_down_factor,
        }
    }
}

/// One EWMA step: `prev + alpha * (sample - prev)`; the first sample is taken as is.
pub(super) fn smooth(prev: Option<f64>, sample: f64, alpha: f64) -> f64 {
    match prev {
        Some(p) if p.is_finite() => p + alpha * (sample - p),
        _ => sample,
    }
}

/// `L = current + queue_weight * queued`, `load = 1 / (1 + L / load_scale)`: 1.0 when idle,
/// 0.5 at `load_scale` requests. Always in (0, 1].
pub(super) fn load_factor(current: f64, queued: f64, c: &PolicyConfig) -> f64 {
    let l = current.max(0.0) + c.queue_weight * queued.max(0.0);
    let f = 1.0 / (1.0 + l / c.load_scale);
    if f.is_finite() && f > 0.0 {
        f
    } else {
        f64::MIN_POSITIVE
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(load_factor(0.0, 0.0, &c), 1.0);
        assert!(load_factor(2.0, 0.0, &c) > load_factor(5.0, 0.0, &c));
        assert_eq!(load_factor(2.0, 0.0, &c), 1.0 / 3.0);
        // One queued request costs as much as two running ones.
        assert_eq!(load_factor(0.0, 1.0, &c), load_factor(2.0, 0.0, &c));
        let f = load_factor(1e6, 1e6, &PolicyConfig { load_scale: 0.01, queue_weight: 100.0, ..c });
        assert!(f > 0.0 && f.is_finite());
    }
}
