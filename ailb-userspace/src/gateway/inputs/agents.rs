//! The rules of the APIs agents call: OpenAI's Responses API (`POST /v1/responses`: `input` a
//! string or a list of input items, `instructions`, `max_output_tokens`, `previous_response_id`)
//! and Anthropic's Messages API (`POST /v1/messages`: `system` a string or text blocks,
//! `messages`, `max_tokens`, required; `POST /v1/messages/count_tokens` the same without
//! `max_tokens`). Pure, as the rest of [`super`].
//!
//! - **memory**: the prompt text is the instructions or system text and every message's or
//!   item's text (an item's `content` string or its parts' `text`, a tool call's `arguments`,
//!   a tool result's `output`); the answer's tokens are `max_output_tokens` (Responses) or
//!   `max_tokens` (Messages). A follow-up with `previous_response_id` counts only what it sends:
//!   the server adds the stored conversation, which the front door never sees.
//! - **conversation** (derived, when no id is given): the hash of the model, the instructions
//!   or system text, and the first user message (a Responses `input` string is that message),
//!   so every turn of an agent that resends its history derives the same key.

use serde_json::Value;

use super::{Endpoint, InputsError};
use crate::gateway::request_fields::{value_text, Fields, Messages, StrOr};

/// Longest quote of a wrong value in an error (a whole input item could be megabytes).
const QUOTE_CHARS: usize = 120;

/// A wrong value as an error quotes it: its JSON, cut to [`QUOTE_CHARS`].
fn quote(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(QUOTE_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// Checks the shape of the fields the rules read, so that a malformed request is refused here
/// with the field named rather than by the model server.
pub(super) fn check(endpoint: Endpoint, body: &Fields<'_>) -> Result<(), InputsError> {
    match endpoint {
        Endpoint::Responses => check_responses(body)?,
        Endpoint::Messages | Endpoint::CountTokens => check_messages(endpoint, body)?,
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Embeddings | Endpoint::PassThrough => {
            return Ok(())
        }
    }
    check_max_tokens(endpoint, body)
}

/// A Responses request: `input` (a string or input items), `instructions` (a string) and
/// `previous_response_id`.
fn check_responses(body: &Fields<'_>) -> Result<(), InputsError> {
    match &body.input {
        None | Some(Value::Null) => {
            return Err(InputsError::Missing { field: "input", reason: "the Responses API requires it" })
        }
        Some(Value::String(_)) => {}
        Some(Value::Array(items)) => {
            if let Some(item) = items.iter().find(|i| !i.is_object()) {
                return Err(InputsError::BadField {
                    field: "input",
                    value: quote(item),
                    reason: "expected each input item to be an object",
                });
            }
        }
        Some(other) => {
            return Err(InputsError::BadField {
                field: "input",
                value: quote(other),
                reason: "expected a string or an array of input items",
            })
        }
    }
    if let Some(StrOr::Other(v)) = &body.instructions {
        if !v.is_null() {
            return Err(InputsError::BadField { field: "instructions", value: quote(v), reason: "expected a string" });
        }
    }
    previous_response_id(body)?;
    Ok(())
}

/// A Messages (or count-tokens) request: `messages` (a list), `system` (a string or text
/// blocks) and, for Messages, `max_tokens`.
fn check_messages(endpoint: Endpoint, body: &Fields<'_>) -> Result<(), InputsError> {
    match &body.messages {
        None => return Err(InputsError::Missing { field: "messages", reason: "the Messages API requires it" }),
        Some(Messages::NotList) => {
            return Err(InputsError::BadField {
                field: "messages",
                value: "(not an array)".into(),
                reason: "expected an array of messages",
            })
        }
        Some(Messages::List(_)) => {}
    }
    match &body.system {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(Value::Array(blocks)) => {
            if let Some(b) = blocks.iter().find(|b| !b.is_object()) {
                return Err(InputsError::BadField {
                    field: "system",
                    value: quote(b),
                    reason: "expected each system block to be an object",
                });
            }
        }
        Some(other) => {
            return Err(InputsError::BadField {
                field: "system",
                value: quote(other),
                reason: "expected a string or an array of text blocks",
            })
        }
    }
    if endpoint == Endpoint::Messages && matches!(body.max_tokens, None | Some(Value::Null)) {
        return Err(InputsError::Missing { field: "max_tokens", reason: "the Messages API requires it" });
    }
    Ok(())
}

/// The answer's token limit, by its API's name: absent, or a whole number (at least 1 for
/// Messages).
fn check_max_tokens(endpoint: Endpoint, body: &Fields<'_>) -> Result<(), InputsError> {
    match max_tokens_field(endpoint, body) {
        (_, None | Some(Value::Null)) => Ok(()),
        // vLLM refuses a Messages request's `max_tokens` of 0 ("max_tokens must be positive").
        (field, Some(v)) if endpoint == Endpoint::Messages && v.as_u64() == Some(0) => {
            Err(InputsError::BadField { field, value: quote(v), reason: "expected at least 1 token" })
        }
        (_, Some(v)) if v.is_u64() => Ok(()),
        (field, Some(v)) => {
            Err(InputsError::BadField { field, value: quote(v), reason: "expected a whole number of tokens" })
        }
    }
}

/// The Responses API's `previous_response_id`: `None` when absent or null; an id is a
/// non-empty string (vLLM's ids begin with `resp_`, but other servers' need not).
pub(super) fn previous_response_id(body: &Fields<'_>) -> Result<Option<String>, InputsError> {
    let bad = |value: String| InputsError::BadField {
        field: "previous_response_id",
        value,
        reason: "expected the id of a stored response (a non-empty string)",
    };
    match &body.previous_response_id {
        None | Some(StrOr::Other(Value::Null)) => Ok(None),
        Some(StrOr::Str(id)) if !id.is_empty() => Ok(Some(id.to_string())),
        Some(StrOr::Str(id)) => Err(bad(Value::String(id.to_string()).to_string())),
        Some(StrOr::Other(v)) => Err(bad(quote(v))),
    }
}

/// The answer's token limit the request sets, by its API's name for it.
pub(super) fn max_tokens_field<'b>(endpoint: Endpoint, body: &'b Fields<'_>) -> (&'static str, Option<&'b Value>) {
    match endpoint {
        Endpoint::Responses => ("max_output_tokens", body.max_output_tokens.as_ref()),
        // Nothing is generated.
        Endpoint::CountTokens => ("max_tokens", None),
        _ => ("max_tokens", body.max_tokens.as_ref()),
    }
}

/// Bytes of prompt text of a Responses or Messages request.
pub(super) fn prompt_text_bytes(endpoint: Endpoint, body: &Fields<'_>) -> usize {
    match endpoint {
        Endpoint::Responses => {
            let instructions = match &body.instructions {
                Some(StrOr::Str(s)) => s.len(),
                _ => 0,
            };
            let input = match &body.input {
                Some(Value::String(s)) => s.len(),
                Some(Value::Array(items)) => items.iter().map(item_text_len).sum(),
                _ => 0,
            };
            instructions + input
        }
        Endpoint::Messages | Endpoint::CountTokens => {
            let messages = match &body.messages {
                Some(Messages::List(msgs)) => msgs.iter().map(|m| m.content.text_len()).sum(),
                _ => 0,
            };
            system_text(body.system.as_ref()).map_or(0, |t| t.len()) + messages
        }
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Embeddings | Endpoint::PassThrough => 0,
    }
}

/// Bytes of text of one Responses input item.
fn item_text_len(item: &Value) -> usize {
    let content = match item.get("content") {
        Some(Value::String(s)) => s.len(),
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p.get("text")?.as_str()).map(str::len).sum(),
        _ => 0,
    };
    let s = |k: &str| item.get(k).and_then(Value::as_str).map_or(0, str::len);
    content + s("output") + s("arguments")
}

