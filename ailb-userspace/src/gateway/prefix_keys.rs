//! Phase **keys**: a request's prompt as prefix keys for the kernel's prefix-aware pick
//! (`ailb_common::prefix`), the ones a request sends (`prefix::sent`, at most 16).
//!
//! - **token-exact**, for a model in `[gateway.tokenizers]`: the prompt tokenized as the
//!   engine tokenizes it (chat: the chat template rendered with the generation prompt, then
//!   encoded; completions: the prompt encoded with the special tokens the engine adds), in
//!   blocks of the model's `kv_block_tokens`. These are the keys the daemon computes from the
//!   engine's KV events, so precise mode matches them block for block. A conversation's later
//!   turn (a chat with an answer before its last message) is tokenized only up to where its
//!   last message begins ([`ChatTokenizer::chat_head`]): the earlier messages are what an
//!   engine may hold, the last one is new text, and tokenizing it was most of the request
//!   path's work on long turns. Its blocks send stand-in keys ([`head_keys`]), and it is
//!   tokenized into the segment cache after the request has gone ([`warm_later`]), for the
//!   conversation's next turn. A first turn is tokenized whole.
//! - **text**, otherwise: the prompt's bytes in 64-byte chunks, as the field's approximate
//!   routers do. Chat messages are written in order as `role 0x1f text 0x1e`, so two requests
//!   that share their leading messages share their leading bytes; a completion's prompt is its
//!   string.
//!
//! The Responses and Messages APIs are keyed as the chat they amount to ([`agent_chat`]): the
//! system text (`instructions`, `system`) first, then each message's role and text, as vLLM
//! 0.32.0 turns them into chat messages before rendering the template (its Anthropic route
//! concatenates the system blocks and drops an attribution header block). So an agent's request and a
//! chat completion with the same system prompt and messages send the same keys, in both
//! modes. Non-text items (tool calls and results, images, reasoning) are left out: their keys
//! then cover the prompt only up to the first such item's message. A Responses request that
//! continues a stored response goes to that response's backend with no kernel pick, so its
//! keys (which cannot cover the stored turns) do not matter.
//!
//! A prompt the tokenizer cannot take (a template error) sends no keys: the pick goes on as
//! without them.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::inputs::Endpoint;
use super::request_fields::{value_text, Fields, Messages};
use crate::tokenize::{answer_before_last, ChatHead, ChatIds, ChatTokenizer};

/// How a model's requests are keyed.
#[derive(Clone)]
pub enum Keyer {
    Text,
    /// Token-exact keys in blocks of `block` tokens; `withhold`: a conversation's later turn
    /// connects with them withheld until the kernel asks ([`PendingKeys`]), for a model whose
    /// map does not learn from picks (`prefix = "precise"`: a learning map records every
    /// connect's keys, so the kernel would ask for them every time).
    Tokens {
        tokenizer: Arc<ChatTokenizer>,
        block: NonZeroU32,
        withhold: bool,
    },
}

impl std::fmt::Debug for Keyer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keyer::Text => f.write_str("Text"),
            Keyer::Tokens { block, .. } => write!(f, "Tokens(block {block})"),
        }
    }
}

