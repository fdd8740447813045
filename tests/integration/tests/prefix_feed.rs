//! The daemon's precise prefix feed against a live engine look-alike: `ailb-sim` tokenizing
//! with the tiny model's tokenizer and publishing its KV events (vLLM's format) on loopback; a
//! config with `prefix = "precise"` and a static backend naming those sockets, read by the
//! daemon's own config and discovery code; the daemon's feed (`daemon::prefix::PrefixFeed`)
//! following the snapshot into its in-memory sink. The sink must hold exactly the front door's
//! keys of the prompts the simulated GPU caches, lose the evicted ones, follow a cache reset, and
//! withdraw the backend's keys when discovery no longer lists it.
//!
//! Needs the tiny model of `cargo xtask setup` (or `AILB_TINY_MODEL_DIR`); no root.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use ailb_common::prefix::token_keys;
use ailb_tests::{http, report_skipped, sim::topic_messages, wait_until, SimServer};
use ailb_userspace::{
    config::Config,
    daemon::prefix::PrefixFeed,
    discovery::{from_static, Snapshot},
    tokenize::ChatTokenizer,
};
use serde_json::{json, Value};

const BLOCK: u32 = 16;
const WAIT: Duration = Duration::from_secs(15);

#[test]
fn the_daemons_feed_holds_what_a_simulated_engine_caches() {
    const TEST: &str = "the_daemons_feed_holds_what_a_simulated_engine_caches";
    let Some(dir) = ailb_tests::tiny_model_dir() else {
        report_skipped(TEST, "no tiny model (cargo xtask setup makes it, or set AILB_TINY_MODEL_DIR)");
        return;
    };
    let tokenizer = ChatTokenizer::load(&dir).expect("the tiny model's tokenizer loads");
    let addr = format!("127.0.0.1:{}", ailb_tests::nacos::free_port());
    let endpoint = format!("tcp://127.0.0.1:{}", ailb_tests::nacos::free_port());
    let replay = format!("tcp://127.0.0.1:{}", ailb_tests::nacos::free_port());
    let sim =
        SimServer::start_small(&addr, "tiny", dir.to_str().expect("a UTF-8 path"), BLOCK, &endpoint, Some(&replay));
    let toml = format!(
        r#"
        [[models]]
        name = "tiny"
        vips = ["10.255.0.1:80"]
        prefix = "precise"

        [[backends]]
        model = "tiny"
        address = "{addr}"
        kv_events = "{endpoint}"
        kv_replay = "{replay}"
        kv_block_size = {BLOCK}
        "#
    );
    let cfg = Config::parse(&toml, "test").and_then(|c| c.validate()).expect("the config is valid");
    let snapshot = from_static(&cfg.backends);
    let backend: SocketAddr = addr.parse().expect("an address");
    let mut feed = PrefixFeed::default();
    feed.update(&snapshot, &cfg.models);
    assert_eq!(feed.followed().len(), 1, "the backend's engine is followed");
    let sink = feed.memory().expect("the daemon's feed goes to memory").clone();
    let keys_now = || sink.keys("tiny", backend);

    // PUB sends nothing until the subscription has reached it: reset the (empty) cache until
    // one batch has been applied, so that every later batch follows in sequence.
    wait_until("a first batch from the simulator", WAIT, || {
        assert_eq!(http::post_json(sim.addr(), "/reset_prefix_cache", &[], &json!({})).status, 200);
        std::thread::sleep(Duration::from_millis(50));
        (feed.stats("tiny").batches > 0).then_some(())
    });

    let keys_of = |m: &Value| -> HashSet<u64> {
        let ids = tokenizer.chat_token_ids(m, true).expect("tokenizes");
        token_keys(&ids, NonZeroU32::new(BLOCK).expect("non-zero")).into_iter().collect()
    };
    let chat = |m: &Value| {
        let r = http::post_json(
            sim.addr(),
            "/v1/chat/completions",
            &[],
            &json!({"model": "tiny", "messages": m, "max_tokens": 1}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    };
    let hold = |feed: &PrefixFeed, want: &HashSet<u64>, what: &str| {
        ailb_sim::poll::wait_until_or(
            what,
            WAIT,
            || (keys_now() == *want).then_some(()),
            || format!("the sink holds {} keys, {} expected; {:?}", keys_now().len(), want.len(), feed.stats("tiny")),
        )
    };
    let (a, b, c) = (topic_messages("apples", 140), topic_messages("boats", 140), topic_messages("clouds", 140));
    let (ka, kb, kc) = (keys_of(&a), keys_of(&b), keys_of(&c));
    chat(&a);
    hold(&feed, &ka, "the first prompt's keys in the sink");
    chat(&b);
    hold(&feed, &ka.union(&kb).copied().collect(), "both prompts' keys in the sink");
    chat(&c);
    let bc: HashSet<u64> = kb.union(&kc).copied().collect();
    hold(&feed, &bc, "the evicted prompt's keys withdrawn");
    let stats = feed.stats("tiny");
    assert_eq!(stats.keys_held, bc.len() as u64, "{stats:?}");
    assert_eq!((stats.gaps, stats.resyncs, stats.malformed), (0, 0, 0), "{stats:?}");
    assert!(stats.blocks_removed >= ka.len() as u64, "{stats:?}");
    // The sink answers which backends hold a key.
    let one = *kc.iter().next().expect("a key");
    assert_eq!(sink.holders("tiny", one), vec![backend]);

    assert_eq!(http::post_json(sim.addr(), "/reset_prefix_cache", &[], &json!({})).status, 200);
    hold(&feed, &HashSet::new(), "the cache reset reaching the sink");
    chat(&a);
    hold(&feed, &ka, "the first prompt cached again");

    // Discovery no longer lists the backend: it is no longer followed, its keys are withdrawn.
    feed.update(&Snapshot::default(), &cfg.models);
    assert!(feed.followed().is_empty());
    hold(&feed, &HashSet::new(), "the gone backend's keys withdrawn");
    wait_until("the held-keys count back to 0", WAIT, || (feed.stats("tiny").keys_held == 0).then_some(()));
}

#[test]
fn a_backend_with_invalid_kv_metadata_is_not_followed() {
    use ailb_userspace::discovery::Instance;
    let models = Config::parse(
        r#"
        [[models]]
        name = "m"
        vips = ["10.255.0.1:80"]
        prefix = "precise"
        "#,
        "test",
    )
    .and_then(|c| c.validate())
    .expect("valid")
    .models;
    let instance = |i: u8, meta: &[(&str, &str)]| Instance {
        model: "m".into(),
        service: "m".into(),
        group: "DEFAULT_GROUP".into(),
        cluster: "DEFAULT".into(),
        address: SocketAddr::new([127, 0, 0, i].into(), 8000),
        weight: 1.0,
        healthy: true,
        enabled: true,
        metadata: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let snapshot = Snapshot {
        instances: vec![
            instance(1, &[("kv_events_endpoint", "tcp://127.0.0.1:5557"), ("kv_block_size", "16")]),
            instance(2, &[("kv_events_endpoint", "tcp://*:5557"), ("kv_block_size", "16")]),
            instance(3, &[("kv_events_endpoint", "tcp://127.0.0.3:5557")]),
            instance(4, &[]),
        ],
        services: Vec::new(),
    };
    let (follow, refused) = ailb_userspace::daemon::prefix::targets(&snapshot, &models);
    assert_eq!(follow.keys().map(|(_, a)| a.ip().to_string()).collect::<Vec<_>>(), ["127.0.0.1"]);
    let reasons: Vec<&String> = refused.values().collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("tcp://*:5557") && reasons[0].contains("wildcard"), "{reasons:?}");
    assert!(reasons[1].contains("kv_block_size is required"), "{reasons:?}");
}
