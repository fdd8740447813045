use std::collections::{HashMap, HashSet};

use super::*;

fn sizes() -> Sizes {
    Sizes {
        requests: 40,
        tenants: 4,
        system_words: 300,
        question_words: 20,
        max_tokens: 8,
        trace_requests: 40,
        trace_scale: 16,
        trace_max_tokens: 32,
        max_model_len: 6144,
        kv_bytes_per_token: 4096,
        seed: 1,
    }
}

fn system(r: &RealRequest) -> String {
    r.body["messages"][0]["content"].as_str().unwrap_or_default().to_string()
}

#[test]
fn shared_prefix_requests_share_only_their_tenants_system_prompt_and_send_no_session() {
    let (reqs, _) = build(Kind::SharedPrefix, &sizes(), "m", Path::new("unused")).expect("built");
    assert_eq!(reqs.len(), 40);
    let systems: HashSet<String> = reqs.iter().map(system).collect();
    assert_eq!(systems.len(), 4, "one system prompt per tenant, every tenant drawn");
    let questions: HashSet<&str> = reqs.iter().filter_map(|r| r.body["messages"][1]["content"].as_str()).collect();
    assert_eq!(questions.len(), 40, "every user asks a question of its own");
    assert!(reqs.iter().all(|r| r.session.is_none() && r.tag_conversation.is_none() && r.memory_mb > 0));
    assert!(reqs.iter().all(|r| r.body["stream"] == true && r.body["max_tokens"] == 8));
    let again = build(Kind::SharedPrefix, &sizes(), "m", Path::new("unused")).expect("built").0;
    assert_eq!(serde_json::to_string(&reqs).ok(), serde_json::to_string(&again).ok(), "seeded: the same list");
}

#[test]
fn the_trace_slice_is_whole_conversations_that_fit() {
    let path = ailb_sim::replay::default_trace_path();
    let s = sizes();
    let (reqs, what) = build(Kind::Trace, &s, "m", &path).expect("built");
    assert!(!reqs.is_empty() && reqs.len() <= s.trace_requests, "{what}");
    let mut turns: HashMap<String, usize> = HashMap::new();
    for r in &reqs {
        let conv = r.session.clone().expect("the trace sends its conversation");
        assert_eq!(r.tag_conversation.as_ref(), Some(&conv));
        *turns.entry(conv).or_default() += 1;
        let text = r.body["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(text.len() / MIN_BYTES_PER_TOKEN + TEMPLATE_TOKENS <= s.max_model_len, "{} bytes", text.len());
    }
    assert!(turns.values().all(|n| *n >= 2), "{turns:?}");
    // A later turn of a conversation starts with its first turn's whole text blocks.
    let first = &reqs[0];
    let conv = first.session.clone();
    let later = reqs.iter().skip(1).find(|r| r.session == conv).expect("a second turn");
    let a = first.body["messages"][0]["content"].as_str().unwrap_or_default();
    let b = later.body["messages"][0]["content"].as_str().unwrap_or_default();
    let chunk = BLOCK_BYTES / s.trace_scale as usize;
    let whole = a.len() / chunk * chunk;
    assert!(whole > 0 && b.starts_with(&a[..whole]), "turns share their leading blocks");
    assert!(what.contains("prefix an earlier request"), "{what}");
    eprintln!("{what}");
}

#[test]
fn a_trace_scale_that_does_not_divide_a_block_is_refused() {
    let s = Sizes { trace_scale: 3, ..sizes() };
    let e = build(Kind::Trace, &s, "m", Path::new("unused")).expect_err("refused");
    assert!(e.to_string().contains("--trace-scale 3"), "{e}");
}
