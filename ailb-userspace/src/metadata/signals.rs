//! The dynamic signals a node reports, each described once: its metadata key, its range and
//! units, how the node sampler's [`Values`] carry it, the move worth a new publish, and what
//! the policy does with it. The publisher ([`super::publish`]), the change detector
//! ([`super::values::moved`]), the parser ([`super::Metadata::parse`]) and the policy's
//! explanation all walk [`ALL`]; none of them names a signal of its own.
//!
//! Adding a signal is one entry here (and in [`ALL`]), the reading that fills its field of
//! [`Values`] (the model server's metric in `telemetry::model_server`), and, if it should
//! change weights, a scorer in `policy::evaluate` that reads it with
//! [`super::Metadata::signal`]. Memory is not a signal here: it has two keys (`remaining_memory_mb`
//! and the older `remaining_memory` in GB), a source (`memory_source`) and a unit conversion, and
//! the kernel fit reads it; its parser and publisher are in [`super`] and [`super::publish`].

use super::{keys, values::Values, MAX_REQUESTS};
use crate::metadata::values::Thresholds;

/// What the policy does with a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A factor of the backend's weight, computed by the scorer named here.
    Scores(&'static str),
    /// Shown by `ailb explain` (and counted when invalid); no effect on weights.
    Shown,
    /// Sets the model's prefix lifetime with the others of this role
    /// (`policy::prefix::fill_time_lifetime`); shown, no effect on weights.
    PrefixLifetime,
}

impl Role {
    /// Shown in `ailb explain`'s information line rather than as a factor.
    pub fn shown(self) -> bool {
        !matches!(self, Role::Scores(_))
    }
}

/// The values a signal may take, as the parser checks them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    pub lo: f64,
    pub hi: f64,
    /// Unit suffixes accepted after the number (case-insensitive).
    pub units: &'static [&'static str],
    /// The range as an invalid value's reason tells it.
    pub text: &'static str,
}

/// One dynamic signal of the metadata contract.
#[derive(Debug, Clone, Copy)]
pub struct Signal {
    /// Its position in [`ALL`] (and in [`super::Metadata`]'s parsed signals).
    pub id: usize,
    pub key: &'static str,
    /// What it measures, one line (docs and explanations).
    pub meaning: &'static str,
    pub range: Range,
    /// The value the node sampler derived, or `None` when the server did not report it.
    pub read: fn(&Values) -> Option<f64>,
    /// The smallest move since the last publish that is worth a new one, given the value last
    /// published.
    pub threshold: fn(&Thresholds, f64) -> f64,
    pub role: Role,
}

const REQUESTS: Range = Range { lo: 0.0, hi: MAX_REQUESTS, units: &[], text: "0 to 1,000,000" };
const FRACTION: Range = Range { lo: 0.0, hi: 1.0, units: &[], text: "a fraction, 0 to 1" };

pub const GPU_UTIL: Signal = Signal {
    id: 0,
    key: keys::GPU_UTIL,
    meaning: "GPU utilisation, percent (NVML or a mapped gauge), averaged over the instance's GPUs",
    range: Range { lo: 0.0, hi: 100.0, units: &["%"], text: "a percentage, 0 to 100" },
    read: |v| v.util_pct,
    threshold: |t, _| t.util_pct,
    role: Role::Scores("utilisation"),
};

pub const CURRENT_REQUESTS: Signal = Signal {
    id: 1,
    key: keys::CURRENT_REQUESTS,
    meaning: "requests the server is running (vLLM vllm:num_requests_running)",
    range: REQUESTS,
    read: |v| v.running,
    threshold: |t, _| t.requests,
    role: Role::Scores("load"),
};

pub const QUEUE_LENGTH: Signal = Signal {
    id: 2,
    key: keys::QUEUE_LENGTH,
    meaning: "requests waiting in the server's queue (vLLM vllm:num_requests_waiting)",
    range: REQUESTS,
    read: |v| v.waiting,
    threshold: |t, _| t.requests,
    role: Role::Scores("load"),
};

pub const KV_CACHE_USAGE: Signal = Signal {
    id: 3,
    key: keys::KV_CACHE_USAGE,
    meaning: "share of the KV cache in use (vLLM vllm:kv_cache_usage_perc)",
    range: FRACTION,
    read: |v| v.kv_cache,
    threshold: |t, _| t.kv_cache,
    role: Role::Shown,
};

pub const PREFIX_CACHE_HIT_RATE: Signal = Signal {
    id: 4,
    key: keys::PREFIX_CACHE_HIT_RATE,
    meaning: "share of prompt tokens served from the server's prefix cache since the last sample \
              (vLLM vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total)",
    range: FRACTION,
    read: |v| v.prefix_cache_hit_rate,
    threshold: |t, _| t.kv_cache,
    role: Role::Shown,
};

/// The largest KV cache or prompt rate accepted, in tokens (or tokens per second): a thousand
/// times the largest GPU node's cache.
const TOKENS: Range = Range { lo: 0.0, hi: 1e12, units: &[], text: "0 to 10^12" };

pub const KV_CACHE_CAPACITY_TOKENS: Signal = Signal {
    id: 5,
    key: keys::KV_CACHE_CAPACITY_TOKENS,
    meaning: "the KV cache's capacity in tokens (vLLM vllm:cache_config_info num_gpu_blocks x block_size, \
              SGLang sglang:max_total_num_tokens)",
    range: TOKENS,
    read: |v| v.kv_capacity_tokens,
    threshold: |t, last| (t.prompt_rate * last).max(1.0),
    role: Role::PrefixLifetime,
};

pub const PROMPT_TOKENS_PER_S: Signal = Signal {
    id: 6,
    key: keys::PROMPT_TOKENS_PER_S,
    meaning: "prompt tokens per second the server was sent, smoothed over the agent's prompt_rate_window \
              (the growth of vLLM vllm:prefix_cache_queries_total)",
    range: TOKENS,
    read: |v| v.prompt_tokens_per_s,
    threshold: |t, last| (t.prompt_rate * last).max(1.0),
    role: Role::PrefixLifetime,
};

/// Every signal, in [`Signal::id`] order.
pub const ALL: [&Signal; 7] = [
    &GPU_UTIL,
    &CURRENT_REQUESTS,
    &QUEUE_LENGTH,
    &KV_CACHE_USAGE,
    &PREFIX_CACHE_HIT_RATE,
    &KV_CACHE_CAPACITY_TOKENS,
    &PROMPT_TOKENS_PER_S,
];

/// How many signals there are.
pub const COUNT: usize = ALL.len();

#[cfg(test)]
mod tests;
