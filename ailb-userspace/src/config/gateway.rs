//! The `[gateway]` section of the config file: serde types with documented defaults, and
//! [`GatewayConfig::validate`] that turns them into a [`ValidGateway`] or an
//! [`ConfigError::InvalidValue`] naming the field and the value. `ailb run` ignores the
//! section; `ailb gateway` reads it together with the model catalog (`[[models]]`,
//! `[[services]]`) of the same file.
//!
//! ```toml
//! [gateway]
//! listen = ["127.0.0.1:8080"]
//! max_body_bytes = 33554432        # 32 MiB
//! max_concurrent = 1024
//! header_timeout = "30s"
//! connect_timeout = "5s"
//! idle_timeout = "5m"
//! total_timeout = "30m"
//! session_header = "x-user-session"
//! completion_prefix_bytes = 1024
//! upstream_reuse = "conversation"  # or "never"
//! upstream_max_age = "1s"
//! upstream_idle_mark_after = "10ms"  # default "0s" when admission is on
//! upstream_max_idle = 256
//! worker_threads = 0               # 0: one per core
//! http1_fast_path = true           # false: every connection served by hyper
//! responses_max_entries = 100000   # response id -> backend, for `previous_response_id`
//! responses_ttl = "24h"            # default: none (kept while there is room)
//! prefix_keys = true               # each prompt's prefix keys to the kernel (default false)
//! tokenizer_cache_mb = 64          # per tokenizer: ids of prompt segments seen (0: none)
//! [gateway.kv_bytes_per_token]
//! "demo-7b" = 131072
//! [gateway.kv_block_tokens]          # default 16 (vLLM's default block size)
//! "demo-7b" = 16
//! [gateway.tokenizers]             # with `prefix_keys = true`: token-exact prefix keys
//! "demo-7b" = "/models/demo-7b"
//! ```
//!
//! Tenants, priorities and the scheduler: `[gateway.scheduler]` and `[[gateway.tenants]]`
//! ([`tenants`]); the admission's table: `[gateway.admission]` (`admission.rs`).
//!
//! `kv_bytes_per_token` and `kv_block_tokens` live here rather than in `[[models]]`: they are
//! only the front door's estimate of a request's memory, the kernel and `ailb run` never use
//! them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::header::HeaderName;
use serde::Deserialize;

use crate::validate::{parse_duration, ConfigError};

mod admission;
pub mod tenants;
pub use admission::{AdmissionSetting, AdmissionTable, FleetMemoryLimits, ValidAdmission, MAX_FACTOR, MAX_QUEUED};
pub use tenants::{SchedulerTable, TenantTable, ValidTenancy, ValidTenant};

/// A model's tokenizer, loaded at start-up (equal when loaded from the same folder).
#[derive(Clone)]
pub struct LoadedTokenizer {
    pub path: std::path::PathBuf,
    pub tokenizer: std::sync::Arc<crate::tokenize::ChatTokenizer>,
}

