//! The real-engine race's vLLM servers: their start, their counters, the prefix-cache reset
//! before each policy (checked by a probe that must hit before it and miss after it), and the
//! wait until they run and queue nothing.

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use ailb_tests::vllm::{self, metric_sum, Engine, Frontend, VllmServer};
use anyhow::{bail, Context};

use super::client;
use super::workload::RealRequest;
use super::MODEL;
use crate::compare::args::Args;

/// Starts `--servers` vLLM servers for CPU serving the tiny model as [`MODEL`] behind
/// `frontend`, with `--max-model-len` and `--kv-blocks`, publishing KV events when `kv_events`;
/// the OpenAI servers also with their development endpoints on (`/reset_prefix_cache`) and the
/// prompt tokens' details. Waits until they are ready. Returns them and when their start began.
pub(super) fn start(args: &Args, engine: &Engine, frontend: Frontend, kv_events: bool) -> (Vec<VllmServer>, Instant) {
    // The launcher adds its own variables to this process's environment, which the servers
    // inherit: this one turns on vLLM's development endpoints, `/reset_prefix_cache` among them.
    std::env::set_var("VLLM_SERVER_DEV_MODE", "1");
    let len = args.max_model_len.to_string();
    let blocks = args.kv_blocks.to_string();
    let mut extra = vec!["--max-model-len", &len];
    if frontend == Frontend::OpenAi {
        // An OpenAI server's flag (the gRPC server's answers carry the cached tokens anyway).
        extra.push("--enable-prompt-tokens-details");
    }
    if args.kv_blocks > 0 {
        extra.extend(["--num-gpu-blocks-override", &blocks]);
    }
    eprintln!(
        "ailb-compare: starting {} vLLM {}server(s) for CPU with {} (100-520 s on 2 cores, depending on what else runs)...",
        args.servers,
        if frontend == Frontend::Grpc { "gRPC " } else { "" },
        engine.model.display()
    );
    let names = vec![MODEL; args.servers];
    let t0 = Instant::now();
    let servers = vllm::start_servers_as(engine, frontend, &names, &extra, kv_events, Duration::from_secs(600));
    (servers, t0)
}

/// The counters of one server now: (prefix-cache queried tokens, hit tokens, requests finished,
/// running + waiting requests).
pub(super) fn counters(s: &VllmServer) -> anyhow::Result<(f64, f64, f64, f64)> {
    let text = match ailb_tests::http::get(&s.addr(), "/metrics") {
        Ok((200, body)) => body,
        other => bail!("GET /metrics from vLLM on {}: {other:?}", s.addr()),
    };
    let m = |name: &str| {
        metric_sum(&text, name).with_context(|| format!("no {name} in the /metrics of vLLM on {}", s.addr()))
    };
    Ok((
        m("vllm:prefix_cache_queries_total")?,
        m("vllm:prefix_cache_hits_total")?,
        m("vllm:request_success_total")?,
        m("vllm:num_requests_running")? + m("vllm:num_requests_waiting")?,
    ))
}

/// The probe of the reset: text no workload shares a block with (other words than theirs).
fn probe() -> RealRequest {
    let text: String = (0..300).map(|i| format!("probe{} ", i % 97)).collect();
    RealRequest {
        body: serde_json::json!({
            "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "stream": true, "stream_options": {"include_usage": true},
        }),
        session: None,
        tag_conversation: None,
        memory_mb: 0,
        tenant: None,
    }
}

