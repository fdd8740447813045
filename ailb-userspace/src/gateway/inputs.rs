//! The routing inputs of one request (model, memory, conversation), read from its headers
//! and JSON body. Pure: no I/O, so every rule is unit-tested here.
//!
//! - **model**: the `X-Model-Id` header, else the body's `model`.
//! - A pass-through route ([`Endpoint::pass_through`]: vLLM's `/tokenize`, `/v1/score`, ...)
//!   is read as a completion: its `prompt` (when it has one) makes its memory estimate and its
//!   derived conversation.
//! - **memory** (MB; ailb's MB are MiB, as NVML reports them): `X-Required-Memory` in GB
//!   (decimal allowed, 1 GB = 1024 MB), else `X-Required-Memory-MB`, else the model's
//!   `required_memory_mb`, else the estimate of the KV cache the server reserves:
//!   `tokens = prompt_tokens + max_tokens`, `blocks = max(1, ceil(tokens / kv_block_tokens))`,
//!   `MB = ceil(blocks * kv_block_tokens * kv_bytes_per_token / 2^20)`, where `prompt_tokens =
//!   ceil(prompt text bytes / 4)` (chat: the text of every message; completions and
//!   embeddings: the prompt or input strings), `max_tokens` is the body's `max_tokens` or
//!   `max_completion_tokens` (0 when absent; the Responses and Messages APIs: see [`agents`])
//!   and `kv_block_tokens` the model's KV block
//!   (a paged KV cache allocates whole blocks, so a request one token past a block boundary
//!   holds one more block); none when the model has no `kv_bytes_per_token`.
//! - **conversation**: the first of `X-Session-ID`, the body's `prompt_cache_key`, the
//!   `llm-d-session` cookie, the configured `session_header`; else derived: for chat, the
//!   hash of the model, the system prompt and the first user message (every turn of a chat
//!   that resends its history derives the same key); for `/v1/completions`, of the model and
//!   the first `completion_prefix_bytes` of the prompt; embeddings derive none; the Responses
//!   and Messages APIs as chat does, from their own fields ([`agents`]). A given id
//!   longer than the kernel takes ([`MAX_CONVERSATION_LEN`]) is replaced by its hash.

use ailb_common::abi::MAX_CONVERSATION_LEN;
use ailb_common::hash::conversation_hash;
use hyper::header::HeaderName;
use hyper::StatusCode;
use serde_json::Value;

use super::http::{visible_ascii, ApiError, ErrorShape, Headers};
use super::request_fields::{self, Fields, Messages, StrOr, Text};

mod agents;

/// The API a request calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
    /// OpenAI's Responses API.
    Responses,
    /// Anthropic's Messages API.
    Messages,
    /// Anthropic's token count of a Messages request (`/v1/messages/count_tokens`): its
    /// fields without `max_tokens`, nothing generated.
    CountTokens,
    /// A route of the model server the front door passes through, routed like a completion
    /// ([`Endpoint::pass_through`]): vLLM's `/tokenize`, `/detokenize`, `/v1/score`,
    /// `/v1/rerank`, and any other `POST /v1/...` whose body names a `model`.
    PassThrough,
}

impl Endpoint {
    /// The API of a request path (`None` for any other path).
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            "/v1/messages/count_tokens" => Some(Endpoint::CountTokens),
            _ => None,
        }
    }

    /// The route of a `POST` to `path` that none of the APIs above takes: a pass-through for
    /// vLLM's own routes (`/tokenize`, `/detokenize`, `/score`, `/rerank`, `/v1/score`,
    /// `/v1/rerank`, `/v2/rerank`) and any other `/v1/...` path, sent upstream as it came,
    /// routed by its body's `model` (a body without one is a 404: no such route). Not under `/v1/responses/`,
    /// `/v1/messages/` or `/v1/models`, whose paths the front door answers itself.
    pub fn pass_through(path: &str) -> Option<Self> {
        const OWN: [&str; 3] = ["/v1/responses/", "/v1/messages/", "/v1/models"];
        let vllm = matches!(path, "/tokenize" | "/detokenize" | "/score" | "/rerank" | "/v2/rerank");
        let v1 = path.starts_with("/v1/") && path.len() > 4 && !OWN.iter().any(|p| path.starts_with(p));
        (vllm || v1).then_some(Endpoint::PassThrough)
    }

    /// The shape its clients read errors in: Anthropic's on its Messages API, else OpenAI's.
    pub fn error_shape(self) -> ErrorShape {
        match self {
            Endpoint::Messages | Endpoint::CountTokens => ErrorShape::Anthropic,
            _ => ErrorShape::OpenAi,
        }
    }
}

/// What the catalog knows of a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelFacts {
    pub required_memory_mb: Option<u32>,
    pub kv_bytes_per_token: Option<u64>,
    /// Tokens per KV block of the model's server (at least 1; 0 is read as 1).
    pub kv_block_tokens: u64,
}

