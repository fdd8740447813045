//! The agent's config: defaults, validation errors naming the field and the value.

use super::*;
use crate::telemetry::model_server::{KvCapacity, MemoryUnit, UtilUnit};

const MIN: &str = r#"
[nacos]
servers = ["http://127.0.0.1:8848"]

[[instances]]
service = "m"
ip = "10.0.0.7"
port = 8000
model_id = "m"
metrics_url = "http://127.0.0.1:8000/metrics"
health_url = "http://127.0.0.1:8000/health"
nvml = false
"#;

fn parse(s: &str) -> Result<ValidAgent, String> {
    let c: AgentConfig = toml::from_str(s).map_err(|e| e.to_string())?;
    c.validate().map_err(|e| e.to_string())
}

#[test]
fn defaults() {
    let v = parse(MIN).unwrap();
    assert_eq!(v.publish_interval, Duration::from_millis(500));
    assert_eq!(v.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(v.drain_timeout, Duration::from_secs(30));
    assert_eq!((v.probe_timeout, v.health_failure_threshold), (Duration::from_secs(1), 3));
    assert_eq!(v.prompt_rate_window, Duration::from_secs(30));
    assert_eq!(v.thresholds, Thresholds::default());
    let i = &v.instances[0];
    assert_eq!((i.cluster.as_str(), i.weight, i.server), ("DEFAULT", 1.0, ServerKind::Vllm));
}

#[test]
fn bad_values_name_the_field() {
    let e = parse(&MIN.replace("nvml = false", "nvml = true")).unwrap_err();
    assert!(e.contains("instances[0].gpus"), "{e}");
    let e = parse(&format!("publish_interval = \"1ms\"\n{MIN}")).unwrap_err();
    assert!(e.contains("publish_interval"), "{e}");
    let e = parse(&format!("probe_timeout = \"2m\"\n{MIN}")).unwrap_err();
    assert!(e.contains("probe_timeout") && e.contains("2m"), "{e}");
    for bad in [0, 101] {
        let e = parse(&format!("health_failure_threshold = {bad}\n{MIN}")).unwrap_err();
        assert!(e.contains("health_failure_threshold") && e.contains(&bad.to_string()), "{e}");
    }
    let e = parse(&MIN.replace("http://127.0.0.1:8848", "ftp://x")).unwrap_err();
    assert!(e.contains("nacos.servers[0]") && !e.contains("discovery"), "{e}");
    let e = parse(&MIN.replace("http://127.0.0.1:8000/health", "nope")).unwrap_err();
    assert!(e.contains("instances[0].health_url"), "{e}");
    let e = parse(&format!("[thresholds]\nutil_pct = 0\n{MIN}")).unwrap_err();
    assert!(e.contains("thresholds.util_pct"), "{e}");
    let e = parse(&format!("[thresholds]\nprompt_rate = 0\n{MIN}")).unwrap_err();
    assert!(e.contains("thresholds.prompt_rate"), "{e}");
    for bad in ["50ms", "11m"] {
        let e = parse(&format!("prompt_rate_window = \"{bad}\"\n{MIN}")).unwrap_err();
        assert!(e.contains("prompt_rate_window") && e.contains(bad), "{e}");
    }
    assert_eq!(
        parse(&format!("prompt_rate_window = \"1500ms\"\n{MIN}")).unwrap().prompt_rate_window,
        Duration::from_millis(1500)
    );
    assert!(parse(&format!("bogus = 1\n{MIN}")).is_err());
    let e = parse(&with("max_inflight = 0")).unwrap_err();
    assert!(e.contains("instances[0].max_inflight") && e.contains('0'), "{e}");
    assert_eq!(parse(&with("max_inflight = 16")).unwrap().instances[0].max_inflight, Some(16));
    assert_eq!(parse(MIN).unwrap().instances[0].max_inflight, None);
}

#[test]
fn gpus_by_index_or_uuid() {
    let v = parse(&MIN.replace("nvml = false", "nvml = true\ngpus = [0, \"GPU-abc\"]")).unwrap();
    assert_eq!(v.instances[0].gpus, vec![GpuRef::Index(0), GpuRef::Uuid("GPU-abc".into())]);
}

/// `MIN` with `lines` added to the instance (before any table of it).
fn with(lines: &str) -> String {
    format!("{MIN}{lines}\n")
}

#[test]
fn custom_server_takes_its_names_from_the_mapping() {
    let v = parse(&with(
        "server = \"custom\"\n[instances.metrics]\nrunning = \"tgi_batch_current_size\"\nwaiting = \"tgi_queue_size\"",
    ))
    .unwrap();
    let n = &v.instances[0].names;
    assert_eq!((n.running.as_str(), n.waiting.as_str()), ("tgi_batch_current_size", "tgi_queue_size"));
    assert!(n.kv_cache_usage.is_empty() && n.gpu.is_none() && n.kv_capacity == KvCapacity::None, "{n:?}");
    // vLLM keeps its names; the table overrides one of them.
    let v = parse(&with("[instances.metrics]\nkv_cache_usage = \"vllm:gpu_cache_usage_perc\"")).unwrap();
    let n = &v.instances[0].names;
    assert_eq!(n.running, "vllm:num_requests_running");
    assert_eq!(n.kv_cache_usage, vec!["vllm:gpu_cache_usage_perc".to_string()]);
}

#[test]
fn kv_bytes_per_token_reads_the_servers_capacity() {
    let v = parse(&with("kv_bytes_per_token = 131072")).unwrap();
    assert_eq!(v.instances[0].kv_bytes_per_token, Some(131072));
    assert_eq!(v.instances[0].names.kv_capacity, KvCapacity::VllmCacheConfig);
    let v = parse(&with("server = \"sglang\"\nkv_bytes_per_token = 131072")).unwrap();
    assert_eq!(v.instances[0].names.kv_capacity, KvCapacity::SglangTokens);
    assert_eq!(v.instances[0].names.running, "sglang:num_running_reqs");
    // Without it, no capacity is read (and no reason is logged for it).
    assert_eq!(parse(MIN).unwrap().instances[0].names.kv_capacity, KvCapacity::None);
}

#[test]
fn dcgm_and_triton_gauges_map_with_their_units() {
    let v = parse(&with(
        "[instances.metrics]\nmemory_free = \"DCGM_FI_DEV_FB_FREE\"\nmemory_unit = \"MiB\"\n\
         gpu_util = \"DCGM_FI_DEV_GPU_UTIL\"\ngpu_util_unit = \"percent\"\n\
         [instances.metrics.gpu_labels]\ngpu = [\"0\", \"1\"]",
    ))
    .unwrap();
    let g = v.instances[0].names.gpu.clone().expect("gpu metrics");
    assert_eq!(g.memory_free.as_deref(), Some("DCGM_FI_DEV_FB_FREE"));
    assert_eq!((g.memory_unit, g.util_unit), (MemoryUnit::MiB, UtilUnit::Percent));
    assert_eq!(g.labels, vec![("gpu".to_string(), vec!["0".to_string(), "1".to_string()])]);
    let v = parse(&with(
        "[instances.metrics]\nmemory_total = \"nv_gpu_memory_total_bytes\"\n\
         memory_used = \"nv_gpu_memory_used_bytes\"\nmemory_unit = \"bytes\"\n\
         gpu_util = \"nv_gpu_utilization\"\ngpu_util_unit = \"fraction\"",
    ))
    .unwrap();
    let g = v.instances[0].names.gpu.clone().expect("gpu metrics");
    assert_eq!((g.memory_unit, g.util_unit, g.memory_free), (MemoryUnit::Bytes, UtilUnit::Fraction, None));
}

#[test]
fn bad_mappings_name_the_field_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("server = \"custom\"", "instances[0].metrics.running", "(none)"),
        ("server = \"custom\"\n[instances.metrics]\nrunning = \"r\"", "instances[0].metrics.waiting", "(none)"),
        ("[instances.metrics]\nrunning = \"bad name\"", "instances[0].metrics.running", "bad name"),
        ("[instances.metrics]\ngpu_util = \"9lives\"", "instances[0].metrics.gpu_util", "9lives"),
        ("[instances.metrics]\nmemory_free = \"DCGM_FI_DEV_FB_FREE\"", "instances[0].metrics.memory_unit", "(none)"),
        ("[instances.metrics]\nmemory_free = \"m\"\nmemory_unit = \"MB\"", "instances[0].metrics.memory_unit", "MB"),
        ("[instances.metrics]\nmemory_unit = \"MiB\"", "instances[0].metrics.memory_unit", "MiB"),
        ("[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"%\"", "instances[0].metrics.gpu_util_unit", "%"),
        ("[instances.metrics]\ngpu_util = \"u\"", "instances[0].metrics.gpu_util_unit", "(none)"),
        ("[instances.metrics]\nmemory_used = \"u\"\nmemory_unit = \"MiB\"", "instances[0].metrics.memory_used", "u"),
        (
            "[instances.metrics]\nmemory_free = \"f\"\nmemory_total = \"t\"\nmemory_used = \"u\"\n\
             memory_unit = \"MiB\"",
            "instances[0].metrics.memory_used",
            "u",
        ),
        ("[instances.metrics.gpu_labels]\ngpu = [\"0\"]", "instances[0].metrics.gpu_labels.gpu", "0"),
        (
            "[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"percent\"\n\
             [instances.metrics.gpu_labels]\ngpu = []",
            "instances[0].metrics.gpu_labels.gpu",
            "[]",
        ),
        ("kv_bytes_per_token = 0", "instances[0].kv_bytes_per_token", "0"),
        ("kv_bytes_per_token = 999999999999", "instances[0].kv_bytes_per_token", "999999999999"),
        (
            "server = \"custom\"\nkv_bytes_per_token = 2\n[instances.metrics]\nrunning = \"r\"\nwaiting = \"w\"",
            "instances[0].kv_bytes_per_token",
            "2",
        ),
        (
            "kv_bytes_per_token = 2\n[instances.metrics]\nmemory_free = \"f\"\nmemory_unit = \"MiB\"",
            "instances[0].kv_bytes_per_token",
            "2",
        ),
    ];
    for (lines, field, value) in cases {
        let e = parse(&with(lines)).expect_err(lines);
        assert!(e.contains(&format!("`{field}`")) && e.contains(value), "{lines}: {e}");
    }
    // With NVML on, memory and utilisation come from NVML only.
    let on = MIN.replace("nvml = false", "nvml = true\ngpus = [0]");
    let e = parse(&format!("{on}kv_bytes_per_token = 131072\n")).unwrap_err();
    assert!(
        e.contains("`instances[0].kv_bytes_per_token`") && e.contains("131072") && e.contains("nvml = false"),
        "{e}"
    );
    let e = parse(&format!("{on}[instances.metrics]\ngpu_util = \"u\"\ngpu_util_unit = \"percent\"\n")).unwrap_err();
    assert!(e.contains("`instances[0].metrics.gpu_util`"), "{e}");
    // Unknown keys in the table are refused.
    assert!(parse(&with("[instances.metrics]\nrunnning = \"r\"")).is_err());
    assert!(parse(&with("server = \"tgi\"")).is_err());
}