impl PartialEq for LoadedTokenizer {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl std::fmt::Debug for LoadedTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTokenizer").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The largest `tokenizer_cache_mb` accepted: 64 GiB, far above a front door's memory.
pub const MAX_TOKENIZER_CACHE_MB: u64 = 1 << 16;

fn default_tokenizer_cache_mb() -> u64 {
    (crate::tokenize::DEFAULT_SEGMENT_CACHE_BYTES >> 20) as u64
}

/// Tokens per KV block of a model not in `kv_block_tokens`: vLLM's default `--block-size`.
pub const DEFAULT_KV_BLOCK_TOKENS: u64 = 16;
/// The largest `kv_block_tokens` accepted (far above any paged KV cache's block).
pub const MAX_KV_BLOCK_TOKENS: u64 = 1 << 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Addresses the front door listens on ("ip:port"). Default `["127.0.0.1:8080"]`.
    #[serde(default = "default_listen")]
    pub listen: Vec<String>,
    /// Largest request body read; a larger one gets 413. Default 32 MiB.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: u64,
    /// Requests served at once; one more gets 429. Default 1024.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
    /// Longest wait for a client's request head, and then for its body (408 past it).
    /// Default "30s".
    #[serde(default = "default_header_timeout")]
    pub header_timeout: String,
    /// Longest wait for the upstream connect (the kernel's pick happens inside it). Default "5s".
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: String,
    /// Longest silence of the upstream: before its response head, and between two body
    /// frames (tokens of a stream). Default "5m".
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout: String,
    /// Longest whole request, from its head to the response's last byte. Default "30m".
    #[serde(default = "default_total_timeout")]
    pub total_timeout: String,
    /// One more request header that carries a conversation id (after `X-Session-ID`, the
    /// body's `prompt_cache_key` and the `llm-d-session` cookie). Default: none.
    #[serde(default)]
    pub session_header: Option<String>,
    /// Bytes of a `/v1/completions` prompt that, with the model, make the derived
    /// conversation key. Default 1024.
    #[serde(default = "default_prefix_bytes")]
    pub completion_prefix_bytes: usize,
    /// Per model (by catalog name): KV-cache bytes per token, for the memory estimate of
    /// requests that give none. Default: empty (no estimate).
    #[serde(default)]
    pub kv_bytes_per_token: BTreeMap<String, u64>,
    /// Per model (by catalog name): tokens per KV block of its servers (vLLM's
    /// `--block-size`, SGLang's `--page-size`); the estimate rounds up to whole blocks.
    /// Default [`DEFAULT_KV_BLOCK_TOKENS`] for a model not listed.
    #[serde(default)]
    pub kv_block_tokens: BTreeMap<String, u64>,
    /// Whether each request carries its prompt's prefix keys to the kernel (`AILB_PREFIX`),
    /// for models with a `prefix` mode: token-exact keys for a model in `tokenizers` (blocks
    /// of its `kv_block_tokens`), else 64-byte text chunks. Default false.
    #[serde(default)]
    pub prefix_keys: bool,
    /// Per model (by catalog name): the folder of its `tokenizer.json`, `tokenizer_config.json`
    /// and chat template, so that its prefix keys are the engine's own blocks (what its KV
    /// events report).
    #[serde(default)]
    pub tokenizers: BTreeMap<String, std::path::PathBuf>,
    /// Per tokenizer of `tokenizers`: MiB of token ids of prompt segments already seen (the
    /// text between special tokens: a tenant's system prompt, a conversation's earlier
    /// messages), so that a request tokenizes only what is new. 0: none. Default 64.
    #[serde(default = "default_tokenizer_cache_mb")]
    pub tokenizer_cache_mb: u64,
    /// Whether an upstream connection may carry another request with the same routing inputs
    /// (`"conversation"`: idle connections are kept per model, memory need and conversation
    /// key; requests without a key always get a fresh socket), or never (`"never"`: a fresh
    /// socket, and a fresh kernel pick, per request). Default "conversation".
    #[serde(default = "default_reuse")]
    pub upstream_reuse: String,
    /// A kept connection is reused only while younger than this (from its connect, where the
    /// kernel picked its backend): no request follows a pick older than this. Default "1s".
    #[serde(default = "default_max_age")]
    pub upstream_max_age: String,
    /// A kept connection is marked idle for the kernel (no longer counted in flight at its
    /// backend) once it has waited this long after its answer; one reused sooner needs no
    /// mark, which saves two system calls per request on back-to-back requests. It counts in
    /// flight meanwhile. "0s" marks it as the answer ends. Default "10ms", or "0s" when
    /// `admission` is on: the admission reads those in-flight counts, and a kept connection
    /// still counted would hold its request's memory there after the answer, so the next
    /// request could wait for room that is already free.
    #[serde(default)]
    pub upstream_idle_mark_after: Option<String>,
    /// Idle upstream connections kept at most, all keys together (each counts as one open
    /// connection at its backend for the kernel's load bound), shared out among the worker
    /// threads, each of which keeps its own. Default 256.
    #[serde(default = "default_max_idle")]
    pub upstream_max_idle: u32,
    /// Threads serving requests, each with its own runtime, listening sockets (`SO_REUSEPORT`)
    /// and idle upstream connections; 0 = one per core. Default 0.
    #[serde(default)]
    pub worker_threads: u32,
    /// Admission per model across both entry points, read from the pins under
    /// `daemon.bpffs` (read access needed). `true` (mode "inflight", `gateway/control/inflight.rs`):
    /// a request whose model has as many connections in flight as the sum of its backends'
    /// `max_inflight` gets 429 with `Retry-After` (needs `daemon.listen`). A table
    /// `[gateway.admission]` with `mode = "fleet_memory"` (`gateway/control/fleet_memory.rs`): a
    /// request waits while its model's hinted memory in flight and its own exceed `factor` x
    /// the live backends' KV capacity, at most `max_wait`, then gets 503 with `Retry-After`
    /// (see [`AdmissionTable`]). Default false (off).
    #[serde(default)]
    pub admission: AdmissionSetting,
    /// The `Retry-After` of an answer shed by the admission, whole seconds. Default "1s".
    #[serde(default = "default_retry_after")]
    pub admission_retry_after: String,
    /// Whether client connections are read by the front door's own HTTP/1 path first
    /// (`gateway/client/h1/`): HTTP/1.x GET and POST requests with a `Content-Length` body (or
    /// none) are parsed in place and answered without hyper's server; anything else (HTTP/2, a
    /// chunked body, an upgrade, `Expect`, a head it does not take) hands the connection to
    /// hyper with the bytes read so far. `false`: hyper serves every connection. Default true.
    #[serde(default = "default_true")]
    pub http1_fast_path: bool,
    /// Responses API ids remembered with the backend that produced each (`POST /v1/responses`
    /// answers), so that a request naming one in `previous_response_id` goes to the server
    /// that stored it; past this many the oldest is forgotten. Default 100000 (25 to 45 MB: an
    /// entry holds the id twice, the backend and the conversation key, 250 to 450 bytes).
    #[serde(default = "default_responses_max_entries")]
    pub responses_max_entries: u32,
    /// How long a remembered response id is kept. Default: none, kept until
    /// `responses_max_entries` pushes it out, since vLLM keeps a stored response in its memory
    /// until the server restarts (a follow-up to a server that restarted gets the server's own
    /// 404).
    #[serde(default)]
    pub responses_ttl: Option<String>,
    /// The scheduler's settings (`[gateway.scheduler]`, see [`tenants`]): priority levels,
    /// the bounds of its queues. Default: off, unless `tenants` are configured.
    #[serde(default)]
    pub scheduler: Option<SchedulerTable>,
    /// The tenants (`[[gateway.tenants]]`, see [`tenants`]): how each is recognised, its
    /// weight, priority ceiling, token rate and concurrency share. Default: none.
    #[serde(default)]
    pub tenants: Vec<TenantTable>,
}

