//! Phase **keys**: a request's prompt as prefix keys for the kernel's prefix-aware pick
//! (`ailb_common::prefix`), the ones a request sends (`prefix::sent`, at most 16).
//!
//! - **token-exact**, for a model in `[gateway.tokenizers]`: the prompt tokenized as the
//!   engine tokenizes it (chat: the chat template rendered with the generation prompt, then
//!   encoded; completions: the prompt encoded with the special tokens the engine adds), in
//!   blocks of the model's `kv_block_tokens`. These are the keys the daemon computes from the
//!   engine's KV events, so precise mode matches them block for block.
//! - **text**, otherwise: the prompt's bytes in 64-byte chunks, as the field's approximate
//!   routers do. Chat messages are written in order as `role 0x1f text 0x1e`, so two requests
//!   that share their leading messages share their leading bytes; a completion's prompt is its
//!   string. The Responses and Messages APIs send no keys yet (their affinity comes from the
//!   conversation key and the stored response).
//!
//! A prompt the tokenizer cannot take (a template error) sends no keys: the pick goes on as
//! without them.

use std::num::NonZeroU32;
use std::sync::Arc;

use serde_json::Value;

use super::inputs::Endpoint;
use super::request_fields::{Fields, Messages};
use crate::tokenize::ChatTokenizer;

/// How a model's requests are keyed.
#[derive(Clone)]
pub enum Keyer {
    Text,
    Tokens { tokenizer: Arc<ChatTokenizer>, block: NonZeroU32 },
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
            Keyer::Tokens { tokenizer, block } => match token_ids(tokenizer, endpoint, body) {
                Ok(Some(ids)) => Some(ailb_common::prefix::token_keys(&ids, *block)),
                Ok(None) => None,
                Err(e) => {
                    tracing::debug!(error = %e, "prefix keys: the prompt could not be tokenized; none sent");
                    None
                }
            },
        };
        all.map(|k| ailb_common::prefix::sent(&k).map(|(_, key)| key).collect()).unwrap_or_default()
    }
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
        _ => return None,
    }
    Some(out)
}

/// The engine's token ids of a prompt; `None` for an endpoint or shape not keyed.
fn token_ids(tok: &ChatTokenizer, endpoint: Endpoint, body: &[u8]) -> Result<Option<Vec<u32>>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    match endpoint {
        Endpoint::ChatCompletions => {
            let Some(messages) = v.get("messages") else { return Ok(None) };
            tok.chat_token_ids(messages, true).map(Some).map_err(|e| crate::error_chain(&e))
        }
        Endpoint::Completions => match v.get("prompt") {
            Some(Value::String(p)) => tok.encode(p, true).map(Some).map_err(|e| crate::error_chain(&e)),
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &[u8]) -> Fields<'_> {
        crate::gateway::inputs::parse_body(body).expect("a JSON object")
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

    #[test]
    fn other_apis_and_shapes_send_no_keys() {
        let body = br#"{"input":"hello"}"#;
        assert!(Keyer::Text.keys(Endpoint::Embeddings, &fields(body), body).is_empty());
        let body = br#"{"prompt":[1,2,3]}"#;
        assert!(Keyer::Text.keys(Endpoint::Completions, &fields(body), body).is_empty());
    }
}
