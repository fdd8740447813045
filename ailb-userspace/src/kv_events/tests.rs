use std::num::NonZeroU32;

use ailb_common::prefix::token_keys;
use rmpv::Value;

use super::*;

const BS: NonZeroU32 = match NonZeroU32::new(4) {
    Some(b) => b,
    None => panic!("block size 0"),
};

fn s(v: &str) -> Value {
    Value::from(v)
}

fn ints(v: &[u64]) -> Value {
    Value::Array(v.iter().map(|&x| Value::from(x)).collect())
}

/// `BlockStored` as msgspec writes it with `array_like=True`: the tag, then the fields.
fn stored_array(hashes: &[u64], parent: Option<u64>, tokens: &[u64], medium: &str) -> Value {
    Value::Array(vec![
        s("BlockStored"),
        ints(hashes),
        parent.map_or(Value::Nil, Value::from),
        ints(tokens),
        Value::from(BS.get()),
        Value::Nil,
        s(medium),
        Value::Nil,
    ])
}

/// The same as a map (msgspec's default struct form), the tag under `"type"`, defaults left out.
fn stored_map(hashes: &[u64], parent: Option<u64>, tokens: &[u64], medium: &str) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), ints(hashes)),
        (s("parent_block_hash"), parent.map_or(Value::Nil, Value::from)),
        (s("token_ids"), ints(tokens)),
        (s("block_size"), Value::from(BS.get())),
        (s("lora_id"), Value::Nil),
        (s("medium"), s(medium)),
        (s("lora_name"), Value::Nil),
    ])
}

fn removed(hashes: &[u64], medium: &str) -> Value {
    Value::Array(vec![s("BlockRemoved"), ints(hashes), s(medium)])
}

fn cleared() -> Value {
    Value::Array(vec![s("AllBlocksCleared")])
}

fn batch(ts: f64, events: Vec<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Array(vec![Value::F64(ts), Value::Array(events), Value::from(0)]))
        .expect("encode");
    out
}

fn map_batch(ts: f64, events: Vec<Value>) -> Vec<u8> {
    let mut out = Vec::new();
    let v = Value::Map(vec![(s("ts"), Value::F64(ts)), (s("events"), Value::Array(events))]);
    rmpv::encode::write_value(&mut out, &v).expect("encode");
    out
}

fn frames(seq: u64, payload: &[u8]) -> [Vec<u8>; 3] {
    [b"kv".to_vec(), seq.to_be_bytes().to_vec(), payload.to_vec()]
}

fn receive(index: &mut BlockIndex, seq: u64, payload: &[u8]) -> Receipt {
    let f = frames(seq, payload);
    index.receive(&[&f[0], &f[1], &f[2]])
}

fn applied(r: Receipt) -> ApplyStats {
    match r {
        Receipt::Applied(s) => s,
        other => panic!("expected the batch applied, got {other:?}"),
    }
}

