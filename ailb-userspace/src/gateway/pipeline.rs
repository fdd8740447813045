//! A proxied request (`POST` to an inference endpoint), from its head to its answer, as named
//! phases in the order they run ([`Pipeline::proxy`]):
//!
//! 1. **slot**: one of `gateway.max_concurrent`, or 429 at once;
//! 2. **body**: the request body, whole ([`RequestBody::read`]);
//! 3. **inputs**: the routing inputs, model, memory and conversation ([`Pipeline::inputs`],
//!    the rules of [`super::inputs`]); a Responses API request with `previous_response_id`
//!    is pinned to the backend that stored that response (`super::responses`);
//! 4. **tenant**: with tenants configured, the request's tenant and priority, its tenant's
//!    concurrency share and token rate, 429 past either ([`Pipeline::tenant`], the rules of
//!    [`super::tenants`]);
//! 5. **admission**: the model's admission, when one is on ([`Pipeline::admit`]); with tenants
//!    configured, through the scheduler ([`super::control::sched`]), where a request of a
//!    saturated model waits in its tenant's queue in its priority's band;
//! 6. **exchange**: the request sent on a kept connection with the same inputs, or on a fresh
//!    tagged one (a pinned request: on a fresh connection to its backend), and the response
//!    head read ([`Pipeline::exchange`]); a fresh connection first takes its
//!    - **keys**: the prompt's prefix keys, for a model that sends them
//!      ([`super::prefix_keys`]; token-exact keys are made only here, since a request on a kept
//!      connection involves no pick and so needs none; a conversation's later turn first
//!      connects with them withheld, and they are made only if the kernel asks for them),
//!    - **tags**: the socket options that carry the inputs and keys to the kernel's pick ([`tags`]);
//! 7. **answer**: the response head as the client gets it ([`answer_head`]: hop-by-hop headers
//!    out, `x-ailb-backend` and `x-ailb-conversation` in, the client's HTTP version), and its
//!    body relayed, or ended at once when it came whole ([`Pipeline::answer`]); a Responses
//!    API answer's id is learned on the way.
//!
//! Every wait ends by the request's [`Deadline`] (`gateway.total_timeout`). Refusals and
//! failures are answered in the error shape of the request's API (Anthropic's on its Messages
//! API, else OpenAI's). The client side
//! ([`super::client`]) hands the request here through the front door's service
//! ([`super::service`]); the upstream side ([`super::upstream`]) and the admission
//! ([`super::control`]) are called from here and know nothing of each other.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::sync::Arc;

use ailb_common::client::Tags;
use http_body_util::BodyExt;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Response, StatusCode, Version};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::client::{RequestBody, Settings};
use super::control::sched::{Grant, Scheduler, Waited};
use super::control::Control;
use super::http::{
    full, is_event_stream, Answer, ApiError, Body, ClientIp, Deadline, HeadLines, ReqHead, BACKEND_HEADER,
    CONVERSATION_HEADER, HOP_BY_HOP,
};
use super::inputs::{self, Conversation, Endpoint, Inputs, InputsError, KeySource};
use super::log::RequestLog;
use super::metrics::{outcome, FollowUpLabel, GatewayMetrics, ModelSeries, TenantMetrics};
use super::prefix_keys::PendingKeys;
use super::request_fields::Fields;
use super::response_ids::Stored;
use super::responses::{self, Learn, Learner, Param, Responses};
use super::tenants::{Tenancy, TenantSlot, Who};
use super::upstream::body::UpBody;
use super::upstream::conn::{Conn, Sent};
use super::upstream::pool::{Pool, PoolKey};
use super::upstream::relay::{Held, Relay, Reuse};
use super::upstream::{self, request::UpRequest};
use crate::config::gateway::{UpstreamReuse, ValidGateway};
use crate::config::ValidConfig;

use super::catalog::find_inputs;
pub use super::catalog::{catalog, routing_inputs, CatalogModel, Routing};

/// A request sent and its response head read: the response (with its headers as lines when
/// the front door's own client read it), its connection, where the connection goes after, and
/// the request's share of the admission.
struct Forwarded {
    resp: Response<UpBody>,
    lines: Option<HeadLines>,
    conn: Box<Conn>,
    reuse: Option<Reuse>,
    grant: Grant,
    /// A Responses API answer: its id is learned with its backend.
    learner: Option<Learner>,
}

