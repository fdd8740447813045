//! The factors of a backend's weight, as pure functions of the metadata, the config and
//! (for the GPU utilisation) what the policy remembers from earlier samples.

use serde::{Deserialize, Serialize};

use super::config::PolicyConfig;

/// Which utilisation band a backend is in; the band, not the raw utilisation, picks the factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
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

/// `L = current + queue_weight * queued`, `load = 1 / (1 + L / (load_scale * capability))`:
/// 1.0 when idle, 0.5 at `load_scale x capability` requests. Always in (0, 1].
///
/// The load counts against the GPU's capability because the capability already says that the
/// GPU carries that many times the requests: a GPU of capability 3 with 30 requests is as loaded
/// as one of capability 1 with 10. Counted against `load_scale` alone, the bigger GPU's factor
/// fell 3x faster and, at the loads the weights aim for, cancelled its capability (measured:
/// ailb in full sent the tail of the trace to the RTX 3090s, `docs/replay.md`).
pub(super) fn load_factor(current: f64, queued: f64, capability: f64, c: &PolicyConfig) -> f64 {
    let l = current.max(0.0) + c.queue_weight * queued.max(0.0);
    let scale = c.load_scale * if capability.is_finite() && capability > 0.0 { capability } else { 1.0 };
    let f = 1.0 / (1.0 + l / scale);
    if f.is_finite() && f > 0.0 {
        f
    } else {
        f64::MIN_POSITIVE
    }
}

#[cfg(test)]
mod tests;