fn keys_of(tokens: &[u64]) -> Vec<u64> {
    let t: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    token_keys(&t, BS)
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn both_struct_forms_decode_to_the_same_events() {
    let tokens: Vec<u64> = (1..=8).collect();
    let a = decode_batch(&batch(1.5, vec![stored_array(&[10, 11], None, &tokens, "GPU")])).expect("array form");
    let m = decode_batch(&map_batch(1.5, vec![stored_map(&[10, 11], None, &tokens, "GPU")])).expect("map form");
    assert_eq!(a.events, m.events);
    assert_eq!(a.data_parallel_rank, Some(0));
    assert_eq!(m.data_parallel_rank, None);
    let KvEvent::BlockStored(st) = &a.events[0] else { panic!("{:?}", a.events) };
    assert_eq!(st.block_hashes, vec![EngineHash::Int(10), EngineHash::Int(11)]);
    assert_eq!(st.token_ids, (1..=8).collect::<Vec<u32>>());
    assert_eq!(st.medium.as_deref(), Some("GPU"));
    assert!(st.has_extra_keys.is_empty());
}

#[test]
fn stored_blocks_get_the_front_doors_keys() {
    let mut index = BlockIndex::new(BS);
    let tokens: Vec<u64> = (100..116).collect();
    // Two events: a prompt's first two blocks, then two more chained on the second.
    let p = batch(
        1.0,
        vec![stored_array(&[1, 2], None, &tokens[..8], "GPU"), stored_array(&[3, 4], Some(2), &tokens[8..], "GPU")],
    );
    let stats = applied(receive(&mut index, 0, &p));
    assert_eq!(stats.stored, 4);
    let want = keys_of(&tokens);
    assert_eq!(sorted(index.keys().collect()), sorted(want.clone()));
    assert_eq!(
        sorted(index.take_changes().into_iter().map(|(k, held)| if held { k } else { 0 }).collect()),
        sorted(want)
    );
    assert!(index.take_changes().is_empty(), "changes are taken once");
}

#[test]
fn block_removed_and_all_blocks_cleared() {
    let mut index = BlockIndex::new(BS);
    let tokens: Vec<u64> = (0..12).collect();
    let keys = keys_of(&tokens);
    applied(receive(&mut index, 0, &batch(1.0, vec![stored_array(&[1, 2, 3], None, &tokens, "GPU")])));
    index.take_changes();
    let stats = applied(receive(&mut index, 1, &batch(2.0, vec![removed(&[3], "GPU")])));
    assert_eq!(stats.removed, 1);
    assert!(index.holds(keys[1]) && !index.holds(keys[2]));
    assert_eq!(index.take_changes(), vec![(keys[2], false)]);
    let stats = applied(receive(&mut index, 2, &batch(3.0, vec![cleared()])));
    assert_eq!(stats.cleared, 1);
    assert!(index.is_empty() && index.blocks() == 0);
    assert_eq!(sorted(index.take_changes().into_iter().map(|(k, _)| k).collect()), sorted(keys[..2].to_vec()));
    // Removing what is gone is counted, not an error.
    let stats = applied(receive(&mut index, 3, &batch(4.0, vec![removed(&[1], "GPU")])));
    assert_eq!(stats.unknown_removed, 1);
}

#[test]
fn a_block_is_held_while_any_medium_holds_it() {
    let mut index = BlockIndex::new(BS);
    let tokens: Vec<u64> = (0..4).collect();
    let key = keys_of(&tokens)[0];
    let p = batch(1.0, vec![stored_array(&[7], None, &tokens, "GPU"), stored_array(&[7], None, &tokens, "CPU")]);
    applied(receive(&mut index, 0, &p));
    applied(receive(&mut index, 1, &batch(2.0, vec![removed(&[7], "GPU")])));
    assert!(index.holds(key), "the CPU copy still holds it");
    applied(receive(&mut index, 2, &batch(3.0, vec![removed(&[7], "CPU")])));
    assert!(!index.holds(key));
}

#[test]
fn a_gap_asks_for_a_replay_and_the_replay_fills_it() {
    let mut index = BlockIndex::new(BS);
    let t: Vec<u64> = (0..12).collect();
    let b0 = batch(1.0, vec![stored_array(&[1], None, &t[..4], "GPU")]);
    let b1 = batch(2.0, vec![stored_array(&[2], Some(1), &t[4..8], "GPU")]);
    let b2 = batch(3.0, vec![stored_array(&[3], Some(2), &t[8..], "GPU")]);
    applied(receive(&mut index, 0, &b0));
    // Batch 1 is lost on the way; batch 2 arrives.
    match receive(&mut index, 2, &b2) {
        Receipt::Gap { expected: 1, got: 2 } => {}
        other => panic!("expected a gap from 1, got {other:?}"),
    }
    assert_eq!(index.len(), 1, "nothing after the gap is applied before the replay");
    // The replay socket answers from 1: batches 1 and 2, then the end.
    let replay = [(1u64, &b1), (2, &b2)];
    for (seq, payload) in replay {
        let seq_frame = seq.to_be_bytes();
        let Replayed::Batch { seq, payload } = split_replay(&[&seq_frame, payload]).expect("replay frame") else {
            panic!("not a batch")
        };
        applied(index.receive_payload(seq, payload));
    }
    // vLLM 0.32.0's end marker as a DEALER receives it: delimiter, empty topic, -1, nothing.
    assert_eq!(split_replay(&[b"", b"", &u64::MAX.to_be_bytes(), b""]).expect("end"), Replayed::End);
    let seq = 9u64.to_be_bytes();
    for frames in [&[b"".as_slice(), b"kv", &seq, b"p"][..], &[b"kv", &seq, b"p"], &[&seq, b"p"]] {
        assert_eq!(split_replay(frames).expect("a layout"), Replayed::Batch { seq: 9, payload: b"p" });
    }
    assert_eq!(sorted(index.keys().collect()), sorted(keys_of(&t)));
    // The live stream goes on; batch 2 seen again is a duplicate.
    assert!(matches!(receive(&mut index, 2, &b2), Receipt::Duplicate { seq: 2 }));
    assert_eq!(index.expected(), Some(3));
}

#[test]
fn a_replay_that_cannot_fill_the_gap_drops_what_is_held() {
    let mut index = BlockIndex::new(BS);
    applied(receive(&mut index, 0, &batch(1.0, vec![stored_array(&[1], None, &[1, 2, 3, 4], "GPU")])));
    assert!(matches!(receive(&mut index, 50, &batch(2.0, vec![])), Receipt::Gap { expected: 1, got: 50 }));
    index.resync(50);
    assert!(index.is_empty());
    applied(receive(&mut index, 50, &batch(2.0, vec![])));
}

#[test]
fn an_engine_restart_starts_over() {
    let mut index = BlockIndex::new(BS);
    let t: Vec<u64> = (0..4).collect();
    applied(receive(&mut index, 0, &batch(1.0, vec![stored_array(&[1], None, &t, "GPU")])));
    applied(receive(&mut index, 1, &batch(2.0, vec![])));
    // Sequence 0 again, but newer: a new engine process with an empty cache.
    match receive(&mut index, 0, &batch(10.0, vec![stored_array(&[9], None, &[5, 6, 7, 8], "GPU")])) {
        Receipt::Restarted(stats) => assert_eq!(stats.stored, 1),
        other => panic!("expected a restart, got {other:?}"),
    }
    assert_eq!(sorted(index.keys().collect()), keys_of(&[5, 6, 7, 8]));
}

#[test]
fn a_malformed_batch_is_skipped_and_nothing_else_is_lost() {
    let mut index = BlockIndex::new(BS);
    let t: Vec<u64> = (0..8).collect();
    applied(receive(&mut index, 0, &batch(1.0, vec![stored_array(&[1], None, &t[..4], "GPU")])));
    let before: Vec<u64> = sorted(index.keys().collect());
    // A valid event then one with a token id out of range: the whole batch is skipped, the
    // valid event included.
    let bad = batch(2.0, vec![removed(&[1], "GPU"), stored_array(&[2], Some(1), &[1, 2, 3, 1 << 40], "GPU")]);
    match receive(&mut index, 1, &bad) {
        Receipt::Skipped { seq: Some(1), error } => {
            let msg = error.to_string();
            assert!(msg.contains("events[1].token_ids[3]") && msg.contains("1099511627776"), "{msg}");
        }
        other => panic!("expected the batch skipped, got {other:?}"),
    }
    assert_eq!(sorted(index.keys().collect()), before, "the skipped batch changed the index");
    // Not msgpack at all, and a message of the wrong shape: skipped too.
    assert!(matches!(receive(&mut index, 2, &[0xc1]), Receipt::Skipped { seq: Some(2), .. }));
    assert!(matches!(index.receive(&[b"kv"]), Receipt::Skipped { seq: None, .. }));
    // The next batch applies: its sequence follows the skipped ones.
    applied(receive(&mut index, 3, &batch(3.0, vec![stored_array(&[2], Some(1), &t[4..], "GPU")])));
    assert_eq!(sorted(index.keys().collect()), sorted(keys_of(&t)));
}

#[test]
fn blocks_of_another_size_are_tracked_not_keyed_and_the_batch_goes_on() {
    let mut index = BlockIndex::new(BS);
    let t: Vec<u64> = (0..8).collect();
    // A full block, a partial entry of 2 tokens chained on it (vLLM 0.32 stores such entries at
    // finer boundaries), and another full block: the batch applies, the partial entry gives no key.
    let mut partial = stored_array(&[2], Some(1), &[50, 51], "GPU");
    let Value::Array(fields) = &mut partial else { unreachable!() };
    fields[4] = Value::from(2);
    let p = batch(
        1.0,
        vec![stored_array(&[1], None, &t[..4], "GPU"), partial, stored_array(&[3], Some(1), &t[4..], "GPU")],
    );
    let stats = applied(receive(&mut index, 0, &p));
    assert_eq!((stats.stored, stats.other_size), (3, 1));
    assert_eq!(sorted(index.keys().collect()), sorted(keys_of(&t)));
    assert_eq!(index.blocks(), 3);
    applied(receive(&mut index, 1, &batch(2.0, vec![removed(&[2], "GPU")])));
    assert_eq!((index.blocks(), index.len()), (2, 2));
}

#[test]
fn a_remote_tier_does_not_make_a_block_held() {
    let mut index = BlockIndex::new(BS);
    let t: Vec<u64> = (0..4).collect();
    let mut remote = stored_map(&[1], None, &t, "CPU");
    let Value::Map(fields) = &mut remote else { unreachable!() };
    fields.push((s("locality"), s("REMOTE")));
    applied(receive(&mut index, 0, &map_batch(1.0, vec![remote])));
    assert_eq!((index.blocks(), index.len()), (1, 0));
    applied(receive(&mut index, 1, &batch(2.0, vec![stored_array(&[1], None, &t, "GPU")])));
    assert!(index.holds(keys_of(&t)[0]));
}

#[test]
fn orphans_and_blocks_with_extra_keys_give_no_keys() {
    let mut index = BlockIndex::new(BS);
    // The parent was stored before the index subscribed.
    let stats = applied(receive(&mut index, 0, &batch(1.0, vec![stored_array(&[5], Some(4), &[1, 2, 3, 4], "GPU")])));
    assert_eq!((stats.orphans, stats.stored), (1, 0));
    // A salted first block, and its plain-looking child: neither is offered.
    let mut salted = stored_map(&[1, 2], None, &(0..8).collect::<Vec<_>>(), "GPU");
    let Value::Map(fields) = &mut salted else { unreachable!() };
    fields.push((s("extra_keys"), Value::Array(vec![Value::Array(vec![s("salt")]), Value::Nil])));
    let stats = applied(receive(&mut index, 1, &map_batch(2.0, vec![salted])));
    assert_eq!(stats.stored, 2);
    assert_eq!((index.blocks(), index.len()), (2, 0));
    // A LoRA adapter's blocks likewise.
    let mut lora = stored_map(&[3], None, &[1, 2, 3, 4], "GPU");
    let Value::Map(fields) = &mut lora else { unreachable!() };
    fields.retain(|(k, _)| k.as_str() != Some("lora_name"));
    fields.push((s("lora_name"), s("adapter")));
    applied(receive(&mut index, 2, &map_batch(3.0, vec![lora])));
    assert_eq!((index.blocks(), index.len()), (3, 0));
}

#[test]
fn decoding_errors_name_the_field_and_the_value() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (batch(1.0, vec![Value::Array(vec![s("BlockStored"), ints(&[1])])]), "events[0].parent_block_hash"),
        (batch(1.0, vec![Value::Array(vec![Value::from(3)])]), "events[0].type"),
        (batch(1.0, vec![stored_array(&[1, 2], None, &[1, 2, 3, 4], "GPU")]), "events[0].token_ids"),
        (batch(1.0, vec![Value::Array(vec![s("BlockRemoved"), s("x")])]), "events[0].block_hashes"),
        (map_batch(1.0, vec![Value::Map(vec![(s("type"), s("BlockRemoved"))])]), "events[0].block_hashes"),
    ];
    for (payload, field) in cases {
        let err = decode_batch(&payload).expect_err(field);
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    let mut p = batch(1.0, vec![]);
    p.push(0);
    assert!(matches!(decode_batch(&p), Err(KvEventError::TrailingBytes { extra: 1 })));
    assert!(matches!(decode_batch(&batch(1.0, vec![Value::Array(vec![s("Compacted")])])).map(|b| b.events),
        Ok(e) if e == vec![KvEvent::Unknown { tag: "Compacted".into() }]));
}