fn default_responses_max_entries() -> u32 {
    100_000
}

fn default_true() -> bool {
    true
}

fn default_retry_after() -> String {
    "1s".to_string()
}

/// Whether upstream connections carry more than one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamReuse {
    Never,
    Conversation,
}

fn default_listen() -> Vec<String> {
    vec!["127.0.0.1:8080".to_string()]
}
fn default_max_body() -> u64 {
    32 * 1024 * 1024
}
fn default_max_concurrent() -> u32 {
    1024
}
fn default_header_timeout() -> String {
    "30s".to_string()
}
fn default_connect_timeout() -> String {
    "5s".to_string()
}
fn default_idle_timeout() -> String {
    "5m".to_string()
}
fn default_total_timeout() -> String {
    "30m".to_string()
}
fn default_prefix_bytes() -> usize {
    1024
}
fn default_reuse() -> String {
    "conversation".to_string()
}
fn default_max_age() -> String {
    "1s".to_string()
}
/// `upstream_idle_mark_after` when not set and the admission is off.
pub const DEFAULT_IDLE_MARK_AFTER: Duration = Duration::from_millis(10);
fn default_max_idle() -> u32 {
    256
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            max_body_bytes: default_max_body(),
            max_concurrent: default_max_concurrent(),
            header_timeout: default_header_timeout(),
            connect_timeout: default_connect_timeout(),
            idle_timeout: default_idle_timeout(),
            total_timeout: default_total_timeout(),
            session_header: None,
            completion_prefix_bytes: default_prefix_bytes(),
            kv_bytes_per_token: BTreeMap::new(),
            kv_block_tokens: BTreeMap::new(),
            prefix_keys: false,
            tokenizers: BTreeMap::new(),
            tokenizer_cache_mb: default_tokenizer_cache_mb(),
            upstream_reuse: default_reuse(),
            upstream_max_age: default_max_age(),
            upstream_idle_mark_after: None,
            upstream_max_idle: default_max_idle(),
            worker_threads: 0,
            admission: AdmissionSetting::Off,
            admission_retry_after: default_retry_after(),
            http1_fast_path: true,
            responses_max_entries: default_responses_max_entries(),
            responses_ttl: None,
            scheduler: None,
            tenants: Vec::new(),
        }
    }
}