/// Empties the prefix caches of `servers` gRPC servers through the SMG in front of them, which
/// has no other way in: its `POST /flush_cache` asks every worker (retried while one refuses with
/// requests in flight), and must report all of them flushed. Checked as the OpenAI servers'
/// reset is, except that SMG picks the server: the probe, sent until one answer is a hit (at most
/// 4 times: SMG may divert a hit to a server it thinks thin), must find nothing cached after the
/// flush.
pub fn flush_through_router(router: SocketAddrV4, servers: usize) -> anyhow::Result<()> {
    wait_router_tokenizer(router)?;
    let probe_cached = || -> anyhow::Result<u64> {
        let rec = client::send(router, 0, &probe(), Duration::from_secs(60));
        if !rec.ok() {
            bail!("the flush probe through SMG on {router} failed: {rec:?}");
        }
        rec.cached_tokens.with_context(|| format!("the answer through SMG on {router} carried no cached_tokens"))
    };
    let mut hit = false;
    for _ in 0..4 {
        if probe_cached()? > 0 {
            hit = true;
            break;
        }
    }
    if !hit {
        bail!("the probe sent 4 times through SMG on {router} was never a hit: the check of the flush could not fail");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = post_empty(&router.to_string(), "/flush_cache")?;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && v["status"] == "success" && v["workers_flushed"].as_u64() == Some(servers as u64) {
            break;
        }
        if Instant::now() >= deadline {
            bail!("SMG on {router}: /flush_cache kept failing (want {servers} workers flushed): {status} {body}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let cached = probe_cached()?;
    if cached != 0 {
        bail!("SMG on {router}: after /flush_cache the probe still found {cached} cached tokens");
    }
    Ok(())
}

/// Waits until SMG in front of gRPC servers answers a chat, 60 s at most: it lists its workers
/// healthy before it has loaded the tokenizer it needs for them, and answers 503
/// `tokenizer_not_ready` until then.
pub fn wait_router_tokenizer(router: SocketAddrV4) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rec = client::send(router, 0, &probe(), Duration::from_secs(60));
        if rec.ok() {
            return Ok(());
        }
        let loading =
            rec.status == Some(503) && rec.error.as_deref().is_some_and(|e| e.contains("tokenizer_not_ready"));
        if !loading || Instant::now() >= deadline {
            bail!("SMG on {router} did not answer a chat (its tokenizer loaded) within 60 s: {rec:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Sends the probe to `s` directly; returns its cached tokens by the answer and by the
/// server's hit counter.
fn send_probe(s: &VllmServer) -> anyhow::Result<(u64, f64)> {
    let addr: SocketAddrV4 = s.addr().parse().context("server address")?;
    let before = counters(s)?.1;
    let rec = client::send(addr, 0, &probe(), Duration::from_secs(60));
    if !rec.ok() {
        bail!("the reset probe to vLLM on {} failed: {rec:?}", s.addr());
    }
    let cached = rec.cached_tokens.with_context(|| format!("vLLM on {} answered no cached_tokens", s.addr()))?;
    Ok((cached, counters(s)?.1 - before))
}

/// Waits until `s` runs and queues nothing (60 s at most), empties its prefix cache with `POST
/// /reset_prefix_cache` (retried while blocks are still held) and checks that a prompt cached
/// before is no longer a hit.
pub(super) fn reset_and_check(s: &VllmServer) -> anyhow::Result<()> {
    wait_idle(std::slice::from_ref(s), Duration::from_secs(60))?;
    send_probe(s)?;
    let (cached, hits) = send_probe(s)?;
    if cached == 0 || hits <= 0.0 {
        bail!(
            "vLLM on {}: the probe sent twice was no hit the second time ({cached} cached, {hits} hit tokens)",
            s.addr()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = post_empty(&s.addr(), "/reset_prefix_cache")?;
        if status == 404 {
            bail!("vLLM on {} has no /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1 not in effect?)", s.addr());
        }
        if status == 200 && body.replace(' ', "").contains("\"success\":true") {
            break;
        }
        if Instant::now() >= deadline {
            bail!("vLLM on {}: /reset_prefix_cache kept failing: {status} {body}", s.addr());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let (cached, hits) = send_probe(s)?;
    if cached != 0 || hits != 0.0 {
        bail!("vLLM on {}: after /reset_prefix_cache the probe still found {cached} ({hits}) cached tokens", s.addr());
    }
    Ok(())
}

/// `POST path` with no body; the status and body.
fn post_empty(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).with_context(|| format!("reading POST {path} from {addr}"))?;
    let r = ailb_tests::http::parse_reply(&raw).map_err(|e| anyhow::anyhow!("POST {path} to {addr}: {e}"))?;
    Ok((r.status, r.body))
}

/// Waits until `servers` run and queue nothing, `limit` at most.
pub(super) fn wait_idle(servers: &[VllmServer], limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let mut busy = 0.0;
        for s in servers {
            busy += counters(s)?.3;
        }
        if busy == 0.0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the vLLM servers still had {busy} requests running or waiting after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
