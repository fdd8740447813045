//! The HTTP server (hyper: HTTP/1.1 with keep-alive, and HTTP/2 with prior knowledge, h2c, on
//! the same port; in front of it, by default, the front door's own HTTP/1 path, [`super::h1`])
//! and its routes.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::control::fleet_memory::Ticket;
use super::control::live_models::Liveness;
use super::control::Control;
use super::http::{
    full, is_event_stream, visible_ascii, Answer, ApiError, Body, ClientIp, Deadline, HeadLines, Headers, ReqHead,
    BACKEND_HEADER, CONVERSATION_HEADER, HOP_BY_HOP,
};
use super::log::RequestLog;
use super::metrics::{GatewayMetrics, ModelSeries};
use super::route::{self, Endpoint, ModelFacts, Rules};
use super::upstream::body::UpBody;
use super::upstream::conn::{Conn, Sent};
use super::upstream::pool::{Pool, PoolKey};
use super::upstream::relay::{Held, Relay, Reuse};
use super::upstream::{self, request::UpRequest};
use crate::config::gateway::{UpstreamReuse, ValidGateway, DEFAULT_KV_BLOCK_TOKENS};
use crate::config::ValidConfig;

/// A forwarded request: the upstream's response (with its headers as lines when the front
/// door's own client read it), its connection, where the connection goes after, and the
/// request's share of the admission.
type Forwarded = (Response<UpBody>, Option<HeadLines>, Box<Conn>, Option<Reuse>, Option<Ticket>);

/// A model of the catalog as the front door routes it.
#[derive(Clone, Debug)]
pub struct ModelRoute {
    /// The model's first VIP: every request of the model connects there.
    pub vip: SocketAddrV4,
    pub facts: ModelFacts,
    /// Its place in the catalog (by name), which keys its kept upstream connections.
    pub index: u32,
    /// Its metric series, reached without a label lookup per request.
    pub series: Arc<ModelSeries>,
}

/// Each model of the catalog with a VIP, as the front door routes it.
pub fn routes(config: &ValidConfig, cfg: &ValidGateway) -> BTreeMap<String, ModelRoute> {
    config
        .models
        .iter()
        .filter_map(|(name, m)| {
            // The front door connects through the model's first IPv4 VIP.
            let vip = m.spec.vips.iter().find_map(|v| match v {
                SocketAddr::V4(a) => Some(*a),
                SocketAddr::V6(_) => None,
            })?;
            let facts = ModelFacts {
                required_memory_mb: m.spec.required_memory_mb,
                kv_bytes_per_token: cfg.kv_bytes_per_token.get(name).copied(),
                kv_block_tokens: cfg.kv_block_tokens.get(name).copied().unwrap_or(DEFAULT_KV_BLOCK_TOKENS),
            };
            Some((name.clone(), vip, facts))
        })
        .enumerate()
        .map(|(i, (name, vip, facts))| {
            let index = u32::try_from(i).expect("a catalog has fewer than 2^32 models");
            let series = Arc::new(ModelSeries::new(name.clone()));
            (name, ModelRoute { vip, facts, index, series })
        })
        .collect()
}

