// The crate may be no_std; its tests run with std.
extern crate std;
use std::{vec, vec::Vec};

use super::*;

/// The largest block position at or before which a backend holding `held` leading blocks holds
/// the key, found by binary search over the keys sent (what the kernel will run): `None` when
/// it holds none of them.
fn search_sent(positions: &[usize], held: usize) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, positions.len());
    // Invariant: positions[..lo] held, positions[hi..] not held.
    while lo < hi {
        let mid = (lo + hi) / 2;
        if positions[mid] < held {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.checked_sub(1).map(|i| positions[i])
}

#[test]
fn the_selection_is_bounded_ascending_and_ends_at_the_last_key() {
    for n in 0..20_000usize {
        let p: Vec<usize> = sent_positions(n).collect();
        let k = send_stride(n);
        assert!(k.is_power_of_two(), "n={n}: stride {k}");
        assert!(p.len() <= PREFIX_KEYS_MAX, "n={n}: {} keys sent", p.len());
        assert!(p.windows(2).all(|w| w[0] < w[1]), "n={n}: {p:?} not strictly ascending");
        assert!(p.iter().all(|&i| i < n), "n={n}: {p:?} out of range");
        assert_eq!(p.last().copied(), n.checked_sub(1), "n={n}: the last key is not sent");
        // Every position but the last is on the stride's grid.
        assert!(p[..p.len().saturating_sub(1)].iter().all(|&i| (i + 1).is_multiple_of(k)), "n={n}: {p:?}");
        if n <= PREFIX_KEYS_MAX {
            assert_eq!(p, (0..n).collect::<Vec<_>>(), "n={n}: a short prompt sends every key");
        } else {
            // The stride is the smallest that fits: half of it would send too many.
            assert!(n.div_ceil(k / 2) > PREFIX_KEYS_MAX, "n={n}: stride {k} is not the smallest");
        }
    }
}

#[test]
fn a_coarser_strides_grid_is_within_a_finer_ones() {
    // A request of another length looks up the positions earlier requests recorded.
    for n in 1..4_000usize {
        let coarse = send_stride(n);
        for m in 1..n {
            let fine = send_stride(m);
            assert!(fine <= coarse && coarse.is_multiple_of(fine), "n={n} m={m}: {coarse} vs {fine}");
        }
    }
}

#[test]
fn sent_pairs_keys_with_their_positions() {
    let keys: Vec<u64> = (100..140).collect();
    let got: Vec<(usize, u64)> = sent(&keys).collect();
    // 40 keys: stride 4 (ceil(40 / 2) = 20 > 16, ceil(40 / 4) = 10), positions 3, 7, .., 39.
    let want: Vec<(usize, u64)> = (1..=10).map(|j| (j * 4 - 1, 100 + j as u64 * 4 - 1)).collect();
    assert_eq!(got, want);
    assert_eq!(sent(&keys[..17]).map(|(i, _)| i).collect::<Vec<_>>(), vec![1, 3, 5, 7, 9, 11, 13, 15, 16]);
    assert_eq!(sent(&[]).count(), 0);
}

mod search {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A binary search over the keys sent finds a held length that is never longer than
        /// the truth and short of it by less than the stride; a prompt held whole is found
        /// whole.
        #[test]
        fn binary_search_over_the_sent_keys_is_within_one_stride(n in 1usize..5_000, held_frac in 0.0f64..=1.0) {
            let held = ((n as f64) * held_frac) as usize;
            let positions: Vec<usize> = sent_positions(n).collect();
            let found = search_sent(&positions, held).map_or(0, |p| p + 1);
            let k = send_stride(n);
            prop_assert!(found <= held, "n={} held={} found={}", n, held, found);
            prop_assert!(held - found < k, "n={} held={} found={} stride={}", n, held, found, k);
            if held == n {
                prop_assert_eq!(found, n);
            }
        }
    }
}

#[cfg(feature = "std")]
mod keys {
    use core::num::NonZeroU32;
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::super::*;

    const BS: NonZeroU32 = match NonZeroU32::new(DEFAULT_BLOCK_SIZE) {
        Some(b) => b,
        None => panic!("block size 0"),
    };

    /// XXH3_64 of known inputs from xxHash's own test data (`sanity_test_vectors.h`,
    /// `XXH3_64bits_withSeed` of the empty input): the crate is XXH3 as specified.
    #[test]
    fn the_hash_is_xxh3() {
        use xxhash_rust::xxh3::xxh3_64_with_seed;
        assert_eq!(xxh3_64_with_seed(b"", 0), 0x2D06_8005_38D3_94C2);
    }