impl Keyer {
    /// The keys a request to `endpoint` with `fields` (of `body`) sends; empty for none.
    pub fn keys(&self, endpoint: Endpoint, fields: &Fields<'_>, body: &[u8]) -> Vec<u64> {
        let all = match self {
            Keyer::Text => text_material(endpoint, fields).map(|m| ailb_common::prefix::text_keys(&m)),
            Keyer::Tokens { tokenizer, block, .. } => match token_prompt(tokenizer, endpoint, fields, body) {
                Ok(Some(ChatIds::Whole(ids))) => Some(ailb_common::prefix::token_keys(&ids, *block)),
                Ok(Some(ChatIds::Head(head))) => {
                    let keys = head_keys(&head, *block);
                    warm_later(tokenizer, head.tail);
                    Some(keys)
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "prefix keys: the prompt could not be tokenized; none sent");
                    None
                }
            },
        };
        all.map(|k| ailb_common::prefix::sent(&k).map(|(_, key)| key).collect()).unwrap_or_default()
    }

    /// [`Self::keys`] for a request whose body is `body`, off the worker's thread: for
    /// token-exact keys ([`PendingKeys`] makes text keys, which cost microseconds, inline).
    /// Tokenizing a long prompt takes milliseconds (about 1 ms for a 14,000-token chat through
    /// the byte-level path on this project's machines, 4-5 ms through the library's pipeline,
    /// for a tokenizer that path does not take), and a front-door worker serves all its requests
    /// on one thread: inline, every response it is streaming would stall meanwhile. The blocking
    /// pool parses the body's fields again (microseconds) rather than share them.
    ///
    /// At most one tokenization per core runs at once ([`tokenizing`]): unbounded, a burst of
    /// long prompts took every core, and on a host shared with the engines (the race's
    /// simulated GPUs) the whole fleet slowed (precise mode's TTFT P50 rose from 0.55 s to
    /// 1.44 s on the trace, its front door's CPU from 17.9 to 26.6 s per 1,000 requests).
    pub async fn keys_off_thread(&self, endpoint: Endpoint, body: &bytes::Bytes) -> Vec<u64> {
        // The semaphore is never closed, so the permit is always granted.
        let Ok(_permit) = tokenizing().acquire().await else {
            return Vec::new();
        };
        let (keyer, body) = (self.clone(), body.clone());
        let keys = tokio::task::spawn_blocking(move || match crate::gateway::inputs::parse_body(&body) {
            Ok(fields) => keyer.keys(endpoint, &fields, &body),
            Err(_) => Vec::new(),
        });
        keys.await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "prefix keys: the tokenizing task failed; none sent");
            Vec::new()
        })
    }
}

/// A request's prefix keys, made when it opens an upstream connection: a request sent on a
/// kept connection involves no kernel pick (the connection already goes to its backend), so
/// its token-exact keys, milliseconds of tokenizing for a long prompt, are never made. Text
/// keys cost microseconds and are made at once, from the fields already parsed.
///
/// A conversation's later turn ([`continues_conversation`]) opens its connection with its
/// token-exact keys withheld ([`PendingKeys::withheld`], the socket option
/// `AILB_PREFIX_ON_REQUEST`): the kernel takes the conversation's affinity before any key, and
/// where it does, the keys would change nothing and are never made; where the pick would read
/// them, the kernel refuses the connect (`ENOKEY`) and the front door makes them and connects
/// again. A first turn has no affinity to find, so its keys are made at once.
pub enum PendingKeys {
    /// Made already (text keys), in `took`.
    Ready { keys: Vec<u64>, took: Duration },
    /// Token-exact keys of `body`, made on [`PendingKeys::make`]; `withheld`: until the kernel
    /// asks for them.
    Tokens { keyer: Keyer, endpoint: Endpoint, body: bytes::Bytes, withheld: bool },
}

impl PendingKeys {
    /// The keys a request to `endpoint` with `fields` (of `body`) will send under `keyer`.
    pub fn new(keyer: &Keyer, endpoint: Endpoint, fields: &Fields<'_>, body: &bytes::Bytes) -> Self {
        match keyer {
            Keyer::Text => {
                let started = Instant::now();
                let keys = keyer.keys(endpoint, fields, body);
                PendingKeys::Ready { keys, took: started.elapsed() }
            }
            Keyer::Tokens { withhold, .. } => PendingKeys::Tokens {
                keyer: keyer.clone(),
                endpoint,
                body: body.clone(),
                withheld: *withhold && continues_conversation(endpoint, fields),
            },
        }
    }

    /// Whether the connection opens with the keys withheld until the kernel asks for them.
    pub fn withheld(&self) -> bool {
        matches!(self, PendingKeys::Tokens { withheld: true, .. })
    }

    /// The keys, made now if they were not yet, and the time making them took.
    pub async fn make(self) -> (Vec<u64>, Duration) {
        match self {
            PendingKeys::Ready { keys, took } => (keys, took),
            PendingKeys::Tokens { keyer, endpoint, body, .. } => {
                let started = Instant::now();
                let keys = keyer.keys_off_thread(endpoint, &body).await;
                (keys, started.elapsed())
            }
        }
    }
}

