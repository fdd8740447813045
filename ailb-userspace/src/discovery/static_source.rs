//! The static source: the config's `[[backends]]`, turned into instances that declare the
//! contract's keys typed, so that the policy treats them like registry instances.

use std::{collections::BTreeMap, net::SocketAddr};

use super::{Instance, Snapshot};
use crate::{
    metadata::{Declared, InstanceMetadata},
    telemetry::instance::ValidInstance,
};

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
}

pub fn from_static(backends: &[StaticBackend]) -> Snapshot {
    from_static_sampled(backends, &BTreeMap::new())
}

/// [`from_static`] where the backends of `sampled` (by index) carry their sampled metadata
/// instead of the declared one.
pub fn from_static_sampled(backends: &[StaticBackend], sampled: &BTreeMap<usize, InstanceMetadata>) -> Snapshot {
    Snapshot {
        instances: backends
            .iter()
            .enumerate()
            .map(|(i, b)| Instance {
                model: b.model.clone(),
                service: "static".to_string(),
                group: String::new(),
                cluster: b.cluster.clone(),
                address: b.address,
                weight: b.weight as f64,
                healthy: b.healthy,
                enabled: true,
                metadata: sampled.get(&i).cloned().unwrap_or_else(|| {
                    InstanceMetadata::declared(Declared {
                        model_id: &b.model,
                        gpu_type: b.gpu_type.as_deref(),
                        free_memory_mb: b.free_memory_mb,
                        max_inflight: (b.max_inflight > 0).then_some(b.max_inflight),
                    })
                }),
            })
            .collect(),
        services: Vec::new(),
    }
}
