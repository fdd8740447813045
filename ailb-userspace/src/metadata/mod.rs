//! The metadata contract (`docs/metadata.md`), its one home: the string keys an instance
//! carries in Nacos, how the agent formats its values ([`format_number`], [`format_gb`]), how
//! the gateway parses them ([`Metadata::parse`]) and how the static source declares them
//! typed ([`InstanceMetadata::declared`]).
//!
//! Parsing is robust: nothing here panics, whatever the strings. Every field is
//! [`Field::Absent`], [`Field::Valid`] or [`Field::Invalid`] with the raw value and the reason,
//! and the policy decides per field whether an invalid value excludes or is ignored.

use std::{
    collections::BTreeMap,
    hash::{Hash, Hasher},
    ops::Index,
};

use serde::Serialize;

use crate::kv_events::{feed, EventSource};

pub mod publish;
pub mod signals;
pub mod values;

use signals::Signal;

/// The contract's keys: the agent writes them, the policy reads them (all but
/// [`keys::MEMORY_SOURCE`], which is only shown). Any other key is ignored.
pub mod keys {
    pub const MODEL_ID: &str = "model_id";
    pub const SUPPORTED_MODELS: &str = "supported_models";
    pub const MODEL_VERSION: &str = "model_version";
    pub const SUPPORTED_TASKS: &str = "supported_tasks";
    pub const GPU_TYPE: &str = "gpu_type";
    pub const REMAINING_MEMORY: &str = "remaining_memory";
    pub const REMAINING_MEMORY_MB: &str = "remaining_memory_mb";
    pub const GPU_MEMORY_TOTAL_MB: &str = "gpu_memory_total_mb";
    pub const GPU_UTIL: &str = "gpu_util";
    pub const CURRENT_REQUESTS: &str = "current_requests";
    pub const QUEUE_LENGTH: &str = "queue_length";
    pub const HEALTH_STATUS: &str = "health_status";
    pub const MAX_INFLIGHT: &str = "max_inflight";
    pub const KV_CACHE_USAGE: &str = "kv_cache_usage";
    pub const PREFIX_CACHE_HIT_RATE: &str = "prefix_cache_hit_rate";
    pub const KV_CACHE_CAPACITY_TOKENS: &str = "kv_cache_capacity_tokens";
    pub const PROMPT_TOKENS_PER_S: &str = "prompt_tokens_per_s";
    pub const AGENT_VERSION: &str = "agent_version";
    pub const UPDATED_AT_MS: &str = "updated_at_ms";
    /// Where `remaining_memory_mb` came from (`nvml`, `kv_cache`, `metrics`); informational.
    pub const MEMORY_SOURCE: &str = "memory_source";
    /// The engine's KV-event publisher (`tcp://HOST:PORT`), for the precise prefix feed.
    pub const KV_EVENTS_ENDPOINT: &str = "kv_events_endpoint";
    /// Its replay socket (`tcp://HOST:PORT`); optional.
    pub const KV_EVENTS_REPLAY: &str = "kv_events_replay";
    /// Its KV-cache block size in tokens; required with the endpoint.
    pub const KV_BLOCK_SIZE: &str = "kv_block_size";

    /// Every key of the contract, in the order above.
    pub const ALL: [&str; 23] = [
        MODEL_ID,
        SUPPORTED_MODELS,
        MODEL_VERSION,
        SUPPORTED_TASKS,
        GPU_TYPE,
        REMAINING_MEMORY,
        REMAINING_MEMORY_MB,
        GPU_MEMORY_TOTAL_MB,
        GPU_UTIL,
        CURRENT_REQUESTS,
        QUEUE_LENGTH,
        HEALTH_STATUS,
        MAX_INFLIGHT,
        KV_CACHE_USAGE,
        PREFIX_CACHE_HIT_RATE,
        KV_CACHE_CAPACITY_TOKENS,
        PROMPT_TOKENS_PER_S,
        AGENT_VERSION,
        UPDATED_AT_MS,
        MEMORY_SOURCE,
        KV_EVENTS_ENDPOINT,
        KV_EVENTS_REPLAY,
        KV_BLOCK_SIZE,
    ];
}

