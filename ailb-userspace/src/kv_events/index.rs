//! [`BlockIndex`]: what one engine's KV cache holds, as prefix keys, kept by applying its
//! events in order.
//!
//! Each stored block is keyed with the same chained keys the front door computes for a prompt
//! (`ailb_common::prefix`): the first block of a prompt is chained from the root, any other from
//! its parent block's key, which the index finds from the parent's engine hash. A block whose
//! parent the index never saw (it subscribed after the parent was stored) cannot be keyed: it is
//! counted as an orphan and left out, as are its descendants in the same event.
//!
//! A block is tracked per *place*: a (medium, KV-cache group, locality, offloading tier) that
//! events name. It is held while a place that is not `REMOTE` holds it: a remote tier is shared
//! by many engines, so a block there says nothing about this one. Only *plain* blocks give keys:
//! a block the engine hashed with more than its tokens (a LoRA adapter, a cache salt,
//! multimodal inputs), a block of another size than the keys' (vLLM 0.32 also stores partial
//! entries at finer boundaries inside a block), or a descendant of one, is in a cache that a
//! plain request of the same tokens does not hit; it is tracked (for its children and its
//! removal) but not offered.
//!
//! Sequence numbers: a batch applies only after the one before it. A later one reports a
//! [`Receipt::Gap`] (ask the replay socket from `expected`, then apply what it sends); an
//! earlier one is a duplicate (a replay overlaps what arrived) unless its timestamp is newer
//! than the last applied batch's, which means the engine restarted and its cache is empty.

use std::{collections::HashMap, num::NonZeroU32};

use ailb_common::prefix;

use super::{
    wire::{self, BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent},
    KvEventError,
};

/// The most places an index tells apart: a bit each per block.
pub const MAX_PLACES: usize = 64;

/// Where an event says its blocks are: (medium, KV-cache group, locality, offloading tier).
type Place = (Option<String>, Option<i64>, Option<String>, Option<String>);

fn stored_place(s: &BlockStored) -> Place {
    (s.medium.clone(), s.group_idx, s.locality.clone(), s.ownership.clone())
}

fn removed_place(r: &BlockRemoved) -> Place {
    (r.medium.clone(), r.group_idx, r.locality.clone(), r.ownership.clone())
}

fn place_of(e: &KvEvent) -> Option<Place> {
    match e {
        KvEvent::BlockStored(s) => Some(stored_place(s)),
        KvEvent::BlockRemoved(r) => Some(removed_place(r)),
        KvEvent::AllBlocksCleared | KvEvent::Unknown { .. } => None,
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    /// The prefix key of this block (a whole prefix); 0 for a block that is not plain.
    key: u64,
    /// Whether the key is offered: the block and all its ancestors hold only their tokens, in
    /// blocks of the keys' size.
    plain: bool,
    /// Which places hold it: bit `i` for `places[i]`.
    held_in: u64,
}

/// What a batch changed (and what it could not use).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Blocks stored (new to a place).
    pub stored: u64,
    /// Blocks stored whose parent the index does not know: not keyed.
    pub orphans: u64,
    /// Blocks stored with another block size than the keys': tracked, not keyed.
    pub other_size: u64,
    /// Blocks removed from a place.
    pub removed: u64,
    /// Removals of blocks the index does not hold in that place.
    pub unknown_removed: u64,
    /// `AllBlocksCleared` events.
    pub cleared: u64,
    /// Events of a type the decoder does not know.
    pub unknown_events: u64,
}

impl std::ops::AddAssign for ApplyStats {
    fn add_assign(&mut self, o: Self) {
        self.stored += o.stored;
        self.orphans += o.orphans;
        self.other_size += o.other_size;
        self.removed += o.removed;
        self.unknown_removed += o.unknown_removed;
        self.cleared += o.cleared;
        self.unknown_events += o.unknown_events;
    }
}

/// What became of a batch given to [`BlockIndex::receive`].
#[derive(Debug)]
pub enum Receipt {
    Applied(ApplyStats),
    /// Already applied (a replay overlapping the live stream).
    Duplicate {
        seq: u64,
    },
    /// Batches `expected..got` are missing: ask the replay socket from `expected`; this batch
    /// is not applied (the replay sends it again).
    Gap {
        expected: u64,
        got: u64,
    },
    /// The engine restarted (its sequence began again with a newer timestamp): everything held
    /// was dropped, then this batch applied.
    Restarted(ApplyStats),
    /// The batch is malformed: skipped whole, nothing in the index changed; its sequence number
    /// is spent, so the next batch applies.
    Skipped {
        seq: Option<u64>,
        error: KvEventError,
    },
}

