//! One box, no registry: `ailb run` with static `[[backends]]` that name their GPUs and their
//! model server's metrics samples them itself (no rnacos, no agent), through the agent's own
//! sampler. NVML is the FAKE `libnvidia-ml.so` (tests/integration/fixtures/fake_nvml.c, values
//! from a state file re-read on every call) and the model server a fake vLLM. What this shows:
//! a change of the fake GPU's free memory reaches `AILB_BACKENDS` (`free_mem_mb`) within a few
//! samples; a failing NVML leaves the memory unknown and the daemon running; a model server
//! that stops answering takes its backend out of the table and back; a backend that names GPUs
//! without an NVML library stops start-up with a message naming the backend; the model's prefix
//! lifetime follows its caches' fill time (capacity over prompt tokens per second) as the
//! servers report them. Nothing here says how a real driver behaves.

use std::time::Duration;

use ailb_tests::agent_harness::{cache_config_info, FakeNvml, FakeVllm};
use ailb_tests::status::{backend, model_prefix};
use ailb_tests::{ailb_bin, base_config, preflight, run_cmd, wait_until, BackendCfg, CgroupGuard, Daemon};

const MODEL: &str = "onebox-7b";
const VIP: &str = "127.77.32.1:8000";
/// Sampled: GPUs 0 and 1 of the fake NVML, metrics from the fake vLLM.
const GPU_BACKEND: &str = "127.0.32.11:18321";
/// Sampled: metrics only (no NVML), a memory requirement-free model.
const METRICS_BACKEND: &str = "127.0.32.12:18322";

/// Two GPUs of 80 GiB; `used0` MiB used on the first, 10000 on the second.
fn state(used0: u64, extra: &str) -> String {
    format!(
        "count 2\n0 name NVIDIA A100-SXM4-80GB\n0 uuid GPU-0\n0 total_mb 81920\n0 used_mb {used0}\n0 util 30\n\
         1 name NVIDIA A100-SXM4-80GB\n1 uuid GPU-1\n1 total_mb 81920\n1 used_mb 10000\n1 util 50\n{extra}"
    )
}

/// (live, free_mem_mb) of a backend in the kernel maps (`ailb status` reads `AILB_BACKENDS`).
fn kernel(d: &Daemon, addr: &str) -> (bool, Option<u64>) {
    let st = d.status();
    let b = backend(&st, addr).unwrap_or_else(|| panic!("{addr} not in the maps: {st}"));
    (b["live"].as_bool().unwrap_or(false), b["free_mem_mb"].as_u64())
}

fn wait_kernel(d: &Daemon, addr: &str, want: (bool, Option<u64>), what: &str) {
    wait_until(what, Duration::from_secs(3), || (kernel(d, addr) == want).then_some(()));
}

#[test]
fn one_box_samples_its_gpus_and_servers_without_a_registry() {
    let bin = preflight();
    let cg = CgroupGuard::new("onebox");
    let vllm = FakeVllm::start();
    let other = FakeVllm::start();
    let nvml = FakeNvml::build(&state(20000, ""));
    let metrics = |v: &FakeVllm| format!("metrics_url = \"http://127.0.0.1:{}/metrics\"\n", v.port);
    let mut gpu = BackendCfg::new(MODEL, GPU_BACKEND, 1);
    gpu.extra =
        format!("{}health_url = \"http://127.0.0.1:{}/health\"\ngpus = [0, \"GPU-1\"]\n", metrics(&vllm), vllm.port);
    let mut plain = BackendCfg::new(MODEL, METRICS_BACKEND, 1);
    plain.extra = metrics(&other);
    let mut cfg = base_config("onebox", &cg).service(MODEL, VIP).backend(gpu).backend(plain);
    cfg.daemon_extra = format!("sample_interval = \"100ms\"\nnvml_library = \"{}\"\n", nvml.lib());
    let daemon = Daemon::start(&bin, &cfg);

    // Free: (81920 - 20000) + (81920 - 10000) = 133840 MiB, summed over the backend's GPUs.
    wait_kernel(&daemon, GPU_BACKEND, (true, Some(133_840)), "NVML's free memory in AILB_BACKENDS");
    // No GPUs and no KV capacity configured: memory unknown (fits every hint), still live.
    wait_kernel(&daemon, METRICS_BACKEND, (true, None), "the metrics-only backend live, memory unknown");

    // 1300 MiB more used: past the 512 MiB threshold, in the kernel within a few samples.
    let t0 = std::time::Instant::now();
    nvml.set(&state(21_300, ""));
    wait_kernel(&daemon, GPU_BACKEND, (true, Some(132_540)), "the new free memory in AILB_BACKENDS");
    eprintln!("a fake GPU's memory change reached AILB_BACKENDS in {:?} (sample_interval 100ms)", t0.elapsed());

    // NVML fails: the memory becomes unknown, the daemon goes on.
    nvml.set(&state(21_300, "fail memory\n"));
    wait_kernel(&daemon, GPU_BACKEND, (true, None), "memory unknown while NVML fails");
    nvml.set(&state(21_300, ""));
    wait_kernel(&daemon, GPU_BACKEND, (true, Some(132_540)), "memory back once NVML answers");

    // The model server's health fails: the backend leaves the table, then returns.
    vllm.set(|s| s.healthy = false);
    wait_kernel(&daemon, GPU_BACKEND, (false, Some(132_540)), "an unhealthy server out of the table");
    vllm.set(|s| s.healthy = true);
    wait_kernel(&daemon, GPU_BACKEND, (true, Some(132_540)), "the server healthy again, back in the table");
    let mut daemon = daemon;
    let log = daemon.log();
    assert!(log.contains("health_status"), "the exclusion is logged with its rule: {log}");
    assert!(daemon.is_running(), "{log}");
}

