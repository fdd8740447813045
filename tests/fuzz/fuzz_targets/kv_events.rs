//! A vLLM KV-event batch payload as a daemon receives it: decoded, then applied to a block
//! index. Besides no panic: a batch that does not decode or apply leaves the index empty and
//! spends its sequence number; one that applies gives only non-zero keys, each from a block the
//! index tracks; the same batch again is a duplicate that changes nothing; and
//! `AllBlocksCleared` afterwards empties the index.
#![no_main]

use std::num::NonZeroU32;

use ailb_userspace::kv_events::{decode_batch, BlockIndex, Receipt};
use libfuzzer_sys::fuzz_target;

/// `[1e300, [["AllBlocksCleared"]]]` in msgpack (the array form of a batch).
const CLEARED: &[u8] = &[
    0x92, 0xcb, 0x7e, 0x37, 0xe4, 0x3c, 0x88, 0x00, 0x75, 0x9c, 0x91, 0x91, 0xb0, b'A', b'l', b'l', b'B', b'l', b'o',
    b'c', b'k', b's', b'C', b'l', b'e', b'a', b'r', b'e', b'd',
];

fuzz_target!(|data: &[u8]| {
    let decoded = decode_batch(data);
    let mut index = BlockIndex::new(NonZeroU32::new(16).expect("16"));
    match index.receive_payload(0, data) {
        Receipt::Applied(_) => {
            assert!(decoded.is_ok(), "applied what does not decode");
            assert!(index.len() <= index.blocks(), "{} keys from {} blocks", index.len(), index.blocks());
            assert!(index.keys().all(|k| k != 0), "a zero key");
            let keys = sorted(index.keys().collect());
            assert!(matches!(index.receive_payload(0, data), Receipt::Duplicate { seq: 0 }));
            assert_eq!(sorted(index.keys().collect()), keys, "a duplicate changed the index");
            assert!(matches!(index.receive_payload(1, CLEARED), Receipt::Applied(_)));
            assert!(index.is_empty() && index.blocks() == 0, "AllBlocksCleared left blocks");
        }
        Receipt::Skipped { seq, .. } => {
            assert_eq!(seq, Some(0));
            assert!(index.is_empty() && index.blocks() == 0, "a skipped batch changed the index");
            assert_eq!(index.expected(), Some(1), "a skipped batch did not spend its sequence number");
        }
        other => panic!("the first batch: {other:?}"),
    }
});

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}