/// One engine's (one publisher's) cache, as prefix keys.
#[derive(Debug)]
pub struct BlockIndex {
    block_size: NonZeroU32,
    root: u64,
    blocks: HashMap<EngineHash, Block>,
    /// Plain keys held, with the number of blocks giving each (two engine hashes can give one
    /// key: the same tokens under different cache salts are different engine blocks).
    held: HashMap<u64, u32>,
    /// Places seen, by bit.
    places: Vec<Place>,
    /// The bits of the places that count for holding (all but `REMOTE` ones).
    local: u64,
    /// The sequence number the next batch should have; `None` before the first.
    expected: Option<u64>,
    last_ts: f64,
    /// Keys whose held state may have changed since [`BlockIndex::take_changes`].
    dirty: Vec<u64>,
}

impl BlockIndex {
    /// An empty index for an engine whose KV-cache blocks are `block_size` tokens; stored
    /// blocks of another size are an error (their keys would match no request's).
    pub fn new(block_size: NonZeroU32) -> Self {
        BlockIndex {
            block_size,
            root: prefix::token_root(block_size),
            blocks: HashMap::new(),
            held: HashMap::new(),
            places: Vec::new(),
            local: 0,
            expected: None,
            last_ts: f64::NEG_INFINITY,
            dirty: Vec::new(),
        }
    }

    /// Whether a plain block with this prefix key is held.
    pub fn holds(&self, key: u64) -> bool {
        self.held.contains_key(&key)
    }

