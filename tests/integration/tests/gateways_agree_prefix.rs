//! Gateways that agree on what the engines hold: three `ailb run` daemons (each its own pin
//! directory, child cgroup and front door; the same config and seed otherwise) follow the same
//! three `ailb-sim` engines' KV events (vLLM's format, the tiny model's tokenizer) in precise
//! mode. They never talk to each other. Workload: tenants with long system prompts, every
//! request a different user's question, no session header, spread over the three front
//! doors in turn.
//!
//! For each of 1,000 requests, before it is served, each daemon's kernel is asked for its pick
//! with the tags the front door sends (model, derived conversation key, token-exact prefix
//! keys): a connection tagged so, from a probe client in that daemon's cgroup, closed once
//! connected. At least 99 % of the requests must get the same backend from all three. That
//! alone would hold without the prefix map (the tables are deterministic), so the prefix must
//! also have decided: on every daemon most picks took a holder of the longest cached prefix,
//! and each tenant's requests stay on few backends.
//!
//! What can differ, and the test prints: a request probed while one daemon has applied an
//! engine's latest batch and another has not yet (milliseconds), and local in-flight counts
//! (each daemon counts only its own connections, so under load one may find a holder at its
//! load bound while another does not). The requests here are sent one at a time on fresh
//! upstream connections, so the load bound plays no part; docs/multi-gateway.md says what an
//! operator should expect under load.
//!
//! Needs the tiny model of `cargo xtask setup` (or `AILB_TINY_MODEL_DIR`); reported skipped
//! without it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ailb_tests::client::{ProbeTags, Prober};
use ailb_tests::{
    base_config, client_bin, http, preflight, report_skipped, wait_until, BackendCfg, CgroupGuard, Daemon,
    GatewayProcess, SimServer, TestClient, TestConfig,
};
use serde_json::{json, Value};

const TEST: &str = "three_gateways_on_one_engine_fleet_agree_on_prefixes";
const MODEL: &str = "tiny";
const VIP: &str = "127.77.32.1:8000";
const BACKENDS: [&str; 3] = ["127.0.32.11:18321", "127.0.32.12:18322", "127.0.32.13:18323"];
const GATEWAYS: [(&str, &str); 3] = [
    ("agree-prefix-a", "127.0.32.1:18301"),
    ("agree-prefix-b", "127.0.32.2:18302"),
    ("agree-prefix-c", "127.0.32.3:18303"),
];
const SEED: u64 = 0x5eed_0b12;
const TENANTS: usize = 10;
const REQUESTS: usize = 1000;
const REQUIRED_AGREEMENT_PCT: f64 = 99.0;
/// Of the picks after each tenant's first request, at least this share must take a prefix
/// holder on every daemon: the prefix map, not the table, decided.
const REQUIRED_PREFIX_USED_PCT: f64 = 90.0;
const WAIT: Duration = Duration::from_secs(30);

/// Tenant `t`'s system prompt: about 1,500 tokens of its own.
fn system_prompt(t: usize) -> String {
    let words: Vec<String> = (0..300).map(|i| format!("rule{t}x{}", i % 40)).collect();
    format!("You are tenant {t}'s assistant. {}", words.join(" "))
}

fn chat(t: usize, u: usize) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": system_prompt(t)},
        {"role": "user", "content": format!("user {u} of tenant {t} asks question number {u}")}]})
}

/// The tenant of request `i`: a fixed pseudo-random order (xorshift), so tenants interleave.
fn tenant_order(n: usize) -> Vec<usize> {
    let mut x: u64 = SEED;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % TENANTS as u64) as usize
        })
        .collect()
}

