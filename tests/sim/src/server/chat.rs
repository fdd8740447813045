//! `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI's chat and completion APIs,
//! answered whole or streamed (SSE, one chunk per token at its time), as vLLM answers them.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{
    admit, error, request, responses, sim_headers, wait_until, Api, App, Clock, SeqGuard, SimHeaders, STREAM_BATCH,
};
use crate::gpu::Started;

/// One answer being generated: what its chunks and its usage say.
struct Gen {
    api: Api,
    id: String,
    created: u64,
    model: String,
    started: Started,
    prompt_tokens: u64,
    max_tokens: u64,
    queued_s: f64,
}

impl Gen {
    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
            "prompt_tokens_details": {"cached_tokens": self.started.cached_tokens},
        })
    }
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut v = json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        Bytes::from(format!("data: {v}\n\n"))
    }
}

/// A chat or completion request: parsed, admitted to the GPU (waiting while queued), then
/// answered whole or streamed.
pub(super) async fn generate(State(app): State<Arc<App>>, body: Bytes, api: Api) -> Response {
    let parsed = request::parse_request(&body, api, app.tokens());
    let req = match parsed {
        Ok(r) => r,
        // vLLM's request models name the field under `body.` (pydantic's location).
        Err(msg) => return responses::validation_error(&format!("body.{msg}")),
    };
    // vLLM serves a model only under its served name and answers any other with a 404.
    if let Some(m) = req.model.as_deref().filter(|m| *m != app.cfg.model) {
        return error(
            StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist. Valid aliases: {}.", app.cfg.model),
        );
    }
    let t0 = app.clock.now();
    let started = match admit(&app, &req.sim, t0).await {
        Ok(s) => s,
        Err(oom) => return error(StatusCode::BAD_REQUEST, oom.to_string()),
    };
    let seq = SeqGuard { app: app.clone(), id: started.id, done: false };
    let begin = Instant::now();
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Completion => "cmpl",
    };
    let gen = Gen {
        api,
        id: format!("{prefix}-sim-{}", app.next_chat.fetch_add(1, Ordering::Relaxed)),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: app.cfg.model.clone(),
        started,
        prompt_tokens: req.sim.prompt_tokens,
        max_tokens: req.sim.max_tokens,
        queued_s: app.clock.now() - t0,
    };
    let sim_headers = sim_headers(&app, &gen.started, gen.queued_s);
    if req.stream {
        streamed(app.clock, req.include_usage, gen, seq, begin, sim_headers)
    } else {
        whole(app.clock, gen, seq, begin, sim_headers).await
    }
}

/// Not streamed: one `chat.completion` when the last token is due (the sequence ends then).
async fn whole(clock: Clock, gen: Gen, seq: SeqGuard, begin: Instant, sim_headers: SimHeaders) -> Response {
    let s = gen.started;
    wait_until(begin + clock.real(s.prefill_s + s.decode_s)).await;
    let mut seq = seq;
    seq.done = true;
    drop(seq);
    let text = "tok ".repeat(gen.max_tokens as usize);
    let (object, choice) = match gen.api {
        Api::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}),
        ),
        Api::Completion => ("text_completion", json!({"index": 0, "text": text, "finish_reason": "length"})),
    };
    let body = json!({
        "id": gen.id, "object": object, "created": gen.created, "model": gen.model,
        "choices": [choice],
        "usage": gen.usage(),
        "ailb_sim": {"cached_tokens": s.cached_tokens, "prefill_s": s.prefill_s, "decode_s": s.decode_s, "queued_s": gen.queued_s},
    });
    (sim_headers, Json(body)).into_response()
}

/// Streamed: one SSE chunk per token at its time (a chat's first token preceded by a chunk
/// with only the role and empty content, as vLLM sends it), then the usage chunk when asked
/// for, then `[DONE]`; the sequence ends with its last token.
fn streamed(
    clock: Clock,
    include_usage: bool,
    gen: Gen,
    seq: SeqGuard,
    begin: Instant,
    sim_headers: SimHeaders,
) -> Response {
    // Token k (1-based) is due at prefill + (k - 1) decode steps: the first comes out of prefill
    // and is sent alone at that instant (TTFT); later tokens due within STREAM_BATCH of each
    // other leave together, one SSE event each, when the last of them is due (so the last token,
    // the end-to-end time, is exact and no token leaves early). At 20x a decode step is about a
    // millisecond of real time: a write per token would cost the host more CPU than the whole
    // balancer, and a busy host delays every timer (the measurement's noise).
    let per_batch =
        (STREAM_BATCH.as_secs_f64() / clock.real(gen.started.token_s).as_secs_f64().max(1e-9)).floor().max(1.0) as u64;
    let st = (Some(seq), 1u64, gen);
    let stream = futures_util::stream::unfold(st, move |(mut seq, k, gen)| async move {
        let s = gen.started;
        if k <= gen.max_tokens {
            let last = if k == 1 { 1 } else { (k + per_batch - 1).min(gen.max_tokens) };
            let at = begin + clock.real(s.prefill_s + (last - 1) as f64 * s.token_s);
            wait_until(at).await;
            let mut out = Vec::new();
            if k == 1 && gen.api == Api::Chat {
                let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]);
                out.extend_from_slice(&gen.chunk(role, None));
            }
            for j in k..=last {
                let finish = if j == gen.max_tokens { json!("length") } else { Value::Null };
                let choice = match gen.api {
                    Api::Chat => json!({"index": 0, "delta": {"content": "tok "}, "finish_reason": finish}),
                    Api::Completion => json!({"index": 0, "text": "tok ", "finish_reason": finish}),
                };
                out.extend_from_slice(&gen.chunk(json!([choice]), None));
            }
            if last == gen.max_tokens {
                if let Some(s) = seq.as_mut() {
                    s.done = true;
                }
                seq = None;
            }
            return Some((Ok::<_, Infallible>(Bytes::from(out)), (seq, last + 1, gen)));
        }
        let bytes = if k == gen.max_tokens + 1 && include_usage {
            gen.chunk(json!([]), Some(gen.usage()))
        } else if k <= gen.max_tokens + 2 {
            let done = Bytes::from_static(b"data: [DONE]\n\n");
            return Some((Ok(done), (seq, gen.max_tokens + 3, gen)));
        } else {
            return None;
        };
        Some((Ok(bytes), (seq, k + 1, gen)))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    for (k, v) in sim_headers {
        h.insert(k, v.parse().expect("digits are a header value"));
    }
    resp
}
