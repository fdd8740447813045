//! The simulated GPU: a pure, deterministic model of one inference server's KV cache, batch
//! slots and wait queue. No I/O and no clock: every call takes `now` (simulated seconds), so the
//! model is unit-testable and the HTTP layer ([`crate::server`]) only turns its answers into
//! sleeps and bytes.
//!
//! KV memory is counted in blocks of [`BLOCK_TOKENS`] tokens, like vLLM's paged KV cache (and
//! like the `hash_ids` of the Mooncake trace). The pool holds
//! `(gpu_memory - weights) / (kv_bytes_per_token * 512)` blocks. A running sequence reserves
//! blocks for its whole prompt plus `max_tokens` up front (no preemption). Prompt blocks that
//! carry a prefix id stay in the pool after the sequence ends, as a prefix cache evicted least
//! recently used first; a new request whose leading ids are cached skips their prefill.
//! Admission is first come, first served: a request waits while the batch is full
//! (`max_seqs`) or its new blocks do not fit even after evicting every unpinned cached block,
//! and is rejected when it needs more blocks than the whole pool (it can never fit).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// Tokens per KV block (vLLM's prefix-caching block, the trace's `hash_ids` unit).
pub const BLOCK_TOKENS: u64 = 512;

const MIB: u64 = 1024 * 1024;

/// What the simulated GPU and model can do.
///
/// The presets model a 7B fp16 model (Llama-2-7B shape: 32 layers, hidden 4096, MHA):
/// - weights: 7e9 params x 2 bytes = 14e9 bytes = 13,352 MiB;
/// - KV per token: 2 (K and V) x 32 layers x 4096 x 2 bytes = 524,288 bytes (0.5 MiB), so one
///   512-token block is 256 MiB;
/// - prefill: compute bound, about 2 x 7e9 = 14 GFLOP per token. A100 (312 TFLOPS fp16 dense)
///   at about 35% MFU gives ~8,000 tok/s; RTX 3090 (71 TFLOPS fp16 tensor with fp16
///   accumulate, 35.6 with fp32) gives ~3,000 tok/s;
/// - decode: memory-bandwidth bound, one pass over the weights per step: A100 2.0 TB/s / 14 GB
///   ~ 140 steps/s alone, RTX 3090 0.94 TB/s ~ 65 steps/s; per sequence in a busy batch we
///   assume ~40 and ~25 tok/s (vLLM's published A100 7B serving numbers are in that range).
///   Decode speed per sequence does not depend on the batch size here (a simplification:
///   contention shows only through `max_seqs` and the KV budget);
/// - max concurrent sequences: 64 (A100) and 16 (RTX 3090), well under vLLM's default 256 so
///   that a realistic trace actually queues.
///
/// Memory sizes are MiB as NVML reports them (the A100 80GB shows 81,920 MiB, the 3090 24,576).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuProfile {
    /// Published as the GPU's NVML name (and so as `gpu_type`): a key of `[policy.gpu_capability]`.
    pub gpu_type: String,
    /// Total GPU memory in MiB.
    pub gpu_memory_mb: u64,
    /// Model weights in MiB.
    pub weights_mb: u64,
    /// KV-cache bytes per token.
    pub kv_bytes_per_token: u64,
    /// Prefill throughput of one sequence, tokens per second.
    pub prefill_tps: f64,
    /// Decode throughput of one sequence, tokens per second.
    pub decode_tps: f64,
    /// Most sequences running at once.
    pub max_seqs: usize,
}

