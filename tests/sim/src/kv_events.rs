//! KV events as vLLM 0.32.0 publishes them (`--kv-events-config`), from the simulated GPU's
//! prefix cache: what lets the daemon's per-engine index be tested against a server that
//! behaves like an engine, without one.
//!
//! The GPU model ([`crate::gpu`]) caches prompts in 512-token blocks; an engine announces its
//! own blocks of `block_size` tokens (vLLM's default 16; a divisor of 512 here). [`EngineBlocks`]
//! turns the model's [`CacheChange`]s into the engine's events: a 512-token block that enters
//! the cache is its full engine blocks, each with an engine hash chained from its parent's (as
//! vLLM chains its block hashes), announced `BlockStored` when no cached block held it yet (a
//! prompt's partial last block shares its first engine blocks with the longer prompts that
//! continue it, so engine blocks are counted by the model blocks that hold them); an evicted
//! block's engine blocks are announced `BlockRemoved` when no other cached block holds them; a
//! cache reset is `AllBlocksCleared`.
//!
//! [`Publisher`] sends them as vLLM's `ZmqEventPublisher` does: a PUB socket, one message
//! `[topic, seq (8 bytes, big-endian), payload]` per batch, `seq` from 0, the payload
//! `[ts, events, data_parallel_rank]` in msgpack with each event a map tagged by `"type"`
//! (fields equal to their default left out, as msgspec writes them; the fields a running engine
//! fills for every block are filled: `extra_keys` one nil per block, `group_idx` 0 and
//! `kv_cache_spec_kind` `"full_attention"`, as vLLM 0.32.0 for CPU was seen to send them); the last `buffer_steps`
//! batches kept for a ROUTER socket that answers `["", start_seq]` with every batch it holds
//! from `start_seq` on, `["", topic, seq, payload]` each, then `["", "", -1, ""]`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ailb_common::hash::ConversationHasher;
use bytes::Bytes;
use rmpv::Value;
use zeromq::{prelude::*, PubSocket, RouterSocket, ZmqMessage};

use crate::gpu::{CacheChange, BLOCK_TOKENS};

/// The medium of every block the simulated GPU holds.
const MEDIUM: &str = "GPU";
/// The KV-cache spec of the simulated model's one group (a plain decoder's, as vLLM names it).
const SPEC_KIND: &str = "full_attention";

/// The chain's start for a prompt's first block (vLLM's `NONE_HASH` plays this part).
const ROOT: u64 = 0x6169_6c62_2d73_696d;

/// How a server publishes its KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB socket's endpoint, `tcp://host:port` (`*` for every address, as vLLM's default
    /// `tcp://*:5557`).
    pub endpoint: String,
    /// The replay ROUTER's endpoint; `None`: no replay (vLLM's default).
    pub replay_endpoint: Option<String>,
    /// The first frame of every message (vLLM's default: empty).
    pub topic: String,
    /// Batches kept for replay (vLLM's default 10,000).
    pub buffer_steps: usize,
    /// The engine's KV-cache block size in tokens: a divisor of 512.
    pub block_size: u32,
}

impl KvEventsConfig {
    /// vLLM's defaults on `endpoint` with `block_size`.
    pub fn new(endpoint: &str, block_size: u32) -> Self {
        KvEventsConfig {
            endpoint: endpoint.to_string(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            block_size,
        }
    }

    /// Checks the values; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.block_size == 0 || !BLOCK_TOKENS.is_multiple_of(u64::from(self.block_size)) {
            return Err(format!(
                "kv block size {}: must divide the simulated GPU's {BLOCK_TOKENS}-token blocks (16, 32, 64, 128, 256 or 512)",
                self.block_size
            ));
        }
        if self.buffer_steps == 0 {
            return Err("kv events buffer steps: must be at least 1".into());
        }
        for (what, e) in [("endpoint", Some(&self.endpoint)), ("replay endpoint", self.replay_endpoint.as_ref())] {
            if let Some(e) = e {
                if !e.starts_with("tcp://") || e.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()) {
                    return Err(format!("kv events {what} {e:?}: expected tcp://HOST:PORT"));
                }
            }
        }
        Ok(())
    }
}

/// One KV event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Full blocks in chain order, the first's parent `parent` (`None`: a prompt's first).
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u32,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

