//! The static source: the config's `[[backends]]`, turned into instances that declare the
//! contract's keys typed, so that the policy treats them like registry instances.

use super::{Instance, Snapshot};
use crate::{
    config::ValidConfig,
    policy::metadata::{Declared, InstanceMetadata},
};

pub fn from_static(config: &ValidConfig) -> Snapshot {
    Snapshot {
        instances: config
            .backends
            .iter()
            .map(|b| Instance {
                model: b.model.clone(),
                service: "static".to_string(),
                group: String::new(),
                cluster: String::new(),
                address: b.address,
                weight: b.weight as f64,
                healthy: b.healthy,
                enabled: true,
                metadata: InstanceMetadata::declared(Declared {
                    model_id: &b.model,
                    gpu_type: b.gpu_type.as_deref(),
                    free_memory_mb: b.free_memory_mb,
                    max_inflight: (b.max_inflight > 0).then_some(b.max_inflight),
                }),
            })
            .collect(),
        services: Vec::new(),
    }
}
