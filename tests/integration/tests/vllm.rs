//! ailb in front of real engines: two vLLM for CPU servers with the tiny model (what
//! `cargo xtask setup` installs under `~/.cache/ailb/`), started once for this binary and
//! checked in turn:
//! - their `/metrics` carry every name the agent reads by default for vLLM, with the KV
//!   capacity in `vllm:cache_config_info`;
//! - `ailb agent` samples one of them and publishes its load and free KV memory to rnacos, a
//!   Nacos-fed `ailb run` puts it in the kernel table with that memory, and a request running on
//!   it shows in the published `current_requests`;
//! - the one-box `ailb run` (static backends with `metrics_url`, no registry) samples the same;
//! - the front door in front of both: chat and completions, streamed and not; a multi-turn chat
//!   with no header stays on one server, whose own `vllm:prefix_cache_hits_total` shows the
//!   second turn read the first turn's prompt from the cache; completions sharing a long prefix
//!   go to one server and the second is read from its cache; a client that disconnects
//!   mid-stream takes the request off the server (`vllm:num_requests_running` back to 0);
//! - precise prefix mode on the servers' own KV events (each publishes on ports of its own):
//!   `ailb run` follows them into the kernel's prefix map (`kv_block_size` = the servers' real
//!   block size), the front door sends token-exact keys of the tiny model's tokenizer; a
//!   tenant's first long chat grows the map by its full blocks, its later chats (other users'
//!   questions, no session header) go to the server that holds its system prompt, and
//!   `/reset_prefix_cache` on that server (`AllBlocksCleared`) leaves it only as an evicted
//!   holder: the feed no longer counts its keys, and the tenant's next chat still goes there,
//!   its prompt found but none of it counted as held by an engine.
//!
//! What the simulator got wrong about a real server is written down in `docs/engines.md`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ailb_tests::http::{post_json, OpenStream, Reply};
use ailb_tests::nacos::{free_port, RnacosServer};
use ailb_tests::status::backend;
use ailb_tests::vllm::{
    agent_config, filler, start_servers_with, Engine, VllmServer, KV_BYTES_PER_TOKEN, KV_CACHE_GIB,
};
use ailb_tests::{base_config, preflight, report_skipped, wait_until, BackendCfg, CgroupGuard, Daemon, GatewayProcess};
use serde_json::{json, Value};

const MODEL: &str = "tiny-llama";
/// The free KV memory of an idle server: its whole cache, MiB.
const IDLE_KV_MB: u64 = KV_CACHE_GIB as u64 * 1024;

#[test]
fn real_vllm_servers_behind_ailb() {
    let engine = match Engine::find() {
        Ok(e) => e,
        Err(why) => return report_skipped("real_vllm_servers_behind_ailb", &why),
    };
    let bin = preflight();
    let t0 = Instant::now();
    // `/reset_prefix_cache` is one of vLLM's development endpoints; the servers inherit this.
    std::env::set_var("VLLM_SERVER_DEV_MODE", "1");
    let servers = start_servers_with(&engine, &[MODEL, MODEL], &[], true, Duration::from_secs(420));
    eprintln!("two vLLM servers ready {:.1}s after the first spawn", t0.elapsed().as_secs_f64());

    the_metrics_the_agent_reads_are_there(&servers[0]);
    // First, while the servers' caches are empty: the map's growth is then the first chat's.
    let t = Instant::now();
    precise_prefix_follows_the_servers_kv_events(&bin, &engine, &servers);
    eprintln!("precise prefix on real KV events checked in {:.1}s", t.elapsed().as_secs_f64());
    one_box_and_the_front_door(&bin, &servers);
    the_agent_publishes_a_real_server_and_the_table_follows(&bin, &servers[0]);
    eprintln!("all checks against real vLLM done in {:.1}s", t0.elapsed().as_secs_f64());
}

