//! The trace parser, conversation grouping, memory hint, percentiles and synthetic workload
//! of `ailb-replay`, and the Mooncake trace shipped in `tests/data/` (pure: no root, no network).

use std::io::{Cursor, Write};
use std::path::Path;

use ailb_sim::replay::synthetic::{generate, SyntheticOpts};
use ailb_sim::replay::trace::{self, conversations, memory_mb, parse};
use ailb_sim::replay::{self, percentile, Percentiles, RequestRecord, Summary, TraceSelect};
use flate2::write::GzEncoder;
use flate2::Compression;

fn parse_str(s: &str) -> (Vec<trace::TraceRequest>, Vec<trace::ParseIssue>) {
    parse(Cursor::new(s.as_bytes().to_vec()))
}

#[test]
fn good_lines_parse_with_their_line_numbers() {
    let text = "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1, 2]}\n\
                \n\
                {\"timestamp\": 27, \"input_length\": 10, \"output_length\": 0, \"hash_ids\": [], \"extra\": 1}\r\n\
                {\"hash_ids\": [0, 7], \"output_length\": 3, \"input_length\": 600, \"timestamp\": 40}";
    let (reqs, issues) = parse_str(text);
    assert!(issues.is_empty(), "unexpected issues: {issues:?}");
    assert_eq!(reqs.len(), 3);
    assert_eq!((reqs[0].line, reqs[0].timestamp_ms, reqs[0].input_length, reqs[0].output_length), (1, 0, 6758, 500));
    assert_eq!(reqs[0].hash_ids, vec![0, 1, 2]);
    assert_eq!((reqs[1].line, reqs[1].timestamp_ms, reqs[1].hash_ids.len()), (3, 27, 0));
    assert_eq!((reqs[2].line, reqs[2].input_length, &reqs[2].hash_ids), (4, 600, &vec![0, 7]));
}