/// `[gateway]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidGateway {
    pub listen: Vec<SocketAddr>,
    pub max_body_bytes: u64,
    pub max_concurrent: u32,
    pub header_timeout: Duration,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub total_timeout: Duration,
    pub session_header: Option<HeaderName>,
    pub completion_prefix_bytes: usize,
    pub kv_bytes_per_token: BTreeMap<String, u64>,
    pub kv_block_tokens: BTreeMap<String, u64>,
    pub prefix_keys: bool,
    /// The tokenizers of `tokenizers`, loaded.
    pub tokenizers: BTreeMap<String, LoadedTokenizer>,
    pub upstream_reuse: UpstreamReuse,
    pub upstream_max_age: Duration,
    pub upstream_idle_mark_after: Duration,
    pub upstream_max_idle: u32,
    /// `None`: one per core.
    pub worker_threads: Option<usize>,
    /// Admission per model, and its mode.
    pub admission: ValidAdmission,
    /// Client connections read by the HTTP/1 fast path first (`false`: hyper only).
    pub http1_fast_path: bool,
    /// Response ids remembered with their backend, at most.
    pub responses_max_entries: u32,
    /// How long a response id is remembered (`None`: until pushed out by newer ones).
    pub responses_ttl: Option<Duration>,
    /// Tenants, priorities and the scheduler (`None`: every request is equal).
    pub tenancy: Option<ValidTenancy>,
}

/// A duration that must be above zero.
fn positive(field: &str, value: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(field, value)?;
    if d.is_zero() {
        return Err(ConfigError::invalid(field, value, "must be above zero"));
    }
    Ok(d)
}

