//! The control side of the front door: what it learns from the daemon and the kernel, apart
//! from any one request.
//!
//! - [`inflight`]: admission per model by connections in flight against the members'
//!   `max_inflight` (`gateway.admission = true`): the capacities from the daemon's plan, the
//!   counts from the kernel's pins.
//! - [`fleet_memory`]: admission per model by hinted memory in flight against the members'
//!   KV capacity, with a bounded wait (`mode = "fleet_memory"`): both read from the pins.
//! - [`live_models`]: which models have a live backend now, for `GET /v1/models`, from the
//!   daemon's plan.
//! - [`plan`]: the daemon's plan (`GET /v1/plan`), read by one client as the type the daemon
//!   serves, for both of those and `ailb explain`.
//!
//! [`Control`] is the admission a front door runs. Both admissions read the pins under
//! `daemon.bpffs`, so with either on the front door needs read access to them; without one it
//! needs no privilege.

pub mod fleet_memory;
pub mod inflight;
pub mod live_models;
pub mod plan;
pub mod sched;

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::config::gateway::{ValidAdmission, ValidGateway};
use crate::config::ValidConfig;
use crate::datapath::model_load::ModelLoad;
use crate::datapath::DatapathError;
use crate::gateway::http::ApiError;
use fleet_memory::{FleetMemory, KernelFleet, Ticket};
use inflight::Admission;

/// Why the admission could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("gateway.admission: needs daemon.listen (the daemon's plan holds each model's capacity)")]
    NoDaemon,
    #[error("gateway.admission: reading the kernel's in-flight counts under {dir}")]
    Pins {
        dir: PathBuf,
        #[source]
        source: DatapathError,
    },
}

/// The admission a front door runs (`gateway.admission`).
#[derive(Clone)]
pub enum Control {
    /// Connections in flight against the members' `max_inflight` ([`inflight`]).
    Inflight(Arc<Admission>),
    /// Memory in flight against the members' KV capacity, with a bounded wait
    /// ([`fleet_memory`]).
    FleetMemory(Arc<FleetMemory>),
}

impl Control {
    /// The admission of `gateway.admission` (`None` when off), its capacities read once and
    /// then refreshed by a task of `rt`.
    pub fn open(
        config: &ValidConfig,
        gateway: &ValidGateway,
        rt: &tokio::runtime::Runtime,
        registry: &mut Registry,
    ) -> Result<Option<Self>, AdmissionError> {
        let control = match &gateway.admission {
            ValidAdmission::Off => return Ok(None),
            ValidAdmission::Inflight { retry_after } => {
                let a = Admission::open(&config.bpffs, config.listen, *retry_after)?;
                rt.block_on(a.start());
                tracing::info!(bpffs = %config.bpffs.display(), "gateway: admission per model on");
                Control::Inflight(a)
            }
            ValidAdmission::FleetMemory(limits) => {
                let kernel = ModelLoad::open(&config.bpffs)
                    .map_err(|source| AdmissionError::Pins { dir: config.bpffs.clone(), source })?;
                let fleet = Box::new(KernelFleet(kernel));
                let f = FleetMemory::new(fleet, limits.clone(), config.models.keys().map(String::as_str), registry);
                let _guard = rt.enter();
                f.start();
                tracing::info!(
                    bpffs = %config.bpffs.display(),
                    factor = limits.factor,
                    max_wait = ?limits.max_wait,
                    max_queued = limits.max_queued,
                    "gateway: admission per model by fleet memory on"
                );
                Control::FleetMemory(f)
            }
        };
        Ok(Some(control))
    }

    /// Whether a request of `model` that needs `need_mb` fits now, without waiting (the
    /// scheduler's queues wait instead): `Some` with the ticket to hold when it fits; `own` is
    /// this front door's admitted requests of the model (the in-flight mode counts them until
    /// the kernel does).
    pub fn try_admit(&self, model: &str, need_mb: Option<u32>, own: u64) -> Option<Option<Ticket>> {
        match self {
            Control::Inflight(a) => a.has_room(model, own).is_ok().then_some(None),
            Control::FleetMemory(f) => f.try_admit(model, need_mb),
        }
    }

    /// Why `model` has no room now, for the answer of a request that waited for it.
    pub fn why_full(&self, model: &str, need_mb: Option<u32>, own: u64) -> String {
        match self {
            Control::Inflight(a) => {
                a.has_room(model, own).err().unwrap_or_else(|| "room only as the wait ran out".into())
            }
            Control::FleetMemory(f) => f.why_full(model, need_mb),
        }
    }

    /// The `Retry-After` of a refused request, seconds.
    pub fn retry_after(&self) -> u32 {
        match self {
            Control::Inflight(a) => a.retry_after(),
            Control::FleetMemory(f) => f.retry_after(),
        }
    }

    /// Admits a request of `model` that needs `need_mb`; the ticket, when there is one, is
    /// held until the request is done.
    pub async fn admit(&self, model: &str, need_mb: Option<u32>) -> Result<Option<Ticket>, ApiError> {
        match self {
            Control::Inflight(a) => a.admit(model).map(|()| None),
            Control::FleetMemory(f) => f.admit(model, need_mb).await,
        }
    }
}
