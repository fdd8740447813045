//! The metadata map an instance publishes: its static fields and its latest [`Values`], in the
//! contract's keys and formats. The agent registers it in Nacos; the one-box daemon parses it
//! straight back ([`super::InstanceMetadata::parse`]).

use std::collections::BTreeMap;

use super::{
    format_gb, format_number, keys, signals,
    values::{Thresholds, Values},
};
use crate::telemetry::instance::ValidInstance;

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
        || signals::ALL.iter().any(|s| {
            let last = (s.read)(old);
            num(last, (s.read)(new), (s.threshold)(t, last.unwrap_or(0.0)))
        })
}

/// The agent's version, published as `agent_version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

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
    for s in signals::ALL {
        if let Some(x) = (s.read)(v) {
            put(s.key, format_number(x.clamp(s.range.lo, s.range.hi)));
        }
    }
    if let Some(kv) = &inst.kv_events {
        put(keys::KV_EVENTS_ENDPOINT, kv.endpoint.clone());
        if let Some(r) = &kv.replay {
            put(keys::KV_EVENTS_REPLAY, r.clone());
        }
        put(keys::KV_BLOCK_SIZE, kv.block_size.to_string());
    }
    put(keys::HEALTH_STATUS, v.health_status().to_string());
    put(keys::UPDATED_AT_MS, updated_at_ms.to_string());
    put(keys::AGENT_VERSION, AGENT_VERSION.to_string());
    m
}

#[cfg(test)]
mod tests;
