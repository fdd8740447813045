//! KV-event ingestion: how many stored blocks per second the daemon's feed takes, and whether
//! it keeps up with an engine publishing 100,000 blocks/s over a real ZMQ socket:
//! `cargo bench -p ailb-userspace --bench kv_ingest` (`docs/prefix.md` quotes a run).
//!
//! The workload is an engine's steady state: each batch stores a new 100-block prompt
//! (16-token blocks, as vLLM 0.32.0 encodes them) and, once 1,000 prompts are held (100,000
//! blocks), evicts the oldest prompt's 100 blocks in the same batch, so the index stays at
//! 100,000 blocks and every batch both adds and withdraws 100 keys.
//!
//! 1. In process, as fast as it goes: decode alone; decode and the index; decode, the index
//!    and the sink (what one feed task does per batch).
//! 2. Over loopback ZMQ: a PUB socket sends one batch per millisecond (100,000 blocks/s) for 5 s
//!    to the daemon's `Feeds` (its own runtime thread, as in `ailb run`); the backlog (blocks
//!    sent but not yet applied) is sampled every 250 ms. It kept up when no batch was lost (no
//!    gap), the backlog did not grow from the first second to the last, and everything sent
//!    was applied within 250 ms of the last send.
//!
//! The sink is the hook: [`sink`] returns the in-memory sink; the kernel map's sink goes there.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    num::NonZeroU32,
    sync::Arc,
    time::{Duration, Instant},
};

use ailb_userspace::kv_events::{decode_batch, BlockIndex, EventSource, FeedSettings, Feeds, MemorySink, PrefixSink};
use bytes::Bytes;
use rmpv::Value;
use zeromq::{prelude::*, PubSocket, ZmqMessage};

const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_BATCH: usize = 100;
/// Prompts (batches) held before the oldest is evicted.
const HELD_PROMPTS: usize = 1_000;
/// The paced run: one batch per millisecond.
const PACE: Duration = Duration::from_millis(1);
const PACED_FOR: Duration = Duration::from_secs(5);
const RATE: u64 = (BLOCKS_PER_BATCH as u64) * 1_000;

/// The sink the feed writes to: swap in the kernel map's sink here to measure it.
fn sink() -> Arc<dyn PrefixSink> {
    Arc::new(MemorySink::default())
}

fn hashes(prompt: usize) -> Value {
    Value::Array((0..BLOCKS_PER_BATCH).map(|j| Value::from(((prompt as u64) << 32) | j as u64)).collect())
}

