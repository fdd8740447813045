//! Configuration: serde types with documented defaults, and a separate [`Config::validate`]
//! that turns them into a [`ValidConfig`] or an [`ConfigError::InvalidValue`] naming the field
//! and the value. A bad config stops start-up; on reload the previous config stays.

pub mod gateway;
mod limits;
mod tc;
mod validate;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::validate::ConfigError;

pub use limits::LimitsConfig;
pub use tc::TcSettings;
pub use validate::{ValidConfig, ValidModel};

/// The embedded default (a loopback demo attached to the child cgroup `ailb-demo`).
pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: DaemonConfig,
    #[serde(default)]
    pub balancer: BalancerConfig,
    /// The model catalog.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Shorthand for a model VIP: `{ model, vip }` (adds the model to the catalog if absent).
    #[serde(default)]
    pub services: Vec<ServiceConfig>,
    /// The static source's backends (only with `discovery.source = "static"`).
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub discovery: DiscoveryConfig,
    #[serde(default)]
    pub policy: crate::policy::PolicyConfig,
    /// The front door's `[gateway]` (`ailb gateway`); `ailb run` does not use it.
    #[serde(default)]
    pub gateway: gateway::GatewayConfig,
    /// The kernel's table and member arenas.
    #[serde(default)]
    pub limits: LimitsConfig,
}

/// One model of the catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    /// The model's VIPs ("ip:port"); more can come from `[[services]]`.
    #[serde(default)]
    pub vips: Vec<String>,
    /// GPU memory (MB) a backend must have free to be eligible; absent: no requirement.
    #[serde(default)]
    pub required_memory_mb: Option<u32>,
    /// Only instances whose `model_version` metadata equals this are eligible.
    #[serde(default)]
    pub model_version: Option<String>,
    /// This model's affinity TTL (e.g. "10m"); absent: `balancer.affinity_ttl`.
    #[serde(default)]
    pub affinity_ttl: Option<String>,
    /// Nacos services that serve this model; default: `[name]`.
    #[serde(default)]
    pub nacos_services: Vec<String>,
    /// In-flight requests one backend of this model serves well (1..=1e6), for backends that
    /// report no `max_inflight`: their capacity in the cluster spill rule and the autoscaling
    /// gauges. Absent: such backends have no capacity.
    #[serde(default)]
    pub backend_capacity: Option<u32>,
    /// This model's `[policy] spill_saturation`.
    #[serde(default)]
    pub spill_saturation: Option<f64>,
    /// Remote clients (the TC datapath): "client_address" keeps each client address on its
    /// backend (as IPVS persistence, for `balancer.affinity_ttl`), "none" (default) places
    /// every connection afresh.
    #[serde(default)]
    pub remote_affinity: Option<String>,
    /// How the kernel's prefix map learns which backend has a prompt prefix cached: "off"
    /// (default), "approximate" (from the picks themselves) or "precise" (from the engines'
    /// KV events).
    #[serde(default)]
    pub prefix: Option<String>,
    /// How long a learnt entry (approximate mode) or a backend whose engine evicted the block
    /// (precise mode: a weaker holder) counts, e.g. "60s", the default; "0s": a learnt entry
    /// until the map evicts it, an evicted holder not at all.
    #[serde(default)]
    pub prefix_ttl: Option<String>,
    /// The lifetime as this many times the longest time the model's KV caches take to fill
    /// with the prompt tokens they are sent (from the agents' `kv_cache_capacity_tokens` and
    /// `prompt_tokens_per_s`), capped at `prefix_ttl`; default 1.25, 0 to 100; 0: `prefix_ttl`
    /// as it is.
    #[serde(default)]
    pub prefix_ttl_fill: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// `[[backends]]` of this file (the embedded default).
    #[default]
    Static,
    Nacos,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    #[serde(default)]
    pub source: SourceKind,
    #[serde(default)]
    pub nacos: Option<crate::nacos::NacosConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Directory in bpffs where maps and links are pinned. Default `/sys/fs/bpf/ailb`.
    #[serde(default = "default_bpffs")]
    pub bpffs: PathBuf,
    /// cgroup whose processes are balanced: a path relative to the cgroup2 mount (created
    /// if missing), an absolute path, or `"/"` for the cgroup2 root (a real gateway).
    /// Default `ailb`: a child cgroup, so that nothing is balanced by accident.
    #[serde(default = "default_cgroup")]
    pub cgroup: String,
    /// Address of the HTTP endpoint (`/metrics`, `/v1/plan`), e.g. "127.0.0.1:9464"; absent: off.
    #[serde(default)]
    pub listen: Option<String>,
    /// How often backends with a `metrics_url` are sampled, 50ms to 60s. Default "500ms" (the
    /// agent's `publish_interval`).
    #[serde(default = "default_sample_interval")]
    pub sample_interval: String,
    /// The NVML library for backends with `gpus`; default `libnvidia-ml.so.1` on the loader's
    /// path. Opened at start-up only when a backend names GPUs; missing: a start-up error.
    #[serde(default)]
    pub nvml_library: Option<PathBuf>,
    /// The gateway's own cluster: the backends of this cluster (Nacos `clusterName`, a static
    /// backend's `cluster`) serve each model while they can; others only as a spill. Absent:
    /// no preference.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Interfaces whose ingress runs the TC datapath for remote clients (tcx links, pinned
    /// under `links/tc-<name>`); none by default. Only interfaces of the daemon's own network
    /// namespace can be named.
    #[serde(default)]
    pub interfaces: Vec<String>,
    #[serde(default)]
    pub tc: TcSettings,
}

