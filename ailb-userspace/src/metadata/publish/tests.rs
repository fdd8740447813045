//! The published map and the values behind it.

use super::*;
use crate::{
    metadata::values::{kv_tokens_to_mb, MemorySource, Thresholds},
    telemetry::{
        instance::{ServerKind, ValidInstance},
        GpuSample, NodeSample, ServerSample,
    },
};

fn inst() -> ValidInstance {
    ValidInstance {
        service: "m".into(),
        ip: "10.0.0.7".parse().unwrap(),
        port: 8000,
        cluster: "DEFAULT".into(),
        weight: 1.0,
        model_id: "m".into(),
        model_version: Some("v1".into()),
        gpu_type: None,
        max_inflight: None,
        supported_tasks: vec!["chat".into(), "embed".into()],
        gpus: vec![],
        metrics_url: "http://127.0.0.1:1/metrics".parse().unwrap(),
        health_url: Some("http://127.0.0.1:1/health".parse().unwrap()),
        server: ServerKind::Vllm,
        nvml: true,
        names: crate::telemetry::model_server::ServerKind::Vllm.names(),
        kv_bytes_per_token: None,
        kv_events: None,
    }
}

fn gpu(free: u64, util: u32) -> GpuSample {
    GpuSample {
        index: 0,
        name: "NVIDIA H100".into(),
        uuid: "GPU-1".into(),
        memory_total_mb: 81920,
        memory_free_mb: free,
        memory_used_mb: 81920 - free,
        util_pct: util,
    }
}

fn sample(free: u64, util: u32, running: f64) -> NodeSample {
    NodeSample {
        gpus: vec![gpu(free, util)],
        server: ServerSample {
            running: Some(running),
            waiting: Some(0.0),
            kv_cache_usage: Some(0.25),
            healthy: true,
            ..Default::default()
        },
    }
}

#[test]
fn metadata_uses_the_contract_keys_and_units() {
    let v = Values::from_sample(&sample(12800, 40, 3.0), false);
    let m = metadata(&inst(), &v, 1234);
    let get = |k: &str| m.get(k).map(String::as_str);
    assert_eq!(get("model_id"), Some("m"));
    assert_eq!(get("model_version"), Some("v1"));
    assert_eq!(get("gpu_type"), Some("NVIDIA H100"));
    assert_eq!(get("supported_tasks"), Some("chat,embed"));
    assert_eq!(get("remaining_memory_mb"), Some("12800"));
    assert_eq!(get("remaining_memory"), Some("12.5"));
    assert_eq!(get("memory_source"), Some("nvml"));
    assert_eq!(get("gpu_memory_total_mb"), Some("81920"));
    assert_eq!(get("gpu_util"), Some("40"));
    assert_eq!(get("current_requests"), Some("3"));
    assert_eq!(get("queue_length"), Some("0"));
    assert_eq!(get("kv_cache_usage"), Some("0.25"));
    assert_eq!(get("health_status"), Some("healthy"));
    assert_eq!(get("updated_at_ms"), Some("1234"));
    assert_eq!(get("agent_version"), Some(AGENT_VERSION));
    assert_eq!(get("max_inflight"), None, "no cap declared");
    let capped = ValidInstance { max_inflight: Some(16), ..inst() };
    assert_eq!(metadata(&capped, &v, 1234).get("max_inflight").map(String::as_str), Some("16"));
}

#[test]
fn without_gpus_memory_and_util_are_left_out() {
    let s = NodeSample { gpus: vec![], server: ServerSample { healthy: false, ..Default::default() } };
    let m = metadata(&inst(), &Values::from_sample(&s, false), 1);
    assert!(!m.contains_key("remaining_memory") && !m.contains_key("gpu_util") && !m.contains_key("gpu_type"));
    assert!(!m.contains_key("memory_source"));
    assert_eq!(m["health_status"], "unhealthy");
    assert_eq!(metadata(&inst(), &Values::from_sample(&s, true), 1)["health_status"], "draining");
}

