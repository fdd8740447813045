//! What an instance publishes and when: pure functions, no I/O.
//!
//! [`Values`] are the dynamic readings of one sample; [`metadata`] turns them and the static
//! fields into the contract's string map (keys and formats from [`crate::metadata`],
//! docs/metadata.md); [`moved`] decides whether a new sample differs enough from the last
//! published one to be worth a Nacos write.

use std::collections::BTreeMap;

use super::config::{Thresholds, ValidInstance};
use crate::{
    metadata::{format_gb, format_number, keys},
    telemetry::{GpuSample, ServerSample},
};

/// The agent's version, published as `agent_version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// One sample of one instance: its GPUs (empty without NVML) and its model server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSample {
    pub gpus: Vec<GpuSample>,
    pub server: ServerSample,
}

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

/// Whether `new` must be published, given the last published `old` (`None`: nothing published
/// yet). Health, draining and a value appearing or disappearing always count; numbers count
/// when they moved by at least their threshold.
pub fn moved(old: Option<&Values>, new: &Values, t: &Thresholds) -> bool {
    let Some(old) = old else { return true };
    fn num(a: Option<f64>, b: Option<f64>, th: f64) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() >= th,
            (None, None) => false,
            _ => true,
        }
    }
    let mb = |v: Option<u64>| v.map(|x| x as f64);
    old.healthy != new.healthy
        || old.draining != new.draining
        || old.memory_source != new.memory_source
        || old.gpu_name != new.gpu_name
        || num(mb(old.free_mb), mb(new.free_mb), t.memory_mb as f64)
        || num(mb(old.total_mb), mb(new.total_mb), t.memory_mb as f64)
        || num(old.util_pct, new.util_pct, t.util_pct)
        || num(old.running, new.running, t.requests)
        || num(old.waiting, new.waiting, t.requests)
        || num(old.kv_cache, new.kv_cache, t.kv_cache)
}

