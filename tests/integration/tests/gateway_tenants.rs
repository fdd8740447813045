//! Tenants, priorities and the scheduler (`[[gateway.tenants]]`, `[gateway.scheduler]`) end to
//! end: the front door in a child cgroup in front of two `ailb-sim` servers declared with
//! 1000 MB free each (`[gateway.admission] mode = "fleet_memory"`: a limit of 2000 MB, four
//! requests of 500 MB). Tenants by API key (`Authorization: Bearer`): `alpha` (weight 3) and
//! `beta` (weight 1) up to priority 2, `batch` capped at 0, `metered` with a token rate.
//!
//! - **Rate**: `metered`'s second request in a row finds its bucket short: 429
//!   `tenant_rate_limited` with the `Retry-After` the bucket computes (curl), and the same in
//!   Anthropic's error shape on `/v1/messages`.
//! - **Priority**: with the fleet held by four streams, requests of priorities 0, 1 and 2 (the
//!   batch tenant asks for 2 and is capped at 0) wait, and are let through highest first as
//!   streams end.
//! - **Weights**: eight waiting requests of `alpha` and eight of `beta` in one band: of the
//!   first eight let through, `alpha` has about 3/4.
//! - **Shedding**: the queue (`max_queued` 16) full of batch requests, a priority-1 request
//!   takes the newest one's place (that one gets 429 `shed_for_priority` with `Retry-After`),
//!   and one more batch request is refused at once (429 `scheduler_queue_full`).
//! - The access log names each request's tenant and priority, and the metrics count them.
//! - A route passed through (`/tokenize`) reaches a backend of the model.
//!
//! And the same priority order over the in-flight admission (`mode = "inflight"`, two
//! requests at once per server by their `max_inflight`), which the scheduler consults the
//! same way.

#[expect(dead_code, reason = "the fleet-memory admission's own counters: its queue is the scheduler's here")]
mod gateway_async;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ailb_tests::nacos::free_port;
use ailb_tests::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MODEL: &str = "tenants-7b";
const VIP: &str = "127.77.43.1:8000";
const LISTEN: &str = "127.0.43.1:18430";
const BACKENDS: [&str; 2] = ["127.0.43.11:18431", "127.0.43.12:18432"];
/// The in-flight admission's front door and servers.
const LISTEN_INFLIGHT: &str = "127.0.43.2:18433";
const BACKENDS_INFLIGHT: [&str; 2] = ["127.0.43.13:18434", "127.0.43.14:18435"];
/// Each in-flight server's `max_inflight`: the fleet runs four at once, as the memory one does.
const CAP: u32 = 2;
const FREE_MB: u32 = 1000;
const NEED_MB: u32 = 500;
const MAX_QUEUED: usize = 16;