/// The routing inputs the front door would find in a request to `path` with `headers` and
/// `body` (what `ailb explain --request` shows), or the error it would answer.
pub fn routing_inputs(
    config: &ValidConfig,
    cfg: &ValidGateway,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(route::Inputs, SocketAddrV4), ApiError> {
    let Some(endpoint) = Endpoint::from_path(path) else {
        return Err(ApiError::not_found(format!("POST {path}: no such route")));
    };
    let models = routes(config, cfg);
    let inputs = find_inputs(&models, cfg, endpoint, headers, body)?;
    let vip = models[&inputs.model].vip;
    Ok((inputs, vip))
}

/// The routing inputs of a request to `endpoint`, by the catalog `models` and `cfg`'s rules.
fn find_inputs(
    models: &BTreeMap<String, ModelRoute>,
    cfg: &ValidGateway,
    endpoint: Endpoint,
    headers: &impl Headers,
    body: &[u8],
) -> Result<route::Inputs, route::RouteError> {
    let json = route::parse_body(body)?;
    let rules =
        Rules { session_header: cfg.session_header.as_ref(), completion_prefix_bytes: cfg.completion_prefix_bytes };
    route::extract(endpoint, headers, &json, rules, |m| models.get(m).map(|r| r.facts))
}

/// A request's body as the routes get it.
pub enum RequestBody {
    /// hyper's, read when the route needs it.
    Hyper(Incoming),
    /// Read whole already (by the HTTP/1 fast path), or why it could not be.
    Read(Result<Bytes, ApiError>),
}

/// The front door's state, shared by every connection.
pub struct Gateway {
    cfg: ValidGateway,
    models: BTreeMap<String, ModelRoute>,
    metrics: Arc<GatewayMetrics>,
    registry: Arc<Registry>,
    permits: Arc<Semaphore>,
    /// Idle upstream connections by routing inputs (`None`: `upstream_reuse = "never"`).
    pool: Option<Arc<Pool>>,
    live: Arc<Liveness>,
    admission: Option<Control>,
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
        let models = routes(config, &cfg);
        let metrics = Arc::new(GatewayMetrics::new(&mut registry));
        let permits = Arc::new(Semaphore::new(cfg.max_concurrent as usize));
        let pool = (cfg.upstream_reuse == UpstreamReuse::Conversation)
            .then(|| Pool::new(cfg.upstream_max_age, cfg.upstream_max_idle as usize, cfg.upstream_idle_mark_after));
        let live = Arc::new(Liveness::new(config.listen));
        Arc::new(Self { cfg, models, metrics, registry: Arc::new(registry), permits, pool, live, admission })
    }

    /// The same front door (catalog, limits, metrics, the `max_concurrent` slots) for worker
    /// `index` of `workers`, with a pool of its own that keeps its share of
    /// `upstream_max_idle`: a worker's requests, their upstream connections and their answers
    /// then stay on its thread.
    pub fn worker(&self, index: usize, workers: usize) -> Arc<Self> {
        let max_idle = self.cfg.upstream_max_idle as usize;
        let workers = workers.max(1);
        let share = max_idle / workers + usize::from(index < max_idle % workers);
        let pool =
            self.pool.as_ref().map(|_| Pool::new(self.cfg.upstream_max_age, share, self.cfg.upstream_idle_mark_after));
        Arc::new(Self {
            cfg: self.cfg.clone(),
            models: self.models.clone(),
            metrics: self.metrics.clone(),
            registry: self.registry.clone(),
            permits: self.permits.clone(),
            pool,
            live: self.live.clone(),
            admission: self.admission.clone(),
        })
    }

    /// The `[gateway]` settings.
    pub fn config(&self) -> &ValidGateway {
        &self.cfg
    }

    /// Counts a client connection the HTTP/1 fast path handed to hyper's server.
    pub fn count_handoff(&self) {
        self.metrics.handoffs.inc();
    }

    /// Accepts connections on `listener` and serves each (HTTP/1.1 with keep-alive, or
    /// HTTP/2 when the client's first bytes are its preface; the HTTP/1 fast path first when
    /// `gateway.http1_fast_path`), until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        if let Some(pool) = &self.pool {
            Pool::spawn_sweeper(pool);
        }
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and the like: the listener stays; wait a little for fds to free up.
                    tracing::warn!(error = %e, "gateway: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let gw = self.clone();
            tokio::spawn(async move {
                let client = ClientIp::new(peer);
                if gw.cfg.http1_fast_path {
                    super::h1::serve(gw, stream, peer, client).await;
                } else {
                    gw.serve_hyper(TokioIo::new(stream), peer, client).await;
                }
            });
        }
    }

    /// Serves one client connection with hyper's server (HTTP/1.1, or HTTP/2 when its first
    /// bytes are the preface) until it closes.
    pub async fn serve_hyper<I>(self: Arc<Self>, io: I, peer: SocketAddr, client: ClientIp)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let header_timeout = self.cfg.header_timeout;
        let svc = hyper::service::service_fn(move |req| self.clone().handle(req, client.clone()));
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
        builder.http2().timer(TokioTimer::new());
        if let Err(e) = builder.serve_connection(io, svc).await {
            tracing::debug!(%peer, error = %crate::error_chain(&*e), "gateway: client connection ended");
        }
    }

    /// One request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, peer: ClientIp) -> Result<Response<Body>, Infallible> {
        let (parts, body) = req.into_parts();
        Ok(self.route(parts.into(), RequestBody::Hyper(body), peer).await.into_response())
    }

    /// One request, from its head and its body (hyper's server and the HTTP/1 fast path both
    /// answer through here).
    pub async fn route(self: Arc<Self>, head: ReqHead, body: RequestBody, peer: ClientIp) -> Answer {
        let endpoint = Endpoint::from_path(head.path());
        if let (&Method::POST, Some(ep)) = (head.method(), endpoint) {
            return self.proxy(ep, head, body, peer).await;
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

    /// `GET /v1/models`: the catalog's models that have a live backend now (the daemon's plan,
    /// see [`Liveness`]); the whole catalog, each with `"ailb_live": null`, when the daemon
    /// cannot say.
    async fn list_models(&self) -> Response<Body> {
        let live = self.live.available().await;
        if let Err(e) = &live {
            tracing::warn!(error = %crate::error_chain(e), "gateway: /v1/models lists the whole catalog");
        }
        let data: Vec<_> = self
            .models
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

    async fn proxy(self: Arc<Self>, endpoint: Endpoint, head: ReqHead, body: RequestBody, peer: ClientIp) -> Answer {
        let mut log = RequestLog::start(self.metrics.clone(), head.method(), head.path());
        let deadline = Deadline::after(log.started(), self.cfg.total_timeout);
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return answer(log, ApiError::overloaded(self.cfg.max_concurrent)).into();
        };
        match self.clone().forward(endpoint, head, body, peer, &mut log, deadline).await {
            Ok((resp, lines, conn, reuse, ticket)) => {
                let (parts, mut body) = resp.into_parts();
                let held = Held { _permit: permit, ticket };
                if let Some(data) = body.take_whole() {
                    // It came whole with its head: nothing left to relay, wait for or time out.
                    upstream::relay::whole(body, &data, conn, reuse, held, log);
                    return Answer { resp: Response::from_parts(parts, full(data)), lines };
                }
                let sse = match &lines {
                    Some(l) => l.event_stream,
                    None => parts.headers.get(CONTENT_TYPE).is_some_and(|v| is_event_stream(v.as_bytes())),
                };
                let relay = Relay::new(body, sse, conn, reuse, held, log, self.cfg.idle_timeout, deadline);
                Answer { resp: Response::from_parts(parts, relay.boxed_unsync()), lines }
            }
            Err(e) => answer(log, e).into(),
        }
    }

    /// Reads and parses the body, finds the routing inputs, and sends the request as it came
    /// (minus hop-by-hop headers, plus `X-Forwarded-For`) on a connection tagged with them;
    /// every wait ends by `deadline`.
    async fn forward(
        self: Arc<Self>,
        endpoint: Endpoint,
        head: ReqHead,
        body: RequestBody,
        client: ClientIp,
        log: &mut RequestLog,
        deadline: Deadline,
    ) -> Result<Forwarded, ApiError> {
        let client_version = head.version();
        let bytes = match body {
            RequestBody::Read(read) => read?,
            RequestBody::Hyper(body) => deadline.bound(self.read_body(&head, body)).await?,
        };
        let inputs = find_inputs(&self.models, &self.cfg, endpoint, &head, &bytes).inspect_err(|e| {
            if let route::RouteError::UnknownModel { model } = e {
                log.model(model);
            }
        })?;
        let conv_hash = inputs.conversation.as_ref().map(route::Conversation::hash);
        let ticket = match &self.admission {
            Some(a) => deadline.bound(a.admit(&inputs.model, inputs.memory_mb)).await?,
            None => None,
        };
        let model = &self.models[&inputs.model];
        log.proxying(&model.series, conv_hash);
        let mut tags = ailb_common::client::Tags::new().model(inputs.model.as_str());
        if let Some(c) = &inputs.conversation {
            tags = tags.conversation(c.key.as_str());
        }
        if let Some(mb) = inputs.memory_mb {
            tags = tags.required_memory_mb(mb);
        }
        let upstream_req = UpRequest { head, body: bytes, client };
        let key = match (&self.pool, conv_hash) {
            (Some(_), Some(conversation)) => {
                Some(PoolKey { model: model.index, memory_mb: inputs.memory_mb, conversation })
            }
            _ => None,
        };
        let (mut resp, mut lines, conn) = self.exchange(key.as_ref(), model.vip, &tags, upstream_req, deadline).await?;
        let backend = conn.backend;
        let reuse = match (key, &self.pool) {
            (Some(key), Some(pool)) if keeps_alive(&resp) => Some(Reuse { pool: pool.clone(), key }),
            _ => None,
        };
        log.upstream(backend, resp.status().as_u16());
        end_to_end(resp.headers_mut());
        // The upstream's HTTP version is its connection's business (an HTTP/1.0 answer would
        // make the client's keep-alive connection close).
        *resp.version_mut() = client_version;
        match &mut lines {
            Some(l) => {
                l.push(BACKEND_HEADER, conn.backend_value.as_bytes());
                if let Some(hash) = conv_hash {
                    let mut hex = [0u8; 18];
                    l.push(CONVERSATION_HEADER, hash_hex(hash, &mut hex));
                }
            }
            None => {
                let h = resp.headers_mut();
                h.insert(HeaderName::from_static(BACKEND_HEADER), conn.backend_value.clone());
                if let Some(hash) = conv_hash {
                    h.insert(HeaderName::from_static(CONVERSATION_HEADER), header_value(format!("{hash:#018x}")));
                }
            }
        }
        Ok((resp, lines, conn, reuse, ticket))
    }

    /// Sends `req` on an idle connection with the same routing inputs (`key`) when the pool
    /// has one, else on a fresh tagged connection to `vip`.
    async fn exchange(
        &self,
        key: Option<&PoolKey>,
        vip: SocketAddrV4,
        tags: &ailb_common::client::Tags<'_>,
        mut req: UpRequest,
        deadline: Deadline,
    ) -> Result<(Response<UpBody>, Option<HeadLines>, Box<Conn>), ApiError> {
        let idle = self.cfg.idle_timeout;
        if let Some(mut conn) = key.and_then(|k| self.pool.as_ref()?.take(k, deadline.started())) {
            match upstream::conn::send(&mut conn, req, idle, deadline).await? {
                Sent::Answered(resp, lines) => {
                    self.metrics.upstream_request(true);
                    return Ok((resp, lines, conn));
                }
                Sent::NotSent(back) => req = back,
            }
        }
        let mut conn = deadline
            .bound(async {
                let up = upstream::connect::connect(vip, tags, self.cfg.connect_timeout).await?;
                // The fast path's own HTTP/1 client, or hyper's.
                if self.cfg.http1_fast_path {
                    Ok(upstream::conn::open_raw(up))
                } else {
                    upstream::conn::open(up).await
                }
            })
            .await?;
        self.metrics.upstream_request(false);
        match upstream::conn::send(&mut conn, req, idle, deadline).await? {
            Sent::Answered(resp, lines) => Ok((resp, lines, conn)),
            Sent::NotSent(_) => Err(ApiError::bad_gateway(format!(
                "upstream {}: the new connection closed before the request could be sent",
                conn.backend
            ))),
        }
    }

    /// The whole body, at most `max_body_bytes`: a larger Content-Length is refused before
    /// reading, a chunked body is read up to the limit only; a body slower than
    /// `header_timeout` gets 408 (it holds one of the `max_concurrent` slots meanwhile).
    async fn read_body(&self, headers: &impl Headers, body: Incoming) -> Result<Bytes, ApiError> {
        let max = self.cfg.max_body_bytes;
        let declared = headers.first("content-length").and_then(|v| visible_ascii(v)?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(ApiError::too_large(max));
        }
        let limit = usize::try_from(max).unwrap_or(usize::MAX);
        let within = self.cfg.header_timeout;
        let Ok(read) = tokio::time::timeout(within, Limited::new(body, limit).collect()).await else {
            return Err(ApiError::body_timeout(within));
        };
        match read {
            Ok(c) => Ok(c.to_bytes()),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(max)),
            Err(e) => Err(ApiError::invalid_request("invalid_body", format!("reading the request body: {e}"))),
        }
    }
}

