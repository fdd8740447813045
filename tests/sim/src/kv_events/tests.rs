use std::num::NonZeroU32;

use ailb_common::prefix::token_keys;
use ailb_userspace::kv_events::{decode_batch, BlockIndex, EngineHash, KvEvent};

use super::*;

/// vLLM 0.32.0's own encoding of a batch with the fields a running engine fills
/// (`tests/engines/kv_events_fixture.py`).
const VLLM_INT_HASHES: &[u8] = include_bytes!("../../../engines/fixtures/kv_events/engine_int_hashes.msgpack");

fn int(h: &EngineHash) -> u64 {
    match h {
        EngineHash::Int(h) => *h,
        EngineHash::Bytes(b) => panic!("integer hash expected, got {b:?}"),
    }
}

#[test]
fn batches_are_encoded_byte_for_byte_as_vllm_encodes_them() {
    let batch = decode_batch(VLLM_INT_HASHES).expect("vLLM's batch decodes");
    let events: Vec<Event> = batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => {
                assert_eq!(s.medium.as_deref(), Some(MEDIUM));
                Event::Stored {
                    hashes: s.block_hashes.iter().map(int).collect(),
                    parent: s.parent_block_hash.as_ref().map(int),
                    tokens: s.token_ids.clone(),
                    block_size: s.block_size,
                }
            }
            KvEvent::BlockRemoved(r) => Event::Removed { hashes: r.block_hashes.iter().map(int).collect() },
            KvEvent::AllBlocksCleared => Event::Cleared,
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    let ours = encode_batch(batch.ts, &events, batch.data_parallel_rank.expect("a rank"));
    assert_eq!(ours, VLLM_INT_HASHES, "the simulator's encoding differs from msgspec's");
}

fn stored(id: u64, parent: Option<u64>, tokens: std::ops::Range<u32>) -> CacheChange {
    CacheChange::Stored { id, parent, tokens: tokens.collect() }
}

/// The events applied to an index of `block_size` (through the decoder).
fn apply(index: &mut BlockIndex, events: &[Event]) {
    let batch = decode_batch(&encode_batch(1.0, events, 0)).expect("decodes");
    index.apply(&batch).expect("applies");
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn model_blocks_become_engine_blocks_with_the_front_doors_keys() {
    const BS: u32 = 16;
    let bs = NonZeroU32::new(BS).expect("non-zero");
    let mut blocks = EngineBlocks::new(BS);
    let mut index = BlockIndex::new(bs);
    // A prompt of 600 tokens: a full 512-token block and a partial one of 88 (5 engine blocks
    // and 8 tokens that no engine block holds).
    let events = blocks.events(vec![stored(1, None, 0..512), stored(2, Some(1), 512..600)]);
    assert_eq!(blocks.len(), 32 + 5);
    apply(&mut index, &events);
    let prompt: Vec<u32> = (0..600).collect();
    assert_eq!(sorted(index.keys().collect()), sorted(token_keys(&prompt, bs)));
    // The same prompt grown to 700 tokens: the model caches a new partial block whose first 5
    // engine blocks are held already: only the new ones are announced.
    let events = blocks.events(vec![stored(3, Some(1), 512..700)]);
    let [Event::Stored { hashes, parent, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(hashes.len(), 11 - 5);
    assert!(parent.is_some());
    apply(&mut index, &events);
    let longer: Vec<u32> = (0..700).collect();
    assert_eq!(sorted(index.keys().collect()), sorted(token_keys(&longer, bs)));
    // The 600-token block evicted: its engine blocks are still held by the 700-token one.
    assert!(blocks.events(vec![CacheChange::Evicted { id: 2 }]).is_empty());
    // The 700-token one evicted: its 11 engine blocks go.
    let events = blocks.events(vec![CacheChange::Evicted { id: 3 }]);
    let [Event::Removed { hashes }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(hashes.len(), 11);
    apply(&mut index, &events);
    assert_eq!(sorted(index.keys().collect()), sorted(token_keys(&longer[..512], bs)));
    let events = blocks.events(vec![CacheChange::Cleared]);
    assert_eq!(events, vec![Event::Cleared]);
    apply(&mut index, &events);
    assert!(index.is_empty() && blocks.is_empty());
}

#[test]
fn blocks_without_tokens_are_not_announced() {
    let mut blocks = EngineBlocks::new(16);
    assert!(blocks.events(vec![stored(1, None, 0..0), stored(2, Some(1), 0..512)]).is_empty());
    assert!(blocks.events(vec![CacheChange::Evicted { id: 2 }, CacheChange::Evicted { id: 1 }]).is_empty());
}

#[test]
fn bad_settings_name_the_field() {
    let mut cfg = KvEventsConfig::new("tcp://127.0.0.1:5557", 24);
    assert!(cfg.validate().unwrap_err().contains("kv block size 24"));
    cfg.block_size = 128;
    cfg.validate().expect("128 divides 512");
    cfg.replay_endpoint = Some("127.0.0.1:5558".into());
    assert!(cfg.validate().unwrap_err().contains("replay endpoint \"127.0.0.1:5558\""));
}
