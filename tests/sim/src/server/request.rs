//! Reading a request: an OpenAI chat or completion body, with the optional `ailb_sim`
//! extension (see [the crate docs](crate)).

use ailb_common::hash::ConversationHasher;
use ailb_userspace::tokenize::ChatTokenizer;
use serde_json::Value;

use crate::gpu::{SimRequest, BLOCK_TOKENS};
use crate::text;

/// Where a request's token ids come from.
#[derive(Debug, Clone, Copy, Default)]
pub enum Tokens<'a> {
    /// None: the prompt is counted as `bytes / 4` tokens and keyed by its text (the default).
    #[default]
    None,
    /// The same count and keys, with pseudo-tokens for the KV events: each 4 bytes of the
    /// prompt text, little-endian, one token id. They name the same prompt in every event, but
    /// no front door computes them, so keys from them match none of its keys.
    Pseudo,
    /// The model's tokenizer and chat template, as vLLM tokenizes: the prompt's length is its
    /// token count and its blocks are its tokens, so the engine's blocks are the real ones.
    Model(&'a ChatTokenizer),
}

/// The API a request called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

/// A parsed chat or completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub sim: SimRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The body's `model`, when it names one (vLLM then serves it only under that name).
    pub model: Option<String>,
}

/// Default `max_tokens` when a request names none.
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// Reads an OpenAI chat request with the optional `ailb_sim` extension (see [the crate docs](crate)).
pub fn parse_chat(body: &[u8]) -> Result<ChatRequest, String> {
    parse(body, Api::Chat, Tokens::None)
}

/// Reads an OpenAI completion request (`prompt`: a string, or an array of one string) with the
/// optional `ailb_sim` extension.
pub fn parse_completion(body: &[u8]) -> Result<ChatRequest, String> {
    parse(body, Api::Completion, Tokens::None)
}

/// A chat or completion request read with its token ids from `tokens`.
pub fn parse_request(body: &[u8], api: Api, tokens: Tokens<'_>) -> Result<ChatRequest, String> {
    parse(body, api, tokens)
}

/// The prompt's token ids as vLLM computes them: a chat's messages through the chat template
/// (`add_generation_prompt` as the body says, vLLM's default true) encoded without special
/// tokens; a completion's prompt encoded with them (a BOS where the tokenizer adds one).
fn model_tokens(v: &Value, api: Api, tokenizer: &ChatTokenizer) -> Result<Vec<u32>, String> {
    let ids = match api {
        Api::Chat => {
            let messages = &v["messages"];
            if !messages.is_array() {
                return Err("messages: missing or not an array".into());
            }
            let generation = v["add_generation_prompt"].as_bool().unwrap_or(true);
            tokenizer.chat_token_ids(messages, generation)
        }
        Api::Completion => {
            let text = prompt_text(v, api)?;
            tokenizer.encode(&String::from_utf8_lossy(&text), true)
        }
    };
    ids.map_err(|e| format!("prompt: {}", ailb_userspace::error_chain(&e)))
}

/// Prefix-cache keys of token ids: one per [`BLOCK_TOKENS`] tokens (the last may be partial),
/// each the hash of the previous key and the block's ids, as [`text::block_keys`] chains text.
pub fn token_block_keys(ids: &[u32]) -> Vec<u64> {
    let mut prev = 0u64;
    ids.chunks(BLOCK_TOKENS as usize)
        .map(|chunk| {
            let mut h = ConversationHasher::new();
            for b in prev.to_le_bytes().into_iter().chain(chunk.iter().flat_map(|t| t.to_le_bytes())) {
                h.write_u8(b);
            }
            prev = h.finish(8 + 4 * chunk.len() as u64);
            prev
        })
        .collect()
}

/// The prompt text of a request without the extension.
fn prompt_text(v: &Value, api: Api) -> Result<Vec<u8>, String> {
    let mut text = Vec::new();
    match api {
        Api::Chat => {
            let Some(msgs) = v["messages"].as_array() else {
                return Err("messages: missing or not an array".into());
            };
            for m in msgs {
                push_content(&m["content"], &mut text);
            }
        }
        Api::Completion => match &v["prompt"] {
            Value::String(s) => text.extend_from_slice(s.as_bytes()),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => {
                text.extend_from_slice(a[0].as_str().unwrap_or_default().as_bytes())
            }
            Value::Array(_) => return Err("prompt: the simulator takes one prompt (a string)".into()),
            _ => return Err("prompt: missing or not a string".into()),
        },
    }
    Ok(text)
}