/// Removes the hop-by-hop headers (the fixed list and those named in `Connection`) from
/// `headers`, keeping the order of the others. Most messages have none, and are left as they are.
fn end_to_end(headers: &mut HeaderMap) {
    if !headers.keys().any(|name| HOP_BY_HOP.contains(&name.as_str())) {
        return;
    }
    let from = std::mem::take(headers);
    let named: Vec<String> = from
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    headers.reserve(from.len());
    let mut name = None;
    for (next, value) in from {
        // `None`: another value of the header before it.
        if let Some(n) = next {
            name = Some(n);
        }
        let Some(n) = &name else { continue };
        if HOP_BY_HOP.contains(&n.as_str()) || named.iter().any(|c| c == n.as_str()) {
            continue;
        }
        headers.append(n.clone(), value);
    }
}

/// Whether the upstream leaves its connection open after `resp` (HTTP/1.1 without
/// `Connection: close`).
fn keeps_alive<B>(resp: &Response<B>) -> bool {
    resp.version() == Version::HTTP_11
        && !resp
            .headers()
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("close"))
}

/// `hash` as `0x` and 16 hex digits (as `{hash:#018x}` writes it), in `out`.
fn hash_hex(hash: u64, out: &mut [u8; 18]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out[..2].copy_from_slice(b"0x");
    for (i, d) in out[2..].iter_mut().enumerate() {
        *d = HEX[((hash >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

fn header_value(s: String) -> HeaderValue {
    HeaderValue::try_from(s).expect("addresses, authorities and hex hashes are valid header values")
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Answers `e` and closes the request's log.
fn answer(mut log: RequestLog, e: ApiError) -> Response<Body> {
    log.status(e.status.as_u16());
    let outcome = if e.status.is_server_error() { "upstream failure" } else { "refused" };
    log.finish(outcome);
    e.into_response()
}
