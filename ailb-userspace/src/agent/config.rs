//! `ailb agent --config FILE`: serde types with documented defaults and their validation.
//!
//! ```toml
//! publish_interval = "1s"      # how often telemetry is sampled; a write only when a value moved
//! heartbeat_interval = "5s"    # Nacos beats for ephemeral instances
//! drain_timeout = "30s"        # SIGTERM: longest wait for in-flight requests to finish
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
    config::{parse_duration, ConfigError},
    nacos::{NacosConfig, ValidNacos},
    telemetry::model_server::{self, GpuMetrics, KvCapacity, MemoryUnit, MetricNames, UtilUnit},
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub nacos: NacosConfig,
    /// Default `"1s"`, 50ms to 60s.
    #[serde(default = "default_publish")]
    pub publish_interval: String,
    /// Default `"5s"` (Nacos' own client interval), 100ms to 60s.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval: String,
    /// Default `"30s"`, at most 1h.
    #[serde(default = "default_drain")]
    pub drain_timeout: String,
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
    "1s".into()
}
fn default_heartbeat() -> String {
    "5s".into()
}
fn default_drain() -> String {
    "30s".into()
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
    pub listen: Option<SocketAddr>,
    pub thresholds: Thresholds,
    pub nvml_library: Option<PathBuf>,
    pub instances: Vec<ValidInstance>,
}

#[derive(Debug, Clone)]
pub struct ValidInstance {
    pub service: String,
    pub ip: Ipv4Addr,
    pub port: u16,
    pub cluster: String,
    pub weight: f64,
    pub model_id: String,
    pub model_version: Option<String>,
    pub gpu_type: Option<String>,
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

/// The largest `kv_bytes_per_token`: 64 MiB, far above any model (Llama 3.1 405B in bf16 takes
/// 126 layers x 8 KV heads x 128 x 2 x 2 bytes = 504 KiB).
pub const MAX_KV_BYTES_PER_TOKEN: u64 = 64 << 20;

fn metric_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && s.len() <= 200
}