/// What the phases of a proxied request need, shared by every connection of a worker.
pub struct Pipeline {
    cfg: ValidGateway,
    /// What the client side reads of `cfg` (the body's limit and timeout).
    client: Settings,
    models: BTreeMap<String, CatalogModel>,
    metrics: Arc<GatewayMetrics>,
    /// The `max_concurrent` slots, shared by every worker.
    permits: Arc<Semaphore>,
    /// Idle upstream connections by routing inputs (`None`: `upstream_reuse = "never"`).
    pool: Option<Arc<Pool>>,
    admission: Option<Control>,
    /// The Responses API's response ids and their backends, shared by every worker.
    responses: Arc<Responses>,
    /// The tenants, their metrics and the scheduler (with an admission on), when configured.
    tenancy: Option<Tenants>,
}

/// What the tenant and admission phases use when tenants are configured.
#[derive(Clone)]
struct Tenants {
    tenancy: Arc<Tenancy>,
    metrics: Arc<TenantMetrics>,
    sched: Option<Arc<Scheduler>>,
    /// `Retry-After` of a request over its tenant's concurrency.
    retry_after: u32,
}

impl Pipeline {
    /// The catalog of `config` with the `[gateway]` settings `cfg`.
    pub fn new(
        config: &ValidConfig,
        cfg: ValidGateway,
        metrics: Arc<GatewayMetrics>,
        admission: Option<Control>,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Self {
        let models = catalog(config, &cfg);
        super::metrics::register_tokenizer_caches(registry, &cfg.tokenizers);
        let tenancy = cfg.tenancy.clone().map(|t| {
            let tenancy = Tenancy::new(t);
            let names: Vec<&str> = tenancy.config().tenants.iter().map(|t| t.name.as_str()).collect();
            let metrics = Arc::new(TenantMetrics::new(&names, tenancy.config().levels, registry));
            let sched = admission
                .clone()
                .map(|a| Scheduler::new(a, tenancy.clone(), metrics.clone(), models.keys().map(String::as_str)));
            let retry_after = sched.as_ref().map_or(1, |s| s.retry_after());
            tracing::info!(
                tenants = tenancy.config().tenants.len(),
                levels = tenancy.config().levels,
                scheduler = sched.is_some(),
                "gateway: tenants on (the scheduler queues only with an admission on)"
            );
            Tenants { tenancy, metrics, sched, retry_after }
        });
        let permits = Arc::new(Semaphore::new(cfg.max_concurrent as usize));
        let pool = (cfg.upstream_reuse == UpstreamReuse::Conversation)
            .then(|| Pool::new(cfg.upstream_max_age, cfg.upstream_max_idle as usize, cfg.upstream_idle_mark_after));
        let responses = Responses::new(&cfg, metrics.responses_remembered.clone());
        Self { client: Settings::of(&cfg), cfg, models, metrics, permits, pool, admission, responses, tenancy }
    }

    /// The same pipeline (catalog, limits, metrics, the `max_concurrent` slots) for worker
    /// `index` of `workers`, with a pool of its own that keeps its share of
    /// `upstream_max_idle`.
    pub fn worker(&self, index: usize, workers: usize) -> Self {
        let max_idle = self.cfg.upstream_max_idle as usize;
        let workers = workers.max(1);
        let share = max_idle / workers + usize::from(index < max_idle % workers);
        let pool =
            self.pool.as_ref().map(|_| Pool::new(self.cfg.upstream_max_age, share, self.cfg.upstream_idle_mark_after));
        Self {
            cfg: self.cfg.clone(),
            client: self.client,
            models: self.models.clone(),
            metrics: self.metrics.clone(),
            permits: self.permits.clone(),
            pool,
            admission: self.admission.clone(),
            responses: self.responses.clone(),
            tenancy: self.tenancy.clone(),
        }
    }

    /// The `[gateway]` settings.
    pub fn config(&self) -> &ValidGateway {
        &self.cfg
    }

    /// The catalog's models, by name.
    pub fn models(&self) -> &BTreeMap<String, CatalogModel> {
        &self.models
    }

    /// Starts what runs beside the requests on the current runtime: the pool's sweeper.
    pub fn start(&self) {
        if let Some(pool) = &self.pool {
            Pool::spawn_sweeper(pool);
        }
    }

    /// A request to `endpoint`, through every phase; refusals and failures are answered in
    /// the error shape of `endpoint`'s API.
    pub async fn proxy(&self, endpoint: Endpoint, head: ReqHead, body: RequestBody, client: ClientIp) -> Answer {
        let mut log = RequestLog::start(self.metrics.clone(), head.method(), head.path());
        let deadline = Deadline::after(log.started(), self.cfg.total_timeout);
        let shape = endpoint.error_shape();
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return refused(log, ApiError::overloaded(self.cfg.max_concurrent).shaped(shape)).into();
        };
        match self.forward(endpoint, head, body, client, &mut log, deadline).await {
            Ok(forwarded) => self.answer(forwarded, endpoint, permit, log, deadline),
            Err(e) => refused(log, e.shaped(shape)).into(),
        }
    }

