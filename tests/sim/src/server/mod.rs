//! The HTTP face of the simulated GPU: an OpenAI-compatible server (axum) over one
//! [`Gpu`](crate::gpu::Gpu). Everything the model answers in simulated seconds becomes a
//! sleep of `seconds / time_scale`.
//!
//! Routes: `POST /v1/chat/completions` and `POST /v1/completions` (SSE when `"stream": true`,
//! [`chat`]),
//! `POST /v1/responses` (OpenAI's Responses API, with stored responses, [`responses`]),
//! `POST /v1/messages` (Anthropic's Messages API, [`anthropic`]), `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM names, [`metrics`]), `GET /sim/state`
//! (JSON for reports); any other path is a 404 with FastAPI's body, as vLLM answers it.
//! See [the crate docs](crate) for the request extension and the error format.

mod anthropic;
mod chat;
mod events;
mod metrics;
mod request;
mod responses;

pub use request::{
    parse_chat, parse_completion, parse_request, token_block_keys, Api, ChatRequest, Tokens, DEFAULT_MAX_TOKENS,
};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ailb_userspace::tokenize::ChatTokenizer;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};

use crate::gpu::{Admission, Gpu, GpuProfile, OutOfMemory, ReqId, SimRequest, Started};
use crate::kv_events::{KvEventsConfig, Publisher};

/// How to run one simulated server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub profile: GpuProfile,
    /// The served model name (`/v1/models`, the `model_name` label).
    pub model: String,
    /// Simulated seconds per real second (10 = ten times faster than real).
    pub time_scale: f64,
    /// Fake-NVML state file to keep up to date (`tests/integration/fixtures/fake_nvml.c` format).
    pub nvml_state: Option<PathBuf>,
    /// UUID written to the NVML state file.
    pub gpu_uuid: String,
    /// Real time between utilisation samples (and NVML state writes).
    pub sample_interval: Duration,
    /// The model's tokenizer: prompts are counted and cached by their real token ids (chat
    /// and completion requests), as the engine tokenizes them. `None`: `bytes / 4` tokens.
    pub tokenizer: Option<Arc<ChatTokenizer>>,
    /// Publish the prefix cache's KV events as vLLM does ([`crate::kv_events`]).
    pub kv_events: Option<KvEventsConfig>,
}

impl SimConfig {
    /// A server of `profile` serving `model` at `time_scale`, without NVML state, tokenizer or
    /// KV events.
    pub fn new(profile: GpuProfile, model: &str, time_scale: f64) -> Self {
        SimConfig {
            profile,
            model: model.to_string(),
            time_scale,
            nvml_state: None,
            gpu_uuid: "GPU-5133a1b0-0000-0000-0000-000000000000".to_string(),
            sample_interval: Duration::from_millis(200),
            tokenizer: None,
            kv_events: None,
        }
    }
}

/// Converts between real and simulated time.
#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    scale: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.scale
    }
    fn real(&self, sim_s: f64) -> Duration {
        Duration::from_secs_f64((sim_s / self.scale).max(0.0))
    }
}

struct Inner {
    gpu: Gpu,
    waiters: HashMap<ReqId, oneshot::Sender<Started>>,
    /// Running requests whose client went away before their last token (the GPU model counts
    /// every ended sequence as finished; vLLM does not count these).
    aborted: u64,
    /// Busy fraction (0..=1) of the last sample window.
    util: f64,
    last_sample: (f64, f64),
    nvml_write_errors: u64,
}

struct App {
    inner: Mutex<Inner>,
    clock: Clock,
    cfg: SimConfig,
    next_chat: AtomicU64,
    /// This server's `ip:port`, sent as `x-ailb-backend` so that a client can tell which GPU
    /// served it (the affinity hit rate of a replay).
    addr: String,
    /// Makes this server's response and message ids unlike any other server's.
    id_seed: u64,
    /// The Responses API's stored responses, by id: in this server's memory only, as vLLM
    /// keeps them.
    stored: Mutex<HashMap<String, responses::Stored>>,
    /// Woken after the GPU model changed, when KV events are published.
    kv_changed: Option<Arc<Notify>>,
}

