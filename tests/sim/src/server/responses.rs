//! `POST /v1/responses`, OpenAI's Responses API as vLLM 0.32.0 serves it, enough to route it:
//! `input` (a string or a list of input items) and `instructions` make the prompt,
//! `max_output_tokens` the answer (16 when absent). With `store` (default true) the finished
//! response is kept in THIS server's memory, for ever, as vLLM keeps it; a request naming it in
//! `previous_response_id` continues its conversation (its tokens count in the prompt), and an
//! id this server does not hold is a 404 "Response with id '...' not found." (`type`
//! `invalid_request_error`, `param` `response_id`), as vLLM answers. (vLLM stores only when
//! started with `VLLM_ENABLE_RESPONSES_API_STORE=1`, ignoring `store` otherwise; the simulator
//! stores as if it were.)
//! `GET /v1/responses/{id}` answers a stored response, `POST /v1/responses/{id}/cancel` vLLM's
//! 400 for a response that is not running in the background (the simulator runs none).
//! Streamed (`"stream": true`): `response.created` (the id), `response.in_progress`, the output
//! item and content part added, one `response.output_text.delta` per token, then the done
//! events and `response.completed`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::events::{self, Events};
use super::request::DEFAULT_MAX_TOKENS;
use super::{admit, error, wait_until, App, SeqGuard};
use crate::gpu::SimRequest;
use crate::text;

/// A response this server stored.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    /// Tokens of its conversation: its prompt (with the responses before it) and its output.
    tokens: u64,
    /// The response object, as `GET /v1/responses/{id}` answers it.
    response: Value,
}

/// A Responses request as the simulator reads it.
#[derive(Debug)]
struct Request {
    model: Option<String>,
    text: Vec<u8>,
    max_tokens: u64,
    stream: bool,
    store: bool,
    previous: Option<String>,
    instructions: Value,
}

fn parse(body: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let mut text = Vec::new();
    if let Some(s) = v["instructions"].as_str() {
        text.extend_from_slice(s.as_bytes());
    }
    match &v["input"] {
        Value::String(s) => text.extend_from_slice(s.as_bytes()),
        Value::Array(items) => {
            for item in items {
                match &item["content"] {
                    Value::String(s) => text.extend_from_slice(s.as_bytes()),
                    Value::Array(parts) => {
                        for t in parts.iter().filter_map(|p| p["text"].as_str()) {
                            text.extend_from_slice(t.as_bytes());
                        }
                    }
                    _ => {}
                }
            }
        }
        Value::Null => return Err("input: Field required".into()),
        other => return Err(format!("input: {other} is not a string or a list of input items")),
    }
    let max_tokens = match &v["max_output_tokens"] {
        Value::Null => DEFAULT_MAX_TOKENS,
        m => m.as_u64().ok_or_else(|| format!("max_output_tokens: {m} is not a non-negative integer"))?,
    };
    let previous = match &v["previous_response_id"] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => return Err(format!("previous_response_id: {other} is not a string")),
    };
    Ok(Request {
        model: v["model"].as_str().filter(|m| !m.is_empty()).map(str::to_string),
        text,
        max_tokens: max_tokens.max(1),
        stream: v["stream"].as_bool().unwrap_or(false),
        store: v["store"].as_bool().unwrap_or(true),
        previous,
        instructions: v["instructions"].clone(),
    })
}

/// An error as vLLM's OpenAI routes send it: `{"error": {"message", "type", "param", "code"}}`.
fn vllm_error(status: StatusCode, kind: &str, param: Option<&str>, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}});
    (status, Json(body)).into_response()
}

/// A request that fails vLLM's validation of its fields (`FIELD: reason`), on any of its routes
/// the Messages API's too: 400 "Bad Request" in the OpenAI shape, naming the field.
pub(super) fn validation_error(msg: &str) -> Response {
    let param = msg.split_once(':').map(|(p, _)| p);
    vllm_error(StatusCode::BAD_REQUEST, "Bad Request", param, format!("1 validation error:\n  {msg}"))
}

/// What a response is while it is generated and when it is done.
#[derive(Clone)]
struct Shape {
    id: String,
    created: u64,
    model: String,
    previous: Option<String>,
    instructions: Value,
    store: bool,
    max_tokens: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    seq: u64,
}

impl Shape {
    fn item_id(&self) -> String {
        format!("msg_{}", &self.id["resp_".len()..])
    }

    fn item(&self, text: &str, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        let content = if done { json!([{"type": "output_text", "text": text, "annotations": []}]) } else { json!([]) };
        json!({"type": "message", "id": self.item_id(), "role": "assistant", "status": status, "content": content})
    }

    fn response(&self, done: bool) -> Value {
        let text = "tok ".repeat(self.max_tokens as usize);
        let (status, output, usage) = if done {
            let usage = json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.max_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.max_tokens,
            });
            ("completed", json!([self.item(&text, true)]), usage)
        } else {
            ("in_progress", json!([]), Value::Null)
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": status, "output": output, "usage": usage, "error": null, "incomplete_details": null,
            "instructions": self.instructions, "previous_response_id": self.previous, "store": self.store,
            "max_output_tokens": self.max_tokens, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
            "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}}, "truncation": "disabled",
            "metadata": {}, "background": false,
        })
    }

    fn next(&mut self, mut v: Value) -> Value {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        v
    }
}

/// The stream's events, and the response stored when its last token is sent.
struct Stream {
    shape: Shape,
    app: Arc<App>,
    conversation_tokens: u64,
}