    /// Pinned keys: a change of algorithm, seed, encoding or tag fails here, deliberately. The
    /// values were computed independently with Python's `xxhash` package
    /// (`xxhash.xxh3_64_intdigest(data, seed=PREFIX_SEED)` over the concatenations the module
    /// docs define).
    #[test]
    fn test_vectors() {
        assert_eq!(PREFIX_SEED, 0x6169_6c62_7072_6566);
        assert_eq!(token_root(BS), ROOT_TOKENS_16);
        assert_eq!(text_root(), ROOT_TEXT);
        let tokens: Vec<u32> = (0..40).collect();
        assert_eq!(token_keys(&tokens, BS), vec![TOKENS_0_16, TOKENS_16_32]);
        let text = b"The quick brown fox jumps over the lazy dog, again and again and again, until the end";
        assert_eq!(text_keys(text), vec![TEXT_0]);
    }
    const ROOT_TOKENS_16: u64 = 0x5010_cdc2_ffbd_36f5;
    const ROOT_TEXT: u64 = 0x3e12_0d53_ebe7_f880;
    const TOKENS_0_16: u64 = 0x12ba_cfbc_a126_0df0;
    const TOKENS_16_32: u64 = 0x203c_89b8_9d45_2e3b;
    const TEXT_0: u64 = 0x4270_78be_5374_69f9;

    #[test]
    fn streaming_equals_the_one_shot_definition() {
        for len in [0usize, 1, 16, 63, 64, 65, 100, 1_000] {
            let block: Vec<u32> = (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
            let mut bytes = 0x0123_4567_89ab_cdefu64.to_le_bytes().to_vec();
            block.iter().for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
            assert_eq!(chain_tokens(0x0123_4567_89ab_cdef, &block), one_shot(&bytes), "{len} tokens");
            let text: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut bytes = 7u64.to_le_bytes().to_vec();
            bytes.extend_from_slice(&text);
            assert_eq!(chain_text(7, &text), one_shot(&bytes), "{len} bytes");
        }
        let mut root = TOKENS_ROOT_TAG.to_vec();
        root.extend_from_slice(&16u32.to_le_bytes());
        assert_eq!(token_root(BS), one_shot(&root));
        let mut root = TEXT_ROOT_TAG.to_vec();
        root.extend_from_slice(&(TEXT_CHUNK_BYTES as u32).to_le_bytes());
        assert_eq!(text_root(), one_shot(&root));
    }

    #[test]
    fn a_partial_last_block_gets_no_key() {
        for n in 0..100u32 {
            let tokens: Vec<u32> = (0..n).collect();
            assert_eq!(token_keys(&tokens, BS).len(), n as usize / 16, "{n} tokens");
            let text = vec![b'a'; n as usize * 3];
            assert_eq!(text_keys(&text).len(), n as usize * 3 / TEXT_CHUNK_BYTES, "{} bytes", n * 3);
        }
    }

    #[test]
    fn block_sizes_and_modes_do_not_share_keys() {
        let tokens: Vec<u32> = vec![7; 64];
        let mut seen = HashSet::new();
        for bs in [1u32, 2, 4, 8, 16, 32, 64] {
            let bs = NonZeroU32::new(bs).unwrap();
            assert!(seen.insert(token_root(bs)), "block size {bs}: root repeats");
            for k in token_keys(&tokens, bs) {
                assert!(seen.insert(k), "block size {bs}: key {k:#x} repeats another size's");
            }
        }
        assert!(seen.insert(text_root()));
        // The same bytes as text and as tokens: [7, 7, ..] as le32 are the bytes 7 0 0 0 ...
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        for k in text_keys(&bytes) {
            assert!(seen.insert(k), "text key {k:#x} repeats a token key");
        }
    }

    #[test]
    fn stand_in_keys_are_the_prompts_own_and_none_is_a_real_key() {
        let tokens: Vec<u32> = (0..64).collect();
        let real = token_keys(&tokens, BS);
        let parent = *real.last().unwrap();
        let a = stand_in_keys(parent, b"the last question", 5);
        assert_eq!(a.len(), 5);
        assert!(a.iter().all(|&k| k != 0));
        assert_eq!(a, stand_in_keys(parent, b"the last question", 5), "deterministic");
        assert_eq!(a[..3], stand_in_keys(parent, b"the last question", 3)[..], "a chain: fewer are its start");
        let distinct: HashSet<u64> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 5, "{a:?}");
        // Another tail, or another prefix before it, shares none.
        assert_eq!(shared(&a, &stand_in_keys(parent, b"the last question?", 5)), 0);
        assert_eq!(shared(&a, &stand_in_keys(real[0], b"the last question", 5)), 0);
        // No real key of the prompt, tokens or text, is among them.
        assert_eq!(shared(&a, &real), 0);
        assert_eq!(shared(&a, &text_keys(&[b'q'; 640])), 0);
        assert!(stand_in_keys(parent, b"x", 0).is_empty());
        // The documented definition, over one buffer each.
        let t = xxhash_rust::xxh3::xxh3_64_with_seed(b"the last question", PREFIX_SEED);
        let s0 = one_shot(&[&parent.to_le_bytes()[..], STAND_IN_TAG, &t.to_le_bytes()].concat());
        let s1 = one_shot(&[s0.to_le_bytes(), t.to_le_bytes()].concat());
        assert_eq!(a[..2], [s0, s1]);
    }

