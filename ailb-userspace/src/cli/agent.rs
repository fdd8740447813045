//! `ailb agent --config FILE`: the GPU node agent (see `crate::agent`). SIGTERM or SIGINT
//! drains and exits 0.

use std::{path::Path, sync::Arc};

use anyhow::Context;
use axum::{extract::State, http::header, response::IntoResponse, routing::get, Router};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{signal, SignalKind};
use tracing::info;

use crate::{
    agent::{config::AgentConfig, metrics::AgentMetrics, Agent},
    nacos::http::ReqwestTransport,
    telemetry::{model_server::ModelServerSource, nvml::NvmlSource, source::NodeSource},
};

async fn metrics(State(r): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &r) {
        Ok(()) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
            .into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}")).into_response(),
    }
}

pub fn agent(config_path: &Path) -> anyhow::Result<()> {
    let cfg = AgentConfig::load(config_path)?.validate()?;
    let nvml = match cfg.instances.iter().find(|i| i.nvml) {
        Some(i) => {
            let n = NvmlSource::open(cfg.nvml_library.as_deref())
                .with_context(|| format!("instance {}: nvml = true", i.name()))?;
            info!(lib = n.lib(), "agent: NVML opened");
            Some(Arc::new(n))
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(async move {
        let mut registry = Registry::default();
        let m = AgentMetrics::new(&mut registry);
        let registry = Arc::new(registry);
        if let Some(addr) = cfg.listen {
            let listener =
                tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listen {addr}: cannot bind"))?;
            let bound = listener.local_addr()?;
            let app = Router::new()
                .route("/metrics", get(metrics))
                .route("/healthz", get(|| async { "ok\n" }))
                .with_state(registry.clone());
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "agent: http endpoint stopped");
                }
            });
            info!(listen = %bound, "agent: /metrics, /healthz");
            if !bound.ip().is_loopback() {
                tracing::warn!(listen = %bound, "agent: listen is not a loopback address: /metrics is reachable from the network (it has no authentication)");
            }
        }
        let nacos = ReqwestTransport::new(cfg.nacos.timeout, cfg.nacos.tls_ca_file.as_deref())?;
        let sources = cfg
            .instances
            .iter()
            .map(|i| {
                let server = ModelServerSource::with_names(
                    i.metrics_url.clone(),
                    i.health_url.clone(),
                    i.names.clone(),
                    cfg.probe_timeout,
                )?;
                let nvml = match (&nvml, i.nvml) {
                    (Some(n), true) => Some((n.clone(), i.gpus.iter().map(NodeSource::selector).collect())),
                    _ => None,
                };
                anyhow::Ok(NodeSource::new(server, nvml).with_prompt_rate_window(cfg.prompt_rate_window))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => info!("agent: SIGTERM"),
                _ = int.recv() => info!("agent: SIGINT"),
            }
        };
        info!(instances = cfg.instances.len(), interval = ?cfg.publish_interval, "agent: started");
        Agent::new(cfg, nacos, sources, m).run(shutdown).await;
        info!("agent: exiting");
        anyhow::Ok(())
    })
}
