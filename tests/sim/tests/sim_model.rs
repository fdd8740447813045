//! The simulated GPU's pure model: prefix-cache hits skip prefill, a request that can never fit
//! is rejected, a full batch or a full KV pool queues (first come, first served), LRU eviction
//! spares pinned and recently used blocks. No I/O, no clock: times are passed in.

use ailb_sim::{Admission, Gpu, GpuProfile, SimRequest, Started, BLOCK_TOKENS};

/// A GPU with exactly `blocks` KV blocks (1 MiB each: 2048 bytes per token), 1000 tok/s
/// prefill, 10 tok/s decode.
fn gpu(blocks: u64, max_seqs: usize) -> Gpu {
    let p = GpuProfile {
        gpu_type: "TEST".into(),
        gpu_memory_mb: 100 + blocks,
        weights_mb: 100,
        kv_bytes_per_token: 2048,
        prefill_tps: 1000.0,
        decode_tps: 10.0,
        max_seqs,
    };
    p.validate().unwrap_or_else(|e| panic!("test profile invalid: {e}"));
    assert_eq!(p.kv_blocks(), blocks);
    Gpu::new(p)
}

fn req(prompt_tokens: u64, max_tokens: u64, hash_ids: &[u64]) -> SimRequest {
    SimRequest { prompt_tokens, max_tokens, hash_ids: hash_ids.to_vec(), token_ids: Vec::new() }
}

fn started(a: Admission) -> Started {
    match a {
        Admission::Start(s) => s,
        other => panic!("expected the request to start, got {other:?}"),
    }
}

#[test]
fn presets_match_their_stated_sizes() {
    let a100 = GpuProfile::preset("a100-80gb").expect("a100 preset");
    let rtx = GpuProfile::preset("RTX3090-24GB").expect("3090 preset (case-insensitive)");
    // (81920 - 13352) MiB / 256 MiB per block; (24576 - 13352) / 256.
    assert_eq!(a100.kv_blocks(), 267);
    assert_eq!(rtx.kv_blocks(), 43);
    assert_eq!(a100.block_bytes(), 256 * 1024 * 1024);
    assert!(GpuProfile::preset("h100").is_none());
    a100.validate().expect("a100 valid");
    rtx.validate().expect("3090 valid");
}

#[test]
fn cached_prefix_skips_its_prefill() {
    let mut g = gpu(64, 8);
    let ids: Vec<u64> = (100..108).collect();
    let first = started(g.admit(req(8 * BLOCK_TOKENS, 4, &ids), 0.0));
    assert_eq!(first.cached_tokens, 0);
    assert!((first.prefill_s - 4.096).abs() < 1e-9, "4096 tokens at 1000 tok/s, got {}", first.prefill_s);
    assert!((first.decode_s - 0.3).abs() < 1e-9, "3 steps after the first token at 10 tok/s, got {}", first.decode_s);
    assert!(g.finish(first.id, 5.0).is_empty());
    assert!(ids.iter().all(|h| g.is_cached(*h)), "finished prompt blocks stay cached");

    // A later turn: the same 8 blocks plus 2 new ones.
    let mut next = ids.clone();
    next.extend([200, 201]);
    let second = started(g.admit(req(10 * BLOCK_TOKENS, 4, &next), 6.0));
    assert_eq!(second.cached_tokens, 8 * BLOCK_TOKENS);
    assert!((second.prefill_s - 1.024).abs() < 1e-9, "only 2 blocks computed, got {}", second.prefill_s);

    // A request that shares no leading block gets nothing, even if a later id is cached.
    let third = started(g.admit(req(2 * BLOCK_TOKENS, 1, &[999, 101]), 6.0));
    assert_eq!(third.cached_tokens, 0);

    let c = g.counters();
    assert_eq!(c.prefix_hit_blocks, 8);
    assert_eq!(c.prefix_query_blocks, 8 + 10 + 2);
    assert_eq!(c.prefix_hit_tokens, 8 * BLOCK_TOKENS);
    assert_eq!(c.prefix_query_tokens, 20 * BLOCK_TOKENS);
}

#[test]
fn fully_cached_prompt_still_computes_one_token() {
    let mut g = gpu(16, 4);
    let a = started(g.admit(req(1024, 1, &[1, 2]), 0.0));
    g.finish(a.id, 1.0);
    let b = started(g.admit(req(1024, 1, &[1, 2]), 2.0));
    assert_eq!(b.cached_tokens, 1024);
    assert!((b.prefill_s - 0.001).abs() < 1e-12);
}