fn label_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The names an instance's scrape reads, from its `server`, `[instances.metrics]`, `nvml` and
/// `kv_bytes_per_token`; `f` names a field (`instances[i].<name>`).
fn metric_names(c: &InstanceConfig, f: &dyn Fn(&str) -> String) -> Result<MetricNames, ConfigError> {
    let empty = MetricsConfig::default();
    let m = c.metrics.as_ref().unwrap_or(&empty);
    let names = [
        ("running", &m.running),
        ("waiting", &m.waiting),
        ("kv_cache_usage", &m.kv_cache_usage),
        ("memory_free", &m.memory_free),
        ("memory_total", &m.memory_total),
        ("memory_used", &m.memory_used),
        ("gpu_util", &m.gpu_util),
    ];
    for (name, v) in names {
        if let Some(v) = v.as_ref().filter(|v| !metric_name_ok(v)) {
            return Err(ConfigError::invalid(
                f(&format!("metrics.{name}")),
                v,
                "not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, at most 200 bytes)",
            ));
        }
    }
    let mut out = match c.server {
        ServerKind::Vllm => model_server::ServerKind::Vllm.names(),
        ServerKind::Sglang => model_server::ServerKind::Sglang.names(),
        ServerKind::Custom => {
            for (name, v) in [("running", &m.running), ("waiting", &m.waiting)] {
                if v.is_none() {
                    return Err(ConfigError::invalid(
                        f(&format!("metrics.{name}")),
                        "(none)",
                        format!("server = \"custom\" needs [instances.metrics] {name} = \"<gauge name>\""),
                    ));
                }
            }
            model_server::ServerKind::Custom { running: String::new(), waiting: String::new(), kv_cache_usage: None }
                .names()
        }
    };
    if let Some(r) = &m.running {
        out.running = r.clone();
    }
    if let Some(w) = &m.waiting {
        out.waiting = w.clone();
    }
    if let Some(k) = &m.kv_cache_usage {
        out.kv_cache_usage = vec![k.clone()];
    }

    let memory = m.memory_free.is_some() || m.memory_total.is_some() || m.memory_used.is_some();
    let nvml_conflict = |name: &str, v: &dyn ToString| {
        ConfigError::invalid(
            f(name),
            v.to_string(),
            "with nvml = true, NVML gives memory and utilisation; set nvml = false to take them from metrics",
        )
    };
    if c.nvml {
        if let Some(b) = c.kv_bytes_per_token {
            return Err(nvml_conflict("kv_bytes_per_token", &b));
        }
        for (name, v) in [("metrics.memory_free", &m.memory_free), ("metrics.memory_total", &m.memory_total)]
            .into_iter()
            .chain([("metrics.memory_used", &m.memory_used), ("metrics.gpu_util", &m.gpu_util)])
        {
            if let Some(v) = v {
                return Err(nvml_conflict(name, v));
            }
        }
    }
    if let Some(b) = c.kv_bytes_per_token {
        if c.server == ServerKind::Custom {
            return Err(ConfigError::invalid(
                f("kv_bytes_per_token"),
                b,
                "only for server = \"vllm\" or \"sglang\" (their KV-cache capacity metrics); map memory_free instead",
            ));
        }
        if !(1..=MAX_KV_BYTES_PER_TOKEN).contains(&b) {
            return Err(ConfigError::invalid(
                f("kv_bytes_per_token"),
                b,
                format!("must be 1 to {MAX_KV_BYTES_PER_TOKEN}"),
            ));
        }
        if memory {
            return Err(ConfigError::invalid(
                f("kv_bytes_per_token"),
                b,
                "one memory source: the memory gauges of [instances.metrics] or kv_bytes_per_token, not both",
            ));
        }
        out.kv_capacity = match c.server {
            ServerKind::Sglang => KvCapacity::SglangTokens,
            _ => KvCapacity::VllmCacheConfig,
        };
    }
    if m.memory_free.is_some() && m.memory_used.is_some() {
        return Err(ConfigError::invalid(
            f("metrics.memory_used"),
            m.memory_used.as_deref().unwrap_or_default(),
            "give memory_free, or memory_total and memory_used, not both",
        ));
    }
    if m.memory_used.is_some() && m.memory_total.is_none() {
        return Err(ConfigError::invalid(
            f("metrics.memory_used"),
            m.memory_used.as_deref().unwrap_or_default(),
            "needs memory_total (free = total - used)",
        ));
    }
    let memory_unit = match (&m.memory_unit, memory) {
        (Some(u), true) => Some(MemoryUnit::parse(u).ok_or_else(|| {
            ConfigError::invalid(f("metrics.memory_unit"), u, "one of \"bytes\", \"KiB\", \"MiB\", \"GiB\"")
        })?),
        (None, true) => {
            return Err(ConfigError::invalid(
                f("metrics.memory_unit"),
                "(none)",
                "required with memory gauges: \"bytes\", \"KiB\", \"MiB\" or \"GiB\" (no guessing)",
            ))
        }
        (Some(u), false) => {
            return Err(ConfigError::invalid(f("metrics.memory_unit"), u, "no memory gauge is mapped"));
        }
        (None, false) => None,
    };
    let util_unit = match (&m.gpu_util_unit, &m.gpu_util) {
        (Some(u), Some(_)) => Some(UtilUnit::parse(u).ok_or_else(|| {
            ConfigError::invalid(f("metrics.gpu_util_unit"), u, "\"percent\" (0..100) or \"fraction\" (0..1)")
        })?),
        (None, Some(_)) => {
            return Err(ConfigError::invalid(
                f("metrics.gpu_util_unit"),
                "(none)",
                "required with gpu_util: \"percent\" (0..100) or \"fraction\" (0..1)",
            ))
        }
        (Some(u), None) => return Err(ConfigError::invalid(f("metrics.gpu_util_unit"), u, "no gpu_util is mapped")),
        (None, None) => None,
    };
    for (k, vals) in &m.gpu_labels {
        let field = f(&format!("metrics.gpu_labels.{k}"));
        if !label_name_ok(k) {
            return Err(ConfigError::invalid(field, k, "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
        }
        if vals.is_empty() {
            return Err(ConfigError::invalid(field, "[]", "at least one value"));
        }
        if memory_unit.is_none() && util_unit.is_none() {
            return Err(ConfigError::invalid(
                field,
                vals.join(","),
                "filters the memory and utilisation gauges; none is mapped",
            ));
        }
    }
    if memory_unit.is_some() || util_unit.is_some() {
        out.gpu = Some(GpuMetrics {
            memory_free: m.memory_free.clone(),
            memory_total: m.memory_total.clone(),
            memory_used: m.memory_used.clone(),
            memory_unit: memory_unit.unwrap_or(MemoryUnit::MiB),
            util: m.gpu_util.clone(),
            util_unit: util_unit.unwrap_or(UtilUnit::Percent),
            labels: m.gpu_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }
    Ok(out)
}

fn http_url(field: &str, s: &str) -> Result<Url, ConfigError> {
    let u = Url::parse(s).map_err(|e| ConfigError::invalid(field, s, format!("expected an http URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") || u.host().is_none() {
        return Err(ConfigError::invalid(field, s, "expected an http(s) URL with a host"));
    }
    Ok(u)
}

impl AgentConfig {
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        toml::from_str(&text)
            .map_err(|e| ConfigError::Parse { origin: path.display().to_string(), source: Box::new(e) })
    }

    pub fn validate(&self) -> Result<ValidAgent, ConfigError> {
        // The gateway's validation names `discovery.nacos.*`; here the table is `[nacos]`.
        let nacos = self.nacos.validate().map_err(|e| match e {
            ConfigError::InvalidValue { field, value, reason } => {
                ConfigError::InvalidValue { field: field.replacen("discovery.nacos", "nacos", 1), value, reason }
            }
            other => other,
        })?;
        let dur = |field: &str, v: &str, min: Duration, max: Duration| {
            let d = parse_duration(field, v)?;
            if d < min || d > max {
                return Err(ConfigError::invalid(field, v, format!("must be {min:?} to {max:?}")));
            }
            Ok(d)
        };
        let publish_interval =
            dur("publish_interval", &self.publish_interval, Duration::from_millis(50), Duration::from_secs(60))?;
        let heartbeat_interval =
            dur("heartbeat_interval", &self.heartbeat_interval, Duration::from_millis(100), Duration::from_secs(60))?;
        let drain_timeout = dur("drain_timeout", &self.drain_timeout, Duration::ZERO, Duration::from_secs(3600))?;
        let t = &self.thresholds;
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
        if self.instances.is_empty() {
            return Err(ConfigError::invalid("instances", "[]", "at least one [[instances]] is needed"));
        }
        let mut instances = Vec::new();
        for (i, c) in self.instances.iter().enumerate() {
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
            if c.port == 0 || c.ip.is_unspecified() {
                return Err(ConfigError::invalid(f("ip"), format!("{}:{}", c.ip, c.port), "a routable address"));
            }
            if !(c.weight.is_finite() && (0.001..=10000.0).contains(&c.weight)) {
                return Err(ConfigError::invalid(f("weight"), c.weight, "must be 0.001 to 10000"));
            }
            if c.nvml && c.gpus.is_empty() {
                return Err(ConfigError::invalid(f("gpus"), "[]", "with nvml = true, name the instance's GPUs"));
            }
            let dup = self.instances[..i].iter().any(|o| o.ip == c.ip && o.port == c.port && o.service == c.service);
            if dup {
                return Err(ConfigError::invalid(f("port"), c.port, "the same service, ip and port twice"));
            }
            instances.push(ValidInstance {
                service: c.service.clone(),
                ip: c.ip,
                port: c.port,
                cluster: c.cluster.clone(),
                weight: c.weight,
                model_id: c.model_id.trim().to_string(),
                model_version: c.model_version.as_ref().map(|s| s.trim().to_string()),
                gpu_type: c.gpu_type.as_ref().map(|s| s.trim().to_string()),
                supported_tasks: c.supported_tasks.iter().map(|s| s.trim().to_string()).collect(),
                gpus: c.gpus.clone(),
                metrics_url: http_url(&f("metrics_url"), &c.metrics_url)?,
                health_url: c.health_url.as_ref().map(|u| http_url(&f("health_url"), u)).transpose()?,
                server: c.server,
                nvml: c.nvml,
                names: metric_names(c, &f)?,
                kv_bytes_per_token: c.kv_bytes_per_token,
            });
        }
        Ok(ValidAgent {
            nacos,
            publish_interval,
            heartbeat_interval,
            drain_timeout,
            listen: self.listen,
            thresholds: self.thresholds,
            nvml_library: self.nvml_library.clone(),
            instances,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
[nacos]
servers = ["http://127.0.0.1:8848"]

[[instances]]
service = "m"
ip = "10.0.0.7"
port = 8000
model_id = "m"
metrics_url = "http://127.0.0.1:8000/metrics"
health_url = "http://127.0.0.1:8000/health"
nvml = false
"#;

    fn parse(s: &str) -> Result<ValidAgent, String> {
        let c: AgentConfig = toml::from_str(s).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let v = parse(MIN).unwrap();
        assert_eq!(v.publish_interval, Duration::from_secs(1));
        assert_eq!(v.heartbeat_interval, Duration::from_secs(5));
        assert_eq!(v.drain_timeout, Duration::from_secs(30));
        assert_eq!(v.thresholds, Thresholds::default());
        let i = &v.instances[0];
        assert_eq!((i.cluster.as_str(), i.weight, i.server), ("DEFAULT", 1.0, ServerKind::Vllm));
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = parse(&MIN.replace("nvml = false", "nvml = true")).unwrap_err();
        assert!(e.contains("instances[0].gpus"), "{e}");
        let e = parse(&format!("publish_interval = \"1ms\"\n{MIN}")).unwrap_err();
        assert!(e.contains("publish_interval"), "{e}");
        let e = parse(&MIN.replace("http://127.0.0.1:8848", "ftp://x")).unwrap_err();
        assert!(e.contains("nacos.servers[0]") && !e.contains("discovery"), "{e}");
        let e = parse(&MIN.replace("http://127.0.0.1:8000/health", "nope")).unwrap_err();
        assert!(e.contains("instances[0].health_url"), "{e}");
        let e = parse(&format!("[thresholds]\nutil_pct = 0\n{MIN}")).unwrap_err();
        assert!(e.contains("thresholds.util_pct"), "{e}");
        assert!(parse(&format!("bogus = 1\n{MIN}")).is_err());
    }

    #[test]
    fn gpus_by_index_or_uuid() {
        let v = parse(&MIN.replace("nvml = false", "nvml = true\ngpus = [0, \"GPU-abc\"]")).unwrap();
        assert_eq!(v.instances[0].gpus, vec![GpuRef::Index(0), GpuRef::Uuid("GPU-abc".into())]);
    }

    /// `MIN` with `lines` added to the instance (before any table of it).
    fn with(lines: &str) -> String {
        format!("{MIN}{lines}\n")
    }

    #[test]
    fn custom_server_takes_its_names_from_the_mapping() {
        let v = parse(&with(
            "server = \"custom\"\n[instances.metrics]\nrunning = \"tgi_batch_current_size\"\nwaiting = \"tgi_queue_size\"",
        ))
        .unwrap();
        let n = &v.instances[0].names;
        assert_eq!((n.running.as_str(), n.waiting.as_str()), ("tgi_batch_current_size", "tgi_queue_size"));
        assert!(n.kv_cache_usage.is_empty() && n.gpu.is_none() && n.kv_capacity == KvCapacity::None, "{n:?}");
        // vLLM keeps its names; the table overrides one of them.
        let v = parse(&with("[instances.metrics]\nkv_cache_usage = \"vllm:gpu_cache_usage_perc\"")).unwrap();
        let n = &v.instances[0].names;
        assert_eq!(n.running, "vllm:num_requests_running");
        assert_eq!(n.kv_cache_usage, vec!["vllm:gpu_cache_usage_perc".to_string()]);
    }

    #[test]
    fn kv_bytes_per_token_reads_the_servers_capacity() {
        let v = parse(&with("kv_bytes_per_token = 131072")).unwrap();
        assert_eq!(v.instances[0].kv_bytes_per_token, Some(131072));
        assert_eq!(v.instances[0].names.kv_capacity, KvCapacity::VllmCacheConfig);
        let v = parse(&with("server = \"sglang\"\nkv_bytes_per_token = 131072")).unwrap();
        assert_eq!(v.instances[0].names.kv_capacity, KvCapacity::SglangTokens);
        assert_eq!(v.instances[0].names.running, "sglang:num_running_reqs");
        // Without it, no capacity is read (and no reason is logged for it).
        assert_eq!(parse(MIN).unwrap().instances[0].names.kv_capacity, KvCapacity::None);
    }

    #[test]
    fn dcgm_and_triton_gauges_map_with_their_units() {
        let v = parse(&with(
            "[instances.metrics]\nmemory_free = \"DCGM_FI_DEV_FB_FREE\"\nmemory_unit = \"MiB\"\n\
             gpu_util = \"DCGM_FI_DEV_GPU_UTIL\"\ngpu_util_unit = \"percent\"\n\
             [instances.metrics.gpu_labels]\ngpu = [\"0\", \"1\"]",
        ))
        .unwrap();
        let g = v.instances[0].names.gpu.clone().expect("gpu metrics");
        assert_eq!(g.memory_free.as_deref(), Some("DCGM_FI_DEV_FB_FREE"));
        assert_eq!((g.memory_unit, g.util_unit), (MemoryUnit::MiB, UtilUnit::Percent));
        assert_eq!(g.labels, vec![("gpu".to_string(), vec!["0".to_string(), "1".to_string()])]);
        let v = parse(&with(
            "[instances.metrics]\nmemory_total = \"nv_gpu_memory_total_bytes\"\n\
             memory_used = \"nv_gpu_memory_used_bytes\"\nmemory_unit = \"bytes\"\n\
             gpu_util = \"nv_gpu_utilization\"\ngpu_util_unit = \"fraction\"",
        ))
        .unwrap();
        let g = v.instances[0].names.gpu.clone().expect("gpu metrics");
        assert_eq!((g.memory_unit, g.util_unit, g.memory_free), (MemoryUnit::Bytes, UtilUnit::Fraction, None));
    }

    #[test]
    fn bad_mappings_name_the_field_and_value() {
        let cases: &[(&str, &str, &str)] = &[
            ("server = \"custom\"", "instances[0].metrics.running", "(none)"),
            ("server = \"custom\"\n[instances.metrics]\nrunning = \"r\"", "instances[0].metrics.waiting", "(none)"),
            ("[instances.metrics]\nrunning = \"bad name\"", "instances[0].metrics.running", "bad name"),
            ("[instances.metrics]\ngpu_util = \"9lives\"", "instances[0].metrics.gpu_util", "9lives"),
            (
                "[instances.metrics]\nmemory_free = \"DCGM_FI_DEV_FB_FREE\"",
                "instances[0].metrics.memory_unit",
                "(none)",
            ),
            (
                "[instances.metrics]\nmemory_free = \"m\"\nmemory_unit = \"MB\"",
                "instances[0].metrics.memory_unit",
                "MB",
            ),
            ("[instances.metrics]\nmemory_unit = \"MiB\"", "instances[0].metrics.memory_unit", "MiB"),
            ("[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"%\"", "instances[0].metrics.gpu_util_unit", "%"),
            ("[instances.metrics]\ngpu_util = \"u\"", "instances[0].metrics.gpu_util_unit", "(none)"),
            (
                "[instances.metrics]\nmemory_used = \"u\"\nmemory_unit = \"MiB\"",
                "instances[0].metrics.memory_used",
                "u",
            ),
            (
                "[instances.metrics]\nmemory_free = \"f\"\nmemory_total = \"t\"\nmemory_used = \"u\"\n\
                 memory_unit = \"MiB\"",
                "instances[0].metrics.memory_used",
                "u",
            ),
            ("[instances.metrics.gpu_labels]\ngpu = [\"0\"]", "instances[0].metrics.gpu_labels.gpu", "0"),
            (
                "[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"percent\"\n\
                 [instances.metrics.gpu_labels]\ngpu = []",
                "instances[0].metrics.gpu_labels.gpu",
                "[]",
            ),
            ("kv_bytes_per_token = 0", "instances[0].kv_bytes_per_token", "0"),
            ("kv_bytes_per_token = 999999999999", "instances[0].kv_bytes_per_token", "999999999999"),
            (
                "server = \"custom\"\nkv_bytes_per_token = 2\n[instances.metrics]\nrunning = \"r\"\nwaiting = \"w\"",
                "instances[0].kv_bytes_per_token",
                "2",
            ),
            (
                "kv_bytes_per_token = 2\n[instances.metrics]\nmemory_free = \"f\"\nmemory_unit = \"MiB\"",
                "instances[0].kv_bytes_per_token",
                "2",
            ),
        ];
        for (lines, field, value) in cases {
            let e = parse(&with(lines)).expect_err(lines);
            assert!(e.contains(&format!("`{field}`")) && e.contains(value), "{lines}: {e}");
        }
        // With NVML on, memory and utilisation come from NVML only.
        let on = MIN.replace("nvml = false", "nvml = true\ngpus = [0]");
        let e = parse(&format!("{on}kv_bytes_per_token = 131072\n")).unwrap_err();
        assert!(
            e.contains("`instances[0].kv_bytes_per_token`") && e.contains("131072") && e.contains("nvml = false"),
            "{e}"
        );
        let e =
            parse(&format!("{on}[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"percent\"\n")).unwrap_err();
        assert!(e.contains("`instances[0].metrics.gpu_util`"), "{e}");
        // Unknown keys in the table are refused.
        assert!(parse(&with("[instances.metrics]\nrunnning = \"r\"")).is_err());
        assert!(parse(&with("server = \"tgi\"")).is_err());
    }
}