fn prefix_status(daemon: &Daemon) -> Value {
    ailb_tests::status::model_prefix(&daemon.status(), MODEL)
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Every daemon's config: only the pin directory, the cgroup and the front door's address
/// differ.
fn gateway_config(name: &str, listen: &str, cg: &CgroupGuard, endpoints: &[String], tokenizer: &str) -> TestConfig {
    let mut cfg = base_config(name, cg).service(MODEL, VIP);
    cfg.seed = SEED;
    for (addr, ep) in BACKENDS.iter().zip(endpoints) {
        let mut b = BackendCfg::new(MODEL, addr, 1).free_memory_mb(20000);
        b.extra = format!("kv_events = \"{ep}\"\nkv_block_size = 16\n");
        cfg = cfg.backend(b);
    }
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nprefix = \"precise\"\n\n[gateway]\nlisten = [\"{listen}\"]\nprefix_keys = true\n\
         upstream_reuse = \"never\"\n[gateway.tokenizers]\n\"{MODEL}\" = \"{tokenizer}\"\n\
         [gateway.kv_block_tokens]\n\"{MODEL}\" = 16\n"
    );
    cfg
}

type Loaded = (ailb_userspace::config::ValidConfig, ailb_userspace::config::gateway::ValidGateway);

/// The tags the front door sends for `body` (the same code as `ailb gateway`).
fn front_door_tags((valid, gw): &Loaded, body: &Value) -> ProbeTags {
    let bytes = serde_json::to_vec(body).expect("body");
    let r =
        ailb_userspace::gateway::routing_inputs(valid, gw, "/v1/chat/completions", &hyper::HeaderMap::new(), &bytes)
            .unwrap_or_else(|e| panic!("routing inputs: {}", e.message));
    assert!(!r.prefix_keys.is_empty(), "the front door sends prefix keys for a chat of {MODEL}");
    ProbeTags {
        model: Some(r.inputs.model),
        conversation: r.inputs.conversation.map(|c| c.key),
        memory_mb: r.inputs.memory_mb,
        keys: r.prefix_keys,
    }
}

