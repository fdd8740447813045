//! `[policy]`: the constants of the weight formula, each with its default and the reason for it.
//! The formula itself is documented in [`super`] and in `docs/metadata.md`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::ConfigError;

/// `[policy]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Relative change of a backend's table share below which a model keeps its last table.
    /// Default 0.1: a 10 % share error is below what the load bound (c = 1.25) already lets
    /// a backend carry over its share, so a smaller change would rebuild tables for nothing.
    #[serde(default = "default_min_change")]
    pub min_weight_change: f64,
    /// GPU capability per `gpu_type`, matched case-insensitively after trimming; an unknown
    /// type counts 1.0. Default empty: a ranking of GPUs is fleet-specific (model, precision,
    /// interconnect), so ailb does not guess one.
    #[serde(default)]
    pub gpu_capability: BTreeMap<String, f64>,
    /// Whether the weights follow each backend's reported load (`current_requests`,
    /// `queue_length`) through the load factor below; when false the factor is 1. Default
    /// false: on the trace replay the weights following the agents' sampled load swapped the
    /// table about 330 times a minute (five of six swaps) and bought no latency within the runs'
    /// noise, while the kernel's load bound already balances on the live in-flight count of
    /// every connection, a sample ahead of any report.
    #[serde(default = "default_load_factor")]
    pub load_factor: bool,
    /// Requests per unit of GPU capability at which the load factor is 0.5:
    /// `load = 1 / (1 + L / (load_scale * gpu_capability))`. Default 1.0: for capability 1, the
    /// classic `1 / (1 + current_requests)`. Raise it for servers that batch many requests
    /// without slowing down (e.g. to vLLM's useful batch size).
    #[serde(default = "default_load_scale")]
    pub load_scale: f64,
    /// What one queued request counts in `L = current_requests + queue_weight * queue_length`.
    /// Default 2.0: a queue means the batch is full; a new request waits for the queued ones
    /// to be admitted, so a backend with spare slots must win over one with the same total
    /// and a queue.
    #[serde(default = "default_queue_weight")]
    pub queue_weight: f64,
    /// Smoothed GPU utilisation (%) above which a backend is down-weighted. Default 70: the
    /// top of the target band of 60-80 % utilisation.
    #[serde(default = "default_util_high")]
    pub util_high: f64,
    /// Smoothed GPU utilisation (%) below which a backend is up-weighted. Default 30: a GPU
    /// this idle has room for more (the under-used GPUs of a round-robin fleet sit there).
    #[serde(default = "default_util_low")]
    pub util_low: f64,
    /// Percentage points by which the smoothed utilisation must cross a threshold before the
    /// band changes. Default 5: a backend at 69/71/69/71 % never flips; one sample's noise on
    /// NVML's 1 s utilisation counter is a few points.
    #[serde(default = "default_util_hysteresis")]
    pub util_hysteresis: f64,
    /// EWMA weight of a new utilisation sample, (0, 1]; 1 = no smoothing. Default 0.3: a
    /// single spike from 50 % to 100 % lifts the average to 65 %, below `util_high +
    /// util_hysteresis`, so one spike alone never down-weights a backend; a lasting change
    /// reaches 97 % of its size after 10 samples.
    #[serde(default = "default_util_smoothing")]
    pub util_smoothing: f64,
    /// Factor above `util_high`. Default 0.5: overload costs latency for every request on
    /// that GPU (the P95 target), so the step down is larger than the step up.
    #[serde(default = "default_util_down")]
    pub util_down_factor: f64,
    /// Factor below `util_low`. Default 1.25: idleness only costs utilisation, and the
    /// utilisation lags the traffic the gateways send, so the step up is gentle.
    #[serde(default = "default_util_up")]
    pub util_up_factor: f64,
    /// With `daemon.cluster` set: the own cluster's load (`current_requests + queue_length`)
    /// against its capacity (`max_inflight`, else the model's `backend_capacity`) at which a
    /// model spills to the other clusters; a model may override it. Default 1.0: every request
    /// slot of the own cluster is taken, so a new request would queue there while another
    /// cluster has room.
    #[serde(default = "default_spill")]
    pub spill_saturation: f64,
    /// `daemon.cluster`, the gateway's own cluster (set by the config's validation; not a
    /// `[policy]` key). `None`: no preference.
    #[serde(skip)]
    pub own_cluster: Option<String>,
}

fn default_spill() -> f64 {
    1.0
}