#[test]
fn message_frames() {
    let seq = 7u64.to_be_bytes();
    let m = split_message(&[b"t", &seq, b"p"]).expect("three frames");
    assert_eq!(m, Message { topic: b"t", seq: 7, payload: b"p" });
    assert!(matches!(split_message(&[b"t", &[0; 4], b"p"]), Err(KvEventError::Sequence { len: 4 })));
    assert!(matches!(split_message(&[b"t"]), Err(KvEventError::Frames { count: 1 })));
    assert!(matches!(split_replay(&[b"x"]), Err(KvEventError::ReplayFrames { count: 1 })));
    assert!(matches!(split_replay(&[b"", b"", b"", &[0; 8], b""]), Err(KvEventError::ReplayFrames { count: 5 })));
    assert_eq!(wire::replay_request(258), [0, 0, 0, 0, 0, 0, 1, 2]);
}

/// Batches written by vLLM 0.32.0's own `KVEventBatch` classes and msgspec's encoder
/// (`tests/engines/kv_events_fixture.py`; what they hold is in its docstring).
mod vllm_fixtures {
    use super::*;

    const INT_HASHES: &[u8] = include_bytes!("../../../tests/engines/fixtures/kv_events/int_hashes.msgpack");
    const BYTES_HASHES: &[u8] = include_bytes!("../../../tests/engines/fixtures/kv_events/bytes_hashes.msgpack");
    const EXTRA_KEYS: &[u8] = include_bytes!("../../../tests/engines/fixtures/kv_events/extra_keys.msgpack");
    const ENGINE_INT_HASHES: &[u8] =
        include_bytes!("../../../tests/engines/fixtures/kv_events/engine_int_hashes.msgpack");

