//! Pure policy: `(Snapshot, config, previous state) -> per model, per backend
//! {eligible, weight, cap, reason}`. Deterministic: equal inputs give equal plans whatever
//! the order of the instances.

use std::{collections::BTreeMap, net::SocketAddrV4, time::Duration};

use serde::Deserialize;

use crate::{
    config::{ConfigError, ValidConfig, MAX_WEIGHT},
    discovery::Snapshot,
};

/// `[policy]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Relative weight change below which a model's table is not rebuilt. Default 0.1.
    #[serde(default = "default_min_change")]
    pub min_weight_change: f64,
}

fn default_min_change() -> f64 {
    0.1
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self { min_weight_change: default_min_change() }
    }
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..1.0).contains(&self.min_weight_change) {
            return Err(ConfigError::invalid("policy.min_weight_change", self.min_weight_change, "must be in [0, 1)"));
        }
        Ok(())
    }
}

/// What the policy remembers between plans (smoothing, hysteresis, last weights).
#[derive(Debug, Clone, Default)]
pub struct PolicyState {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedBackend {
    pub address: SocketAddrV4,
    /// Table weight, 0..=65535 (0 when not eligible).
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
    pub affinity_ttl: Option<Duration>,
}

/// Model name -> plan.
pub type Plan = BTreeMap<String, ModelPlan>;

pub fn plan(snapshot: &Snapshot, config: &ValidConfig, _state: &mut PolicyState) -> Plan {
    let mut plan: Plan = config
        .models
        .iter()
        .map(|(name, m)| {
            (name.clone(), ModelPlan { vips: m.vips.clone(), backends: Vec::new(), affinity_ttl: m.affinity_ttl })
        })
        .collect();
    for inst in &snapshot.instances {
        let Some(model) = plan.get_mut(&inst.model) else {
            continue;
        };
        let weight = inst.weight.round().clamp(0.0, MAX_WEIGHT as f64) as u32;
        let (eligible, reason) = if !inst.healthy {
            (false, "unhealthy".to_string())
        } else if !inst.enabled {
            (false, "disabled".to_string())
        } else if weight == 0 {
            (false, "weight 0 (drained)".to_string())
        } else {
            (true, format!("healthy, weight {weight}"))
        };
        let meta_u32 = |k: &str| inst.metadata.get(k).and_then(|v| v.trim().parse::<u32>().ok());
        model.backends.push(PlannedBackend {
            address: inst.address,
            weight: if eligible { weight } else { 0 },
            cap: meta_u32("max_inflight").unwrap_or(0),
            free_memory_mb: meta_u32("remaining_memory_mb"),
            eligible,
            reason,
        });
    }
    for m in plan.values_mut() {
        m.backends.sort_by_key(|b| (u32::from(*b.address.ip()), b.address.port()));
        m.backends.dedup_by_key(|b| b.address);
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
        let p1 = plan(&snap, &cfg, &mut PolicyState::default());
        snap.instances.reverse();
        assert_eq!(p1, plan(&snap, &cfg, &mut PolicyState::default()));
        let m = &p1["m"];
        assert_eq!(m.backends[0].address.to_string(), "127.0.0.11:1");
        assert!(!m.backends[0].eligible && m.backends[0].weight == 0);
        assert!(m.backends[1].eligible && m.backends[1].weight == 3);
    }
}
