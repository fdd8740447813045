//! Load and health of a model server (vLLM, SGLang, or any server with Prometheus gauges).
//!
//! One `sample()` fetches the metrics and the health endpoint concurrently:
//! - health endpoint answers 2xx: healthy; any other status, refused, timed out: not healthy;
//! - metrics unreachable (refused, timed out before an answer): the sample says `healthy = false`
//!   with no load values, so the agent can publish the instance as unhealthy;
//! - `timed_out` says that no answer came in time (from either): slow or hung, not known down,
//!   which the agent counts towards its failure threshold instead of acting at once;
//! - metrics answer that is not 2xx, over [`MAX_BODY`], or not exposition text: an error, because
//!   a server that answers is up and the problem is the configuration or the server's metrics.
//!
//! Without a health URL, health is "the metrics endpoint answered 2xx".
//!
//! Asked for by [`MetricNames`], a scrape also derives the free KV cache in tokens
//! ([`KvCapacity`]: vLLM's `vllm:cache_config_info`, SGLang's `sglang:max_total_num_tokens`) and
//! GPU memory and utilisation from mapped gauges ([`GpuMetrics`], in their stated units). A value
//! that cannot be derived is `None`, with its reason in [`ServerSample::unknown`].

use std::time::Duration;

/// The URL type of [`ModelServerSource::new`] (reqwest's), re-exported for callers.
pub use reqwest::Url;
use reqwest::{Client, Response};

use super::{exposition, ServerSample, TelemetryError};

/// The largest metrics body read. vLLM's `/metrics` is tens of KiB (a few hundred histogram
/// buckets per model); 8 MiB leaves room for many models and LoRA adapters and still bounds the
/// agent's memory against a misconfigured URL (a file download).
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// Which metric names carry the load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerKind {
    /// `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
    /// (before vLLM 0.10: `vllm:gpu_cache_usage_perc`).
    Vllm,
    /// `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.
    Sglang,
    /// Any server: the gauges' names.
    Custom { running: String, waiting: String, kv_cache_usage: Option<String> },
}

/// vLLM's info gauge of its cache configuration (value 1); its labels carry `num_gpu_blocks` and
/// `block_size` (strings) once the engine is initialised.
pub const VLLM_CACHE_CONFIG: &str = "vllm:cache_config_info";
/// SGLang: the KV-cache pool's capacity in tokens ("Maximum total number of tokens in the KV
/// cache pool"), exported by newer versions.
pub const SGLANG_MAX_TOKENS: &str = "sglang:max_total_num_tokens";
/// SGLang: tokens in use in the pool.
pub const SGLANG_USED_TOKENS: &str = "sglang:num_used_tokens";

impl ServerKind {
    /// The kind's metric names, with no KV capacity and no GPU metrics.
    pub fn names(&self) -> MetricNames {
        let prefix_cache = match self {
            ServerKind::Vllm => {
                PrefixCache::Counters { hits: VLLM_PREFIX_HITS.to_string(), queries: VLLM_PREFIX_QUERIES.to_string() }
            }
            ServerKind::Sglang => PrefixCache::Gauge(SGLANG_CACHE_HIT_RATE.to_string()),
            ServerKind::Custom { .. } => PrefixCache::None,
        };
        let (running, waiting, kv): (&str, &str, Vec<&str>) = match self {
            ServerKind::Vllm => (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                vec!["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ),
            ServerKind::Sglang => ("sglang:num_running_reqs", "sglang:num_queue_reqs", vec!["sglang:token_usage"]),
            ServerKind::Custom { running, waiting, kv_cache_usage } => {
                (running, waiting, kv_cache_usage.iter().map(String::as_str).collect())
            }
        };
        MetricNames {
            running: running.to_string(),
            waiting: waiting.to_string(),
            kv_cache_usage: kv.into_iter().map(str::to_string).collect(),
            kv_capacity: KvCapacity::None,
            prefix_cache,
            gpu: None,
        }
    }
}

/// vLLM: prompt tokens found in the prefix cache, and prompt tokens looked up (counters).
pub const VLLM_PREFIX_HITS: &str = "vllm:prefix_cache_hits_total";
pub const VLLM_PREFIX_QUERIES: &str = "vllm:prefix_cache_queries_total";
/// SGLang: the prefix cache's hit rate (a gauge, 0..=1).
pub const SGLANG_CACHE_HIT_RATE: &str = "sglang:cache_hit_rate";

/// Where the prefix cache's hit rate is read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PrefixCache {
    /// Not read.
    #[default]
    None,
    /// Cumulative counters of hit and queried tokens (vLLM), summed over label sets: the rate is
    /// taken over the window between two scrapes ([`super::source::NodeSource`]).
    Counters { hits: String, queries: String },
    /// A gauge already in 0..=1 (SGLang), averaged over label sets.
    Gauge(String),
}

/// Where the free KV-cache capacity (in tokens) is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCapacity {
    /// Not read.
    #[default]
    None,
    /// vLLM: per engine, `num_gpu_blocks x block_size` of [`VLLM_CACHE_CONFIG`] times
    /// `1 - kv usage` (the first of [`MetricNames::kv_cache_usage`] present).
    VllmCacheConfig,
    /// SGLang: [`SGLANG_MAX_TOKENS`] minus [`SGLANG_USED_TOKENS`], per label set.
    SglangTokens,
}