#[test]
fn only_moves_past_a_threshold_publish() {
    let t = Thresholds::default();
    let a = Values::from_sample(&sample(20000, 40, 3.0), false);
    assert!(moved(None, &a, &t));
    assert!(!moved(Some(&a), &a, &t));
    assert!(!moved(Some(&a), &Values::from_sample(&sample(20000 - 511, 44, 3.0), false), &t));
    assert!(moved(Some(&a), &Values::from_sample(&sample(20000 - 512, 40, 3.0), false), &t));
    assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 45, 3.0), false), &t));
    assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 40, 4.0), false), &t));
    assert!(moved(Some(&a), &Values::from_sample(&sample(20000, 40, 3.0), true), &t));
    let mut dead = sample(20000, 40, 3.0);
    dead.server.healthy = false;
    assert!(moved(Some(&a), &Values::from_sample(&dead, false), &t));
    let mut gone = sample(20000, 40, 3.0);
    gone.server.running = None;
    assert!(moved(Some(&a), &Values::from_sample(&gone, false), &t));
}

#[test]
fn the_prompt_rate_and_the_kv_capacity_move_by_a_share_of_the_last_published() {
    let t = Thresholds::default();
    let with = |rate: f64, capacity: f64| {
        let mut s = sample(20000, 40, 3.0);
        s.server.prompt_tokens_per_s = Some(rate);
        s.server.kv_capacity_tokens = Some(capacity);
        Values::from_sample(&s, false)
    };
    let a = with(2_000.0, 100_000.0);
    let m = metadata(&inst(), &a, 1);
    assert_eq!((m["prompt_tokens_per_s"].as_str(), m["kv_cache_capacity_tokens"].as_str()), ("2000", "100000"));
    // A tenth of the last published value, either way.
    assert!(!moved(Some(&a), &with(2_199.0, 100_000.0), &t));
    assert!(moved(Some(&a), &with(2_200.0, 100_000.0), &t));
    assert!(moved(Some(&a), &with(1_800.0, 100_000.0), &t));
    assert!(moved(Some(&a), &with(2_000.0, 89_000.0), &t));
    // From nothing, at least a token a second.
    assert!(!moved(Some(&with(0.0, 100_000.0)), &with(0.5, 100_000.0), &t));
    assert!(moved(Some(&with(0.0, 100_000.0)), &with(1.0, 100_000.0), &t));
    // Appearing or going counts at once.
    assert!(moved(Some(&Values::from_sample(&sample(20000, 40, 3.0), false)), &a, &t));
}

#[test]
fn slow_drift_is_measured_against_the_last_publish() {
    // Each step is below the threshold, but they add up against the last published value.
    let t = Thresholds::default();
    let last = Values::from_sample(&sample(20000, 40, 3.0), false);
    let mut published = 0;
    let mut last_pub = last;
    for step in 1..=10u32 {
        let v = Values::from_sample(&sample(20000, 40 + step, 3.0), false);
        if moved(Some(&last_pub), &v, &t) {
            published += 1;
            last_pub = v;
        }
    }
    assert_eq!(published, 2, "40 -> 45 -> 50 with a 5-point threshold");
}

/// A vLLM-like sample without NVML: `kv_free` tokens free, no GPU gauges.
fn kv_sample(kv_free: Option<f64>) -> NodeSample {
    NodeSample {
        gpus: vec![],
        server: ServerSample {
            running: Some(1.0),
            waiting: Some(0.0),
            kv_cache_usage: Some(0.25),
            healthy: true,
            kv_free_tokens: kv_free,
            ..Default::default()
        },
    }
}

#[test]
fn free_kv_cache_becomes_memory_with_its_source() {
    // Llama 3 8B in bf16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131072 B/token.
    let b = 32 * 8 * 128 * 2 * 2;
    assert_eq!(b, 131_072);
    // 4096 blocks x 16 tokens x (1 - 0.25) = 49152 tokens x 128 KiB = 6144 MiB.
    let v = Values::derive(&kv_sample(Some(49152.0)), Some(b), false);
    assert_eq!(
        (v.free_mb, v.memory_source, v.total_mb, v.util_pct),
        (Some(6144), Some(MemorySource::KvCache), None, None)
    );
    let m = metadata(&inst(), &v, 1);
    assert_eq!((m["remaining_memory_mb"].as_str(), m["remaining_memory"].as_str()), ("6144", "6.0"));
    assert_eq!(m["memory_source"], "kv_cache");
    assert!(!m.contains_key("gpu_util") && !m.contains_key("gpu_memory_total_mb"), "{m:?}");
    // Fractional tokens are rounded down before, MiB after: 31457.28 tokens -> 3932 MiB.
    assert_eq!(kv_tokens_to_mb(31457.28, b), Some(3932));
    assert_eq!(kv_tokens_to_mb(7.0, 1), Some(0));
    assert_eq!(kv_tokens_to_mb(f64::NAN, b), None);
    assert_eq!(kv_tokens_to_mb(-1.0, b), None);
    // No bytes per token, or no capacity: unknown, no source.
    let v = Values::derive(&kv_sample(Some(49152.0)), None, false);
    assert_eq!((v.free_mb, v.memory_source), (None, None));
    let v = Values::derive(&kv_sample(None), Some(b), false);
    assert_eq!((v.free_mb, v.memory_source), (None, None));
    assert!(!metadata(&inst(), &v, 1).contains_key("remaining_memory_mb"));
}

