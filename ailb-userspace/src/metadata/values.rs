//! What a node's sample says in the contract's terms, and when it is worth saying again: pure
//! functions, no I/O.
//!
//! [`Values`] are the dynamic readings of one sample ([`Values::derive`]); whether a new sample
//! differs enough from the last published one to be worth a write is [`super::publish::moved`].

use serde::Deserialize;

use crate::telemetry::NodeSample;

/// Where `remaining_memory_mb` came from, published as `memory_source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySource {
    /// NVML: the device's unallocated memory, summed over the instance's GPUs.
    Nvml,
    /// The model server's free KV cache x `kv_bytes_per_token`.
    KvCache,
    /// Mapped gauges (`[instances.metrics] memory_free`, or total - used).
    Metrics,
}

impl MemorySource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::KvCache => "kv_cache",
            Self::Metrics => "metrics",
        }
    }
}

/// The dynamic values published; `None` is "not known" (the key is left out).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Values {
    pub free_mb: Option<u64>,
    /// Set exactly when `free_mb` is.
    pub memory_source: Option<MemorySource>,
    pub total_mb: Option<u64>,
    pub util_pct: Option<f64>,
    pub running: Option<f64>,
    pub waiting: Option<f64>,
    pub kv_cache: Option<f64>,
    /// Share of prompt tokens the server's prefix cache served since the last sample, 0..=1.
    pub prefix_cache_hit_rate: Option<f64>,
    /// The KV cache's capacity, tokens.
    pub kv_capacity_tokens: Option<f64>,
    /// Prompt tokens per second the server was sent, smoothed.
    pub prompt_tokens_per_s: Option<f64>,
    pub healthy: bool,
    pub draining: bool,
    /// NVML's name of the first GPU (used when the config names no `gpu_type`).
    pub gpu_name: Option<String>,
}

fn finite_nonneg(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

/// Free KV-cache tokens as MiB, rounded down: whole tokens x bytes per token / 2^20.
pub fn kv_tokens_to_mb(tokens: f64, bytes_per_token: u64) -> Option<u64> {
    if !(tokens.is_finite() && tokens >= 0.0) {
        return None;
    }
    let bytes = (tokens.floor() as u128).checked_mul(u128::from(bytes_per_token))?;
    u64::try_from(bytes >> 20).ok()
}

impl Values {
    /// [`Self::derive`] without KV-cache memory.
    pub fn from_sample(s: &NodeSample, draining: bool) -> Self {
        Self::derive(s, None, draining)
    }

    /// Memory and utilisation from NVML when the sample has GPUs (memory summed over the
    /// instance's GPUs, utilisation averaged); else from the server's mapped gauges; else, with
    /// `kv_bytes_per_token`, memory is the server's free KV cache in MiB. Anything else: unknown.
    pub fn derive(s: &NodeSample, kv_bytes_per_token: Option<u64>, draining: bool) -> Self {
        let mb = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x.floor() as u64);
        let (free_mb, total_mb, util_pct, memory_source) = if s.gpus.is_empty() {
            let util = s.server.gpu_util_pct.filter(|u| (0.0..=100.0).contains(u));
            let total = mb(s.server.memory_total_mb);
            let kv = s.server.kv_free_tokens.zip(kv_bytes_per_token).and_then(|(t, b)| kv_tokens_to_mb(t, b));
            match (mb(s.server.memory_free_mb), kv) {
                (Some(free), _) => (Some(free), total, util, Some(MemorySource::Metrics)),
                (None, Some(free)) => (Some(free), total, util, Some(MemorySource::KvCache)),
                (None, None) => (None, total, util, None),
            }
        } else {
            let n = s.gpus.len() as f64;
            (
                Some(s.gpus.iter().map(|g| g.memory_free_mb).sum()),
                Some(s.gpus.iter().map(|g| g.memory_total_mb).sum()),
                Some(s.gpus.iter().map(|g| f64::from(g.util_pct.min(100))).sum::<f64>() / n),
                Some(MemorySource::Nvml),
            )
        };
        Self {
            free_mb,
            memory_source,
            total_mb,
            util_pct,
            running: finite_nonneg(s.server.running),
            waiting: finite_nonneg(s.server.waiting),
            kv_cache: finite_nonneg(s.server.kv_cache_usage).map(|k| k.min(1.0)),
            prefix_cache_hit_rate: finite_nonneg(s.server.prefix_cache_hit_rate).map(|k| k.min(1.0)),
            kv_capacity_tokens: finite_nonneg(s.server.kv_capacity_tokens),
            prompt_tokens_per_s: finite_nonneg(s.server.prompt_tokens_per_s),
            healthy: s.server.healthy,
            draining,
            gpu_name: s.gpus.first().map(|g| g.name.clone()).filter(|n| !n.trim().is_empty()),
        }
    }

    /// `healthy`, `unhealthy` or `draining`.
    pub fn health_status(&self) -> &'static str {
        match (self.draining, self.healthy) {
            (true, _) => "draining",
            (false, true) => "healthy",
            (false, false) => "unhealthy",
        }
    }

    /// Running plus waiting requests, when the server reported them.
    pub fn in_flight(&self) -> Option<f64> {
        match (self.running, self.waiting) {
            (None, None) => None,
            (r, w) => Some(r.unwrap_or(0.0) + w.unwrap_or(0.0)),
        }
    }
}

/// A publish happens when any dynamic value moved by at least its threshold since the last
/// publish (health, presence of a value and static fields: any change).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// Free GPU memory, MiB. Default 512.
    pub memory_mb: u64,
    /// GPU utilisation, percentage points. Default 5.
    pub util_pct: f64,
    /// Running or waiting requests. Default 1.
    pub requests: f64,
    /// KV-cache usage and prefix-cache hit rate, fraction 0..1. Default 0.05.
    pub kv_cache: f64,
    /// Prompt tokens per second and the KV cache's capacity: a share of the value last
    /// published, at least one token (they span orders of magnitude between fleets). Default 0.1.
    pub prompt_rate: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { memory_mb: 512, util_pct: 5.0, requests: 1.0, kv_cache: 0.05, prompt_rate: 0.1 }
    }
}