/// The payload of one batch, as msgspec encodes vLLM 0.32.0's `KVEventBatch`.
pub fn encode_batch(ts: f64, events: &[Event], data_parallel_rank: i64) -> Vec<u8> {
    let s = |v: &str| Value::from(v);
    let ints = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::from(x)).collect());
    let events = events
        .iter()
        .map(|e| match e {
            // The fields without a default are always written (None as nil); of those with one,
            // the engine fills `extra_keys` (one nil per block: no extra keys), `group_idx` (its
            // one KV-cache group, 0) and `kv_cache_spec_kind`; the others are left out.
            Event::Stored { hashes, parent, tokens, block_size } => Value::Map(vec![
                (s("type"), s("BlockStored")),
                (s("block_hashes"), ints(hashes)),
                (s("parent_block_hash"), parent.map_or(Value::Nil, Value::from)),
                (s("token_ids"), Value::Array(tokens.iter().map(|&t| Value::from(t)).collect())),
                (s("block_size"), Value::from(*block_size)),
                (s("lora_id"), Value::Nil),
                (s("medium"), s(MEDIUM)),
                (s("lora_name"), Value::Nil),
                (s("extra_keys"), Value::Array(vec![Value::Nil; hashes.len()])),
                (s("group_idx"), Value::from(0)),
                (s("kv_cache_spec_kind"), s(SPEC_KIND)),
            ]),
            Event::Removed { hashes } => Value::Map(vec![
                (s("type"), s("BlockRemoved")),
                (s("block_hashes"), ints(hashes)),
                (s("medium"), s(MEDIUM)),
                (s("group_idx"), Value::from(0)),
            ]),
            Event::Cleared => Value::Map(vec![(s("type"), s("AllBlocksCleared"))]),
        })
        .collect();
    let batch = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(data_parallel_rank)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec cannot fail");
    out
}

/// The engine's blocks of the model's cached blocks (see the module doc).
#[derive(Debug)]
pub struct EngineBlocks {
    block_size: usize,
    /// Engine blocks by hash, with the number of cached model blocks holding each.
    refs: HashMap<u64, u32>,
    /// Each cached model block's engine blocks, in order.
    of_block: HashMap<u64, Vec<u64>>,
}

impl EngineBlocks {
    pub fn new(block_size: u32) -> Self {
        EngineBlocks { block_size: block_size as usize, refs: HashMap::new(), of_block: HashMap::new() }
    }

    /// The engine hash of a block of `tokens` after `parent`.
    fn hash(parent: u64, tokens: &[u32]) -> u64 {
        let mut h = ConversationHasher::new();
        for b in parent.to_le_bytes().into_iter().chain(tokens.iter().flat_map(|t| t.to_le_bytes())) {
            h.write_u8(b);
        }
        h.finish(8 + 4 * tokens.len() as u64)
    }

    /// Engine blocks held now.
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// The events of `changes`, in order.
    pub fn events(&mut self, changes: Vec<CacheChange>) -> Vec<Event> {
        let mut out = Vec::new();
        for change in changes {
            match change {
                CacheChange::Stored { id, parent, tokens } => {
                    // The parent model block is cached (the prompt pins its blocks), and full:
                    // its last engine block ends where this block starts.
                    let parent_hash = match parent {
                        None => None,
                        Some(p) => match self.of_block.get(&p).and_then(|b| b.last()) {
                            Some(&h) => Some(h),
                            // A parent without engine blocks (a request without tokens).
                            None => {
                                self.of_block.insert(id, Vec::new());
                                continue;
                            }
                        },
                    };
                    let mut chain = parent_hash;
                    let mut hashes = Vec::new();
                    let mut run: Option<(Option<u64>, Vec<u64>, Vec<u32>)> = None;
                    for block in tokens.chunks_exact(self.block_size) {
                        let h = Self::hash(chain.unwrap_or(ROOT), block);
                        let n = self.refs.entry(h).or_insert(0);
                        *n += 1;
                        if *n == 1 {
                            let r = run.get_or_insert_with(|| (chain, Vec::new(), Vec::new()));
                            r.1.push(h);
                            r.2.extend_from_slice(block);
                        } else if let Some((parent, hashes, tokens)) = run.take() {
                            let block_size = self.block_size as u32;
                            out.push(Event::Stored { hashes, parent, tokens, block_size });
                        }
                        hashes.push(h);
                        chain = Some(h);
                    }
                    if let Some((parent, hashes, tokens)) = run {
                        out.push(Event::Stored { hashes, parent, tokens, block_size: self.block_size as u32 });
                    }
                    self.of_block.insert(id, hashes);
                }
                CacheChange::Evicted { id } => {
                    let mut gone = Vec::new();
                    for h in self.of_block.remove(&id).unwrap_or_default() {
                        if let Some(n) = self.refs.get_mut(&h) {
                            *n -= 1;
                            if *n == 0 {
                                self.refs.remove(&h);
                                gone.push(h);
                            }
                        }
                    }
                    if !gone.is_empty() {
                        out.push(Event::Removed { hashes: gone });
                    }
                }
                CacheChange::Cleared => {
                    self.refs.clear();
                    self.of_block.clear();
                    out.push(Event::Cleared);
                }
            }
        }
        out
    }
}

