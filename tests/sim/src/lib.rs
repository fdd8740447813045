//! Simulated GPUs and the trace replay, for benchmarks and demos without GPUs (no root, no
//! eBPF): a simulated LLM inference server (`ailb-sim`), a vLLM look-alike over a model of one
//! GPU; the same model for a whole fleet in simulated time; and the replay of an LLM workload
//! against a model VIP (`ailb-replay`).
//!
//! [`gpu`] is the pure model of one GPU (KV blocks, prefix cache, batch slots, queue);
//! [`server`] is its HTTP layer; [`fleet_model`] runs a fleet of them in simulated time under a
//! placement; [`replay`] reads the Mooncake trace or makes a synthetic mix and sends it.
//!
//! # Request extension
//!
//! A replay knows token counts and prefix block ids, not text. `POST /v1/chat/completions`
//! therefore accepts, besides the usual OpenAI body,
//!
//! ```json
//! "ailb_sim": {"prompt_tokens": 8192, "hash_ids": [17, 18, 19], "max_tokens": 64}
//! ```
//!
//! `prompt_tokens` is required in it; `hash_ids` (the ids of the prompt's 512-token blocks, as
//! in the Mooncake trace) default to none, `max_tokens` to the body's `max_tokens` (or
//! `max_completion_tokens`), then 16. Without the extension the prompt is `bytes / 4` tokens of
//! the messages' text and nothing is cached.
//!
//! # Answers
//!
//! Not streamed: one `chat.completion` with `usage` (with `prompt_tokens_details.cached_tokens`)
//! and an `ailb_sim` object (`cached_tokens`, `prefill_s`, `decode_s`, `queued_s`, simulated
//! seconds). Streamed: one `chat.completion.chunk` SSE event per token, the first at the end of
//! prefill, then (with `stream_options.include_usage`) a usage chunk, then `data: [DONE]`.
//! Both carry headers `x-ailb-sim-cached-tokens` and `x-ailb-sim-queued-s`. Headers are sent
//! when the request starts, so a queued request's response begins only when it leaves the queue.
//!
//! A request whose KV (prompt + `max_tokens`) exceeds the whole KV pool is answered HTTP 400
//! with an OpenAI error `{"error": {"message": "... exceeds the KV cache capacity ...",
//! "type": "BadRequestError", "code": 400}}`: vLLM rejects a prompt longer than the model can
//! hold with the same 400 before scheduling it, rather than failing mid-run.

pub mod fleet_model;
pub mod gpu;
pub mod poll;
pub mod replay;
pub mod server;

pub use gpu::{Admission, Gpu, GpuProfile, OutOfMemory, ReqId, SimRequest, Started, BLOCK_TOKENS};
pub use poll::wait_until;
pub use server::{parse_chat, serve, ChatRequest, SimConfig};
