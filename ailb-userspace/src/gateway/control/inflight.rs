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
//! sheds load, it never stops a gateway from serving.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;

use super::AdmissionError;
use crate::datapath::model_load::ModelLoad;
use crate::gateway::http::ApiError;

/// How often the capacities and model indices are read again.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Longest wait for the daemon's plan.
const TIMEOUT: Duration = Duration::from_millis(500);

/// The part of `/v1/plan` admission reads.
#[derive(Debug, Deserialize)]
struct Plan {
    models: BTreeMap<String, PlanModel>,
}

#[derive(Debug, Deserialize)]
struct PlanModel {
    backends: Vec<PlanBackend>,
}

#[derive(Debug, Deserialize)]
struct PlanBackend {
    weight: u32,
    cap: u32,
    eligible: bool,
}

/// A model's running capacity: the sum of its members' caps; `None` when a member has no cap
/// or there is no member (not limited).
fn capacity(m: &PlanModel) -> Option<u64> {
    let members: Vec<&PlanBackend> = m.backends.iter().filter(|b| b.eligible && b.weight > 0).collect();
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
    plan_url: String,
    client: reqwest::Client,
    retry_after: u32,
    limits: RwLock<BTreeMap<String, Limit>>,
}

impl Admission {
    /// Opens the pins under `bpffs`; `daemon` is `daemon.listen`.
    pub fn open(bpffs: &Path, daemon: Option<SocketAddr>, retry_after: Duration) -> Result<Arc<Self>, AdmissionError> {
        let daemon = daemon.ok_or(AdmissionError::NoDaemon)?;
        let kernel = ModelLoad::open(bpffs).map_err(|source| AdmissionError::Pins { dir: bpffs.into(), source })?;
        let client = reqwest::Client::builder().timeout(TIMEOUT).build().unwrap_or_default();
        Ok(Arc::new(Self {
            kernel,
            plan_url: format!("http://{daemon}/v1/plan"),
            client,
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
        let plan = match self.fetch().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(url = %self.plan_url, error = %e, "gateway admission: keeping the last capacities");
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

    async fn fetch(&self) -> Result<Plan, String> {
        let resp = self.client.get(&self.plan_url).send().await.map_err(|e| crate::error_chain(&e))?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status().as_u16()));
        }
        let text = resp.text().await.map_err(|e| crate::error_chain(&e))?;
        let plan: Option<Plan> = serde_json::from_str(&text).map_err(|e| format!("not a plan: {e}"))?;
        plan.ok_or_else(|| "the daemon has made no plan yet".to_string())
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
mod tests {
    use super::*;

    fn model(backends: &[(u32, u32, bool)]) -> PlanModel {
        PlanModel {
            backends: backends.iter().map(|&(weight, cap, eligible)| PlanBackend { weight, cap, eligible }).collect(),
        }
    }

    #[test]
    fn capacity_is_the_sum_of_the_members_caps() {
        assert_eq!(capacity(&model(&[(3, 64, true), (1, 16, true)])), Some(80));
        // Not members (excluded, or weight 0): their caps do not count.
        assert_eq!(capacity(&model(&[(3, 64, true), (1, 16, false), (0, 16, true)])), Some(64));
        assert_eq!(capacity(&model(&[(3, 64, true), (1, 0, true)])), None, "a member without a cap");
        assert_eq!(capacity(&model(&[(1, 16, false)])), None, "no member");
    }

    #[test]
    fn the_plan_parses_as_the_daemon_serves_it() {
        use crate::{config::Config, discovery::from_static, policy};
        let text = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n\
                    [[backends]]\nmodel = \"m\"\naddress = \"10.1.0.1:80\"\nweight = 1\nmax_inflight = 16\n\
                    [[backends]]\nmodel = \"m\"\naddress = \"10.1.0.2:80\"\nweight = 3\nmax_inflight = 64\n";
        let cfg = Config::parse(text, "test").and_then(|c| c.validate()).unwrap();
        let models = policy::plan(&from_static(&cfg.backends), &cfg.models, &cfg.policy, &mut Default::default());
        let served = serde_json::to_string(&policy::PlanView { generation: 1, models }).unwrap();
        let plan: Option<Plan> = serde_json::from_str(&served).unwrap();
        assert_eq!(capacity(&plan.unwrap().models["m"]), Some(80));
    }
}