/// MiB per GB: GPU memory is sold and reported in binary units (an "80GB" A100 shows
/// 81920 MiB in NVML and nvidia-smi), and the kernel's `free_mem_mb` is MiB.
pub const MB_PER_GB: f64 = 1024.0;
/// Largest believable free or total memory: 10 TiB in MiB. The largest GPUs hold under
/// 300 GB and a whole 8-GPU node under 3 TB; anything above is a unit mistake or garbage.
pub const MAX_MEMORY_MB: f64 = 10.0 * 1024.0 * 1024.0;
pub use crate::telemetry::instance::MAX_REQUESTS;
/// Longest string kept in explanations (values from Nacos can be anything, of any size).
pub const MAX_SHOWN_CHARS: usize = 64;
/// The ranges, as invalid values are told.
const MEMORY_RANGE: &str = "0 to 10 TiB";
const REQUESTS_RANGE: &str = "0 to 1,000,000";

/// One parsed metadata field.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<T> {
    /// The key is not there.
    Absent,
    Valid(T),
    /// The raw value (shortened to [`MAX_SHOWN_CHARS`]) and why it was refused.
    Invalid {
        raw: String,
        reason: String,
    },
}

impl<T> Field<T> {
    pub fn valid(&self) -> Option<&T> {
        match self {
            Field::Valid(v) => Some(v),
            _ => None,
        }
    }
}

/// An invalid metadata value, as shown by `ailb explain` and counted by the daemon
/// (`key` is one of [`keys`], so it is safe as a metric label).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidField {
    pub key: &'static str,
    pub value: String,
    pub reason: String,
    /// What the policy did about it: `"excluded"` or `"ignored"`.
    pub effect: &'static str,
}

/// `health_status` as the agent reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Healthy,
    /// Finishing its requests, taking no new ones.
    Draining,
    /// Anything else the agent says (unhealthy, starting, loading, down, ...).
    NotHealthy,
}

/// Every contract key of one instance, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    pub model_id: Field<String>,
    pub supported_models: Field<Vec<String>>,
    pub model_version: Field<String>,
    pub supported_tasks: Field<Vec<String>>,
    pub gpu_type: Field<String>,
    /// From `remaining_memory_mb` when present (valid or not), else from `remaining_memory` (GB).
    pub free_memory_mb: Field<u32>,
    /// Which key `free_memory_mb` came from.
    pub free_memory_key: &'static str,
    pub gpu_memory_total_mb: Field<u32>,
    /// The dynamic signals ([`signals::ALL`]), by [`Signal::id`]; read with [`Self::signal`].
    pub signals: [Field<f64>; signals::COUNT],
    pub health_status: Field<HealthStatus>,
    pub max_inflight: Field<u32>,
    pub agent_version: Field<String>,
    pub updated_at_ms: Field<u64>,
    /// Where the engine publishes its KV events (`kv_events_endpoint`, `kv_events_replay`,
    /// `kv_block_size` together); absent without `kv_events_endpoint`.
    pub kv_events: Field<EventSource>,
}

/// A value for display: at most [`MAX_SHOWN_CHARS`] characters, control characters escaped
/// by the `{:?}` that shows it.
pub fn shorten(raw: &str) -> String {
    let mut s: String = raw.chars().take(MAX_SHOWN_CHARS).collect();
    if raw.chars().nth(MAX_SHOWN_CHARS).is_some() {
        s.push('…');
    }
    s
}

fn invalid<T>(raw: &str, reason: impl Into<String>) -> Field<T> {
    Field::Invalid { raw: shorten(raw), reason: reason.into() }
}