#[test]
fn request_larger_than_the_pool_is_out_of_memory() {
    let mut g = gpu(10, 4);
    // 10 blocks exactly fits; 10 blocks + 1 token never can.
    let fits = started(g.admit(req(9 * BLOCK_TOKENS, BLOCK_TOKENS, &[]), 0.0));
    match g.admit(req(10 * BLOCK_TOKENS, 1, &[]), 0.0) {
        Admission::Reject(oom) => {
            assert_eq!((oom.needed_blocks, oom.capacity_blocks), (11, 10));
            let msg = oom.to_string();
            assert!(msg.contains("exceeds the KV cache capacity"), "message: {msg}");
        }
        other => panic!("expected an out-of-memory rejection, got {other:?}"),
    }
    assert_eq!(g.counters().oom_total, 1);
    assert_eq!(g.waiting(), 0, "a rejected request does not wait");
    g.finish(fits.id, 1.0);
}

#[test]
fn full_batch_queues_until_a_sequence_finishes() {
    let mut g = gpu(64, 2);
    let a = started(g.admit(req(100, 1, &[]), 0.0));
    let _b = started(g.admit(req(100, 1, &[]), 0.0));
    let Admission::Queued(c) = g.admit(req(100, 1, &[]), 0.0) else { panic!("third request should queue") };
    let Admission::Queued(d) = g.admit(req(100, 1, &[]), 0.0) else { panic!("fourth request should queue") };
    assert_eq!((g.running(), g.waiting()), (2, 2));
    let now_running = g.finish(a.id, 1.0);
    assert_eq!(now_running.iter().map(|s| s.id).collect::<Vec<_>>(), vec![c], "first come, first served");
    assert_eq!((g.running(), g.waiting()), (2, 1));
    assert!(g.cancel(d, 1.5).is_some_and(|s| s.is_empty()), "d was waiting; nothing starts in its place");
    assert!(g.cancel(c, 1.5).is_none(), "c already started");
    assert_eq!((g.running(), g.waiting()), (2, 0));
    let cs = g.counters();
    assert_eq!((cs.queued_total, cs.cancelled_total), (2, 1));
}

#[test]
fn full_kv_pool_queues_and_the_queue_head_blocks_later_requests() {
    let mut g = gpu(8, 16);
    let big = started(g.admit(req(5 * BLOCK_TOKENS, BLOCK_TOKENS, &[]), 0.0)); // 6 blocks
    assert!((g.kv_usage() - 0.75).abs() < 1e-12);
    let Admission::Queued(head) = g.admit(req(3 * BLOCK_TOKENS, 1, &[]), 0.0) else {
        panic!("4 blocks do not fit beside 6 of 8: should queue")
    };
    // One block would fit, but it arrived after the queued head (no overtaking).
    let Admission::Queued(small) = g.admit(req(10, 1, &[]), 0.0) else { panic!("should queue behind the head") };
    let after = g.finish(big.id, 3.0);
    assert_eq!(after.iter().map(|s| s.id).collect::<Vec<_>>(), vec![head, small]);
    assert_eq!(g.kv_blocks_in_use(), 5);
}

#[test]
fn lru_evicts_least_recently_used_unpinned_blocks() {
    let mut g = gpu(4, 4);
    for (t, ids) in [(0.0, [1, 2]), (1.0, [3, 4]), (2.0, [1, 2])] {
        let s = started(g.admit(req(2 * BLOCK_TOKENS - 1, 1, &ids), t));
        g.finish(s.id, t + 0.5);
    }
    assert_eq!(g.kv_blocks_cached(), 4);
    assert_eq!(g.kv_blocks_in_use(), 0, "cached unpinned blocks count as free");
    // Needs 2 new blocks: 3 and 4 were used least recently.
    let s = started(g.admit(req(2 * BLOCK_TOKENS - 1, 1, &[5, 6]), 3.0));
    assert!(g.is_cached(1) && g.is_cached(2) && !g.is_cached(3) && !g.is_cached(4));
    assert_eq!(g.counters().evicted_blocks, 2);
    // Pinned blocks (5, 6 running) are not evictable: 3 new blocks cannot fit beside them.
    let Admission::Queued(_) = g.admit(req(3 * BLOCK_TOKENS - 1, 1, &[7, 8, 9]), 3.0) else {
        panic!("only 2 evictable blocks beside the running sequence's 2")
    };
    let next = g.finish(s.id, 4.0);
    assert_eq!(next.len(), 1, "after the finish, 4 evictable blocks make room");
}

#[test]
fn busy_seconds_count_time_with_a_running_sequence() {
    let mut g = gpu(16, 4);
    let a = started(g.admit(req(10, 1, &[]), 1.0));
    let b = started(g.admit(req(10, 1, &[]), 2.0));
    assert!((g.busy_seconds(3.0) - 2.0).abs() < 1e-12);
    g.finish(a.id, 4.0);
    g.finish(b.id, 5.0);
    assert!((g.busy_seconds(10.0) - 4.0).abs() < 1e-12, "busy from 1 to 5, idle after");
    assert_eq!(g.memory_used_mb(), 100);
}
