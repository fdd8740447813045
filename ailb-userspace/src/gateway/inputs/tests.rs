use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};

use super::*;

fn facts(name: &str) -> Option<ModelFacts> {
    match name {
        "m" => Some(ModelFacts::default()),
        "pinned" => {
            Some(ModelFacts { required_memory_mb: Some(2048), kv_bytes_per_token: Some(1 << 20), kv_block_tokens: 1 })
        }
        "kv" => Some(ModelFacts { required_memory_mb: None, kv_bytes_per_token: Some(1 << 20), kv_block_tokens: 1 }),
        "paged" => {
            Some(ModelFacts { required_memory_mb: None, kv_bytes_per_token: Some(524_288), kv_block_tokens: 512 })
        }
        _ => None,
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::try_from(*k).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

const RULES: Rules<'static> = Rules { session_header: None, completion_prefix_bytes: 8 };

/// [`extract`] of the JSON text of `body`, parsed as the front door parses a request's body.
fn extract_json(
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Value,
    rules: Rules<'_>,
    facts: impl Fn(&str) -> Option<ModelFacts>,
) -> Result<Inputs, InputsError> {
    let bytes = serde_json::to_vec(body).unwrap();
    extract(endpoint, headers, &parse_body(&bytes)?, rules, facts)
}

fn chat(h: &[(&str, &str)], body: Value) -> Result<Inputs, InputsError> {
    extract_json(Endpoint::ChatCompletions, &headers(h), &body, RULES, facts)
}

fn chat_body(turns: &[(&str, &str)]) -> Value {
    let msgs: Vec<Value> = turns.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
    json!({"model": "m", "messages": msgs})
}

#[test]
fn model_from_header_then_body_unknown_and_missing() {
    assert_eq!(chat(&[], json!({"model": "m"})).unwrap().model, "m");
    assert_eq!(chat(&[("X-Model-Id", "m")], json!({"model": "other"})).unwrap().model, "m");
    assert_eq!(chat(&[], json!({"model": "nope"})), Err(InputsError::UnknownModel { model: "nope".into() }));
    assert_eq!(chat(&[], json!({})), Err(InputsError::NoModel));
    assert!(matches!(chat(&[], json!({"model": 3})), Err(InputsError::BadField { field: "model", .. })));
}

#[test]
fn body_must_be_a_json_object() {
    assert!(parse_body(br#"{"model":"m"}"#).is_ok());
    let e = parse_body(b"{\"model\":").unwrap_err();
    assert!(matches!(&e, InputsError::Json { reason } if reason.contains("EOF")), "{e}");
    assert_eq!(parse_body(b"[1]").unwrap_err(), InputsError::NotObject { found: "an array" });
    // Bytes that are not UTF-8, in a string or outside one, are refused as a parse of the bytes
    // refuses them, and the error says where.
    for bad in [&b"{\"model\":\"m\xff\"}"[..], b"{\"model\":\"m\"}\xc3", b"\xef\xbb{}"] {
        assert!(serde_json::from_slice::<Value>(bad).is_err());
        let e = parse_body(bad).unwrap_err();
        let at = bad.iter().position(|&b| b >= 0x80).unwrap();
        assert_eq!(e, InputsError::Json { reason: format!("not UTF-8 text (an invalid byte at offset {at})") });
    }
    let fields = parse_body("{\"model\":\"m\\u00e9\",\"x\":\"\u{e9}\"}".as_bytes()).unwrap();
    assert_eq!(fields.model, Some(crate::gateway::request_fields::StrOr::Str("m\u{e9}".into())));
}

#[test]
fn memory_headers_then_model_then_estimate() {
    let body = json!({"model": "pinned"});
    let mem = |h: &[(&str, &str)], b: &Value| chat(h, b.clone()).map(|i| i.memory_mb);
    assert_eq!(mem(&[("X-Required-Memory", "1.5")], &body), Ok(Some(1536)));
    assert_eq!(mem(&[("x-required-memory-mb", "700")], &body), Ok(Some(700)));
    assert_eq!(mem(&[("X-Required-Memory", "2"), ("X-Required-Memory-MB", "9")], &body), Ok(Some(2048)));
    assert_eq!(mem(&[], &body), Ok(Some(2048)), "the model's required_memory_mb");
    assert_eq!(mem(&[], &json!({"model": "m"})), Ok(None), "nothing known");
    // 40 bytes of text = 10 tokens, + 6 max tokens = 16 tokens x 1 MiB.
    let kv = json!({"model": "kv", "max_tokens": 6, "messages": [{"role": "user", "content": "x".repeat(40)}]});
    assert_eq!(mem(&[], &kv), Ok(Some(16)));
    let kv = json!({"model": "kv", "max_completion_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "abc"}]}]});
    assert_eq!(mem(&[], &kv), Ok(Some(2)));
    for bad in ["lots", "-1", "NaN"] {
        let e = mem(&[("X-Required-Memory", bad)], &body).unwrap_err();
        assert!(matches!(&e, InputsError::BadHeader { header: "X-Required-Memory", value, .. } if value == bad), "{e}");
    }
    let e = mem(&[("X-Required-Memory-MB", "1.5")], &body).unwrap_err();
    assert_eq!(e.param(), Some("X-Required-Memory-MB"));
    let e = mem(&[], &json!({"model": "kv", "max_tokens": "many"})).unwrap_err();
    assert_eq!(e.param(), Some("max_tokens"));
}

#[test]
fn estimate_for_completions_uses_the_prompt() {
    let body = json!({"model": "kv", "prompt": "y".repeat(8), "max_tokens": 2});
    let i = extract_json(Endpoint::Completions, &HeaderMap::new(), &body, RULES, facts).unwrap();
    assert_eq!(i.memory_mb, Some(4));
}

#[test]
fn estimate_rounds_up_to_whole_kv_blocks() {
    // 512-token blocks of 0.5 MiB per token: 256 MiB a block.
    for (tokens, mb) in [(0, 256), (1, 256), (511, 256), (512, 256), (513, 512), (22_016, 11_008), (22_017, 11_264)] {
        assert_eq!(kv_estimate_mb(tokens, 524_288, 512), mb, "{tokens} tokens");
    }
    // A block of 1 token is the plain product; a block of 0 is read as 1.
    assert_eq!(kv_estimate_mb(3, 1 << 20, 1), 3);
    assert_eq!(kv_estimate_mb(3, 1 << 20, 0), 3);
    // 16-token blocks of 1000 bytes: 17 tokens hold 2 blocks = 32,000 bytes -> 1 MiB (rounded up).
    assert_eq!(kv_estimate_mb(17, 1000, 16), 1);
    assert_eq!(kv_estimate_mb(u64::MAX, u64::MAX, 512), u32::MAX, "saturates");
    // Through a request: 2048 bytes of text = 512 tokens, + max_tokens 1 = 513 tokens = 2 blocks.
    let body = |max: u64| json!({"model": "paged", "max_tokens": max, "messages": [{"role": "user", "content": "z".repeat(2048)}]});
    assert_eq!(chat(&[], body(0)).unwrap().memory_mb, Some(256));
    assert_eq!(chat(&[], body(1)).unwrap().memory_mb, Some(512));
}

#[test]
fn conversation_sources_in_order() {
    let body = json!({"model": "m", "prompt_cache_key": "pck", "messages": [{"role": "user", "content": "hi"}]});
    let name = HeaderName::from_static("x-user");
    let rules = Rules { session_header: Some(&name), ..RULES };
    let conv = |h: &[(&str, &str)], b: &Value| {
        extract_json(Endpoint::ChatCompletions, &headers(h), b, rules, facts).unwrap().conversation.unwrap()
    };
    let all = [("x-SESSION-id", "s1"), ("Cookie", "a=b; llm-d-session=ck"), ("X-User", "u")];
    assert_eq!(conv(&all, &body), Conversation { key: "s1".into(), source: KeySource::SessionHeader });
    assert_eq!(conv(&all[1..], &body).source, KeySource::PromptCacheKey);
    let no_pck = chat_body(&[("user", "hi")]);
    assert_eq!(conv(&all[1..], &no_pck), Conversation { key: "ck".into(), source: KeySource::Cookie });
    assert_eq!(conv(&all[2..], &no_pck), Conversation { key: "u".into(), source: KeySource::ConfiguredHeader });
    assert_eq!(conv(&[], &no_pck).source, KeySource::Derived);
    assert_eq!(conv(&[("X-Session-ID", " ")], &no_pck).source, KeySource::Derived, "an empty id is no id");
}

#[test]
fn long_ids_are_hashed_to_fit_the_kernel() {
    let long = "s".repeat(MAX_CONVERSATION_LEN + 1);
    let c = chat(&[("X-Session-ID", &long)], json!({"model": "m"})).unwrap().conversation.unwrap();
    assert_eq!(c.key, format!("h-{:016x}", conversation_hash(long.as_bytes())));
    let exact = "s".repeat(MAX_CONVERSATION_LEN);
    let c = chat(&[("X-Session-ID", &exact)], json!({"model": "m"})).unwrap().conversation.unwrap();
    assert_eq!(c.key, exact);
    assert_eq!(c.hash(), conversation_hash(exact.as_bytes()));
}

#[test]
fn derived_chat_key_is_stable_over_turns_and_differs_by_system_user_and_model() {
    let key = |b: Value| chat(&[], b).unwrap().conversation.unwrap().key;
    let first = key(chat_body(&[("system", "be brief"), ("user", "hello")]));
    let later =
        key(chat_body(&[("system", "be brief"), ("user", "hello"), ("assistant", "hi"), ("user", "and then?")]));
    assert_eq!(first, later, "a chat that resends its history keeps its key");
    assert!(first.starts_with("d-") && first.len() == 18, "{first}");
    assert_ne!(first, key(chat_body(&[("system", "be long"), ("user", "hello")])));
    assert_ne!(first, key(chat_body(&[("system", "be brief"), ("user", "bye")])));
    let mut other_model = chat_body(&[("system", "be brief"), ("user", "hello")]);
    other_model["model"] = json!("pinned");
    assert_ne!(first, key(other_model));
    assert_eq!(chat(&[], chat_body(&[("system", "only")])).unwrap().conversation, None, "no user message");
}

#[test]
fn derived_completion_key_uses_the_prompt_prefix() {
    let key = |p: Value| {
        extract_json(Endpoint::Completions, &HeaderMap::new(), &json!({"model": "m", "prompt": p}), RULES, facts)
            .unwrap()
            .conversation
            .map(|c| c.key)
    };
    // RULES takes 8 bytes.
    assert_eq!(key(json!("12345678-a")), key(json!("12345678-b")));
    assert_ne!(key(json!("12345678")), key(json!("1234567x")));
    assert_eq!(key(json!(["12345678-a", "z"])), key(json!("12345678")));
    let e = extract_json(Endpoint::Embeddings, &HeaderMap::new(), &json!({"model": "m", "input": "x"}), RULES, facts);
    assert_eq!(e.unwrap().conversation, None, "embeddings derive no key");
}

#[test]
fn vllm_routes_and_other_v1_posts_pass_through_but_not_the_front_doors_own_paths() {
    for path in
        ["/tokenize", "/detokenize", "/v1/score", "/v1/rerank", "/score", "/rerank", "/v2/rerank", "/v1/pooling"]
    {
        assert_eq!(Endpoint::pass_through(path), Some(Endpoint::PassThrough), "{path}");
    }
    for path in ["/v1/", "/v1/responses/resp_1/cancel", "/v1/messages/batches", "/v1/models", "/metrics", "/v2/x"] {
        assert_eq!(Endpoint::pass_through(path), None, "{path}");
    }
}

#[test]
fn a_pass_through_request_is_routed_like_a_completion() {
    let body = parse_body(br#"{"model":"m","prompt":"the same prefix, then more"}"#).unwrap();
    let rules = Rules { session_header: None, completion_prefix_bytes: 15 };
    let facts =
        |_: &str| Some(ModelFacts { kv_bytes_per_token: Some(1 << 20), kv_block_tokens: 1, ..ModelFacts::default() });
    let h = hyper::HeaderMap::new();
    let pass = extract(Endpoint::PassThrough, &h, &body, rules, facts).unwrap();
    let completion = extract(Endpoint::Completions, &h, &body, rules, facts).unwrap();
    assert_eq!(pass, completion);
    assert_eq!(token_estimate(Endpoint::PassThrough, &body, 256).unwrap(), 7, "the prompt only: nothing generated");
    let no_model = parse_body(br#"{"text_1":"a","text_2":"b"}"#).unwrap();
    assert_eq!(extract(Endpoint::PassThrough, &h, &no_model, rules, facts).unwrap_err(), InputsError::NoModel);
}
