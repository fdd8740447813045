//! A model's prompt as the engine tokenizes it: the model's `tokenizer.json` (the `tokenizers`
//! crate, the library behind transformers' fast tokenizers) and its chat template rendered the
//! way transformers' `apply_chat_template` renders it for vLLM, so that the token ids, and with
//! them the prefix keys (`ailb_common::prefix::token_keys`), are the engine's own.
//!
//! What vLLM does for `/v1/chat/completions`, and so what [`ChatTokenizer::chat_token_ids`]
//! does: render the template with `messages`, `add_generation_prompt` and the special tokens
//! of `tokenizer_config.json` (`bos_token`, `eos_token`, `unk_token`, `pad_token`), then
//! encode the text without adding special tokens (the template wrote them).
//! The template is the model folder's `chat_template.jinja` if there is one (what
//! transformers 5 writes), else `chat_template` in `tokenizer_config.json` (a string, or a list
//! of named templates of which `default` is taken).
//!
//! Synchronous: files in, token ids out. A chat's rendered prompt is encoded in
//! segments whose ids are reused across requests ([`segments`]): the same ids, less work for
//! the system prompts and histories that requests repeat. A byte-level BPE's segments are
//! encoded without the library's per-byte bookkeeping ([`byte_level`]): the same ids again.
#![forbid(unsafe_code)]

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use minijinja::Environment;
use tokenizers::Tokenizer;

pub mod byte_level;
pub mod segments;
mod template;

/// The segment cache's bytes per tokenizer unless configured (`[gateway] tokenizer_cache_mb`):
/// about 8 million tokens of prompts with their text.
pub const DEFAULT_SEGMENT_CACHE_BYTES: usize = 64 << 20;

/// The special tokens a chat template may print.
const SPECIAL_TOKENS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// What went wrong loading a tokenizer or tokenizing a prompt. Messages name the file or the
/// field.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("tokenizer {path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer {origin}: not a tokenizer.json the tokenizers library reads")]
    Tokenizer {
        origin: String,
        #[source]
        source: tokenizers::Error,
    },
    #[error("tokenizer {origin}: not JSON")]
    Config {
        origin: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("tokenizer config {origin}: field `{field}`: {value}: {reason}")]
    Field { origin: String, field: String, value: String, reason: &'static str },
    #[error("tokenizer {origin}: no chat template (neither chat_template.jinja nor `chat_template` in tokenizer_config.json)")]
    NoChatTemplate { origin: String },
    #[error("tokenizer {origin}: the chat template does not parse")]
    Template {
        origin: String,
        #[source]
        source: minijinja::Error,
    },
    #[error("chat template: rendering failed")]
    Render(#[source] minijinja::Error),
    #[error("tokenizer: encoding failed")]
    Encode(#[source] tokenizers::Error),
}

/// A chat's prompt up to where its last message begins, tokenized, and the rest as text
/// ([`ChatTokenizer::chat_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatHead {
    /// The token ids of the rendered prompt's first `head_bytes` bytes.
    pub ids: Vec<u32>,
    /// The bytes of the rendered prompt the ids cover (at least one: it ends after a cut token).
    pub head_bytes: usize,
    /// The rest of the rendered prompt: the last message and the generation prompt.
    pub tail: String,
}

/// A chat's ids for its prefix keys ([`ChatTokenizer::chat_ids`]); also a completion's prompt,
/// whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatIds {
    Whole(Vec<u32>),
    Head(ChatHead),
}

/// The messages of a conversation's later turn ([`answer_before_last`]).
fn later_turn(messages: &serde_json::Value) -> Option<&[serde_json::Value]> {
    let list = messages.as_array()?;
    answer_before_last(list.iter().map(|m| m.get("role").and_then(|r| r.as_str()))).then_some(list.as_slice())
}

/// Whether messages of these roles, in order, are a conversation's later turn: an `assistant`
/// message (an answer) before the last one.
pub fn answer_before_last<'r>(roles: impl ExactSizeIterator<Item = Option<&'r str>>) -> bool {
    let earlier = roles.len().saturating_sub(1);
    roles.take(earlier).any(|r| r == Some("assistant"))
}

