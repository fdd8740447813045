//! Token-timed event streams of the agents' APIs (Responses and Anthropic Messages): the
//! events before the first token, one event per token at its time, the events after the
//! last, each written `event: TYPE` and `data: JSON` as vLLM writes them.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::Value;

use super::{wait_until, Clock, SeqGuard, SimHeaders, STREAM_BATCH};
use crate::gpu::Started;

/// One named event.
pub(super) fn event(v: &Value) -> Vec<u8> {
    let kind = v["type"].as_str().unwrap_or("message");
    format!("event: {kind}\ndata: {v}\n\n").into_bytes()
}

/// What a stream says around its tokens.
pub(super) trait Events: Send + 'static {
    /// The events before the first token (sent with it, when prefill ends).
    fn head(&mut self) -> Vec<Value>;
    /// The event of token `k` (1-based).
    fn token(&mut self, k: u64) -> Value;
    /// The events after the last token.
    fn tail(&mut self) -> Vec<Value>;
}

/// The stream of `max_tokens` tokens of `started` from `begin`: tokens due within
/// [`STREAM_BATCH`] of each other leave together, as the chat stream sends them; the sequence
/// ends with its last token.
pub(super) fn streamed(
    clock: Clock,
    started: Started,
    max_tokens: u64,
    seq: SeqGuard,
    begin: Instant,
    mut events: impl Events,
    sim_headers: SimHeaders,
) -> Response {
    let per_batch =
        (STREAM_BATCH.as_secs_f64() / clock.real(started.token_s).as_secs_f64().max(1e-9)).floor().max(1.0) as u64;
    let st = (Some(seq), 1u64, events.head());
    let stream = futures_util::stream::unfold((st, events), move |((mut seq, k, head), mut events)| async move {
        if k > max_tokens + 1 {
            return None;
        }
        let mut out = Vec::new();
        if k == max_tokens + 1 {
            for e in events.tail() {
                out.extend_from_slice(&event(&e));
            }
            return Some((Ok::<_, Infallible>(Bytes::from(out)), ((seq, k + 1, Vec::new()), events)));
        }
        let last = if k == 1 { 1 } else { (k + per_batch - 1).min(max_tokens) };
        wait_until(begin + clock.real(started.prefill_s + (last - 1) as f64 * started.token_s)).await;
        for e in &head {
            out.extend_from_slice(&event(e));
        }
        for j in k..=last {
            out.extend_from_slice(&event(&events.token(j)));
        }
        if last == max_tokens {
            if let Some(s) = seq.as_mut() {
                s.done = true;
            }
            seq = None;
        }
        Some((Ok(Bytes::from(out)), ((seq, last + 1, Vec::new()), events)))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    for (k, v) in sim_headers {
        h.insert(k, v.parse().expect("digits and addresses are header values"));
    }
    resp
}