impl GpuProfile {
    /// Names accepted by [`GpuProfile::preset`].
    pub const PRESETS: [&'static str; 2] = ["a100-80gb", "rtx3090-24gb"];

    /// A preset by name (case-insensitive): `a100-80gb` or `rtx3090-24gb`.
    pub fn preset(name: &str) -> Option<GpuProfile> {
        match name.to_ascii_lowercase().as_str() {
            "a100-80gb" => Some(GpuProfile {
                gpu_type: "A100-80GB".into(),
                gpu_memory_mb: 81_920,
                weights_mb: 13_352,
                kv_bytes_per_token: 524_288,
                prefill_tps: 8_000.0,
                decode_tps: 40.0,
                max_seqs: 64,
            }),
            "rtx3090-24gb" => Some(GpuProfile {
                gpu_type: "RTX3090-24GB".into(),
                gpu_memory_mb: 24_576,
                weights_mb: 13_352,
                kv_bytes_per_token: 524_288,
                prefill_tps: 3_000.0,
                decode_tps: 25.0,
                max_seqs: 16,
            }),
            _ => None,
        }
    }

    /// Bytes of one KV block.
    pub fn block_bytes(&self) -> u64 {
        self.kv_bytes_per_token.max(1) * BLOCK_TOKENS
    }

    /// KV blocks that fit beside the weights.
    pub fn kv_blocks(&self) -> u64 {
        self.gpu_memory_mb.saturating_sub(self.weights_mb) * MIB / self.block_bytes()
    }

    /// Checks the values a flag may have set; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.gpu_type.trim().is_empty() {
            return Err("gpu_type: must not be empty".into());
        }
        if !(self.prefill_tps > 0.0 && self.prefill_tps.is_finite()) {
            return Err(format!("prefill_tps: {} is not a positive number", self.prefill_tps));
        }
        if !(self.decode_tps > 0.0 && self.decode_tps.is_finite()) {
            return Err(format!("decode_tps: {} is not a positive number", self.decode_tps));
        }
        if self.max_seqs == 0 {
            return Err("max_seqs: must be at least 1".into());
        }
        if self.kv_bytes_per_token == 0 {
            return Err("kv_bytes_per_token: must be at least 1".into());
        }
        if self.kv_blocks() == 0 {
            return Err(format!(
                "gpu_memory_mb: {} MiB leaves no room for one {}-token KV block beside {} MiB of weights",
                self.gpu_memory_mb, BLOCK_TOKENS, self.weights_mb
            ));
        }
        Ok(())
    }
}

/// One request as the model sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SimRequest {
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// Tokens to generate (all of them: the simulator never stops early).
    pub max_tokens: u64,
    /// Ids of the prompt's 512-token blocks in order (a shared leading run = a shared prefix).
    /// Ids past the prompt's `ceil(prompt_tokens / 512)` blocks are ignored.
    pub hash_ids: Vec<u64>,
    /// The prompt's token ids, when the server knows them (a tokenizer, or its own
    /// pseudo-tokens): what the KV events of its blocks carry ([`CacheChange::Stored`]). Empty:
    /// the blocks are cached all the same and announced without tokens.
    pub token_ids: Vec<u32>,
}

impl SimRequest {
    /// Blocks the request holds while it runs: prompt plus output, at least one.
    pub fn blocks_needed(&self) -> u64 {
        (self.prompt_tokens + self.max_tokens).div_ceil(BLOCK_TOKENS).max(1)
    }
}

/// A change of the prefix cache, as [`Gpu::take_cache_changes`] reports it in order: what an
/// engine's KV events announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheChange {
    /// Block `id` entered the cache; `parent` is the prompt's block before it (`None`: the
    /// prompt's first). `tokens`: the block's token ids (up to [`BLOCK_TOKENS`]; a prompt's
    /// last block may be partial), empty when the request carried none.
    Stored { id: u64, parent: Option<u64>, tokens: Vec<u32> },
    /// Block `id` was evicted.
    Evicted { id: u64 },
    /// Every block was dropped ([`Gpu::reset_prefix_cache`]).
    Cleared,
}

/// Identifies one admitted or waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// A request that can never run: it needs more KV blocks than the whole pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this request needs {needed_tokens} tokens of KV cache ({needed_blocks} blocks of {BLOCK_TOKENS}), \
     which exceeds the KV cache capacity of {capacity_tokens} tokens ({capacity_blocks} blocks)"
)]
pub struct OutOfMemory {
    pub needed_tokens: u64,
    pub needed_blocks: u64,
    pub capacity_tokens: u64,
    pub capacity_blocks: u64,
}

