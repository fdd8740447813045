//! Admission per model by connections in flight, across both entry points
//! (`gateway.admission = true`, or `mode = "inflight"`).
//!
//! A request is admitted only while its model's connections in flight are under the model's
//! running capacity; above it the front door answers 429 with `Retry-After` at once instead of
//! sending the request to a server's queue, so an admitted request's latency stays near its
//! service time however much is offered.
//!
//! - **In flight**: the kernel's count of the model (`AILB_INFLIGHT[INFLIGHT_MODEL_BASE +
//!   model]`): every connection to its backends from the attached cgroup, the socket ABI's and
//!   the front door's alike, read on each request from the pins (`daemon.bpffs`). Requests
//!   that arrive together may all read the same count and all be admitted; the same caps in
//!   the kernel then bound what reaches each backend (a connect to a model whose backends are
//!   all at their caps is refused, and answered 503 with `Retry-After`).
//! - **Capacity**: the sum of the hard caps (`max_inflight`: the metadata an agent publishes,
//!   or the static backend's) of the model's table members in the daemon's plan (`GET /v1/plan`
//!   on `daemon.listen`, read every [`REFRESH`]). A model with a member without a cap, or
//!   without members, is not limited here (the kernel refuses a model without members itself).
//!   The same caps make the kernel refuse a socket-ABI connect to a backend at its cap, so the
//!   ABI's excess fails fast at `connect()` instead of queueing ahead of admitted requests.
//!
//! If the plan or the pins cannot be read, requests are admitted (and it is logged): admission
//! sheds load, it never stops the front door from serving.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::plan::PlanClient;
use super::AdmissionError;
use crate::datapath::model_load::ModelLoad;
use crate::gateway::http::ApiError;
use crate::policy::{ModelPlan, PlannedBackend};

/// How often the capacities and model indices are read again.
pub const REFRESH: Duration = Duration::from_secs(1);

/// A model's running capacity: the sum of its members' caps; `None` when a member has no cap
/// or there is no member (not limited).
fn capacity(m: &ModelPlan) -> Option<u64> {
    let members: Vec<&PlannedBackend> = m.backends.iter().filter(|b| b.eligible && b.weight > 0).collect();
    if members.is_empty() || members.iter().any(|b| b.cap == 0) {
        return None;
    }
    Some(members.iter().map(|b| u64::from(b.cap)).sum())
}

/// What is known of a model between two refreshes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limit {
    index: u32,
    capacity: u64,
}

pub struct Admission {
    kernel: ModelLoad,
    plan: PlanClient,
    retry_after: u32,
    limits: RwLock<BTreeMap<String, Limit>>,
}

impl Admission {
    /// Opens the pins under `bpffs`; `daemon` is `daemon.listen`.
    pub fn open(bpffs: &Path, daemon: Option<SocketAddr>, retry_after: Duration) -> Result<Arc<Self>, AdmissionError> {
        let daemon = daemon.ok_or(AdmissionError::NoDaemon)?;
        let kernel = ModelLoad::open(bpffs).map_err(|source| AdmissionError::Pins { dir: bpffs.into(), source })?;
        Ok(Arc::new(Self {
            kernel,
            plan: PlanClient::new(daemon),
            retry_after: retry_after.as_secs().clamp(1, u64::from(u32::MAX)) as u32,
            limits: RwLock::new(BTreeMap::new()),
        }))
    }

    /// Reads the capacities now, then every [`REFRESH`] in a task of the current runtime.
    pub async fn start(self: &Arc<Self>) {
        self.refresh().await;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.refresh().await;
            }
        });
    }

    async fn refresh(&self) {
        let plan = match self.plan.latest().await {
            Ok(p) => p,
            Err(e) => {
                let error = crate::error_chain(&e);
                tracing::warn!(url = %self.plan.url(), %error, "gateway admission: keeping the last capacities");
                return;
            }
        };
        let mut limits = BTreeMap::new();
        for (name, m) in &plan.models {
            let Some(capacity) = capacity(m) else { continue };
            match self.kernel.model_index(name) {
                Ok(Some(index)) => {
                    limits.insert(name.clone(), Limit { index, capacity });
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(model = %name, error = %crate::error_chain(&e), "gateway admission"),
            }
        }
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// The `Retry-After` of a refused request, seconds.
    pub fn retry_after(&self) -> u32 {
        self.retry_after
    }

    /// Whether a request of `model` fits now, counting `own` (this front door's admitted requests
    /// of the model, which the kernel counts only once they connect) against the capacity; with
    /// the reason when it does not.
    pub fn has_room(&self, model: &str, own: u64) -> Result<(), String> {
        let limit = self.limits.read().unwrap_or_else(|p| p.into_inner()).get(model).copied();
        let Some(limit) = limit else { return Ok(()) };
        match self.kernel.inflight(limit.index) {
            Ok(inflight) if inflight.max(own) >= limit.capacity => Err(format!(
                "{} requests in flight, capacity {} (the sum of its backends' max_inflight)",
                inflight.max(own),
                limit.capacity
            )),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(model, error = %crate::error_chain(&e), "gateway admission: admitting unread");
                Ok(())
            }
        }
    }

    /// Admits a request of `model`, or answers 429 with `Retry-After` when the model's
    /// connections in flight have reached its capacity.
    pub fn admit(&self, model: &str) -> Result<(), ApiError> {
        let limit = self.limits.read().unwrap_or_else(|p| p.into_inner()).get(model).copied();
        let Some(limit) = limit else { return Ok(()) };
        match self.kernel.inflight(limit.index) {
            Ok(inflight) if inflight >= limit.capacity => {
                Err(ApiError::at_capacity(model, inflight, limit.capacity, self.retry_after))
            }
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(model, error = %crate::error_chain(&e), "gateway admission: admitting unread");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