/// The unit of a memory gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryUnit {
    Bytes,
    KiB,
    MiB,
    GiB,
}

impl MemoryUnit {
    /// `bytes`, `KiB`, `MiB` or `GiB` (exactly these spellings).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bytes" => Some(Self::Bytes),
            "KiB" => Some(Self::KiB),
            "MiB" => Some(Self::MiB),
            "GiB" => Some(Self::GiB),
            _ => None,
        }
    }

    pub fn to_mib(self, v: f64) -> f64 {
        match self {
            Self::Bytes => v / (1024.0 * 1024.0),
            Self::KiB => v / 1024.0,
            Self::MiB => v,
            Self::GiB => v * 1024.0,
        }
    }
}

/// The scale of a utilisation gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UtilUnit {
    /// 0..=100 (DCGM exporter `DCGM_FI_DEV_GPU_UTIL`).
    Percent,
    /// 0..=1 (Triton `nv_gpu_utilization`).
    Fraction,
}

impl UtilUnit {
    /// `percent` or `fraction`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "percent" => Some(Self::Percent),
            "fraction" => Some(Self::Fraction),
            _ => None,
        }
    }
}

/// GPU memory and utilisation read from gauges at the metrics URL (the server's own or an
/// exporter's), for nodes without NVML. Memory is summed over the selected samples (one per
/// GPU), utilisation averaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMetrics {
    pub memory_free: Option<String>,
    pub memory_total: Option<String>,
    /// Free = total - used when `memory_free` is not given.
    pub memory_used: Option<String>,
    pub memory_unit: MemoryUnit,
    pub util: Option<String>,
    pub util_unit: UtilUnit,
    /// Only samples whose label `name` has one of `values`, for every entry (e.g. the DCGM
    /// exporter's `gpu` index); empty: every sample.
    pub labels: Vec<(String, Vec<String>)>,
}

/// The names a scrape reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricNames {
    pub running: String,
    pub waiting: String,
    /// KV-cache usage 0..=1, in order of preference.
    pub kv_cache_usage: Vec<String>,
    pub kv_capacity: KvCapacity,
    pub prefix_cache: PrefixCache,
    pub gpu: Option<GpuMetrics>,
}

/// Scrapes one model server.
#[derive(Debug, Clone)]
pub struct ModelServerSource {
    client: Client,
    metrics_url: Url,
    health_url: Option<Url>,
    names: MetricNames,
}

impl ModelServerSource {
    /// `timeout` bounds each request, connect to last byte.
    pub fn new(
        metrics_url: Url,
        health_url: Option<Url>,
        kind: ServerKind,
        timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        Self::with_names(metrics_url, health_url, kind.names(), timeout)
    }

    /// [`Self::new`] with the names given in full (KV capacity, GPU gauges).
    pub fn with_names(
        metrics_url: Url,
        health_url: Option<Url>,
        names: MetricNames,
        timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        let client =
            Client::builder().timeout(timeout).connect_timeout(timeout).build().map_err(TelemetryError::Client)?;
        Ok(ModelServerSource { client, metrics_url, health_url, names })
    }

    pub fn metrics_url(&self) -> &Url {
        &self.metrics_url
    }

    pub fn health_url(&self) -> Option<&Url> {
        self.health_url.as_ref()
    }

    pub fn names(&self) -> &MetricNames {
        &self.names
    }