#[test]
fn three_gateways_on_one_engine_fleet_agree_on_prefixes() {
    let Some(dir) = ailb_tests::tiny_model_dir() else {
        report_skipped(TEST, "no tiny model (cargo xtask setup makes it, or set AILB_TINY_MODEL_DIR)");
        return;
    };
    let dir_s = dir.to_str().expect("a UTF-8 path").to_string();
    let bin = preflight();
    let started = Instant::now();
    let (_sims, endpoints) = SimServer::start_publishing(&BACKENDS, MODEL, &dir_s, 16);
    let cgs: Vec<CgroupGuard> = GATEWAYS.iter().map(|(name, _)| CgroupGuard::new(name)).collect();
    let daemons: Vec<Daemon> = GATEWAYS
        .iter()
        .zip(&cgs)
        .map(|((name, listen), cg)| Daemon::start(&bin, &gateway_config(name, listen, cg, &endpoints, &dir_s)))
        .collect();
    let _front_doors: Vec<GatewayProcess> = GATEWAYS
        .iter()
        .zip(&cgs)
        .zip(&daemons)
        .map(|(((_, listen), cg), d)| {
            let addr: SocketAddr = listen.parse().expect("front door address");
            GatewayProcess::start(&bin, d.config_path(), cg, addr)
        })
        .collect();
    let client = TestClient::new(client_bin!());
    let mut probers: Vec<Prober> = cgs.iter().map(|cg| client.prober(Some(cg), VIP)).collect();
    eprintln!("3 engines, 3 daemons, 3 front doors up in {:?}", started.elapsed());

    let loaded: Loaded = ailb_userspace::gateway::load(Some(daemons[0].config_path())).expect("the config loads");
    let order = tenant_order(REQUESTS);
    let mut agree = 0usize;
    let mut disagreements: Vec<String> = Vec::new();
    let mut served_as_probed = 0usize;
    let mut seen_tenant: BTreeSet<usize> = BTreeSet::new();
    let mut by_tenant: BTreeMap<usize, BTreeMap<String, usize>> = BTreeMap::new();
    let before: Vec<Value> = daemons.iter().map(prefix_status).collect();
    let run = Instant::now();
    for (i, &t) in order.iter().enumerate() {
        let body = chat(t, i);
        let tags = front_door_tags(&loaded, &body);
        let picks: Vec<String> = probers
            .iter_mut()
            .enumerate()
            .map(|(g, p)| {
                p.pick(&tags).unwrap_or_else(|e| panic!("request {i}: gateway {}'s probe: {e}", GATEWAYS[g].0))
            })
            .collect();
        if picks.iter().all(|p| *p == picks[0]) {
            agree += 1;
        } else if disagreements.len() < 20 {
            disagreements.push(format!("request {i} (tenant {t}): {picks:?}"));
        }
        // Served through the front doors in turn.
        let g = i % GATEWAYS.len();
        let first = !seen_tenant.contains(&t);
        let entries: Vec<u64> =
            if first { daemons.iter().map(|d| n(&prefix_status(d), "entries")).collect() } else { Vec::new() };
        let r = http::post_json(GATEWAYS[g].1, "/v1/chat/completions", &[], &body);
        assert_eq!(r.status, 200, "request {i} through {}: {}", GATEWAYS[g].0, r.body);
        let backend = r.header("x-ailb-backend").unwrap_or_else(|| panic!("no x-ailb-backend: {:?}", r.headers));
        served_as_probed += usize::from(backend == picks[g]);
        if first {
            seen_tenant.insert(t);
            // A tenant's first request: its system prompt's blocks must reach every daemon
            // before its next request can find them there (the only wait of the run; later
            // requests overlap the events of their predecessors, as in production).
            wait_until("the first chat's blocks in every daemon's prefix map", WAIT, || {
                daemons.iter().zip(&entries).all(|(d, e)| n(&prefix_status(d), "entries") > *e).then_some(())
            });
        } else {
            *by_tenant.entry(t).or_default().entry(backend.to_string()).or_default() += 1;
        }
    }
    let took = run.elapsed();
    let after: Vec<Value> = daemons.iter().map(prefix_status).collect();
    let pct = ailb_tests::percent(agree, REQUESTS);
    eprintln!(
        "{agree}/{REQUESTS} requests ({pct:.2} %) got the same backend from all three daemons in {took:?}; \
         {served_as_probed} served where their front door's daemon had said"
    );
    for d in &disagreements {
        eprintln!("  differs: {d}");
    }
    let later = (REQUESTS - seen_tenant.len()) as u64;
    for (g, (b, a)) in before.iter().zip(&after).enumerate() {
        let used = n(a, "used") - n(b, "used");
        let lookups = n(a, "lookups") - n(b, "lookups");
        eprintln!(
            "daemon {}: entries {}, lookups {lookups}, used {used} (of {later} later requests, probes and front door \
             both count), overruled_load {}, learned {}",
            GATEWAYS[g].0,
            n(a, "entries"),
            n(a, "overruled_load") - n(b, "overruled_load"),
            n(a, "learned")
        );
        assert_eq!(n(a, "learned"), 0, "precise mode learns nothing from picks: {a}");
        // Each request is probed once on each daemon; a third of them is also served through it.
        let probes_used_floor = (later as f64 * REQUIRED_PREFIX_USED_PCT / 100.0) as u64;
        assert!(
            used >= probes_used_floor,
            "daemon {}: only {used} prefix-routed picks for {later} later requests (want at least \
             {REQUIRED_PREFIX_USED_PCT} %): the prefix map did not decide",
            GATEWAYS[g].0
        );
    }
    for (t, backends) in &by_tenant {
        eprintln!("tenant {t}: later requests served by {backends:?}");
        let top = backends.values().max().copied().unwrap_or(0);
        let total: usize = backends.values().sum();
        assert!(
            ailb_tests::percent(top, total) >= REQUIRED_PREFIX_USED_PCT,
            "tenant {t}: its later requests spread over {backends:?}: the system prompt's holder did not keep them"
        );
    }
    assert!(
        pct >= REQUIRED_AGREEMENT_PCT,
        "only {pct:.2} % of {REQUESTS} requests got the same backend from all three daemons (want at least \
         {REQUIRED_AGREEMENT_PCT} %): {disagreements:?}"
    );
    // The maps themselves: once the engines are quiet, every daemon holds the same entries.
    wait_until("the three prefix maps to hold as many entries", WAIT, || {
        let e: Vec<u64> = daemons.iter().map(|d| n(&prefix_status(d), "entries")).collect();
        e.iter().all(|x| *x == e[0]).then_some(e)
    });
}
