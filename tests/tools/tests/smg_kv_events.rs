//! The peer `smg-kv-events` of the real-engine race, end to end on one real vLLM for CPU server:
//! vLLM's gRPC server (SMG's servicer) publishing KV events, SMG `cache_aware` in front of it
//! with the race's command line, a prompt sent twice (the second a cache hit), SMG's index fed by
//! the engine's events, and the flush the race empties the caches with, checked.
//!
//! The server takes 2-3 minutes to start on 2 cores: one server, started once.

use std::net::{SocketAddrV4, TcpListener};
use std::time::Duration;

use ailb_tests::vllm::{self, Engine, Frontend};
use ailb_tools::compare::peers;
use ailb_tools::compare::policy::Policy;
use ailb_tools::compare::real::client::send;
use ailb_tools::compare::real::workload::RealRequest;
use ailb_tools::compare::real::{flush_through_router, smg_kv_events, wait_router_tokenizer};

fn free_addr() -> SocketAddrV4 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    match l.local_addr().expect("local addr") {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("not IPv4: {other}"),
    }
}

fn chat(question: &str) -> RealRequest {
    let system = vllm::filler(7, 400);
    RealRequest {
        body: serde_json::json!({
            "model": "tiny-llama",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true},
        }),
        session: None,
        tag_conversation: None,
        memory_mb: 0,
        tenant: None,
    }
}

#[test]
fn smg_routes_by_the_kv_events_of_a_real_vllm_grpc_server() {
    let engine = match Engine::find() {
        Ok(e) => e,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let policy = Policy::SmgKvEvents;
    let venv = peers::venv_of(policy);
    if let Some(why) = peers::missing(policy, &venv) {
        eprintln!("skipped: {}: {why}", policy.title());
        return;
    }
    // Setup installs the servicer with the engine: its absence here is a setup failure.
    engine.grpc_servicer().unwrap_or_else(|why| panic!("{why}"));
    let servers = vllm::start_servers_as(
        &engine,
        Frontend::Grpc,
        &["tiny-llama"],
        &["--max-model-len", "4096"],
        true,
        Duration::from_secs(600),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let (listen, metrics) = (free_addr(), free_addr());
    let mut argv = peers::args(policy, listen, metrics, &[format!("grpc://{}", servers[0].addr())]);
    argv.extend(["--model-path".to_string(), engine.model.display().to_string()]);
    let router = peers::start_with_args(policy, &venv, listen, argv, 1, dir.path())
        .unwrap_or_else(|e| panic!("SMG in front of a vLLM gRPC server: {e:#}"));
    wait_router_tokenizer(listen).unwrap_or_else(|e| panic!("{e:#}"));

    let first = send(listen, 0, &chat("What does the gateway do?"), Duration::from_secs(120));
    assert!(first.ok(), "{first:?}");
    let second = send(listen, 1, &chat("And what does the agent do?"), Duration::from_secs(120));
    assert!(second.ok(), "{second:?}");
    // The shared system prompt (about 800 tokens) is cached: at least one 128-token CPU block.
    assert!(second.cached_tokens.is_some_and(|c| c >= 128), "the second chat found no cached block: {second:?}");
    let (batches, blocks) = smg_kv_events(metrics).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(batches >= 1.0 && blocks >= 6.0, "SMG's index took in {batches} batches, {blocks} blocks");
    // The race's reset: SMG flushes the server, and the probe finds nothing cached after it.
    flush_through_router(listen, 1).unwrap_or_else(|e| panic!("{e:#}"));
    let again = send(listen, 2, &chat("What does the gateway do?"), Duration::from_secs(120));
    assert_eq!(again.cached_tokens, Some(0), "the chat sent before the flush is cached after it: {again:?}");
    drop(router);
}
