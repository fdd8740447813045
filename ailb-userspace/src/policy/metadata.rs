//! The metadata contract (`docs/metadata.md`): the string keys an instance carries in Nacos,
//! parsed robustly. Nothing here panics, whatever the strings: every field is
//! [`Field::Absent`], [`Field::Valid`] or [`Field::Invalid`] with the raw value and the reason,
//! and the policy decides per field whether an invalid value excludes or is ignored.

use std::collections::BTreeMap;

use serde::Serialize;

/// The metadata keys ailb reads. Any other key is ignored.
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
    pub const AGENT_VERSION: &str = "agent_version";
    pub const UPDATED_AT_MS: &str = "updated_at_ms";
}

/// MiB per GB: GPU memory is sold and reported in binary units (an "80GB" A100 shows
/// 81920 MiB in NVML and nvidia-smi), and the kernel's `free_mem_mb` is MiB.
pub const MB_PER_GB: f64 = 1024.0;
/// Largest believable free or total memory: 10 TiB in MiB. The largest GPUs hold under
/// 300 GB and a whole 8-GPU node under 3 TB; anything above is a unit mistake or garbage.
pub const MAX_MEMORY_MB: f64 = 10.0 * 1024.0 * 1024.0;
/// Largest believable request count, queue length or cap: no model server runs or queues a
/// million requests (vLLM's `max_num_seqs` defaults to 256).
pub const MAX_REQUESTS: f64 = 1e6;
/// Longest string kept in explanations (values from Nacos can be anything, of any size).
pub const MAX_SHOWN_CHARS: usize = 64;

/// One parsed metadata field.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<T> {
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
    pub gpu_util: Field<f64>,
    pub current_requests: Field<f64>,
    pub queue_length: Field<f64>,
    pub health_status: Field<HealthStatus>,
    pub max_inflight: Field<u32>,
    pub kv_cache_usage: Field<f64>,
    pub agent_version: Field<String>,
    pub updated_at_ms: Field<u64>,
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
    match number(raw, units, 0.0, MAX_MEMORY_MB / per_unit, "0 to 10 TiB") {
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
            gpu_util: field(get(keys::GPU_UTIL), |r| number(r, &["%"], 0.0, 100.0, "a percentage, 0 to 100")),
            current_requests: field(get(keys::CURRENT_REQUESTS), |r| {
                number(r, &[], 0.0, MAX_REQUESTS, "0 to 1,000,000")
            }),
            queue_length: field(get(keys::QUEUE_LENGTH), |r| number(r, &[], 0.0, MAX_REQUESTS, "0 to 1,000,000")),
            health_status: field(get(keys::HEALTH_STATUS), health),
            max_inflight: as_u32(field(get(keys::MAX_INFLIGHT), |r| integer(r, MAX_REQUESTS, "0 to 1,000,000"))),
            kv_cache_usage: field(get(keys::KV_CACHE_USAGE), |r| number(r, &[], 0.0, 1.0, "a fraction, 0 to 1")),
            agent_version: field(get(keys::AGENT_VERSION), text),
            updated_at_ms: match field(get(keys::UPDATED_AT_MS), |r| integer(r, 2f64.powi(53), "0 to 2^53")) {
                Field::Valid(v) => Field::Valid(v as u64),
                Field::Invalid { raw, reason } => Field::Invalid { raw, reason },
                Field::Absent => Field::Absent,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> Metadata {
        Metadata::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn numbers_accept_spaces_units_and_exponents() {
        let cases: &[(&str, &[&str], Option<f64>)] = &[
            ("12", &[], Some(12.0)),
            (" 12.5 ", &[], Some(12.5)),
            ("1e3", &[], Some(1000.0)),
            ("12GB", &["gib", "gb"], Some(12.0)),
            ("12 gib", &["gib", "gb"], Some(12.0)),
            ("85%", &["%"], Some(85.0)),
            ("12MB", &["gib", "gb"], None),
            ("GB", &["gib", "gb"], None),
            ("NaN", &[], None),
            ("inf", &[], None),
            ("-inf", &[], None),
            ("", &[], None),
            ("1,000", &[], None),
            ("１２", &[], None),
            ("12é", &["gb"], None),
        ];
        for (raw, units, want) in cases {
            assert_eq!(parse_number(raw, units).ok(), *want, "{raw:?} with units {units:?}");
        }
    }

    #[test]
    fn memory_prefers_mb_and_converts_gb_in_binary_units() {
        let m = meta(&[("remaining_memory", "12"), ("remaining_memory_mb", "100")]);
        assert_eq!((m.free_memory_mb, m.free_memory_key), (Field::Valid(100), keys::REMAINING_MEMORY_MB));
        let m = meta(&[("remaining_memory", "8.5GB")]);
        assert_eq!((m.free_memory_mb, m.free_memory_key), (Field::Valid(8704), keys::REMAINING_MEMORY));
        // An invalid `_mb` is not silently replaced by the GB key.
        let m = meta(&[("remaining_memory", "12"), ("remaining_memory_mb", "lots")]);
        assert!(matches!(m.free_memory_mb, Field::Invalid { .. }));
        for bad in ["-1", "nan", "11 TiB", "20000000", "1e400"] {
            let m = meta(&[("remaining_memory_mb", bad)]);
            assert!(matches!(m.free_memory_mb, Field::Invalid { .. }), "{bad:?}");
        }
    }

    #[test]
    fn ranges_and_whole_numbers() {
        let m = meta(&[
            ("gpu_util", "100.5"),
            ("current_requests", "2.5"),
            ("queue_length", "-1"),
            ("max_inflight", "8.5"),
            ("kv_cache_usage", "0.9"),
            ("updated_at_ms", "1700000000000"),
        ]);
        assert!(matches!(m.gpu_util, Field::Invalid { .. }));
        assert_eq!(m.current_requests, Field::Valid(2.5), "averaged counts are fine");
        assert!(matches!(m.queue_length, Field::Invalid { .. }));
        assert!(matches!(m.max_inflight, Field::Invalid { .. }));
        assert_eq!(m.kv_cache_usage, Field::Valid(0.9));
        assert_eq!(m.updated_at_ms, Field::Valid(1_700_000_000_000));
    }

    #[test]
    fn text_lists_and_health() {
        let m = meta(&[
            ("model_id", "  qwen-7b "),
            ("supported_models", "a, b,,c "),
            ("model_version", "\u{7}"),
            ("health_status", " Healthy"),
        ]);
        assert_eq!(m.model_id, Field::Valid("qwen-7b".to_string()));
        assert_eq!(m.supported_models, Field::Valid(vec!["a".into(), "b".into(), "c".into()]));
        assert!(matches!(m.model_version, Field::Invalid { .. }));
        assert_eq!(m.health_status, Field::Valid(HealthStatus::Healthy));
        for (raw, want) in [("DRAINING", HealthStatus::Draining), ("degraded", HealthStatus::NotHealthy)] {
            assert_eq!(meta(&[("health_status", raw)]).health_status, Field::Valid(want));
        }
        assert!(matches!(meta(&[("supported_models", " , ,")]).supported_models, Field::Invalid { .. }));
    }

    #[test]
    fn long_values_are_shortened_on_a_char_boundary() {
        let raw = "é".repeat(1000);
        match meta(&[("gpu_util", &raw)]).gpu_util {
            Field::Invalid { raw, .. } => assert_eq!(raw.chars().count(), MAX_SHOWN_CHARS + 1),
            other => panic!("{other:?}"),
        }
    }
}