/// A number: trimmed, an optional unit suffix from `units` (case-insensitive, spaces
/// allowed before it), then a finite decimal (`"12"`, `"12.5"`, `"1e3"`). NaN, infinities,
/// other suffixes and everything else are refused.
pub fn parse_number(raw: &str, units: &[&str]) -> Result<f64, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("is empty".to_string());
    }
    let mut num = s;
    for unit in units {
        let n = unit.len();
        if s.len() > n && s.is_char_boundary(s.len() - n) && s[s.len() - n..].eq_ignore_ascii_case(unit) {
            num = s[..s.len() - n].trim_end();
            break;
        }
    }
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("is not a finite number".to_string()),
        Err(_) if units.is_empty() => Err("is not a number".to_string()),
        Err(_) => Err(format!("is not a number (optional unit: {})", units.join(", "))),
    }
}

fn number(raw: &str, units: &[&str], lo: f64, hi: f64, what: &str) -> Field<f64> {
    match parse_number(raw, units) {
        Ok(v) if (lo..=hi).contains(&v) => Field::Valid(v),
        Ok(_) => invalid(raw, format!("is out of range: {what}")),
        Err(e) => invalid(raw, e),
    }
}

fn memory_mb(raw: &str, per_unit: f64, units: &[&str]) -> Field<u32> {
    match number(raw, units, 0.0, MAX_MEMORY_MB / per_unit, MEMORY_RANGE) {
        // Floor: a fractional MiB must not make a request look like it fits.
        Field::Valid(v) => Field::Valid((v * per_unit).floor() as u32),
        Field::Invalid { raw, reason } => Field::Invalid { raw, reason },
        Field::Absent => Field::Absent,
    }
}

fn integer(raw: &str, hi: f64, what: &str) -> Field<f64> {
    match number(raw, &[], 0.0, hi, what) {
        Field::Valid(v) if v.fract() != 0.0 => invalid(raw, "is not a whole number"),
        other => other,
    }
}

fn text(raw: &str) -> Field<String> {
    let s = raw.trim();
    if s.is_empty() {
        invalid(raw, "is empty")
    } else if s.chars().any(char::is_control) {
        invalid(raw, "contains control characters")
    } else {
        Field::Valid(s.to_string())
    }
}

fn list(raw: &str) -> Field<Vec<String>> {
    match text(raw) {
        Field::Valid(s) => {
            let items: Vec<String> =
                s.split(',').map(str::trim).filter(|i| !i.is_empty()).map(str::to_string).collect();
            if items.is_empty() {
                invalid(raw, "lists nothing")
            } else {
                Field::Valid(items)
            }
        }
        Field::Invalid { raw, reason } => Field::Invalid { raw, reason },
        Field::Absent => Field::Absent,
    }
}

/// The three KV-event keys as one value: invalid when any of them is (the reason names the
/// key), or when the endpoint comes without the block size.
fn kv_events(endpoint: Option<&str>, replay: Option<&str>, block_size: Option<&str>) -> Field<EventSource> {
    let Some(raw) = endpoint else { return Field::Absent };
    let endpoint = raw.trim();
    if let Err(reason) = feed::check_endpoint(endpoint) {
        return invalid(raw, format!("{}: {reason}", keys::KV_EVENTS_ENDPOINT));
    }
    let replay = match replay.map(str::trim) {
        None => None,
        Some(r) => match feed::check_endpoint(r) {
            Ok(()) => Some(r.to_string()),
            Err(reason) => return invalid(r, format!("{}: {reason}", keys::KV_EVENTS_REPLAY)),
        },
    };
    let Some(size) = block_size else {
        return invalid(
            raw,
            format!(
                "{} is required with {} (the engine's --block-size)",
                keys::KV_BLOCK_SIZE,
                keys::KV_EVENTS_ENDPOINT
            ),
        );
    };
    let block_size = match integer(size, f64::from(feed::MAX_BLOCK_SIZE), "1 to 65536") {
        Field::Valid(v) => match feed::check_block_size(v as u64) {
            Ok(b) => b,
            Err(reason) => return invalid(size, format!("{}: {reason}", keys::KV_BLOCK_SIZE)),
        },
        Field::Invalid { raw, reason } => {
            return Field::Invalid { raw, reason: format!("{}: {reason}", keys::KV_BLOCK_SIZE) }
        }
        Field::Absent => return Field::Absent,
    };
    Field::Valid(EventSource { endpoint: endpoint.to_string(), replay, block_size })
}