#[test]
fn mapped_gauges_give_memory_and_util() {
    let mut s = kv_sample(None);
    s.server.memory_free_mb = Some(50000.9);
    s.server.memory_total_mb = Some(163840.0);
    s.server.gpu_util_pct = Some(45.0);
    let v = Values::derive(&s, None, false);
    assert_eq!((v.free_mb, v.total_mb, v.util_pct), (Some(50000), Some(163840), Some(45.0)));
    let m = metadata(&inst(), &v, 1);
    assert_eq!(m["remaining_memory"], "48.8");
    assert_eq!(m["memory_source"], "metrics");
    assert_eq!(m["gpu_util"], "45");
    // NVML wins when the sample has GPUs (the config allows only one source; this is the order).
    let mut with_gpu = s.clone();
    with_gpu.gpus = vec![gpu(1000, 10)];
    assert_eq!(Values::derive(&with_gpu, Some(1), false).memory_source, Some(MemorySource::Nvml));
    // Out-of-range utilisation is not published.
    s.server.gpu_util_pct = Some(250.0);
    assert_eq!(Values::derive(&s, None, false).util_pct, None);
}

#[test]
fn derived_memory_and_util_move_by_their_thresholds() {
    let t = Thresholds::default();
    let b = 131_072;
    let kv = |tokens: f64| Values::derive(&kv_sample(Some(tokens)), Some(b), false);
    let a = kv(49152.0); // 6144 MiB
    assert!(!moved(Some(&a), &kv(49152.0 - 4088.0), &t), "6144 -> 5633 MiB: 511 MiB, below 512");
    assert!(moved(Some(&a), &kv(49152.0 - 4096.0), &t), "6144 -> 5632 MiB: 512 MiB");
    // Memory becoming unknown, or changing source, is published.
    assert!(moved(Some(&a), &Values::derive(&kv_sample(None), Some(b), false), &t));
    let mut m = kv_sample(None);
    m.server.memory_free_mb = Some(6144.0);
    assert!(moved(Some(&a), &Values::derive(&m, Some(b), false), &t), "same MiB, another source");
    // Mapped utilisation: 5 points.
    m.server.gpu_util_pct = Some(40.0);
    let u = Values::derive(&m, None, false);
    m.server.gpu_util_pct = Some(44.9);
    assert!(!moved(Some(&u), &Values::derive(&m, None, false), &t));
    m.server.gpu_util_pct = Some(45.0);
    assert!(moved(Some(&u), &Values::derive(&m, None, false), &t));
}

#[test]
fn every_signal_the_sampler_derived_is_published_in_its_range() {
    let mut s = sample(12800, 40, 3.0);
    s.server.prefix_cache_hit_rate = Some(0.875);
    let v = Values::from_sample(&s, false);
    let m = metadata(&inst(), &v, 1);
    assert_eq!(m.get("prefix_cache_hit_rate").map(String::as_str), Some("0.875"));
    for sig in crate::metadata::signals::ALL {
        let published = m.get(sig.key).map(|r| r.parse::<f64>().unwrap());
        assert_eq!(published, (sig.read)(&v), "{}", sig.key);
    }
    // A new rate is published once it moved by the KV-cache threshold.
    let t = Thresholds::default();
    s.server.prefix_cache_hit_rate = Some(0.84);
    assert!(!moved(Some(&v), &Values::from_sample(&s, false), &t));
    s.server.prefix_cache_hit_rate = Some(0.8);
    assert!(moved(Some(&v), &Values::from_sample(&s, false), &t));
    s.server.prefix_cache_hit_rate = None;
    assert!(moved(Some(&v), &Values::from_sample(&s, false), &t), "a signal gone is published");
}