fn default_sample_interval() -> String {
    "500ms".to_string()
}

fn default_bpffs() -> PathBuf {
    PathBuf::from("/sys/fs/bpf/ailb")
}
fn default_cgroup() -> String {
    "ailb".to_string()
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            bpffs: default_bpffs(),
            cgroup: default_cgroup(),
            listen: None,
            sample_interval: default_sample_interval(),
            nvml_library: None,
            cluster: None,
            interfaces: Vec::new(),
            tc: TcSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalancerConfig {
    /// The load bound factor c in `ceil(c * (total + 1) * w / W)`. Default 1.25.
    #[serde(default = "default_load_factor")]
    pub load_factor: f64,
    /// The load bound factor of a backend holding the longest cached prefix of a request's
    /// prompt (models with `prefix`): it is taken while under `ceil(c * (total + 1) * w / W)`
    /// with this c, else the table's pick decides. Default: [`DEFAULT_PREFIX_LOAD_FACTOR`], or
    /// `load_factor` where that is larger (a holder is never held tighter than any backend).
    #[serde(default)]
    pub prefix_load_factor: Option<f64>,
    /// Table slots probed per connection, 1..=8. Default 4.
    #[serde(default = "default_probes")]
    pub probes: u32,
    /// Conversation affinity. Default on.
    #[serde(default = "yes")]
    pub affinity: bool,
    /// Bounded-load probing. Default on.
    #[serde(default = "yes")]
    pub load_bound: bool,
    /// Plain round robin over each model's live backends for connections that no affinity
    /// entry decides: weights, loads and memory hints are not used. A baseline for
    /// comparisons (`ailb-compare`), not for production. Default off.
    #[serde(default)]
    pub round_robin: bool,
    /// Affinity entries unused for longer are ignored; "0s" = never. Default "30m".
    #[serde(default = "default_ttl")]
    pub affinity_ttl: String,
    /// How long after a conversation's last connect or close a request of it still waits for
    /// its backend when that backend lacks the hinted memory now (its prefix is likely still
    /// cached there); "0s" = never wait. About the time the model servers' prefix cache keeps
    /// an idle conversation: KV pool tokens / prompt tokens per second. Default "20s".
    #[serde(default = "default_wait")]
    pub affinity_wait: String,
    /// Seed of the table layout; gateways that share it build identical tables. Default 0.
    #[serde(default)]
    pub seed: u64,
}

fn default_load_factor() -> f64 {
    1.25
}

/// `[balancer] prefix_load_factor`'s default (unless `load_factor` is larger). A holder spares
/// the request its cached prefill, and a request sent elsewhere caches the prompt a second
/// time: at the table's 1.25 the bound, one or two requests on a small fleet, passed holders
/// over on 2 % of the connects of the simulated shared-prefix race and 6 in 48 on two real
/// vLLM servers; at 2 the simulated race read more of its prompts from the caches and its
/// TTFT P95 fell (`docs/prefix.md` has the runs).
pub const DEFAULT_PREFIX_LOAD_FACTOR: f64 = 2.0;

fn default_probes() -> u32 {
    4
}
fn yes() -> bool {
    true
}
fn default_ttl() -> String {
    "30m".to_string()
}
fn default_wait() -> String {
    "20s".to_string()
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            load_factor: default_load_factor(),
            prefix_load_factor: None,
            probes: default_probes(),
            affinity: true,
            load_bound: true,
            round_robin: false,
            affinity_ttl: default_ttl(),
            affinity_wait: default_wait(),
            seed: 0,
        }
    }
}