fn health(raw: &str) -> Field<HealthStatus> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "" => invalid(raw, "is empty"),
        "healthy" | "ok" | "up" | "ready" | "serving" => Field::Valid(HealthStatus::Healthy),
        "draining" => Field::Valid(HealthStatus::Draining),
        _ => Field::Valid(HealthStatus::NotHealthy),
    }
}

impl Metadata {
    pub fn parse(map: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| map.get(k).map(String::as_str);
        fn field<T>(v: Option<&str>, f: impl Fn(&str) -> Field<T>) -> Field<T> {
            v.map_or(Field::Absent, f)
        }
        let (free_memory_mb, free_memory_key) = match (get(keys::REMAINING_MEMORY_MB), get(keys::REMAINING_MEMORY)) {
            (Some(mb), _) => (memory_mb(mb, 1.0, &["mib", "mb"]), keys::REMAINING_MEMORY_MB),
            (None, Some(gb)) => (memory_mb(gb, MB_PER_GB, &["gib", "gb"]), keys::REMAINING_MEMORY),
            (None, None) => (Field::Absent, keys::REMAINING_MEMORY_MB),
        };
        let as_u32 = |f: Field<f64>| match f {
            Field::Valid(v) => Field::Valid(v as u32),
            Field::Invalid { raw, reason } => Field::Invalid { raw, reason },
            Field::Absent => Field::Absent,
        };
        Metadata {
            model_id: field(get(keys::MODEL_ID), text),
            supported_models: field(get(keys::SUPPORTED_MODELS), list),
            model_version: field(get(keys::MODEL_VERSION), text),
            supported_tasks: field(get(keys::SUPPORTED_TASKS), list),
            gpu_type: field(get(keys::GPU_TYPE), text),
            free_memory_mb,
            free_memory_key,
            gpu_memory_total_mb: field(get(keys::GPU_MEMORY_TOTAL_MB), |r| memory_mb(r, 1.0, &["mib", "mb"])),
            signals: signals::ALL
                .map(|s| field(get(s.key), |r| number(r, s.range.units, s.range.lo, s.range.hi, s.range.text))),
            health_status: field(get(keys::HEALTH_STATUS), health),
            max_inflight: as_u32(field(get(keys::MAX_INFLIGHT), |r| integer(r, MAX_REQUESTS, REQUESTS_RANGE))),
            agent_version: field(get(keys::AGENT_VERSION), text),
            updated_at_ms: match field(get(keys::UPDATED_AT_MS), |r| integer(r, 2f64.powi(53), "0 to 2^53")) {
                Field::Valid(v) => Field::Valid(v as u64),
                Field::Invalid { raw, reason } => Field::Invalid { raw, reason },
                Field::Absent => Field::Absent,
            },
            kv_events: kv_events(get(keys::KV_EVENTS_ENDPOINT), get(keys::KV_EVENTS_REPLAY), get(keys::KV_BLOCK_SIZE)),
        }
    }
}

impl Metadata {
    /// The parsed value of a dynamic signal.
    pub fn signal(&self, s: &Signal) -> &Field<f64> {
        &self.signals[s.id]
    }
}

impl Default for Metadata {
    /// Every key absent.
    fn default() -> Self {
        Self::parse(&BTreeMap::new())
    }
}

/// A typed value checked against the same range as its string form.
fn in_range(v: u32, hi: f64, what: &str) -> Field<u32> {
    if f64::from(v) <= hi {
        Field::Valid(v)
    } else {
        invalid(&v.to_string(), format!("is out of range: {what}"))
    }
}

