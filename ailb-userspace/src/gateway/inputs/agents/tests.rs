use hyper::header::HeaderMap;
use serde_json::{json, Value};

use crate::gateway::http::{ApiError, ErrorShape};
use crate::gateway::inputs::{extract, parse_body, Endpoint, Inputs, InputsError, KeySource, ModelFacts, Rules};

const RULES: Rules<'static> = Rules { session_header: None, completion_prefix_bytes: 8 };

fn facts(name: &str) -> Option<ModelFacts> {
    // 1 MiB a token in blocks of one token: the estimate in MB is the token count.
    (name == "m").then_some(ModelFacts {
        required_memory_mb: None,
        kv_bytes_per_token: Some(1 << 20),
        kv_block_tokens: 1,
    })
}

fn call(endpoint: Endpoint, body: Value) -> Result<Inputs, InputsError> {
    let bytes = serde_json::to_vec(&body).unwrap();
    extract(endpoint, &HeaderMap::new(), &parse_body(&bytes)?, RULES, facts)
}

fn responses(body: Value) -> Result<Inputs, InputsError> {
    call(Endpoint::Responses, body)
}

fn messages(body: Value) -> Result<Inputs, InputsError> {
    call(Endpoint::Messages, body)
}

#[test]
fn the_routes_of_the_agents_apis() {
    assert_eq!(Endpoint::from_path("/v1/responses"), Some(Endpoint::Responses));
    assert_eq!(Endpoint::from_path("/v1/messages"), Some(Endpoint::Messages));
    assert_eq!(Endpoint::Messages.error_shape(), ErrorShape::Anthropic);
    assert_eq!(Endpoint::from_path("/v1/messages/count_tokens"), Some(Endpoint::CountTokens));
    assert_eq!(Endpoint::CountTokens.error_shape(), ErrorShape::Anthropic);
    assert_eq!(Endpoint::Responses.error_shape(), ErrorShape::OpenAi);
}

#[test]
fn a_responses_request_estimates_from_instructions_input_and_max_output_tokens() {
    // 8 bytes of instructions + 8 of input: 4 tokens; 6 to generate.
    let r = responses(json!({"model": "m", "instructions": "abcdefgh", "input": "ijklmnop", "max_output_tokens": 6}))
        .unwrap();
    assert_eq!(r.memory_mb, Some(10));
    let items = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "abcd"}, {"type": "input_image", "image_url": "x"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c", "output": "result!"},
        {"role": "assistant", "content": "a"},
    ]);
    // 4 + 7 + 7 + 1 = 19 bytes: 5 tokens; max_tokens is not the Responses API's name for it.
    let r = responses(json!({"model": "m", "input": items, "max_tokens": 100})).unwrap();
    assert_eq!(r.memory_mb, Some(5));
    assert_eq!(r.previous_response_id, None);
}

#[test]
fn an_agent_that_resends_its_history_keeps_one_derived_conversation() {
    let first = json!([{"role": "user", "content": "plan a trip"}]);
    let later = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "plan a trip"}]},
        {"role": "assistant", "content": "where to?"},
        {"role": "user", "content": "Lisbon"},
    ]);
    let a = responses(json!({"model": "m", "instructions": "be brief", "input": first})).unwrap();
    let b = responses(json!({"model": "m", "instructions": "be brief", "input": later})).unwrap();
    let s = responses(json!({"model": "m", "instructions": "be brief", "input": "plan a trip"})).unwrap();
    let other = responses(json!({"model": "m", "instructions": "be verbose", "input": "plan a trip"})).unwrap();
    let key = |i: &Inputs| i.conversation.clone().map(|c| (c.key, c.source));
    assert_eq!(key(&a), key(&b));
    assert_eq!(key(&a), key(&s), "an input string is the first user message");
    assert_ne!(key(&a), key(&other));
    assert_eq!(a.conversation.unwrap().source, KeySource::Derived);
    let given = responses(json!({"model": "m", "input": "x", "prompt_cache_key": "agent-7"})).unwrap();
    assert_eq!(given.conversation.unwrap().key, "agent-7");

    let system = |s: Value, first: &str| {
        messages(json!({"model": "m", "max_tokens": 1, "system": s, "messages": [{"role": "user", "content": first}]}))
            .unwrap()
            .conversation
            .unwrap()
            .key
    };
    assert_eq!(system(json!("sys"), "q"), system(json!([{"type": "text", "text": "sys"}]), "q"));
    assert_ne!(system(json!("sys"), "q"), system(json!("sys"), "r"));
}

#[test]
fn a_messages_request_estimates_from_system_messages_and_max_tokens() {
    let body = json!({
        "model": "m",
        "system": [{"type": "text", "text": "abcd"}, {"type": "text", "text": "efg"}],
        "messages": [{"role": "user", "content": "hijk"}, {"role": "assistant", "content": [{"type": "text", "text": "l"}]}],
        "max_tokens": 3,
    });
    // "abcd\nefg" (8) + 4 + 1 = 13 bytes: 4 tokens, and 3 to generate.
    assert_eq!(messages(body).unwrap().memory_mb, Some(7));
}