fn the_metrics_the_agent_reads_are_there(s: &VllmServer) {
    let text = s.metrics();
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(ailb_tests::vllm::metric_sum(&text, name).is_some(), "no {name} in vLLM's /metrics:\n{text}");
    }
    // vLLM for CPU uses 128-token blocks (the GPU build's default is 16): read, not assumed.
    let block =
        s.cache_config("block_size").unwrap_or_else(|| panic!("no block_size in vllm:cache_config_info:\n{text}"));
    let blocks = s.cache_config("num_gpu_blocks").unwrap_or_else(|| panic!("no num_gpu_blocks:\n{text}"));
    eprintln!("vLLM's KV cache: {blocks} blocks of {block} tokens");
    assert_eq!(blocks * block * KV_BYTES_PER_TOKEN, IDLE_KV_MB << 20, "the KV cache is {blocks} x {block} tokens");
}

/// The instance's metadata in rnacos, if listed.
fn published(nacos: &RnacosServer, port: u16) -> Option<Value> {
    let path = format!("/nacos/v1/ns/instance/list?serviceName={MODEL}&healthyOnly=false");
    let (status, body) = ailb_tests::nacos::http_request(nacos.http_port, "GET", &path, &[]).ok()?;
    let v: Value = serde_json::from_slice(&body).ok().filter(|_| status == 200)?;
    v["hosts"].as_array()?.iter().find(|h| h["port"] == port).map(|h| h["metadata"].clone())
}

fn meta_num(meta: &Value, key: &str) -> Option<f64> {
    meta[key].as_str()?.parse().ok()
}

fn the_agent_publishes_a_real_server_and_the_table_follows(bin: &Path, s: &VllmServer) {
    let nacos = RnacosServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, agent_config(s, MODEL, &nacos.url(), free_port(), "250ms")).expect("agent config");
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let mut agent = std::process::Command::new(bin)
        .args(["agent", "--config"])
        .arg(&cfg)
        .env("AILB_LOG", "info")
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("spawning ailb agent");
    let agent_log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let guard = KillOnDrop(&mut agent);

    let meta = ailb_sim::poll::wait_until_or(
        "the agent to publish the real server's load and KV memory",
        Duration::from_secs(20),
        || {
            let m = published(&nacos, s.port())?;
            (m["memory_source"] == "kv_cache" && m["current_requests"].is_string()).then_some(m)
        },
        || format!("published: {:?}\nagent log:\n{}", published(&nacos, s.port()), agent_log()),
    );
    eprintln!("published for a real vLLM: {meta}");
    assert_eq!(meta_num(&meta, "current_requests"), Some(0.0), "{meta}");
    assert_eq!(meta_num(&meta, "queue_length"), Some(0.0), "{meta}");
    let usage = meta_num(&meta, "kv_cache_usage").unwrap_or_else(|| panic!("kv_cache_usage: {meta}"));
    assert!((0.0..0.05).contains(&usage), "an idle server's KV usage: {meta}");
    let mb = meta_num(&meta, "remaining_memory_mb").unwrap_or_else(|| panic!("remaining_memory_mb: {meta}"));
    assert!((IDLE_KV_MB as f64 * 0.95..=IDLE_KV_MB as f64).contains(&mb), "free KV memory of an idle server: {meta}");

    // A Nacos-fed gateway node puts the instance in the kernel table with that memory.
    let cg = CgroupGuard::new("vllm-nacos");
    let mut dcfg = base_config("vllm-nacos", &cg);
    dcfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"127.77.31.9:8000\"]\n\n[discovery]\nsource = \"nacos\"\n\
         [discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(bin, &dcfg);
    let row = wait_until("the real server live in the Nacos-fed table", Duration::from_secs(10), || {
        backend(&daemon.status(), &s.addr()).filter(|b| b["live"] == true).cloned()
    });
    assert_eq!(row["free_mem_mb"].as_u64(), Some(mb as u64), "the kernel's free memory is the published one: {row}");

    // A request running on the server shows in what the agent publishes, and goes away.
    let mut stream = OpenStream::start(&s.addr(), "/v1/completions", &long_stream_body(&filler(7, 40)));
    let _ = stream.read_events(2);
    wait_until("current_requests 1 published while a request runs", Duration::from_secs(10), || {
        published(&nacos, s.port()).and_then(|m| (meta_num(&m, "current_requests") == Some(1.0)).then_some(()))
    });
    drop(stream);
    wait_until("current_requests back to 0 once the client left", Duration::from_secs(15), || {
        published(&nacos, s.port()).and_then(|m| (meta_num(&m, "current_requests") == Some(0.0)).then_some(()))
    });
    drop(daemon);
    drop(guard);
    eprintln!("agent log tail:\n{}", tail(&agent_log(), 10));
}