#[test]
fn gpus_without_an_nvml_library_stop_start_up_naming_the_backend() {
    let _ = preflight();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ailb.toml");
    // Never attaches: start-up stops before the cgroup or the maps are touched.
    std::fs::write(
        &path,
        format!(
            "[daemon]\nbpffs = \"/sys/fs/bpf/ailb-test-onebox-nonvml-{pid}\"\ncgroup = \"ailb-test-onebox-nonvml-{pid}\"\n\
             nvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n\
             [[services]]\nmodel = \"{MODEL}\"\nvip = \"{VIP}\"\n\
             [[backends]]\nmodel = \"{MODEL}\"\naddress = \"{GPU_BACKEND}\"\n\
             metrics_url = \"http://127.0.0.1:1/metrics\"\ngpus = [0]\n",
            pid = std::process::id()
        ),
    )
    .expect("write config");
    let out =
        run_cmd(std::process::Command::new(ailb_bin()).arg("run").arg("--config").arg(&path), Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("backend {MODEL} {GPU_BACKEND} names gpus")) && err.contains("no NVML library"),
        "{err}"
    );
    assert!(!std::path::Path::new(&format!("/sys/fs/bpf/ailb-test-onebox-nonvml-{}", std::process::id())).exists());
}

/// The kernel's prefix lifetime of `model`, ms (`ailb status`).
fn prefix_ttl_ms(d: &Daemon, model: &str) -> u64 {
    let p = model_prefix(&d.status(), model);
    p["ttl_ms"].as_u64().unwrap_or_else(|| panic!("no prefix.ttl_ms: {p}"))
}

#[test]
fn the_prefix_lifetime_follows_the_caches_fill_time() {
    let bin = preflight();
    let cg = CgroupGuard::new("onebox-fill");
    let (big, small) = (FakeVllm::start(), FakeVllm::start());
    // 4096 x 16 = 65,536 tokens at 10,000 tokens/s fill in 6.55 s; 2048 x 16 = 32,768 at
    // 16,384/s in 2 s. The slower sets the lifetime: 1.25 x 6.55 s = 8.19 s.
    big.set(|s| {
        s.extra = cache_config_info(4096);
        s.prompts = Some((std::time::Instant::now(), 10_000.0));
    });
    small.set(|s| {
        s.extra = cache_config_info(2048);
        s.prompts = Some((std::time::Instant::now(), 16_384.0));
    });
    let metrics = |v: &FakeVllm| format!("metrics_url = \"http://127.0.0.1:{}/metrics\"\n", v.port);
    let mut a = BackendCfg::new(MODEL, GPU_BACKEND, 1);
    a.extra = metrics(&big);
    let mut b = BackendCfg::new(MODEL, METRICS_BACKEND, 1);
    b.extra = metrics(&small);
    let mut cfg = base_config("onebox-fill", &cg).service(MODEL, VIP).backend(a).backend(b);
    cfg.daemon_extra = "sample_interval = \"100ms\"\n".into();
    cfg.extra = format!("[[models]]\nname = \"{MODEL}\"\nprefix = \"approximate\"\nprefix_ttl = \"60s\"\n");
    let daemon = Daemon::start(&bin, &cfg);

    let within = |lo: u64, hi: u64, what: &str| {
        wait_until(what, Duration::from_secs(5), || {
            let t = prefix_ttl_ms(&daemon, MODEL);
            (lo..=hi).contains(&t).then_some(t)
        })
    };
    let t = within(7_000, 9_500, "the lifetime at 1.25 x the bigger cache's fill time (8.19 s)");
    eprintln!("lifetime {t} ms from the fill times 6.55 s and 2 s");
    // The bigger cache is sent nothing now: it fills never and says nothing, the smaller one
    // sets the lifetime once the rate's counter is gone (1.25 x 2 s).
    big.set(|s| s.prompts = None);
    within(2_000, 3_000, "the lifetime at 1.25 x the smaller cache's fill time (2.5 s)");
    // No cache reports its capacity: the model's prefix_ttl.
    small.set(|s| s.extra.clear());
    within(60_000, 60_000, "the lifetime back at prefix_ttl");
    let mut daemon = daemon;
    assert!(daemon.is_running(), "{}", daemon.log());
}
