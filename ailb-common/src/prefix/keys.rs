//! The keys (feature `std`): the algorithm of the module docs over XXH3 (`xxhash-rust`).

use core::num::NonZeroU32;

use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use super::{PREFIX_SEED, TEXT_CHUNK_BYTES};

/// What the root of a token chain hashes, before `le32(block_size)`.
pub const TOKENS_ROOT_TAG: &[u8] = b"ailb.prefix.tokens.v1";
/// What the root of a text chain hashes, before `le32(TEXT_CHUNK_BYTES)`.
pub const TEXT_ROOT_TAG: &[u8] = b"ailb.prefix.text.v1";

/// 0 is the empty slot of fixed-size key arrays, so no key is 0.
#[inline]
fn nonzero(k: u64) -> u64 {
    if k == 0 {
        1
    } else {
        k
    }
}

fn root(tag: &[u8], size: u32) -> u64 {
    let mut h = Xxh3::with_seed(PREFIX_SEED);
    h.update(tag);
    h.update(&size.to_le_bytes());
    nonzero(h.digest())
}

/// The parent of the first token block, for blocks of `block_size` tokens.
pub fn token_root(block_size: NonZeroU32) -> u64 {
    root(TOKENS_ROOT_TAG, block_size.get())
}

/// The parent of the first text chunk.
pub fn text_root() -> u64 {
    root(TEXT_ROOT_TAG, TEXT_CHUNK_BYTES as u32)
}

/// The key of a token block whose prefix before it has key `parent` (the chain's root for the
/// first block). The caller passes a full block.
pub fn chain_tokens(parent: u64, block: &[u32]) -> u64 {
    // Streamed in pieces through a stack buffer: XXH3's streaming digest equals its one-shot
    // digest of the concatenation (a tested property), and nothing is allocated per block.
    const PIECE: usize = 64;
    let mut h = Xxh3::with_seed(PREFIX_SEED);
    h.update(&parent.to_le_bytes());
    let mut buf = [0u8; PIECE * 4];
    for piece in block.chunks(PIECE) {
        for (i, t) in piece.iter().enumerate() {
            buf[i * 4..i * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..piece.len() * 4]);
    }
    nonzero(h.digest())
}

/// The key of a text chunk whose prefix before it has key `parent`.
pub fn chain_text(parent: u64, chunk: &[u8]) -> u64 {
    let mut h = Xxh3::with_seed(PREFIX_SEED);
    h.update(&parent.to_le_bytes());
    h.update(chunk);
    nonzero(h.digest())
}

/// The keys of a prompt's token ids in blocks of `block_size`: one per full block.
pub fn token_keys(tokens: &[u32], block_size: NonZeroU32) -> Vec<u64> {
    let size = block_size.get() as usize;
    let mut parent = token_root(block_size);
    tokens
        .chunks_exact(size)
        .map(|block| {
            parent = chain_tokens(parent, block);
            parent
        })
        .collect()
}

/// The keys of a prompt's bytes in chunks of [`TEXT_CHUNK_BYTES`]: one per full chunk.
pub fn text_keys(text: &[u8]) -> Vec<u64> {
    let mut parent = text_root();
    text.chunks_exact(TEXT_CHUNK_BYTES)
        .map(|chunk| {
            parent = chain_text(parent, chunk);
            parent
        })
        .collect()
}

/// What a chain of stand-in keys hashes first, after its parent key.
pub const STAND_IN_TAG: &[u8] = b"ailb.prefix.unread.v1";

/// `count` stand-in keys for the blocks of a prompt's `tail` that were not tokenized, after the
/// key `parent` of the last block that was (the chain's root when none was): the keys a prompt
/// sends at the positions that tail would fill, so that the positions, the stride and the
/// share of its keys found held stay what they would be for the whole prompt.
///
/// `s_0 = H(le64(parent) || STAND_IN_TAG || le64(H(tail)))`, `s_i = H(le64(s_{i-1}) ||
/// le64(H(tail)))`, none 0. They are a function of the whole prompt, so every gateway sends the
/// same ones for the same request, and two prompts that share the tail's first blocks but not
/// the whole tail share none of them: a stand-in matches only the same prompt again.
pub fn stand_in_keys(parent: u64, tail: &[u8], count: usize) -> Vec<u64> {
    let tail_hash = xxh3_64_with_seed(tail, PREFIX_SEED).to_le_bytes();
    let mut first = STAND_IN_TAG.to_vec();
    first.extend_from_slice(&tail_hash);
    // Each is `chain_text` of the one before: H(le64(previous) || bytes), never 0.
    let mut key = chain_text(parent, &first);
    (0..count)
        .map(|i| {
            if i > 0 {
                key = chain_text(key, &tail_hash);
            }
            key
        })
        .collect()
}

/// XXH3 with the prefix seed over one buffer: the definition [`chain_tokens`] and
/// [`chain_text`] stream (kept for the tests that check they agree).
pub fn one_shot(bytes: &[u8]) -> u64 {
    nonzero(xxh3_64_with_seed(bytes, PREFIX_SEED))
}