/// Kills the agent (our child, by pid) on drop, also when the test panics first.
struct KillOnDrop<'a>(&'a mut std::process::Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A streamed completion that runs for seconds: thousands of tokens, EOS ignored (the tiny
/// model's random weights could stop at any point).
fn long_stream_body(prompt: &str) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 3000, "ignore_eos": true, "stream": true})
}

fn one_box_and_the_front_door(bin: &Path, servers: &[VllmServer]) {
    let cg = CgroupGuard::new("vllm-front");
    let vip = "127.77.31.1:8000";
    let listen = "127.0.31.1:18031";
    let mut cfg = base_config("vllm-front", &cg).service(MODEL, vip);
    for s in servers {
        let mut b = BackendCfg::new(MODEL, &s.addr(), 1);
        b.extra = format!(
            "metrics_url = \"http://{a}/metrics\"\nhealth_url = \"http://{a}/health\"\nkv_bytes_per_token = {KV_BYTES_PER_TOKEN}\n",
            a = s.addr()
        );
        cfg = cfg.backend(b);
    }
    cfg.daemon_extra = "sample_interval = \"200ms\"\n".to_string();
    cfg.extra = format!("[gateway]\nlisten = [\"{listen}\"]\n");
    let daemon = Daemon::start(bin, &cfg);

    // One box: the daemon samples both servers itself, no registry.
    for s in servers {
        let row = wait_until("the one-box daemon to sample a real server", Duration::from_secs(10), || {
            backend(&daemon.status(), &s.addr()).filter(|b| b["live"] == true && b["free_mem_mb"].is_u64()).cloned()
        });
        let mb = row["free_mem_mb"].as_u64().unwrap_or(0);
        assert!(mb * 100 >= IDLE_KV_MB * 95 && mb <= IDLE_KV_MB, "free KV memory sampled by ailb run: {row}");
    }

    let addr: SocketAddr = listen.parse().expect("listen address");
    let gateway = GatewayProcess::start(bin, daemon.config_path(), &cg, addr);
    let names: BTreeSet<String> = servers.iter().map(VllmServer::addr).collect();
    let by_addr = |a: &str| servers.iter().find(|s| s.addr() == a).unwrap_or_else(|| panic!("no server {a}"));
    let served_by = |r: &Reply| -> String {
        let b = r.header("x-ailb-backend").unwrap_or_else(|| panic!("no x-ailb-backend: {r:?}")).to_string();
        assert!(names.contains(&b), "x-ailb-backend {b} is not one of {names:?}");
        b
    };

    // Chat and completions, streamed and not.
    let chat = |messages: Value, stream: bool| -> Reply {
        post_json(
            listen,
            "/v1/chat/completions",
            &[],
            &json!({"model": MODEL, "messages": messages, "max_tokens": 16, "stream": stream}),
        )
    };
    let r = chat(json!([{"role": "user", "content": "hello there"}]), false);
    assert_eq!(r.status, 200, "{r:?}\n{}", gateway.log());
    served_by(&r);
    let body = r.json();
    assert!(body["choices"][0]["message"]["content"].is_string(), "{body}");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{body}");
    let r = chat(json!([{"role": "user", "content": "hello again"}]), true);
    assert_eq!(r.status, 200, "{r:?}");
    served_by(&r);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")), "{r:?}");
    let events = r.sse_data();
    assert!(events.len() > 2 && events.last().map(String::as_str) == Some("[DONE]"), "{events:?}");
    for streamed in [false, true] {
        let r = post_json(
            listen,
            "/v1/completions",
            &[],
            &json!({"model": MODEL, "prompt": "once upon a time", "max_tokens": 16, "stream": streamed}),
        );
        assert_eq!(r.status, 200, "completions (stream {streamed}): {r:?}");
        served_by(&r);
        if streamed {
            assert_eq!(r.sse_data().last().map(String::as_str), Some("[DONE]"), "{r:?}");
        } else {
            assert!(r.json()["choices"][0]["text"].is_string(), "{r:?}");
        }
    }

    // A multi-turn chat with no header: every turn on one server; the second turn reads the
    // first turn's prompt from that server's prefix cache.
    let block = servers[0].cache_config("block_size").expect("block_size");
    let system = filler(1, 1500);
    let mut messages =
        vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": filler(2, 40)})];
    let mut used = BTreeSet::new();
    let mut first_prompt = 0;
    for turn in 0..4 {
        let before: Vec<f64> = servers.iter().map(|s| s.must("vllm:prefix_cache_hits_total")).collect();
        let r = chat(Value::Array(messages.clone()), false);
        assert_eq!(r.status, 200, "turn {turn}: {r:?}");
        let at = served_by(&r);
        used.insert(at.clone());
        let body = r.json();
        let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        let i = servers.iter().position(|s| s.addr() == at).expect("a server");
        let hits = by_addr(&at).must("vllm:prefix_cache_hits_total") - before[i];
        eprintln!("turn {turn} on {at}: {prompt} prompt tokens, {hits} read from the cache");
        if turn == 0 {
            first_prompt = prompt;
            assert!(prompt > 1000, "the system prompt is long: {prompt} tokens");
        } else {
            // Whole blocks of the first prompt (the last, partial block is not cached).
            let want = (first_prompt / block) * block;
            assert!(hits >= want as f64, "turn {turn}: {hits} tokens from the cache, want at least {want}");
        }
        let reply = body["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": filler(10 + turn, 12)}));
    }
    assert_eq!(used.len(), 1, "a 4-turn chat with no header went to {used:?}");

    // Completions sharing a long prefix: the front door keys them by that prefix, so they meet
    // on one server and the second reads it from the cache.
    let prefix = filler(3, 1200);
    let mut at = Vec::new();
    for (k, suffix) in ["first question?", "a second, different question?"].iter().enumerate() {
        let before: Vec<f64> = servers.iter().map(|s| s.must("vllm:prefix_cache_hits_total")).collect();
        let r = post_json(
            listen,
            "/v1/completions",
            &[],
            &json!({"model": MODEL, "prompt": format!("{prefix} {suffix}"), "max_tokens": 8}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        let a = served_by(&r);
        let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        let i = servers.iter().position(|s| s.addr() == a).expect("a server");
        let hits = servers[i].must("vllm:prefix_cache_hits_total") - before[i];
        eprintln!("shared-prefix completion {k} on {a}: {prompt} prompt tokens, {hits} from the cache");
        if k == 1 {
            assert!(hits >= (prompt as f64) * 0.8, "the second request read {hits} of {prompt} tokens from the cache");
        }
        at.push(a);
    }
    assert_eq!(at[0], at[1], "two completions sharing a 1,200-word prefix went to different servers");

    // A client that disconnects mid-stream: the server stops the request.
    let mut stream = OpenStream::start(listen, "/v1/completions", &long_stream_body("tell me a long story"));
    let seen = stream.read_events(3);
    let b = seen
        .iter()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-ailb-backend:").map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no x-ailb-backend in {seen:?}"));
    let s = by_addr(&b);
    assert!(s.must("vllm:num_requests_running") >= 1.0, "the streamed request runs on {b}");
    let t = Instant::now();
    drop(stream);
    wait_until("vLLM to drop the request once its client left", Duration::from_secs(15), || {
        (s.must("vllm:num_requests_running") == 0.0).then_some(())
    });
    eprintln!("vLLM stopped the abandoned request {:.2}s after the client closed", t.elapsed().as_secs_f64());
    assert!(gateway.log().lines().all(|l| !l.contains("panicked")), "{}", gateway.log());
    drop(gateway);
    drop(daemon);
}

