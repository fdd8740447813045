//! vLLM's KV-event messages decoded into typed values ([`EventBatch`], [`KvEvent`]).
//!
//! A message on the PUB socket is three frames, `[topic, seq, payload]`: `seq` is 8 bytes,
//! big-endian, counting batches from 0 per publisher; `payload` is one msgpack value written by
//! msgspec from `KVEventBatch`. msgspec writes a struct as a map of its field names, or, for a
//! struct declared `array_like=True`, as an array of its fields in declaration order; fields
//! equal to their default are left out (`omit_defaults=True`: from a map, or from an array's
//! tail). Events are tagged structs: the tag is the class name, in the map under `"type"`, or
//! first in the array. vLLM 0.32.0 writes the batch as an array (`[ts, events, rank]`) and each
//! event as a map; earlier versions wrote events as arrays too. Both forms are read everywhere,
//! so the decoder follows either. A block hash is an integer (the default,
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64 bits of the engine's hash) or bytes.
//! Fields a newer engine adds are ignored; `docs/prefix.md` lists the fields of 0.32.0.

use rmpv::Value;

use super::KvEventError;

/// How deep a batch may nest: batch, events, event, `extra_keys`, a block's keys and what they
/// hold; deeper is not a batch.
const MAX_DEPTH: usize = 16;

/// An engine's block hash, as the engine sent it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineHash {
    /// An integer hash; a negative one (older engines sent Python's `hash()`) as its two's
    /// complement.
    Int(u64),
    /// A hash in bytes (the engine's hash whole).
    Bytes(Box<[u8]>),
}

impl std::fmt::Display for EngineHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineHash::Int(h) => write!(f, "{h:#018x}"),
            EngineHash::Bytes(b) => b.iter().try_for_each(|x| write!(f, "{x:02x}")),
        }
    }
}

/// One `KVEventBatch`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// When the engine made the batch (seconds since the epoch, the engine's clock).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The engine's data-parallel rank (each rank publishes on its own port).
    pub data_parallel_rank: Option<i64>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    AllBlocksCleared,
    /// An event type this decoder does not know (a newer engine's): kept by name so that it is
    /// counted, not applied.
    Unknown {
        tag: String,
    },
}

/// Full blocks the engine stored, in chain order: block `i`'s parent is block `i - 1`, the
/// first block's is `parent_block_hash` (`None`: it starts a prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    pub block_hashes: Vec<EngineHash>,
    pub parent_block_hash: Option<EngineHash>,
    /// The blocks' token ids, `block_size` per block.
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    /// Where the blocks are (`"GPU"`, `"CPU"`, ...); `None` from engines that do not say.
    pub medium: Option<String>,
    /// Per block, whether the engine hashed more than the tokens into it (multimodal inputs,
    /// a LoRA name, a cache salt): such a block holds what the tokens alone do not name.
    /// Empty when the engine sent no `extra_keys`.
    pub has_extra_keys: Vec<bool>,
    /// The KV-cache group (models with more than one kind of attention layer).
    pub group_idx: Option<i64>,
    /// `"LOCAL"` or `"REMOTE"` relative to the engine; `None`: unspecified.
    pub locality: Option<String>,
    /// The offloading tier that stored the blocks, if one did.
    pub ownership: Option<String>,
}

/// Blocks the engine evicted from one medium.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<EngineHash>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

/// A publisher message, split: the payload is decoded by [`decode_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub topic: &'a [u8],
    pub seq: u64,
    pub payload: &'a [u8],
}

/// The publisher's message `[topic, seq, payload]`.
pub fn split_message<'a>(frames: &[&'a [u8]]) -> Result<Message<'a>, KvEventError> {
    let [topic, seq, payload] = frames else {
        return Err(KvEventError::Frames { count: frames.len() });
    };
    Ok(Message { topic, seq: sequence(seq)?, payload })
}

/// One answer of the replay socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed<'a> {
    /// A buffered batch, as it was published.
    Batch { seq: u64, payload: &'a [u8] },
    /// The end of the replay: sequence number -1 (all bits set).
    End,
}

/// One frame list the replay socket answers, as the client's socket receives it: vLLM 0.32.0's
/// ROUTER sends `[identity, "", topic, seq, payload]` per batch and `[identity, "", "", -1, ""]`
/// at the end, so a DEALER receives `["", topic, seq, payload]` and a REQ `[topic, seq,
/// payload]`; earlier versions sent no topic (`["", seq, payload]`, `[seq, payload]`). In every
/// layout the sequence number and the payload are the last two frames.
pub fn split_replay<'a>(frames: &[&'a [u8]]) -> Result<Replayed<'a>, KvEventError> {
    let [.., seq, payload] = frames else {
        return Err(KvEventError::ReplayFrames { count: frames.len() });
    };
    if frames.len() > 4 {
        return Err(KvEventError::ReplayFrames { count: frames.len() });
    }
    match sequence(seq)? {
        u64::MAX => Ok(Replayed::End),
        seq => Ok(Replayed::Batch { seq, payload }),
    }
}

