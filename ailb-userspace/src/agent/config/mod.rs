//! `ailb agent --config FILE`: serde types with documented defaults and their validation.
//!
//! ```toml
//! publish_interval = "500ms"   # how often telemetry is sampled; a write only when a value moved
//! heartbeat_interval = "5s"    # Nacos beats for ephemeral instances
//! drain_timeout = "30s"        # SIGTERM: longest wait for in-flight requests to finish
//! probe_timeout = "1s"         # each scrape and health probe of a model server
//! health_failure_threshold = 3 # timed-out probes in a row before the instance is unhealthy
//! listen = "127.0.0.1:9464"    # the agent's /metrics (optional)
//! nvml_library = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"   # optional
//!
//! [nacos]                      # the gateway's [discovery.nacos] (poll_interval, udp_push, clusters unused)
//! servers = ["http://10.0.0.5:8848"]
//! api = "v1"                   # "auto" (v3, else v1), "v1" or "v3"
//!
//! [thresholds]                 # a publish when a value moved by at least this much
//! memory_mb = 512
//! util_pct = 5
//! requests = 1
//! kv_cache = 0.05
//!
//! [[instances]]
//! service = "llama3-70b"       # the Nacos service (the model name in the gateway catalog)
//! ip = "10.0.0.7"
//! port = 8000
//! model_id = "llama3-70b"
//! model_version = "v1"
//! gpu_type = "A100-80GB"       # optional: NVML's name of the first GPU
//! max_inflight = 64             # optional: the server's most requests at once (the hard cap)
//! supported_tasks = ["chat"]
//! gpus = [0, 1]                # NVML indices or UUIDs ("GPU-...")
//! metrics_url = "http://127.0.0.1:8000/metrics"
//! health_url = "http://127.0.0.1:8000/health"   # optional: default, metrics answering 2xx
//! server = "vllm"              # "sglang", or "custom": names from [instances.metrics]
//! nvml = true                  # false: no NVML; memory and utilisation from metrics (below) or left out
//! # kv_bytes_per_token = 131072 # nvml = false, vllm / sglang: free KV cache x this = free memory
//!
//! # [instances.metrics]          # optional for vllm / sglang (overrides); custom: running, waiting
//! # running = "tgi_batch_current_size"
//! # waiting = "tgi_queue_size"
//! # kv_cache_usage = "my_kv_usage"            # optional, fraction 0..1
//! # nvml = false only, one memory source (not with kv_bytes_per_token):
//! # memory_free = "DCGM_FI_DEV_FB_FREE"       # or memory_total + memory_used (free = total - used)
//! # memory_unit = "MiB"                       # "bytes", "KiB", "MiB", "GiB": required with memory gauges
//! # gpu_util = "DCGM_FI_DEV_GPU_UTIL"
//! # gpu_util_unit = "percent"                 # or "fraction" (0..1): required with gpu_util
//! # gpu_labels = { gpu = ["0", "1"] }         # only these samples of the memory / util gauges
//! ```
//!
//! docs/metadata.md ("Where the agent's values come from") says what each source means.

use std::{collections::BTreeMap, net::Ipv4Addr, net::SocketAddr, path::PathBuf, time::Duration};

use reqwest::Url;
use serde::Deserialize;

use crate::{
    metadata::MAX_REQUESTS,
    nacos::{NacosConfig, ValidNacos},
    telemetry::model_server::MetricNames,
    validate::{parse_duration, ConfigError},
};

mod metric_names;

use metric_names::metric_names;
pub use metric_names::MAX_KV_BYTES_PER_TOKEN;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub nacos: NacosConfig,
    /// Default `"500ms"` (a change reaches the kernel maps within 1 s with room: the wait for the
    /// next sample is at most one interval), 50ms to 60s.
    #[serde(default = "default_publish")]
    pub publish_interval: String,
    /// Default `"5s"` (Nacos' own client interval), 100ms to 60s.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval: String,
    /// Default `"30s"`, at most 1h.
    #[serde(default = "default_drain")]
    pub drain_timeout: String,
    /// How long a scrape or a health probe of a model server may take, connect to last byte.
    /// Default `"1s"` (Kubernetes' probe timeout), 10ms to 60s.
    #[serde(default = "default_probe_timeout")]
    pub probe_timeout: String,
    /// Timed-out samples in a row (no answer within `probe_timeout`) before an instance is
    /// published unhealthy; until then its last healthy values stand. A refused connection or
    /// an error answer is unhealthy at once. Default 3 (Kubernetes' `failureThreshold`), 1 to
    /// 100: with the defaults a hung server leaves the table after about 3 s.
    #[serde(default = "default_failure_threshold")]
    pub health_failure_threshold: u32,
    /// The agent's `/metrics` and `/healthz`; default none.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    #[serde(default)]
    pub thresholds: Thresholds,
    /// The NVML library; default `libnvidia-ml.so.1` on the loader's path. Opened once at
    /// start-up when any instance has `nvml = true`; missing: a start-up error.
    #[serde(default)]
    pub nvml_library: Option<PathBuf>,
    pub instances: Vec<InstanceConfig>,
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
    /// KV-cache usage, fraction 0..1. Default 0.05.
    pub kv_cache: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { memory_mb: 512, util_pct: 5.0, requests: 1.0, kv_cache: 0.05 }
    }
}

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
}