/// An Anthropic `system`'s text: a string, or its blocks' `text` joined by newlines.
fn system_text(system: Option<&Value>) -> Option<String> {
    match system? {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            Some(blocks.iter().filter_map(|b| b.get("text")?.as_str()).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    }
}

/// Appends what identifies the conversation (after the model, already in `material`): the
/// system text, a 0 byte, the first user message. `None` when there is no user message.
pub(super) fn derive_material(endpoint: Endpoint, body: &Fields<'_>, material: &mut Vec<u8>) -> Option<()> {
    match endpoint {
        Endpoint::Responses => {
            if let Some(StrOr::Str(s)) = &body.instructions {
                material.extend_from_slice(s.as_bytes());
            }
            material.push(0);
            match body.input.as_ref()? {
                Value::String(s) => material.extend_from_slice(s.as_bytes()),
                Value::Array(items) => {
                    let user = items.iter().find(|i| i.get("role").and_then(Value::as_str) == Some("user"))?;
                    if let Some(text) = user.get("content").and_then(value_text) {
                        material.extend_from_slice(text.as_bytes());
                    }
                }
                _ => return None,
            }
        }
        Endpoint::Messages | Endpoint::CountTokens => {
            let Some(Messages::List(msgs)) = &body.messages else { return None };
            let user = msgs.iter().find(|m| m.role.as_deref() == Some("user"))?;
            if let Some(system) = system_text(body.system.as_ref()) {
                material.extend_from_slice(system.as_bytes());
            }
            material.push(0);
            user.content.write_text(material);
        }
        Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::Embeddings | Endpoint::PassThrough => {
            return None
        }
    }
    Some(())
}

#[cfg(test)]
mod tests;