/// The request for a replay from `start`: the frame after the empty delimiter (the ROUTER
/// takes exactly `[identity, "", start]`).
pub fn replay_request(start: u64) -> [u8; 8] {
    start.to_be_bytes()
}

fn sequence(frame: &[u8]) -> Result<u64, KvEventError> {
    let bytes: [u8; 8] = frame.try_into().map_err(|_| KvEventError::Sequence { len: frame.len() })?;
    Ok(u64::from_be_bytes(bytes))
}

/// A `KVEventBatch` payload.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, KvEventError> {
    let mut rest = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH).map_err(KvEventError::Msgpack)?;
    if !rest.is_empty() {
        return Err(KvEventError::TrailingBytes { extra: rest.len() });
    }
    let batch = Struct::untagged(&value, "batch")?;
    let ts = batch.required(0, "ts")?;
    // Finite: the order of batches from a restarted engine is told by their timestamps.
    let ts = ts
        .as_f64()
        .filter(|t| t.is_finite())
        .ok_or_else(|| KvEventError::field("ts", ts, "expected a finite number"))?;
    let events = batch.required(1, "events")?;
    let events = events.as_array().ok_or_else(|| KvEventError::field("events", events, "expected an array"))?;
    let events = events.iter().enumerate().map(|(i, e)| event(e, i)).collect::<Result<_, _>>()?;
    let data_parallel_rank =
        batch.optional(2, "data_parallel_rank").map(|v| int(v, "data_parallel_rank")).transpose()?;
    Ok(EventBatch { ts, events, data_parallel_rank })
}

/// Event `i` of a batch, by its tag; an unknown tag is kept by name.
fn event(value: &Value, i: usize) -> Result<KvEvent, KvEventError> {
    let path = format!("events[{i}]");
    let (tag, fields) = Struct::tagged(value, &path)?;
    match tag {
        "BlockStored" => block_stored(&fields, &path).map(KvEvent::BlockStored),
        "BlockRemoved" => block_removed(&fields, &path).map(KvEvent::BlockRemoved),
        "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        other => Ok(KvEvent::Unknown { tag: other.to_string() }),
    }
}

/// A `BlockStored` event's fields (`path`: the event's, in errors): the chain of hashes, the
/// tokens (`block_size` per hash), then the optional fields.
fn block_stored(fields: &Struct<'_>, path: &str) -> Result<BlockStored, KvEventError> {
    let at = |f: &str| format!("{path}.{f}");
    let block_hashes = hashes(fields.required(0, "block_hashes")?, &at("block_hashes"))?;
    let parent = fields.required(1, "parent_block_hash")?;
    let parent_block_hash = if parent.is_nil() { None } else { Some(hash(parent, &at("parent_block_hash"))?) };
    let token_ids = token_ids(fields.required(2, "token_ids")?, &at("token_ids"))?;
    let size = fields.required(3, "block_size")?;
    let block_size = size
        .as_u64()
        .and_then(|s| u32::try_from(s).ok())
        .filter(|&s| s > 0)
        .ok_or_else(|| KvEventError::field(at("block_size"), size, "expected a block size (1..2^32)"))?;
    let blocks = block_hashes.len();
    if token_ids.len() as u64 != blocks as u64 * block_size as u64 {
        return Err(KvEventError::field(
            at("token_ids"),
            format!("{} tokens", token_ids.len()),
            "expected block_size tokens per block hash",
        ));
    }
    let lora_id = fields.nullable(4, "lora_id").map(|v| int(v, &at("lora_id"))).transpose()?;
    let medium = fields.nullable(5, "medium").map(|v| string(v, &at("medium"))).transpose()?;
    let lora_name = fields.nullable(6, "lora_name").map(|v| string(v, &at("lora_name"))).transpose()?;
    let has_extra_keys = extra_keys(fields.nullable(7, "extra_keys"), blocks, &at("extra_keys"))?;
    let group_idx = fields.nullable(8, "group_idx").map(|v| int(v, &at("group_idx"))).transpose()?;
    let locality = fields.nullable(11, "locality").map(|v| string(v, &at("locality"))).transpose()?;
    let ownership = fields.nullable(12, "ownership").map(|v| string(v, &at("ownership"))).transpose()?;
    Ok(BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        lora_name,
        medium,
        has_extra_keys,
        group_idx,
        locality,
        ownership,
    })
}