fn default_publish() -> String {
    "500ms".into()
}
fn default_heartbeat() -> String {
    "5s".into()
}
fn default_drain() -> String {
    "30s".into()
}
fn default_probe_timeout() -> String {
    "1s".into()
}
fn default_failure_threshold() -> u32 {
    3
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

/// A validated agent config.
#[derive(Debug, Clone)]
pub struct ValidAgent {
    pub nacos: ValidNacos,
    pub publish_interval: Duration,
    pub heartbeat_interval: Duration,
    pub drain_timeout: Duration,
    pub probe_timeout: Duration,
    pub health_failure_threshold: u32,
    pub listen: Option<SocketAddr>,
    pub thresholds: Thresholds,
    pub nvml_library: Option<PathBuf>,
    pub instances: Vec<ValidInstance>,
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

impl AgentConfig {
    /// The TOML `text`; `origin` names it in the error.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { origin: origin.to_string(), source: Box::new(e) })
    }

    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn validate(&self) -> Result<ValidAgent, ConfigError> {
        // The gateway's validation names `discovery.nacos.*`; here the table is `[nacos]`.
        let nacos = self.nacos.validate().map_err(|e| match e {
            ConfigError::InvalidValue { field, value, reason } => {
                ConfigError::InvalidValue { field: field.replacen("discovery.nacos", "nacos", 1), value, reason }
            }
            other => other,
        })?;
        let publish_interval =
            duration("publish_interval", &self.publish_interval, Duration::from_millis(50), Duration::from_secs(60))?;
        let heartbeat_interval = duration(
            "heartbeat_interval",
            &self.heartbeat_interval,
            Duration::from_millis(100),
            Duration::from_secs(60),
        )?;
        let drain_timeout = duration("drain_timeout", &self.drain_timeout, Duration::ZERO, Duration::from_secs(3600))?;
        let probe_timeout =
            duration("probe_timeout", &self.probe_timeout, Duration::from_millis(10), Duration::from_secs(60))?;
        if !(1..=100).contains(&self.health_failure_threshold) {
            return Err(ConfigError::invalid(
                "health_failure_threshold",
                self.health_failure_threshold.to_string(),
                "expected 1 to 100 timed-out probes in a row",
            ));
        }
        check_thresholds(&self.thresholds)?;
        if self.instances.is_empty() {
            return Err(ConfigError::invalid("instances", "[]", "at least one [[instances]] is needed"));
        }
        let instances = (0..self.instances.len())
            .map(|i| check_instance(i, &self.instances[i], &self.instances[..i]))
            .collect::<Result<_, _>>()?;
        Ok(ValidAgent {
            nacos,
            publish_interval,
            heartbeat_interval,
            drain_timeout,
            probe_timeout,
            health_failure_threshold: self.health_failure_threshold,
            listen: self.listen,
            thresholds: self.thresholds,
            nvml_library: self.nvml_library.clone(),
            instances,
        })
    }
}

/// A duration field within `min..=max`.
fn duration(field: &str, v: &str, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
    let d = parse_duration(field, v)?;
    if d < min || d > max {
        return Err(ConfigError::invalid(field, v, format!("must be {min:?} to {max:?}")));
    }
    Ok(d)
}

fn check_thresholds(t: &Thresholds) -> Result<(), ConfigError> {
    for (field, v, max) in [
        ("thresholds.util_pct", t.util_pct, 100.0),
        ("thresholds.requests", t.requests, 1e6),
        ("thresholds.kv_cache", t.kv_cache, 1.0),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= max) {
            return Err(ConfigError::invalid(field, v, format!("must be in (0, {max}]")));
        }
    }
    if t.memory_mb == 0 {
        return Err(ConfigError::invalid("thresholds.memory_mb", 0, "must be at least 1"));
    }
    Ok(())
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
fn check_instance(i: usize, c: &InstanceConfig, before: &[InstanceConfig]) -> Result<ValidInstance, ConfigError> {
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
    })
}

#[cfg(test)]
mod tests;
