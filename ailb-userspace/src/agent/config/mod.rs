//! `ailb agent --config FILE`: serde types with documented defaults and their validation.
//!
//! ```toml
//! publish_interval = "500ms"   # how often telemetry is sampled; a write only when a value moved
//! heartbeat_interval = "5s"    # Nacos beats for ephemeral instances
//! drain_timeout = "30s"        # SIGTERM: longest wait for in-flight requests to finish
//! probe_timeout = "1s"         # each scrape and health probe of a model server
//! prompt_rate_window = "30s"   # prompt tokens/s smoothed over this (the prefix lifetime's input)
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
//! prompt_rate = 0.1            # prompt tokens/s and KV capacity: a share of the last published
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
//! # kv_events = "tcp://*:5557"  # optional: the engine's KV-event publisher (vLLM's --kv-events-config
//! #                             # endpoint; `*` is published as `ip`), for gateways with prefix = "precise"
//! # kv_replay = "tcp://*:5558"  # optional: its replay_endpoint
//! # kv_block_size = 16          # required with kv_events: the engine's --block-size
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

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

pub use crate::{
    metadata::values::Thresholds,
    telemetry::instance::{GpuRef, InstanceConfig, MetricsConfig, ServerKind, ValidInstance},
};
use crate::{
    nacos::{NacosConfig, ValidNacos},
    telemetry::instance::check_instance,
    validate::{parse_duration, ConfigError},
};

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
    /// How long `prompt_tokens_per_s` is smoothed over (an exponential average). Default
    /// `"30s"`, 100ms to 10m.
    #[serde(default = "default_prompt_rate_window")]
    pub prompt_rate_window: String,
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
fn default_prompt_rate_window() -> String {
    humantime::format_duration(crate::telemetry::source::DEFAULT_PROMPT_RATE_WINDOW).to_string()
}
fn default_failure_threshold() -> u32 {
    3
}

/// A validated agent config.
#[derive(Debug, Clone)]
pub struct ValidAgent {
    pub nacos: ValidNacos,
    pub publish_interval: Duration,
    pub heartbeat_interval: Duration,
    pub drain_timeout: Duration,
    pub probe_timeout: Duration,
    pub prompt_rate_window: Duration,
    pub health_failure_threshold: u32,
    pub listen: Option<SocketAddr>,
    pub thresholds: Thresholds,
    pub nvml_library: Option<PathBuf>,
    pub instances: Vec<ValidInstance>,
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
        let prompt_rate_window = duration(
            "prompt_rate_window",
            &self.prompt_rate_window,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
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
            prompt_rate_window,
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
        ("thresholds.prompt_rate", t.prompt_rate, 10.0),
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

#[cfg(test)]
mod tests;