/// The configurable part of the rules.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub session_header: Option<&'a HeaderName>,
    pub completion_prefix_bytes: usize,
}

/// Where a conversation key came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    SessionHeader,
    PromptCacheKey,
    Cookie,
    ConfiguredHeader,
    Derived,
    /// The conversation of the stored response a Responses API request continues.
    PreviousResponse,
}

/// Where a memory need came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// `X-Required-Memory` (GB).
    Header,
    /// `X-Required-Memory-MB`.
    HeaderMb,
    /// The model's `required_memory_mb`.
    Model,
    /// The estimate from the prompt's size, `max_tokens` and `kv_bytes_per_token`.
    Estimate,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Conversation {
    /// The bytes tagged as `AILB_CONVERSATION` (1..=[`MAX_CONVERSATION_LEN`]).
    pub key: String,
    pub source: KeySource,
}

impl Conversation {
    /// What the kernel stores for the key (`ailb hash` prints the same).
    pub fn hash(&self) -> u64 {
        conversation_hash(self.key.as_bytes())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Inputs {
    pub model: String,
    pub memory_mb: Option<u32>,
    pub memory_source: Option<MemorySource>,
    pub conversation: Option<Conversation>,
    /// The Responses API's `previous_response_id`: the request must reach the backend that
    /// stored that response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum InputsError {
    #[error("request body: invalid JSON: {reason}")]
    Json { reason: String },
    #[error("request body: expected a JSON object, found {found}")]
    NotObject { found: &'static str },
    #[error("no model: set the body's `model` or the X-Model-Id header")]
    NoModel,
    #[error("body field `{field}`: missing ({reason})")]
    Missing { field: &'static str, reason: &'static str },
    #[error("body field `{field}`: invalid value {value}: {reason}")]
    BadField { field: &'static str, value: String, reason: &'static str },
    #[error("header {header}: invalid value {value:?}: {reason}")]
    BadHeader { header: &'static str, value: String, reason: &'static str },
    #[error("the model `{model}` does not exist")]
    UnknownModel { model: String },
}

impl InputsError {
    /// The request field at fault, for the error's `param`.
    pub fn param(&self) -> Option<&str> {
        match self {
            InputsError::NoModel | InputsError::UnknownModel { .. } => Some("model"),
            InputsError::BadField { field, .. } | InputsError::Missing { field, .. } => Some(field),
            InputsError::BadHeader { header, .. } => Some(header),
            InputsError::Json { .. } | InputsError::NotObject { .. } => None,
        }
    }
}

impl From<InputsError> for ApiError {
    fn from(e: InputsError) -> Self {
        use InputsError as R;
        let param = e.param().map(str::to_string);
        let mut api = match &e {
            R::UnknownModel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", "")
            }
            R::Json { .. } | R::NotObject { .. } => ApiError::invalid_request("invalid_json", ""),
            R::NoModel | R::BadField { .. } | R::BadHeader { .. } => ApiError::invalid_request("invalid_value", ""),
            R::Missing { .. } => ApiError::invalid_request("missing_required_parameter", ""),
        };
        api.message = e.to_string();
        api.param = param;
        api
    }
}

/// Parses a request body as a JSON object, keeping only the fields the rules read
/// ([`super::request_fields::ROUTING_FIELDS`], borrowed from `bytes` where they can be; the body goes
/// upstream as it came).
pub fn parse_body(bytes: &[u8]) -> Result<Fields<'_>, InputsError> {
    // JSON text is UTF-8. One check of the whole body lets the parser take it as text; parsing
    // the bytes instead checks each string on its own, a fifth of the parse of a small body.
    let text = std::str::from_utf8(bytes).map_err(|e| InputsError::Json {
        reason: format!("not UTF-8 text (an invalid byte at offset {})", e.valid_up_to()),
    })?;
    match serde_json::from_str(text).map_err(|e| InputsError::Json { reason: e.to_string() })? {
        request_fields::Top::Object(fields) => Ok(fields),
        request_fields::Top::Other(found) => Err(InputsError::NotObject { found }),
    }
}

/// The routing inputs of a request to `endpoint`; `facts` looks a model up in the catalog.
pub fn extract(
    endpoint: Endpoint,
    headers: &impl Headers,
    body: &Fields<'_>,
    rules: Rules<'_>,
    facts: impl Fn(&str) -> Option<ModelFacts>,
) -> Result<Inputs, InputsError> {
    let bad_model =
        |value: String| InputsError::BadField { field: "model", value, reason: "expected a non-empty string" };
    let model = match header_str(headers, "x-model-id")? {
        Some(m) => m.to_string(),
        None => match &body.model {
            Some(StrOr::Str(m)) if !m.is_empty() => m.to_string(),
            Some(StrOr::Str(m)) => return Err(bad_model(Value::String(m.to_string()).to_string())),
            None | Some(StrOr::Other(Value::Null)) => return Err(InputsError::NoModel),
            Some(StrOr::Other(v)) => return Err(bad_model(v.to_string())),
        },
    };
    let Some(model_facts) = facts(&model) else {
        return Err(InputsError::UnknownModel { model });
    };
    agents::check(endpoint, body)?;
    let memory = memory_mb(endpoint, headers, body, model_facts)?;
    let conversation = conversation(endpoint, headers, body, rules, &model)?;
    let previous_response_id = agents::previous_response_id(body)?;
    Ok(Inputs {
        model,
        memory_mb: memory.map(|m| m.0),
        memory_source: memory.map(|m| m.1),
        conversation,
        previous_response_id,
    })
}

/// A header's value as text; `None` when absent or empty.
fn header_str<'h>(headers: &'h impl Headers, name: &'static str) -> Result<Option<&'h str>, InputsError> {
    let Some(v) = headers.first(name) else { return Ok(None) };
    let s = visible_ascii(v).ok_or_else(|| InputsError::BadHeader {
        header: name,
        value: String::from_utf8_lossy(v).into_owned(),
        reason: "not visible ASCII",
    })?;
    let s = s.trim();
    Ok((!s.is_empty()).then_some(s))
}

fn memory_mb(
    endpoint: Endpoint,
    headers: &impl Headers,
    body: &Fields<'_>,
    facts: ModelFacts,
) -> Result<Option<(u32, MemorySource)>, InputsError> {
    if let Some(gb) = header_str(headers, "x-required-memory")? {
        let bad = |reason| InputsError::BadHeader { header: "X-Required-Memory", value: gb.to_string(), reason };
        let v: f64 = gb.parse().map_err(|_| bad("expected GB as a decimal number"))?;
        if !v.is_finite() || v < 0.0 {
            return Err(bad("expected GB as a decimal number"));
        }
        let mb = (v * 1024.0).ceil();
        if mb > u32::MAX as f64 {
            return Err(bad("too large"));
        }
        return Ok(Some((mb as u32, MemorySource::Header)));
    }
    if let Some(mb) = header_str(headers, "x-required-memory-mb")? {
        let v = mb.parse::<u32>().map_err(|_| InputsError::BadHeader {
            header: "X-Required-Memory-MB",
            value: mb.to_string(),
            reason: "expected whole MB (0..=4294967295)",
        })?;
        return Ok(Some((v, MemorySource::HeaderMb)));
    }
    if let Some(mb) = facts.required_memory_mb {
        return Ok(Some((mb, MemorySource::Model)));
    }
    let Some(per_token) = facts.kv_bytes_per_token else { return Ok(None) };
    let prompt_tokens = (prompt_text_bytes(endpoint, body) as u64).div_ceil(4);
    let tokens = prompt_tokens.saturating_add(max_tokens(endpoint, body)?);
    Ok(Some((kv_estimate_mb(tokens, per_token, facts.kv_block_tokens), MemorySource::Estimate)))
}

/// MB of KV cache a paged server reserves for `tokens`: whole blocks of `block_tokens`
/// (at least one), each `block_tokens * per_token` bytes; saturates at `u32::MAX`.
pub fn kv_estimate_mb(tokens: u64, per_token: u64, block_tokens: u64) -> u32 {
    let block_tokens = block_tokens.max(1);
    let blocks = tokens.div_ceil(block_tokens).max(1);
    let bytes = blocks.saturating_mul(block_tokens).saturating_mul(per_token);
    u32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(u32::MAX)
}

/// The tokens a request may take, for a tenant's token rate: the prompt's estimate (as for
/// memory, a token per 4 bytes of prompt text) plus its `max_tokens`, or `assumed_max_tokens`
/// when it sets none (an embedding, a token count or a pass-through route such as `/tokenize`
/// or `/v1/score` generates nothing unless it says so).
pub fn token_estimate(endpoint: Endpoint, body: &Fields<'_>, assumed_max_tokens: u64) -> Result<u64, InputsError> {
    let prompt_tokens = (prompt_text_bytes(endpoint, body) as u64).div_ceil(4);
    let out = match max_tokens(endpoint, body)? {
        0 if matches!(endpoint, Endpoint::Embeddings | Endpoint::CountTokens | Endpoint::PassThrough) => 0,
        0 => assumed_max_tokens,
        n => n,
    };
    Ok(prompt_tokens.saturating_add(out))
}

fn max_tokens(endpoint: Endpoint, body: &Fields<'_>) -> Result<u64, InputsError> {
    let fields = match endpoint {
        Endpoint::Responses | Endpoint::Messages | Endpoint::CountTokens => {
            [agents::max_tokens_field(endpoint, body), ("", None)]
        }
        _ => [("max_tokens", body.max_tokens.as_ref()), ("max_completion_tokens", body.max_completion_tokens.as_ref())],
    };
    for (field, value) in fields {
        match value {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return v.as_u64().ok_or(InputsError::BadField {
                    field,
                    value: v.to_string(),
                    reason: "expected a whole number of tokens",
                })
            }
        }
    }
    Ok(0)
}