    /// The plain prefix keys held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.held.keys().copied()
    }

    /// The number of distinct plain keys held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The number of engine blocks tracked (plain or not, orphans excluded).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The sequence number the next batch should carry; `None` before the first batch.
    pub fn expected(&self) -> Option<u64> {
        self.expected
    }

    /// Keys whose held state may have changed since the last call, each once, with whether it
    /// is held now: what a writer of the kernel map applies. Their list grows until taken, so
    /// the owner of an index takes them after every batch or few.
    pub fn take_changes(&mut self) -> Vec<(u64, bool)> {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        dirty.into_iter().map(|k| (k, self.held.contains_key(&k))).collect()
    }

    /// Forgets everything held (the engine cleared its cache, or events were lost and what it
    /// holds is unknown); the sequence position is kept.
    pub fn clear(&mut self) {
        self.dirty.extend(self.held.keys().copied());
        self.blocks.clear();
        self.held.clear();
    }

    /// After a gap that the replay could not fill (the engine's replay buffer no longer has
    /// the batches): what the cache holds is unknown, so everything is dropped and the stream
    /// goes on from `next`.
    pub fn resync(&mut self, next: u64) {
        self.clear();
        self.expected = Some(next);
    }

    /// A publisher message `[topic, seq, payload]`: decoded and applied in sequence. A malformed
    /// one is logged and skipped.
    pub fn receive(&mut self, frames: &[&[u8]]) -> Receipt {
        let message = match wire::split_message(frames) {
            Ok(m) => m,
            Err(error) => return self.skip(None, error),
        };
        self.receive_payload(message.seq, message.payload)
    }

    /// A batch's payload with its sequence number (from the PUB socket or the replay socket).
    pub fn receive_payload(&mut self, seq: u64, payload: &[u8]) -> Receipt {
        if let Some(expected) = self.expected {
            if seq > expected {
                return Receipt::Gap { expected, got: seq };
            }
        }
        let batch = match wire::decode_batch(payload) {
            Ok(b) => b,
            Err(error) => {
                if self.expected.is_none_or(|e| seq == e) {
                    self.expected = Some(seq + 1);
                }
                return self.skip(Some(seq), error);
            }
        };
        let restarted = match self.expected {
            Some(expected) if seq < expected => {
                if batch.ts <= self.last_ts {
                    return Receipt::Duplicate { seq };
                }
                self.clear();
                true
            }
            _ => false,
        };
        match self.apply(&batch) {
            Ok(stats) => {
                self.expected = Some(seq + 1);
                self.last_ts = batch.ts;
                if restarted {
                    Receipt::Restarted(stats)
                } else {
                    Receipt::Applied(stats)
                }
            }
            Err(error) => {
                self.expected = Some(seq + 1);
                self.last_ts = self.last_ts.max(batch.ts);
                self.skip(Some(seq), error)
            }
        }
    }

    fn skip(&self, seq: Option<u64>, error: KvEventError) -> Receipt {
        tracing::warn!(seq, error = %crate::error_chain(&error), "kv event batch skipped");
        Receipt::Skipped { seq, error }
    }

    /// Applies a decoded batch whole, or, if any event in it is invalid, none of it.
    pub fn apply(&mut self, batch: &EventBatch) -> Result<ApplyStats, KvEventError> {
        // Checked first, so that an invalid batch changes nothing.
        let mut new_places: Vec<Place> = Vec::new();
        for (i, e) in batch.events.iter().enumerate() {
            let Some(place) = place_of(e) else { continue };
            if !self.places.contains(&place) && !new_places.contains(&place) {
                if self.places.len() + new_places.len() == MAX_PLACES {
                    return Err(KvEventError::TooManyPlaces {
                        field: format!("events[{i}]"),
                        value: format!(
                            "medium {:?}, group {:?}, locality {:?}, ownership {:?}",
                            place.0, place.1, place.2, place.3
                        ),
                        max: MAX_PLACES,
                    });
                }
                new_places.push(place);
            }
        }
        for place in new_places {
            if place.2.as_deref() != Some("REMOTE") {
                self.local |= 1 << self.places.len();
            }
            self.places.push(place);
        }
        let mut stats = ApplyStats::default();
        for e in &batch.events {
            match e {
                KvEvent::BlockStored(s) => self.store(s, &mut stats),
                KvEvent::BlockRemoved(r) => self.remove(r, &mut stats),
                KvEvent::AllBlocksCleared => {
                    self.clear();
                    stats.cleared += 1;
                }
                KvEvent::Unknown { .. } => stats.unknown_events += 1,
            }
        }
        Ok(stats)
    }

    fn place_bit(&self, place: &Place) -> u64 {
        let i = self.places.iter().position(|p| p == place);
        // `apply` registered every place of the batch before applying any event.
        1u64 << i.unwrap_or(MAX_PLACES - 1)
    }

    /// Sets a block's places, keeping the held keys and the changes in step.
    fn set_places(&mut self, hash: &EngineHash, held_in: u64) {
        let Some(block) = self.blocks.get_mut(hash) else { return };
        let was = block.plain && block.held_in & self.local != 0;
        let now = block.plain && held_in & self.local != 0;
        block.held_in = held_in;
        let key = block.key;
        if held_in == 0 {
            self.blocks.remove(hash);
        }
        if was == now {
            return;
        }
        if now {
            let n = self.held.entry(key).or_insert(0);
            *n += 1;
            if *n == 1 {
                self.dirty.push(key);
            }
        } else if let Some(n) = self.held.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&key);
                self.dirty.push(key);
            }
        }
    }

    fn store(&mut self, s: &BlockStored, stats: &mut ApplyStats) {
        let bit = self.place_bit(&stored_place(s));
        let other_size = s.block_size != self.block_size.get();
        let lora = s.lora_id.is_some() || s.lora_name.is_some();
        let (mut parent, mut parent_plain) = match &s.parent_block_hash {
            None => (self.root, true),
            Some(h) => match self.blocks.get(h) {
                Some(b) => (b.key, b.plain),
                None => {
                    stats.orphans += s.block_hashes.len() as u64;
                    return;
                }
            },
        };
        if other_size {
            stats.other_size += s.block_hashes.len() as u64;
        }
        let size = s.block_size as usize;
        for (i, (hash, tokens)) in s.block_hashes.iter().zip(s.token_ids.chunks_exact(size)).enumerate() {
            let plain = parent_plain && !other_size && !lora && !s.has_extra_keys.get(i).copied().unwrap_or(false);
            // A block that gives no key is never chained on as plain, so its key is not needed.
            let key = if plain { prefix::chain_tokens(parent, tokens) } else { 0 };
            let block = *self.blocks.entry(hash.clone()).or_insert(Block { key, plain, held_in: 0 });
            if block.held_in & bit == 0 {
                stats.stored += 1;
                self.set_places(hash, block.held_in | bit);
            }
            parent = block.key;
            parent_plain = block.plain;
        }
    }

    fn remove(&mut self, r: &BlockRemoved, stats: &mut ApplyStats) {
        let bit = self.place_bit(&removed_place(r));
        for hash in &r.block_hashes {
            match self.blocks.get(hash) {
                Some(block) if block.held_in & bit != 0 => {
                    stats.removed += 1;
                    self.set_places(hash, block.held_in & !bit);
                }
                _ => stats.unknown_removed += 1,
            }
        }
    }
}
