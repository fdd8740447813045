//! The request lists of the real-engine race, built once in the parent and written to a file
//! that the client worker reads: every policy sends exactly the same bytes in the same order.
//!
//! - **shared-prefix**: `tenants` tenants, each with a long system prompt of its own
//!   (`system_words` words of [`filler`] text, about two tokens of the tiny model's tokenizer a
//!   word), and users who each ask one short question (`question_words` words) under a tenant
//!   drawn at random (seeded). No session header and no socket tag: what is shared is the text
//!   only, as with an API whose clients send the whole prompt every time.
//! - **trace**: the first requests of the Mooncake conversation trace, each prompt the trace's
//!   block ids rendered as text ([`block_text`]) scaled down by `trace_scale` (every 512-token
//!   block becomes `2048 / scale` bytes, so the blocks conversations share stay shared, at
//!   `1 / scale` of their length), `max_tokens` the trace's output length over the same scale.
//!   The conversation goes as `X-Session-ID` (and as the socket tag for ailb's kernel pick).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use ailb_sim::replay::{trace, RequestSpec, TraceSelect};
use ailb_sim::text::{block_text, BLOCK_BYTES, BYTES_PER_TOKEN};
use ailb_tests::vllm::filler;
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Bytes of prompt text per token of the tiny model's tokenizer, at least (its vocabulary is
/// trained on English-like text: about 3.3 bytes a token on the trace's words): only used to
/// keep every request within `--max-model-len` and to estimate the KV memory tag.
const MIN_BYTES_PER_TOKEN: usize = 3;
/// The chat template's own tokens around the messages, at most.
const TEMPLATE_TOKENS: usize = 64;

/// One request of a workload, as the client worker sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RealRequest {
    /// The `/v1/chat/completions` body (streamed, with the usage chunk).
    pub body: serde_json::Value,
    /// `X-Session-ID`, when the workload has conversations.
    pub session: Option<String>,
    /// The socket's conversation tag for ailb's kernel pick (the same as the session).
    pub tag_conversation: Option<String>,
    /// The socket's memory tag for ailb's kernel pick: the request's KV need, MiB.
    pub memory_mb: u32,
    /// The tenant (shared-prefix) or conversation (trace, numbered in the order of their first
    /// turn) the request belongs to: where the `tenant-pinned` oracle sends it.
    #[serde(default)]
    pub tenant: Option<usize>,
}

/// A workload of the real-engine race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    SharedPrefix,
    Trace,
}

impl Kind {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s.trim() {
            "shared-prefix" => Ok(Kind::SharedPrefix),
            "trace" => Ok(Kind::Trace),
            other => bail!("--workloads: unknown workload {other:?} (shared-prefix, trace)"),
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Kind::SharedPrefix => "shared-prefix",
            Kind::Trace => "trace",
        }
    }
}

/// The sizes of the workloads (from the command line).
#[derive(Debug, Clone)]
pub struct Sizes {
    pub requests: usize,
    pub tenants: usize,
    pub system_words: usize,
    pub question_words: usize,
    pub max_tokens: u32,
    pub trace_requests: usize,
    pub trace_scale: u32,
    pub trace_max_tokens: u32,
    pub max_model_len: usize,
    pub kv_bytes_per_token: u64,
    pub seed: u64,
}

/// The request list of `kind`, and a line saying what it is.
pub fn build(kind: Kind, sizes: &Sizes, model: &str, trace_path: &Path) -> anyhow::Result<(Vec<RealRequest>, String)> {
    match kind {
        Kind::SharedPrefix => Ok(shared_prefix(sizes, model)),
        Kind::Trace => trace_slice(sizes, model, trace_path),
    }
}

/// The KV memory a request needs, MiB (its prompt at the fewest bytes a token, plus its output).
fn memory_mb(prompt_bytes: usize, max_tokens: u32, kv_bytes_per_token: u64) -> u32 {
    let tokens = (prompt_bytes / MIN_BYTES_PER_TOKEN + TEMPLATE_TOKENS) as u64 + u64::from(max_tokens);
    (tokens * kv_bytes_per_token).div_ceil(1 << 20) as u32
}