impl GatewayConfig {
    /// Checks every field; `models` is the catalog (names of `[[models]]` and `[[services]]`).
    pub fn validate<'a>(&self, models: impl IntoIterator<Item = &'a str>) -> Result<ValidGateway, ConfigError> {
        let listen = self.listen()?;
        self.check_counts()?;
        let session_header = self.session_header()?;
        let models: Vec<&str> = models.into_iter().collect();
        self.check_kv(&models)?;
        let admission_retry = self.admission_retry()?;
        let upstream_reuse = self.upstream_reuse()?;
        let upstream_max_age = positive("gateway.upstream_max_age", &self.upstream_max_age)?;
        let admission = self.admission.validate(admission_retry)?;
        let upstream_idle_mark_after = self.idle_mark_after(upstream_max_age, &admission)?;
        Ok(ValidGateway {
            listen,
            max_body_bytes: self.max_body_bytes,
            max_concurrent: self.max_concurrent,
            header_timeout: positive("gateway.header_timeout", &self.header_timeout)?,
            connect_timeout: positive("gateway.connect_timeout", &self.connect_timeout)?,
            idle_timeout: positive("gateway.idle_timeout", &self.idle_timeout)?,
            total_timeout: positive("gateway.total_timeout", &self.total_timeout)?,
            session_header,
            completion_prefix_bytes: self.completion_prefix_bytes,
            kv_bytes_per_token: self.kv_bytes_per_token.clone(),
            kv_block_tokens: self.kv_block_tokens.clone(),
            prefix_keys: self.prefix_keys,
            tokenizers: self.load_tokenizers(&models)?,
            upstream_reuse,
            upstream_max_age,
            upstream_idle_mark_after,
            upstream_max_idle: self.upstream_max_idle,
            worker_threads: (self.worker_threads > 0).then_some(self.worker_threads as usize),
            admission,
            http1_fast_path: self.http1_fast_path,
            responses_max_entries: self.responses_max_entries,
            responses_ttl: self.responses_ttl.as_deref().map(|t| positive("gateway.responses_ttl", t)).transpose()?,
            tenancy: tenants::validate(self.scheduler.as_ref(), &self.tenants, self.max_concurrent)?,
        })
    }

    /// `listen`: at least one `ip:port`.
    fn listen(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        if self.listen.is_empty() {
            return Err(ConfigError::invalid("gateway.listen", "[]", "at least one address is needed"));
        }
        self.listen
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.parse::<SocketAddr>().map_err(|e| {
                    ConfigError::invalid(format!("gateway.listen[{i}]"), l, format!("expected ip:port ({e})"))
                })
            })
            .collect()
    }

    /// The sizes and counts that must be above zero.
    fn check_counts(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 {
            return Err(ConfigError::invalid("gateway.max_body_bytes", 0, "must be above zero"));
        }
        if self.max_concurrent == 0 {
            return Err(ConfigError::invalid("gateway.max_concurrent", 0, "must be above zero"));
        }
        if self.completion_prefix_bytes == 0 {
            return Err(ConfigError::invalid("gateway.completion_prefix_bytes", 0, "must be above zero"));
        }
        if self.responses_max_entries == 0 {
            return Err(ConfigError::invalid(
                "gateway.responses_max_entries",
                0,
                "must be above zero (a follow-up with previous_response_id needs its response's backend)",
            ));
        }
        Ok(())
    }

    fn session_header(&self) -> Result<Option<HeaderName>, ConfigError> {
        self.session_header
            .as_deref()
            .map(|h| {
                HeaderName::try_from(h)
                    .map_err(|_| ConfigError::invalid("gateway.session_header", h, "not a valid HTTP header name"))
            })
            .transpose()
    }

    /// `tokenizers`: models of the catalog, each folder loaded (a bad one stops start-up).
    fn load_tokenizers(&self, models: &[&str]) -> Result<BTreeMap<String, LoadedTokenizer>, ConfigError> {
        let mut out = BTreeMap::new();
        let cache = self.tokenizer_cache_bytes()?;
        for (name, dir) in &self.tokenizers {
            let field = format!("gateway.tokenizers.{name}");
            if !models.contains(&name.as_str()) {
                return Err(ConfigError::invalid(field, name, "no model of this name in the catalog"));
            }
            let tok = crate::tokenize::ChatTokenizer::load(dir).map_err(|e| {
                ConfigError::invalid(
                    &field,
                    dir.display(),
                    format!("not a usable tokenizer folder: {}", crate::error_chain(&e)),
                )
            })?;
            let tok = tok.with_segment_cache(cache);
            out.insert(name.clone(), LoadedTokenizer { path: dir.clone(), tokenizer: std::sync::Arc::new(tok) });
        }
        Ok(out)
    }

    /// `tokenizer_cache_mb` in bytes (`None`: 0, no cache).
    fn tokenizer_cache_bytes(&self) -> Result<Option<std::num::NonZeroUsize>, ConfigError> {
        if self.tokenizer_cache_mb > MAX_TOKENIZER_CACHE_MB {
            return Err(ConfigError::invalid(
                "gateway.tokenizer_cache_mb",
                self.tokenizer_cache_mb,
                format!("at most {MAX_TOKENIZER_CACHE_MB} (MiB per tokenizer)"),
            ));
        }
        Ok(std::num::NonZeroUsize::new((self.tokenizer_cache_mb as usize) << 20))
    }

    /// `kv_bytes_per_token` and `kv_block_tokens`: models of the catalog, values in range.
    fn check_kv(&self, models: &[&str]) -> Result<(), ConfigError> {
        for (name, &bytes) in &self.kv_bytes_per_token {
            let field = format!("gateway.kv_bytes_per_token.{name}");
            if !models.contains(&name.as_str()) {
                return Err(ConfigError::invalid(field, name, "no model of this name in the catalog"));
            }
            if bytes == 0 {
                return Err(ConfigError::invalid(field, 0, "must be above zero (omit the model for no estimate)"));
            }
        }
        for (name, &tokens) in &self.kv_block_tokens {
            let field = format!("gateway.kv_block_tokens.{name}");
            if !models.contains(&name.as_str()) {
                return Err(ConfigError::invalid(field, name, "no model of this name in the catalog"));
            }
            if !(1..=MAX_KV_BLOCK_TOKENS).contains(&tokens) {
                return Err(ConfigError::invalid(field, tokens, format!("must be 1 to {MAX_KV_BLOCK_TOKENS}")));
            }
        }
        Ok(())
    }

    /// `admission_retry_after`: whole seconds above zero.
    fn admission_retry(&self) -> Result<Duration, ConfigError> {
        let retry = positive("gateway.admission_retry_after", &self.admission_retry_after)?;
        if retry.subsec_nanos() != 0 {
            return Err(ConfigError::invalid(
                "gateway.admission_retry_after",
                &self.admission_retry_after,
                "must be whole seconds (Retry-After counts seconds)",
            ));
        }
        Ok(retry)
    }

    fn upstream_reuse(&self) -> Result<UpstreamReuse, ConfigError> {
        match self.upstream_reuse.as_str() {
            "conversation" => Ok(UpstreamReuse::Conversation),
            "never" => Ok(UpstreamReuse::Never),
            other => {
                Err(ConfigError::invalid("gateway.upstream_reuse", other, "expected \"conversation\" or \"never\""))
            }
        }
    }

    /// `upstream_idle_mark_after`: below `max_age` when set; else the default of the admission.
    fn idle_mark_after(&self, max_age: Duration, admission: &ValidAdmission) -> Result<Duration, ConfigError> {
        match &self.upstream_idle_mark_after {
            Some(text) => {
                let d = parse_duration("gateway.upstream_idle_mark_after", text)?;
                if d >= max_age {
                    return Err(ConfigError::invalid(
                        "gateway.upstream_idle_mark_after",
                        text,
                        "must be below gateway.upstream_max_age (a connection that old is closed, not kept)",
                    ));
                }
                Ok(d)
            }
            None if *admission == ValidAdmission::Off => Ok(DEFAULT_IDLE_MARK_AFTER.min(max_age / 2)),
            None => Ok(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests;
