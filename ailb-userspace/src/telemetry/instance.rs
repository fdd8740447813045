//! One sampled model-server instance as configured: where its metrics and health are, which
//! GPUs it runs on, which server it is and what its metric names are. Shared by the agent's
//! `[[instances]]` and the one-box daemon's `[[backends]]` with a `metrics_url`, so both
//! validate an instance the same way (errors name the field and the value).

use std::{collections::BTreeMap, net::Ipv4Addr};

use reqwest::Url;
use serde::Deserialize;

use super::model_server::MetricNames;
use crate::validate::ConfigError;

mod metric_names;

use metric_names::metric_names;
pub use metric_names::MAX_KV_BYTES_PER_TOKEN;

/// Largest believable request count, queue length or cap: no model server runs or queues a
/// million requests (vLLM's `max_num_seqs` defaults to 256).
pub const MAX_REQUESTS: f64 = 1e6;

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    #[default]
    Vllm,
    Sglang,
    /// Names from `[instances.metrics]` (`running` and `waiting` required).
    Custom,
}

/// `[instances.metrics]`: metric names read from `metrics_url`. For `server = "custom"`,
/// `running` and `waiting` are required; for vLLM and SGLang every entry overrides or adds to
/// the built-in names. The memory and utilisation gauges are for `nvml = false` only.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Running requests (summed over label sets).
    pub running: Option<String>,
    /// Waiting requests (summed).
    pub waiting: Option<String>,
    /// KV-cache usage, fraction 0..1 (mean over label sets).
    pub kv_cache_usage: Option<String>,
    /// Free GPU memory (summed over the selected samples, one per GPU).
    pub memory_free: Option<String>,
    /// Total GPU memory; with `memory_used`, free = total - used.
    pub memory_total: Option<String>,
    pub memory_used: Option<String>,
    /// `bytes`, `KiB`, `MiB` or `GiB`; required with any memory gauge.
    pub memory_unit: Option<String>,
    /// GPU utilisation (mean over the selected samples).
    pub gpu_util: Option<String>,
    /// `percent` (0..100) or `fraction` (0..1); required with `gpu_util`.
    pub gpu_util_unit: Option<String>,
    /// Only samples of the memory and utilisation gauges whose label has one of the values
    /// (every entry must match), e.g. `{ gpu = ["0", "1"] }` for the DCGM exporter.
    #[serde(default)]
    pub gpu_labels: BTreeMap<String, Vec<String>>,
}

/// A GPU by NVML index or UUID.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum GpuRef {
    Index(u32),
    Uuid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    pub service: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    /// Default `"DEFAULT"`.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// Registry weight while serving; default 1.
    #[serde(default = "one")]
    pub weight: f64,
    pub model_id: String,
    #[serde(default)]
    pub model_version: Option<String>,
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// The most requests the server runs at once (vLLM's `--max-num-seqs`), published as
    /// `max_inflight`: the kernel's hard cap on the backend's connections, and its share of
    /// the model's capacity for the front door's admission. Default none (no cap).
    #[serde(default)]
    pub max_inflight: Option<u32>,
    #[serde(default)]
    pub supported_tasks: Vec<String>,
    #[serde(default)]
    pub gpus: Vec<GpuRef>,
    pub metrics_url: String,
    /// Health is a 2xx here; default none: health is "the metrics endpoint answered 2xx".
    #[serde(default)]
    pub health_url: Option<String>,
    #[serde(default)]
    pub server: ServerKind,
    /// Default true: NVML must be present at start-up.
    #[serde(default = "yes")]
    pub nvml: bool,
    /// vLLM / SGLang with `nvml = false`: bytes of KV cache one token takes in the whole model
    /// (layers x KV heads x head dim x 2 x dtype bytes); the free KV cache is then published as
    /// free memory. Default none.
    #[serde(default)]
    pub kv_bytes_per_token: Option<u64>,
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// The engine's KV-event publisher (vLLM's `--kv-events-config` endpoint), published as
    /// `kv_events_endpoint` for gateways whose model follows the engines' caches
    /// (`prefix = "precise"`). A wildcard host, as vLLM's default `tcp://*:5557`, is published
    /// with the instance's `ip`. Default none.
    #[serde(default)]
    pub kv_events: Option<String>,
    /// Its replay socket (vLLM's `replay_endpoint`), published as `kv_events_replay`; optional.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// The engine's KV-cache block size in tokens (vLLM's `--block-size`), published as
    /// `kv_block_size`; required with `kv_events`.
    #[serde(default)]
    pub kv_block_size: Option<u32>,
}

/// `endpoint` with a wildcard host (`*`, `0.0.0.0`: where an engine binds) replaced by `ip`,
/// the address a gateway connects to.
fn published_endpoint(endpoint: &str, ip: Ipv4Addr) -> String {
    for wildcard in ["tcp://*:", "tcp://0.0.0.0:"] {
        if let Some(port) = endpoint.strip_prefix(wildcard) {
            return format!("tcp://{ip}:{port}");
        }
    }
    endpoint.to_string()
}

fn default_cluster() -> String {
    "DEFAULT".into()
}
fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq)]
pub struct ValidInstance {
    pub service: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub cluster: String,
    pub weight: f64,
    pub model_id: String,
    pub model_version: Option<String>,
    pub gpu_type: Option<String>,
    pub max_inflight: Option<u32>,
    pub supported_tasks: Vec<String>,
    pub gpus: Vec<GpuRef>,
    pub metrics_url: Url,
    pub health_url: Option<Url>,
    pub server: ServerKind,
    pub nvml: bool,
    /// What a scrape reads (built-in names, `[instances.metrics]`, KV capacity).
    pub names: MetricNames,
    pub kv_bytes_per_token: Option<u64>,
    /// The engine's KV-event publisher as gateways connect to it.
    pub kv_events: Option<crate::kv_events::EventSource>,
}

