//! Simulated GPUs and the trace replay, for benchmarks and demos without GPUs (no root, no
//! eBPF): a simulated LLM inference server (`ailb-sim`), a vLLM look-alike over a model of one
//! GPU; the same model for a whole fleet in simulated time; and the replay of an LLM workload
//! against a model VIP (`ailb-replay`).
//!
//! [`gpu`] is the pure model of one GPU (KV blocks, prefix cache, batch slots, queue);
//! [`server`] is its HTTP layer; [`fleet_model`] runs a fleet of them in simulated time under a
//! placement; [`replay`] reads the Mooncake trace or makes a synthetic mix and sends it;
//! [`text`] turns block ids into prompt text and prompt text into block keys.
//!
//! # Prompts: text, and the block keys the server derives from it
//!
//! `POST /v1/chat/completions` takes the usual OpenAI body. The prompt is the messages' text
//! concatenated (a string `content`, or the `text` of its parts), counted as `bytes / 4`
//! tokens ([`text::BYTES_PER_TOKEN`], about 4 bytes per English token). Its prefix-cache
//! block keys come from that text ([`text::block_keys`]): chunks of 2,048 bytes (512 tokens of
//! that approximation, the KV block), each key the hash of the previous key and the chunk, as
//! vLLM chains its block hashes; two prompts that share their first k chunks share exactly k
//! keys, and the GPU model ([`gpu`]) caches blocks by key.
//!
//! The replay knows a trace request only as token counts and the ids of its 512-token blocks;
//! it renders each id as 2,048 bytes of words drawn by a PRNG seeded with the id
//! ([`text::block_text`], the same text for the same id) and sends the blocks' text in order,
//! the last cut to the prompt's length, as one user message ([`text::prompt_text`]). So the
//! server, and any router in between, sees only text: a request's tokens are the trace's
//! `input_length`, its keys stand for its `hash_ids` one for one, and the cache hits on the
//! trace are those the ids gave (checked in `docs/replay.md`). Unlike vLLM the partial last
//! chunk gets a key too, since the trace's ids include the partial last block.
//!
//! ## Side channel (tests only)
//!
//! A body may instead carry
//!
//! ```json
//! "ailb_sim": {"prompt_tokens": 8192, "hash_ids": [17, 18, 19], "max_tokens": 64}
//! ```
//!
//! which sets the token count and the block keys directly and ignores the text: the HTTP tests
//! of the model (`tests/sim/tests/sim_http.rs`) use it to state a 16-block prompt or an
//! oversized one in a few bytes. `prompt_tokens` is required in it; `hash_ids` default to none,
//! `max_tokens` to the body's `max_tokens` (or `max_completion_tokens`), then 16. The replay
//! never sends it.
//!
//! # Token ids and KV events
//!
//! With `--tokenizer DIR` (a model folder: `tokenizer.json`, `tokenizer_config.json`, the chat
//! template), chat and completion prompts are tokenized as vLLM tokenizes them (ailb's
//! `tokenize::ChatTokenizer`): the prompt's length is its token count and its 512-token blocks
//! are keyed by their token ids. With `--kv-events-endpoint` the server publishes its prefix
//! cache's KV events in vLLM 0.32.0's format ([`kv_events`]), in engine blocks of
//! `--kv-block-size` tokens; their token ids are the tokenizer's, or, without one, the
//! simulator's pseudo-tokens (each 4 bytes of prompt text one id), which follow the same
//! prompts through the cache but match no front door's keys. The Responses and Messages APIs
//! and the `ailb_sim` extension carry no token ids: their blocks are cached and not announced.
//! `POST /reset_prefix_cache` drops the cache (`AllBlocksCleared`), as vLLM's does.
//!
//! # Answers
//!
//! `POST /v1/completions` takes a `prompt` (one string) where a chat takes `messages`, and is
//! answered the same way with `text_completion` objects. A body whose `model` is not the served
//! name gets vLLM's 404 (`NotFoundError`, "The model `X` does not exist."); a body without one is
//! served.
//!
//! Not streamed: one `chat.completion` with `usage` (with `prompt_tokens_details.cached_tokens`,
//! as vLLM reports it with `--enable-prompt-tokens-details`) and an `ailb_sim` object
//! (`cached_tokens`, `prefill_s`, `decode_s`, `queued_s`, simulated seconds). Streamed: for a
//! chat, a chunk with the role and empty content, then one `chat.completion.chunk` SSE event per
//! token, the first at the end of prefill, then (with `stream_options.include_usage`) a usage
//! chunk, then `data: [DONE]`. Both carry headers `x-ailb-sim-cached-tokens` and
//! `x-ailb-sim-queued-s`, and `x-ailb-backend` with the server's own address (vLLM sends none of
//! these; the replay reads which GPU served it through routers that add nothing). Headers are
//! sent when the request starts, so a queued request's response begins only when it leaves the
//! queue. How the simulator differs from vLLM 0.32.0 otherwise: `docs/real-engine.md`.
//!
//! A request whose KV (prompt + `max_tokens`) exceeds the whole KV pool is answered HTTP 400
//! with an OpenAI error `{"error": {"message": "... exceeds the KV cache capacity ...",
//! "type": "BadRequestError", "code": 400}}`: vLLM rejects a prompt longer than the model can
//! hold with the same 400 before scheduling it, rather than failing mid-run.

pub mod fleet_model;
pub mod gpu;
pub mod kv_events;
pub mod poll;
pub mod replay;
pub mod server;
pub mod text;

pub use gpu::{Admission, CacheChange, Gpu, GpuProfile, OutOfMemory, ReqId, SimRequest, Started, BLOCK_TOKENS};
pub use poll::wait_until;
pub use server::{parse_chat, serve, serve_with, ChatRequest, SimConfig};
