//! `ailb agent` against a real rnacos (v1 Open API) and a fake vLLM server on loopback
//! (`/metrics` in vLLM's names, `/health`), NVML off. No eBPF: the agent only talks HTTP.
//!
//! Shown here: the metadata contract's keys appear; a changed running count reaches Nacos
//! within 1 s (publish_interval 250ms: the bound is one interval plus a scrape and a write);
//! steady metrics write nothing while beats continue; a dead health endpoint is published
//! `unhealthy` at once; bad metrics text and a Nacos outage are counted and survived; SIGTERM
//! disables, waits for in-flight to reach zero, deregisters and exits 0.

mod agent_support;

use std::time::{Duration, Instant};

use agent_support::{cache_config_info, instance, listed, meta, Agent, FakeVllm, SERVICE};
use ailb_tests::nacos::RnacosServer;
use ailb_tests::wait_until;

#[test]
fn agent_publishes_the_contract_keys_and_writes_only_what_moved() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::start(&nacos, &vllm, "1s");
    let port = agent.instance_port;

    let host = wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));
    let m = &host["metadata"];
    for (k, v) in [
        ("model_id", SERVICE),
        ("model_version", "v7"),
        ("gpu_type", "A100-80GB"),
        ("supported_tasks", "chat,completion"),
        ("current_requests", "2"),
        ("queue_length", "1"),
        ("kv_cache_usage", "0.25"),
        ("health_status", "healthy"),
    ] {
        assert_eq!(m[k], v, "metadata {k}: {m}");
    }
    assert!(m["updated_at_ms"].as_str().and_then(|s| s.parse::<u64>().ok()).is_some(), "{m}");
    assert!(m["agent_version"].is_string(), "{m}");
    assert_eq!(host["enabled"], true);

    // Propagation: a changed running count reaches rnacos within 1 s.
    let t0 = Instant::now();
    vllm.set(|s| s.running = 5.0);
    wait_until("current_requests=5 in rnacos", Duration::from_secs(1), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("5")).then_some(())
    });
    eprintln!("propagation of current_requests 2 -> 5: {} ms", t0.elapsed().as_millis());

    // Steady metrics: no write over 12 intervals (3 s), while beats (every 1 s) continue.
    let (p0, b0) = (agent.metric("ailb_agent_publishes_total"), agent.metric("ailb_agent_beats_total"));
    let stamp = meta(&nacos, port, "updated_at_ms");
    std::thread::sleep(Duration::from_secs(3));
    let (p1, b1) = (agent.metric("ailb_agent_publishes_total"), agent.metric("ailb_agent_beats_total"));
    eprintln!("steady 3 s (12 intervals): publishes {p0} -> {p1}, beats {b0} -> {b1}");
    assert_eq!(p1, p0, "steady metrics must not be written");
    assert!(b1 - b0 >= 2.0, "beats every 1 s continue: {b0} -> {b1}");
    assert_eq!(meta(&nacos, port, "updated_at_ms"), stamp, "updated_at_ms only moves on a publish");

    // The health endpoint dies: unhealthy at once.
    let t0 = Instant::now();
    vllm.set(|s| s.healthy = false);
    wait_until("health_status=unhealthy", Duration::from_secs(1), || {
        (meta(&nacos, port, "health_status").as_deref() == Some("unhealthy")).then_some(())
    });
    eprintln!("propagation of health_status unhealthy: {} ms", t0.elapsed().as_millis());
    vllm.set(|s| s.healthy = true);
    wait_until("health_status=healthy again", Duration::from_secs(2), || {
        (meta(&nacos, port, "health_status").as_deref() == Some("healthy")).then_some(())
    });

    // Bad metrics text: counted, the agent lives on, and recovers when the text is good again.
    let e0 = agent.metric("ailb_agent_errors_total{source=\"scrape\"}");
    vllm.set(|s| s.garbage = true);
    wait_until("scrape errors counted", Duration::from_secs(3), || {
        (agent.metric("ailb_agent_errors_total{source=\"scrape\"}") >= e0 + 2.0).then_some(())
    });
    assert!(agent.alive(), "the agent survives bad metrics text; log:\n{}", agent.log());
    vllm.set(|s| {
        s.garbage = false;
        s.running = 9.0;
    });
    wait_until("current_requests=9 after recovery", Duration::from_secs(2), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("9")).then_some(())
    });
    assert!(agent.log().contains("scrape"), "the scrape error is logged:\n{}", agent.log());
}