/// The full metadata map of an instance (Nacos replaces the map on every registration).
pub fn metadata(inst: &ValidInstance, v: &Values, updated_at_ms: u64) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let mut put = |k: &str, val: String| {
        m.insert(k.to_string(), val);
    };
    put(keys::MODEL_ID, inst.model_id.clone());
    if let Some(mv) = &inst.model_version {
        put(keys::MODEL_VERSION, mv.clone());
    }
    if let Some(g) = inst.gpu_type.clone().or_else(|| v.gpu_name.clone()) {
        put(keys::GPU_TYPE, g);
    }
    if let Some(cap) = inst.max_inflight {
        put(keys::MAX_INFLIGHT, cap.to_string());
    }
    if !inst.supported_tasks.is_empty() {
        put(keys::SUPPORTED_TASKS, inst.supported_tasks.join(","));
    }
    if let Some(free) = v.free_mb {
        put(keys::REMAINING_MEMORY_MB, free.to_string());
        put(keys::REMAINING_MEMORY, format_gb(free));
        if let Some(src) = v.memory_source {
            put(keys::MEMORY_SOURCE, src.label().to_string());
        }
    }
    if let Some(total) = v.total_mb {
        put(keys::GPU_MEMORY_TOTAL_MB, total.to_string());
    }
    if let Some(u) = v.util_pct {
        put(keys::GPU_UTIL, format_number(u.clamp(0.0, 100.0)));
    }
    if let Some(r) = v.running {
        put(keys::CURRENT_REQUESTS, format_number(r.min(1e6)));
    }
    if let Some(w) = v.waiting {
        put(keys::QUEUE_LENGTH, format_number(w.min(1e6)));
    }
    if let Some(k) = v.kv_cache {
        put(keys::KV_CACHE_USAGE, format_number(k));
    }
    put(keys::HEALTH_STATUS, v.health_status().to_string());
    put(keys::UPDATED_AT_MS, updated_at_ms.to_string());
    put(keys::AGENT_VERSION, AGENT_VERSION.to_string());
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::config::{ServerKind, ValidInstance};

    fn inst() -> ValidInstance {
        ValidInstance {
            service: "m".into(),
            ip: "10.0.0.7".parse().unwrap(),
            port: 8000,
            cluster: "DEFAULT".into(),
            weight: 1.0,
            model_id: "m".into(),
            model_version: Some("v1".into()),
            gpu_type: None,
            max_inflight: None,
            supported_tasks: vec!["chat".into(), "embed".into()],
            gpus: vec![],
            metrics_url: "http://127.0.0.1:1/metrics".parse().unwrap(),
            health_url: Some("http://127.0.0.1:1/health".parse().unwrap()),
            server: ServerKind::Vllm,
            nvml: true,
            names: crate::telemetry::model_server::ServerKind::Vllm.names(),
            kv_bytes_per_token: None,
        }
    }

    fn gpu(free: u64, util: u32) -> GpuSample {
        GpuSample {
            index: 0,
            name: "NVIDIA H100".into(),
            uuid: "GPU-1".into(),
            memory_total_mb: 81920,
            memory_free_mb: free,
            memory_used_mb: 81920 - free,
            util_pct: util,
        }
    }

    fn sample(free: u64, util: u32, running: f64) -> NodeSample {
        NodeSample {
            gpus: vec![gpu(free, util)],
            server: ServerSample {
                running: Some(running),
                waiting: Some(0.0),
                kv_cache_usage: Some(0.25),
                healthy: true,
                ..Default::default()
            },
        }
    }

    #[test]
    fn metadata_uses_the_contract_keys_and_units() {
        let v = Values::from_sample(&sample(12800, 40, 3.0), false);
        let m = metadata(&inst(), &v, 1234);
        let get = |k: &str| m.get(k).map(String::as_str);
        assert_eq!(get("model_id"), Some("m"));
        assert_eq!(get("model_version"), Some("v1"));
        assert_eq!(get("gpu_type"), Some("NVIDIA H100"));
        assert_eq!(get("supported_tasks"), Some("chat,embed"));
        assert_eq!(get("remaining_memory_mb"), Some("12800"));
        assert_eq!(get("remaining_memory"), Some("12.5"));
        assert_eq!(get("memory_source"), Some("nvml"));
        assert_eq!(get("gpu_memory_total_mb"), Some("81920"));
        assert_eq!(get("gpu_util"), Some("40"));
        assert_eq!(get("current_requests"), Some("3"));
        assert_eq!(get("queue_length"), Some("0"));
        assert_eq!(get("kv_cache_usage"), Some("0.25"));
        assert_eq!(get("health_status"), Some("healthy"));
        assert_eq!(get("updated_at_ms"), Some("1234"));
        assert_eq!(get("agent_version"), Some(AGENT_VERSION));
        assert_eq!(get("max_inflight"), None, "no cap declared");
        let capped = ValidInstance { max_inflight: Some(16), ..inst() };
        assert_eq!(metadata(&capped, &v, 1234).get("max_inflight").map(String::as_str), Some("16"));
    }

    #[test]
    fn without_gpus_memory_and_util_are_left_out() {
        let s = NodeSample { gpus: vec![], server: ServerSample { healthy: false, ..Default::default() } };
        let m = metadata(&inst(), &Values::from_sample(&s, false), 1);
        assert!(!m.contains_key("remaining_memory") && !m.contains_key("gpu_util") && !m.contains_key("gpu_type"));
        assert!(!m.contains_key("memory_source"));
        assert_eq!(m["health_status"], "unhealthy");
        assert_eq!(metadata(&inst(), &Values::from_sample(&s, true), 1)["health_status"], "draining");
    }

    #[test]
    fn only_moves_past_a_threshold_publish() {
        let t = Thresholds::default();
        let a = Values::from_sample(&sample(20000, 40, 3.0), false);
        assert!(moved(None, &a, &t));
        assert!(!moved(Some(&a), &a, &t));
        assert!(!moved(Some(&a), &Values::from_sample(&sample(20000 - 511, 44, 3.0), false), &t));
        assert!(moved(Some(&a), &Values::from_sample(&sample(20000 - 512, 40, 3.0), false), &t));
        assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 45, 3.0), false), &t));
        assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 40, 4.0), false), &t));
        assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 40, 3.0), true), &t));
        let mut dead = sample(20000, 40, 3.0);
        dead.server.healthy = false;
        assert!(moved(Some(&a), &Values::from_sample(&dead, false), &t));
        let mut gone = sample(20000, 40, 3.0);
        gone.server.running = None;
        assert!(moved(Some(&a), &Values::from_sample(&gone, false), &t));
    }

    #[test]
    fn slow_drift_is_measured_against_the_last_publish() {
        // Each step is below the threshold, but they add up against the last published value.
        let t = Thresholds::default();
        let last = Values::from_sample(&sample(20000, 40, 3.0), false);
        let mut published = 0;
        let mut last_pub = last;
        for step in 1..=10u32 {
            let v = Values::from_sample(&sample(20000, 40 + step, 3.0), false);
            if moved(Some(&last_pub), &v, &t) {
                published += 1;
                last_pub = v;
            }
        }
        assert_eq!(published, 2, "40 -> 45 -> 50 with a 5-point threshold");
    }

    /// A vLLM-like sample without NVML: `kv_free` tokens free, no GPU gauges.
    fn kv_sample(kv_free: Option<f64>) -> NodeSample {
        NodeSample {
            gpus: vec![],
            server: ServerSample {
                running: Some(1.0),
                waiting: Some(0.0),
                kv_cache_usage: Some(0.25),
                healthy: true,
                kv_free_tokens: kv_free,
                ..Default::default()
            },
        }
    }

    #[test]
    fn free_kv_cache_becomes_memory_with_its_source() {
        // Llama 3 8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131072 B/token.
        let b = 32 * 8 * 128 * 2 * 2;
        assert_eq!(b, 131_072);
        // 4096 blocks x 16 tokens x (1 - 0.25) = 49152 tokens x 128 KiB = 6144 MiB.
        let v = Values::derive(&kv_sample(Some(49152.0)), Some(b), false);
        assert_eq!(
            (v.free_mb, v.memory_source, v.total_mb, v.util_pct),
            (Some(6144), Some(MemorySource::KvCache), None, None)
        );
        let m = metadata(&inst(), &v, 1);
        assert_eq!((m["remaining_memory_mb"].as_str(), m["remaining_memory"].as_str()), ("6144", "6.0"));
        assert_eq!(m["memory_source"], "kv_cache");
        assert!(!m.contains_key("gpu_util") && !m.contains_key("gpu_memory_total_mb"), "{m:?}");
        // Fractional tokens are rounded down before, MiB after: 31457.28 tokens -> 3932 MiB.
        assert_eq!(kv_tokens_to_mb(31457.28, b), Some(3932));
        assert_eq!(kv_tokens_to_mb(7.0, 1), Some(0));
        assert_eq!(kv_tokens_to_mb(f64::NAN, b), None);
        assert_eq!(kv_tokens_to_mb(-1.0, b), None);
        // No bytes per token, or no capacity: unknown, no source.
        let v = Values::derive(&kv_sample(Some(49152.0)), None, false);
        assert_eq!((v.free_mb, v.memory_source), (None, None));
        let v = Values::derive(&kv_sample(None), Some(b), false);
        assert_eq!((v.free_mb, v.memory_source), (None, None));
        assert!(!metadata(&inst(), &v, 1).contains_key("remaining_memory_mb"));
    }

    #[test]
    fn mapped_gauges_give_memory_and_util() {
        let mut s = kv_sample(None);
        s.server.memory_free_mb = Some(50000.9);
        s.server.memory_total_mb = Some(163840.0);
        s.server.gpu_util_pct = Some(45.0);
        let v = Values::derive(&s, None, false);
        assert_eq!((v.free_mb, v.total_mb, v.util_pct), (Some(50000), Some(163840), Some(45.0)));
        let m = metadata(&inst(), &v, 1);
        assert_eq!(m["remaining_memory"], "48.8");
        assert_eq!(m["memory_source"], "metrics");
        assert_eq!(m["gpu_util"], "45");
        // NVML wins when the sample has GPUs (the config allows only one source; this is the order).
        let mut with_gpu = s.clone();
        with_gpu.gpus = vec![gpu(1000, 10)];
        assert_eq!(Values::derive(&with_gpu, Some(1), false).memory_source, Some(MemorySource::Nvml));
        // Out-of-range utilisation is not published.
        s.server.gpu_util_pct = Some(250.0);
        assert_eq!(Values::derive(&s, None, false).util_pct, None);
    }

    #[test]
    fn derived_memory_and_util_move_by_their_thresholds() {
        let t = Thresholds::default();
        let b = 131_072;
        let kv = |tokens: f64| Values::derive(&kv_sample(Some(tokens)), Some(b), false);
        let a = kv(49152.0); // 6144 MiB
        assert!(!moved(Some(&a), &kv(49152.0 - 4088.0), &t), "6144 -> 5633 MiB: 511 MiB, below 512");
        assert!(moved(Some(&a), &kv(49152.0 - 4096.0), &t), "6144 -> 5632 MiB: 512 MiB");
        // Memory becoming unknown, or changing source, is published.
        assert!(moved(Some(&a), &Values::derive(&kv_sample(None), Some(b), false), &t));
        let mut m = kv_sample(None);
        m.server.memory_free_mb = Some(6144.0);
        assert!(moved(Some(&a), &Values::derive(&m, Some(b), false), &t), "same MiB, another source");
        // Mapped utilisation: 5 points.
        m.server.gpu_util_pct = Some(40.0);
        let u = Values::derive(&m, None, false);
        m.server.gpu_util_pct = Some(44.9);
        assert!(!moved(Some(&u), &Values::derive(&m, None, false), &t));
        m.server.gpu_util_pct = Some(45.0);
        assert!(moved(Some(&u), &Values::derive(&m, None, false), &t));
    }
}
