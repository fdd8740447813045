//! The static source: the config's `[[backends]]`, turned into instances that declare the
//! contract's keys typed, so that the policy treats them like registry instances; those with a
//! `metrics_url` are sampled on every read ([`StaticSource`]).

use std::{collections::BTreeMap, time::Duration};

use super::{
    local::LocalTelemetry,
    source::{BoxFuture, DiscoverySettings, SnapshotSource, SourceError, ValidSource},
    static_backend::StaticBackend,
    Instance, Snapshot,
};
use crate::metadata::{Declared, InstanceMetadata};

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
                metadata: static_metadata(i, b, sampled),
            })
            .collect(),
        services: Vec::new(),
    }
}

/// Backend `i`'s metadata: sampled, or declared; with its KV-event publisher either way.
fn static_metadata(i: usize, b: &StaticBackend, sampled: &BTreeMap<usize, InstanceMetadata>) -> InstanceMetadata {
    let metadata = sampled.get(&i).cloned().unwrap_or_else(|| {
        InstanceMetadata::declared(Declared {
            model_id: &b.model,
            gpu_type: b.gpu_type.as_deref(),
            free_memory_mb: b.free_memory_mb,
            max_inflight: (b.max_inflight > 0).then_some(b.max_inflight),
        })
    });
    match &b.kv_events {
        Some(source) => metadata.with_kv_events(source),
        None => metadata,
    }
}

/// The config's `[[backends]]` as a [`SnapshotSource`]; those with a `metrics_url` sampled on
/// every read.
pub struct StaticSource {
    settings: DiscoverySettings,
    local: Option<LocalTelemetry>,
}

impl StaticSource {
    /// Opens NVML when a backend names GPUs (its absence is then a start-up error).
    pub fn new(settings: &DiscoverySettings) -> Result<Self, SourceError> {
        let s = settings;
        let local = LocalTelemetry::new(&s.backends, s.nvml_library.as_deref(), s.sample_interval, None)
            .map_err(SourceError::Local)?;
        Ok(Self { settings: settings.clone(), local })
    }
}

impl SnapshotSource for StaticSource {
    fn discover(&mut self) -> BoxFuture<'_, Result<Snapshot, SourceError>> {
        Box::pin(async move {
            let sampled = match &mut self.local {
                Some(l) => l.sample().await,
                None => Default::default(),
            };
            Ok(from_static_sampled(&self.settings.backends, &sampled))
        })
    }
    /// Sampled backends are read every `daemon.sample_interval`; declared ones only at start
    /// and on reload.
    fn poll_interval(&self) -> Option<Duration> {
        self.local.as_ref().map(|_| self.settings.sample_interval)
    }
    fn reconfigure(&mut self, settings: &DiscoverySettings) -> Result<(), SourceError> {
        if settings.source != ValidSource::Static {
            return Err(SourceError::SwitchSource { from: "static", to: settings.source.kind() });
        }
        let s = settings;
        let nvml = self.local.as_ref().and_then(LocalTelemetry::nvml);
        self.local = LocalTelemetry::new(&s.backends, s.nvml_library.as_deref(), s.sample_interval, nvml)
            .map_err(SourceError::Local)?;
        self.settings = settings.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