#[test]
fn agent_sigterm_disables_drains_in_flight_then_deregisters() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    vllm.set(|s| {
        s.running = 3.0;
        s.waiting = 0.0;
    });
    let mut agent = Agent::start(&nacos, &vllm, "1s");
    let port = agent.instance_port;
    wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));

    agent.sigterm();
    // rnacos leaves disabled instances out of the list; the instance itself says enabled=false.
    let t0 = Instant::now();
    wait_until("the instance disabled", Duration::from_secs(2), || {
        let i = instance(&nacos, port)?;
        (i["enabled"] == false && listed(&nacos, port).is_none()).then_some(i)
    });
    eprintln!("disabled {} ms after SIGTERM", t0.elapsed().as_millis());
    // In flight: the agent waits (several intervals) with the instance still registered.
    std::thread::sleep(Duration::from_secs(1));
    assert!(agent.alive(), "requests in flight: the agent waits; log:\n{}", agent.log());
    assert!(instance(&nacos, port).is_some(), "still registered while draining");
    assert_eq!(instance(&nacos, port).expect("instance")["metadata"]["health_status"], "draining");

    vllm.set(|s| s.running = 0.0);
    let status = agent.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "agent exit {status}; log:\n{}", agent.log());
    assert!(instance(&nacos, port).is_none(), "deregistered after the drain");
}

#[test]
fn agent_survives_a_nacos_outage_and_registers_again() {
    let mut nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::start(&nacos, &vllm, "500ms");
    let port = agent.instance_port;
    wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));

    nacos.stop();
    vllm.set(|s| s.running = 4.0);
    wait_until("nacos errors counted", Duration::from_secs(5), || {
        (agent.metric("ailb_agent_errors_total{source=\"nacos\"}") >= 2.0).then_some(())
    });
    assert!(agent.alive(), "the agent survives the outage; log:\n{}", agent.log());

    // rnacos keeps no ephemeral instance over a restart: the agent registers again, in full.
    nacos.restart();
    let t0 = Instant::now();
    wait_until("the instance back with its metadata", Duration::from_secs(5), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("4")).then_some(())
    });
    eprintln!("registered again {} ms after rnacos was back", t0.elapsed().as_millis());
    assert_eq!(meta(&nacos, port, "model_id").as_deref(), Some(SERVICE));
    assert!(agent.alive());
}

#[test]
fn agent_logs_in_and_picks_v1_with_api_auto_on_rnacos_with_auth() {
    let nacos = RnacosServer::start_with(&[
        ("RNACOS_ENABLE_OPEN_API_AUTH", "true"),
        ("RNACOS_INIT_ADMIN_USERNAME", "ailb"),
        ("RNACOS_INIT_ADMIN_PASSWORD", "s3cret-pw"),
    ]);
    let vllm = FakeVllm::start();
    let creds = "api = \"auto\"\nusername = \"ailb\"\npassword = \"s3cret-pw\"";
    let agent = Agent::spawn_full(&nacos, &vllm, "1s", "", creds, "nvml = false").ready();
    let port = agent.instance_port;
    let token = nacos.login("ailb", "s3cret-pw").expect("test login");
    let listed_auth = || {
        let path = format!("/nacos/v1/ns/instance/list?serviceName={SERVICE}&healthyOnly=false&accessToken={token}");
        let (status, body) = ailb_tests::nacos::http_request(nacos.http_port, "GET", &path, &[]).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        (status == 200).then(|| v["hosts"].as_array()?.iter().find(|h| h["port"] == port).cloned()).flatten()
    };
    let host = wait_until("the instance registered with a token", Duration::from_secs(5), listed_auth);
    assert_eq!(host["metadata"]["current_requests"], "2", "{host}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(agent.metric("ailb_agent_beats_total") >= 1.0, "beats carry the token too; log:\n{}", agent.log());
    assert_eq!(agent.metric("ailb_agent_errors_total{source=\"nacos\"}"), 0.0, "log:\n{}", agent.log());
}

#[test]
fn agent_without_nvml_publishes_vllm_free_kv_cache_as_memory() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    vllm.set(|s| {
        s.kv = 0.25;
        s.extra = cache_config_info(4096);
    });
    // Llama 3 8B in bf16: 32 layers x 8 KV heads x 128 x 2 x 2 bytes = 131072 bytes per token.
    let agent = Agent::start_with(&nacos, &vllm, "1s", "", "nvml = false\nkv_bytes_per_token = 131072");
    let port = agent.instance_port;
    let host = wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));
    let m = &host["metadata"];
    // 4096 x 16 x (1 - 0.25) = 49152 tokens x 128 KiB = 6144 MiB = 6.0 GB.
    assert_eq!(m["remaining_memory_mb"], "6144", "{m}");
    assert_eq!(m["remaining_memory"], "6.0", "{m}");
    assert_eq!(m["memory_source"], "kv_cache", "{m}");
    assert!(m.get("gpu_util").is_none() && m.get("gpu_memory_total_mb").is_none(), "vLLM exports neither: {m}");
    // The cache's capacity, the prefix lifetime's input: 4096 x 16 tokens.
    assert_eq!(m["kv_cache_capacity_tokens"], "65536", "{m}");
    assert!(m.get("prompt_tokens_per_s").is_none(), "no prompt counter exported: {m}");

    // Prompts come in at 2,000 tokens a second: the smoothed rate is published.
    vllm.set(|s| s.prompts = Some((Instant::now(), 2000.0)));
    let rate = wait_until("prompt_tokens_per_s published", Duration::from_secs(5), || {
        meta(&nacos, port, "prompt_tokens_per_s").and_then(|r| r.parse::<f64>().ok())
    });
    assert!((1500.0..=2500.0).contains(&rate), "a steady 2,000 tokens/s read as {rate}");
    vllm.set(|s| s.prompts = None);

    // The cache fills: 4096 x 16 x 0.5 = 32768 tokens = 4096 MiB.
    vllm.set(|s| s.kv = 0.5);
    wait_until("remaining_memory_mb=4096", Duration::from_secs(2), || {
        (meta(&nacos, port, "remaining_memory_mb").as_deref() == Some("4096")).then_some(())
    });

    // The info gauge disappears: memory is unknown again (left out), with the reason logged.
    vllm.set(|s| s.extra.clear());
    wait_until("remaining_memory_mb left out", Duration::from_secs(2), || {
        let h = listed(&nacos, port)?;
        (h["metadata"].get("remaining_memory_mb").is_none() && h["metadata"].get("memory_source").is_none())
            .then_some(())
    });
    assert_eq!(meta(&nacos, port, "current_requests").as_deref(), Some("2"), "the load is still published");
    assert!(agent.log().contains("vllm:cache_config_info absent"), "the reason is logged:\n{}", agent.log());
}

