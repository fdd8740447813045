//! The daemon's HTTP endpoint: `/metrics` (Prometheus text), `/v1/plan` (the last plan with
//! every weight's reasons, for `ailb explain`), `/healthz`.

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
};

use axum::{extract::State, http::header, response::IntoResponse, routing::get, Router};
use prometheus_client::registry::Registry;
use tracing::{error, info};

use crate::policy::PlanView;

pub struct Shared {
    pub registry: Registry,
    /// The last plan, served at `/v1/plan`; `None` (served as `null`) before the first one.
    pub plan: RwLock<Option<PlanView>>,
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
            .into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}")).into_response(),
    }
}

async fn plan(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    match s.plan.read() {
        Ok(p) => axum::Json(&*p).into_response(),
        // A writer panicked mid-update: serve no plan rather than a torn one.
        Err(_) => axum::Json(None::<PlanView>).into_response(),
    }
}

/// Binds `addr` (an error here stops start-up) and serves in the background.
pub async fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/plan", get(plan))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(shared);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            error!(error = %e, "http endpoint stopped");
        }
    });
    info!(listen = %bound, "http endpoint: /metrics, /v1/plan, /healthz");
    Ok(bound)
}