    /// Metrics and health now.
    pub async fn sample(&self) -> Result<ServerSample, TelemetryError> {
        let health = async {
            match &self.health_url {
                Some(url) => Some(self.healthy(url).await),
                None => None,
            }
        };
        let (metrics, health) = tokio::join!(self.scrape(), health);
        let samples = match metrics? {
            Ok(samples) => samples,
            Err(NoAnswer { timed_out }) => {
                let timed_out = timed_out || health.is_some_and(|h| h == Probe::TimedOut);
                return Ok(ServerSample { healthy: false, timed_out, ..ServerSample::default() });
            }
        };
        let mut s = read(&samples, &self.names, health.is_none_or(|h| h == Probe::Healthy));
        s.timed_out = health == Some(Probe::TimedOut);
        Ok(s)
    }

    async fn healthy(&self, url: &Url) -> Probe {
        match self.client.get(url.clone()).send().await {
            Ok(r) if r.status().is_success() => Probe::Healthy,
            Ok(r) => {
                tracing::debug!(url = %url, status = %r.status(), "health check answered not healthy");
                Probe::Failed
            }
            Err(e) => {
                tracing::debug!(url = %url, error = %crate::error_chain(&e), "health check failed");
                if e.is_timeout() {
                    Probe::TimedOut
                } else {
                    Probe::Failed
                }
            }
        }
    }

    /// `Ok(Err(_))`: the server did not answer.
    async fn scrape(&self) -> Result<Result<Vec<exposition::Sample>, NoAnswer>, TelemetryError> {
        let url = &self.metrics_url;
        let resp = match self.client.get(url.clone()).send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() || e.is_timeout() => {
                tracing::debug!(url = %url, error = %crate::error_chain(&e), "metrics endpoint unreachable");
                return Ok(Err(NoAnswer { timed_out: e.is_timeout() }));
            }
            Err(source) => return Err(TelemetryError::MetricsRequest { url: url.clone(), source }),
        };
        if !resp.status().is_success() {
            return Err(TelemetryError::MetricsStatus { url: url.clone(), status: resp.status() });
        }
        let body = read_bounded(resp, url).await?;
        let text = String::from_utf8_lossy(&body);
        exposition::parse(&text).map(Ok).map_err(|e| TelemetryError::MetricsParse {
            url: url.clone(),
            line: e.line,
            reason: e.reason,
        })
    }
}

/// What the health endpoint said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Healthy,
    /// An answer other than 2xx, or no connection.
    Failed,
    /// No answer within the timeout.
    TimedOut,
}

/// The metrics endpoint did not answer: refused, or (`timed_out`) not within the timeout.
struct NoAnswer {
    timed_out: bool,
}

async fn read_bounded(mut resp: Response, url: &Url) -> Result<Vec<u8>, TelemetryError> {
    let too_large = || TelemetryError::MetricsTooLarge { url: url.clone(), limit: MAX_BODY };
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|source| TelemetryError::MetricsRequest { url: url.clone(), source })?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What one scrape's samples say, read by `names`; pure, so that it can be tested and fuzzed
/// without a server.
pub(crate) fn read(samples: &[exposition::Sample], n: &MetricNames, healthy: bool) -> ServerSample {
    let mut out = ServerSample {
        running: sum(samples, &n.running),
        waiting: sum(samples, &n.waiting),
        kv_cache_usage: n.kv_cache_usage.iter().find_map(|name| mean(samples, name)),
        healthy,
        ..ServerSample::default()
    };
    match &n.prefix_cache {
        PrefixCache::None => {}
        PrefixCache::Counters { hits, queries } => {
            out.prefix_cache_counters = sum(samples, hits).zip(sum(samples, queries))
        }
        PrefixCache::Gauge(name) => out.prefix_cache_hit_rate = mean(samples, name),
    }
    out.kv_capacity_tokens = kv_capacity_tokens(samples);
    let kv_free = match n.kv_capacity {
        KvCapacity::None => None,
        KvCapacity::VllmCacheConfig => Some(vllm_free_tokens(samples, &n.kv_cache_usage)),
        KvCapacity::SglangTokens => Some(sglang_free_tokens(samples)),
    };
    match kv_free {
        Some(Ok(t)) => out.kv_free_tokens = Some(t),
        Some(Err(reason)) => out.unknown.push(reason),
        None => {}
    }
    if let Some(g) = &n.gpu {
        gpu_values(samples, g, &mut out);
    }
    out
}