/// Whether a request continues a conversation ([`answer_before_last`], the rule by which the
/// tokenizer cuts a later turn at its new message): in a chat, a Messages API request or a
/// Responses API request's input items.
pub fn continues_conversation(endpoint: Endpoint, fields: &Fields<'_>) -> bool {
    match (endpoint, &fields.messages, &fields.input) {
        (Endpoint::ChatCompletions | Endpoint::Messages, Some(Messages::List(msgs)), _) => {
            answer_before_last(msgs.iter().map(|m| m.role.as_deref()))
        }
        (Endpoint::Responses, _, Some(Value::Array(items))) => {
            answer_before_last(items.iter().map(|i| i.get("role").and_then(Value::as_str)))
        }
        _ => false,
    }
}

/// The warming thread's nice value: the lowest priority, a share of about 1.5 % of a CPU that
/// other threads of the default priority want.
const WARM_NICE: i32 = 19;

/// Lowers the calling thread's priority to [`WARM_NICE`] (Linux keeps a nice value per thread:
/// `setpriority` on a thread id sets that thread's alone). Lowering one's own priority needs no
/// privilege.
fn idle_priority() -> std::io::Result<()> {
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), WARM_NICE).map_err(std::io::Error::from)
}

/// The tokenizations that may run at once, process-wide: one per core the process may use.
fn tokenizing() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
}

/// The text mode's bytes of a prompt.
pub fn text_material(endpoint: Endpoint, fields: &Fields<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match endpoint {
        Endpoint::ChatCompletions => {
            let Some(Messages::List(msgs)) = &fields.messages else { return None };
            for m in msgs {
                out.extend_from_slice(m.role.as_deref().unwrap_or("").as_bytes());
                out.push(0x1f);
                m.content.write_text(&mut out);
                out.push(0x1e);
            }
        }
        Endpoint::Completions => match fields.prompt.as_ref()? {
            Value::String(s) => out.extend_from_slice(s.as_bytes()),
            _ => return None,
        },
        Endpoint::Responses | Endpoint::Messages => {
            let msgs = agent_chat(endpoint, fields)?;
            for m in &msgs {
                out.extend_from_slice(m.role.as_bytes());
                out.push(0x1f);
                out.extend_from_slice(m.text.as_bytes());
                out.push(0x1e);
            }
        }
        _ => return None,
    }
    Some(out)
}

/// One message of the chat an agents' API request amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: String,
    pub text: String,
}

/// A Messages request's `system` as vLLM makes it a system message: a string as it is; text
/// blocks concatenated, without the attribution header some agents put first (it carries a
/// hash per request, which would make every request's first block differ).
fn anthropic_system(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            let text: String = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .filter(|t| !t.starts_with("x-anthropic-billing-header"))
                .collect();
            (!text.is_empty()).then_some(text)
        }
        _ => None,
    }
}

/// The chat messages a Responses or Messages request amounts to (see the module docs);
/// `None` for another endpoint or when it has no text at all.
pub fn agent_chat(endpoint: Endpoint, fields: &Fields<'_>) -> Option<Vec<ChatTurn>> {
    let mut out = Vec::new();
    let turn = |role: &str, text: String| ChatTurn { role: role.to_string(), text };
    match endpoint {
        Endpoint::Responses => {
            if let Some(super::request_fields::StrOr::Str(s)) = &fields.instructions {
                out.push(turn("system", s.to_string()));
            }
            match fields.input.as_ref() {
                Some(Value::String(s)) => out.push(turn("user", s.clone())),
                Some(Value::Array(items)) => {
                    for item in items {
                        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
                        let (Some(role), Some(text)) =
                            (item.get("role").and_then(Value::as_str), item.get("content").and_then(value_text))
                        else {
                            break;
                        };
                        if kind != "message" {
                            break;
                        }
                        out.push(turn(role, text));
                    }
                }
                _ => {}
            }
        }
        Endpoint::Messages => {
            if let Some(system) = fields.system.as_ref().and_then(anthropic_system) {
                out.push(turn("system", system));
            }
            if let Some(Messages::List(msgs)) = &fields.messages {
                for m in msgs {
                    let mut text = Vec::new();
                    m.content.write_text(&mut text);
                    let (Some(role), Ok(text)) = (m.role.as_deref(), String::from_utf8(text)) else { break };
                    out.push(turn(role, text));
                }
            }
        }
        _ => return None,
    }
    (!out.is_empty()).then_some(out)
}

