//! The static source: the config's `[[backends]]`, turned into instances with the metadata
//! keys of the contract so that the policy treats them like registry instances.

use std::collections::BTreeMap;

use super::{Instance, Snapshot};
use crate::config::ValidConfig;

pub fn from_static(config: &ValidConfig) -> Snapshot {
    Snapshot {
        instances: config
            .backends
            .iter()
            .map(|b| {
                let mut metadata = BTreeMap::new();
                metadata.insert("model_id".to_string(), b.model.clone());
                if let Some(g) = &b.gpu_type {
                    metadata.insert("gpu_type".to_string(), g.clone());
                }
                if let Some(m) = b.free_memory_mb {
                    metadata.insert("remaining_memory_mb".to_string(), m.to_string());
                }
                if b.max_inflight > 0 {
                    metadata.insert("max_inflight".to_string(), b.max_inflight.to_string());
                }
                Instance {
                    model: b.model.clone(),
                    service: "static".to_string(),
                    group: String::new(),
                    cluster: String::new(),
                    address: b.address,
                    weight: b.weight as f64,
                    healthy: b.healthy,
                    enabled: true,
                    metadata,
                }
            })
            .collect(),
        services: Vec::new(),
    }
}