/// A `BlockRemoved` event's fields (`path`: the event's, in errors).
fn block_removed(fields: &Struct<'_>, path: &str) -> Result<BlockRemoved, KvEventError> {
    let at = |f: &str| format!("{path}.{f}");
    let block_hashes = hashes(fields.required(0, "block_hashes")?, &at("block_hashes"))?;
    let medium = fields.nullable(1, "medium").map(|v| string(v, &at("medium"))).transpose()?;
    let group_idx = fields.nullable(2, "group_idx").map(|v| int(v, &at("group_idx"))).transpose()?;
    let locality = fields.nullable(3, "locality").map(|v| string(v, &at("locality"))).transpose()?;
    let ownership = fields.nullable(4, "ownership").map(|v| string(v, &at("ownership"))).transpose()?;
    Ok(BlockRemoved { block_hashes, medium, group_idx, locality, ownership })
}

/// Token ids: an array of integers below 2^32.
fn token_ids(value: &Value, path: &str) -> Result<Vec<u32>, KvEventError> {
    value
        .as_array()
        .ok_or_else(|| KvEventError::field(path, value, "expected an array"))?
        .iter()
        .enumerate()
        .map(|(j, t)| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| KvEventError::field(format!("{path}[{j}]"), t, "expected a token id (0..2^32)"))
        })
        .collect()
}

/// Per block, whether its `extra_keys` entry is set (empty when the engine sent none); one
/// entry per block hash.
fn extra_keys(value: Option<&Value>, blocks: usize, path: &str) -> Result<Vec<bool>, KvEventError> {
    let Some(v) = value else { return Ok(Vec::new()) };
    let keys = v.as_array().ok_or_else(|| KvEventError::field(path, v, "expected an array"))?;
    if keys.len() != blocks {
        return Err(KvEventError::field(path, format!("{} entries", keys.len()), "expected one entry per block hash"));
    }
    Ok(keys.iter().map(|k| !k.is_nil()).collect())
}

/// A msgspec struct in either form: its fields by position (array) or by name (map).
enum Struct<'a> {
    /// The fields after the tag, if any.
    Array(&'a [Value], String),
    Map(&'a [(Value, Value)], String),
}

impl<'a> Struct<'a> {
    fn untagged(value: &'a Value, path: &str) -> Result<Self, KvEventError> {
        match value {
            Value::Array(a) => Ok(Struct::Array(a, path.to_string())),
            Value::Map(m) => Ok(Struct::Map(m, path.to_string())),
            other => Err(KvEventError::field(path, other, "expected an array or a map")),
        }
    }

    /// A tagged struct: the tag first in the array, or under `"type"` in the map.
    fn tagged(value: &'a Value, path: &str) -> Result<(&'a str, Self), KvEventError> {
        let s = Self::untagged(value, path)?;
        let tag = match &s {
            Struct::Array(a, _) => a.first(),
            Struct::Map(m, _) => lookup(m, "type"),
        }
        .ok_or_else(|| KvEventError::field(path, value, "no event type"))?;
        let tag = tag.as_str().ok_or_else(|| KvEventError::field(format!("{path}.type"), tag, "expected a string"))?;
        Ok(match s {
            Struct::Array(a, p) => (tag, Struct::Array(&a[1..], p)),
            map => (tag, map),
        })
    }

    fn optional(&self, pos: usize, name: &str) -> Option<&'a Value> {
        match self {
            Struct::Array(a, _) => a.get(pos),
            Struct::Map(m, _) => lookup(m, name),
        }
    }

    /// A field that may be absent (a default, or an older engine's) or nil.
    fn nullable(&self, pos: usize, name: &str) -> Option<&'a Value> {
        self.optional(pos, name).filter(|v| !v.is_nil())
    }

    fn required(&self, pos: usize, name: &str) -> Result<&'a Value, KvEventError> {
        self.optional(pos, name).ok_or_else(|| {
            let path = match self {
                Struct::Array(_, p) | Struct::Map(_, p) => p,
            };
            KvEventError::field(format!("{path}.{name}"), "absent", "a required field")
        })
    }
}

fn lookup<'a>(map: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v)
}

fn hashes(value: &Value, path: &str) -> Result<Vec<EngineHash>, KvEventError> {
    let items = value.as_array().ok_or_else(|| KvEventError::field(path, value, "expected an array"))?;
    items.iter().enumerate().map(|(i, h)| hash(h, &format!("{path}[{i}]"))).collect()
}

fn hash(value: &Value, path: &str) -> Result<EngineHash, KvEventError> {
    match value {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|v| v as u64))
            .map(EngineHash::Int)
            .ok_or_else(|| KvEventError::field(path, value, "expected a 64-bit integer")),
        Value::Binary(b) => Ok(EngineHash::Bytes(b.clone().into_boxed_slice())),
        other => Err(KvEventError::field(path, other, "expected a block hash (an integer or bytes)")),
    }
}

fn int(value: &Value, path: &str) -> Result<i64, KvEventError> {
    value.as_i64().ok_or_else(|| KvEventError::field(path, value, "expected an integer"))
}

fn string(value: &Value, path: &str) -> Result<String, KvEventError> {
    value.as_str().map(str::to_string).ok_or_else(|| KvEventError::field(path, value, "expected a string"))
}