impl App {
    /// The GPU model may have changed its cache: the KV-event publisher takes the changes.
    fn changed(&self) {
        if let Some(n) = &self.kv_changed {
            n.notify_one();
        }
    }

    /// Where this server's requests take their token ids from.
    fn tokens(&self) -> request::Tokens<'_> {
        match (&self.cfg.tokenizer, &self.cfg.kv_events) {
            (Some(t), _) => request::Tokens::Model(t),
            (None, Some(_)) => request::Tokens::Pseudo,
            (None, None) => request::Tokens::None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent model (every mutation completes
        // before any await), so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stored_responses(&self) -> MutexGuard<'_, HashMap<String, responses::Stored>> {
        // Each insert completes under the lock.
        self.stored.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Hands newly started requests to their waiting handlers; a handler that is gone frees its
/// slot again at once.
fn wake(inner: &mut Inner, mut started: Vec<Started>, now: f64) {
    while let Some(s) = started.pop() {
        let delivered = match inner.waiters.remove(&s.id) {
            Some(tx) => tx.send(s).is_ok(),
            None => false,
        };
        if !delivered {
            started.extend(inner.gpu.finish(s.id, now));
        }
    }
}

/// Ends a running sequence when dropped (generation done or client gone).
struct SeqGuard {
    app: Arc<App>,
    id: ReqId,
    /// Its last token was sent; dropped before that, the client went away.
    done: bool,
}

impl Drop for SeqGuard {
    fn drop(&mut self) {
        let now = self.app.clock.now();
        let mut inner = self.app.lock();
        if !self.done {
            inner.aborted += 1;
        }
        let started = inner.gpu.finish(self.id, now);
        wake(&mut inner, started, now);
        drop(inner);
        self.app.changed();
    }
}

/// A queued request; dropping it before it starts leaves the queue.
struct WaitGuard {
    app: Arc<App>,
    id: ReqId,
    rx: Option<oneshot::Receiver<Started>>,
}

impl WaitGuard {
    async fn wait(mut self) -> Started {
        let rx = self.rx.as_mut().expect("receiver present until wait ends");
        let started = rx.await.expect("the sender lives in App until it sends");
        self.rx = None;
        started
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let now = self.app.clock.now();
        let mut inner = self.app.lock();
        inner.waiters.remove(&self.id);
        match inner.gpu.cancel(self.id, now) {
            Some(started) => wake(&mut inner, started, now),
            None => {
                if let Ok(s) = rx.try_recv() {
                    let started = inner.gpu.finish(s.id, now);
                    wake(&mut inner, started, now);
                }
            }
        }
        drop(inner);
        self.app.changed();
    }
}

/// Serves until the listener fails; binds the KV-event sockets first when `cfg.kv_events`
/// asks for them (and says where on stderr).
pub async fn serve(listener: tokio::net::TcpListener, cfg: SimConfig) -> std::io::Result<()> {
    let publisher = match &cfg.kv_events {
        None => None,
        Some(kv) => {
            let (publisher, bound) = Publisher::bind(kv).await.map_err(std::io::Error::other)?;
            eprintln!(
                "ailb-sim: kv events on {} (replay {}), blocks of {} tokens",
                bound.endpoint,
                bound.replay_endpoint.as_deref().unwrap_or("off"),
                kv.block_size
            );
            Some(publisher)
        }
    };
    serve_with(listener, cfg, publisher).await
}

/// [`serve`] with a KV-event publisher already bound ([`Publisher::bind`], which tells the ports
/// it bound).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    cfg: SimConfig,
    publisher: Option<Publisher>,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?.to_string();
    let mut gpu = Gpu::new(cfg.profile.clone());
    let kv_changed = publisher.as_ref().map(|_| {
        gpu.record_cache_changes();
        Arc::new(Notify::new())
    });
    let app = Arc::new(App {
        inner: Mutex::new(Inner {
            gpu,
            waiters: HashMap::new(),
            aborted: 0,
            util: 0.0,
            last_sample: (0.0, 0.0),
            nvml_write_errors: 0,
        }),
        clock: Clock { start: Instant::now(), scale: cfg.time_scale },
        cfg,
        next_chat: AtomicU64::new(0),
        id_seed: id_seed(&addr),
        addr,
        stored: Mutex::new(HashMap::new()),
        kv_changed,
    });
    tokio::spawn(sampler(app.clone()));
    if let Some(publisher) = publisher {
        tokio::spawn(publish(app.clone(), publisher));
    }
    let router = Router::new()
        .route("/v1/chat/completions", post(|s, b| chat::generate(s, b, Api::Chat)))
        .route("/v1/completions", post(|s, b| chat::generate(s, b, Api::Completion)))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/messages", post(anthropic::create))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics::metrics))
        .route("/sim/state", get(state))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))) })
        .with_state(app);
    axum::serve(listener, router).await
}