    /// The number of keys two key lists share, anywhere.
    fn shared(a: &[u64], b: &[u64]) -> usize {
        let a: HashSet<u64> = a.iter().copied().collect();
        b.iter().filter(|k| a.contains(k)).count()
    }

    proptest! {
        /// Two token prompts that agree on exactly `k` leading blocks (they differ inside block
        /// `k`, and may go on for any length after it) share exactly `k` keys: the first `k`,
        /// in place, and no other.
        #[test]
        fn token_prompts_sharing_k_blocks_share_exactly_k_keys(
            bs in 1u32..=32,
            k in 0usize..12,
            prefix_seed in any::<u64>(),
            differ_at in 0usize..32,
            tail_a in proptest::collection::vec(any::<u32>(), 0..200),
            tail_b in proptest::collection::vec(any::<u32>(), 0..200),
        ) {
            let size = bs as usize;
            let bs = NonZeroU32::new(bs).unwrap();
            let differ_at = differ_at % size;
            let common: Vec<u32> = (0..k * size + differ_at)
                .map(|i| (prefix_seed.wrapping_add(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32)
                .collect();
            let mut a = common.clone();
            let mut b = common;
            // The first token after the common part differs; each prompt then has at least one
            // more full block.
            a.push(1);
            b.push(2);
            a.extend(&tail_a);
            b.extend(&tail_b);
            a.extend(std::iter::repeat_n(3, size));
            b.extend(std::iter::repeat_n(3, size));
            let (ka, kb) = (token_keys(&a, bs), token_keys(&b, bs));
            prop_assert!(ka.len() > k && kb.len() > k);
            prop_assert_eq!(&ka[..k], &kb[..k]);
            prop_assert_eq!(shared(&ka, &kb), k);
        }

        /// The same for text chunks.
        #[test]
        fn text_prompts_sharing_k_chunks_share_exactly_k_keys(
            k in 0usize..12,
            common_seed in any::<u64>(),
            differ_at in 0usize..TEXT_CHUNK_BYTES,
            tail_a in proptest::collection::vec(any::<u8>(), 0..400),
            tail_b in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let common: Vec<u8> = (0..k * TEXT_CHUNK_BYTES + differ_at)
                .map(|i| (common_seed.wrapping_add(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
                .collect();
            let mut a = common.clone();
            let mut b = common;
            a.push(b'a');
            b.push(b'b');
            a.extend(&tail_a);
            b.extend(&tail_b);
            a.extend([b'.'; TEXT_CHUNK_BYTES]);
            b.extend([b'.'; TEXT_CHUNK_BYTES]);
            let (ka, kb) = (text_keys(&a), text_keys(&b));
            prop_assert!(ka.len() > k && kb.len() > k);
            prop_assert_eq!(&ka[..k], &kb[..k]);
            prop_assert_eq!(shared(&ka, &kb), k);
        }

        /// Keys are a function of the prefix alone: what follows a block does not change it.
        #[test]
        fn a_key_does_not_depend_on_what_follows(tokens in proptest::collection::vec(any::<u32>(), 0..400), cut in 0usize..400) {
            let cut = cut.min(tokens.len());
            let all = token_keys(&tokens, BS);
            let head = token_keys(&tokens[..cut], BS);
            prop_assert_eq!(&all[..head.len()], &head[..]);
        }
    }
}
