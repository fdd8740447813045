//! Each peer router of `ailb-compare` (sglang-router, vllm-router and SMG, from the venvs `cargo
//! xtask setup` installs) starts in front of a simulated GPU and routes the replay's requests to
//! it: text prompts, `X-Session-ID`, SSE streamed through. No root. Without a venv each of its
//! cases prints why it is skipped.

use std::net::{SocketAddrV4, TcpListener};
use std::time::Duration;

use ailb_sim::replay::client::send;
use ailb_sim::replay::RequestSpec;
use ailb_sim::{serve, GpuProfile, SimConfig};
use ailb_tools::compare::peers;
use ailb_tools::compare::policy::Policy;

/// A free loopback port (bound and released: the router binds it next).
fn free_addr() -> SocketAddrV4 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    match l.local_addr().expect("addr") {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("IPv4 expected, got {other}"),
    }
}

/// An A100 simulator at 100x on a loopback port, served by a runtime of its own for the
/// rest of the test process.
fn start_sim() -> SocketAddrV4 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the simulator");
    let std::net::SocketAddr::V4(addr) = listener.local_addr().expect("addr") else { panic!("IPv4 expected") };
    listener.set_nonblocking(true).expect("nonblocking");
    let cfg = SimConfig {
        profile: GpuProfile::preset("a100-80gb").expect("preset"),
        model: "sim-7b".into(),
        time_scale: 100.0,
        nvml_state: None,
        gpu_uuid: "GPU-peers-test".into(),
        sample_interval: Duration::from_millis(100),
        tokenizer: None,
        kv_events: None,
    };
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            serve(listener, cfg).await.expect("the simulator serves");
        });
    });
    addr
}

fn spec(index: usize, hash_ids: Vec<u64>, prompt_tokens: u32) -> RequestSpec {
    RequestSpec {
        index,
        line: None,
        at_ms: 0,
        conversation: "conv-7".into(),
        memory_mb: 0,
        prompt_tokens,
        max_tokens: 3,
        hash_ids,
        message_ends: Vec::new(),
        model: "sim-7b".into(),
        tag_socket: false,
        prefix_keys: false,
    }
}

#[test]
fn every_peer_router_starts_and_routes_to_a_simulator() {
    let policies = [
        Policy::SglangCacheAware,
        Policy::SglangRoundRobin,
        Policy::SmgCacheAware,
        Policy::SmgPrefixHash,
        Policy::SmgLeastLoad,
        Policy::VllmCacheAware,
        Policy::VllmConsistentHash,
    ];
    let mut ran = 0;
    for policy in policies {
        let venv = peers::venv_of(policy);
        if let Some(why) = peers::missing(policy, &venv) {
            eprintln!("skipped: {}: {why}", policy.title());
            continue;
        }
        let sim = start_sim();
        let dir = tempfile::tempdir().expect("tempdir");
        let (listen, metrics) = (free_addr(), free_addr());
        let router = peers::start(policy, &venv, listen, metrics, &[sim], dir.path())
            .unwrap_or_else(|e| panic!("{}: {e:#}", policy.title()));
        let first = send(listen, &spec(0, vec![0, 1, 2], 1500), Duration::from_secs(20));
        assert!(first.ok(), "{}: {first:?}", policy.title());
        assert_eq!(first.tokens, 3, "{}: {first:?}", policy.title());
        // The second prompt shares blocks 0 and 1 with the first: the simulator, which keys its
        // cache on the text the router passed on, finds them.
        let second = send(listen, &spec(1, vec![0, 1, 3], 1400), Duration::from_secs(20));
        assert!(second.ok(), "{}: {second:?}", policy.title());
        assert_eq!(second.cached_tokens, Some(1024), "{}: {second:?}", policy.title());
        drop(router);
        ran += 1;
    }
    if ran == 0 {
        let (routers, smg) = (peers::venv(), peers::smg_venv());
        eprintln!(
            "skipped: no peer router installed in {} or {} (cargo xtask setup)",
            routers.display(),
            smg.display()
        );
    }
}
