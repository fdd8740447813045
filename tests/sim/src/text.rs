//! Prompt text for block ids, and prefix-cache block keys from text.
//!
//! A trace knows a prompt only as token counts and the ids of its 512-token blocks. To send
//! real text (what a text-based router such as sglang's or vLLM's cache-aware router reads), the
//! replay renders each block id as [`BLOCK_BYTES`] bytes of words drawn from a fixed list by a
//! PRNG seeded with the id ([`block_text`]): the same id always gives the same text, two ids
//! (almost surely) different text. A prompt is its blocks' text in order ([`prompt_text`]), its
//! last block cut to the prompt's length, so that it is exactly `BYTES_PER_TOKEN x
//! prompt_tokens` bytes.
//!
//! The simulated server counts a prompt as `bytes / BYTES_PER_TOKEN` tokens (its token
//! approximation, about 4 bytes per English token) and derives its prefix-cache keys from the
//! text it receives ([`block_keys`]): fixed chunks of [`BLOCK_BYTES`] bytes (512 tokens of its
//! approximation), each key the hash of the previous key and the chunk, as vLLM chains its
//! block hashes, so that a key stands for the whole prefix up to its block. Unlike vLLM, the
//! partial last chunk has a key too: the trace's ids include the partial last block, and the
//! simulator caches it. A partial chunk's key is that of its bytes, so it matches only the same
//! block cut at the same length: a conversation's next turn, which resends the block grown to
//! its full length, misses it even though the synthetic mix gives both the same id. Models that
//! work on ids rather than text (the fleet model, the oracle bounds) take [`cache_keys`], the ids
//! with each partial block's length folded in, so that they count the hits the text gets.

use ailb_common::hash::ConversationHasher;

use crate::gpu::BLOCK_TOKENS;

/// Bytes per token in the simulator's token approximation.
pub const BYTES_PER_TOKEN: u64 = 4;
/// Bytes of text that stand for one KV block.
pub const BLOCK_BYTES: usize = (BLOCK_TOKENS * BYTES_PER_TOKEN) as usize;

/// The words block text is made of (ASCII, so every byte boundary is a char boundary).
const WORDS: [&str; 64] = [
    "the",
    "model",
    "answer",
    "question",
    "request",
    "token",
    "cache",
    "memory",
    "layer",
    "batch",
    "prefix",
    "block",
    "server",
    "router",
    "queue",
    "prompt",
    "context",
    "history",
    "user",
    "assistant",
    "system",
    "reply",
    "turn",
    "length",
    "value",
    "weight",
    "kernel",
    "socket",
    "packet",
    "stream",
    "first",
    "last",
    "over",
    "under",
    "with",
    "from",
    "into",
    "about",
    "after",
    "before",
    "again",
    "every",
    "other",
    "which",
    "while",
    "where",
    "there",
    "their",
    "would",
    "could",
    "should",
    "might",
    "large",
    "small",
    "quick",
    "slow",
    "green",
    "blue",
    "north",
    "south",
    "river",
    "stone",
    "light",
    "night",
];

/// splitmix64: a fixed, well-mixed sequence from a seed (no randomness at run time).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The text of block `id`: exactly [`BLOCK_BYTES`] bytes of space-separated words, the same for
/// the same id.
pub fn block_text(id: u64) -> String {
    let mut rng = SplitMix(id);
    let mut s = String::with_capacity(BLOCK_BYTES + 16);
    while s.len() < BLOCK_BYTES {
        let r = rng.next();
        s.push_str(WORDS[(r % WORDS.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(BLOCK_BYTES);
    s
}

/// The prompt of `prompt_tokens` tokens made of blocks `hash_ids` in order: each block's text,
/// the last one cut so that the prompt is `prompt_tokens x BYTES_PER_TOKEN` bytes. Ids past the
/// prompt's blocks are ignored; tokens past the ids are filled with the text of ids derived
/// from `filler_seed` (text no other prompt shares).
pub fn prompt_text(hash_ids: &[u64], prompt_tokens: u64, filler_seed: u64) -> String {
    let total = (prompt_tokens * BYTES_PER_TOKEN) as usize;
    let mut s = String::with_capacity(total);
    let mut filler = SplitMix(filler_seed ^ 0xf111_e5ee_d000_0000);
    let mut ids = hash_ids.iter().copied();
    while s.len() < total {
        // A filler id with the top bit set: trace ids are small, so it never collides with one.
        let id = ids.next().unwrap_or_else(|| filler.next() | 1 << 63);
        let block = block_text(id);
        let take = (total - s.len()).min(BLOCK_BYTES);
        s.push_str(&block[..take]);
    }
    s
}

/// Prompt tokens of `bytes` of text under the simulator's approximation (at least one).
pub fn tokens_of(bytes: usize) -> u64 {
    (bytes as u64 / BYTES_PER_TOKEN).max(1)
}

/// The prefix-cache keys of `text`: one per [`BLOCK_BYTES`] chunk (the last may be partial),
/// each the hash of the previous key and the chunk's bytes.
pub fn block_keys(text: &[u8]) -> Vec<u64> {
    let mut prev = 0u64;
    text.chunks(BLOCK_BYTES)
        .map(|chunk| {
            let mut h = ConversationHasher::new();
            for b in prev.to_le_bytes().iter().chain(chunk) {
                h.write_u8(*b);
            }
            prev = h.finish(8 + chunk.len() as u64);
            prev
        })
        .collect()
}

/// The prefix-cache keys of the prompt [`prompt_text`] renders from `hash_ids`, in id space:
/// a key per id inside the prompt, equal between two prompts exactly where their
/// [`block_keys`] are (given the same leading ids). A full block's key is its id; a partial last
/// block's key mixes its id with its length and has bit 62 set (trace and synthetic ids are far
/// smaller, and filler ids have bit 63 set), so a turn's partial block never matches the next
/// turn's full block of the same id, as their text does not.
pub fn cache_keys(hash_ids: &[u64], prompt_tokens: u64) -> Vec<u64> {
    let blocks = prompt_tokens.div_ceil(BLOCK_TOKENS) as usize;
    hash_ids
        .iter()
        .take(blocks)
        .enumerate()
        .map(|(i, &id)| {
            let tokens = (prompt_tokens - i as u64 * BLOCK_TOKENS).min(BLOCK_TOKENS);
            if tokens == BLOCK_TOKENS {
                id
            } else {
                let mixed = SplitMix(id ^ tokens.rotate_right(24)).next();
                (mixed | 1 << 62) & !(1 << 63)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