/// Bytes of prompt text: chat messages' text, or the prompt/input strings.
fn prompt_text_bytes(endpoint: Endpoint, body: &Fields<'_>) -> usize {
    match endpoint {
        Endpoint::ChatCompletions => match &body.messages {
            Some(Messages::List(msgs)) => msgs.iter().map(|m| m.content.text_len()).sum(),
            _ => 0,
        },
        Endpoint::Completions | Endpoint::PassThrough => strings_len(body.prompt.as_ref()),
        Endpoint::Embeddings => strings_len(body.input.as_ref()),
        Endpoint::Responses | Endpoint::Messages | Endpoint::CountTokens => agents::prompt_text_bytes(endpoint, body),
    }
}

fn strings_len(v: Option<&Value>) -> usize {
    match v {
        Some(Value::String(s)) => s.len(),
        Some(Value::Array(items)) => items.iter().map(|i| i.as_str().map_or(0, str::len)).sum(),
        _ => 0,
    }
}

fn conversation(
    endpoint: Endpoint,
    headers: &impl Headers,
    body: &Fields<'_>,
    rules: Rules<'_>,
    model: &str,
) -> Result<Option<Conversation>, InputsError> {
    let given = |key: &str, source| Conversation { key: fit(key), source };
    if let Some(id) = header_str(headers, "x-session-id")? {
        return Ok(Some(given(id, KeySource::SessionHeader)));
    }
    if let Some(Text(Some(id))) = &body.prompt_cache_key {
        if !id.is_empty() {
            return Ok(Some(given(id, KeySource::PromptCacheKey)));
        }
    }
    if let Some(id) = cookie(headers, "llm-d-session") {
        return Ok(Some(given(id, KeySource::Cookie)));
    }
    if let Some(name) = rules.session_header {
        if let Some(v) = headers.first(name.as_str()) {
            let id = String::from_utf8_lossy(v);
            if !id.trim().is_empty() {
                return Ok(Some(given(id.trim(), KeySource::ConfiguredHeader)));
            }
        }
    }
    Ok(derive(endpoint, body, rules, model).map(|key| Conversation { key, source: KeySource::Derived }))
}