/// The engine's token ids of a prompt (a later turn's up to its last message); `None` for an
/// endpoint or shape not keyed.
fn token_prompt(
    tok: &ChatTokenizer,
    endpoint: Endpoint,
    fields: &Fields<'_>,
    body: &[u8],
) -> Result<Option<ChatIds>, String> {
    if let Some(turns) = agent_chat(endpoint, fields) {
        let messages: Vec<Value> =
            turns.into_iter().map(|t| serde_json::json!({"role": t.role, "content": t.text})).collect();
        return tok.chat_ids(&Value::Array(messages)).map(Some).map_err(|e| crate::error_chain(&e));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    match endpoint {
        Endpoint::ChatCompletions => {
            let Some(messages) = v.get("messages") else { return Ok(None) };
            tok.chat_ids(messages).map(Some).map_err(|e| crate::error_chain(&e))
        }
        Endpoint::Completions => match v.get("prompt") {
            Some(Value::String(p)) => {
                tok.encode(p, true).map(|ids| Some(ChatIds::Whole(ids))).map_err(|e| crate::error_chain(&e))
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The keys of a chat tokenized up to its last message: the head's own keys, then stand-ins
/// (`prefix::stand_in_keys`) for the blocks its tail would fill, the tail's tokens estimated
/// from its bytes at the head's bytes per token. So the request sends its keys at the
/// positions the whole prompt's would take, with the same stride, and the kernel's share of
/// keys found held (its wait rule, the memory it asks of a holder) reads as for the whole
/// prompt; the stand-ins are never held, as the new message's own blocks are held nowhere.
/// What is lost: a prompt sent again whole (a retry) is found held only up to its head.
fn head_keys(head: &ChatHead, block: NonZeroU32) -> Vec<u64> {
    let mut keys = ailb_common::prefix::token_keys(&head.ids, block);
    let tail_tokens = (head.tail.len() * head.ids.len()).div_ceil(head.head_bytes.max(1));
    let blocks = (head.ids.len() + tail_tokens) / block.get() as usize;
    let parent = keys.last().copied().unwrap_or_else(|| ailb_common::prefix::token_root(block));
    keys.extend(ailb_common::prefix::stand_in_keys(parent, head.tail.as_bytes(), blocks.saturating_sub(keys.len())));
    keys
}

/// Tails waiting to be put in their model's segment cache, at most this many; more are dropped
/// (their conversation's next request tokenizes them on its own path).
const WARM_QUEUE: usize = 256;

/// The name of the thread that warms the segment caches.
const WARM_THREAD: &str = "ailb-warm";

/// Tokenizes `tail` into `tokenizer`'s segment cache on a thread of its own, after the request
/// has gone: the conversation's next request sends it among its earlier messages, and finds its
/// ids cached rather than tokenizing it on that request's path. One thread: at most one core,
/// off the front door's workers and its tokenizing permits. It runs only on a CPU that would
/// otherwise idle, nearly ([`idle_priority`]): the next turn comes seconds later, while
/// the request just sent is being served now, and where the engines share the gateway's cores
/// (one box, the races' simulated GPUs) the warming, run at once, took the CPU from the
/// engine's own tokenizing of that same prompt. A tail it never gets to is tokenized on the
/// next turn's path, as without it.
fn warm_later(tokenizer: &Arc<ChatTokenizer>, tail: String) {
    type Job = (Arc<ChatTokenizer>, String);
    static QUEUE: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<Job>>> = std::sync::OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(WARM_QUEUE);
        let spawned = std::thread::Builder::new().name(WARM_THREAD.into()).spawn(move || {
            if let Err(e) = idle_priority() {
                tracing::warn!(error = %e, "prefix keys: the warming thread keeps the normal priority");
            }
            for (tokenizer, tail) in rx {
                tokenizer.warm(&tail);
            }
        });
        match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "prefix keys: no thread to warm the segment caches; later turns tokenize on their path");
                None
            }
        }
    });
    if let Some(tx) = queue {
        let _ = tx.try_send((tokenizer.clone(), tail));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &[u8]) -> Fields<'_> {
        crate::gateway::inputs::parse_body(body).expect("a JSON object")
    }

    /// Token-exact keys computed on the blocking pool are the keys computed inline, on a
    /// runtime of one thread as the front door's workers run.
    #[test]
    fn token_keys_off_the_workers_thread_are_the_inline_keys() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let block = NonZeroU32::new(2).expect("2");
        let keyer = Keyer::Tokens { tokenizer: Arc::new(crate::tokenize::tests::fixture()), block, withhold: true };
        let body = bytes::Bytes::from_static(
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello world ! hello world !"}]}"#,
        );
        let f = fields(&body);
        let inline = keyer.keys(Endpoint::ChatCompletions, &f, &body);
        assert!(inline.len() >= 2, "{inline:?}");
        assert_eq!(rt.block_on(keyer.keys_off_thread(Endpoint::ChatCompletions, &body)), inline);
        // Made when asked for, they are the same keys.
        let pending = PendingKeys::new(&keyer, Endpoint::ChatCompletions, &f, &body);
        assert!(matches!(pending, PendingKeys::Tokens { .. }), "token-exact keys are made only when asked for");
        assert_eq!(rt.block_on(pending.make()).0, inline);
        // Text keys are made at once, and say how long that took.
        let text = PendingKeys::new(&Keyer::Text, Endpoint::ChatCompletions, &f, &body);
        let PendingKeys::Ready { keys, took } = text else { panic!("text keys are made at once") };
        assert_eq!(keys, Keyer::Text.keys(Endpoint::ChatCompletions, &f, &body));
        assert!(took > Duration::ZERO, "the time they took is kept");
        // A body the blocking pool cannot parse sends no keys.
        let bad = bytes::Bytes::from_static(b"{not json");
        assert!(rt.block_on(keyer.keys_off_thread(Endpoint::ChatCompletions, &bad)).is_empty());
    }

    /// A conversation's later turn (an answer before its last message) opens its connection with
    /// its token-exact keys withheld until the kernel asks; a first turn, a chat ending with an
    /// answer, another API's shape, text keys (microseconds to make) and a model whose map
    /// learns from picks do not.
    #[test]
    fn a_later_turn_withholds_its_token_keys_and_nothing_else_does() {
        let block = NonZeroU32::new(2).expect("2");
        let keyer = Keyer::Tokens { tokenizer: Arc::new(crate::tokenize::tests::fixture()), block, withhold: true };
        let withheld = |keyer: &Keyer, endpoint: Endpoint, body: &'static [u8]| {
            let b = bytes::Bytes::from_static(body);
            PendingKeys::new(keyer, endpoint, &fields(&b), &b).withheld()
        };
        let later = br#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]}"#;
        assert!(withheld(&keyer, Endpoint::ChatCompletions, later), "a chat's later turn");
        assert!(withheld(&keyer, Endpoint::Messages, later), "a Messages API later turn");
        let items = br#"{"input":[{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]}"#;
        assert!(withheld(&keyer, Endpoint::Responses, items), "Responses API input items");
        let first = br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}]}"#;
        assert!(!withheld(&keyer, Endpoint::ChatCompletions, first), "a first turn");
        let answer_last = br#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
        assert!(!withheld(&keyer, Endpoint::ChatCompletions, answer_last), "no answer before the last message");
        assert!(!withheld(&keyer, Endpoint::Responses, br#"{"input":"q"}"#), "a string input");
        assert!(!withheld(&keyer, Endpoint::Completions, br#"{"prompt":"q"}"#), "a completion");
        assert!(!withheld(&Keyer::Text, Endpoint::ChatCompletions, later), "text keys are made at once");
        let learning = Keyer::Tokens { tokenizer: Arc::new(crate::tokenize::tests::fixture()), block, withhold: false };
        assert!(!withheld(&learning, Endpoint::ChatCompletions, later), "a map that learns from picks wants them");
    }

    /// A chat with earlier messages sends its head's keys, the whole prompt's own, at the
    /// positions the whole prompt's keys take, and stand-ins where its last message's would be;
    /// about as many keys as the whole prompt gives.
    #[test]
    fn a_chat_sends_its_earlier_messages_keys_and_stand_ins_for_its_last() {
        let check = |tok: ChatTokenizer, block: u32, messages: Value, slack: usize| {
            let block = NonZeroU32::new(block).expect("non-zero");
            let tok = Arc::new(tok);
            let keyer = Keyer::Tokens { tokenizer: tok.clone(), block, withhold: true };
            let body = serde_json::to_vec(&serde_json::json!({ "messages": messages })).expect("json");
            let sent = keyer.keys(Endpoint::ChatCompletions, &fields(&body), &body);
            let whole_ids = crate::tokenize::tests::library(&tok, &tok.render(&messages, true).expect("renders"));
            let whole = ailb_common::prefix::token_keys(&whole_ids, block);
            let head = tok.chat_head(&messages).expect("renders").expect("a head");
            let own = head.ids.len() / block.get() as usize;
            assert!(own > 0 && own < whole.len(), "{own} of {} blocks in the head", whole.len());
            // The keys the whole prompt would send at the head's positions, and none of its
            // keys after them.
            let mut i = 0;
            for (pos, key) in ailb_common::prefix::sent(&whole) {
                if pos < own {
                    assert_eq!(sent[i], key, "block {pos}");
                    i += 1;
                }
            }
            assert!(sent[i..].iter().all(|k| !whole.contains(k)), "stand-ins are no real keys");
            assert!(sent.len() > i, "the last message's blocks have stand-ins");
            let n = ailb_common::prefix::sent(&whole).count();
            assert!(sent.len().abs_diff(n) <= slack, "{} keys sent, the whole prompt sends {n}", sent.len());
            // The same request sends the same keys (gateways agree).
            assert_eq!(keyer.keys(Endpoint::ChatCompletions, &fields(&body), &body), sent);
        };
        let messages = serde_json::json!([{"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello world ! hello world !"},
            {"role": "assistant", "content": "hello hello"},
            {"role": "user", "content": "world ! world ! world brief brief"}]);
        check(crate::tokenize::tests::fixture(), 2, messages, 3);
        // A real tokenizer, a long last message: its token count estimated from its bytes.
        if let Some(dir) = crate::tokenize::tests::tiny_model_dir() {
            let tok = ChatTokenizer::load(&dir).expect("loads");
            let system = "You are the assistant of tenant seven, and you answer briefly. ".repeat(40);
            let question = "Summarise the history of the Roman republic, its wars and its laws. ".repeat(60);
            let messages = serde_json::json!([{"role": "system", "content": system},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": question}]);
            check(tok, 16, messages, 1);
        }
    }

    /// The warming thread runs at the lowest priority, and warms: a later turn's tail, handed to
    /// it, ends up in the segment cache.
    #[test]
    fn the_warming_thread_runs_at_the_lowest_priority_and_warms() {
        let tok = Arc::new(crate::tokenize::tests::fixture());
        let entries = || tok.segment_cache().expect("a cache").usage().1;
        let before = entries();
        warm_later(&tok, "hello world !<|im_end|>brief<|im_end|>".to_string());
        let deadline = Instant::now() + Duration::from_secs(10);
        let thread = loop {
            let found = std::fs::read_dir("/proc/self/task")
                .expect("/proc/self/task")
                .flatten()
                .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == WARM_THREAD));
            if let (Some(t), true) = (found, entries() >= before + 2) {
                break t.path();
            }
            assert!(Instant::now() < deadline, "no warming thread, or the tail not cached ({} entries)", entries());
            std::thread::sleep(Duration::from_millis(10));
        };
        // Field 19 of a task's stat is its nice value. The command name (field 2) is in
        // parentheses and has no spaces here.
        let stat = std::fs::read_to_string(thread.join("stat")).expect("the thread's stat");
        let nice: i32 = stat.split_whitespace().nth(18).and_then(|f| f.parse().ok()).expect("a nice field");
        assert_eq!(nice, WARM_NICE, "{stat}");
        // The test's own thread keeps its priority.
        let own = std::fs::read_to_string("/proc/thread-self/stat").expect("own stat");
        assert_eq!(own.split_whitespace().nth(18), Some("0"), "{own}");
    }

    #[test]
    fn chats_sharing_a_system_prompt_share_its_keys() {
        let system = "You are the assistant of tenant seven. ".repeat(30);
        let (qa, qb) = ("first question. ".repeat(10), "second question. ".repeat(10));
        let chat = |q: &str| {
            format!(r#"{{"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{q}"}}]}}"#)
        };
        let (a, b) = (chat(&qa), chat(&qb));
        let (fa, fb) = (fields(a.as_bytes()), fields(b.as_bytes()));
        let ka = text_material(Endpoint::ChatCompletions, &fa).expect("chat");
        let kb = text_material(Endpoint::ChatCompletions, &fb).expect("chat");
        let (ta, tb) = (ailb_common::prefix::text_keys(&ka), ailb_common::prefix::text_keys(&kb));
        let shared = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
        // The system prompt's chunks are shared; the questions' (two chunks or more) are not.
        assert!(shared >= system.len() / 64 - 1, "{shared} of {} keys shared", ta.len());
        assert!(shared < ta.len() && shared < tb.len(), "{shared} of {} keys shared", ta.len());
        let sent = Keyer::Text.keys(Endpoint::ChatCompletions, &fa, a.as_bytes());
        assert!(!sent.is_empty() && sent.len() <= ailb_common::prefix::PREFIX_KEYS_MAX);
        assert!(sent.iter().all(|&k| k != 0));
    }

    /// The same system prompt and question through chat, the Messages API and the Responses
    /// API: one chat, so one set of keys.
    #[test]
    fn agents_apis_send_the_keys_of_the_chat_they_amount_to() {
        let system = "You are the assistant of tenant seven. ".repeat(30);
        let q = "what is the capital of France? ".repeat(4);
        let chat =
            serde_json::json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]});
        let messages = serde_json::json!({"system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.0; hash=1234"},
                {"type": "text", "text": &system[..100]}, {"type": "text", "text": &system[100..]}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": q}]}], "max_tokens": 5});
        let responses = serde_json::json!({"instructions": system, "input": q});
        let responses_items = serde_json::json!({"instructions": system,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": q}]}]});
        let keys = |endpoint: Endpoint, v: &Value| {
            let body = serde_json::to_vec(v).expect("json");
            Keyer::Text.keys(endpoint, &fields(&body), &body)
        };
        let want = keys(Endpoint::ChatCompletions, &chat);
        assert!(want.len() > 2, "{want:?}");
        assert_eq!(keys(Endpoint::Messages, &messages), want, "Messages API");
        assert_eq!(keys(Endpoint::Responses, &responses), want, "Responses API, input as a string");
        assert_eq!(keys(Endpoint::Responses, &responses_items), want, "Responses API, input as items");
    }

    #[test]
    fn an_agents_request_is_keyed_up_to_its_first_item_without_text() {
        let body = serde_json::to_vec(&serde_json::json!({"instructions": "be brief", "input": [
            {"role": "user", "content": "first"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"role": "user", "content": "second"}]}))
        .expect("json");
        let turns = agent_chat(Endpoint::Responses, &fields(&body)).expect("text");
        let roles: Vec<&str> = turns.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["system", "user"], "{turns:?}");
        let body = br#"{"input":[{"type":"function_call_output","output":"x"}]}"#;
        assert_eq!(agent_chat(Endpoint::Responses, &fields(body)), None);
    }

    #[test]
    fn other_apis_and_shapes_send_no_keys() {
        let body = br#"{"input":"hello"}"#;
        assert!(Keyer::Text.keys(Endpoint::Embeddings, &fields(body), body).is_empty());
        let body = br#"{"prompt":[1,2,3]}"#;
        assert!(Keyer::Text.keys(Endpoint::Completions, &fields(body), body).is_empty());
    }
}
