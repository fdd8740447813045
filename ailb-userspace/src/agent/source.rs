//! The agent's telemetry seam: [`Telemetry`] gives one [`NodeSample`] per call, with the
//! errors met on the way (each source fails alone: a failed scrape leaves the GPU values, a
//! failed NVML read leaves the server's). [`NodeSource`] is the real one: `telemetry::nvml` and
//! `telemetry::model_server`.

use std::{future::Future, sync::Arc};

use super::{config::GpuRef, publish::NodeSample};
use crate::{
    error_chain,
    telemetry::{
        model_server::ModelServerSource,
        nvml::{DeviceSelector, NvmlSource},
        ServerSample,
    },
};

/// Which source an error came from (a metric label: fixed names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    Nvml,
    Scrape,
    Nacos,
}

impl ErrorSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::Scrape => "scrape",
            Self::Nacos => "nacos",
        }
    }
}

/// A sample and what went wrong taking it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub sample: NodeSample,
    pub errors: Vec<(ErrorSource, String)>,
}

/// One instance's telemetry. Async only here, at the I/O edge.
pub trait Telemetry: Send {
    fn sample(&mut self) -> impl Future<Output = Sampled> + Send;
}

/// The real sources of one instance: its model server (metrics and health) and, unless the
/// config says `nvml = false`, its GPUs through NVML (opened once, shared by the instances).
pub struct NodeSource {
    pub server: ModelServerSource,
    pub nvml: Option<(Arc<NvmlSource>, Vec<DeviceSelector>)>,
}

impl NodeSource {
    pub fn selector(g: &GpuRef) -> DeviceSelector {
        match g {
            GpuRef::Index(i) => DeviceSelector::Index(*i),
            GpuRef::Uuid(u) => DeviceSelector::Uuid(u.clone()),
        }
    }
}

impl Telemetry for NodeSource {
    async fn sample(&mut self) -> Sampled {
        let mut errors = Vec::new();
        let server = match self.server.sample().await {
            Ok(s) => s,
            Err(e) => {
                errors.push((ErrorSource::Scrape, error_chain(&e)));
                // The server answered (wrongly): it is up, its load is unknown.
                ServerSample { healthy: true, ..ServerSample::default() }
            }
        };
        let mut gpus = Vec::new();
        if let Some((nvml, selectors)) = &self.nvml {
            // NVML answers in microseconds (ioctls): called inline. One failed GPU leaves the
            // memory unknown rather than counting part of the instance's GPUs.
            match selectors.iter().map(|s| nvml.sample(s)).collect::<Result<Vec<_>, _>>() {
                Ok(g) => gpus = g,
                Err(e) => errors.push((ErrorSource::Nvml, error_chain(&e))),
            }
        }
        Sampled { sample: NodeSample { gpus, server }, errors }
    }
}
