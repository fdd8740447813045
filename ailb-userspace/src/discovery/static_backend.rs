//! The static source's input: one `[[backends]]` entry of the config, validated. A file of its
//! own so that the sampler of live telemetry (`local.rs`) and the source (`static_source.rs`)
//! both use it without using each other.

use std::net::SocketAddr;

use crate::telemetry::instance::ValidInstance;

/// One `[[backends]]` entry of the config, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticBackend {
    pub model: String,
    pub address: SocketAddr,
    pub weight: u32,
    pub gpu_type: Option<String>,
    pub free_memory_mb: Option<u32>,
    pub max_inflight: u32,
    pub healthy: bool,
    /// Its cluster (`""`: none), for the gateway's cluster preference.
    pub cluster: String,
    /// Live telemetry sampled by the daemon (`metrics_url`, `gpus`), as an agent's instance.
    pub telemetry: Option<Box<ValidInstance>>,
    /// The engine's KV-event publisher (`kv_events`, `kv_replay`, `kv_block_size`).
    pub kv_events: Option<crate::kv_events::EventSource>,
}
