use super::*;

#[test]
fn block_text_is_fixed_length_and_deterministic() {
    for id in [0, 1, 17, u64::MAX] {
        assert_eq!(block_text(id).len(), BLOCK_BYTES);
        assert_eq!(block_text(id), block_text(id));
    }
    assert_ne!(block_text(0), block_text(1));
    // A fixed rendering: a change here changes every replayed prompt (and the cache keys).
    assert!(block_text(0).starts_with("their large prompt while socket other "), "{}", &block_text(0)[..40]);
}

#[test]
fn prompt_is_its_blocks_in_order_cut_to_its_length() {
    let p = prompt_text(&[3, 4, 5], 1100, 9);
    assert_eq!(p.len(), 4400);
    assert_eq!(&p[..BLOCK_BYTES], block_text(3));
    assert_eq!(&p[BLOCK_BYTES..2 * BLOCK_BYTES], block_text(4));
    assert_eq!(&p[2 * BLOCK_BYTES..], &block_text(5)[..4400 - 2 * BLOCK_BYTES]);
    assert_eq!(tokens_of(p.len()), 1100);
    // Fewer ids than blocks: the rest is filler of this prompt's own.
    let q = prompt_text(&[3], 1100, 9);
    assert_eq!(q.len(), 4400);
    assert_eq!(&q[..BLOCK_BYTES], block_text(3));
    assert_ne!(&q[BLOCK_BYTES..], &prompt_text(&[3], 1100, 10)[BLOCK_BYTES..]);
}

#[test]
fn requests_sharing_k_leading_blocks_share_exactly_k_keys() {
    let a = prompt_text(&[0, 10, 11, 12], 2048, 1);
    let b = prompt_text(&[0, 10, 20, 21, 22], 2500, 2);
    let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    assert!((2 * BLOCK_BYTES..2 * BLOCK_BYTES + 64).contains(&common), "{common} bytes in common");
    let (ka, kb) = (block_keys(a.as_bytes()), block_keys(b.as_bytes()));
    assert_eq!((ka.len(), kb.len()), (4, 5));
    let shared = ka.iter().zip(&kb).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, 2);
    // Chained: the same block after a different prefix has a different key.
    let c = prompt_text(&[1, 10], 1024, 3);
    assert_ne!(block_keys(c.as_bytes())[1], ka[1]);
    assert_eq!(block_keys(b""), Vec::<u64>::new());
}

/// Leading keys shared between two prompts, by text and by [`cache_keys`].
fn shared_both_ways(a: (&[u64], u64), b: (&[u64], u64)) -> (usize, usize) {
    let lead = |x: &[u64], y: &[u64]| x.iter().zip(y).take_while(|(p, q)| p == q).count();
    let text = |(ids, tokens): (&[u64], u64), seed| block_keys(prompt_text(ids, tokens, seed).as_bytes());
    (lead(&text(a, 1), &text(b, 2)), lead(&cache_keys(a.0, a.1), &cache_keys(b.0, b.1)))
}

#[test]
fn cache_keys_match_where_the_texts_keys_match() {
    // A conversation's next turn: the partial last block grown to full, under the same id.
    assert_eq!(shared_both_ways((&[1, 2, 3], 1300), (&[1, 2, 3, 4], 2000)), (2, 2));
    // The same prompt again, partial block and all.
    assert_eq!(shared_both_ways((&[1, 2, 3], 1300), (&[1, 2, 3], 1300)), (3, 3));
    // The same partial block at another length.
    assert_eq!(shared_both_ways((&[1, 2, 3], 1300), (&[1, 2, 3], 1400)), (2, 2));
    // Full blocks only: every common id is a common key.
    assert_eq!(shared_both_ways((&[1, 2, 3], 1536), (&[1, 2, 3, 4], 1800)), (3, 3));
    // Ids past the prompt have no key; a prompt past its ids ends the keys there.
    assert_eq!(cache_keys(&[1, 2, 3], 600), vec![1, cache_keys(&[2], 88)[0]]);
    assert_eq!(cache_keys(&[1], 2000), vec![1]);
    assert!(cache_keys(&[7], 100)[0] & (1 << 62) != 0);
}

#[test]
fn cache_keys_agree_with_the_text_over_many_prompt_pairs() {
    let mut rng = SplitMix(42);
    for _ in 0..200 {
        let ids: Vec<u64> = (1..=6).collect();
        let ta = 1 + rng.next() % 3072;
        let tb = 1 + rng.next() % 3072;
        let nb = 1 + (rng.next() % 6) as usize;
        let (text, keys) = shared_both_ways((&ids, ta), (&ids[..nb], tb));
        assert_eq!(text, keys, "prompts of {ta} and {tb} tokens, {nb} ids");
    }
}