/// SHA-256 of `key` as `sha256sum` prints it.
fn sha256(key: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s '{key}' | sha256sum")])
        .output()
        .unwrap_or_else(|e| panic!("sha256sum: {e}"));
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

/// The front door on `listen` with the admission table `admission` (its body).
fn gateway_toml(listen: &str, admission: &str) -> String {
    format!(
        "[gateway]\nlisten = [\"{listen}\"]\nadmission_retry_after = \"3s\"\n\
         [gateway.admission]\n{admission}\
         [gateway.scheduler]\nmax_queued = {MAX_QUEUED}\nmax_queued_per_tenant = {MAX_QUEUED}\nmax_wait = \"30s\"\n\
         [[gateway.tenants]]\nname = \"alpha\"\napi_key_sha256 = [\"{}\"]\nweight = 3\nmax_priority = 2\n\
         [[gateway.tenants]]\nname = \"beta\"\napi_key_sha256 = [\"{}\"]\nweight = 1\nmax_priority = 2\n\
         [[gateway.tenants]]\nname = \"batch\"\napi_key_sha256 = [\"{}\"]\nmax_priority = 0\n\
         [[gateway.tenants]]\nname = \"metered\"\napi_key_sha256 = [\"{}\"]\ntokens_per_second = 10.0\n\
         burst_tokens = 100.0\n",
        sha256("key-alpha"),
        sha256("key-beta"),
        sha256("key-batch"),
        sha256("key-metered"),
    )
}

/// A chat request of `key`'s tenant at `priority`, 500 MB, closing its connection after.
fn request(key: &str, priority: u8, tag: &str, max_tokens: u32, stream: bool) -> String {
    let req = gateway_async::chat_request(MODEL, tag, max_tokens, stream, NEED_MB);
    req.replacen(
        "Host: gw\r\n",
        &format!("Host: gw\r\nAuthorization: Bearer {key}\r\nX-Ailb-Priority: {priority}\r\n"),
        1,
    )
}

/// Opens a stream of `alpha` at priority 2 and reads until its first token (it then holds its
/// 500 MB until dropped).
async fn hold(listen: &str) -> TcpStream {
    let mut s = TcpStream::connect(listen).await.expect("connect to the gateway");
    s.write_all(request("key-alpha", 2, "holder", 4000, true).as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("chat.completion.chunk") {
        let n = s.read(&mut buf).await.expect("read the stream");
        assert!(n > 0, "the holder's stream ended early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    s
}

async fn fill(listen: &str) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..(2 * FREE_MB / NEED_MB) {
        held.push(hold(listen).await);
    }
    held
}

/// A gauge or counter line's value in a metrics page (0 when absent).
fn value(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).unwrap_or(0.0) as u64
}

fn tenant_series(name: &str, tenant: &str, priority: u8, outcome: Option<&str>) -> String {
    match outcome {
        Some(o) => format!("{name}{{tenant=\"{tenant}\",priority=\"{priority}\",outcome=\"{o}\"}} "),
        None => format!("{name}{{tenant=\"{tenant}\",priority=\"{priority}\"}} "),
    }
}

/// Polls the metrics (5 s at most) until `n` requests wait in the scheduler, all together.
async fn wait_for_queued(listen: &str, n: u64) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let m = gateway_async::metrics(listen).await;
        let waiting: u64 = m
            .lines()
            .filter(|l| l.starts_with("ailb_gateway_tenant_waiting{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if waiting == n {
            return;
        }
        assert!(std::time::Instant::now() < until, "{n} requests never waited (now {waiting}): {m}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends a short request and records `label` in `order` when answered 200.
fn waiter(
    listen: &'static str,
    order: &Arc<Mutex<Vec<String>>>,
    key: &'static str,
    priority: u8,
    label: String,
) -> tokio::task::JoinHandle<String> {
    let order = order.clone();
    tokio::spawn(async move {
        let answer = gateway_async::exchange_raw(listen, &request(key, priority, &label, 1, false)).await;
        if answer.starts_with("HTTP/1.1 200") {
            order.lock().unwrap().push(label);
        }
        answer
    })
}

/// `curl -i` of a small request of `key`'s tenant to `path`: the head and body.
fn curl(key: &str, path: &str, body: &str) -> String {
    let out = Command::new("curl")
        .args(["-sS", "-i", "-X", "POST", &format!("http://{LISTEN}{path}")])
        .args(["-H", &format!("Authorization: Bearer {key}"), "-H", "Content-Type: application/json"])
        .args(["-d", body])
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_body(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("a JSON body ({e}): {answer}"))
}

/// With the fleet full, batch asks for priority 2 and gets 0, then beta waits at 1 and alpha
/// at 2; as one of the held streams ends, they go highest first. Returns the streams still
/// held.
async fn highest_priority_first(listen: &'static str) -> Vec<TcpStream> {
    let mut held = fill(listen).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = vec![waiter(listen, &order, "key-batch", 2, "batch-0".into())];
    wait_for_queued(listen, 1).await;
    tasks.push(waiter(listen, &order, "key-beta", 1, "beta-1".into()));
    wait_for_queued(listen, 2).await;
    tasks.push(waiter(listen, &order, "key-alpha", 2, "alpha-2".into()));
    wait_for_queued(listen, 3).await;
    held.pop();
    for t in tasks {
        let answer = t.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    assert_eq!(*order.lock().unwrap(), ["alpha-2", "beta-1", "batch-0"], "highest priority first");
    held
}

#[test]
fn priorities_order_the_queue_over_the_in_flight_admission_too() {
    let bin = preflight();
    let cg = CgroupGuard::new("gw-tenants-inflight");
    let _sims: Vec<SimServer> =
        BACKENDS_INFLIGHT.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "1"])).collect();
    let mut cfg = base_config("gw-tenants-inflight", &cg).service(MODEL, VIP);
    for addr in BACKENDS_INFLIGHT {
        let mut b = BackendCfg::new(MODEL, addr, 1);
        b.max_inflight = Some(CAP);
        cfg = cfg.backend(b);
    }
    // The in-flight admission reads the members' caps from the daemon's plan.
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = gateway_toml(LISTEN_INFLIGHT, "mode = \"inflight\"\n");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN_INFLIGHT.parse().unwrap();
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);
    gateway.wait_for_log("gateway: admission per model on");
    assert_eq!(2 * CAP, 2 * FREE_MB / NEED_MB, "both fleets run as many at once, which fill() holds");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        drop(highest_priority_first(LISTEN_INFLIGHT).await);
        let m = gateway_async::metrics(LISTEN_INFLIGHT).await;
        assert_eq!(value(&m, "ailb_gateway_scheduler_inversions_total "), 0, "{m}");
    });
}