    const BLOCK: NonZeroU32 = match NonZeroU32::new(16) {
        Some(b) => b,
        None => panic!("block size 0"),
    };

    /// The fixture's prompt: four blocks of 16 tokens, 1000..1064.
    fn prompt_keys() -> Vec<u64> {
        token_keys(&(1000..1064).collect::<Vec<u32>>(), BLOCK)
    }

    /// The batch's events applied one by one, the keys held after each.
    fn keys_after_each(batch: &EventBatch) -> Vec<Vec<u64>> {
        let mut index = BlockIndex::new(BLOCK);
        batch
            .events
            .iter()
            .map(|e| {
                let one = EventBatch { ts: batch.ts, events: vec![e.clone()], data_parallel_rank: None };
                index.apply(&one).expect("applies");
                sorted(index.keys().collect())
            })
            .collect()
    }

    #[test]
    fn integer_hashes() {
        let batch = decode_batch(INT_HASHES).expect("vLLM's batch decodes");
        assert_eq!((batch.ts, batch.data_parallel_rank, batch.events.len()), (1_764_806_400.25, Some(0), 4));
        let KvEvent::BlockStored(second) = &batch.events[1] else { panic!("{:?}", batch.events[1]) };
        assert_eq!(second.parent_block_hash, Some(EngineHash::Int(0x2222_0000_0000_0002)));
        // A hash above 2^63 (msgpack uint64).
        assert_eq!(second.block_hashes[1], EngineHash::Int(u64::MAX - 4));
        assert_eq!((second.block_size, second.medium.as_deref(), second.lora_id), (16, Some("GPU"), None));
        assert_eq!(batch.events[3], KvEvent::AllBlocksCleared);
        let keys = prompt_keys();
        assert_eq!(
            keys_after_each(&batch),
            vec![sorted(keys[..2].to_vec()), sorted(keys.clone()), sorted(keys[..3].to_vec()), vec![]]
        );
    }

