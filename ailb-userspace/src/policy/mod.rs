//! Pure policy: `(Snapshot, config) -> per model, per backend {eligible, weight, cap, reason}`.
//! This issue implements the static part (health, configured weight, cap, free memory);
//! the AI-aware factors (GPU utilisation, load, memory fit against the model) plug in here.

use std::{collections::BTreeMap, net::SocketAddrV4};

use crate::{config::ValidConfig, discovery::Snapshot};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBackend {
    pub address: SocketAddrV4,
    pub weight: u32,
    pub cap: u32,
    /// `None`: unknown (fits every memory hint).
    pub free_memory_mb: Option<u32>,
    pub eligible: bool,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelPlan {
    pub vips: Vec<SocketAddrV4>,
    /// Sorted by address, so that equal inputs give equal plans whatever their order.
    pub backends: Vec<PlannedBackend>,
}

/// Model name -> plan.
pub type Plan = BTreeMap<String, ModelPlan>;

pub fn plan(snapshot: &Snapshot, config: &ValidConfig) -> Plan {
    let mut plan: Plan = config
        .services
        .iter()
        .map(|(model, vips)| {
            (model.clone(), ModelPlan { vips: vips.iter().map(|s| s.vip).collect(), backends: Vec::new() })
        })
        .collect();
    for inst in &snapshot.instances {
        let Some(model) = plan.get_mut(&inst.model) else {
            continue; // validation rejects this for the static source
        };
        let (eligible, reason) = if !inst.healthy {
            (false, "unhealthy".to_string())
        } else if inst.weight == 0 {
            (false, "weight 0 (drained)".to_string())
        } else {
            (true, format!("healthy, weight {}", inst.weight))
        };
        model.backends.push(PlannedBackend {
            address: inst.address,
            weight: if eligible { inst.weight } else { 0 },
            cap: inst.max_inflight,
            free_memory_mb: inst.free_memory_mb,
            eligible,
            reason,
        });
    }
    for m in plan.values_mut() {
        m.backends.sort_by_key(|b| (u32::from(*b.address.ip()), b.address.port()));
        m.vips.sort_by_key(|v| (u32::from(*v.ip()), v.port()));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, discovery::from_static};

    #[test]
    fn order_of_instances_does_not_matter_and_unhealthy_is_excluded() {
        let text = r#"
[[services]]
model = "m"
vip = "127.77.0.1:8000"
[[backends]]
model = "m"
address = "127.0.0.12:1"
weight = 3
[[backends]]
model = "m"
address = "127.0.0.11:1"
healthy = false
"#;
        let cfg = Config::parse(text, "t").unwrap().validate().unwrap();
        let mut snap = from_static(&cfg);
        let p1 = plan(&snap, &cfg);
        snap.instances.reverse();
        assert_eq!(p1, plan(&snap, &cfg));
        let m = &p1["m"];
        assert_eq!(m.backends[0].address.to_string(), "127.0.0.11:1");
        assert!(!m.backends[0].eligible && m.backends[0].weight == 0);
        assert!(m.backends[1].eligible && m.backends[1].weight == 3);
    }
}
