//! `[instances.metrics]`, `server`, `nvml` and `kv_bytes_per_token` -> the names one
//! instance's scrape reads ([`MetricNames`]), every mapping checked.

use super::{InstanceConfig, MetricsConfig, ServerKind};
use crate::{
    telemetry::model_server::{self, GpuMetrics, KvCapacity, MemoryUnit, MetricNames, UtilUnit},
    validate::ConfigError,
};

/// The largest `kv_bytes_per_token`: 64 MiB, far above any model (Llama 3.1 405B in bf16 takes
/// 126 layers x 8 KV heads x 128 x 2 x 2 bytes = 504 KiB).
pub const MAX_KV_BYTES_PER_TOKEN: u64 = 64 << 20;

/// Names a field of the instance (`instances[i].<name>`).
type FieldName<'a> = &'a dyn Fn(&str) -> String;

fn metric_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && s.len() <= 200
}

fn label_name_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The names an instance's scrape reads, from its `server`, `[instances.metrics]`, `nvml` and
/// `kv_bytes_per_token`; `f` names a field (`instances[i].<name>`).
pub(super) fn metric_names(c: &InstanceConfig, f: FieldName) -> Result<MetricNames, ConfigError> {
    let empty = MetricsConfig::default();
    let m = c.metrics.as_ref().unwrap_or(&empty);
    check_names(m, f)?;
    let mut out = server_names(c.server, m, f)?;
    let memory = m.memory_free.is_some() || m.memory_total.is_some() || m.memory_used.is_some();
    if c.nvml {
        check_nothing_nvml_gives(c, m, f)?;
    }
    if let Some(b) = c.kv_bytes_per_token {
        out.kv_capacity = kv_capacity(c.server, b, memory, f)?;
    }
    let memory_unit = memory_unit(m, memory, f)?;
    let util_unit = util_unit(m, f)?;
    check_gpu_labels(m, memory_unit.is_some() || util_unit.is_some(), f)?;
    if memory_unit.is_some() || util_unit.is_some() {
        out.gpu = Some(GpuMetrics {
            memory_free: m.memory_free.clone(),
            memory_total: m.memory_total.clone(),
            memory_used: m.memory_used.clone(),
            memory_unit: memory_unit.unwrap_or(MemoryUnit::MiB),
            util: m.gpu_util.clone(),
            util_unit: util_unit.unwrap_or(UtilUnit::Percent),
            labels: m.gpu_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        });
    }
    Ok(out)
}

/// Every name in `[instances.metrics]` is a Prometheus metric name.
fn check_names(m: &MetricsConfig, f: FieldName) -> Result<(), ConfigError> {
    let names = [
        ("running", &m.running),
        ("waiting", &m.waiting),
        ("kv_cache_usage", &m.kv_cache_usage),
        ("memory_free", &m.memory_free),
        ("memory_total", &m.memory_total),
        ("memory_used", &m.memory_used),
        ("gpu_util", &m.gpu_util),
    ];
    for (name, v) in names {
        if let Some(v) = v.as_ref().filter(|v| !metric_name_ok(v)) {
            return Err(ConfigError::invalid(
                f(&format!("metrics.{name}")),
                v,
                "not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*, at most 200 bytes)",
            ));
        }
    }
    Ok(())
}

/// The server's built-in names (custom: none, `running` and `waiting` required), with the
/// overrides of `[instances.metrics]`.
fn server_names(server: ServerKind, m: &MetricsConfig, f: FieldName) -> Result<MetricNames, ConfigError> {
    let mut out = match server {
        ServerKind::Vllm => model_server::ServerKind::Vllm.names(),
        ServerKind::Sglang => model_server::ServerKind::Sglang.names(),
        ServerKind::Custom => {
            for (name, v) in [("running", &m.running), ("waiting", &m.waiting)] {
                if v.is_none() {
                    return Err(ConfigError::invalid(
                        f(&format!("metrics.{name}")),
                        "(none)",
                        format!("server = \"custom\" needs [instances.metrics] {name} = \"<gauge name>\""),
                    ));
                }
            }
            model_server::ServerKind::Custom { running: String::new(), waiting: String::new(), kv_cache_usage: None }
                .names()
        }
    };
    if let Some(r) = &m.running {
        out.running = r.clone();
    }
    if let Some(w) = &m.waiting {
        out.waiting = w.clone();
    }
    if let Some(k) = &m.kv_cache_usage {
        out.kv_cache_usage = vec![k.clone()];
    }
    Ok(out)
}

