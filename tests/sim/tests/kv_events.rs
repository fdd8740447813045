//! The simulator's KV events, live: a server tokenizing with the tiny model's tokenizer
//! publishes on loopback, ailb's own subscriber (`ailb_userspace::kv_events`) follows it into a
//! `BlockIndex`, and the index holds exactly the front door's keys (`token_keys` of the
//! tokenizer's ids) of the prompts the simulated GPU holds: after requests, after evictions,
//! after a cache reset; a late subscriber learns the same from the replay socket.
//!
//! Needs the tiny model that `cargo xtask setup` makes (or a model folder named by
//! `AILB_TINY_MODEL_DIR`); without it the test says it is skipped.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ailb_common::prefix::token_keys;
use ailb_sim::kv_events::{KvEventsConfig, Publisher};
use ailb_sim::{serve_with, GpuProfile, SimConfig};
use ailb_userspace::kv_events::{wire, BlockIndex, Receipt, Subscriber};
use ailb_userspace::tokenize::ChatTokenizer;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{prelude::*, DealerSocket, ZmqMessage};

const BLOCK: u32 = 16;
const WAIT: Duration = Duration::from_secs(10);

fn tiny_model() -> Option<PathBuf> {
    let dir = match (std::env::var_os("AILB_TINY_MODEL_DIR"), std::env::var_os("HOME")) {
        (Some(d), _) => PathBuf::from(d),
        (None, Some(home)) => PathBuf::from(home).join(".cache/ailb/models/tiny-llama"),
        (None, None) => return None,
    };
    dir.join("tokenizer.json").exists().then_some(dir)
}

/// `POST path` with a JSON body; the status and the body.
async fn post(addr: &str, path: &str, body: &Value) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to the simulator");
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("send the head");
    s.write_all(body.as_bytes()).await.expect("send the body");
    let mut raw = String::new();
    tokio::time::timeout(WAIT, s.read_to_string(&mut raw)).await.expect("an answer in time").expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status code");
    (status, body.to_string())
}

/// A conversation whose prompt is about `words` words.
fn messages(topic: &str, words: usize) -> Value {
    let text: Vec<String> = (0..words).map(|i| format!("{topic}{}", i % 50)).collect();
    json!([{"role": "system", "content": format!("You answer questions about {topic}.")},
           {"role": "user", "content": text.join(" ")}])
}

fn keys(tokenizer: &ChatTokenizer, messages: &Value) -> BTreeSet<u64> {
    let ids = tokenizer.chat_token_ids(messages, true).expect("tokenizes");
    token_keys(&ids, NonZeroU32::new(BLOCK).expect("non-zero")).into_iter().collect()
}