#[test]
fn previous_response_id_is_read_and_checked() {
    let r = responses(json!({"model": "m", "input": "more", "previous_response_id": "resp_abc"})).unwrap();
    assert_eq!(r.previous_response_id.as_deref(), Some("resp_abc"));
    let r = responses(json!({"model": "m", "input": "more", "previous_response_id": null})).unwrap();
    assert_eq!(r.previous_response_id, None);
}

/// `(field, value quoted)` of a 400, and that the answer names both.
fn bad(r: Result<Inputs, InputsError>) -> (String, String) {
    let e = r.expect_err("refused");
    let api = ApiError::from(e.clone());
    assert_eq!(api.status.as_u16(), 400, "{e}");
    let field = api.param.clone().expect("the field is named");
    assert!(api.message.contains(&field), "{}", api.message);
    let value = match &e {
        InputsError::BadField { value, .. } => {
            assert!(api.message.contains(value.as_str()), "{}", api.message);
            value.clone()
        }
        InputsError::Missing { .. } => "(missing)".into(),
        other => panic!("not a field's error: {other}"),
    };
    (field, value)
}

#[test]
fn malformed_fields_are_400s_naming_the_field_and_value() {
    let f = |field: &str, value: &str| (field.to_string(), value.to_string());
    assert_eq!(bad(responses(json!({"model": "m"}))), f("input", "(missing)"));
    assert_eq!(bad(responses(json!({"model": "m", "input": 5}))), f("input", "5"));
    assert_eq!(bad(responses(json!({"model": "m", "input": ["hi"]}))), f("input", "\"hi\""));
    assert_eq!(
        bad(responses(json!({"model": "m", "input": "x", "instructions": ["a"]}))),
        f("instructions", "[\"a\"]")
    );
    assert_eq!(
        bad(responses(json!({"model": "m", "input": "x", "previous_response_id": 7}))),
        f("previous_response_id", "7")
    );
    assert_eq!(
        bad(responses(json!({"model": "m", "input": "x", "previous_response_id": ""}))),
        f("previous_response_id", "\"\"")
    );
    assert_eq!(
        bad(responses(json!({"model": "m", "input": "x", "max_output_tokens": -1}))),
        f("max_output_tokens", "-1")
    );
    let long = "y".repeat(500);
    let (_, quoted) = bad(responses(json!({"model": "m", "input": [long]})));
    assert!(quoted.len() < 130 && quoted.ends_with("..."), "a long value is cut: {quoted}");

    let ok = json!([{"role": "user", "content": "q"}]);
    assert_eq!(bad(messages(json!({"model": "m", "max_tokens": 1}))), f("messages", "(missing)"));
    assert_eq!(bad(messages(json!({"model": "m", "max_tokens": 1, "messages": "q"}))), f("messages", "(not an array)"));
    assert_eq!(bad(messages(json!({"model": "m", "messages": ok}))), f("max_tokens", "(missing)"));
    assert_eq!(bad(messages(json!({"model": "m", "messages": ok, "max_tokens": "lots"}))), f("max_tokens", "\"lots\""));
    assert_eq!(bad(messages(json!({"model": "m", "messages": ok, "max_tokens": 0}))), f("max_tokens", "0"));
    assert_eq!(bad(messages(json!({"model": "m", "messages": ok, "max_tokens": 1, "system": 3}))), f("system", "3"));
    assert_eq!(bad(messages(json!({"model": "m", "messages": ok, "max_tokens": 1, "system": [1]}))), f("system", "1"));
    // The model first: an unknown one is a 404 before any field is read.
    assert_eq!(messages(json!({"model": "nope"})), Err(InputsError::UnknownModel { model: "nope".into() }));
}

#[test]
fn errors_on_the_messages_route_take_anthropics_shape() {
    let e = ApiError::from(messages(json!({"model": "m", "messages": []})).unwrap_err()).shaped(ErrorShape::Anthropic);
    let body = e.body();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_tokens"), "{body}");
    let nf = ApiError::from(InputsError::UnknownModel { model: "x".into() }).shaped(ErrorShape::Anthropic);
    assert_eq!(nf.body()["error"]["type"], "not_found_error");
    let busy = ApiError::overloaded(1).shaped(ErrorShape::Anthropic);
    assert_eq!(busy.body()["error"]["type"], "rate_limit_error");
    assert!(busy.event().starts_with("event: error\ndata: {"), "{}", busy.event());
    assert!(ApiError::overloaded(1).event().starts_with("data: {\"error\""));
}

#[test]
fn a_token_count_reads_a_messages_request_without_max_tokens() {
    let body = json!({"model": "m", "system": "abcd", "messages": [{"role": "user", "content": "efgh"}]});
    let counted = call(Endpoint::CountTokens, body.clone()).unwrap();
    assert_eq!(counted.memory_mb, Some(2), "the prompt only: nothing is generated");
    let mut sent = body;
    sent["max_tokens"] = json!(1);
    assert_eq!(counted.conversation, messages(sent).unwrap().conversation, "the conversation's backend");
    assert_eq!(bad(call(Endpoint::CountTokens, json!({"model": "m"}))), ("messages".into(), "(missing)".into()));
}