/// Publishes the GPU model's cache changes, one batch per wake-up (an engine publishes one per
/// scheduler step).
async fn publish(app: Arc<App>, mut publisher: Publisher) {
    let Some(changed) = app.kv_changed.clone() else { return };
    loop {
        changed.notified().await;
        let changes = app.lock().gpu.take_cache_changes();
        if !changes.is_empty() {
            publisher.publish(changes).await;
        }
    }
}

/// vLLM's `POST /reset_prefix_cache`: every cached block dropped (`AllBlocksCleared`). While
/// sequences run the model refuses, as vLLM's cache does; the simulator then answers 409 so that
/// a caller can tell.
async fn reset_prefix_cache(State(app): State<Arc<App>>) -> Response {
    let reset = app.lock().gpu.reset_prefix_cache();
    app.changed();
    if reset {
        StatusCode::OK.into_response()
    } else {
        error(StatusCode::CONFLICT, "the prefix cache was not reset: sequences are running".into())
    }
}

/// A seed from the server's address and its start time.
fn id_seed(addr: &str) -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    ailb_common::hash::fmix64(ailb_common::hash::conversation_hash(addr.as_bytes()) ^ nanos)
}

/// Samples utilisation every interval and rewrites the NVML state file.
async fn sampler(app: Arc<App>) {
    let mut tick = tokio::time::interval(app.cfg.sample_interval);
    loop {
        tick.tick().await;
        let now = app.clock.now();
        let text = {
            let mut inner = app.lock();
            let busy = inner.gpu.busy_seconds(now);
            let (t0, b0) = inner.last_sample;
            if now > t0 {
                inner.util = ((busy - b0) / (now - t0)).clamp(0.0, 1.0);
                inner.last_sample = (now, busy);
            }
            nvml_state_text(&app.cfg, &inner)
        };
        if let Some(path) = &app.cfg.nvml_state {
            let tmp = path.with_extension("tmp");
            let res = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
            if let Err(e) = res {
                app.lock().nvml_write_errors += 1;
                eprintln!("ailb-sim: writing NVML state {}: {e}", path.display());
            }
        }
    }
}

fn nvml_state_text(cfg: &SimConfig, inner: &Inner) -> String {
    let p = inner.gpu.profile();
    format!(
        "count 1\n0 name {}\n0 uuid {}\n0 total_mb {}\n0 used_mb {}\n0 util {}\n",
        p.gpu_type,
        cfg.gpu_uuid,
        p.gpu_memory_mb,
        inner.gpu.memory_used_mb(),
        (inner.util * 100.0).round() as u64
    )
}

