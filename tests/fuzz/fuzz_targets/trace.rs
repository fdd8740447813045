//! The Mooncake trace (JSON lines, as `ailb-replay` reads the shipped file after decompression).
//! Besides no panic: every non-blank line is a request or an issue, line numbers are in order,
//! every request is within the documented limits and written back parses the same, and the
//! conversation grouping gives every request an id.
#![no_main]

use ailb_sim::replay::trace::{self, MAX_BLOCKS, MAX_TIMESTAMP_MS, MAX_TOKENS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (requests, issues) = trace::parse(data);
    let lines = data.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
    assert!(requests.len() + issues.len() <= lines, "{} + {} > {lines}", requests.len(), issues.len());
    let mut numbers: Vec<usize> = requests.iter().map(|r| r.line).chain(issues.iter().map(|i| i.line)).collect();
    numbers.sort_unstable();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "a line reported twice: {numbers:?}");
    for r in &requests {
        assert!(r.timestamp_ms <= MAX_TIMESTAMP_MS && u64::from(r.input_length) <= MAX_TOKENS, "{r:?}");
        assert!(u64::from(r.output_length) <= MAX_TOKENS && r.hash_ids.len() <= MAX_BLOCKS, "{r:?}");
        let line = serde_json::json!({
            "timestamp": r.timestamp_ms,
            "input_length": r.input_length,
            "output_length": r.output_length,
            "hash_ids": r.hash_ids,
        });
        assert_eq!(trace::parse_line(r.line, &line.to_string()).as_ref(), Ok(r));
    }
    let (ids, _) = trace::conversations(&requests, trace::DEFAULT_COMMON_SHARE);
    assert_eq!(ids.len(), requests.len());
});