/// A number as the agent writes it: whole numbers without a fraction, else up to 3 decimals.
pub fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// MiB as `remaining_memory`'s GB (= 1024 MiB), rounded *down* to 0.1, so that the GB key
/// never claims more free memory than `remaining_memory_mb`.
pub fn format_gb(mb: u64) -> String {
    let tenths = mb * 10 / 1024;
    format!("{}.{}", tenths / 10, tenths % 10)
}

/// What a static backend (`[[backends]]`) declares, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared<'a> {
    pub model_id: &'a str,
    pub gpu_type: Option<&'a str>,
    pub free_memory_mb: Option<u32>,
    /// `None`: no cap.
    pub max_inflight: Option<u32>,
}

/// An instance's metadata: the string map as its source reported it (what explanations show
/// and the utilisation report hash covers) and the contract's keys, typed. Compared, ordered
/// and hashed by the map alone: the typed keys follow from it (a registry's are parsed from
/// it; a static backend's map only shows its declared values).
#[derive(Debug, Clone, Default)]
pub struct InstanceMetadata {
    raw: BTreeMap<String, String>,
    contract: Metadata,
}

impl InstanceMetadata {
    /// A registry's string map, parsed.
    pub fn parse(raw: BTreeMap<String, String>) -> Self {
        let contract = Metadata::parse(&raw);
        Self { raw, contract }
    }

    /// A static backend's declared values, checked as the contract checks them (text non-empty
    /// and printable, numbers in range) without a round trip through strings.
    pub fn declared(d: Declared<'_>) -> Self {
        let mut raw = BTreeMap::new();
        let mut contract = Metadata { model_id: text(d.model_id), ..Metadata::default() };
        raw.insert(keys::MODEL_ID.to_string(), d.model_id.to_string());
        if let Some(g) = d.gpu_type {
            contract.gpu_type = text(g);
            raw.insert(keys::GPU_TYPE.to_string(), g.to_string());
        }
        if let Some(m) = d.free_memory_mb {
            contract.free_memory_mb = in_range(m, MAX_MEMORY_MB, MEMORY_RANGE);
            raw.insert(keys::REMAINING_MEMORY_MB.to_string(), m.to_string());
        }
        if let Some(c) = d.max_inflight {
            contract.max_inflight = in_range(c, MAX_REQUESTS, REQUESTS_RANGE);
            raw.insert(keys::MAX_INFLIGHT.to_string(), c.to_string());
        }
        Self { raw, contract }
    }

    /// The same with the engine's KV-event publisher declared (a static backend's
    /// `kv_events`, checked by the config's validation).
    pub fn with_kv_events(mut self, source: &EventSource) -> Self {
        self.raw.insert(keys::KV_EVENTS_ENDPOINT.to_string(), source.endpoint.clone());
        if let Some(r) = &source.replay {
            self.raw.insert(keys::KV_EVENTS_REPLAY.to_string(), r.clone());
        }
        self.raw.insert(keys::KV_BLOCK_SIZE.to_string(), source.block_size.to_string());
        self.contract.kv_events = Field::Valid(source.clone());
        self
    }

    /// The contract's keys, typed.
    pub fn contract(&self) -> &Metadata {
        &self.contract
    }

    /// Every key as reported, the contract's and any other.
    pub fn raw(&self) -> &BTreeMap<String, String> {
        &self.raw
    }

    pub fn get(&self, key: &str) -> Option<&String> {
        self.raw.get(key)
    }
}

impl From<BTreeMap<String, String>> for InstanceMetadata {
    fn from(raw: BTreeMap<String, String>) -> Self {
        Self::parse(raw)
    }
}

impl FromIterator<(String, String)> for InstanceMetadata {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self::parse(iter.into_iter().collect())
    }
}

impl Index<&str> for InstanceMetadata {
    type Output = String;
    fn index(&self, key: &str) -> &String {
        &self.raw[key]
    }
}

impl PartialEq for InstanceMetadata {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for InstanceMetadata {}

impl PartialOrd for InstanceMetadata {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InstanceMetadata {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.raw.cmp(&other.raw)
    }
}

impl Hash for InstanceMetadata {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

#[cfg(test)]
mod tests;