/// With `nvml = true`, NVML gives memory and utilisation: no other source of them.
fn check_nothing_nvml_gives(c: &InstanceConfig, m: &MetricsConfig, f: FieldName) -> Result<(), ConfigError> {
    let nvml_conflict = |name: &str, v: &dyn ToString| {
        ConfigError::invalid(
            f(name),
            v.to_string(),
            "with nvml = true, NVML gives memory and utilisation; set nvml = false to take them from metrics",
        )
    };
    if let Some(b) = c.kv_bytes_per_token {
        return Err(nvml_conflict("kv_bytes_per_token", &b));
    }
    for (name, v) in [("metrics.memory_free", &m.memory_free), ("metrics.memory_total", &m.memory_total)]
        .into_iter()
        .chain([("metrics.memory_used", &m.memory_used), ("metrics.gpu_util", &m.gpu_util)])
    {
        if let Some(v) = v {
            return Err(nvml_conflict(name, v));
        }
    }
    Ok(())
}

/// `kv_bytes_per_token = b`: the server's KV-cache capacity metric to read, for vLLM and
/// SGLang only, and as the only memory source.
fn kv_capacity(server: ServerKind, b: u64, memory: bool, f: FieldName) -> Result<KvCapacity, ConfigError> {
    if server == ServerKind::Custom {
        return Err(ConfigError::invalid(
            f("kv_bytes_per_token"),
            b,
            "only for server = \"vllm\" or \"sglang\" (their KV-cache capacity metrics); map memory_free instead",
        ));
    }
    if !(1..=MAX_KV_BYTES_PER_TOKEN).contains(&b) {
        return Err(ConfigError::invalid(f("kv_bytes_per_token"), b, format!("must be 1 to {MAX_KV_BYTES_PER_TOKEN}")));
    }
    if memory {
        return Err(ConfigError::invalid(
            f("kv_bytes_per_token"),
            b,
            "one memory source: the memory gauges of [instances.metrics] or kv_bytes_per_token, not both",
        ));
    }
    Ok(match server {
        ServerKind::Sglang => KvCapacity::SglangTokens,
        _ => KvCapacity::VllmCacheConfig,
    })
}

/// The memory gauges (`memory_free`, or `memory_total` and `memory_used`) and their unit,
/// required with them (`memory`: any is mapped).
fn memory_unit(m: &MetricsConfig, memory: bool, f: FieldName) -> Result<Option<MemoryUnit>, ConfigError> {
    if m.memory_free.is_some() && m.memory_used.is_some() {
        return Err(ConfigError::invalid(
            f("metrics.memory_used"),
            m.memory_used.as_deref().unwrap_or_default(),
            "give memory_free, or memory_total and memory_used, not both",
        ));
    }
    if m.memory_used.is_some() && m.memory_total.is_none() {
        return Err(ConfigError::invalid(
            f("metrics.memory_used"),
            m.memory_used.as_deref().unwrap_or_default(),
            "needs memory_total (free = total - used)",
        ));
    }
    match (&m.memory_unit, memory) {
        (Some(u), true) => Ok(Some(MemoryUnit::parse(u).ok_or_else(|| {
            ConfigError::invalid(f("metrics.memory_unit"), u, "one of \"bytes\", \"KiB\", \"MiB\", \"GiB\"")
        })?)),
        (None, true) => Err(ConfigError::invalid(
            f("metrics.memory_unit"),
            "(none)",
            "required with memory gauges: \"bytes\", \"KiB\", \"MiB\" or \"GiB\" (no guessing)",
        )),
        (Some(u), false) => Err(ConfigError::invalid(f("metrics.memory_unit"), u, "no memory gauge is mapped")),
        (None, false) => Ok(None),
    }
}

/// The unit of `gpu_util`, required with it.
fn util_unit(m: &MetricsConfig, f: FieldName) -> Result<Option<UtilUnit>, ConfigError> {
    match (&m.gpu_util_unit, &m.gpu_util) {
        (Some(u), Some(_)) => Ok(Some(UtilUnit::parse(u).ok_or_else(|| {
            ConfigError::invalid(f("metrics.gpu_util_unit"), u, "\"percent\" (0..100) or \"fraction\" (0..1)")
        })?)),
        (None, Some(_)) => Err(ConfigError::invalid(
            f("metrics.gpu_util_unit"),
            "(none)",
            "required with gpu_util: \"percent\" (0..100) or \"fraction\" (0..1)",
        )),
        (Some(u), None) => Err(ConfigError::invalid(f("metrics.gpu_util_unit"), u, "no gpu_util is mapped")),
        (None, None) => Ok(None),
    }
}

/// `gpu_labels`: label names with at least one value, filtering gauges that are mapped
/// (`gauges`: a memory or utilisation gauge is).
fn check_gpu_labels(m: &MetricsConfig, gauges: bool, f: FieldName) -> Result<(), ConfigError> {
    for (k, vals) in &m.gpu_labels {
        let field = f(&format!("metrics.gpu_labels.{k}"));
        if !label_name_ok(k) {
            return Err(ConfigError::invalid(field, k, "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
        }
        if vals.is_empty() {
            return Err(ConfigError::invalid(field, "[]", "at least one value"));
        }
        if !gauges {
            return Err(ConfigError::invalid(
                field,
                vals.join(","),
                "filters the memory and utilisation gauges; none is mapped",
            ));
        }
    }
    Ok(())
}
