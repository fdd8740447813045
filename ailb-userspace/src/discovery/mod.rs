//! Where backends come from. Output: an immutable [`Snapshot`] of instances with their
//! registry flags and metadata, as the source reported it and typed by the metadata contract
//! ([`crate::metadata`]): deciding eligibility is the policy's job.

pub mod local;
pub mod nacos;
pub mod source;
mod static_backend;
mod static_source;

use std::net::SocketAddr;

pub use source::{DiscoverySettings, SnapshotSource, SourceError, ValidSource};
pub use static_backend::StaticBackend;
pub use static_source::{from_static, from_static_sampled, StaticSource};

use crate::metadata::InstanceMetadata;

/// One backend instance as discovered, before any policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// The catalog model whose service listed this instance.
    pub model: String,
    /// Registry service name (`"static"` for the static source).
    pub service: String,
    pub group: String,
    pub cluster: String,
    pub address: SocketAddr,
    /// Registry weight (Nacos: a float, default 1.0; static: the configured integer).
    pub weight: f64,
    pub healthy: bool,
    pub enabled: bool,
    /// Metadata, keys as documented in `docs/metadata.md`: the strings as reported and the
    /// contract's keys typed.
    pub metadata: InstanceMetadata,
}

/// Per registry service: what the registry said about the service as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    pub model: String,
    pub service: String,
    /// Nacos' protection threshold was reached: it returned all instances, healthy or not.
    pub reach_protection_threshold: bool,
}

/// Everything the policy needs to know about the fleet at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    pub instances: Vec<Instance>,
    pub services: Vec<ServiceInfo>,
}

/// The source that `settings` names, ready to read. The one place that tells the kinds of
/// source apart: a new kind is its [`SnapshotSource`] in a file of this module, its
/// [`ValidSource`] variant (validated by `config`) and an arm here.
///
/// Nacos: a refused login or an unreadable CA file stops start-up; unreachable servers do not
/// (the daemon starts fail-static and keeps reading).
pub async fn open(settings: &DiscoverySettings) -> Result<Box<dyn SnapshotSource>, SourceError> {
    Ok(match &settings.source {
        ValidSource::Static => Box::new(StaticSource::new(settings)?),
        ValidSource::Nacos(n) => Box::new(nacos::NacosAdapter::connect(n, &settings.catalog).await?),
    })
}

#[cfg(test)]
impl Instance {
    /// A healthy, enabled instance of model `m` (service `m`, default group and cluster) at
    /// `10.0.0.i:8000` with this metadata: the fixture of the policy's and explain's tests.
    pub(crate) fn test(i: u8, meta: &[(&str, &str)]) -> Self {
        Instance {
            model: "m".into(),
            service: "m".into(),
            group: "DEFAULT_GROUP".into(),
            cluster: "DEFAULT".into(),
            address: SocketAddr::new([10, 0, 0, i].into(), 8000),
            weight: 1.0,
            healthy: true,
            enabled: true,
            metadata: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }
}