/// A request that starts now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    pub id: ReqId,
    /// Prompt tokens found in the prefix cache (their prefill is skipped).
    pub cached_tokens: u64,
    /// Seconds of prefill for the rest of the prompt (at least one token is computed).
    pub prefill_s: f64,
    /// Seconds of decode after prefill: `max_tokens - 1` steps (prefill yields the first token).
    pub decode_s: f64,
    /// Seconds per generated token.
    pub token_s: f64,
}

/// The model's answer to a new request.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    Start(Started),
    /// Waits; a later [`Gpu::finish`] or [`Gpu::cancel`] starts it.
    Queued(ReqId),
    Reject(OutOfMemory),
}

/// Counters since start (vLLM counts prefix-cache queries and hits in tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub requests_total: u64,
    pub started_total: u64,
    pub finished_total: u64,
    pub cancelled_total: u64,
    pub queued_total: u64,
    pub oom_total: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub prefix_query_blocks: u64,
    pub prefix_hit_blocks: u64,
    pub evicted_blocks: u64,
}

#[derive(Debug, Clone)]
struct Block {
    refs: u32,
    tick: u64,
}

#[derive(Debug, Clone)]
struct Running {
    ids: Vec<u64>,
    private: u64,
    max_tokens: u64,
}

/// The simulated GPU (see the module doc).
#[derive(Debug, Clone)]
pub struct Gpu {
    profile: GpuProfile,
    capacity: u64,
    next_id: u64,
    tick: u64,
    blocks: HashMap<u64, Block>,
    /// Unpinned cached blocks by last use: the eviction order.
    lru: BTreeMap<u64, u64>,
    private: u64,
    running: HashMap<ReqId, Running>,
    waiting: VecDeque<(ReqId, SimRequest)>,
    counters: Counters,
    busy_s: f64,
    busy_since: Option<f64>,
    /// Cache changes not yet taken; `None`: not recorded (nobody takes them).
    changes: Option<Vec<CacheChange>>,
}

impl Gpu {
    pub fn new(profile: GpuProfile) -> Gpu {
        Gpu {
            capacity: profile.kv_blocks(),
            profile,
            next_id: 0,
            tick: 0,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            private: 0,
            running: HashMap::new(),
            waiting: VecDeque::new(),
            counters: Counters::default(),
            busy_s: 0.0,
            busy_since: None,
            changes: None,
        }
    }

    /// Starts recording the prefix cache's changes for [`Gpu::take_cache_changes`] (a server
    /// that publishes KV events); whoever turns it on takes them, or they pile up.
    pub fn record_cache_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The cache's changes since the last call, in order (empty unless recording).
    pub fn take_cache_changes(&mut self) -> Vec<CacheChange> {
        self.changes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&mut self, change: CacheChange) {
        if let Some(c) = &mut self.changes {
            c.push(change);
        }
    }

