//! `POST /v1/messages`, Anthropic's Messages API as vLLM 0.32.0 serves it, enough to route it:
//! `system` (a string or text blocks) and `messages` make the prompt, `max_tokens` (required)
//! the answer. Not streamed: one `message` object. Streamed: `message_start`,
//! `content_block_start`, one `content_block_delta` per token, `content_block_stop`,
//! `message_delta` (the stop reason and output tokens), `message_stop`, each `event: TYPE` and
//! `data: JSON`. Errors as vLLM sends them on this route: a request its validation refuses
//! (no `max_tokens`, `max_tokens` 0, no `messages`) in the OpenAI shape with `type` "Bad
//! Request" (FastAPI's validation handler is the server's, not the route's); any other in
//! Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, whose `type` is vLLM's
//! name of the error ("NotFoundError" for another model).
//!
//! `POST /v1/messages/count_tokens` answers `{"input_tokens": N}`.
//!
//! For the tests of what a router passes upstream, the answer also says what it saw of the
//! client's Anthropic headers: `x-ailb-sim-anthropic-version` (the value) and
//! `x-ailb-sim-x-api-key` (its length; vLLM sends neither).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::events::{self, Events};
use super::{admit, wait_until, App, SeqGuard};
use crate::gpu::SimRequest;
use crate::text;

/// A Messages request as the simulator reads it.
#[derive(Debug)]
struct Request {
    model: Option<String>,
    text: Vec<u8>,
    max_tokens: u64,
    stream: bool,
}

fn push_text(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(blocks) => {
            for t in blocks.iter().filter_map(|b| b["text"].as_str()) {
                out.extend_from_slice(t.as_bytes());
            }
        }
        _ => {}
    }
}

fn parse(body: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let mut text = Vec::new();
    push_text(&v["system"], &mut text);
    let Some(messages) = v["messages"].as_array() else {
        return Err("messages: Field required (a list of messages)".into());
    };
    for m in messages {
        push_text(&m["content"], &mut text);
    }
    let max_tokens = match &v["max_tokens"] {
        Value::Null => return Err("max_tokens: Field required".into()),
        m => m.as_u64().filter(|&n| n > 0).ok_or_else(|| format!("max_tokens: {m}: max_tokens must be positive"))?,
    };
    Ok(Request {
        model: v["model"].as_str().filter(|m| !m.is_empty()).map(str::to_string),
        text,
        max_tokens,
        stream: v["stream"].as_bool().unwrap_or(false),
    })
}

/// An error in Anthropic's shape, its `type` vLLM's name of the error (as vLLM translates its
/// errors on this route).
fn api_error(status: StatusCode, kind: &str, message: String) -> Response {
    (status, Json(json!({"type": "error", "error": {"type": kind, "message": message}}))).into_response()
}

struct Message {
    id: String,
    model: String,
    input_tokens: u64,
    max_tokens: u64,
}

impl Message {
    fn whole(&self) -> Value {
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [{"type": "text", "text": "tok ".repeat(self.max_tokens as usize)}],
            "stop_reason": "max_tokens", "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.max_tokens},
        })
    }
}

impl Events for Message {
    fn head(&mut self) -> Vec<Value> {
        let start = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        });
        vec![
            json!({"type": "message_start", "message": start}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ]
    }

    fn token(&mut self, _k: u64) -> Value {
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "tok "}})
    }

    fn tail(&mut self) -> Vec<Value> {
        vec![
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                "usage": {"output_tokens": self.max_tokens}}),
            json!({"type": "message_stop"}),
        ]
    }
}

pub(super) async fn create(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let req = match parse(&body) {
        Ok(r) => r,
        Err(msg) => return super::responses::validation_error(&msg),
    };
    if let Some(m) = req.model.as_deref().filter(|m| *m != app.cfg.model) {
        return api_error(StatusCode::NOT_FOUND, "NotFoundError", format!("The model `{m}` does not exist."));
    }
    let sim = SimRequest {
        prompt_tokens: text::tokens_of(req.text.len()),
        max_tokens: req.max_tokens,
        hash_ids: text::block_keys(&req.text),
        token_ids: Vec::new(),
    };
    let t0 = app.clock.now();
    let started = match admit(&app, &sim, t0).await {
        Ok(s) => s,
        Err(oom) => return api_error(StatusCode::BAD_REQUEST, "BadRequestError", oom.to_string()),
    };
    let seq = SeqGuard { app: app.clone(), id: started.id, done: false };
    let begin = Instant::now();
    let msg = Message {
        id: format!("msg_{:016x}{:08x}", app.id_seed, app.next_chat.fetch_add(1, Ordering::Relaxed)),
        model: app.cfg.model.clone(),
        input_tokens: sim.prompt_tokens,
        max_tokens: req.max_tokens,
    };
    let sim_headers = super::sim_headers(&app, &started, app.clock.now() - t0);
    let mut resp = if req.stream {
        events::streamed(app.clock, started, req.max_tokens, seq, begin, msg, sim_headers)
    } else {
        wait_until(begin + app.clock.real(started.prefill_s + started.decode_s)).await;
        let mut seq = seq;
        seq.done = true;
        drop(seq);
        (sim_headers, Json(msg.whole())).into_response()
    };
    let seen = |name: &str| headers.get(name).map(|v| v.as_bytes().to_vec());
    let h = resp.headers_mut();
    if let Some(v) = seen("anthropic-version").and_then(|v| HeaderValue::from_bytes(&v).ok()) {
        h.insert("x-ailb-sim-anthropic-version", v);
    }
    if let Some(key) = seen("x-api-key") {
        h.insert("x-ailb-sim-x-api-key", HeaderValue::from(key.len()));
    }
    resp
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}` for the system and messages.
pub(super) async fn count_tokens(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let mut v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return super::responses::validation_error(&format!("body: {e}")),
    };
    // Nothing is generated: any positive max_tokens reads the same prompt.
    v["max_tokens"] = json!(1);
    let req = match parse(v.to_string().as_bytes()) {
        Ok(r) => r,
        Err(msg) => return super::responses::validation_error(&msg),
    };
    if let Some(m) = req.model.as_deref().filter(|m| *m != app.cfg.model) {
        return api_error(StatusCode::NOT_FOUND, "NotFoundError", format!("The model `{m}` does not exist."));
    }
    let mut resp = Json(json!({"input_tokens": text::tokens_of(req.text.len())})).into_response();
    resp.headers_mut()
        .insert("x-ailb-backend", HeaderValue::from_str(&app.addr).expect("an address is a header value"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_and_messages_make_the_prompt_and_max_tokens_is_required() {
        let r = parse(br#"{"model":"m","system":[{"type":"text","text":"ab"}],"messages":[{"role":"user","content":"cd"},{"role":"assistant","content":[{"type":"text","text":"ef"}]}],"max_tokens":3}"#).unwrap();
        assert_eq!((r.text.as_slice(), r.max_tokens, r.stream), (&b"abcdef"[..], 3, false));
        assert!(parse(br#"{"messages":[]}"#).unwrap_err().contains("max_tokens"));
        assert!(parse(br#"{"max_tokens":1}"#).unwrap_err().contains("messages"));
        assert!(parse(br#"{"messages":[],"max_tokens":0}"#).unwrap_err().contains("must be positive"));
    }
}