/// The model's `prefix` object in `ailb status`.
fn prefix_status(daemon: &Daemon) -> Value {
    let status = daemon.status();
    status["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == MODEL))
        .map(|m| m["prefix"].clone())
        .unwrap_or_else(|| panic!("no model {MODEL} in status: {status}"))
}

/// Tenant `t`'s chat for its user `u`: a long system prompt of its own (several blocks), a
/// question of the user's.
fn tenant_chat(t: u64, u: u64) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": format!("You are tenant {t}'s assistant. {}", filler(100 + t, 700))},
        {"role": "user", "content": format!("user {u} of tenant {t} asks: {}", filler(1000 + 10 * t + u, 12))}]})
}

fn precise_prefix_follows_the_servers_kv_events(bin: &Path, engine: &Engine, servers: &[VllmServer]) {
    const TENANTS: u64 = 2;
    const LATER: u64 = 3;
    let wait = Duration::from_secs(20);
    let block = servers[0].cache_config("block_size").expect("block_size in vllm:cache_config_info");
    let dir = engine.model.to_str().expect("a UTF-8 model path");
    let cg = CgroupGuard::new("vllm-precise");
    let vip = "127.77.31.2:8000";
    let listen = "127.0.31.2:18032";
    // The daemon's `/metrics`: the feed's count of the keys the servers report held.
    let metrics = "127.0.31.2:18033";
    let mut cfg = base_config("vllm-precise", &cg).service(MODEL, vip);
    cfg.listen = Some(metrics.to_string());
    for s in servers {
        let kv = s.kv_events().expect("the servers publish KV events");
        let mut b = BackendCfg::new(MODEL, &s.addr(), 1).free_memory_mb(20000);
        b.extra = format!(
            "kv_events = \"{}\"\nkv_replay = \"{}\"\nkv_block_size = {block}\n",
            kv.endpoint(),
            kv.replay_endpoint()
        );
        cfg = cfg.backend(b);
    }
    // Fresh upstream connections: a kept one counts in flight for a moment after its answer,
    // and the load bound may then overrule the prefix, by design.
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\n\n[gateway]\nlisten = [\"{listen}\"]\nprefix_keys = true\n\
         upstream_reuse = \"never\"\n[gateway.tokenizers]\n\"{MODEL}\" = \"{dir}\"\n[gateway.kv_block_tokens]\n\"{MODEL}\" = {block}\n"
    );
    let daemon = Daemon::start(bin, &cfg);
    let addr: SocketAddr = listen.parse().expect("listen address");
    let gateway = GatewayProcess::start(bin, daemon.config_path(), &cg, addr);
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let send = |t: u64, u: u64| -> (String, u64) {
        let r = post_json(listen, "/v1/chat/completions", &[], &tenant_chat(t, u));
        assert_eq!(r.status, 200, "tenant {t} user {u}: {r:?}\n{}", gateway.log());
        let at = r.header("x-ailb-backend").unwrap_or_else(|| panic!("no x-ailb-backend: {r:?}")).to_string();
        (at, r.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0))
    };
    assert_eq!(n(&prefix_status(&daemon), "entries"), 0, "nothing cached yet: {}", prefix_status(&daemon));

    // The blocks a chat stores: each full block's token prefix, by the server's own tokenizer
    // (`/tokenize` renders the chat template as a chat request does); the map holds one entry
    // per distinct prefix (a block key names its whole prefix).
    let prefixes = |t: u64, u: u64| -> Vec<Vec<u64>> {
        let mut body = tenant_chat(t, u);
        body.as_object_mut().expect("an object").remove("max_tokens");
        let r = post_json(&servers[0].addr(), "/tokenize", &[], &body);
        assert_eq!(r.status, 200, "/tokenize: {r:?}");
        let ids: Vec<u64> = r.json()["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_u64).collect();
        (1..=ids.len() as u64 / block).map(|b| ids[..(b * block) as usize].to_vec()).collect()
    };
    let mut held: Vec<(String, BTreeSet<Vec<u64>>)> = Vec::new();
    let expect = |held: &Vec<(String, BTreeSet<Vec<u64>>)>, skip: Option<&str>| -> u64 {
        let all: BTreeSet<&Vec<u64>> =
            held.iter().filter(|(at, _)| Some(at.as_str()) != skip).flat_map(|(_, p)| p.iter()).collect();
        all.len() as u64
    };

    // Each tenant's first chat: the server that runs it reports its full blocks stored, and
    // the daemon writes one entry per block.
    let mut first = Vec::new();
    for t in 0..TENANTS {
        let (at, prompt) = send(t, 0);
        let p = prefixes(t, 0);
        assert_eq!(prompt / block, p.len() as u64, "tenant {t}: /tokenize and the chat agree on the prompt");
        assert!(p.len() >= 4, "tenant {t}'s chat is several blocks: {prompt} tokens");
        held.push((at.clone(), p.into_iter().collect()));
        let want = expect(&held, None);
        wait_until("the daemon to write the first chat's blocks", wait, || {
            Some(n(&prefix_status(&daemon), "entries")).filter(|&e| e == want)
        });
        eprintln!("tenant {t}'s first chat on {at}: {prompt} prompt tokens; prefix entries now {want}");
        first.push(at);
    }
    let before = prefix_status(&daemon);
    for u in 1..=LATER {
        for t in 0..TENANTS {
            let (at, _) = send(t, u);
            assert_eq!(
                at, first[t as usize],
                "tenant {t} user {u}: must follow the server that reported its system prompt cached"
            );
            held.push((at, prefixes(t, u).into_iter().collect()));
        }
    }
    let want = expect(&held, None);
    wait_until("the map to hold the later chats' blocks too", wait, || {
        Some(n(&prefix_status(&daemon), "entries")).filter(|&e| e == want)
    });
    let after = prefix_status(&daemon);
    eprintln!("prefix before the later chats {before}; after {after}");
    let later = TENANTS * LATER;
    assert_eq!(after["mode"], "precise");
    assert_eq!(n(&after, "used") - n(&before, "used"), later, "every later chat took its prefix's holder: {after}");
    assert_eq!(n(&after, "learned"), 0, "precise mode learns nothing from picks: {after}");
    // The front door's token keys are the daemon's keys of the engine's own token ids.
    assert!(n(&after, "keys_found") > n(&before, "keys_found"), "{after}");

    // A cache reset on tenant 0's server. vLLM queues `AllBlocksCleared` and publishes it with
    // the batch of its next scheduler step, so a short request (less than a block: nothing
    // stored) makes it go out.
    let target = servers.iter().find(|s| s.addr() == first[0]).expect("tenant 0's server");
    // It refuses (`"success": false`) while any block is in use: every request has finished.
    let r = post_json(&target.addr(), "/reset_prefix_cache", &[], &json!({}));
    assert!(r.status == 200 && r.body.replace(' ', "").contains("\"success\":true"), "reset: {r:?}");
    let r =
        post_json(&target.addr(), "/v1/completions", &[], &json!({"model": MODEL, "prompt": "hi", "max_tokens": 1}));
    assert_eq!(r.status, 200, "{r:?}");
    // The feed then holds only the other server's keys; the map keeps the reset server as an
    // evicted holder of its blocks (for the model's `prefix_ttl`), so its entries stay.
    let want = expect(&held, Some(&first[0]));
    let entries = n(&prefix_status(&daemon), "entries");
    wait_until("the feed to hold the other server's keys, and only those", wait, || {
        // The daemon serves one model: the series has one label set.
        let (code, text) = ailb_tests::http::get(metrics, "/metrics").ok()?;
        let held = ailb_tests::sim::metric_value(&text, "ailb_kv_events_keys_held")?;
        (code == 200 && held as u64 == want).then_some(())
    });
    assert_eq!(n(&prefix_status(&daemon), "entries"), entries, "evicted holders stay in the map");
    // Tenant 0's next chat goes back to its server, through the evicted holder: the kernel
    // finds its prompt and counts none of it as held by an engine.
    let before = prefix_status(&daemon);
    let (at, _) = send(0, LATER + 1);
    let after = prefix_status(&daemon);
    assert_eq!(at, first[0], "tenant 0 goes back to the server it was cached on: {after}");
    assert_eq!(n(&after, "used") - n(&before, "used"), 1, "{after}");
    assert!(n(&after, "keys_found") > n(&before, "keys_found"), "its prompt found: {after}");
    assert_eq!(n(&after, "keys_exact"), n(&before, "keys_exact"), "none of it reported held: {after}");
    eprintln!(
        "after the reset of {}: the feed holds {want} keys (the other server's); {entries} entries",
        target.addr()
    );
    let log = daemon.log();
    for bad in ["kv event batch skipped", "not replayable", "answer skipped"] {
        assert!(!log.contains(bad), "the daemon logged {bad:?} following real vLLM:\n{log}");
    }
    drop(gateway);
    drop(daemon);
}