#[test]
fn every_kind_of_bad_line_is_reported_with_its_line_number_and_parsing_goes_on() {
    let good = r#"{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [4]}"#;
    let bad: [(&str, &str); 12] = [
        (r#"{"timestamp": 1, "input_length": 2"#, "invalid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        (r#"{"input_length": 2, "output_length": 3, "hash_ids": []}"#, "`timestamp` is missing"),
        (r#"{"timestamp": 1, "output_length": 3, "hash_ids": []}"#, "`input_length` is missing"),
        (r#"{"timestamp": 1, "input_length": 2, "hash_ids": []}"#, "`output_length` is missing"),
        (r#"{"timestamp": 1, "input_length": 2, "output_length": 3}"#, "`hash_ids` is missing"),
        (r#"{"timestamp": -5, "input_length": 2, "output_length": 3, "hash_ids": []}"#, "-5 is negative"),
        (r#"{"timestamp": 1, "input_length": 2000000, "output_length": 3, "hash_ids": []}"#, "too large"),
        (r#"{"timestamp": 1, "input_length": "2", "output_length": 3, "hash_ids": []}"#, "non-negative integer"),
        (r#"{"timestamp": 1, "input_length": 2, "output_length": 3.5, "hash_ids": []}"#, "non-negative integer"),
        (r#"{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": 7}"#, "expected an array"),
        (r#"{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1, -2]}"#, "`hash_ids[1]`"),
    ];
    let mut text = format!("{good}\n");
    for (line, _) in &bad {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(good);
    text.push('\n');
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(b"{\"timestamp\": \xff}\n");
    bytes.extend_from_slice(good.as_bytes());
    let (reqs, issues) = parse(Cursor::new(bytes));
    assert_eq!(reqs.iter().map(|r| r.line).collect::<Vec<_>>(), vec![1, 14, 16], "good lines around the bad ones");
    assert_eq!(issues.len(), bad.len() + 1, "one issue per bad line: {issues:#?}");
    for (i, (line, want)) in bad.iter().enumerate() {
        let issue = &issues[i];
        assert_eq!(issue.line, i + 2, "line number of {line}");
        assert!(issue.reason.contains(want), "line {line}: reason {:?} should mention {want:?}", issue.reason);
    }
    assert_eq!(issues[bad.len()].line, 15);
    assert!(issues[bad.len()].reason.contains("UTF-8"), "{:?}", issues[bad.len()]);
    assert!(issues[0].to_string().starts_with("line 2: "), "{}", issues[0]);
}

#[test]
fn the_mooncake_trace_parses_with_no_issues() {
    let path = Path::new(replay::SHIPPED_TRACE);
    let (reqs, issues) = trace::load(path).unwrap_or_else(|e| {
        panic!("{} (the trace ships in the repository: see tests/data/README.md)", error_chain(&e))
    });
    assert!(issues.is_empty(), "{} issues in {}, first: {:?}", issues.len(), path.display(), issues.first());
    assert_eq!(reqs.len(), 12_031, "the README says 12,031 requests");
    assert!(reqs.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms), "timestamps are sorted");
    let (ids, stats) = conversations(&reqs, trace::DEFAULT_COMMON_SHARE);
    assert_eq!(ids.len(), reqs.len());
    // Block 0 (in every request) is the only shared one; without skipping it the whole trace
    // would be one conversation.
    assert_eq!(stats.shared_blocks, 1, "{stats}");
    assert!(stats.conversations > 1000 && stats.multi_turn_conversations > 100, "{stats}");
    eprintln!("{stats}");
}

#[test]
fn a_trace_file_reads_the_same_gzipped_or_plain_and_a_missing_one_is_named() {
    let text = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
                {\"timestamp\": 40, \"input_length\": 1100, \"output_length\": 7, \"hash_ids\": [0, 1, 2]}\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let plain = dir.path().join("trace.jsonl");
    std::fs::write(&plain, text).expect("write the plain trace");
    // Named without .gz on purpose: the format is recognised by the file's first bytes.
    let gz = dir.path().join("trace-gz.jsonl");
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(text.as_bytes()).expect("compress");
    std::fs::write(&gz, enc.finish().expect("compress")).expect("write the gzipped trace");
    let from_plain = trace::load(&plain).expect("plain trace");
    let from_gz = trace::load(&gz).expect("gzipped trace");
    assert_eq!(from_plain, parse_str(text));
    assert_eq!(from_gz, from_plain);
    assert_eq!(from_gz.0.len(), 2);

    let missing = dir.path().join("absent.jsonl.gz");
    let err = trace::load(&missing).expect_err("a missing file is an error");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "the error names the file: {}",
        error_chain(&err)
    );
}

/// The error and its sources on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

#[test]
fn conversations_group_turns_by_their_first_unshared_block() {
    // Block 0 is a system prompt in all 5 requests; 10.. are conversation A, 20.. B.
    let text = [
        r#"{"timestamp": 0, "input_length": 900, "output_length": 10, "hash_ids": [0, 10, 11]}"#,
        r#"{"timestamp": 1, "input_length": 700, "output_length": 10, "hash_ids": [0, 20, 21]}"#,
        // A's second turn: its partial last block 11 changed to 12, it grew by 13.
        r#"{"timestamp": 2, "input_length": 1600, "output_length": 10, "hash_ids": [0, 10, 12, 13]}"#,
        r#"{"timestamp": 3, "input_length": 1100, "output_length": 10, "hash_ids": [0, 20, 21, 22]}"#,
        // Nothing but the system prompt: a conversation of its own.
        r#"{"timestamp": 4, "input_length": 300, "output_length": 10, "hash_ids": [0]}"#,
    ]
    .join("\n");
    let (reqs, issues) = parse_str(&text);
    assert!(issues.is_empty());
    let (ids, stats) = conversations(&reqs, 0.5);
    assert_eq!(ids, vec!["conv-10", "conv-20", "conv-10", "conv-20", "req-5"]);
    assert_eq!((stats.conversations, stats.multi_turn_conversations, stats.requests_in_multi_turn), (3, 2, 4));
    assert_eq!((stats.max_turns, stats.shared_blocks), (2, 1));
    assert!((stats.mean_turns() - 5.0 / 3.0).abs() < 1e-9);
    // With no block counted as shared, everything starts with block 0: one conversation.
    let (ids, _) = conversations(&reqs, 1.0);
    assert!(ids.iter().all(|i| i == "conv-0"), "{ids:?}");
}

#[test]
fn trace_selection_scales_start_and_limit_and_tags_memory() {
    let text = (0..10)
        .map(|i| {
            format!(r#"{{"timestamp": {}, "input_length": 100, "output_length": 28, "hash_ids": [{i}]}}"#, i * 100)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let (reqs, _) = parse_str(&text);
    let (convs, _) = conversations(&reqs, 0.5);
    let sel = TraceSelect { start_ms: 250, limit: Some(3), kv_mb_per_token: 0.5, model: "m".into() };
    let specs = replay::trace_specs(&reqs, &convs, &sel);
    assert_eq!(specs.iter().map(|s| s.at_ms).collect::<Vec<_>>(), vec![50, 150, 250]);
    assert_eq!(specs.iter().map(|s| s.line).collect::<Vec<_>>(), vec![Some(4), Some(5), Some(6)]);
    assert_eq!(specs.iter().map(|s| s.index).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(specs[0].memory_mb, 256, "(100 + 28) tokens -> one 512-token block x 0.5 MB");
    let body = specs[0].body();
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 28);
    let prompt = ailb_sim::text::prompt_text(&[3], 100, 0);
    assert_eq!(body["messages"][0]["content"], prompt.as_str(), "block 3 as text, no side channel");
    // What the simulator reads back from the text: the trace's token counts and block 3's key.
    let parsed = ailb_sim::parse_chat(body.to_string().as_bytes()).expect("the replay's body parses");
    assert_eq!((parsed.sim.prompt_tokens, parsed.sim.max_tokens), (100, 28));
    assert_eq!(parsed.sim.hash_ids, ailb_sim::text::block_keys(prompt.as_bytes()));
    assert_eq!(parsed.sim.hash_ids.len(), 1);
}

/// The hint counts whole 512-token KV blocks, the unit a paged KV cache (and `ailb-sim`) allocates.
#[test]
fn memory_need_is_whole_kv_blocks_times_kv_size() {
    assert_eq!(memory_mb(6758, 500, 0.5), 15 * 256, "7258 tokens hold 15 blocks");
    assert_eq!(memory_mb(1, 0, 0.5), 256, "one token holds a block");
    assert_eq!(memory_mb(500, 12, 0.5), 256);
    assert_eq!(memory_mb(500, 13, 0.5), 512);
    // A 3090's pool is 43 blocks (11,008 MiB): a 43.5-block context must not claim to fit.
    assert_eq!(memory_mb(21_800, 500, 0.5), 44 * 256);
    assert_eq!(memory_mb(0, 0, 0.5), 0);
    assert_eq!(memory_mb(u32::MAX, u32::MAX, 1e6), u32::MAX, "capped");
    assert_eq!(memory_mb(100, 0, 0.0), 0);
}

#[test]
fn percentiles_use_the_nearest_rank() {
    let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), Some(50.0));
    assert_eq!(percentile(&v, 95.0), Some(95.0));
    assert_eq!(percentile(&v, 99.0), Some(99.0));
    assert_eq!(percentile(&v, 100.0), Some(100.0));
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
    // ceil(0.5 * 4) = 2nd, ceil(0.95 * 4) = 4th.
    assert_eq!(Percentiles::of(&[4.0, 1.0, 3.0, 2.0]), Some(Percentiles { p50: 2.0, p95: 4.0, p99: 4.0 }));
}

fn rec(index: usize, conv: &str, backend: &str, e2e: f64, ok: bool) -> RequestRecord {
    RequestRecord {
        index,
        conversation: conv.into(),
        status: Some(if ok { 200 } else { 503 }),
        error: (!ok).then(|| "HTTP 503".to_string()),
        ttft_ms: ok.then_some(e2e / 10.0),
        e2e_ms: e2e,
        tokens: if ok { 10 } else { 0 },
        prompt_tokens: 100,
        cached_tokens: ok.then_some(50),
        backend: Some(backend.into()),
        ..Default::default()
    }
}

#[test]
fn summary_counts_failures_throughput_cache_and_affinity() {
    let records = vec![
        rec(0, "a", "b1", 100.0, true),
        rec(1, "b", "b2", 200.0, true),
        rec(2, "a", "b1", 300.0, true), // a: same backend
        rec(3, "a", "b2", 400.0, true), // a: moved
        rec(4, "b", "b2", 0.0, false),  // b: same backend, but failed
    ];
    let s = Summary::from_records(&records, 2.0);
    assert_eq!((s.requests, s.failures), (5, 1));
    assert!((s.failure_rate() - 0.2).abs() < 1e-9);
    assert_eq!(s.e2e_ms.map(|p| p.p50), Some(200.0));
    assert_eq!(s.ttft_ms.map(|p| p.p99), Some(40.0));
    assert_eq!((s.output_tokens, s.token_throughput), (40, 20.0));
    assert_eq!(s.prefix_cache_hit_rate, Some(0.5));
    assert_eq!(s.affinity_hit_rate, Some(2.0 / 3.0));
    let text = s.to_string();
    assert!(text.contains("affinity hits     66.7 %"), "{text}");
}

#[test]
fn synthetic_mix_is_seeded_and_turns_share_prefixes() {
    let opts = SyntheticOpts { requests: 2000, ..SyntheticOpts::default() };
    let a = generate(&opts);
    assert_eq!(a, generate(&opts), "same seed, same workload");
    assert_ne!(a, generate(&SyntheticOpts { seed: 2, ..opts.clone() }));
    assert_eq!(a.len(), 2000);
    assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    let long = a.iter().filter(|r| r.long).count() as f64 / a.len() as f64;
    // Each of the ~800 conversations is long with probability 0.1, whatever its turns, so the
    // long share of requests is 0.1 with a standard deviation of about sqrt(0.09 / 800) ~ 0.011
    // (a bit more for the varying turns): 0.05 is over 4 of them. The seed is fixed anyway.
    assert!((long - 0.1).abs() < 0.05, "long share {long}");
    for r in &a {
        let (lo, hi) = if r.long { (600, 1000) } else { (5, 15) };
        assert!((lo..=hi).contains(&r.output_length), "{r:?}");
        assert_eq!(r.hash_ids.len() as u64, u64::from(r.input_length).div_ceil(512), "{r:?}");
    }
    // A later turn starts with all of the previous turn's blocks.
    let mut multi = 0;
    let mut last: std::collections::HashMap<&str, &Vec<u64>> = std::collections::HashMap::new();
    for r in &a {
        if let Some(prev) = last.insert(&r.conversation, &r.hash_ids) {
            assert!(r.hash_ids.starts_with(prev), "{r:?} does not extend {prev:?}");
            multi += 1;
        }
    }
    assert!(multi > 500, "{multi} later turns");
}

/// A later turn is sent as the chat it continues: the earlier questions and answers as
/// alternating user and assistant messages, the new question last, their text together the
/// prompt's, each earlier message sent again as it was.
#[test]
fn a_synthetic_turn_is_sent_as_the_conversation_so_far() {
    let opts = SyntheticOpts { requests: 400, ..SyntheticOpts::default() };
    let specs = replay::synthetic_specs(&opts, 0.5, "m");
    let reqs = generate(&opts);
    let mut turns: std::collections::HashMap<&str, Vec<Vec<serde_json::Value>>> = Default::default();
    for (s, r) in specs.iter().zip(&reqs) {
        assert_eq!((s.message_ends.as_slice(), s.prompt_tokens), (r.message_ends.as_slice(), r.input_length));
        let body = s.body();
        let msgs = body["messages"].as_array().expect("messages").clone();
        let text: String = msgs.iter().map(|m| m["content"].as_str().expect("text")).collect();
        assert_eq!(text, s.prompt(), "the messages are the prompt, cut");
        assert_eq!(msgs.len(), s.message_ends.len() + 1, "{:?}", s.message_ends);
        assert_eq!(msgs.len() % 2, 1, "questions and answers in pairs, then the new question");
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(m["role"], if i % 2 == 0 { "user" } else { "assistant" }, "message {i}");
        }
        turns.entry(&s.conversation).or_default().push(msgs);
    }
    let mut later = 0;
    for sent in turns.values() {
        for w in sent.windows(2) {
            // The previous turn's messages come back unchanged, then its answer and a new question.
            let (prev, next) = (&w[0], &w[1]);
            assert_eq!(next[..prev.len()], prev[..], "every earlier message is sent again as it was");
            assert_eq!(next.len(), prev.len() + 2, "an answer and a new question");
            later += 1;
        }
    }
    assert!(later > 100, "{later} later turns");
    // Every conversation starts with one user message; the trace's requests stay one message.
    let first = specs.iter().find(|s| s.message_ends.is_empty()).expect("a first turn");
    assert_eq!(first.body()["messages"].as_array().map(Vec::len), Some(1));
}