    /// A running engine fills `extra_keys` with one nil per block, `group_idx` 0 and
    /// `kv_cache_spec_kind`: the same blocks, the same keys.
    #[test]
    fn the_fields_a_running_engine_fills_change_nothing() {
        let batch = decode_batch(ENGINE_INT_HASHES).expect("vLLM's batch decodes");
        let KvEvent::BlockStored(first) = &batch.events[0] else { panic!("{:?}", batch.events[0]) };
        assert_eq!((first.has_extra_keys.as_slice(), first.group_idx), (&[false, false][..], Some(0)));
        let KvEvent::BlockRemoved(removed) = &batch.events[2] else { panic!("{:?}", batch.events[2]) };
        assert_eq!(removed.group_idx, Some(0));
        let plain = decode_batch(INT_HASHES).expect("decodes");
        assert_eq!(keys_after_each(&batch), keys_after_each(&plain));
    }

    #[test]
    fn bytes_hashes_give_the_same_keys() {
        let batch = decode_batch(BYTES_HASHES).expect("vLLM's batch decodes");
        let KvEvent::BlockRemoved(removed) = &batch.events[2] else { panic!("{:?}", batch.events[2]) };
        assert_eq!(removed.block_hashes, vec![EngineHash::Bytes(vec![4; 32].into_boxed_slice())]);
        let ints = decode_batch(INT_HASHES).expect("decodes");
        assert_eq!(keys_after_each(&batch), keys_after_each(&ints));
    }

    #[test]
    fn salted_and_lora_blocks_are_tracked_but_give_no_keys() {
        let batch = decode_batch(EXTRA_KEYS).expect("vLLM's batch decodes");
        let [KvEvent::BlockStored(salted), KvEvent::BlockStored(lora)] = &batch.events[..] else {
            panic!("{:?}", batch.events)
        };
        assert_eq!((salted.has_extra_keys.as_slice(), salted.lora_id), (&[true][..], None));
        assert_eq!((lora.lora_id, lora.lora_name.as_deref()), (Some(3), Some("adapter")));
        let mut index = BlockIndex::new(BLOCK);
        index.apply(&batch).expect("applies");
        assert_eq!((index.blocks(), index.len()), (2, 0));
    }

    #[test]
    fn as_the_publisher_frames_them() {
        let mut index = BlockIndex::new(BLOCK);
        let f = [b"".as_slice(), &0u64.to_be_bytes(), INT_HASHES];
        let Receipt::Applied(stats) = index.receive(&f) else { panic!("not applied") };
        assert_eq!((stats.stored, stats.removed, stats.cleared), (4, 1, 1));
        assert!(index.is_empty());
    }
}

/// What the fuzz target `kv_events` checks, on vLLM's batches with bytes flipped, cut or
/// appended: no panic; a batch that does not apply changes nothing and spends its sequence
/// number; one that applies gives only non-zero keys and is a duplicate the second time.
mod mutated {
    use proptest::prelude::*;

    use super::*;