fn chat(model: &str, messages: serde_json::Value, max_tokens: u32) -> serde_json::Value {
    // `ignore_eos`: the tiny model's random weights may stop at any token; every policy's
    // requests then generate the same number of tokens.
    json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

fn shared_prefix(s: &Sizes, model: &str) -> (Vec<RealRequest>, String) {
    let systems: Vec<String> = (0..s.tenants).map(|t| filler(1_000 + t as u64, s.system_words)).collect();
    let mut rng = s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(s.requests);
    for i in 0..s.requests {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let tenant = (rng % s.tenants as u64) as usize;
        let question = filler(1_000_000 + i as u64, s.question_words);
        let bytes = systems[tenant].len() + question.len();
        let messages = json!([
            {"role": "system", "content": systems[tenant]},
            {"role": "user", "content": question},
        ]);
        out.push(RealRequest {
            body: chat(model, messages, s.max_tokens),
            session: None,
            tag_conversation: None,
            memory_mb: memory_mb(bytes, s.max_tokens, s.kv_bytes_per_token),
            tenant: Some(tenant),
        });
    }
    let what = format!(
        "{} requests, {} tenants, each a system prompt of {} words (about {} tokens) and a {}-word question, \
         {} output tokens each, no session header",
        s.requests,
        s.tenants,
        s.system_words,
        s.system_words * 2,
        s.question_words,
        s.max_tokens
    );
    (out, what)
}

/// The trace workload: whole conversations of the Mooncake trace ([`choose_conversations`]),
/// each request's sizes scaled ([`Scaled`]) and its blocks rendered as text
/// ([`trace_request`]); and a line saying what it is.
fn trace_slice(s: &Sizes, model: &str, path: &Path) -> anyhow::Result<(Vec<RealRequest>, String)> {
    if s.trace_scale == 0 || !BLOCK_BYTES.is_multiple_of(s.trace_scale as usize) {
        bail!("--trace-scale {}: must divide {BLOCK_BYTES} (the bytes of a trace block's text)", s.trace_scale);
    }
    let (requests, _issues) = trace::load(path).with_context(|| format!("reading the trace {}", path.display()))?;
    let (convs, _stats) = trace::conversations(&requests, trace::DEFAULT_COMMON_SHARE);
    let sel = TraceSelect { limit: None, model: model.to_string(), ..Default::default() };
    let specs = ailb_sim::replay::trace_specs(&requests, &convs, &sel);
    let scaled = Scaled { sizes: s };
    let chosen = choose_conversations(&specs, &scaled, s.trace_requests);
    let picked: Vec<RequestSpec> =
        specs.iter().filter(|x| chosen.names.contains(x.conversation.as_str())).cloned().collect();
    let mut out = Vec::new();
    let mut numbers: HashMap<&str, usize> = HashMap::new();
    for spec in &picked {
        let next = numbers.len();
        let tenant = *numbers.entry(spec.conversation.as_str()).or_insert(next);
        out.push(trace_request(spec, tenant, &scaled, model));
    }
    let reuse = ailb_sim::replay::oracle_prefix_hit_rate(&picked).unwrap_or(0.0);
    let what = format!(
        "{} requests of the Mooncake trace ({}): every turn of its first {} conversations of two turns or more{}, \
         in the trace's order; prompts and outputs scaled by 1/{} (a 512-token block of the trace is {} bytes of \
         text), at most {} output tokens, the conversation as X-Session-ID; {:.1} % of their prompt tokens are a \
         prefix an earlier request of the slice sent (in whole trace blocks: a bound no placement passes)",
        out.len(),
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        chosen.names.len(),
        if chosen.too_long > 0 {
            format!(" whose turns fit --max-model-len ({} longer ones left out)", chosen.too_long)
        } else {
            String::new()
        },
        s.trace_scale,
        scaled.chunk(),
        s.trace_max_tokens,
        reuse * 100.0
    );
    Ok((out, what))
}

/// A trace request's sizes scaled down by `trace_scale`.
struct Scaled<'a> {
    sizes: &'a Sizes,
}