#[test]
fn tenants_share_a_saturated_fleet_by_priority_and_weight_and_are_shed_and_rate_limited_with_429() {
    let name = "tenants_share_a_saturated_fleet_by_priority_and_weight_and_are_shed_and_rate_limited_with_429";
    if !Command::new("sh")
        .args(["-c", "command -v curl && command -v sha256sum"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return ailb_tests::report_skipped(name, "curl and sha256sum are needed (command -v found none)");
    }
    let bin = preflight();
    let cg = CgroupGuard::new("gw-tenants");
    let _sims: Vec<SimServer> = BACKENDS.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "1"])).collect();
    let mut cfg = base_config("gw-tenants", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1).free_memory_mb(FREE_MB));
    }
    cfg.listen = Some(format!("127.0.0.1:{}", free_port()));
    cfg.extra = gateway_toml(LISTEN, "mode = \"fleet_memory\"\nmax_wait = \"30s\"\nreserve = 0.0\n");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN.parse().unwrap();
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);
    gateway.wait_for_log("admission per model by fleet memory on");

    // Rate: 100 tokens of burst at 10/s; a request with max_tokens 90 costs 91 or 92.
    let body = format!(r#"{{"model":"{MODEL}","max_tokens":90,"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let first = curl("key-metered", "/v1/chat/completions", &body);
    assert!(first.starts_with("HTTP/1.1 200"), "the bucket is full: {first}");
    let second = curl("key-metered", "/v1/chat/completions", &body);
    let head = second.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 429"), "over its rate: {second}");
    let retry: u32 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("Retry-After: {second}"));
    // 9 tokens left after the first, refilled at 10/s while it was answered: 91 are there
    // within ceil(82 / 10) = 9 s at most.
    assert!((1..=9).contains(&retry), "the bucket's Retry-After: {retry} s ({second})");
    let e = json_body(&second);
    assert_eq!(e["error"]["code"], "tenant_rate_limited", "{e}");
    assert!(e["error"]["message"].as_str().unwrap_or("").contains("tenant `metered`"), "{e}");
    let msg = format!(r#"{{"model":"{MODEL}","max_tokens":90,"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let anthropic = curl("key-metered", "/v1/messages", &msg);
    let e = json_body(&anthropic);
    assert!(anthropic.starts_with("HTTP/1.1 429"), "{anthropic}");
    assert_eq!((&e["type"], &e["error"]["type"]), (&"error".into(), &"rate_limit_error".into()), "{e}");

    // A route the front door passes through (vLLM's /tokenize) reaches a backend of the model,
    // whatever the simulated server answers for it.
    let tokenize = curl("key-alpha", "/tokenize", &format!(r#"{{"model":"{MODEL}","prompt":"hi"}}"#));
    assert!(tokenize.to_ascii_lowercase().contains("x-ailb-backend: 127.0.43.1"), "passed through: {tokenize}");

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut held = highest_priority_first(LISTEN).await;

        // Weights: 8 + 8 waiting in band 1; the fleet holds four at once. It has room for one
        // (three held): filled again first, so that all sixteen wait.
        held.push(hold(LISTEN).await);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..8 {
            tasks.push(waiter(LISTEN, &order, "key-alpha", 1, format!("alpha-{i}")));
            tasks.push(waiter(LISTEN, &order, "key-beta", 1, format!("beta-{i}")));
        }
        wait_for_queued(LISTEN, 16).await;
        drop(held.drain(..));
        for t in tasks {
            let answer = t.await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        let order = order.lock().unwrap().clone();
        let alpha_first = order[..8].iter().filter(|l| l.starts_with("alpha")).count();
        // 3:1 gives 6 of 8; each admission is exact to one request, four run at once.
        assert!((5..=7).contains(&alpha_first), "alpha's share of the first 8 by weight 3:1: {order:?}");

        // Shedding: 16 batch requests fill the queue; a priority-1 request evicts the newest.
        let mut held = fill(LISTEN).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let batch: Vec<_> =
            (0..MAX_QUEUED).map(|i| waiter(LISTEN, &order, "key-batch", 0, format!("batch-{i}"))).collect();
        wait_for_queued(LISTEN, MAX_QUEUED as u64).await;
        let high = waiter(LISTEN, &order, "key-beta", 1, "beta-high".into());
        let mut shed = None;
        for _ in 0..500 {
            if let Some(i) = batch.iter().position(|t| t.is_finished()) {
                shed = Some(i);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut batch = batch;
        let answer = batch.remove(shed.expect("a batch request is shed within 5 s")).await.unwrap();
        let head = answer.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 429") && head.contains("retry-after: 3"), "{answer}");
        assert_eq!(json_body(&answer)["error"]["code"], "shed_for_priority", "{answer}");
        let refused = gateway_async::exchange_raw(LISTEN, &request("key-batch", 0, "late", 1, false)).await;
        assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
        assert_eq!(json_body(&refused)["error"]["code"], "scheduler_queue_full", "{refused}");
        // One stream ends: room for one, which goes to the higher band.
        held.pop();
        assert!(high.await.unwrap().starts_with("HTTP/1.1 200"));
        drop(held.drain(..));
        for t in batch {
            assert!(t.await.unwrap().starts_with("HTTP/1.1 200"));
        }
        assert_eq!(order.lock().unwrap()[0], "beta-high", "the higher band first");

        let m = gateway_async::metrics(LISTEN).await;
        let count =
            |t: &str, p: u8, o: &str| value(&m, &tenant_series("ailb_gateway_tenant_requests_total", t, p, Some(o)));
        assert_eq!(count("batch", 0, "shed_evicted"), 1, "{m}");
        assert_eq!(count("batch", 0, "shed_queue_full"), 1, "{m}");
        assert_eq!(count("metered", 1, "rate_limited"), 2, "{m}");
        assert_eq!(count("beta", 1, "queued"), 10, "{m}");
        assert_eq!(value(&m, "ailb_gateway_scheduler_inversions_total "), 0, "{m}");
        assert!(value(&m, &tenant_series("ailb_gateway_tenant_wait_seconds_count", "alpha", 1, None)) >= 8, "{m}");
    });
    let log = gateway.log();
    assert!(log.contains("tenant=\"alpha\"") || log.contains("tenant=alpha"), "the access log names tenants:\n{log}");
    assert!(log.contains("queued_ms"), "and the wait:\n{log}");
    assert!(!log.contains("key-alpha"), "API keys never appear in the log");
}
