//! Nacos v1 UDP push packets: the first byte says whether the rest is sent as is (even) or
//! gzip-compressed first (odd, so that the decompression path sees valid streams too). Besides
//! no panic: plain and compressed packets parse the same, the kind is printable, and the ack
//! echoes `lastRefTime` with one of the three ack types.
#![no_main]

use std::io::Write;

use ailb_userspace::fuzzing;
use flate2::{write::GzEncoder, Compression};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&which, packet)) = data.split_first() else { return };
    let parsed = if which % 2 == 0 {
        fuzzing::nacos_push(packet)
    } else {
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(packet).expect("compressing in memory");
        let compressed = gz.finish().expect("compressing in memory");
        let parsed = fuzzing::nacos_push(&compressed);
        if !packet.starts_with(&[0x1f, 0x8b]) && packet.len() as u64 <= fuzzing::MAX_PUSH {
            let plain = fuzzing::nacos_push(packet);
            assert_eq!(plain.as_ref().ok(), parsed.as_ref().ok(), "plain and gzip differ");
        }
        parsed
    };
    let Ok(p) = parsed else { return };
    assert!(!p.kind.chars().any(char::is_control), "kind {:?} not escaped", p.kind);
    match (&p.last_ref_time, &p.ack) {
        (None, None) => {}
        (Some(t), Some(ack)) => {
            let ack: Value = serde_json::from_slice(ack).expect("the ack is JSON");
            assert_eq!(ack["lastRefTime"].as_str(), Some(t.as_str()));
            assert!(matches!(ack["type"].as_str(), Some("push-ack" | "dump-ack" | "unknown-ack")), "{ack}");
        }
        other => panic!("lastRefTime and ack disagree: {other:?}"),
    }
});
