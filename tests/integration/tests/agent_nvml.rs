//! `ailb agent` with `nvml = true` against a FAKE `libnvidia-ml.so` (tests/integration/fixtures/fake_nvml.c,
//! values from a `state` file re-read on every call), rnacos and a fake vLLM. What this shows:
//! GPU memory and utilisation reach Nacos in the contract's units, summed over the instance's
//! GPUs; a memory move below the threshold writes nothing, above it publishes; an NVML error is
//! counted and survived; no library at all stops start-up with a clear message. Nothing here
//! says how a real driver behaves.

mod agent_support;

use std::time::Duration;

use agent_support::{listed, meta, Agent, FakeNvml, FakeVllm};
use ailb_tests::nacos::RnacosServer;
use ailb_tests::wait_until;

/// Two GPUs of 80 GiB; `used0` MiB used on the first, 10000 on the second.
fn state(used0: u64, extra: &str) -> String {
    format!(
        "count 2\n0 name NVIDIA A100-SXM4-80GB\n0 uuid GPU-0\n0 total_mb 81920\n0 used_mb {used0}\n0 util 30\n\
         1 name NVIDIA A100-SXM4-80GB\n1 uuid GPU-1\n1 total_mb 81920\n1 used_mb 10000\n1 util 50\n{extra}"
    )
}

#[test]
fn agent_publishes_gpu_memory_and_util_from_nvml() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let nvml = FakeNvml::build(&state(20000, ""));
    let agent = Agent::start_with(
        &nacos,
        &vllm,
        "1s",
        &format!("nvml_library = \"{}\"", nvml.lib()),
        "nvml = true\ngpus = [0, \"GPU-1\"]",
    );
    let port = agent.instance_port;
    let host = wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));
    let m = &host["metadata"];
    // Free: (81920 - 20000) + (81920 - 10000) = 133840 MiB = 130.7 GiB (rounded down).
    assert_eq!(m["remaining_memory_mb"], "133840", "{m}");
    assert_eq!(m["remaining_memory"], "130.7", "{m}");
    assert_eq!(m["gpu_memory_total_mb"], "163840", "{m}");
    assert_eq!(m["gpu_util"], "40", "mean of 30 and 50: {m}");
    // The config's gpu_type (the key of [policy.gpu_capability]) wins over NVML's name; the
    // NVML name is the fallback (unit test `metadata_uses_the_contract_keys_and_units`).
    assert_eq!(m["gpu_type"], "A100-80GB", "{m}");

    // 300 MiB less free: below the 512 MiB threshold, no write.
    let p0 = agent.metric("ailb_agent_publishes_total");
    nvml.set(&state(20300, ""));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(agent.metric("ailb_agent_publishes_total"), p0, "a move below the threshold is not written");
    // 1300 MiB less than published: written.
    nvml.set(&state(21300, ""));
    wait_until("remaining_memory_mb=132540", Duration::from_secs(1), || {
        (meta(&nacos, port, "remaining_memory_mb").as_deref() == Some("132540")).then_some(())
    });

    // NVML fails on memory: counted, survived, memory left out (unknown), then back.
    nvml.set(&state(21300, "fail memory\n"));
    wait_until("nvml errors counted", Duration::from_secs(3), || {
        (agent.metric("ailb_agent_errors_total{source=\"nvml\"}") >= 2.0).then_some(())
    });
    wait_until("memory left out while NVML fails", Duration::from_secs(2), || {
        meta(&nacos, port, "remaining_memory_mb").is_none().then_some(())
    });
    assert_eq!(meta(&nacos, port, "current_requests").as_deref(), Some("2"), "the server's values stay");
    nvml.set(&state(21300, ""));
    wait_until("memory back", Duration::from_secs(2), || {
        (meta(&nacos, port, "remaining_memory_mb").as_deref() == Some("132540")).then_some(())
    });
}

#[test]
fn agent_without_an_nvml_library_stops_at_start_up() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::spawn(
        &nacos,
        &vllm,
        "1s",
        "nvml_library = \"/nonexistent/libnvidia-ml.so.1\"",
        "nvml = true\ngpus = [0]",
    );
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(!status.success());
    let log = agent.log();
    assert!(log.contains("nvml = true") && log.contains("no NVML library"), "{log}");
    assert!(log.contains("nvml = false"), "the message names the way out: {log}");
}