/// Batch `i` as vLLM 0.32.0 encodes it: `[ts, events, rank]`, events as tagged maps.
fn payload(i: usize) -> Vec<u8> {
    let s = Value::from;
    let tokens = (0..BLOCKS_PER_BATCH * BLOCK_SIZE as usize).map(|k| Value::from((i * 1_600 + k) as u32));
    let mut events = vec![Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), hashes(i)),
        (s("parent_block_hash"), Value::Nil),
        (s("token_ids"), Value::Array(tokens.collect())),
        (s("block_size"), Value::from(BLOCK_SIZE)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), Value::Nil),
    ])];
    if i >= HELD_PROMPTS {
        events.push(Value::Map(vec![
            (s("type"), s("BlockRemoved")),
            (s("block_hashes"), hashes(i - HELD_PROMPTS)),
            (s("medium"), s("GPU")),
        ]));
    }
    let batch = Value::Array(vec![Value::F64(i as f64), Value::Array(events), Value::from(0)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encodes");
    out
}

fn block_size() -> NonZeroU32 {
    NonZeroU32::new(BLOCK_SIZE).expect("non-zero")
}

/// Blocks per second of `f` over the payloads (each stores `BLOCKS_PER_BATCH`).
fn rate(payloads: &[Vec<u8>], mut f: impl FnMut(u64, &[u8])) -> f64 {
    let t = Instant::now();
    for (seq, p) in payloads.iter().enumerate() {
        f(seq as u64, p);
    }
    (payloads.len() * BLOCKS_PER_BATCH) as f64 / t.elapsed().as_secs_f64()
}

fn in_process(payloads: &[Vec<u8>]) {
    let backend: SocketAddr = "10.0.0.1:8000".parse().expect("addr");
    let decode = rate(payloads, |_, p| {
        std::hint::black_box(decode_batch(p).expect("decodes"));
    });
    let mut index = BlockIndex::new(block_size());
    let indexed = rate(payloads, |seq, p| {
        index.receive_payload(seq, p);
        std::hint::black_box(index.take_changes());
    });
    assert_eq!(index.len(), HELD_PROMPTS * BLOCKS_PER_BATCH, "the index holds the steady state");
    let mut index = BlockIndex::new(block_size());
    let sink = sink();
    let mut changes = 0;
    let fed = rate(payloads, |seq, p| {
        index.receive_payload(seq, p);
        let c = index.take_changes();
        changes += c.len();
        sink.apply("m", backend, &c);
    });
    assert_eq!(changes, (2 * payloads.len() - HELD_PROMPTS) * BLOCKS_PER_BATCH, "every key stored and withdrawn");
    println!("in process, {} batches of {BLOCKS_PER_BATCH} blocks (one thread):", payloads.len());
    println!("  decode                  {:>12.0} blocks/s", decode);
    println!("  decode + index          {:>12.0} blocks/s", indexed);
    println!("  decode + index + sink   {:>12.0} blocks/s  ({:.1}x the 100,000 blocks/s goal)", fed, fed / 1e5);
}

async fn over_zmq(payloads: Vec<Bytes>) {
    let mut publisher = PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
    let backend: SocketAddr = "10.0.0.1:8000".parse().expect("addr");
    let mut feeds = Feeds::new(sink(), FeedSettings::default()).expect("the feed's runtime");
    let source = EventSource { endpoint, replay: None, block_size: block_size() };
    feeds.follow(&BTreeMap::from([(("m".to_string(), backend), source)]));
    let message = |seq: u64, payload: &Bytes| {
        let frames = vec![Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()];
        ZmqMessage::try_from(frames).expect("frames")
    };
    // Empty batches until one is applied: the subscription has reached the publisher.
    let empty = Bytes::from(rmpv_empty());
    let mut seq = 0u64;
    while feeds.stats("m").batches == 0 {
        publisher.send(message(seq, &empty)).await.expect("sent");
        seq += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(seq < 1_000, "the feed never received a batch");
    }
    let mut tick = tokio::time::interval(PACE);
    let mut samples = Vec::new();
    let start = Instant::now();
    let mut next_sample = start + Duration::from_millis(250);
    let mut sent_blocks = 0u64;
    for p in payloads.iter().take((PACED_FOR.as_millis() / PACE.as_millis()) as usize) {
        tick.tick().await;
        publisher.send(message(seq, p)).await.expect("sent");
        seq += 1;
        sent_blocks += BLOCKS_PER_BATCH as u64;
        if Instant::now() >= next_sample {
            let applied = feeds.stats("m").blocks_stored;
            samples.push((start.elapsed(), sent_blocks, sent_blocks.saturating_sub(applied)));
            next_sample += Duration::from_millis(250);
        }
    }
    let sent_for = start.elapsed();
    let ended = Instant::now();
    while feeds.stats("m").blocks_stored < sent_blocks && ended.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drained = ended.elapsed();
    let stats = feeds.stats("m");
    let backlog_at = |from: Duration, to: Duration| {
        samples.iter().filter(|(t, _, _)| *t >= from && *t < to).map(|(_, _, b)| *b).max().unwrap_or(0)
    };
    let first = backlog_at(Duration::ZERO, Duration::from_secs(1));
    let last = backlog_at(sent_for.saturating_sub(Duration::from_secs(1)), sent_for + Duration::from_secs(1));
    let max = samples.iter().map(|(_, _, b)| *b).max().unwrap_or(0);
    let offered = sent_blocks as f64 / sent_for.as_secs_f64();
    let kept_up = stats.gaps == 0
        && stats.blocks_stored == sent_blocks
        && drained < Duration::from_millis(250)
        && last <= first.max(2 * BLOCKS_PER_BATCH as u64);
    println!(
        "over loopback ZMQ to the daemon's feed, paced at {RATE} blocks/s for {:.1} s (offered {:.0} blocks/s):",
        sent_for.as_secs_f64(),
        offered
    );
    println!("  blocks applied          {:>12} of {sent_blocks}", stats.blocks_stored);
    println!("  gaps / resyncs          {:>12} / {}", stats.gaps, stats.resyncs);
    println!("  backlog, max            {:>12} blocks", max);
    println!("  backlog, first / last s {:>12} / {} blocks", first, last);
    println!("  drained after last send {:>12.1} ms", drained.as_secs_f64() * 1e3);
    println!("  kept up                 {:>12}", if kept_up { "yes" } else { "NO" });
}

fn rmpv_empty() -> Vec<u8> {
    let mut out = Vec::new();
    let batch = Value::Array(vec![Value::F64(0.0), Value::Array(Vec::new()), Value::from(0)]);
    rmpv::encode::write_value(&mut out, &batch).expect("encodes");
    out
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no options.
    let n = (PACED_FOR.as_millis() / PACE.as_millis()) as usize + HELD_PROMPTS;
    let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
    println!(
        "kv_ingest: {} CPUs; batches of {BLOCKS_PER_BATCH} blocks of {BLOCK_SIZE} tokens ({} bytes each), {} blocks held",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        payloads[HELD_PROMPTS].len(),
        HELD_PROMPTS * BLOCKS_PER_BATCH
    );
    in_process(&payloads);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(over_zmq(payloads.into_iter().map(Bytes::from).collect()));
}
