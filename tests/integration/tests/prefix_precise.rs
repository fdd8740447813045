//! Precise mode end to end, through the kernel: three `ailb-sim` servers tokenizing with the
//! tiny model's tokenizer and publishing their KV events (vLLM's format), `ailb run` with a
//! `prefix = "precise"` model following them into the kernel's prefix map, and `ailb gateway`
//! sending each chat's token-exact prefix keys (`prefix_keys = true`, the same tokenizer and
//! block size). Clients send no session header, and every user's question differs, so the
//! derived conversation keys differ: only the prefix map can keep a tenant's users together.
//!
//! - After a tenant's first chat, the engine that cached it reports its blocks; every later
//!   chat of the tenant goes to that engine (the kernel found its system prompt there);
//! - the kernel's counters say so, and the map holds what the engines hold: after a cache
//!   reset (`AllBlocksCleared`), no engine reports the prompt held, and its engine is named as
//!   an evicted holder.
//!
//! A second test evicts a prompt from a small engine: the map keeps the engine as an evicted
//! holder of it for the model's `prefix_ttl`, so that the prompt's next request still goes
//! there, and says that no engine reports it held.
//!
//! A third test sends a conversation's turns through the front door with kept connections:
//! only the turns that open a connection (a kernel pick) make prefix keys. A fourth sends a
//! conversation's later turns: each is keyed up to its new question, and the conversation so
//! far is found where its engine holds it; a later turn opens its connection with its keys
//! withheld, so the kernel asks for them where no affinity decides, and where the
//! conversation's affinity does, none are made.
//!
//! The first two send their requests one after another on fresh upstream connections (`upstream_reuse =
//! "never"`), so no holder is ever at its load bound: with kept connections counting in
//! flight for a moment after their answer, the bound may overrule the prefix, by design.
//!
//! Needs the tiny model of `cargo xtask setup` (or `AILB_TINY_MODEL_DIR`); reported skipped
//! without it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use ailb_tests::{
    base_config, http, preflight, report_skipped, sim::topic_messages, wait_until, BackendCfg, CgroupGuard, Daemon,
    GatewayProcess, SimServer,
};
use serde_json::{json, Value};

const TEST: &str = "tenants_follow_what_the_engines_report_cached";
const MODEL: &str = "tiny";
const VIP: &str = "127.77.19.1:8000";
const LISTEN: &str = "127.0.19.1:18190";
/// The daemon's `/metrics`.
const METRICS: &str = "127.0.19.1:18199";
const BACKENDS: [&str; 3] = ["127.0.19.11:18191", "127.0.19.12:18192", "127.0.19.13:18193"];
const TENANTS: usize = 3;
const PER_TENANT: usize = 8;
const WAIT: Duration = Duration::from_secs(20);

/// Tenant `t`'s chat for its user `u`: a long system prompt of its own, a question of the user's.
fn chat(t: usize, u: usize) -> Value {
    let system: Vec<String> = (0..300).map(|i| format!("rule{t}x{}", i % 40)).collect();
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": format!("You are tenant {t}'s assistant. {}", system.join(" "))},
        {"role": "user", "content": format!("user {u} of tenant {t} asks question number {u}")}]})
}

/// The value of `name{model="MODEL"}` in a `/metrics` text.
fn model_metric(metrics: &str, name: &str) -> u64 {
    let prefix = format!("{name}{{model=\"{MODEL}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {prefix} in /metrics:\n{metrics}")) as u64
}

/// The tiny model's folder as a string, or `None` with `test` reported skipped.
fn tiny_model(test: &str) -> Option<String> {
    let Some(dir) = ailb_tests::tiny_model_dir() else {
        report_skipped(test, "no tiny model (cargo xtask setup makes it, or set AILB_TINY_MODEL_DIR)");
        return None;
    };
    Some(dir.to_str().expect("a UTF-8 path").to_string())
}

fn prefix_status(daemon: &Daemon) -> Value {
    ailb_tests::status::model_prefix(&daemon.status(), MODEL)
}

