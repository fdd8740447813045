//! The daemon's plan as its readers get it: `GET /v1/plan` on `daemon.listen`, deserialized as
//! [`PlanView`], the type the daemon serializes, by one client with one timeout.
//!
//! Its readers: the in-flight admission (each model's members and their caps, refreshed in the
//! background, [`super::inflight`]), the live models of `GET /v1/models` (each model's
//! `available`, asked on demand and kept a moment, [`super::live_models`]) and `ailb explain`
//! (one model's whole plan). The fleet-memory admission reads the kernel's pins instead: the
//! plan has no memory in flight.
//!
//! The daemon and the front door are one binary, so they agree on the type; a plan that does
//! not parse (a daemon of another version) is an error of its reader, which keeps what it knew
//! (the admission) or says it cannot tell (the listing), as when the daemon does not answer.

use std::net::SocketAddr;
use std::time::Duration;

use crate::policy::PlanView;

/// The longest wait for the daemon's answer: the daemon is on this host, and the front door's
/// readers must not hang on one that does not answer (the admission refreshes every second).
pub const TIMEOUT: Duration = Duration::from_millis(500);

/// Why the daemon's plan could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
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

/// The client of one daemon's `/v1/plan`.
#[derive(Debug, Clone)]
pub struct PlanClient {
    url: String,
    client: reqwest::Client,
}

impl PlanClient {
    /// The plan of the daemon listening on `daemon` (`daemon.listen`).
    pub fn new(daemon: SocketAddr) -> Self {
        Self::with_timeout(daemon, TIMEOUT)
    }

    /// [`Self::new`] that waits up to `timeout` for the whole answer: an operator's one-off
    /// read (`ailb explain`) of a plan of thousands of backends (megabytes of JSON) may take
    /// seconds on a busy node, where the front door's periodic reads must not.
    pub fn with_timeout(daemon: SocketAddr, timeout: Duration) -> Self {
        let client = reqwest::Client::builder().timeout(timeout).build().unwrap_or_default();
        Self { url: format!("http://{daemon}/v1/plan"), client }
    }

    /// `http://<daemon.listen>/v1/plan`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The daemon's plan; `None` before its first.
    pub async fn fetch(&self) -> Result<Option<PlanView>, PlanError> {
        let request = |source| PlanError::Request { url: self.url.clone(), source };
        let resp = self.client.get(&self.url).send().await.map_err(request)?;
        if !resp.status().is_success() {
            return Err(PlanError::Status { url: self.url.clone(), status: resp.status().as_u16() });
        }
        let text = resp.text().await.map_err(request)?;
        parse(&text).map_err(|source| PlanError::Parse { url: self.url.clone(), source })
    }

    /// The daemon's plan, or [`PlanError::NoPlan`] before its first.
    pub async fn latest(&self) -> Result<PlanView, PlanError> {
        self.fetch().await?.ok_or_else(|| PlanError::NoPlan { url: self.url.clone() })
    }
}

/// The body of `/v1/plan` (`null` before the daemon's first plan).
pub fn parse(body: &str) -> serde_json::Result<Option<PlanView>> {
    serde_json::from_str(body)
}

#[cfg(test)]
mod tests;