    /// The phases from the body to the response head: the request sent as it came (minus
    /// hop-by-hop headers, plus `X-Forwarded-For`) on a connection tagged with its inputs.
    async fn forward(
        &self,
        endpoint: Endpoint,
        head: ReqHead,
        body: RequestBody,
        client: ClientIp,
        log: &mut RequestLog,
        deadline: Deadline,
    ) -> Result<Forwarded, ApiError> {
        let client_version = head.version();
        let bytes = body.read(&head, self.client, deadline).await?;
        let (mut inputs, fields) = self.inputs(endpoint, &head, &bytes, log)?;
        let tenant = self.tenant(endpoint, &head, &fields, &client, log)?;
        // The prompt's prefix keys, for a model that sends them: text keys now, from the fields
        // parsed; token-exact keys in phase **keys**, if the request opens a connection.
        let keyer = self.models.get(&inputs.model).and_then(|m| m.keyer.as_ref());
        let keys = keyer.map(|k| PendingKeys::new(k, endpoint, &fields, &bytes));
        drop(fields);
        let pinned = self.pinned(endpoint, &mut inputs)?;
        let conv_hash = inputs.conversation.as_ref().map(Conversation::hash);
        let grant = self.admit(&inputs, tenant, deadline, log).await?;
        let model = &self.models[&inputs.model];
        log.proxying(&model.series, conv_hash);
        // A pinned request never takes a kept connection: those go where the kernel picked.
        let key = match (&self.pool, conv_hash, &pinned) {
            (Some(_), Some(conversation), None) => {
                Some(PoolKey { model: model.index, memory_mb: inputs.memory_mb, conversation })
            }
            _ => None,
        };
        let req = UpRequest { head, body: bytes, client };
        let (mut resp, mut lines, conn) = match &pinned {
            None => {
                let tagging = Tagging { inputs: &inputs, keys, series: &model.series };
                self.exchange(key.as_ref(), model.vip, Some(tagging), req, deadline).await?
            }
            Some((id, stored)) => {
                let sent = self.exchange_pinned(id, stored, Param::PreviousResponseId, req, deadline).await;
                let outcome = match &sent {
                    Ok(_) => FollowUpLabel::PINNED,
                    Err(e) if e.status == StatusCode::NOT_FOUND => FollowUpLabel::GONE,
                    Err(_) => FollowUpLabel::FAILED,
                };
                self.metrics.follow_up(outcome);
                sent?
            }
        };
        let reuse = match (key, &self.pool) {
            (Some(key), Some(pool)) if keeps_alive(&resp) => Some(Reuse { pool: pool.clone(), key }),
            _ => None,
        };
        let learner = (endpoint == Endpoint::Responses && resp.status().is_success()).then(|| Learner {
            responses: self.responses.clone(),
            stored: Stored {
                backend: conn.backend,
                model: inputs.model.clone(),
                conversation: inputs.conversation.map(|c| c.key),
            },
        });
        log.upstream(conn.backend, resp.status().as_u16());
        answer_head(&mut resp, lines.as_mut(), &conn, conv_hash, client_version);
        Ok(Forwarded { resp, lines, conn, reuse, grant, learner })
    }

