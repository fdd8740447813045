//! Live telemetry of static backends on this node, sampled by `ailb run` itself: one box with
//! its GPUs and model servers needs no registry and no agent. Each backend with a
//! `metrics_url` is sampled by the node sampler the agent uses ([`NodeSource`]: the model
//! server's metrics and, with `gpus`, NVML) and its values become metadata exactly as the agent
//! would publish them ([`publish::metadata`]), renewed only when a value moved past the agent's
//! default thresholds ([`publish::moved`]), so a steady node gives the same snapshot and the
//! daemon plans nothing.
//!
//! A failed sample never stops the daemon: the values it could not read are left out
//! (unknown), a server that does not answer is published unhealthy, and the reason is logged
//! when it starts, changes or clears.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tracing::{info, warn};

use super::StaticBackend;
use crate::{
    metadata::{
        keys, publish,
        values::{Thresholds, Values},
        InstanceMetadata,
    },
    telemetry::{
        instance::ValidInstance,
        model_server::ModelServerSource,
        nvml::NvmlSource,
        source::{NodeSource, Telemetry},
        TelemetryError,
    },
};

/// Why live telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A backend names GPUs and NVML could not be opened.
    #[error("backend {backend} names gpus: NVML is needed")]
    Nvml {
        backend: String,
        #[source]
        source: Box<TelemetryError>,
    },
    /// The HTTP client of a backend's scrapes could not be built.
    #[error("backend {backend}: metrics client")]
    Client {
        backend: String,
        #[source]
        source: Box<TelemetryError>,
    },
}

/// One sampled backend.
struct Sampled {
    /// Index in the config's `[[backends]]`.
    index: usize,
    inst: ValidInstance,
    max_inflight: u32,
    source: NodeSource,
    /// The values of the metadata now served, and when they were taken.
    published: Option<(Values, u64)>,
    /// The errors of the last sample, logged when they change.
    last_errors: Vec<String>,
}

/// The sampled backends of a config; one NVML handle shared by them.
pub struct LocalTelemetry {
    backends: Vec<Sampled>,
    nvml: Option<Arc<NvmlSource>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl LocalTelemetry {
    /// The sampled backends of `backends`; `None` when none has a `metrics_url`. NVML is opened
    /// (from `nvml_library`, else the loader's default) only when a backend names GPUs, or
    /// taken from `reuse` (a reload keeps the handle).
    pub fn new(
        backends: &[StaticBackend],
        nvml_library: Option<&Path>,
        interval: Duration,
        reuse: Option<Arc<NvmlSource>>,
    ) -> Result<Option<Self>, LocalError> {
        let mut nvml = reuse;
        // A hung model server must not hold the loop for more than about one interval.
        let timeout = interval.clamp(Duration::from_millis(100), Duration::from_secs(2));
        let mut out = Vec::new();
        for (index, b) in backends.iter().enumerate() {
            let Some(inst) = b.telemetry.as_deref() else { continue };
            let name = format!("{} {}", b.model, b.address);
            let gpus = if inst.nvml {
                let n = match &nvml {
                    Some(n) => n.clone(),
                    None => {
                        let n = NvmlSource::open(nvml_library)
                            .map_err(|e| LocalError::Nvml { backend: name.clone(), source: Box::new(e) })?;
                        info!(lib = n.lib(), "NVML opened for the backends' gpus");
                        let n = Arc::new(n);
                        nvml = Some(n.clone());
                        n
                    }
                };
                Some((n, inst.gpus.iter().map(NodeSource::selector).collect()))
            } else {
                None
            };
            let server = ModelServerSource::with_names(
                inst.metrics_url.clone(),
                inst.health_url.clone(),
                inst.names.clone(),
                timeout,
            )
            .map_err(|e| LocalError::Client { backend: name, source: Box::new(e) })?;
            out.push(Sampled {
                index,
                inst: inst.clone(),
                max_inflight: b.max_inflight,
                source: NodeSource::new(server, gpus),
                published: None,
                last_errors: Vec::new(),
            });
        }
        Ok((!out.is_empty()).then_some(Self { backends: out, nvml }))
    }

    /// The NVML handle, if one is open (kept across reloads).
    pub fn nvml(&self) -> Option<Arc<NvmlSource>> {
        self.nvml.clone()
    }

    /// Samples every backend (one after the other: a handful on one node, each bounded by its
    /// timeout) and returns the metadata of each sampled one by its `[[backends]]` index.
    pub async fn sample(&mut self) -> BTreeMap<usize, InstanceMetadata> {
        let t = Thresholds::default();
        let mut out = BTreeMap::new();
        for b in &mut self.backends {
            let sampled = b.source.sample().await;
            let errors: Vec<String> = sampled.errors.iter().map(|(s, e)| format!("{}: {e}", s.label())).collect();
            if errors != b.last_errors {
                if errors.is_empty() {
                    info!(backend = %b.inst.name(), "backend telemetry: sampled again");
                } else {
                    warn!(backend = %b.inst.name(), errors = %errors.join("; "), "backend telemetry: sample failed; the values it lacks are left out");
                }
                b.last_errors = errors;
            }
            let values = Values::derive(&sampled.sample, b.inst.kv_bytes_per_token, false);
            if publish::moved(b.published.as_ref().map(|(v, _)| v), &values, &t) {
                b.published = Some((values, now_ms()));
            }
            let (values, at) = b.published.as_ref().expect("set above");
            let mut map = publish::metadata(&b.inst, values, *at);
            if b.max_inflight > 0 {
                map.insert(keys::MAX_INFLIGHT.to_string(), b.max_inflight.to_string());
            }
            out.insert(b.index, InstanceMetadata::parse(map));
        }
        out
    }
}

#[cfg(test)]
mod tests;
