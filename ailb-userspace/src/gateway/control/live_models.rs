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

use serde::Deserialize;
use tokio::sync::Mutex;

/// How long one answer of the daemon is used.
pub const TTL: Duration = Duration::from_secs(1);
/// Longest wait for the daemon's answer.
const TIMEOUT: Duration = Duration::from_millis(500);

/// Why the daemon's plan could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no daemon.listen in the config: the front door cannot ask `ailb run` which models are live")]
    NoDaemon,
    #[error("GET {url}")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: not a plan")]
    Parse {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("GET {url}: the daemon has made no plan yet")]
    NoPlan { url: String },
}

/// The part of `/v1/plan` the front door reads.
#[derive(Debug, Deserialize)]
struct Plan {
    models: BTreeMap<String, PlanModel>,
}

#[derive(Debug, Deserialize)]
struct PlanModel {
    available: bool,
}

/// Asks the daemon which models are live, with a short cache.
pub struct Liveness {
    url: Option<String>,
    client: reqwest::Client,
    last: Mutex<Option<(Instant, BTreeMap<String, bool>)>>,
}

impl Liveness {
    /// `daemon` is the config's `daemon.listen`.
    pub fn new(daemon: Option<SocketAddr>) -> Self {
        let client = reqwest::Client::builder().timeout(TIMEOUT).build().unwrap_or_default();
        Self { url: daemon.map(|a| format!("http://{a}/v1/plan")), client, last: Mutex::new(None) }
    }

    /// Each planned model and whether it has an eligible backend now.
    pub async fn available(&self) -> Result<BTreeMap<String, bool>, LiveError> {
        let url = self.url.as_ref().ok_or(LiveError::NoDaemon)?;
        let mut last = self.last.lock().await;
        if let Some((at, models)) = &*last {
            if at.elapsed() < TTL {
                return Ok(models.clone());
            }
        }
        let models = self.fetch(url).await?;
        *last = Some((Instant::now(), models.clone()));
        Ok(models)
    }

    async fn fetch(&self, url: &str) -> Result<BTreeMap<String, bool>, LiveError> {
        let request = |source| LiveError::Request { url: url.to_string(), source };
        let resp = self.client.get(url).send().await.map_err(request)?;
        if !resp.status().is_success() {
            return Err(LiveError::Status { url: url.to_string(), status: resp.status().as_u16() });
        }
        let text = resp.text().await.map_err(request)?;
        let plan: Option<Plan> =
            serde_json::from_str(&text).map_err(|source| LiveError::Parse { url: url.to_string(), source })?;
        let plan = plan.ok_or_else(|| LiveError::NoPlan { url: url.to_string() })?;
        Ok(plan.models.into_iter().map(|(name, m)| (name, m.available)).collect())
    }
}