    /// Phase **inputs**, for a Responses API request with `previous_response_id`: the stored
    /// response's id and backend, the request taking that response's conversation.
    fn pinned(&self, endpoint: Endpoint, inputs: &mut Inputs) -> Result<Option<(String, Stored)>, ApiError> {
        let (Endpoint::Responses, Some(id)) = (endpoint, &inputs.previous_response_id) else { return Ok(None) };
        let stored = self
            .responses
            .pinned(id, Param::PreviousResponseId)
            .inspect_err(|_| self.metrics.follow_up(FollowUpLabel::UNKNOWN))?;
        if let Some(key) = &stored.conversation {
            if inputs.conversation.as_ref().is_none_or(|c| c.source == KeySource::Derived) {
                inputs.conversation = Some(Conversation { key: key.clone(), source: KeySource::PreviousResponse });
            }
        }
        Ok(Some((id.clone(), stored)))
    }

    /// Phase **inputs**: the routing inputs of the request (a model the catalog does not have
    /// is noted in the access log), and the body's fields they were read from.
    fn inputs<'b>(
        &self,
        endpoint: Endpoint,
        head: &ReqHead,
        body: &'b [u8],
        log: &mut RequestLog,
    ) -> Result<(Inputs, Fields<'b>), ApiError> {
        let found = find_inputs(&self.models, &self.cfg, endpoint, head, body).map_err(|e| match e {
            // Only a body that names its model makes a path of the server's a route here.
            InputsError::NoModel if endpoint == Endpoint::PassThrough => ApiError::not_found(format!(
                "POST {}: no such route (a path passed through to the model's servers needs the body's `model`)",
                head.path()
            )),
            e => {
                if let InputsError::UnknownModel { model } = &e {
                    log.model(model);
                }
                e.into()
            }
        })?;
        Ok(found)
    }

    /// Phase **tenant** (tenants configured): the request's tenant and priority (in the access
    /// log), its place among its tenant's requests in flight and its tokens from its tenant's
    /// bucket, or 429 past either.
    fn tenant(
        &self,
        endpoint: Endpoint,
        head: &ReqHead,
        body: &Fields<'_>,
        client: &ClientIp,
        log: &mut RequestLog,
    ) -> Result<Option<(Who, TenantSlot)>, ApiError> {
        let Some(t) = &self.tenancy else { return Ok(None) };
        let tenancy = &t.tenancy;
        let tenant = tenancy.identify(head, || client.addr());
        let (priority, asked) = tenancy.priority(tenant, head, body)?;
        let assumed = u64::from(tenancy.config().assumed_max_tokens);
        let cost = inputs::token_estimate(endpoint, body, assumed)?;
        log.tenant(tenancy.name(tenant), priority);
        let series = t.metrics.of(tenant, priority);
        let slot = tenancy.enter(tenant, t.retry_after).inspect_err(|_| {
            series.outcomes[outcome::CONCURRENCY_LIMITED].inc();
        })?;
        tenancy.take_tokens(tenant, cost, std::time::Instant::now()).inspect_err(|_| {
            series.outcomes[outcome::RATE_LIMITED].inc();
        })?;
        Ok(Some((Who { tenant, priority, asked, cost }, slot)))
    }

    /// Phase **exchange** of a request pinned to the backend that stored the response `id`:
    /// a fresh connection to that backend (not the VIP, so the kernel lets the connect through
    /// untouched: no pick to tag); a refused connect is the 404 that says it is gone.
    async fn exchange_pinned(
        &self,
        id: &str,
        stored: &Stored,
        param: Param,
        req: UpRequest,
        deadline: Deadline,
    ) -> Result<(Response<UpBody>, Option<HeadLines>, Box<Conn>), ApiError> {
        self.exchange(None, stored.backend, None, req, deadline).await.map_err(|e| {
            if e.code == Some(ApiError::NO_BACKEND) {
                responses::gone(id, stored.backend, param)
            } else {
                e
            }
        })
    }

    /// A request for the stored response `id` ([`responses::by_id`]: retrieve, cancel), sent as
    /// it came to the backend that stored it; the slot, body, exchange and answer phases of
    /// [`Pipeline::proxy`], without routing inputs or admission (a lookup, not a generation).
    pub async fn stored_response(&self, id: &str, head: ReqHead, body: RequestBody, client: ClientIp) -> Answer {
        let mut log = RequestLog::start(self.metrics.clone(), head.method(), head.path());
        let deadline = Deadline::after(log.started(), self.cfg.total_timeout);
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return refused(log, ApiError::overloaded(self.cfg.max_concurrent)).into();
        };
        let forwarded = async {
            let client_version = head.version();
            let bytes = body.read(&head, self.client, deadline).await?;
            let stored = self.responses.pinned(id, Param::ResponseId)?;
            let series = self.models.get(&stored.model).map(|m| &m.series);
            if let Some(series) = series {
                log.proxying(series, None);
            }
            let req = UpRequest { head, body: bytes, client };
            let (mut resp, mut lines, conn) =
                self.exchange_pinned(id, &stored, Param::ResponseId, req, deadline).await?;
            log.upstream(conn.backend, resp.status().as_u16());
            answer_head(&mut resp, lines.as_mut(), &conn, None, client_version);
            Ok::<_, ApiError>(Forwarded { resp, lines, conn, reuse: None, grant: Grant::default(), learner: None })
        };
        match forwarded.await {
            Ok(f) => self.answer(f, Endpoint::Responses, permit, log, deadline),
            Err(e) => refused(log, e).into(),
        }
    }

    /// Phase **admission**: the request's share of its model's admission, when one is on;
    /// through the scheduler for a request of a tenant (how long it waited in the access log).
    async fn admit(
        &self,
        inputs: &Inputs,
        tenant: Option<(Who, TenantSlot)>,
        deadline: Deadline,
        log: &mut RequestLog,
    ) -> Result<Grant, ApiError> {
        let Some((who, slot)) = tenant else {
            return match &self.admission {
                Some(a) => deadline.bound(a.admit(&inputs.model, inputs.memory_mb)).await.map(Grant::of),
                None => Ok(Grant::default()),
            };
        };
        let t = self.tenancy.as_ref().expect("a tenant comes from a configured tenancy");
        let grant = match &t.sched {
            Some(sched) => {
                let (grant, waited) = sched.admit(&inputs.model, inputs.memory_mb, who, deadline).await?;
                if let Waited::For(d) = waited {
                    log.waited(d);
                }
                grant
            }
            None => {
                let series = t.metrics.of(who.tenant, who.priority);
                series.outcomes[outcome::ADMITTED].inc();
                series.tokens.inc_by(who.cost);
                Grant::default()
            }
        };
        Ok(grant.with_tenant(slot))
    }

    /// Phase **exchange**: sends `req` on an idle connection with the same routing inputs
    /// (`key`) when the pool has one, else on a fresh connection to `vip` tagged with `tags`
    /// (a pinned request's backend instead of a VIP).
    async fn exchange(
        &self,
        key: Option<&PoolKey>,
        vip: SocketAddrV4,
        tagging: Option<Tagging<'_>>,
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
        let timeout = self.cfg.connect_timeout;
        // A later turn's keys withheld: the kernel places it by affinity without them, or asks.
        let mut placed = None;
        if let Some(Tagging { inputs, keys: Some(pending), series }) = &tagging {
            if pending.withheld() && inputs.conversation.is_some() {
                let tags = tags(inputs, &[]).prefix_on_request();
                placed = deadline.bound(upstream::connect::connect_unless_asked(vip, &tags, timeout)).await?;
                series.prefix_keys_withheld(&self.metrics, placed.is_some());
            }
        }
        let up = match placed {
            Some(up) => up,
            None => {
                // Phase **keys**, for a connection to open: a kept one involves no pick.
                let (inputs, keys) = match tagging {
                    Some(Tagging { inputs, keys: Some(pending), series }) => {
                        let (keys, took) = deadline.bound(async { Ok(pending.make().await) }).await?;
                        series.prefix_keys(&self.metrics).observe(took.as_secs_f64());
                        (Some(inputs), keys)
                    }
                    Some(Tagging { inputs, keys: None, .. }) => (Some(inputs), Vec::new()),
                    None => (None, Vec::new()),
                };
                let tags = inputs.map_or_else(Tags::new, |i| tags(i, &keys));
                deadline.bound(upstream::connect::connect(vip, &tags, timeout)).await?
            }
        };
        // The front door's own HTTP/1 client, or hyper's.
        let mut conn = if self.cfg.http1_fast_path {
            upstream::conn::open_raw(up)
        } else {
            deadline.bound(upstream::conn::open(up)).await?
        };
        self.metrics.upstream_request(false);
        match upstream::conn::send(&mut conn, req, idle, deadline).await? {
            Sent::Answered(resp, lines) => Ok((resp, lines, conn)),
            Sent::NotSent(_) => Err(ApiError::bad_gateway(format!(
                "upstream {}: the new connection closed before the request could be sent",
                conn.backend
            ))),
        }
    }

    /// Phase **answer**, its body: relayed as it comes, or, when it came whole with its head,
    /// ended now (nothing left to relay, wait for or time out).
    fn answer(
        &self,
        f: Forwarded,
        endpoint: Endpoint,
        permit: OwnedSemaphorePermit,
        log: RequestLog,
        deadline: Deadline,
    ) -> Answer {
        let Forwarded { resp, lines, conn, reuse, grant, learner } = f;
        let (parts, mut body) = resp.into_parts();
        let held = Held { _permit: permit, ticket: Some(grant) };
        if let Some(data) = body.take_whole() {
            if let Some(learner) = learner {
                responses::learn_whole(learner, &data);
            }
            upstream::relay::whole(body, &data, conn, reuse, held, log);
            return Answer { resp: Response::from_parts(parts, full(data)), lines };
        }
        let sse = match &lines {
            Some(l) => l.event_stream,
            None => parts.headers.get(CONTENT_TYPE).is_some_and(|v| is_event_stream(v.as_bytes())),
        };
        let shape = sse.then_some(endpoint.error_shape());
        let relay = Relay::new(body, shape, conn, reuse, held, log, self.cfg.idle_timeout, deadline);
        let body = match learner {
            Some(learner) => Learn::new(relay, sse, learner).boxed_unsync(),
            None => relay.boxed_unsync(),
        };
        Answer { resp: Response::from_parts(parts, body), lines }
    }
}