/// `name`'s value in the Cookie headers.
fn cookie<'h>(headers: &'h impl Headers, name: &str) -> Option<&'h str> {
    headers.find_value("cookie", |v| {
        visible_ascii(v)?
            .split(';')
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, v)| *k == name && !v.is_empty())
            .map(|(_, v)| v)
    })
}

/// A given id as the kernel takes it: unchanged when it fits, else `h-<hash>`.
fn fit(id: &str) -> String {
    if id.len() <= MAX_CONVERSATION_LEN {
        id.to_string()
    } else {
        format!("h-{:016x}", conversation_hash(id.as_bytes()))
    }
}

/// The derived key `d-<hash>` of a request without an id; `None` when nothing identifies it.
fn derive(endpoint: Endpoint, body: &Fields<'_>, rules: Rules<'_>, model: &str) -> Option<String> {
    let mut material = Vec::new();
    material.extend_from_slice(model.as_bytes());
    material.push(0);
    match endpoint {
        Endpoint::ChatCompletions => {
            let Some(Messages::List(msgs)) = &body.messages else { return None };
            let role = |m: &&request_fields::Message<'_>, r: &str| m.role.as_deref() == Some(r);
            let system = msgs.iter().find(|m| role(m, "system") || role(m, "developer"));
            let user = msgs.iter().find(|m| role(m, "user"))?;
            if let Some(system) = system {
                system.content.write_text(&mut material);
            }
            material.push(0);
            user.content.write_text(&mut material);
        }
        Endpoint::Completions | Endpoint::PassThrough => {
            let prompt = match body.prompt.as_ref()? {
                Value::String(s) => s.clone(),
                Value::Array(items) => match items.first()? {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
                other => other.to_string(),
            };
            let bytes = prompt.as_bytes();
            material.extend_from_slice(&bytes[..bytes.len().min(rules.completion_prefix_bytes)]);
        }
        Endpoint::Embeddings => return None,
        Endpoint::Responses | Endpoint::Messages | Endpoint::CountTokens => {
            agents::derive_material(endpoint, body, &mut material)?
        }
    }
    Some(format!("d-{:016x}", conversation_hash(&material)))
}

#[cfg(test)]
mod tests;
