//! Prometheus exposition text as the agent reads a model server's `/metrics` (lossy UTF-8), then
//! the vLLM, SGLang and custom-gauge readers on top. Besides no panic: the samples written back
//! as text parse the same, and every derived value is in its documented range.
#![no_main]

use ailb_fuzz::{exposition_text, same_samples};
use ailb_userspace::{
    fuzzing,
    telemetry::{
        model_server::{GpuMetrics, KvCapacity, MemoryUnit, MetricNames, ServerKind, UtilUnit},
        ServerSample,
    },
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(samples) = fuzzing::exposition(&text) else { return };
    for s in &samples {
        assert!(s.name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':'), "{s:?}");
    }
    let again = fuzzing::exposition(&exposition_text(&samples)).expect("written-back samples parse");
    assert!(same_samples(&again, &samples), "{again:?} != {samples:?}");
    for names in names() {
        check(&fuzzing::scrape(&text, &names).expect("parsed once, parses again"));
    }
});

/// The readers the agent configures: vLLM and SGLang with their KV capacity, and a custom
/// server whose GPU gauges come from a DCGM-style exporter.
fn names() -> [MetricNames; 3] {
    let vllm = MetricNames { kv_capacity: KvCapacity::VllmCacheConfig, ..ServerKind::Vllm.names() };
    let sglang = MetricNames { kv_capacity: KvCapacity::SglangTokens, ..ServerKind::Sglang.names() };
    let custom = ServerKind::Custom {
        running: "tgi_batch_current_size".into(),
        waiting: "tgi_queue_size".into(),
        kv_cache_usage: Some("my_kv_usage".into()),
    };
    let custom = MetricNames {
        gpu: Some(GpuMetrics {
            memory_free: None,
            memory_total: Some("DCGM_FI_DEV_FB_TOTAL".into()),
            memory_used: Some("DCGM_FI_DEV_FB_USED".into()),
            memory_unit: MemoryUnit::MiB,
            util: Some("nv_gpu_utilization".into()),
            util_unit: UtilUnit::Fraction,
            labels: vec![("gpu".into(), vec!["0".into(), "1".into()])],
        }),
        ..custom.names()
    };
    [vllm, sglang, custom]
}

fn check(s: &ServerSample) {
    // `x >= 0.0` is false for NaN too.
    for (what, v) in [
        ("kv_free_tokens", s.kv_free_tokens),
        ("memory_free_mb", s.memory_free_mb),
        ("memory_total_mb", s.memory_total_mb),
    ] {
        if let Some(v) = v {
            assert!(v >= 0.0, "{what} = {v}: {s:?}");
        }
    }
    if let (Some(free), Some(total)) = (s.memory_free_mb, s.memory_total_mb) {
        assert!(free <= total, "free {free} > total {total}: {s:?}");
    }
    if let Some(u) = s.gpu_util_pct {
        assert!((0.0..=100.0).contains(&u), "gpu_util_pct = {u}");
    }
}