    const SEEDS: [&[u8]; 3] = [
        include_bytes!("../../../tests/engines/fixtures/kv_events/int_hashes.msgpack"),
        include_bytes!("../../../tests/engines/fixtures/kv_events/bytes_hashes.msgpack"),
        include_bytes!("../../../tests/engines/fixtures/kv_events/extra_keys.msgpack"),
    ];

    proptest! {
        #[test]
        fn a_mutated_batch_applies_whole_or_not_at_all(
            seed in 0usize..3,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            tail in proptest::collection::vec(any::<u8>(), 0..3),
        ) {
            let mut data = SEEDS[seed].to_vec();
            for (at, byte) in flips {
                let i = at.index(data.len());
                data[i] = byte;
            }
            if tail.is_empty() {
                data.truncate(cut.index(data.len() + 1));
            } else {
                data.extend(tail);
            }
            let mut index = BlockIndex::new(NonZeroU32::new(16).expect("16"));
            match index.receive_payload(0, &data) {
                Receipt::Applied(_) => {
                    prop_assert!(index.keys().all(|k| k != 0));
                    prop_assert!(index.len() <= index.blocks());
                    let keys = sorted(index.keys().collect());
                    let again = matches!(index.receive_payload(0, &data), Receipt::Duplicate { seq: 0 });
                    prop_assert!(again, "the same batch again is not a duplicate");
                    prop_assert_eq!(sorted(index.keys().collect()), keys);
                }
                Receipt::Skipped { seq, error } => {
                    prop_assert_eq!(seq, Some(0));
                    prop_assert!(index.is_empty() && index.blocks() == 0, "{}", error);
                    prop_assert_eq!(index.expected(), Some(1));
                }
                other => prop_assert!(false, "the first batch: {:?}", other),
            }
        }
    }
}

/// The subscriber against a publisher that speaks as vLLM 0.32.0's does (a PUB socket, and a
/// ROUTER answering replays as `ZmqEventPublisher._service_replay` does), over loopback TCP.
mod sockets {
    use std::time::Duration;

    use bytes::Bytes;
    use zeromq::{prelude::*, PubSocket, RouterSocket, ZmqMessage};

    use super::*;

    fn message(frames: &[&[u8]]) -> ZmqMessage {
        let frames: Vec<Bytes> = frames.iter().map(|f| Bytes::copy_from_slice(f)).collect();
        ZmqMessage::try_from(frames).expect("at least one frame")
    }

