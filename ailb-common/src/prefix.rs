//! Prefix keys: a prompt as a chain of 64-bit block keys, each covering the whole prefix up to
//! its block, so that two prompts sharing `k` leading blocks share exactly their first `k` keys
//! and no later one. The front door, the daemon (from the engines' KV events) and the socket
//! ABI's clients compute them here, so they agree bit for bit.
//!
//! # The algorithm (fixed: a change moves every cached prefix to new keys)
//!
//! With `H(bytes) = XXH3_64bits_withSeed(bytes, PREFIX_SEED)` (xxHash's XXH3, 64-bit output),
//! `le32`/`le64` little-endian encodings and `||` concatenation:
//!
//! * the root of a chain names its mode and block size, so that keys of different modes or
//!   block sizes never meet: `root = H("ailb.prefix.tokens.v1" || le32(block_size))` for token
//!   blocks, `root = H("ailb.prefix.text.v1" || le32(TEXT_CHUNK_BYTES))` for text chunks;
//! * `key_0 = H(le64(root) || block_0)`, `key_i = H(le64(key_{i-1}) || block_i)`, where a token
//!   block is its `block_size` token ids, each as `le32`, and a text block its
//!   [`TEXT_CHUNK_BYTES`] bytes;
//! * a key that comes out 0 is replaced by 1 (before it is chained on): 0 is the empty slot of
//!   fixed-size key arrays;
//! * a partial last block gets no key: an engine keys its cache by full blocks, so a key for
//!   it could name a block no engine offers.
//!
//! The test vectors in `prefix/tests.rs` pin this; they were checked against the reference
//! implementation of XXH3 (Python's `xxhash` package).
//!
//! # What is sent to the kernel
//!
//! A request carries at most [`PREFIX_KEYS_MAX`] keys ([`sent`]): with `n` keys, the stride `k`
//! is the smallest power of two with `ceil(n / k) <= PREFIX_KEYS_MAX`, and the keys sent are
//! those at blocks `k-1, 2k-1, 3k-1, ...` and always the last, `n-1`. Why this subset:
//!
//! * A backend that holds block `i` holds every block before it (an engine caches a prefix, and
//!   a key names a whole prefix), so "held" is monotone along the chain: true up to some block,
//!   false after. Restricted to any subsequence it is still monotone, so a search over the
//!   keys sent (from their end, then binary: `pick::Search`) finds the last sent key held in at
//!   most 8 lookups, 1 or 2 when the prompt is held whole or but its last key. The true held
//!   length lies between that block and the next key sent: the search under-estimates by fewer
//!   than `k` blocks and never over-estimates.
//! * The last key is always sent, so a prompt held whole is recognised exactly.
//! * Strides are powers of two and positions are multiples of the stride, so positions of a
//!   coarser stride are a subset of a finer one's: a request of another length, which picks
//!   another stride, still looks up keys at positions that the map learnt from earlier requests
//!   (what the approximate mode records is what requests sent).

/// The most prefix keys one request carries to the kernel.
pub const PREFIX_KEYS_MAX: usize = 16;

/// vLLM's default KV-cache block size, in tokens.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// The text mode's chunk, in bytes. A token of English text is about 4 bytes, so 64 bytes is
/// about one 16-token engine block: a text key then names about as much prompt as an engine
/// block, and a 6,000-token system prompt is about 375 chunks. Smaller chunks would resolve a
/// shared prefix more finely but the request sends at most [`PREFIX_KEYS_MAX`] keys anyway,
/// so the resolution is set by the stride long before it is set by the chunk.
pub const TEXT_CHUNK_BYTES: usize = 64;

/// XXH3's seed for every prefix key: the ASCII bytes `ailbpref` read big-endian.
pub const PREFIX_SEED: u64 = u64::from_be_bytes(*b"ailbpref");

/// The stride of the keys sent for a prompt of `n` keys: the smallest power of two `k` with
/// `ceil(n / k) <= PREFIX_KEYS_MAX` (1 while `n <= PREFIX_KEYS_MAX`).
pub const fn send_stride(n: usize) -> usize {
    let mut k = 1usize;
    while n.div_ceil(k) > PREFIX_KEYS_MAX {
        k *= 2;
    }
    k
}

/// The block positions whose keys a prompt of `n` keys sends, ascending: every
/// [`send_stride`]-th block (`k-1, 2k-1, ...`) and the last. At most [`PREFIX_KEYS_MAX`].
pub fn sent_positions(n: usize) -> impl Iterator<Item = usize> {
    let k = send_stride(n);
    let strided = (1..=n / k).map(move |j| j * k - 1);
    let last = (n > 0 && !n.is_multiple_of(k)).then(|| n - 1);
    strided.chain(last)
}

/// The keys a prompt sends, with their block positions: [`sent_positions`] over `keys`.
pub fn sent(keys: &[u64]) -> impl Iterator<Item = (usize, u64)> + '_ {
    sent_positions(keys.len()).map(move |i| (i, keys[i]))
}

#[cfg(feature = "std")]
mod keys;
#[cfg(feature = "std")]
pub use keys::*;

#[cfg(test)]
mod tests;
