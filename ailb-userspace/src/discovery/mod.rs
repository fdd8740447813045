//! Where backends come from. Output: an immutable [`Snapshot`]. This source is the
//! static config (the embedded default or `--config FILE`); Nacos comes next behind the same
//! type.

use std::net::SocketAddrV4;

use crate::config::ValidConfig;

/// One backend instance as discovered, before any policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub model: String,
    pub address: SocketAddrV4,
    /// Registry / config weight, 0..=65535.
    pub weight: u32,
    pub gpu_type: Option<String>,
    pub free_memory_mb: Option<u32>,
    pub max_inflight: u32,
    pub healthy: bool,
}

/// Everything a policy needs to know about the fleet at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub instances: Vec<Instance>,
}

/// The static source: the config's `[[backends]]`.
pub fn from_static(config: &ValidConfig) -> Snapshot {
    Snapshot {
        instances: config
            .backends
            .iter()
            .map(|b| Instance {
                model: b.model.clone(),
                address: b.address,
                weight: b.weight,
                gpu_type: b.gpu_type.clone(),
                free_memory_mb: b.free_memory_mb,
                max_inflight: b.max_inflight,
                healthy: b.healthy,
            })
            .collect(),
    }
}