impl Events for Stream {
    fn head(&mut self) -> Vec<Value> {
        let s = &self.shape;
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        let evs = [
            json!({"type": "response.created", "response": s.response(false)}),
            json!({"type": "response.in_progress", "response": s.response(false)}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": s.item("", false)}),
            json!({"type": "response.content_part.added", "item_id": s.item_id(), "output_index": 0, "content_index": 0, "part": part}),
        ];
        evs.into_iter().map(|e| self.shape.next(e)).collect()
    }

    fn token(&mut self, _k: u64) -> Value {
        let e = json!({"type": "response.output_text.delta", "item_id": self.shape.item_id(), "output_index": 0,
            "content_index": 0, "delta": "tok ", "logprobs": []});
        self.shape.next(e)
    }

    fn tail(&mut self) -> Vec<Value> {
        let s = &self.shape;
        let text = "tok ".repeat(s.max_tokens as usize);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        let evs = [
            json!({"type": "response.output_text.done", "item_id": s.item_id(), "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
            json!({"type": "response.content_part.done", "item_id": s.item_id(), "output_index": 0, "content_index": 0, "part": part}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": s.item(&text, true)}),
            json!({"type": "response.completed", "response": s.response(true)}),
        ];
        if s.store {
            store(&self.app, &s.id, self.conversation_tokens, s.response(true));
        }
        evs.into_iter().map(|e| self.shape.next(e)).collect()
    }
}

fn store(app: &App, id: &str, tokens: u64, response: Value) {
    app.stored_responses().insert(id.to_string(), Stored { tokens, response });
}

fn not_found(id: &str) -> Response {
    let message = format!("Response with id '{id}' not found.");
    vllm_error(StatusCode::NOT_FOUND, "invalid_request_error", Some("response_id"), message)
}

/// `GET /v1/responses/{id}`: the stored response, or vLLM's 404.
pub(super) async fn retrieve(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.stored_responses().get(&id) {
        Some(s) => Json(s.response.clone()).into_response(),
        None => not_found(&id),
    }
}

/// `POST /v1/responses/{id}/cancel`: only a background response can be cancelled, and the
/// simulator makes none, so a stored one is vLLM's 400.
pub(super) async fn cancel(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if !app.stored_responses().contains_key(&id) {
        return not_found(&id);
    }
    let message = "Cannot cancel a synchronous response.".to_string();
    vllm_error(StatusCode::BAD_REQUEST, "invalid_request_error", Some("response_id"), message)
}

/// A new response id, unique across servers (the front door keys its table by it).
fn new_id(app: &App) -> String {
    let n = app.next_chat.fetch_add(1, Ordering::Relaxed);
    format!("resp_{:016x}{n:08x}", app.id_seed)
}

pub(super) async fn create(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req = match parse(&body) {
        Ok(r) => r,
        Err(msg) => return validation_error(&msg),
    };
    if let Some(m) = req.model.as_deref().filter(|m| *m != app.cfg.model) {
        return error(StatusCode::NOT_FOUND, format!("The model `{m}` does not exist."));
    }
    let history = match &req.previous {
        None => 0,
        Some(id) => match app.stored_responses().get(id) {
            Some(s) => s.tokens,
            None => return not_found(id),
        },
    };
    let prompt_tokens = history + text::tokens_of(req.text.len());
    let sim = SimRequest {
        prompt_tokens,
        max_tokens: req.max_tokens,
        hash_ids: text::block_keys(&req.text),
        token_ids: Vec::new(),
    };
    let t0 = app.clock.now();
    let started = match admit(&app, &sim, t0).await {
        Ok(s) => s,
        Err(oom) => return vllm_error(StatusCode::BAD_REQUEST, "BadRequestError", None, oom.to_string()),
    };
    let seq = SeqGuard { app: app.clone(), id: started.id, done: false };
    let begin = Instant::now();
    let shape = Shape {
        id: new_id(&app),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: app.cfg.model.clone(),
        previous: req.previous,
        instructions: req.instructions,
        store: req.store,
        max_tokens: req.max_tokens,
        prompt_tokens,
        cached_tokens: started.cached_tokens,
        seq: 0,
    };
    let sim_headers = super::sim_headers(&app, &started, app.clock.now() - t0);
    let conversation_tokens = prompt_tokens + req.max_tokens;
    if req.stream {
        let stream = Stream { shape, app: app.clone(), conversation_tokens };
        return events::streamed(app.clock, started, req.max_tokens, seq, begin, stream, sim_headers);
    }
    wait_until(begin + app.clock.real(started.prefill_s + started.decode_s)).await;
    let mut seq = seq;
    seq.done = true;
    drop(seq);
    if shape.store {
        store(&app, &shape.id, conversation_tokens, shape.response(true));
    }
    (sim_headers, Json(shape.response(true))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_and_instructions_make_the_prompt_and_malformed_fields_are_named() {
        let r = parse(br#"{"model":"m","instructions":"ab","input":[{"role":"user","content":[{"type":"input_text","text":"cd"}]},{"role":"assistant","content":"ef"}],"max_output_tokens":3}"#).unwrap();
        assert_eq!((r.text.as_slice(), r.max_tokens, r.store, r.stream), (&b"abcdef"[..], 3, true, false));
        let r = parse(br#"{"input":"hi","store":false,"previous_response_id":"resp_1","stream":true}"#).unwrap();
        assert_eq!((r.store, r.stream, r.previous.as_deref(), r.max_tokens), (false, true, Some("resp_1"), 16));
        assert!(parse(br#"{"model":"m"}"#).unwrap_err().contains("input"));
        assert!(parse(br#"{"input":7}"#).unwrap_err().contains("input"));
        assert!(parse(br#"{"input":"x","previous_response_id":1}"#).unwrap_err().contains("previous_response_id"));
        assert!(parse(br#"{"input":"x","max_output_tokens":"many"}"#).unwrap_err().contains("max_output_tokens"));
    }
}