/// Sum over every label set (one per model name, LoRA adapter or engine): requests add up.
fn sum(samples: &[exposition::Sample], name: &str) -> Option<f64> {
    let mut it = samples.iter().filter(|s| s.name == name).map(|s| s.value).peekable();
    it.peek()?;
    Some(it.sum())
}

/// Mean over label sets: each engine's KV cache usage is a fraction of its own cache, and the
/// engines of one server (data-parallel ranks) have caches of one size, so the mean is the
/// fraction of the server's whole cache in use. A sum could exceed 1.
fn mean(samples: &[exposition::Sample], name: &str) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter(|s| s.name == name).map(|s| s.value).collect();
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / values.len() as f64)
}

fn label<'a>(s: &'a exposition::Sample, name: &str) -> Option<&'a str> {
    s.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn same_labels(a: &exposition::Sample, b: &exposition::Sample) -> bool {
    a.labels.len() == b.labels.len() && a.labels.iter().all(|(k, v)| label(b, k) == Some(v.as_str()))
}

/// The KV cache's capacity in tokens, whatever the config asks of the scrape: vLLM's
/// [`VLLM_CACHE_CONFIG`] (`num_gpu_blocks x block_size`, once per engine, summed), else SGLang's
/// [`SGLANG_MAX_TOKENS`] (summed over label sets); `None` when neither is exported or a value
/// is not a whole number (an engine not initialised yet).
fn kv_capacity_tokens(samples: &[exposition::Sample]) -> Option<f64> {
    let configs = vllm_capacities(samples).ok()?;
    if configs.is_empty() {
        return sum(samples, SGLANG_MAX_TOKENS).filter(|t| t.is_finite() && *t >= 0.0);
    }
    let engines: std::collections::BTreeMap<&str, u64> = configs.into_iter().collect();
    Some(engines.values().map(|&t| t as f64).sum())
}

/// Each [`VLLM_CACHE_CONFIG`] sample's engine (its `engine` label, "" without one) and
/// capacity, `num_gpu_blocks x block_size` tokens; empty when vLLM exports none. `Err`: a sample
/// whose labels are not whole numbers (the engine not initialised yet).
fn vllm_capacities(samples: &[exposition::Sample]) -> Result<Vec<(&str, u64)>, String> {
    let mut configs = Vec::new();
    for s in samples.iter().filter(|s| s.name == VLLM_CACHE_CONFIG) {
        let (blocks, size) = (label(s, "num_gpu_blocks"), label(s, "block_size"));
        let tokens = match (blocks.and_then(|b| b.parse::<u64>().ok()), size.and_then(|b| b.parse::<u64>().ok())) {
            (Some(b), Some(z)) => b.checked_mul(z),
            _ => None,
        };
        let Some(tokens) = tokens else {
            return Err(format!(
                "{VLLM_CACHE_CONFIG}: num_gpu_blocks={blocks:?} block_size={size:?} are not whole numbers \
                 (engine not initialised yet?)"
            ));
        };
        configs.push((label(s, "engine").unwrap_or(""), tokens));
    }
    Ok(configs)
}

/// vLLM's free KV cache in tokens: for each engine (the `engine` label of the usage gauge),
/// `num_gpu_blocks x block_size` (its [`VLLM_CACHE_CONFIG`] sample, or the one capacity all
/// samples agree on) times `1 - usage` (usage above 1 counts as 1), summed. `Err`: why not.
fn vllm_free_tokens(samples: &[exposition::Sample], usage_names: &[String]) -> Result<f64, String> {
    let configs = vllm_capacities(samples)?;
    if configs.is_empty() {
        return Err(format!("{VLLM_CACHE_CONFIG} absent from the metrics (vLLM exports it once its engine is up)"));
    }
    let usage_name = usage_names
        .iter()
        .find(|n| samples.iter().any(|s| &s.name == *n))
        .ok_or_else(|| format!("no KV-cache usage gauge ({}) in the metrics", usage_names.join(" or ")))?;
    // Mean per engine: several label sets of one engine (model names) describe one cache.
    let mut engines: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
    for s in samples.iter().filter(|s| &s.name == usage_name) {
        let e = engines.entry(label(s, "engine").unwrap_or("")).or_default();
        e.0 += s.value;
        e.1 += 1;
    }
    let shared = configs.iter().all(|c| c.1 == configs[0].1).then_some(configs[0].1);
    let mut free = 0.0;
    for (engine, (total, n)) in engines {
        let usage = total / n as f64;
        if !(usage.is_finite() && usage >= 0.0) {
            return Err(format!("{usage_name}{{engine={engine:?}}} = {usage} is not a fraction"));
        }
        let capacity = configs.iter().find(|c| c.0 == engine).map(|c| c.1).or(shared).ok_or_else(|| {
            format!("{VLLM_CACHE_CONFIG}: no sample for engine {engine:?} and the engines' capacities differ")
        })?;
        free += capacity as f64 * (1.0 - usage.min(1.0));
    }
    Ok(free)
}

