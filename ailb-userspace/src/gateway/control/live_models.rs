//! Which models of the catalog have a live backend now, for `GET /v1/models`.
//!
//! The kernel knows (a model without an eligible backend refuses connects with
//! `ECONNREFUSED`), but its maps are readable only with privilege, which the front door has
//! only when an admission is on (it reads the pins then). `ailb run` publishes the same fact in its plan (`GET /v1/plan` on
//! `daemon.listen`, `models.<name>.available`), so the front door asks it there, at most once
//! per [`TTL`] (concurrent listings share one answer).
//!
//! Without `daemon.listen`, or while the daemon does not answer, the listing is the whole
//! catalog and says so (`"ailb_live": null` on each model and a warning in the log): a client
//! may then pick a model without a backend and gets 503 for it, which is what happens anyway
//! when the last backend goes between the listing and the request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::plan::{PlanClient, PlanError};

/// How long one answer of the daemon is used.
pub const TTL: Duration = Duration::from_secs(1);

/// Why the live models are not known.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no daemon.listen in the config: the front door cannot ask `ailb run` which models are live")]
    NoDaemon,
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Asks the daemon which models are live, with a short cache.
pub struct Liveness {
    plan: Option<PlanClient>,
    last: Mutex<Option<(Instant, BTreeMap<String, bool>)>>,
}

impl Liveness {
    /// `daemon` is the config's `daemon.listen`.
    pub fn new(daemon: Option<SocketAddr>) -> Self {
        Self { plan: daemon.map(PlanClient::new), last: Mutex::new(None) }
    }

    /// Each planned model and whether it has an eligible backend now.
    pub async fn available(&self) -> Result<BTreeMap<String, bool>, LiveError> {
        let plan = self.plan.as_ref().ok_or(LiveError::NoDaemon)?;
        let mut last = self.last.lock().await;
        if let Some((at, models)) = &*last {
            if at.elapsed() < TTL {
                return Ok(models.clone());
            }
        }
        let view = plan.latest().await?;
        let models: BTreeMap<String, bool> = view.models.into_iter().map(|(name, m)| (name, m.available)).collect();
        *last = Some((Instant::now(), models.clone()));
        Ok(models)
    }
}
