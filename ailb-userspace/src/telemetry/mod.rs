//! Telemetry of one GPU node, read by `ailb agent`: NVML (GPU memory and utilisation) and the
//! model server's Prometheus metrics (running / waiting requests, KV-cache usage) and health.
//! Sources are async only at their I/O edge; the types here are plain data.

mod error;
pub(crate) mod exposition;
pub mod instance;
pub mod model_server;
pub mod nvml;
pub mod source;

pub use error::TelemetryError;

/// One sample of one instance: its GPUs (empty without NVML) and its model server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeSample {
    pub gpus: Vec<GpuSample>,
    pub server: ServerSample,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_mb: u64,
    pub memory_free_mb: u64,
    pub memory_used_mb: u64,
    /// GPU utilisation, 0..=100 %.
    pub util_pct: u32,
}

/// What a model server's metrics and health endpoint said.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct ServerSample {
    /// Requests being processed (vLLM `vllm:num_requests_running`, SGLang `sglang:num_running_reqs`).
    pub running: Option<f64>,
    /// Requests waiting (vLLM `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`).
    pub waiting: Option<f64>,
    /// KV-cache usage 0..=1 (vLLM `vllm:kv_cache_usage_perc` / `vllm:gpu_cache_usage_perc`,
    /// SGLang `sglang:token_usage`).
    pub kv_cache_usage: Option<f64>,
    /// Share of prompt tokens served from the prefix cache, 0..=1: SGLang's gauge as read, or,
    /// from vLLM's counters, over the window since the sampler's previous scrape
    /// ([`source::NodeSource`] keeps the window).
    pub prefix_cache_hit_rate: Option<f64>,
    /// The prefix cache's cumulative counters (hit tokens, queried tokens), when the server
    /// exports counters rather than a rate (vLLM).
    pub prefix_cache_counters: Option<(f64, f64)>,
    /// Prompt tokens per second the server was sent (looked up in its prefix cache), smoothed
    /// over the sampler's prompt-rate window ([`source::NodeSource`] keeps it; vLLM only).
    pub prompt_tokens_per_s: Option<f64>,
    /// The KV cache's capacity in tokens (vLLM: `num_gpu_blocks x block_size` of
    /// `vllm:cache_config_info`, summed over engines; SGLang: `sglang:max_total_num_tokens`),
    /// when the server exports it.
    pub kv_capacity_tokens: Option<f64>,
    /// Whether the health endpoint answered 2xx.
    pub healthy: bool,
    /// Not healthy because the health probe or the scrape got no answer within the timeout:
    /// the server may be slow (a loaded machine) or hung, but it accepted the connection or
    /// may yet; unlike a refused connection or an error answer, it is not known to be down.
    pub timed_out: bool,
    /// Free KV-cache capacity in tokens, when asked for ([`model_server::KvCapacity`]).
    pub kv_free_tokens: Option<f64>,
    /// Free GPU memory, MiB, from mapped gauges ([`model_server::GpuMetrics`]).
    pub memory_free_mb: Option<f64>,
    /// Total GPU memory, MiB, from mapped gauges.
    pub memory_total_mb: Option<f64>,
    /// GPU utilisation, 0..=100 %, from a mapped gauge.
    pub gpu_util_pct: Option<f64>,
    /// Why a value asked for (KV capacity, mapped GPU gauges) is not known in this scrape, one
    /// line each.
    pub unknown: Vec<String>,
}