/// What a request's new upstream connection is tagged with: its routing inputs and, for a
/// model that sends them, its prefix keys, made only when the connection is opened.
struct Tagging<'a> {
    inputs: &'a Inputs,
    keys: Option<PendingKeys>,
    series: &'a ModelSeries,
}

/// Phase **tags**: the socket options that carry `inputs` and the prompt's prefix `keys` to
/// the kernel's pick.
fn tags<'a>(inputs: &'a Inputs, keys: &'a [u64]) -> Tags<'a> {
    let mut tags = Tags::new().model(inputs.model.as_str());
    if !keys.is_empty() {
        tags = tags.prefix(keys);
    }
    if let Some(c) = &inputs.conversation {
        tags = tags.conversation(c.key.as_str());
    }
    if let Some(mb) = inputs.memory_mb {
        tags = tags.required_memory_mb(mb);
    }
    tags
}

/// Phase **answer**, its head: the upstream's hop-by-hop headers out, the backend and the
/// conversation's hash in (as lines when the front door's own client read the head, else in
/// the map), and the client's HTTP version: the upstream's is its connection's business (an
/// HTTP/1.0 answer would make the client's keep-alive connection close).
fn answer_head(
    resp: &mut Response<UpBody>,
    lines: Option<&mut HeadLines>,
    conn: &Conn,
    conv_hash: Option<u64>,
    client_version: Version,
) {
    end_to_end(resp.headers_mut());
    *resp.version_mut() = client_version;
    match lines {
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

/// Answers `e` and closes the request's log.
fn refused(mut log: RequestLog, e: ApiError) -> Response<Body> {
    log.status(e.status.as_u16());
    let outcome = if e.status.is_server_error() { "upstream failure" } else { "refused" };
    log.finish(outcome);
    e.into_response()
}
