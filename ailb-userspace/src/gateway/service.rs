//! What the front door serves ([`Gateway`]): a request is dispatched by its method and path to
//! the [`Pipeline`] (a `POST` to an inference endpoint, a request for one stored response by
//! its id, or a `POST` to a route passed through, such as vLLM's `/tokenize` or `/v1/rerank`) or answered here (`GET /v1/models`,
//! `/healthz`, `/metrics`; 404 and 405 for the rest).

use std::sync::Arc;

use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Response, StatusCode};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;

use super::client::{self, Handler, RequestBody, Settings};
use super::control::live_models::Liveness;
use super::control::Control;
use super::http::{full, Answer, ApiError, Body, ClientIp, ReqHead};
use super::inputs::Endpoint;
use super::metrics::GatewayMetrics;
use super::pipeline::Pipeline;
use super::responses;
use crate::config::gateway::ValidGateway;
use crate::config::ValidConfig;

/// The front door's state, shared by every connection of a worker.
pub struct Gateway {
    pipeline: Pipeline,
    metrics: Arc<GatewayMetrics>,
    registry: Arc<Registry>,
    live: Arc<Liveness>,
}

impl Gateway {
    /// The catalog of `config` with the `[gateway]` settings; its metrics go on `registry`.
    pub fn new(config: &ValidConfig, cfg: ValidGateway, registry: Registry) -> Arc<Self> {
        Self::with_admission(config, cfg, registry, None)
    }

    /// [`Gateway::new`], with the admission per model of `gateway.admission` when given.
    pub fn with_admission(
        config: &ValidConfig,
        cfg: ValidGateway,
        mut registry: Registry,
        admission: Option<Control>,
    ) -> Arc<Self> {
        let metrics = Arc::new(GatewayMetrics::new(&mut registry));
        let pipeline = Pipeline::new(config, cfg, metrics.clone(), admission, &mut registry);
        let live = Arc::new(Liveness::new(config.listen));
        Arc::new(Self { pipeline, metrics, registry: Arc::new(registry), live })
    }

    /// The same front door (catalog, limits, metrics, the `max_concurrent` slots) for worker
    /// `index` of `workers`, with a pool of its own that keeps its share of
    /// `upstream_max_idle`: a worker's requests, their upstream connections and their answers
    /// then stay on its thread.
    pub fn worker(&self, index: usize, workers: usize) -> Arc<Self> {
        Arc::new(Self {
            pipeline: self.pipeline.worker(index, workers),
            metrics: self.metrics.clone(),
            registry: self.registry.clone(),
            live: self.live.clone(),
        })
    }

    /// The `[gateway]` settings.
    pub fn config(&self) -> &ValidGateway {
        self.pipeline.config()
    }

    /// Accepts connections on `listener` and serves each (HTTP/1.1 with keep-alive, or
    /// HTTP/2 when the client's first bytes are its preface; the HTTP/1 fast path first when
    /// `gateway.http1_fast_path`), until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        self.pipeline.start();
        let settings = Settings::of(self.config());
        client::serve(self, listener, settings).await;
    }

    /// `GET /v1/models`: the catalog's models that have a live backend now (the daemon's plan,
    /// see [`Liveness`]); the whole catalog, each with `"ailb_live": null`, when the daemon
    /// cannot say.
    async fn list_models(&self) -> Response<Body> {
        let live = self.live.available().await;
        if let Err(e) = &live {
            tracing::warn!(error = %crate::error_chain(e), "gateway: /v1/models lists the whole catalog");
        }
        let data: Vec<_> = self
            .pipeline
            .models()
            .keys()
            .filter_map(|name| {
                let known = match &live {
                    Ok(models) => Some(models.get(name).copied().unwrap_or(false)),
                    Err(_) => None,
                };
                if known == Some(false) {
                    return None;
                }
                Some(json!({"id": name, "object": "model", "created": 0, "owned_by": "ailb", "ailb_live": known}))
            })
            .collect();
        text(StatusCode::OK, "application/json", json!({"object": "list", "data": data}).to_string())
    }

    fn encode_metrics(&self) -> Response<Body> {
        let mut out = String::new();
        match prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            Ok(()) => text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", out),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("encoding metrics: {e}\n")),
        }
    }
}

impl Handler for Gateway {
    /// One request, by its method and path.
    async fn answer(self: Arc<Self>, head: ReqHead, body: RequestBody, client: ClientIp) -> Answer {
        let endpoint = Endpoint::from_path(head.path());
        if let (&Method::POST, Some(ep)) = (head.method(), endpoint) {
            return self.pipeline.proxy(ep, head, body, client).await;
        }
        if let Some(id) = responses::by_id(head.method(), head.path()) {
            let id = id.to_string();
            return self.pipeline.stored_response(&id, head, body, client).await;
        }
        if let (&Method::POST, Some(ep)) = (head.method(), Endpoint::pass_through(head.path())) {
            return self.pipeline.proxy(ep, head, body, client).await;
        }
        let path = head.path();
        let resp = match (head.method(), path, endpoint) {
            (&Method::GET, "/v1/models", _) => self.list_models().await,
            (&Method::GET, "/healthz", _) => text(StatusCode::OK, "text/plain", "ok\n".into()),
            (&Method::GET, "/metrics", _) => self.encode_metrics(),
            (_, "/v1/models" | "/healthz" | "/metrics", _) | (_, _, Some(_)) => ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
                format!("{} {path}: method not allowed", head.method()),
            )
            .into_response(),
            _ => ApiError::not_found(format!("{} {path}: no such route", head.method())).into_response(),
        };
        resp.into()
    }

    fn handed_off(&self) {
        self.metrics.handoffs.inc();
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