impl Scaled<'_> {
    /// Bytes of text of a trace block.
    fn chunk(&self) -> usize {
        BLOCK_BYTES / self.sizes.trace_scale as usize
    }

    /// Bytes of the prompt's text.
    fn bytes(&self, spec: &RequestSpec) -> usize {
        (u64::from(spec.prompt_tokens) * BYTES_PER_TOKEN) as usize / self.sizes.trace_scale as usize
    }

    fn max_tokens(&self, spec: &RequestSpec) -> u32 {
        (spec.max_tokens / self.sizes.trace_scale).clamp(1, self.sizes.trace_max_tokens)
    }

    /// Whether the request fits `--max-model-len`, its prompt at the fewest bytes a token.
    fn fits(&self, spec: &RequestSpec) -> bool {
        self.bytes(spec) / MIN_BYTES_PER_TOKEN + TEMPLATE_TOKENS + self.max_tokens(spec) as usize
            <= self.sizes.max_model_len
    }
}

/// The conversations of a trace slice, and how many were left out for a turn too long.
struct Chosen<'a> {
    names: HashSet<&'a str>,
    too_long: usize,
}

/// Whole conversations of two turns or more, in the order of their first turn, while they fit
/// `limit` requests in all: the trace's first requests are mostly first turns (their later
/// turns come minutes later), which no placement can serve from a cache.
fn choose_conversations<'a>(specs: &'a [RequestSpec], scaled: &Scaled<'_>, limit: usize) -> Chosen<'a> {
    let mut turns: HashMap<&str, (usize, bool)> = HashMap::new();
    for spec in specs {
        let e = turns.entry(spec.conversation.as_str()).or_insert((0, true));
        e.0 += 1;
        e.1 &= scaled.fits(spec);
    }
    let (mut names, mut total, mut too_long) = (HashSet::new(), 0, 0);
    for spec in specs {
        let (n, fit) = turns[spec.conversation.as_str()];
        if n < 2 || names.contains(spec.conversation.as_str()) || total + n > limit {
            continue;
        }
        if !fit {
            too_long += 1;
            continue;
        }
        names.insert(spec.conversation.as_str());
        total += n;
    }
    Chosen { names, too_long }
}

/// One trace request as text: the trace's block ids rendered ([`block_text`]) and scaled, past
/// them text no other prompt has; the conversation as its session and socket tag.
fn trace_request(spec: &RequestSpec, tenant: usize, scaled: &Scaled<'_>, model: &str) -> RealRequest {
    let (bytes, chunk) = (scaled.bytes(spec), scaled.chunk());
    let max_tokens = scaled.max_tokens(spec);
    let mut text = String::with_capacity(bytes + chunk);
    let mut ids = spec.hash_ids.iter();
    let mut filler_id = 1u64 << 63 | (spec.index as u64) << 20;
    while text.len() < bytes {
        // Past the trace's ids, text no other prompt has.
        let id = ids.next().copied().unwrap_or_else(|| {
            filler_id += 1;
            filler_id
        });
        let take = chunk.min(bytes - text.len());
        text.push_str(&block_text(id)[..take]);
    }
    let messages = json!([{"role": "user", "content": text}]);
    RealRequest {
        body: chat(model, messages, max_tokens),
        session: Some(spec.conversation.clone()),
        tag_conversation: Some(spec.conversation.clone()),
        memory_mb: memory_mb(bytes, max_tokens, scaled.sizes.kv_bytes_per_token),
        tenant: Some(tenant),
    }
}

#[cfg(test)]
mod tests;