/// A model's VIP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub model: String,
    pub vip: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub model: String,
    pub address: String,
    /// 0..=65535; 0 drains the backend. Default 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// Free GPU memory in MB; absent = unknown (fits every memory hint).
    #[serde(default)]
    pub free_memory_mb: Option<u32>,
    /// Hard cap on in-flight connections; 0 = none.
    #[serde(default)]
    pub max_inflight: u32,
    #[serde(default = "yes")]
    pub healthy: bool,
    /// The backend's cluster, for `daemon.cluster`; default none ("").
    #[serde(default)]
    pub cluster: Option<String>,
    /// Live telemetry of a backend on this node, sampled by `ailb run` itself every
    /// `daemon.sample_interval` as `ailb agent` samples its `[[instances]]` (no registry, no
    /// agent), with the meaning of the agent's keys of the same names. `metrics_url` turns it
    /// on: the model server's Prometheus metrics (running and waiting requests, KV cache).
    #[serde(default)]
    pub metrics_url: Option<String>,
    /// Health is a 2xx here; default: the metrics endpoint answering 2xx.
    #[serde(default)]
    pub health_url: Option<String>,
    /// NVML indices or UUIDs ("GPU-..."): free memory and utilisation from NVML. Default
    /// none: no NVML, memory from the metrics (`kv_bytes_per_token`, `[backends.metrics]`).
    #[serde(default)]
    pub gpus: Vec<crate::telemetry::instance::GpuRef>,
    /// `vllm` (default), `sglang` or `custom` (names from `[backends.metrics]`).
    #[serde(default)]
    pub server: Option<crate::telemetry::instance::ServerKind>,
    /// Without `gpus`: free KV cache x this = free memory.
    #[serde(default)]
    pub kv_bytes_per_token: Option<u64>,
    /// Metric names, as the agent's `[instances.metrics]`.
    #[serde(default)]
    pub metrics: Option<crate::telemetry::instance::MetricsConfig>,
    /// The engine's KV-event publisher, `tcp://HOST:PORT` (vLLM's `--kv-events-config`
    /// endpoint, with the engine's address for its `*`), for models with `prefix = "precise"`.
    #[serde(default)]
    pub kv_events: Option<String>,
    /// Its replay socket, `tcp://HOST:PORT` (vLLM's `replay_endpoint`); optional.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// The engine's KV-cache block size in tokens (vLLM's `--block-size`); required with
    /// `kv_events`.
    #[serde(default)]
    pub kv_block_size: Option<u32>,
}

fn default_weight() -> u32 {
    1
}

impl Config {
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { origin: origin.to_string(), source: Box::new(e) })
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn embedded_default() -> Self {
        Self::parse(DEFAULT_TOML, "<embedded default>").expect("the embedded default config parses")
    }
}

impl ValidConfig {
    /// What discovery reads: the source and its settings, the static backends, and the
    /// catalog's registry services per model.
    pub fn discovery(&self) -> crate::discovery::DiscoverySettings {
        crate::discovery::DiscoverySettings {
            source: self.source.clone(),
            backends: self.backends.clone(),
            sample_interval: self.sample_interval,
            nvml_library: self.nvml_library.clone(),
            catalog: self.models.iter().map(|(name, m)| (name.clone(), m.nacos_services.clone())).collect(),
        }
    }
}

/// Loads and validates: from `path`, or the embedded default.
pub fn load_valid(path: Option<&Path>) -> Result<ValidConfig, ConfigError> {
    let config = match path {
        Some(p) => Config::load(p)?,
        None => Config::embedded_default(),
    };
    config.validate()
}