#[test]
fn tenants_follow_what_the_engines_report_cached() {
    let Some(dir_s) = tiny_model(TEST) else { return };
    let bin = preflight();
    let cg = CgroupGuard::new("prefix-precise");
    let (sims, endpoints) = SimServer::start_publishing(&BACKENDS, MODEL, &dir_s, 16);
    let mut cfg = base_config("prefix-precise", &cg).service(MODEL, VIP);
    cfg.listen = Some(METRICS.to_string());
    for (addr, ep) in BACKENDS.iter().zip(&endpoints) {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(20000);
        b.extra = format!("kv_events = \"{ep}\"\nkv_block_size = 16\n");
        cfg = cfg.backend(b);
    }
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\n\n[gateway]\nlisten = [\"{LISTEN}\"]\nprefix_keys = true\nupstream_reuse = \"never\"\n\
         [gateway.tokenizers]\n\"{MODEL}\" = \"{dir_s}\"\n[gateway.kv_block_tokens]\n\"{MODEL}\" = 16\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = LISTEN.parse().expect("gateway address");
    let _gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, listen);

    let send = |t: usize, u: usize| -> String {
        let r = http::post_json(LISTEN, "/v1/chat/completions", &[], &chat(t, u));
        assert_eq!(r.status, 200, "tenant {t} user {u}: {}", r.body);
        r.header("x-ailb-backend").unwrap_or_else(|| panic!("no x-ailb-backend: {:?}", r.headers)).to_string()
    };
    let mut first = BTreeMap::new();
    for t in 0..TENANTS {
        first.insert(t, send(t, 0));
    }
    // The engines' events reach the kernel's map.
    wait_until("the prefix map to hold the engines' blocks", WAIT, || {
        prefix_status(&daemon)["entries"].as_u64().filter(|&e| e > 0)
    });
    let before = prefix_status(&daemon);
    let mut landed: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for u in 1..PER_TENANT {
        for t in 0..TENANTS {
            landed.entry(t).or_default().insert(send(t, u));
        }
    }
    let after = prefix_status(&daemon);
    eprintln!("first chats {first:?}; later {landed:?}; prefix before {before}, after {after}");
    for (t, backends) in &landed {
        assert_eq!(
            backends.iter().collect::<Vec<_>>(),
            vec![&first[t]],
            "tenant {t}: its later users must follow its first user's engine {}, which reported the system prompt cached",
            first[t]
        );
    }
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let later = ((PER_TENANT - 1) * TENANTS) as u64;
    assert_eq!(after["mode"], "precise");
    assert_eq!(n(&after, "used") - n(&before, "used"), later, "every later chat took its prefix's holder: {after}");
    assert_eq!(n(&after, "learned"), 0, "precise mode learns nothing from picks: {after}");
    // The daemon sets each stored block's bits in the filter in front of the map: a later
    // chat looks up one key of the map, the last it finds held (a key that tests positive
    // without being held may cost one more, rarely in a filter this empty).
    let map_lookups = n(&after, "map_lookups") - n(&before, "map_lookups");
    assert!((later..=later + 2).contains(&map_lookups), "{map_lookups} map lookups for {later} chats: {after}");

    // `/metrics` has the map's counters and the feed's.
    let (code, metrics) = http::get(METRICS, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{metrics}");
    let metric = |name: &str| model_metric(&metrics, name);
    assert_eq!(metric("ailb_prefix_used_total"), n(&after, "used"), "/metrics and ailb status agree");
    assert_eq!(metric("ailb_prefix_map_lookups_total"), n(&after, "map_lookups"), "on the map's lookups too");
    assert!(metric("ailb_kv_events_batches_total") > 0, "the feed's batches are counted");
    assert!(metric("ailb_kv_events_blocks_stored_total") > 0, "and the blocks they stored");
    assert!(metric("ailb_kv_events_keys_held") > 0, "and the keys held now");
    assert_eq!(metric("ailb_kv_events_malformed_total"), 0, "no malformed batch from the simulator");

    // The front door tokenized each tenant's system prompt once: its later users' prompts took
    // that segment's ids from the tokenizer's cache.
    let (code, front) = http::get(LISTEN, "/metrics").expect("GET the front door's /metrics");
    assert_eq!(code, 200, "{front}");
    let front_metric = |name: &str| model_metric(&front, name);
    let (cached, encoded) = (
        front_metric("ailb_gateway_tokenizer_tokens_cached_total"),
        front_metric("ailb_gateway_tokenizer_tokens_encoded_total"),
    );
    eprintln!("front door's tokenizer: {cached} tokens from its cache, {encoded} encoded");
    assert!(
        cached > encoded,
        "{later} later chats repeat {TENANTS} system prompts: most of their tokens come from the cache ({cached} cached, \
         {encoded} encoded)"
    );
    assert!(
        front_metric("ailb_gateway_tokenizer_segments_cached_total") >= later,
        "one system prompt segment per later chat"
    );
    assert!(front_metric("ailb_gateway_tokenizer_cache_bytes") > 0);
    // Every request opened a connection (`upstream_reuse = "never"`), so every one made its keys.
    assert_eq!(
        front_metric("ailb_gateway_prefix_keys_seconds_count"),
        (TENANTS * PER_TENANT) as u64,
        "the time to make each request's keys is measured"
    );

    // `ailb explain --request` runs the same pick over the pinned maps: a new user of tenant 0
    // goes to the holder of its system prompt, and says so.
    let v = explain(&bin, &daemon, &chat(0, 99));
    eprintln!("explain: {v}");
    let p = &v["conversation"]["prefix"];
    assert!(v["request"]["prefix_keys"].as_array().is_some_and(|k| !k.is_empty()), "keys shown: {v}");
    assert_eq!(p["usage"], "used", "explain's prefix step: {v}");
    assert!(n(p, "found") >= 1 && n(p, "found") < n(p, "sent"), "the system prompt held, not the question: {p}");
    assert_eq!(v["conversation"]["backend"].as_str(), Some(first[&0].as_str()), "explain's backend: {v}");
    assert!(p["holders"].as_array().is_some_and(|h| h.iter().any(|b| b == first[&0].as_str())), "holders: {p}");

    // A cache reset on the first tenant's engine (AllBlocksCleared): no engine reports tenant 0's
    // prompt held any longer; its engine stays its holder, as an evicted one.
    let target = &first[&0];
    let sim = sims.iter().find(|s| s.addr() == target.as_str()).expect("the engine that served tenant 0");
    let r = http::post_json(sim.addr(), "/reset_prefix_cache", &[], &json!({}));
    assert_eq!(r.status, 200, "reset: {}", r.body);
    let v = wait_until("the reset engine's blocks reported evicted", WAIT, || {
        let v = explain(&bin, &daemon, &chat(0, 99));
        (v["conversation"]["prefix"]["exact"] == false).then_some(v)
    });
    let p = &v["conversation"]["prefix"];
    assert_eq!(p["evicted"], json!([target]), "the reset engine named as an evicted holder: {v}");
    assert_eq!(v["conversation"]["backend"].as_str(), Some(target.as_str()), "tenant 0 still goes there: {v}");
}

/// A chat of `messages`.
fn chat_of(messages: &Value) -> Value {
    json!({"model": MODEL, "max_tokens": 1, "messages": messages})
}

/// `ailb explain --json --request` of the request `body` against `daemon`'s maps.
fn explain(bin: &std::path::Path, daemon: &Daemon, body: &Value) -> Value {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(body).expect("body")).expect("write the body");
    let out = ailb_tests::run_cmd(
        std::process::Command::new(bin).args(["explain", "--json", "--request"]).arg(file.path()).args([
            "--config".as_ref(),
            daemon.config_path().as_os_str(),
            "--bpffs".as_ref(),
            daemon.bpffs().as_os_str(),
        ]),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "ailb explain --request: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("explain --json")
}

#[test]
fn an_evicted_prompt_keeps_its_engine_as_a_weaker_holder() {
    const TEST: &str = "an_evicted_prompt_keeps_its_engine_as_a_weaker_holder";
    const SMALL: &str = "127.0.19.21:18195";
    const OTHER: &str = "127.0.19.22:18196";
    const FRONT: &str = "127.0.19.2:18197";
    let Some(dir_s) = tiny_model(TEST) else { return };
    let bin = preflight();
    let cg = CgroupGuard::new("prefix-evicted");
    // An engine whose cache holds two of these prompts: a third evicts the least recently used
    // (the first). The other engine holds nothing.
    let small_ep = format!("tcp://127.0.0.1:{}", ailb_tests::nacos::free_port());
    let small = SimServer::start_small(SMALL, MODEL, &dir_s, 16, &small_ep, None);
    let (_other, other_ep) = SimServer::start_publishing(&[OTHER], MODEL, &dir_s, 16);
    let mut cfg = base_config("prefix-evicted", &cg).service(MODEL, "127.77.19.2:8000");
    for (addr, ep) in [(SMALL, &small_ep), (OTHER, &other_ep[0])] {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(20000);
        b.extra = format!("kv_events = \"{ep}\"\nkv_block_size = 16\n");
        cfg = cfg.backend(b);
    }
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\nprefix_ttl = \"10m\"\n\n[gateway]\nlisten = [\"{FRONT}\"]\nprefix_keys = true\n\
         upstream_reuse = \"never\"\n\
         [gateway.tokenizers]\n\"{MODEL}\" = \"{dir_s}\"\n[gateway.kv_block_tokens]\n\"{MODEL}\" = 16\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let _gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, FRONT.parse().expect("an address"));
    let chat = |m: &Value| {
        let r = http::post_json(SMALL, "/v1/chat/completions", &[], &chat_of(m));
        assert_eq!(r.status, 200, "{}", r.body);
    };
    let (a, b, c) = (topic_messages("apples", 140), topic_messages("boats", 140), topic_messages("clouds", 140));
    // PUB drops what it sends before the subscription reaches it: chat until the map holds
    // the first prompt, whole.
    wait_until("the first prompt held whole by the small engine", WAIT, || {
        chat(&a);
        let v = explain(&bin, &daemon, &chat_of(&a));
        let p = &v["conversation"]["prefix"];
        (p["usage"] == "used" && p["found"] == p["sent"] && p["exact"] == true).then_some(())
    });
    chat(&b);
    chat(&c);
    // The small engine evicted the first prompt; its events say so.
    let v = wait_until("the first prompt reported evicted", WAIT, || {
        let v = explain(&bin, &daemon, &chat_of(&a));
        (v["conversation"]["prefix"]["exact"] == false).then_some(v)
    });
    eprintln!("explain after the eviction: {v}");
    let p = &v["conversation"]["prefix"];
    assert_eq!(p["usage"], "used", "an evicted holder still takes the prompt: {v}");
    assert_eq!(v["conversation"]["backend"], SMALL, "the prompt goes back where it was cached: {v}");
    assert_eq!(p["evicted"], json!([SMALL]), "named as evicted: {v}");
    assert_eq!(p["holders"], json!([SMALL]), "{v}");
    // The kernel's own pick, through the front door: the same holder, its keys found through
    // the evicted holder and counted apart from those an engine reports held.
    let before = prefix_status(&daemon);
    let r = http::post_json(FRONT, "/v1/chat/completions", &[], &chat_of(&a));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-ailb-backend"), Some(SMALL), "{:?}", r.headers);
    let after = prefix_status(&daemon);
    let d = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
    assert_eq!((d("lookups"), d("used")), (1, 1), "before {before}, after {after}");
    assert_eq!(d("keys_found"), p["sent"].as_u64().expect("sent"), "the whole prompt found: {after}");
    assert_eq!(d("keys_exact"), 0, "none of it reported held by an engine: {after}");
    // Stored again: exact again.
    wait_until("the first prompt held again", WAIT, || {
        let v = explain(&bin, &daemon, &chat_of(&a));
        (v["conversation"]["prefix"]["exact"] == true).then_some(())
    });
    drop(small);
}

/// A conversation's turn sent on the connection its previous turn kept involves no kernel pick,
/// so the front door makes no prefix keys for it: tokenizing is spent only where a pick uses it.
#[test]
fn a_turn_on_a_kept_connection_makes_no_prefix_keys() {
    const TEST: &str = "a_turn_on_a_kept_connection_makes_no_prefix_keys";
    const ENGINE: &str = "127.0.19.31:18185";
    const FRONT: &str = "127.0.19.3:18186";
    let Some(dir_s) = tiny_model(TEST) else { return };
    let bin = preflight();
    let cg = CgroupGuard::new("prefix-kept");
    let (_sims, endpoints) = SimServer::start_publishing(&[ENGINE], MODEL, &dir_s, 16);
    let mut b = BackendCfg::new(MODEL, ENGINE, 1).free_memory_mb(20000);
    b.extra = format!("kv_events = \"{}\"\nkv_block_size = 16\n", endpoints[0]);
    let mut cfg = base_config("prefix-kept", &cg).service(MODEL, "127.77.19.3:8000").backend(b);
    // Kept connections stay reusable for the whole test, whatever the machine's pace.
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\n\n[gateway]\nlisten = [\"{FRONT}\"]\nprefix_keys = true\n\
         upstream_reuse = \"conversation\"\nupstream_max_age = \"60s\"\n\
         [gateway.tokenizers]\n\"{MODEL}\" = \"{dir_s}\"\n[gateway.kv_block_tokens]\n\"{MODEL}\" = 16\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let _gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, FRONT.parse().expect("an address"));
    let mut messages = topic_messages("harbours", 60);
    let turns = 4;
    for turn in 0..turns {
        let r = http::post_json(FRONT, "/v1/chat/completions", &[("x-session-id", "kept-1")], &chat_of(&messages));
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        let Value::Array(list) = &mut messages else { panic!("messages are a list") };
        list.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        list.push(json!({"role": "user", "content": format!("and then question {turn}?")}));
    }
    let (code, front) = http::get(FRONT, "/metrics").expect("GET the front door's /metrics");
    assert_eq!(code, 200, "{front}");
    let line = |prefix: &str| -> u64 {
        front
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    let fresh = line("ailb_gateway_upstream_requests_total{reused=\"false\"} ");
    let kept = line("ailb_gateway_upstream_requests_total{reused=\"true\"} ");
    let made = model_metric(&front, "ailb_gateway_prefix_keys_seconds_count");
    // A later turn that had to open a connection withheld its keys, and the conversation's
    // affinity placed it without them.
    let placed = line(&withheld_line("placed"));
    eprintln!("{fresh} fresh connections, {kept} kept, keys made {made} times, {placed} placed without");
    assert_eq!(fresh + kept, turns, "every turn went upstream once");
    assert!(kept >= 1, "the later turns went on the connection the first kept: {fresh} fresh, {kept} kept");
    assert_eq!(made + placed, fresh, "keys are made for the fresh connections only, where the pick reads them");
}

/// The start of the front door's `/metrics` line counting connections opened with their keys
/// withheld that ended as `outcome`.
fn withheld_line(outcome: &str) -> String {
    format!("ailb_gateway_prefix_keys_withheld_total{{model=\"{MODEL}\",outcome=\"{outcome}\"}} ")
}

/// A conversation's later turn is keyed up to its new question: the conversation so far is
/// found where its engine holds it, the question's blocks send stand-in keys (held nowhere),
/// and the question goes into the front door's segment cache for the turn after, which then
/// finds it there. A later turn opens its connection with its keys withheld: sent under a
/// session the kernel has no affinity for, the kernel asks for them; under its conversation's
/// session, the affinity places it on its engine and no keys are made.
#[test]
fn a_later_turn_is_keyed_up_to_its_new_question() {
    const TEST: &str = "a_later_turn_is_keyed_up_to_its_new_question";
    const ENGINES: [&str; 2] = ["127.0.19.41:18181", "127.0.19.42:18182"];
    const FRONT: &str = "127.0.19.4:18183";
    let Some(dir_s) = tiny_model(TEST) else { return };
    let bin = preflight();
    let cg = CgroupGuard::new("prefix-later");
    let (_sims, endpoints) = SimServer::start_publishing(&ENGINES, MODEL, &dir_s, 16);
    let mut cfg = base_config("prefix-later", &cg).service(MODEL, "127.77.19.4:8000");
    for (addr, ep) in ENGINES.iter().zip(&endpoints) {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(20000);
        b.extra = format!("kv_events = \"{ep}\"\nkv_block_size = 16\n");
        cfg = cfg.backend(b);
    }
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\n\n[gateway]\nlisten = [\"{FRONT}\"]\nprefix_keys = true\n\
         upstream_reuse = \"never\"\n\
         [gateway.tokenizers]\n\"{MODEL}\" = \"{dir_s}\"\n[gateway.kv_block_tokens]\n\"{MODEL}\" = 16\n"
    );
    let daemon = Daemon::start(&bin, &cfg);
    let _gateway = GatewayProcess::start(&bin, daemon.config_path(), &cg, FRONT.parse().expect("an address"));
    let front_metric = |name: &str| {
        let (code, text) = http::get(FRONT, "/metrics").expect("GET the front door's /metrics");
        assert_eq!(code, 200, "{text}");
        model_metric(&text, name)
    };
    let withheld = |outcome: &str| {
        let (code, text) = http::get(FRONT, "/metrics").expect("GET the front door's /metrics");
        assert_eq!(code, 200, "{text}");
        let line = withheld_line(outcome);
        text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |v| v.trim().parse::<f64>().expect("a count") as u64)
    };
    // Each turn under a session of its own: the kernel has no affinity for it, as a gateway
    // that did not serve the earlier turns, so the prefix step places it.
    let send = |messages: &Value, session: &str| {
        let r = http::post_json(FRONT, "/v1/chat/completions", &[("x-session-id", session)], &chat_of(messages));
        assert_eq!(r.status, 200, "{session}: {}", r.body);
        r.header("x-ailb-backend").expect("the backend is named").to_string()
    };
    let first = topic_messages("lighthouses", 140);
    let engine = send(&first, "later-1");
    wait_until("the first turn held whole by its engine", WAIT, || {
        let p = explain(&bin, &daemon, &chat_of(&first))["conversation"]["prefix"].clone();
        (p["found"] == p["sent"] && p["exact"] == true).then_some(())
    });
    let mut second = first.clone();
    let question: Vec<String> = (0..200).map(|i| format!("why{}", i % 30)).collect();
    let Value::Array(list) = &mut second else { panic!("messages are a list") };
    list.push(json!({"role": "assistant", "content": "Lighthouses guide ships."}));
    list.push(json!({"role": "user", "content": question.join(" ")}));
    let v = explain(&bin, &daemon, &chat_of(&second));
    let p = &v["conversation"]["prefix"];
    let (found, sent) = (p["found"].as_u64().expect("found"), p["sent"].as_u64().expect("sent"));
    assert!(found >= 1 && found < sent, "the conversation so far found, its question not: {v}");
    assert_eq!((&p["usage"], &p["exact"]), (&json!("used"), &json!(true)), "{v}");
    assert_eq!(p["holders"], json!([engine]), "{v}");
    // Through the front door: the kernel finds the same prefix of the same keys.
    let before = prefix_status(&daemon);
    let encoded = front_metric("ailb_gateway_tokenizer_tokens_encoded_total");
    assert_eq!(send(&second, "later-2"), engine, "the second turn goes where the first is cached");
    let after = prefix_status(&daemon);
    let d = |k: &str| after[k].as_u64().unwrap_or(0) - before[k].as_u64().unwrap_or(0);
    assert_eq!((d("lookups"), d("used")), (1, 1), "before {before}, after {after}");
    assert_eq!((d("keys_found"), d("keys_sent")), (found, sent), "explain's keys: {after}");
    // The question is tokenized into the front door's cache (off the request's path), and the
    // third turn takes it from there.
    wait_until("the second turn's question in the front door's segment cache", WAIT, || {
        (front_metric("ailb_gateway_tokenizer_tokens_encoded_total") >= encoded + question.len() as u64).then_some(())
    });
    let mut third = second.clone();
    let Value::Array(list) = &mut third else { panic!("messages are a list") };
    list.push(json!({"role": "assistant", "content": "Because."}));
    list.push(json!({"role": "user", "content": "thanks"}));
    let encoded = front_metric("ailb_gateway_tokenizer_tokens_encoded_total");
    send(&third, "later-3");
    // The third turn encodes the second answer (and, once sent, its own short question): not
    // the second question's 200 words again.
    let again = front_metric("ailb_gateway_tokenizer_tokens_encoded_total") - encoded;
    assert!(again < question.len() as u64 / 2, "{again} tokens encoded for the third turn");
    // The second and third turns withheld their keys and were asked for them: no affinity.
    assert_eq!((withheld("asked"), withheld("placed")), (2, 0), "the later turns under new sessions");
    // The fourth under the third's session: the conversation's affinity places it on its
    // engine before any key, so none are made and the prefix map is not searched.
    let mut fourth = third.clone();
    let Value::Array(list) = &mut fourth else { panic!("messages are a list") };
    list.push(json!({"role": "assistant", "content": "You are welcome."}));
    list.push(json!({"role": "user", "content": "one more question about lighthouses"}));
    let made = front_metric("ailb_gateway_prefix_keys_seconds_count");
    let before = prefix_status(&daemon);
    assert_eq!(send(&fourth, "later-3"), engine, "the conversation's affinity keeps it on its engine");
    let after = prefix_status(&daemon);
    assert_eq!((withheld("asked"), withheld("placed")), (2, 1), "placed with its keys withheld");
    assert_eq!(front_metric("ailb_gateway_prefix_keys_seconds_count"), made, "no keys made for it");
    assert_eq!(after["lookups"], before["lookups"], "no prefix search: before {before}, after {after}");
}
