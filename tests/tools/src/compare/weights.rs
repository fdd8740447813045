//! How stable ailb's weights were during a run: the daemon's own `/metrics` (on
//! `daemon.listen`) sampled once a second, `ailb_backend_weight` per backend and
//! `ailb_table_rebuilds_total` (table swaps). A policy that reweights on every sample rebuilds
//! its table as often, and moves conversations whose slots change hands each time.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;

use serde::Serialize;

use crate::sim_gpus;

/// One sample: each backend's table weight and the table swaps so far.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightSample {
    pub weights: BTreeMap<String, f64>,
    pub rebuilds: f64,
}

/// Parses the daemon's Prometheus text.
pub fn parse(text: &str) -> WeightSample {
    let mut weights = BTreeMap::new();
    let mut rebuilds = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        if let Some(labels) = series.strip_prefix("ailb_backend_weight{") {
            if let Some(b) = label(labels, "backend") {
                weights.insert(b.to_string(), value);
            }
        } else if series.starts_with("ailb_table_rebuilds_total") {
            rebuilds += value;
        }
    }
    WeightSample { weights, rebuilds }
}

/// `name="value"` in a label list.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let at = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &labels[at..];
    Some(&rest[..rest.find('"')?])
}

/// The kernel's prefix-pick counters in the daemon's Prometheus text (`ailb_prefix_*`, summed
/// over the models; a counter's `_total` suffix dropped): `lookups`, `found`, `used`,
/// `overruled_load`, `overruled_memory`, `keys_sent`, `keys_found`, `keys_exact`, `map_lookups`,
/// `entries`.
pub fn parse_prefix(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let Some(rest) = series.strip_prefix("ailb_prefix_") else { continue };
        let name = rest.split('{').next().unwrap_or_default();
        *out.entry(name.strip_suffix("_total").unwrap_or(name).to_string()).or_insert(0.0) += value;
    }
    out
}

/// The prefix counters of the daemon at `addr` ([`parse_prefix`]), `None` when it does not answer.
pub fn prefix_counters(addr: SocketAddrV4) -> Option<BTreeMap<String, f64>> {
    match sim_gpus::http_get(addr, "/metrics")? {
        (200, body) => Some(parse_prefix(&body)),
        _ => None,
    }
}

/// One sample of the daemon at `addr`, `None` when it does not answer.
pub fn sample(addr: SocketAddrV4) -> Option<WeightSample> {
    match sim_gpus::http_get(addr, "/metrics")? {
        (200, body) => Some(parse(&body)),
        _ => None,
    }
}

/// What the report shows of a run's samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightStats {
    pub samples: usize,
    /// Table swaps between the first and the last sample.
    pub rebuilds: f64,
    pub rebuilds_per_min: f64,
    /// Per backend: how often its weight differed from the sample before, and the lowest and
    /// highest weight seen.
    pub backends: BTreeMap<String, BackendWeights>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendWeights {
    pub changes: usize,
    pub min: f64,
    pub max: f64,
}

impl WeightStats {
    /// The statistics of `samples` taken over `seconds`; `None` without two samples.
    pub fn of(samples: &[WeightSample], seconds: f64) -> Option<Self> {
        let (first, last) = (samples.first()?, samples.last()?);
        if samples.len() < 2 {
            return None;
        }
        let mut backends: BTreeMap<String, BackendWeights> = BTreeMap::new();
        for (i, s) in samples.iter().enumerate() {
            for (b, &w) in &s.weights {
                let e = backends.entry(b.clone()).or_insert(BackendWeights { changes: 0, min: w, max: w });
                e.min = e.min.min(w);
                e.max = e.max.max(w);
                if i > 0 && samples[i - 1].weights.get(b).is_some_and(|&prev| prev != w) {
                    e.changes += 1;
                }
            }
        }
        let rebuilds = (last.rebuilds - first.rebuilds).max(0.0);
        Some(Self {
            samples: samples.len(),
            rebuilds,
            rebuilds_per_min: if seconds > 0.0 { rebuilds * 60.0 / seconds } else { 0.0 },
            backends,
        })
    }

    /// Mean and largest weight changes per backend.
    pub fn changes(&self) -> (f64, usize) {
        let n = self.backends.len().max(1) as f64;
        let sum: usize = self.backends.values().map(|b| b.changes).sum();
        (sum as f64 / n, self.backends.values().map(|b| b.changes).max().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests;