    /// Answers one replay request from `buffer` (the batches the engine still holds).
    async fn serve_one_replay(mut router: RouterSocket, buffer: Vec<(u64, Vec<u8>)>) -> u64 {
        let request = router.recv().await.expect("a replay request");
        let frames = request.into_vec();
        assert_eq!(frames.len(), 3, "vLLM's ROUTER takes [identity, \"\", start]: {frames:?}");
        assert!(frames[1].is_empty());
        let start = u64::from_be_bytes(frames[2].as_ref().try_into().expect("8 bytes"));
        for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
            router.send(message(&[&frames[0], b"", b"kv", &seq.to_be_bytes(), payload])).await.expect("sent");
        }
        router.send(message(&[&frames[0], b"", b"", &u64::MAX.to_be_bytes(), b""])).await.expect("sent");
        start
    }

    /// A subscriber that has applied batch 0 (published until it arrives: a PUB drops what it
    /// sends before the subscription reaches it), and its publisher.
    async fn subscribed(b0: &[u8], replay: &str) -> (PubSocket, Subscriber, BlockIndex) {
        let mut publisher = PubSocket::new();
        let endpoint = publisher.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        let mut sub = Subscriber::connect(&endpoint, Some(replay), Duration::from_secs(5)).await.expect("connects");
        let mut index = BlockIndex::new(BS);
        loop {
            publisher.send(message(&[b"kv", &0u64.to_be_bytes(), b0])).await.expect("published");
            if let Ok(followed) = tokio::time::timeout(Duration::from_millis(50), sub.next(&mut index)).await {
                assert!(matches!(followed.expect("received").receipt, Receipt::Applied(_) | Receipt::Duplicate { .. }));
                break;
            }
        }
        // The copies of batch 0 still on the way are duplicates.
        while let Ok(followed) = tokio::time::timeout(Duration::from_millis(100), sub.next(&mut index)).await {
            assert!(matches!(followed.expect("received").receipt, Receipt::Duplicate { seq: 0 }));
        }
        (publisher, sub, index)
    }

    async fn router() -> (RouterSocket, String) {
        let mut router = RouterSocket::new();
        let endpoint = router.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        (router, endpoint)
    }

    #[tokio::test]
    async fn a_gap_is_filled_from_the_replay_socket() {
        let t: Vec<u64> = (0..12).collect();
        let b0 = batch(1.0, vec![stored_array(&[1], None, &t[..4], "GPU")]);
        let b1 = batch(2.0, vec![stored_array(&[2], Some(1), &t[4..8], "GPU")]);
        let b2 = batch(3.0, vec![stored_array(&[3], Some(2), &t[8..], "GPU")]);
        let (router, replay) = router().await;
        let run = async {
            let replayer = tokio::spawn(serve_one_replay(router, vec![(0, b0.clone()), (1, b1), (2, b2.clone())]));
            let (mut publisher, mut sub, mut index) = subscribed(&b0, &replay).await;
            // Batch 1 never reaches the subscriber; batch 2 does.
            publisher.send(message(&[b"kv", &2u64.to_be_bytes(), &b2])).await.expect("published");
            let followed = sub.next(&mut index).await.expect("followed");
            assert_eq!(replayer.await.expect("the replayer"), 1, "the replay is asked from the first missing batch");
            assert!(matches!(followed.receipt, Receipt::Duplicate { seq: 2 }), "{followed:?}");
            assert_eq!((followed.replayed, followed.resynced), (2, false));
            assert_eq!(sorted(index.keys().collect()), sorted(keys_of(&t)));
        };
        tokio::time::timeout(Duration::from_secs(20), run).await.expect("within 20 s");
    }

    #[tokio::test]
    async fn a_gap_the_engine_no_longer_holds_drops_what_was_held() {
        let t: Vec<u64> = (0..8).collect();
        let b0 = batch(1.0, vec![stored_array(&[1], None, &t[..4], "GPU")]);
        let b2 = batch(3.0, vec![stored_array(&[3], None, &t[4..], "GPU")]);
        let (router, replay) = router().await;
        let run = async {
            // The engine's buffer has moved past batch 1.
            let replayer = tokio::spawn(serve_one_replay(router, vec![(2, b2.clone())]));
            let (mut publisher, mut sub, mut index) = subscribed(&b0, &replay).await;
            publisher.send(message(&[b"kv", &2u64.to_be_bytes(), &b2])).await.expect("published");
            let followed = sub.next(&mut index).await.expect("followed");
            replayer.await.expect("the replayer");
            assert!(followed.resynced, "{followed:?}");
            assert!(matches!(followed.receipt, Receipt::Applied(_)), "{followed:?}");
            assert_eq!(sorted(index.keys().collect()), keys_of(&t[4..]), "batch 0's block was dropped");
        };
        tokio::time::timeout(Duration::from_secs(20), run).await.expect("within 20 s");
    }
}

/// The feed: a task per engine into a sink, counters, malformed batches and gaps, and the keys
/// withdrawn when the engine is no longer followed.
mod feed {
    use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

    use bytes::Bytes;
    use zeromq::{prelude::*, PubSocket, ZmqMessage};

    use super::*;

    fn message(seq: u64, payload: &[u8]) -> ZmqMessage {
        let frames = vec![
            Bytes::from_static(b"kv"),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::copy_from_slice(payload),
        ];
        ZmqMessage::try_from(frames).expect("frames")
    }

    /// Polls `f` every 10 ms for up to 10 s.
    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_feed_follows_an_engine_into_the_sink_and_withdraws_it() {
        let mut publisher = PubSocket::new();
        let endpoint = publisher.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        let backend: SocketAddr = "127.0.0.1:8000".parse().expect("addr");
        let sink = Arc::new(MemorySink::default());
        let mut feeds = Feeds::new(sink.clone(), FeedSettings::default()).expect("a runtime");
        let source = EventSource { endpoint, replay: None, block_size: BS };
        let targets = BTreeMap::from([(("m".to_string(), backend), source)]);
        feeds.follow(&targets);
        // Empty batches until one is applied: the subscription has reached the publisher.
        let mut seq = 0;
        let empty = batch(1.0, vec![]);
        while feeds.stats("m").batches == 0 {
            publisher.send(message(seq, &empty)).await.expect("published");
            seq += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(seq < 500, "no batch reached the feed");
        }
        let t: Vec<u64> = (0..8).collect();
        publisher.send(message(seq, &batch(2.0, vec![stored_array(&[1, 2], None, &t, "GPU")]))).await.expect("sent");
        let want: std::collections::HashSet<u64> = keys_of(&t).into_iter().collect();
        until("the stored blocks' keys in the sink", || sink.keys("m", backend) == want).await;
        // A malformed batch: counted and skipped; nothing else changes.
        publisher.send(message(seq + 1, &[0xc1])).await.expect("sent");
        until("the malformed batch counted", || feeds.stats("m").malformed == 1).await;
        assert_eq!(sink.keys("m", backend), want);
        // A gap without a replay socket: the backend's keys are dropped and relearnt.
        let other: Vec<u64> = (100..104).collect();
        publisher
            .send(message(seq + 5, &batch(3.0, vec![stored_array(&[9], None, &other, "GPU")])))
            .await
            .expect("sent");
        let relearnt: std::collections::HashSet<u64> = keys_of(&other).into_iter().collect();
        until("the resync", || sink.keys("m", backend) == relearnt).await;
        let stats = feeds.stats("m");
        assert_eq!((stats.gaps, stats.resyncs, stats.keys_held, stats.blocks_stored), (1, 1, 1, 3), "{stats:?}");
        // No longer followed: its keys are withdrawn.
        feeds.follow(&BTreeMap::new());
        until("the keys withdrawn", || sink.keys("m", backend).is_empty() && feeds.stats("m").keys_held == 0).await;
        assert_eq!(feeds.followed().count(), 0);
    }