/// Batches kept for replay, oldest first.
type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// The endpoints a [`Publisher`] bound (with the ports the system chose for port 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

/// A server's KV-event publisher: the PUB socket, the replay ROUTER (its own task) and the
/// translation of the model's changes.
pub struct Publisher {
    socket: PubSocket,
    topic: Bytes,
    seq: u64,
    buffer: Buffer,
    buffer_steps: usize,
    blocks: EngineBlocks,
    replay: Option<tokio::task::JoinHandle<()>>,
}

/// vLLM binds `*` as every address; the socket library takes an address.
fn bindable(endpoint: &str) -> String {
    endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1)
}

impl Publisher {
    /// Binds the sockets (inside a tokio runtime).
    pub async fn bind(cfg: &KvEventsConfig) -> Result<(Publisher, Bound), String> {
        cfg.validate()?;
        let mut socket = PubSocket::new();
        let endpoint = socket
            .bind(&bindable(&cfg.endpoint))
            .await
            .map_err(|e| format!("kv events endpoint {}: cannot bind: {e}", cfg.endpoint))?
            .to_string();
        let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
        let (replay, replay_endpoint) = match &cfg.replay_endpoint {
            None => (None, None),
            Some(e) => {
                let mut router = RouterSocket::new();
                let bound = router
                    .bind(&bindable(e))
                    .await
                    .map_err(|err| format!("kv events replay endpoint {e}: cannot bind: {err}"))?
                    .to_string();
                let task = tokio::spawn(serve_replay(router, buffer.clone(), Bytes::from(cfg.topic.clone())));
                (Some(task), Some(bound))
            }
        };
        let publisher = Publisher {
            socket,
            topic: Bytes::from(cfg.topic.clone()),
            seq: 0,
            buffer,
            buffer_steps: cfg.buffer_steps,
            blocks: EngineBlocks::new(cfg.block_size),
            replay,
        };
        Ok((publisher, Bound { endpoint, replay_endpoint }))
    }

    /// Engine blocks held now.
    pub fn engine_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Publishes the events of `changes` as one batch (nothing when they announce nothing).
    pub async fn publish(&mut self, changes: Vec<CacheChange>) {
        let events = self.blocks.events(changes);
        if events.is_empty() {
            return;
        }
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.send(Bytes::from(encode_batch(ts, &events, 0))).await;
    }

    /// Sends one batch's payload with the next sequence number and keeps it for replay.
    pub async fn send(&mut self, payload: Bytes) {
        let seq = self.seq;
        self.seq += 1;
        {
            let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
            if buffer.len() == self.buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload.clone()));
        }
        let mut message = ZmqMessage::from(self.topic.clone());
        message.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        message.push_back(payload);
        // PUB drops a message that no subscriber takes; a subscriber finds the gap by `seq`.
        if let Err(e) = self.socket.send(message).await {
            eprintln!("ailb-sim: kv events: sending batch {seq}: {e}");
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(task) = self.replay.take() {
            task.abort();
        }
    }
}

/// Answers replay requests `[identity, "", start_seq]` until the socket fails.
async fn serve_replay(mut router: RouterSocket, buffer: Buffer, topic: Bytes) {
    loop {
        let request = match router.recv().await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ailb-sim: kv events replay: {e}");
                return;
            }
        };
        let frames: Vec<Bytes> = request.into_vec();
        let [identity, _delimiter, start] = &frames[..] else { continue };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else { continue };
        let held: Vec<(u64, Bytes)> = {
            let buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
            buffer.iter().filter(|(seq, _)| *seq >= start).cloned().collect()
        };
        let answer = |frames: [Bytes; 4]| {
            let mut m = ZmqMessage::from(identity.clone());
            for f in frames {
                m.push_back(f);
            }
            m
        };
        for (seq, payload) in held {
            let frames = [Bytes::new(), topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            if router.send(answer(frames)).await.is_err() {
                break;
            }
        }
        let end = [Bytes::new(), Bytes::new(), Bytes::copy_from_slice(&u64::MAX.to_be_bytes()), Bytes::new()];
        let _ = router.send(answer(end)).await;
    }
}

#[cfg(test)]
mod tests;