    /// Drops every cached block, as vLLM's `POST /reset_prefix_cache` does; like vLLM it
    /// refuses (`false`, nothing dropped) while a sequence runs and holds blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if !self.running.is_empty() {
            return false;
        }
        self.counters.evicted_blocks += self.blocks.len() as u64;
        self.blocks.clear();
        self.lru.clear();
        self.record(CacheChange::Cleared);
        true
    }

    pub fn profile(&self) -> &GpuProfile {
        &self.profile
    }

    /// A new request arrives at `now`.
    pub fn admit(&mut self, req: SimRequest, now: f64) -> Admission {
        self.counters.requests_total += 1;
        let needed = req.blocks_needed();
        if needed > self.capacity {
            self.counters.oom_total += 1;
            return Admission::Reject(OutOfMemory {
                needed_tokens: req.prompt_tokens + req.max_tokens,
                needed_blocks: needed,
                capacity_tokens: self.capacity * BLOCK_TOKENS,
                capacity_blocks: self.capacity,
            });
        }
        self.next_id += 1;
        let id = ReqId(self.next_id);
        if self.waiting.is_empty() && self.fits(&req) {
            return Admission::Start(self.start(id, req, now));
        }
        self.counters.queued_total += 1;
        self.waiting.push_back((id, req));
        Admission::Queued(id)
    }

    /// A running request ends (done or abandoned) at `now`; returns the waiting requests that
    /// start in its place, in arrival order.
    pub fn finish(&mut self, id: ReqId, now: f64) -> Vec<Started> {
        let Some(run) = self.running.remove(&id) else {
            return Vec::new();
        };
        self.counters.finished_total += 1;
        self.counters.generation_tokens_total += run.max_tokens;
        self.private -= run.private;
        for h in run.ids {
            self.tick += 1;
            if let Some(b) = self.blocks.get_mut(&h) {
                b.refs -= 1;
                b.tick = self.tick;
                if b.refs == 0 {
                    self.lru.insert(self.tick, h);
                }
            }
        }
        if self.running.is_empty() {
            if let Some(since) = self.busy_since.take() {
                self.busy_s += (now - since).max(0.0);
            }
        }
        self.drain(now)
    }

    /// A waiting request gives up at `now`. `None` if it was not waiting (it had started, or is
    /// unknown); else the requests that start now that it left the queue.
    pub fn cancel(&mut self, id: ReqId, now: f64) -> Option<Vec<Started>> {
        let pos = self.waiting.iter().position(|(w, _)| *w == id)?;
        self.waiting.remove(pos);
        self.counters.cancelled_total += 1;
        Some(self.drain(now))
    }

    fn drain(&mut self, now: f64) -> Vec<Started> {
        let mut out = Vec::new();
        while let Some((_, req)) = self.waiting.front() {
            if !self.fits(req) {
                break;
            }
            let (id, req) = self.waiting.pop_front().expect("front exists");
            out.push(self.start(id, req, now));
        }
        out
    }

    /// The request's prompt block ids (deduplicated, at most the prompt's blocks).
    fn prompt_ids(req: &SimRequest) -> Vec<u64> {
        let max = req.prompt_tokens.div_ceil(BLOCK_TOKENS) as usize;
        let mut seen = HashSet::new();
        req.hash_ids.iter().take(max).copied().filter(|h| seen.insert(*h)).collect()
    }

    fn fits(&self, req: &SimRequest) -> bool {
        if self.running.len() >= self.profile.max_seqs {
            return false;
        }
        let ids = Self::prompt_ids(req);
        let present_unpinned = ids.iter().filter(|h| self.blocks.get(h).is_some_and(|b| b.refs == 0)).count() as u64;
        let new_ids = ids.iter().filter(|h| !self.blocks.contains_key(h)).count() as u64;
        let new_blocks = new_ids + req.blocks_needed() - ids.len() as u64;
        let free = self.capacity - self.used_blocks();
        let evictable = self.lru.len() as u64 - present_unpinned;
        new_blocks <= free + evictable
    }

    fn start(&mut self, id: ReqId, req: SimRequest, now: f64) -> Started {
        let ids = Self::prompt_ids(&req);
        let hit = ids.iter().take_while(|h| self.blocks.contains_key(h)).count() as u64;
        let cached_tokens = (hit * BLOCK_TOKENS).min(req.prompt_tokens);
        let c = &mut self.counters;
        c.started_total += 1;
        c.prompt_tokens_total += req.prompt_tokens;
        c.prefix_query_tokens += req.prompt_tokens;
        c.prefix_hit_tokens += cached_tokens;
        c.prefix_query_blocks += ids.len() as u64;
        c.prefix_hit_blocks += hit;

        // Pin the present blocks first so that eviction below cannot take them.
        for h in &ids {
            if let Some(b) = self.blocks.get_mut(h) {
                if b.refs == 0 {
                    self.lru.remove(&b.tick);
                }
                b.refs += 1;
            }
        }
        let new_ids: Vec<u64> = ids.iter().copied().filter(|h| !self.blocks.contains_key(h)).collect();
        let private = req.blocks_needed() - ids.len() as u64;
        let new_blocks = new_ids.len() as u64 + private;
        while self.capacity - self.used_blocks() < new_blocks {
            let (_, victim) = self.lru.pop_first().expect("fits() counted enough evictable blocks");
            self.blocks.remove(&victim);
            self.counters.evicted_blocks += 1;
            self.record(CacheChange::Evicted { id: victim });
        }
        if self.changes.is_some() {
            // The prompt's blocks in order, for each new one its parent and its tokens.
            let max = req.prompt_tokens.div_ceil(BLOCK_TOKENS) as usize;
            let mut parent = None;
            for (i, &h) in req.hash_ids.iter().take(max).enumerate() {
                if new_ids.contains(&h) && !self.blocks.contains_key(&h) {
                    let from = (i * BLOCK_TOKENS as usize).min(req.token_ids.len());
                    let to = ((i + 1) * BLOCK_TOKENS as usize).min(req.token_ids.len());
                    let tokens = req.token_ids[from..to].to_vec();
                    self.record(CacheChange::Stored { id: h, parent, tokens });
                    // Recorded once even if the prompt names it twice.
                    self.blocks.insert(h, Block { refs: 0, tick: 0 });
                }
                parent = Some(h);
            }
        }
        for h in new_ids {
            self.tick += 1;
            self.blocks.insert(h, Block { refs: 1, tick: self.tick });
        }
        self.private += private;
        self.running.insert(id, Running { ids, private, max_tokens: req.max_tokens });
        if self.busy_since.is_none() {
            self.busy_since = Some(now);
        }
        let token_s = 1.0 / self.profile.decode_tps;
        Started {
            id,
            cached_tokens,
            prefill_s: (req.prompt_tokens - cached_tokens).max(1) as f64 / self.profile.prefill_tps,
            decode_s: req.max_tokens.saturating_sub(1) as f64 * token_s,
            token_s,
        }
    }

    /// Blocks in memory: cached (pinned or not) plus private.
    fn used_blocks(&self) -> u64 {
        self.blocks.len() as u64 + self.private
    }

    /// Blocks held by running sequences (cached unpinned blocks count as free, like vLLM).
    pub fn kv_blocks_in_use(&self) -> u64 {
        self.used_blocks() - self.lru.len() as u64
    }

    /// Blocks in the prefix cache (pinned or not).
    pub fn kv_blocks_cached(&self) -> u64 {
        self.blocks.len() as u64
    }

    pub fn kv_blocks_total(&self) -> u64 {
        self.capacity
    }

    /// vLLM's `kv_cache_usage_perc`: 0..=1.
    pub fn kv_usage(&self) -> f64 {
        self.kv_blocks_in_use() as f64 / self.capacity as f64
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Whether `id` is the prefix id of a block in the cache.
    pub fn is_cached(&self, hash_id: u64) -> bool {
        self.blocks.contains_key(&hash_id)
    }

    /// Seconds until `now` during which at least one sequence ran (the GPU was "busy" in
    /// NVML's sense); the busy fraction of a window is the difference of two samples over its
    /// length.
    pub fn busy_seconds(&self, now: f64) -> f64 {
        self.busy_s + self.busy_since.map_or(0.0, |s| (now - s).max(0.0))
    }

    /// MiB of GPU memory in use as NVML would show it: the weights plus the KV blocks held by
    /// running sequences (a real vLLM preallocates its whole pool; showing what is held gives
    /// the agent a signal that moves with load).
    pub fn memory_used_mb(&self) -> u64 {
        self.profile.weights_mb + self.kv_blocks_in_use() * self.profile.block_bytes() / MIB
    }
}