/// SGLang's free KV cache in tokens: [`SGLANG_MAX_TOKENS`] minus [`SGLANG_USED_TOKENS`] of the
/// same label set, summed over label sets. `Err`: why not.
fn sglang_free_tokens(samples: &[exposition::Sample]) -> Result<f64, String> {
    let mut free = 0.0;
    let mut any = false;
    for max in samples.iter().filter(|s| s.name == SGLANG_MAX_TOKENS) {
        any = true;
        let used = samples
            .iter()
            .find(|s| s.name == SGLANG_USED_TOKENS && same_labels(s, max))
            .ok_or_else(|| format!("{SGLANG_USED_TOKENS} absent for the labels of {SGLANG_MAX_TOKENS}"))?;
        if !(max.value.is_finite() && used.value.is_finite() && max.value >= 0.0 && used.value >= 0.0) {
            return Err(format!(
                "{SGLANG_MAX_TOKENS} = {} / {SGLANG_USED_TOKENS} = {}: not counts",
                max.value, used.value
            ));
        }
        free += (max.value - used.value).max(0.0);
    }
    if !any {
        return Err(format!("{SGLANG_MAX_TOKENS} absent from the metrics (older SGLang versions do not export it)"));
    }
    Ok(free)
}

/// Fills memory (MiB) and utilisation (%) from the mapped gauges; a value that cannot be read
/// is left `None` with its reason in `out.unknown`.
fn gpu_values(samples: &[exposition::Sample], g: &GpuMetrics, out: &mut ServerSample) {
    let selected = |name: &str| -> Vec<f64> {
        samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| g.labels.iter().all(|(k, vals)| label(s, k).is_some_and(|v| vals.iter().any(|x| x == v))))
            .map(|s| s.value)
            .collect()
    };
    let filtered = if g.labels.is_empty() { "" } else { " (after the gpu_labels filter)" };
    let sum_mib = |name: &str| -> Result<f64, String> {
        let v = selected(name);
        if v.is_empty() {
            return Err(format!("{name} absent from the metrics{filtered}"));
        }
        if let Some(bad) = v.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
            return Err(format!("{name} = {bad}: not an amount of memory"));
        }
        Ok(g.memory_unit.to_mib(v.iter().sum()))
    };
    let total = g.memory_total.as_deref().map(sum_mib);
    let free = match (&g.memory_free, &total, &g.memory_used) {
        (Some(name), _, _) => Some(sum_mib(name)),
        (None, Some(Ok(t)), Some(used)) => Some(sum_mib(used).and_then(|u| {
            if u <= *t {
                Ok(t - u)
            } else {
                Err(format!("{used} ({u} MiB) above {} ({t} MiB)", g.memory_total.as_deref().unwrap_or("")))
            }
        })),
        (None, Some(Err(e)), Some(_)) => Some(Err(e.clone())),
        _ => None,
    };
    for (slot, v) in [(&mut out.memory_free_mb, free), (&mut out.memory_total_mb, total)] {
        match v {
            Some(Ok(x)) => *slot = Some(x),
            Some(Err(e)) if !out.unknown.contains(&e) => out.unknown.push(e),
            _ => {}
        }
    }
    if let Some(name) = &g.util {
        let v = selected(name);
        let pct = match g.util_unit {
            UtilUnit::Percent => 1.0,
            UtilUnit::Fraction => 100.0,
        };
        if v.is_empty() {
            out.unknown.push(format!("{name} absent from the metrics{filtered}"));
        } else {
            let mean = v.iter().sum::<f64>() / v.len() as f64 * pct;
            if mean.is_finite() && (0.0..=100.0).contains(&mean) {
                out.gpu_util_pct = Some(mean);
            } else {
                out.unknown.push(format!("{name}: {mean} % is outside 0..100 (check gpu_util_unit)"));
            }
        }
    }
}

#[cfg(test)]
mod tests;