/// Follows the publisher until the index holds exactly `want` (every batch applied in order
/// and none malformed), or fails after [`WAIT`].
async fn until_holds(sub: &mut Subscriber, index: &mut BlockIndex, want: &BTreeSet<u64>, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while &index.keys().collect::<BTreeSet<u64>>() != want {
        let followed = tokio::time::timeout_at(deadline, sub.next(index))
            .await
            .unwrap_or_else(|_| {
                panic!("{what}: the index holds {} keys, not the {} expected, after {WAIT:?}", index.len(), want.len())
            })
            .expect("the subscriber receives");
        assert!(
            matches!(followed.receipt, Receipt::Applied(_)) && !followed.resynced,
            "{what}: a batch was not applied in order: {followed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_holds_the_keys_of_what_the_simulated_gpu_caches() {
    let Some(dir) = tiny_model() else {
        eprintln!("SKIPPED a_subscriber_holds_the_keys_of_what_the_simulated_gpu_caches: no tiny model (cargo xtask setup makes it, or set AILB_TINY_MODEL_DIR)");
        return;
    };
    let tokenizer = Arc::new(ChatTokenizer::load(&dir).expect("the tiny model's tokenizer loads"));
    // Four 512-token blocks: two prompts of two blocks each fill the cache, and a third evicts
    // the least recently used two (the first prompt's).
    let mut profile = GpuProfile::preset("a100-80gb").expect("preset");
    profile.kv_bytes_per_token = 2048;
    profile.gpu_memory_mb = profile.weights_mb + 4;
    assert_eq!(profile.kv_blocks(), 4);
    let mut cfg = SimConfig::new(profile, "tiny", 1000.0);
    cfg.tokenizer = Some(tokenizer.clone());
    let mut kv = KvEventsConfig::new("tcp://127.0.0.1:0", BLOCK);
    kv.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    cfg.kv_events = Some(kv.clone());
    let (publisher, bound) = Publisher::bind(&kv).await.expect("binds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    tokio::spawn(serve_with(listener, cfg, Some(publisher)));

    let mut sub = Subscriber::connect(&bound.endpoint, bound.replay_endpoint.as_deref(), Duration::from_secs(2))
        .await
        .expect("subscribes");
    let mut index = BlockIndex::new(NonZeroU32::new(BLOCK).expect("non-zero"));
    // PUB sends nothing until the subscription has reached it: reset the (empty) cache until a
    // batch arrives, so that the requests' batches all follow it in sequence.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert_eq!(post(&addr, "/reset_prefix_cache", &json!({})).await.0, 200);
        match tokio::time::timeout(Duration::from_millis(100), sub.next(&mut index)).await {
            Ok(followed) => {
                assert!(matches!(followed.expect("receives").receipt, Receipt::Applied(_)));
                break;
            }
            Err(_) => assert!(tokio::time::Instant::now() < deadline, "no batch reached the subscriber"),
        }
    }

    let chat = |m: &Value| json!({"model": "tiny", "messages": m, "max_tokens": 1});
    let a = messages("apples", 140);
    let b = messages("boats", 140);
    let c = messages("clouds", 140);
    let (ka, kb, kc) = (keys(&tokenizer, &a), keys(&tokenizer, &b), keys(&tokenizer, &c));
    for k in [&ka, &kb, &kc] {
        // Two of the simulator's 512-token blocks, the second partial: they fit the cache
        // two prompts at a time.
        assert!((33..64).contains(&k.len()), "a prompt of {} blocks of {BLOCK} tokens", k.len());
    }

    assert_eq!(post(&addr, "/v1/chat/completions", &chat(&a)).await.0, 200);
    until_holds(&mut sub, &mut index, &ka, "after the first prompt").await;
    assert_eq!(post(&addr, "/v1/chat/completions", &chat(&b)).await.0, 200);
    let ab: BTreeSet<u64> = ka.union(&kb).copied().collect();
    until_holds(&mut sub, &mut index, &ab, "after the second prompt").await;
    assert_eq!(post(&addr, "/v1/chat/completions", &chat(&c)).await.0, 200);
    let bc: BTreeSet<u64> = kb.union(&kc).copied().collect();
    until_holds(&mut sub, &mut index, &bc, "after the third prompt evicted the first").await;

    // A subscriber that comes late learns the same from the replay socket.
    let replay = bound.replay_endpoint.as_deref().expect("a replay socket");
    let mut late = BlockIndex::new(NonZeroU32::new(BLOCK).expect("non-zero"));
    let mut dealer = DealerSocket::new();
    dealer.connect(replay).await.expect("connects to the replay socket");
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&0u64.to_be_bytes()));
    dealer.send(request).await.expect("asks");
    loop {
        let answer = tokio::time::timeout(WAIT, dealer.recv()).await.expect("an answer in time").expect("receives");
        let frames: Vec<&[u8]> = answer.iter().map(|f| f.as_ref()).collect();
        match wire::split_replay(&frames).expect("a replay answer") {
            wire::Replayed::End => break,
            wire::Replayed::Batch { seq, payload } => {
                let receipt = late.receive_payload(seq, payload);
                assert!(matches!(receipt, Receipt::Applied(_)), "replayed batch {seq}: {receipt:?}");
            }
        }
    }
    assert_eq!(late.keys().collect::<BTreeSet<u64>>(), bc, "the replay gave another cache");

    assert_eq!(post(&addr, "/reset_prefix_cache", &json!({})).await.0, 200);
    until_holds(&mut sub, &mut index, &BTreeSet::new(), "after the cache reset").await;
}