#[test]
fn agent_with_a_custom_mapping_publishes_exporter_gpu_gauges() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    // Another server's load gauges, and DCGM-exporter-style GPU gauges (MiB, %) for 3 GPUs of
    // which the instance has 0 and 1.
    vllm.set(|s| {
        s.extra = "tgi_batch_current_size 6\ntgi_queue_size 3\n\
                   DCGM_FI_DEV_FB_FREE{gpu=\"0\",UUID=\"GPU-a\"} 30000\n\
                   DCGM_FI_DEV_FB_FREE{gpu=\"1\",UUID=\"GPU-b\"} 20000\n\
                   DCGM_FI_DEV_FB_FREE{gpu=\"2\",UUID=\"GPU-c\"} 80000\n\
                   DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\"} 30\n\
                   DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-b\"} 60\n\
                   DCGM_FI_DEV_GPU_UTIL{gpu=\"2\",UUID=\"GPU-c\"} 0\n"
            .to_string();
    });
    let instance = r#"nvml = false
server = "custom"
[instances.metrics]
running = "tgi_batch_current_size"
waiting = "tgi_queue_size"
memory_free = "DCGM_FI_DEV_FB_FREE"
memory_unit = "MiB"
gpu_util = "DCGM_FI_DEV_GPU_UTIL"
gpu_util_unit = "percent"
[instances.metrics.gpu_labels]
gpu = ["0", "1"]
"#;
    let agent = Agent::start_with(&nacos, &vllm, "1s", "", instance);
    let port = agent.instance_port;
    let host = wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));
    let m = &host["metadata"];
    for (k, v) in [
        ("current_requests", "6"),
        ("queue_length", "3"),
        ("remaining_memory_mb", "50000"),
        ("remaining_memory", "48.8"),
        ("memory_source", "metrics"),
        ("gpu_util", "45"),
    ] {
        assert_eq!(m[k], v, "metadata {k}: {m}");
    }
    assert!(m.get("kv_cache_usage").is_none(), "no KV gauge mapped: {m}");

    // GPU 1 fills up and gets busy: 30000 + 4000 MiB, (30 + 90) / 2 = 60 %.
    vllm.set(|s| {
        s.extra = s
            .extra
            .replace("UUID=\"GPU-b\"} 20000", "UUID=\"GPU-b\"} 4000")
            .replace("UUID=\"GPU-b\"} 60", "UUID=\"GPU-b\"} 90");
    });
    wait_until("the new memory and util in rnacos", Duration::from_secs(2), || {
        let h = listed(&nacos, port)?;
        (h["metadata"]["remaining_memory_mb"] == "34000" && h["metadata"]["gpu_util"] == "60").then_some(())
    });
    assert_eq!(agent.metric("ailb_agent_errors_total{source=\"scrape\"}"), 0.0, "log:\n{}", agent.log());
}

#[test]
fn agent_refuses_a_custom_server_without_its_gauges() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::spawn(&nacos, &vllm, "1s", "", "nvml = false\nserver = \"custom\"");
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(!status.success(), "a custom server without [instances.metrics] must not start");
    let log = agent.log();
    assert!(log.contains("instances[0].metrics.running") && log.contains("custom"), "{log}");
}