fn default_min_change() -> f64 {
    0.1
}
fn default_load_factor() -> bool {
    false
}
fn default_load_scale() -> f64 {
    1.0
}
fn default_queue_weight() -> f64 {
    2.0
}
fn default_util_high() -> f64 {
    70.0
}
fn default_util_low() -> f64 {
    30.0
}
fn default_util_hysteresis() -> f64 {
    5.0
}
fn default_util_smoothing() -> f64 {
    0.3
}
fn default_util_down() -> f64 {
    0.5
}
fn default_util_up() -> f64 {
    1.25
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            min_weight_change: default_min_change(),
            gpu_capability: BTreeMap::new(),
            load_factor: default_load_factor(),
            load_scale: default_load_scale(),
            queue_weight: default_queue_weight(),
            util_high: default_util_high(),
            util_low: default_util_low(),
            util_hysteresis: default_util_hysteresis(),
            util_smoothing: default_util_smoothing(),
            util_down_factor: default_util_down(),
            util_up_factor: default_util_up(),
            spill_saturation: default_spill(),
            own_cluster: None,
        }
    }
}

/// Largest GPU capability: keeps the composed weight finite and the ratio between two GPUs
/// within what a table can show (a 100x GPU already takes 99 % of a two-backend table).
pub const MAX_GPU_CAPABILITY: f64 = 100.0;

fn check(field: &str, v: f64, ok: bool, reason: &str) -> Result<(), ConfigError> {
    if v.is_finite() && ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(format!("policy.{field}"), v, reason))
    }
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        check(
            "min_weight_change",
            c.min_weight_change,
            (0.0..1.0).contains(&c.min_weight_change),
            "must be in [0, 1)",
        )?;
        check(
            "load_scale",
            c.load_scale,
            (0.01..=1e6).contains(&c.load_scale),
            "must be in [0.01, 1e6] (requests at which the load factor is 0.5)",
        )?;
        check("queue_weight", c.queue_weight, (0.0..=100.0).contains(&c.queue_weight), "must be in [0, 100]")?;
        check("util_low", c.util_low, (0.0..=100.0).contains(&c.util_low), "must be a percentage, 0..=100")?;
        check("util_high", c.util_high, (0.0..=100.0).contains(&c.util_high), "must be a percentage, 0..=100")?;
        check("util_hysteresis", c.util_hysteresis, c.util_hysteresis >= 0.0, "must be >= 0 percentage points")?;
        check(
            "util_high",
            c.util_high,
            c.util_high - c.util_low > 2.0 * c.util_hysteresis,
            "util_high - util_low must exceed 2 * util_hysteresis, so that the bands do not overlap",
        )?;
        check(
            "util_hysteresis",
            c.util_hysteresis,
            c.util_low - c.util_hysteresis >= 0.0 && c.util_high + c.util_hysteresis <= 100.0,
            "util_low - util_hysteresis and util_high + util_hysteresis must stay within 0..=100 \
             (else a band can never be entered)",
        )?;
        check(
            "util_smoothing",
            c.util_smoothing,
            c.util_smoothing > 0.0 && c.util_smoothing <= 1.0,
            "must be in (0, 1] (1 = no smoothing)",
        )?;
        check(
            "util_down_factor",
            c.util_down_factor,
            (0.01..=1.0).contains(&c.util_down_factor),
            "must be in [0.01, 1] (it lowers a weight)",
        )?;
        check(
            "util_up_factor",
            c.util_up_factor,
            (1.0..=10.0).contains(&c.util_up_factor),
            "must be in [1, 10] (it raises a weight)",
        )?;
        check(
            "spill_saturation",
            c.spill_saturation,
            c.spill_saturation > 0.0 && c.spill_saturation <= 10.0,
            "must be in (0, 10] (load over capacity)",
        )?;
        let mut seen = BTreeMap::new();
        for (gpu, &v) in &c.gpu_capability {
            let field = format!("gpu_capability.\"{gpu}\"");
            check(&field, v, v > 0.0 && v <= MAX_GPU_CAPABILITY, "must be in (0, 100]")?;
            let key = normalize_gpu(gpu);
            if key.is_empty() {
                return Err(ConfigError::invalid("policy.gpu_capability", gpu, "GPU type names must not be empty"));
            }
            if let Some(other) = seen.insert(key, gpu) {
                return Err(ConfigError::invalid(
                    format!("policy.{field}"),
                    gpu,
                    format!("same GPU type as \"{other}\" (names match case-insensitively)"),
                ));
            }
        }
        Ok(())
    }

    /// The capability of `gpu_type` and whether the table knows it (unknown: 1.0).
    pub fn capability(&self, gpu_type: &str) -> Option<f64> {
        let want = normalize_gpu(gpu_type);
        self.gpu_capability.iter().find(|(k, _)| normalize_gpu(k) == want).map(|(_, &v)| v)
    }
}

fn normalize_gpu(s: &str) -> String {
    s.trim().to_lowercase()
}

#[cfg(test)]
mod tests;