#[test]
fn the_password_comes_from_one_source_named_under_nacos() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nacos.pass");
    std::fs::write(&file, "agent-file-pw\n").unwrap();
    let with = |lines: &str| MIN.replace("[nacos]\n", &format!("[nacos]\nusername = \"agent\"\n{lines}\n"));
    let v = parse(&with(&format!("password_file = \"{}\"", file.display()))).unwrap();
    assert_eq!(v.nacos.credentials.unwrap().password.expose(), "agent-file-pw");
    let e = parse(&with("password_env = \"AILB_TEST_AGENT_PW_UNSET\"")).unwrap_err();
    assert!(e.contains("`nacos.password_env`") && e.contains("not set") && !e.contains("discovery"), "{e}");
    let e = parse(&with(&format!("password = \"inline-pw\"\npassword_file = \"{}\"", file.display()))).unwrap_err();
    assert!(e.contains("`nacos.password_file`") && e.contains("only one password source"), "{e}");
    assert!(!e.contains("inline-pw") && !e.contains("agent-file-pw"), "{e}");
}

/// The engine's KV-event publisher: a wildcard host is published with the instance's address;
/// bad values name the field.
#[test]
fn kv_events_are_published_with_the_instances_address() {
    let kv = "kv_events = \"tcp://*:5557\"\nkv_replay = \"tcp://0.0.0.0:5558\"\nkv_block_size = 16\n";
    let v = parse(&format!("{MIN}{kv}")).unwrap();
    let source = v.instances[0].kv_events.as_ref().expect("a publisher");
    assert_eq!(
        (source.endpoint.as_str(), source.replay.as_deref()),
        ("tcp://10.0.0.7:5557", Some("tcp://10.0.0.7:5558"))
    );
    assert_eq!(source.block_size.get(), 16);
    let published = crate::metadata::publish::metadata(&v.instances[0], &crate::metadata::values::Values::default(), 1);
    let parsed = crate::metadata::Metadata::parse(&published);
    assert_eq!(
        parsed.kv_events,
        crate::metadata::Field::Valid(source.clone()),
        "the gateway reads what the agent writes"
    );
    assert_eq!(parse(MIN).unwrap().instances[0].kv_events, None);
    for (bad, want) in [
        (kv.replace("kv_block_size = 16\n", ""), "instances[0].kv_block_size"),
        (kv.replace("tcp://*:5557", "5557"), "instances[0].kv_events"),
        (kv.replace("tcp://0.0.0.0:5558", "tcp://10.0.0.7:0"), "instances[0].kv_replay"),
        ("kv_block_size = 16\n".to_string(), "instances[0].kv_block_size"),
    ] {
        let e = parse(&format!("{MIN}{bad}")).unwrap_err();
        assert!(e.contains(want), "{e} should name {want}");
    }
}