impl ValidInstance {
    /// `service ip:port`, for logs.
    pub fn name(&self) -> String {
        format!("{} {}:{}", self.service, self.ip, self.port)
    }
}

fn text_ok(s: &str) -> bool {
    !s.trim().is_empty() && s.len() <= 256 && !s.chars().any(char::is_control)
}

fn http_url(field: &str, s: &str) -> Result<Url, ConfigError> {
    let u = Url::parse(s).map_err(|e| ConfigError::invalid(field, s, format!("expected an http URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() {
        return Err(ConfigError::invalid(field, s, "expected an http(s) URL with a host"));
    }
    Ok(u)
}

/// One instance checked as `[[instances]]` are, its errors naming `prefix.<field>` (the gateway's
/// `backends[i]` that `ailb run` samples itself). There NVML is on exactly when `gpus` is set (no
/// `nvml` key), and the reasons say so.
pub fn check_local_instance(prefix: &str, c: &InstanceConfig) -> Result<ValidInstance, ConfigError> {
    check_instance(0, c, &[]).map_err(|e| match e {
        ConfigError::InvalidValue { field, value, reason } => ConfigError::InvalidValue {
            field: field.replacen("instances[0]", prefix, 1),
            value,
            reason: reason.replace("with nvml = true", "with gpus").replace("set nvml = false", "remove gpus"),
        },
        other => other,
    })
}

/// `instances[i]`; `before` are the instances listed before it.
pub(crate) fn check_instance(
    i: usize,
    c: &InstanceConfig,
    before: &[InstanceConfig],
) -> Result<ValidInstance, ConfigError> {
    let f = |name: &str| format!("instances[{i}].{name}");
    for (name, v) in [("service", &c.service), ("model_id", &c.model_id), ("cluster", &c.cluster)] {
        if !text_ok(v) || v.contains("@@") || (name == "cluster" && v.contains(',')) {
            return Err(ConfigError::invalid(f(name), v, "1 to 256 bytes, no control characters, no \"@@\""));
        }
    }
    for (name, v) in [("model_version", &c.model_version), ("gpu_type", &c.gpu_type)] {
        if let Some(v) = v.as_ref().filter(|v| !text_ok(v)) {
            return Err(ConfigError::invalid(f(name), v, "1 to 256 bytes, no control characters"));
        }
    }
    for (k, task) in c.supported_tasks.iter().enumerate() {
        if !text_ok(task) || task.contains(',') {
            return Err(ConfigError::invalid(f(&format!("supported_tasks[{k}]")), task, "non-empty, no ','"));
        }
    }
    if let Some(cap) = c.max_inflight.filter(|&n| !(1..=MAX_REQUESTS as u32).contains(&n)) {
        return Err(ConfigError::invalid(f("max_inflight"), cap, "must be 1 to 1000000 (omit it for no cap)"));
    }
    if c.port == 0 || c.ip.is_unspecified() {
        return Err(ConfigError::invalid(f("ip"), format!("{}:{}", c.ip, c.port), "a routable address"));
    }
    if !(c.weight.is_finite() && (0.001..=10000.0).contains(&c.weight)) {
        return Err(ConfigError::invalid(f("weight"), c.weight, "must be 0.001 to 10000"));
    }
    if c.nvml && c.gpus.is_empty() {
        return Err(ConfigError::invalid(f("gpus"), "[]", "with nvml = true, name the instance's GPUs"));
    }
    if before.iter().any(|o| o.ip == c.ip && o.port == c.port && o.service == c.service) {
        return Err(ConfigError::invalid(f("port"), c.port, "the same service, ip and port twice"));
    }
    Ok(ValidInstance {
        service: c.service.clone(),
        ip: c.ip,
        port: c.port,
        cluster: c.cluster.clone(),
        weight: c.weight,
        model_id: c.model_id.trim().to_string(),
        model_version: c.model_version.as_ref().map(|s| s.trim().to_string()),
        gpu_type: c.gpu_type.as_ref().map(|s| s.trim().to_string()),
        max_inflight: c.max_inflight,
        supported_tasks: c.supported_tasks.iter().map(|s| s.trim().to_string()).collect(),
        gpus: c.gpus.clone(),
        metrics_url: http_url(&f("metrics_url"), &c.metrics_url)?,
        health_url: c.health_url.as_ref().map(|u| http_url(&f("health_url"), u)).transpose()?,
        server: c.server,
        nvml: c.nvml,
        names: metric_names(c, &f)?,
        kv_bytes_per_token: c.kv_bytes_per_token,
        kv_events: kv_events(c, &f)?,
    })
}

/// `instances[i]`'s KV-event publisher, wildcard hosts replaced by the instance's address.
fn kv_events(
    c: &InstanceConfig,
    f: &dyn Fn(&str) -> String,
) -> Result<Option<crate::kv_events::EventSource>, ConfigError> {
    let Some(endpoint) = &c.kv_events else {
        for (name, set) in [("kv_replay", c.kv_replay.is_some()), ("kv_block_size", c.kv_block_size.is_some())] {
            if set {
                return Err(ConfigError::invalid(f(name), "set", "only with kv_events (the engine's publisher)"));
            }
        }
        return Ok(None);
    };
    let replay = c.kv_replay.as_deref().map(|r| published_endpoint(r, c.ip));
    crate::kv_events::feed::check_source(
        &published_endpoint(endpoint, c.ip),
        replay.as_deref(),
        c.kv_block_size.map(u64::from),
    )
    .map(Some)
    .map_err(|(name, value, reason)| ConfigError::invalid(f(name), value, reason))
}