/// An OpenAI-style error body, as vLLM sends it.
fn error(status: StatusCode, message: String) -> Response {
    let kind = match status {
        StatusCode::BAD_REQUEST => "BadRequestError",
        StatusCode::CONFLICT => "ConflictError",
        StatusCode::NOT_FOUND => "NotFoundError",
        _ => "InternalServerError",
    };
    let param = if status == StatusCode::NOT_FOUND { json!("model") } else { Value::Null };
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// Streamed tokens due within this much real time of each other are written together.
const STREAM_BATCH: Duration = Duration::from_millis(10);

/// The headers every answer carries: who served it, its cached tokens, its time in the queue.
type SimHeaders = [(&'static str, String); 3];

/// The headers of an answer of `app` to a request `started` after `queued_s` in the queue.
fn sim_headers(app: &App, started: &Started, queued_s: f64) -> SimHeaders {
    [
        ("x-ailb-backend", app.addr.clone()),
        ("x-ailb-sim-cached-tokens", started.cached_tokens.to_string()),
        ("x-ailb-sim-queued-s", format!("{queued_s:.6}")),
    ]
}

/// Admits the request to the GPU at `t0`, waiting while it is queued; the GPU's refusal when
/// its KV cache can never hold it.
async fn admit(app: &Arc<App>, req: &SimRequest, t0: f64) -> Result<Started, OutOfMemory> {
    let admission = {
        let mut inner = app.lock();
        match inner.gpu.admit(req.clone(), t0) {
            Admission::Start(s) => Ok(s),
            Admission::Queued(id) => {
                let (tx, rx) = oneshot::channel();
                inner.waiters.insert(id, tx);
                Err(Ok(WaitGuard { app: app.clone(), id, rx: Some(rx) }))
            }
            Admission::Reject(oom) => Err(Err(oom)),
        }
    };
    app.changed();
    match admission {
        Ok(s) => Ok(s),
        Err(Ok(wait)) => Ok(wait.wait().await),
        Err(Err(oom)) => Err(oom),
    }
}

/// Waits until `at`, and not at all when it has passed. tokio's timer counts in whole
/// milliseconds and rounds a deadline up to the next one, so a `sleep_until` of a deadline
/// already past (a one-token answer at a large time scale is due nanoseconds after it began)
/// would still wait for the next millisecond tick: every answer up to a millisecond late.
async fn wait_until(at: Instant) {
    if at > Instant::now() {
        tokio::time::sleep_until(at.into()).await;
    }
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    let max_len = app.cfg.profile.kv_blocks() * crate::gpu::BLOCK_TOKENS;
    Json(json!({"object": "list", "data": [
        {"id": app.cfg.model, "object": "model", "created": 0, "owned_by": "ailb-sim", "max_model_len": max_len}
    ]}))
}

async fn state(State(app): State<Arc<App>>) -> Json<Value> {
    let now = app.clock.now();
    let inner = app.lock();
    let g = &inner.gpu;
    let p = g.profile();
    Json(json!({
        "gpu_type": p.gpu_type,
        "model": app.cfg.model,
        "time_scale": app.cfg.time_scale,
        "sim_time_s": now,
        "running": g.running(),
        "waiting": g.waiting(),
        "max_seqs": p.max_seqs,
        "kv_blocks_total": g.kv_blocks_total(),
        "kv_blocks_in_use": g.kv_blocks_in_use(),
        "kv_blocks_cached": g.kv_blocks_cached(),
        "kv_cache_usage": g.kv_usage(),
        "memory_total_mb": p.gpu_memory_mb,
        "memory_used_mb": g.memory_used_mb(),
        "busy_seconds": g.busy_seconds(now),
        "busy_fraction": if now > 0.0 { g.busy_seconds(now) / now } else { 0.0 },
        "utilization": inner.util,
        "nvml_write_errors": inner.nvml_write_errors,
        "counters": g.counters(),
    }))
}

#[cfg(test)]
mod tests;
