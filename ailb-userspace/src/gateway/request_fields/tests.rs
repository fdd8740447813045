use super::*;

/// What the rules read of a parse into a `Value`, the way they read it from a `Value`
/// (or its error, or the kind of a non-object).
fn reference(bytes: &[u8]) -> Result<Result<Fields<'static>, &'static str>, String> {
    let m = match serde_json::from_slice::<Value>(bytes).map_err(|e| e.to_string())? {
        Value::Object(m) => m,
        Value::Null => return Ok(Err("null")),
        Value::Bool(_) => return Ok(Err("a boolean")),
        Value::Number(_) => return Ok(Err("a number")),
        Value::String(_) => return Ok(Err("a string")),
        Value::Array(_) => return Ok(Err("an array")),
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(|s| Cow::Owned(s.to_string()));
    let message = |v: &Value| Message {
        role: text(v.get("role")),
        content: match v.get("content") {
            Some(Value::String(s)) => Content::Text(Cow::Owned(s.clone())),
            Some(Value::Array(parts)) => Content::Parts(parts.iter().filter_map(|p| text(p.get("text"))).collect()),
            _ => Content::None,
        },
    };
    let str_or = |v: &Value| match v {
        Value::String(s) => StrOr::Str(Cow::Owned(s.clone())),
        other => StrOr::Other(other.clone()),
    };
    Ok(Ok(Fields {
        model: m.get("model").map(str_or),
        messages: m.get("messages").map(|v| match v {
            Value::Array(list) => Messages::List(list.iter().map(message).collect()),
            _ => Messages::NotList,
        }),
        prompt: m.get("prompt").cloned(),
        input: m.get("input").cloned(),
        max_tokens: m.get("max_tokens").cloned(),
        max_completion_tokens: m.get("max_completion_tokens").cloned(),
        prompt_cache_key: m.get("prompt_cache_key").map(|v| Text(text(Some(v)))),
        instructions: m.get("instructions").map(str_or),
        system: m.get("system").cloned(),
        previous_response_id: m.get("previous_response_id").map(str_or),
        max_output_tokens: m.get("max_output_tokens").cloned(),
        priority: m.get("priority").cloned(),
        service_tier: m.get("service_tier").cloned(),
    }))
}

fn parsed(bytes: &[u8]) -> Result<Result<Fields<'_>, &'static str>, String> {
    match serde_json::from_slice::<Top>(bytes).map_err(|e| e.to_string())? {
        Top::Object(m) => Ok(Ok(m)),
        Top::Other(kind) => Ok(Err(kind)),
    }
}

#[test]
fn accepts_refuses_and_keeps_what_a_value_parse_does() {
    let deep = format!("{{\"model\":\"m\",\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
    let deep_msg = format!("{{\"messages\":[{{\"content\":[{{\"text\":{}1{}}}]}}]}}", "[".repeat(126), "]".repeat(126));
    let inputs: Vec<Vec<u8>> = [
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false}"#,
        r#"{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"a":[1,2.5,-3e7,null,true]}}}]}"#,
        r#"{"model":"a","model":"b","prompt":["x","y"],"input":"z","prompt_cache_key":"k","max_completion_tokens":9}"#,
        r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}],"instructions":"be terse","previous_response_id":"resp_1","max_output_tokens":5}"#,
        r#"{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"}],"max_tokens":3}"#,
        r#"{"instructions":7,"previous_response_id":{"id":1},"system":"s","system":null,"max_output_tokens":"x"}"#,
        r#"{"model":"m","temperature":1e400}"#,
        r#"{"model":"m","x":"\ud800"}"#,
        r#"{"model":"m","x":"\u00e9\n\"q\""}"#,
        r#"{"model":"m","x":"tab	in"}"#,
        r#"{"model":"m","x":[1,]}"#,
        r#"{"model":"m"} trailing"#,
        r#"{"model":"m","x":01}"#,
        r#"{"m\u006fdel":"escaped key"}"#,
        r#"{"model":{"a":[1,"x"]},"max_tokens":"many","max_completion_tokens":1.5,"prompt_cache_key":7}"#,
        r#"{"model":null,"messages":{"role":"user"},"prompt_cache_key":"p\u0041"}"#,
        r#"{"messages":[1,"s",null,{"role":7,"content":{"text":"x"}},{"role":"user","role":"system"}]}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},"b",{"text":2},{"text":"c","text":"d"}]}]}"#,
        r#"{"messages":[{"role":"u\u0073er","content":"esc\u00e9\n","content":"last","extra":[{"z":1}]}],"messages":[]}"#,
        r#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
        r#"{"messages":[{"role":"user","content":[{"text":"x"},]}]}"#,
        r#"{"messages":[{"role":"user","content":"a"}"#,
        "[1,{\"a\":2}]",
        "null",
        "true",
        "-1.5",
        "\"s\"",
        "",
        "{\"model\":",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .chain([deep.into_bytes(), deep_msg.into_bytes(), b"{\"model\":\"m\",\"x\":\"\xff\"}".to_vec()])
    .collect();
    for bytes in &inputs {
        assert_eq!(parsed(bytes), reference(bytes), "{}", String::from_utf8_lossy(bytes));
    }
    // A repeated field keeps its last value; the others are not kept at all.
    let m = parsed(inputs[2].as_slice()).unwrap().unwrap();
    assert_eq!(m.model, Some(StrOr::Str("b".into())));
    // Unescaped text is a slice of the body, not a copy.
    let m = parsed(inputs[0].as_slice()).unwrap().unwrap();
    let Some(Messages::List(list)) = &m.messages else { panic!("messages: {:?}", m.messages) };
    assert!(matches!(&list[0].content, Content::Text(Cow::Borrowed("hi"))), "{:?}", list[0].content);
}

#[test]
fn content_text_joins_parts_with_newlines() {
    let parts = Content::Parts(vec!["ab".into(), "c".into()]);
    let mut out = Vec::new();
    parts.write_text(&mut out);
    assert_eq!(out, b"ab\nc");
    assert_eq!(parts.text_len(), out.len());
    assert_eq!(Content::Parts(vec![]).text_len(), 0);
    assert_eq!(Content::Text("xyz".into()).text_len(), 3);
}