    #[test]
    fn endpoints_and_block_sizes_are_checked() {
        use super::super::feed::{check_block_size, check_endpoint};
        for ok in ["tcp://127.0.0.1:5557", "tcp://engine-3.local:5557", "tcp://[::1]:5557"] {
            check_endpoint(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("127.0.0.1:5557", "tcp://"),
            ("tcp://*:5557", "wildcard"),
            ("tcp://0.0.0.0:5557", "wildcard"),
            ("tcp://127.0.0.1:0", "port"),
            ("tcp://127.0.0.1", "tcp://"),
            ("tcp://::1:5557", "brackets"),
            ("tcp://:5557", "host"),
        ] {
            let e = check_endpoint(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(check_block_size(16).map(|b| b.get()), Ok(16));
        assert!(check_block_size(0).is_err() && check_block_size(65_537).is_err());
    }
}

/// Against a real vLLM started by hand (not run by `cargo test`): the keys the index makes from
/// the engine's own events for a chat request are the keys the tokenizer makes from the same
/// messages. Run with `AILB_VLLM_URL=http://127.0.0.1:PORT AILB_VLLM_KV_EVENTS=tcp://127.0.0.1:PORT
/// AILB_VLLM_MODEL_DIR=DIR AILB_VLLM_BLOCK_SIZE=N cargo test -p ailb-userspace --lib real_vllm --
/// --ignored`, the engine served with `--block-size N --enable-prefix-caching --kv-events-config
/// '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:PORT"}'` (vLLM's
/// CPU backend takes only multiples of 32).
#[tokio::test]
#[ignore = "needs a running vLLM with KV events; see the doc comment"]
async fn real_vllm_events_give_the_tokenizers_keys() {
    use std::time::{Duration, Instant};

    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let (url, events, model) = (var("AILB_VLLM_URL"), var("AILB_VLLM_KV_EVENTS"), var("AILB_VLLM_MODEL_DIR"));
    let tokenizer = crate::tokenize::ChatTokenizer::load(std::path::Path::new(&model)).expect("the model's tokenizer");
    let messages = serde_json::json!([
        {"role": "system", "content": "You are a model server cache. Explain the prefix, please! ".repeat(16)},
        {"role": "user", "content": "What is the kernel socket route weight table? 12345 tokens."},
    ]);
    let ids = tokenizer.chat_token_ids(&messages, true).expect("tokens");
    let block: u32 = std::env::var("AILB_VLLM_BLOCK_SIZE").map_or(16, |b| b.parse().expect("AILB_VLLM_BLOCK_SIZE"));
    let block = NonZeroU32::new(block).expect("a block size over 0");
    let want = token_keys(&ids, block);
    assert!(want.len() >= 4, "the prompt is {} tokens", ids.len());

    let mut sub = Subscriber::connect(&events, None, Duration::from_secs(5)).await.expect("subscribed");
    let mut index = BlockIndex::new(block);
    let body = serde_json::json!({"model": "tiny", "messages": messages, "max_tokens": 4});
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The subscription takes a moment to reach the publisher: ask again until the blocks show.
    while !want.iter().all(|k| index.holds(*k)) {
        assert!(
            Instant::now() < deadline,
            "held {} of {} prompt keys",
            want.iter().filter(|k| index.holds(**k)).count(),
            want.len()
        );
        let answer = client
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("vLLM answers");
        assert!(answer.status().is_success(), "{}", answer.status());
        while let Ok(followed) = tokio::time::timeout(Duration::from_millis(500), sub.next(&mut index)).await {
            let followed = followed.expect("received");
            println!("{:?}", followed.receipt);
        }
    }
    println!("all {} prompt keys ({} tokens) held, {} keys in the index", want.len(), ids.len(), index.len());
}