fn parse(body: &[u8], api: Api, tokens: Tokens<'_>) -> Result<ChatRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let uint = |v: &Value, what: &str| -> Result<Option<u64>, String> {
        match v {
            Value::Null => Ok(None),
            v => v.as_u64().map(Some).ok_or_else(|| format!("{what}: {v} is not a non-negative integer")),
        }
    };
    let top_max = match uint(&v["max_tokens"], "max_tokens")? {
        Some(m) => Some(m),
        None => uint(&v["max_completion_tokens"], "max_completion_tokens")?,
    };
    let sim = match &v["ailb_sim"] {
        Value::Null => match tokens {
            Tokens::Model(tokenizer) => {
                let ids = model_tokens(&v, api, tokenizer)?;
                SimRequest {
                    prompt_tokens: (ids.len() as u64).max(1),
                    max_tokens: top_max.unwrap_or(DEFAULT_MAX_TOKENS),
                    hash_ids: token_block_keys(&ids),
                    token_ids: ids,
                }
            }
            Tokens::None | Tokens::Pseudo => {
                let text = prompt_text(&v, api)?;
                let token_ids = match tokens {
                    Tokens::Pseudo => {
                        text.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
                    }
                    _ => Vec::new(),
                };
                SimRequest {
                    prompt_tokens: text::tokens_of(text.len()),
                    max_tokens: top_max.unwrap_or(DEFAULT_MAX_TOKENS),
                    hash_ids: text::block_keys(&text),
                    token_ids,
                }
            }
        },
        ext @ Value::Object(_) => {
            let prompt_tokens =
                uint(&ext["prompt_tokens"], "ailb_sim.prompt_tokens")?.ok_or("ailb_sim.prompt_tokens: missing")?;
            let max_tokens = uint(&ext["max_tokens"], "ailb_sim.max_tokens")?.or(top_max).unwrap_or(DEFAULT_MAX_TOKENS);
            let hash_ids = match &ext["hash_ids"] {
                Value::Null => Vec::new(),
                Value::Array(a) => a
                    .iter()
                    .map(|h| h.as_u64().ok_or_else(|| format!("ailb_sim.hash_ids: {h} is not a non-negative integer")))
                    .collect::<Result<_, _>>()?,
                other => return Err(format!("ailb_sim.hash_ids: {other} is not an array")),
            };
            SimRequest { prompt_tokens, max_tokens, hash_ids, token_ids: Vec::new() }
        }
        other => return Err(format!("ailb_sim: {other} is not an object")),
    };
    let sim = SimRequest { max_tokens: sim.max_tokens.max(1), ..sim };
    Ok(ChatRequest {
        sim,
        stream: v["stream"].as_bool().unwrap_or(false),
        include_usage: v["stream_options"]["include_usage"].as_bool().unwrap_or(false),
        model: v["model"].as_str().filter(|m| !m.is_empty()).map(str::to_string),
    })
}

/// Appends a message's text (a string, or the `text` of its parts) to the prompt.
fn push_content(c: &Value, out: &mut Vec<u8>) {
    match c {
        Value::String(s) => out.extend_from_slice(s.as_bytes()),
        Value::Array(parts) => {
            for t in parts.iter().filter_map(|p| p["text"].as_str()) {
                out.extend_from_slice(t.as_bytes());
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_prompt_is_read_like_a_chat_message() {
        let chat = parse_chat(br#"{"model": "m", "messages": [{"role": "user", "content": "abcdefgh"}]}"#).unwrap();
        let done = parse_completion(br#"{"model": "m", "prompt": "abcdefgh"}"#).unwrap();
        assert_eq!(chat, done);
        assert_eq!((done.sim.prompt_tokens, done.model.as_deref()), (2, Some("m")));
        assert_eq!(parse_completion(br#"{"prompt": ["abcd"]}"#).unwrap().sim.prompt_tokens, 1);
        assert!(parse_completion(br#"{"prompt": ["a", "b"]}"#).unwrap_err().contains("one prompt"));
        assert!(parse_completion(br#"{"messages": []}"#).unwrap_err().contains("prompt"));
        assert_eq!(parse_completion(br#"{"model": "", "prompt": "x"}"#).unwrap().model, None);
    }
}
