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

use agent_support::{instance, listed, meta, Agent, FakeVllm, SERVICE};
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
