//! The front door, `ailb gateway`: an OpenAI-style HTTP/1.1 server that sends EVERY request
//! to the kernel's pick on a fresh upstream connection, tagged with the request's own
//! routing inputs (model, memory, conversation; see [`route`]).
//!
//! Why it exists: ailb picks a backend per connection, in `cgroup/connect4`; an unchanged
//! client with a keep-alive pool (the official `openai` client) sends every request of a
//! process down one connection, so the pick would happen once per process. The front door
//! keeps the client's connection and opens one upstream connection per request instead.
//!
//! Why a separate process from `ailb run`: it must run INSIDE the cgroup ailb attaches to,
//! so that its upstream connects are the ones `connect4` steers (the daemon stays outside
//! it), and it needs no privilege at all (tagging a socket is a plain `setsockopt`), while
//! `ailb run` must load programs and write maps as root. A crash or restart of one does not
//! take the other down.
//!
//! It reads the same config file as `ailb run`: the model catalog (`[[models]]`,
//! `[[services]]`; a model's first VIP is where its requests connect) and the `[gateway]`
//! section ([`GatewayConfig`]).

#![forbid(unsafe_code)]

mod body;
pub mod config;
pub mod error;
mod log;
pub mod metrics;
pub mod models;
pub mod pool;
pub mod proxy;
pub mod route;
pub mod server;

use std::path::Path;
use std::sync::Arc;

use prometheus_client::registry::Registry;

pub use config::{GatewayConfig, ValidGateway};
pub use error::{ApiError, GatewayError};
pub use server::{routing_inputs, Gateway, BACKEND_HEADER, CONVERSATION_HEADER};

/// The catalog and the `[gateway]` section of the config at `path` (or the embedded
/// default), both validated.
pub fn load(path: Option<&Path>) -> Result<(crate::config::ValidConfig, ValidGateway), GatewayError> {
    let config = match path {
        Some(p) => crate::config::Config::load(p)?,
        None => crate::config::Config::embedded_default(),
    };
    let valid = config.validate()?;
    let gateway = config.gateway.validate(valid.models.keys().map(String::as_str))?;
    Ok((valid, gateway))
}

/// `ailb gateway`: serves on every `gateway.listen` address until SIGINT or SIGTERM.
pub fn run(path: Option<&Path>) -> Result<(), GatewayError> {
    let (config, gateway) = load(path)?;
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = gateway.worker_threads {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build().map_err(|source| GatewayError::Runtime { source })?;
    rt.block_on(serve_until_signal(config, gateway))
}

async fn serve_until_signal(config: crate::config::ValidConfig, gateway: ValidGateway) -> Result<(), GatewayError> {
    let mut listeners = Vec::new();
    for &addr in &gateway.listen {
        let l = tokio::net::TcpListener::bind(addr).await.map_err(|source| GatewayError::Bind { addr, source })?;
        let local = l.local_addr().map_err(|source| GatewayError::Bind { addr, source })?;
        tracing::info!(%local, "gateway: listening");
        listeners.push(l);
    }
    let gw = Gateway::new(&config, gateway, Registry::default());
    let tasks: Vec<_> = listeners.into_iter().map(|l| tokio::spawn(Arc::clone(&gw).serve(l))).collect();
    shutdown_signal().await;
    tracing::info!("gateway: stopping");
    for t in tasks {
        t.abort();
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "gateway: no SIGTERM handler; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