/// A model's tokenizer with its chat template.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    env: Environment<'static>,
    /// The special tokens' text, by the template variable's name.
    specials: Vec<(&'static str, String)>,
    /// Where a rendered prompt is cut into segments; `None`: encoded whole.
    cuts: Option<segments::Cuts>,
    /// The segments' ids; `None`: every segment encoded.
    cache: Option<segments::SegmentCache>,
    /// The byte-level path to the ids, where the tokenizer's pipeline is one it takes; `None`:
    /// the library's pipeline.
    direct: Option<byte_level::ByteLevelPath>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("specials", &self.specials)
            .field("cuts", &self.cuts.as_ref().map(segments::Cuts::tokens))
            .field("cache", &self.cache)
            .field("direct", &self.direct.is_some())
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TokenizeError> {
    std::fs::read(path).map_err(|source| TokenizeError::Read { path: path.to_path_buf(), source })
}

impl ChatTokenizer {
    /// A model folder's `tokenizer.json`, `tokenizer_config.json` and, if present,
    /// `chat_template.jinja`.
    pub fn load(dir: &Path) -> Result<Self, TokenizeError> {
        let tokenizer = read(&dir.join("tokenizer.json"))?;
        let config = read(&dir.join("tokenizer_config.json"))?;
        let jinja = dir.join("chat_template.jinja");
        let template = match std::fs::read_to_string(&jinja) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(TokenizeError::Read { path: jinja, source }),
        };
        Self::from_parts(&dir.display().to_string(), &tokenizer, &config, template)
    }

    /// The same from the files' contents; `origin` names them in errors; `template` overrides
    /// the config's `chat_template`.
    pub fn from_parts(
        origin: &str,
        tokenizer_json: &[u8],
        config_json: &[u8],
        template: Option<String>,
    ) -> Result<Self, TokenizeError> {
        let tokenizer = Tokenizer::from_bytes(tokenizer_json)
            .map_err(|source| TokenizeError::Tokenizer { origin: origin.to_string(), source })?;
        let config: serde_json::Value = serde_json::from_slice(config_json)
            .map_err(|source| TokenizeError::Config { origin: origin.to_string(), source })?;
        let field = |field: &str, value: &serde_json::Value, reason| TokenizeError::Field {
            origin: origin.to_string(),
            field: field.to_string(),
            value: value.to_string(),
            reason,
        };
        let mut specials = Vec::new();
        for name in SPECIAL_TOKENS {
            match config.get(name) {
                None | Some(serde_json::Value::Null) => {}
                Some(serde_json::Value::String(s)) => specials.push((name, s.clone())),
                // transformers also writes an added token: `{"content": "<s>", ...}`.
                Some(v) => match v.get("content").and_then(|c| c.as_str()) {
                    Some(s) => specials.push((name, s.to_string())),
                    None => return Err(field(name, v, "expected a string or an object with `content`")),
                },
            }
        }
        let template = match template {
            Some(t) => t,
            None => match config.get("chat_template") {
                None | Some(serde_json::Value::Null) => {
                    return Err(TokenizeError::NoChatTemplate { origin: origin.to_string() })
                }
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v @ serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| field("chat_template", v, "a list of templates without a `default` one"))?,
                Some(v) => return Err(field("chat_template", v, "expected a string or a list of named templates")),
            },
        };
        let env = template::environment(template)
            .map_err(|source| TokenizeError::Template { origin: origin.to_string(), source })?;
        let cuts = segments::Cuts::of(&tokenizer);
        let cache = NonZeroUsize::new(DEFAULT_SEGMENT_CACHE_BYTES).map(segments::SegmentCache::new);
        let direct = byte_level::ByteLevelPath::of(&tokenizer);
        Ok(ChatTokenizer { tokenizer, env, specials, cuts, cache, direct })
    }

    /// The same with a segment cache of `bytes` (`None`: no cache, every prompt encoded whole).
    pub fn with_segment_cache(mut self, bytes: Option<NonZeroUsize>) -> Self {
        self.cache = bytes.map(segments::SegmentCache::new);
        self
    }

    /// The same encoding every text through the library's pipeline (`direct: false`) or, where
    /// the tokenizer is one it takes, through [`byte_level`] (`true`, the default).
    pub fn with_direct_path(mut self, direct: bool) -> Self {
        self.direct = if direct { byte_level::ByteLevelPath::of(&self.tokenizer) } else { None };
        self
    }

    /// Whether texts are encoded through [`byte_level`] rather than the library's pipeline.
    pub fn direct_path(&self) -> bool {
        self.direct.is_some()
    }

    /// The segment cache, if any.
    pub fn segment_cache(&self) -> Option<&segments::SegmentCache> {
        self.cache.as_ref()
    }

    /// The special tokens a rendered prompt is cut after (empty: encoded whole).
    pub fn cut_tokens(&self) -> &[String] {
        self.cuts.as_ref().map_or(&[], segments::Cuts::tokens)
    }

    /// The prompt text: the chat template over `messages` (the request's `messages` array, as
    /// JSON) with `add_generation_prompt`.
    pub fn render<M: serde::Serialize + ?Sized>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizeError> {
        let tmpl = self.env.get_template(template::CHAT).map_err(TokenizeError::Render)?;
        let mut ctx: Vec<(&str, minijinja::Value)> =
            self.specials.iter().map(|(name, text)| (*name, minijinja::Value::from(text.as_str()))).collect();
        ctx.push(("messages", minijinja::Value::from(minijinja::value::Serde(messages))));
        ctx.push(("add_generation_prompt", minijinja::Value::from(add_generation_prompt)));
        let ctx = minijinja::Value::from_pairs(ctx);
        tmpl.render(ctx).map_err(TokenizeError::Render)
    }

    /// Token ids of `text`; `add_special_tokens` as in transformers (the tokenizer's own
    /// post-processor, e.g. a leading BOS). Only the ids are needed, so the tokenizer tracks no
    /// offsets (`encode_fast`: the same ids, less work per token; `cargo bench -p ailb-userspace
    /// --bench tokenize_cpu` measures both). Without special tokens added, through
    /// [`byte_level`] where it applies: the same ids again, less work still.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        if let (Some(direct), false) = (&self.direct, add_special_tokens) {
            return direct.encode(&self.tokenizer, text).map_err(TokenizeError::Encode);
        }
        let encoding = self.tokenizer.encode_fast(text, add_special_tokens).map_err(TokenizeError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The tokenizer itself.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// A chat request's prompt token ids, as vLLM computes them for `/v1/chat/completions`.
    pub fn chat_token_ids(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.encode_rendered(&self.render(messages, add_generation_prompt)?)
    }

    /// A conversation's later turn tokenized up to where its last message begins, the rest left
    /// as text; `None` for any other chat and where the turn cannot be cut exactly (then
    /// [`Self::chat_token_ids`] tokenizes it whole): no assistant message before the last one, a
    /// tokenizer that is not cut in segments or has no segment cache, a template whose rendering
    /// of the earlier messages is not the start of the whole prompt's (or fails), or no cut
    /// before the last message.
    ///
    /// The head ends right after the last cut token at or before the end of the earlier
    /// messages' rendering, so its ids are exactly the first ids of the whole prompt (the cut
    /// property of [`segments`]). Why: a later turn's earlier messages (the conversation so
    /// far) are what an engine may hold; its last message is the user's new text, which no
    /// engine has seen, and tokenizing it is most of the work on the request path when it is
    /// long. A chat without an answer in it is a first turn: its last message may carry what
    /// many requests share (a document before the question, the same question again), so it is
    /// tokenized whole.
    pub fn chat_head(&self, messages: &serde_json::Value) -> Result<Option<ChatHead>, TokenizeError> {
        if self.cuts.is_none() || self.cache.is_none() || later_turn(messages).is_none() {
            return Ok(None);
        }
        self.head_of(messages, &self.render(messages, true)?)
    }

    /// A chat request's ids for its prefix keys: a later turn's up to its last message
    /// ([`Self::chat_head`]) where it can be cut so, else the whole prompt's
    /// ([`Self::chat_token_ids`]); the template rendered once for both.
    pub fn chat_ids(&self, messages: &serde_json::Value) -> Result<ChatIds, TokenizeError> {
        let full = self.render(messages, true)?;
        match self.head_of(messages, &full)? {
            Some(head) => Ok(ChatIds::Head(head)),
            None => self.encode_rendered(&full).map(ChatIds::Whole),
        }
    }

    /// [`Self::chat_head`] of `messages` whose whole prompt renders as `full`.
    fn head_of(&self, messages: &serde_json::Value, full: &str) -> Result<Option<ChatHead>, TokenizeError> {
        let (Some(cuts), Some(_)) = (&self.cuts, &self.cache) else { return Ok(None) };
        let Some(list) = later_turn(messages) else { return Ok(None) };
        let Ok(earlier) = self.render(&list[..list.len() - 1], false) else { return Ok(None) };
        if !full.starts_with(&earlier) {
            return Ok(None);
        }
        let Some(cut) = cuts.last_cut_within(full, earlier.len()) else { return Ok(None) };
        let ids = self.encode_rendered(&full[..cut])?;
        Ok(Some(ChatHead { ids, head_bytes: cut, tail: full[cut..].to_string() }))
    }

    /// Puts the ids of `text`'s segments in the segment cache (a prompt's tail left untokenized
    /// by [`Self::chat_head`], which the conversation's next request will send again among its
    /// earlier messages); nothing without cuts or a cache. An encoding error leaves that
    /// segment out.
    pub fn warm(&self, text: &str) {
        let (Some(cuts), Some(cache)) = (&self.cuts, &self.cache) else { return };
        let mut scratch = Vec::new();
        for segment in cuts.segments(text) {
            scratch.clear();
            let _ = cache.extend(segment, &mut scratch, |s| self.encode(s, false));
        }
    }

    /// A rendered prompt's ids (no special tokens added: the template wrote them), segment by
    /// segment through the cache where the tokenizer can be cut, else whole. The same ids
    /// either way.
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let (Some(cuts), Some(cache)) = (&self.cuts, &self.cache) else { return self.encode(text, false) };
        let mut ids = Vec::new();
        for segment in cuts.segments(text) {
            cache.extend(segment, &mut ids, |s| self.encode(s, false))?;
        }
        Ok(ids)
    }
}

#[cfg(test)]
pub(crate) mod tests;
