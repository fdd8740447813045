//! `ailb-sim` over HTTP on loopback: the binary is spawned on a free port, polled for
//! `/health`, and killed by pid when the test ends. Timing bounds are derived from the
//! profile: with prefill at 1000 tok/s and a time scale of 10, 8192 uncached tokens take
//! 0.82 s of real time, a fully cached prompt 0.1 ms; the asserts split the difference.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_sim::wait_until;
use serde_json::{json, Value};

struct Sim {
    child: Child,
    addr: String,
}

impl Sim {
    fn start(args: &[&str]) -> Sim {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_ailb-sim"))
            .args(["--listen", &addr])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning ailb-sim: {e}"));
        let mut sim = Sim { child, addr };
        wait_until("ailb-sim /health to answer 200", Duration::from_secs(10), || {
            if let Ok(Some(st)) = sim.child.try_wait() {
                panic!("ailb-sim exited early: {st}");
            }
            sim.try_get("/health").ok().filter(|r| r.status == 200)
        });
        sim
    }

    fn try_get(&self, path: &str) -> std::io::Result<Resp> {
        request(&self.addr, "GET", path, None)
    }

    fn get(&self, path: &str) -> Resp {
        self.try_get(path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    fn chat(&self, body: &Value) -> Resp {
        request(&self.addr, "POST", "/v1/chat/completions", Some(body))
            .unwrap_or_else(|e| panic!("POST /v1/chat/completions: {e}"))
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").body;
        parse_exposition(&text)
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
            .1
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            eprintln!("killing ailb-sim pid {}: {e}", self.child.id());
        }
        let _ = self.child.wait(); // reaping a killed child cannot fail in a way that matters here
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// Real time from sending the request to the first `data:` event of the body.
    first_event: Option<Duration>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

/// A minimal HTTP/1.1 client (Connection: close; chunked bodies decoded).
fn request(addr: &str, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let t0 = Instant::now();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    let mut first_event = None;
    let mut buf = [0u8; 16384];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if first_event.is_none() && raw.windows(6).any(|w| w == b"data: ") {
            first_event = Some(t0.elapsed());
        }
    }
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end in {text:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status =
        status_line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{status_line:?}"));
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let chunked = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_string() };
    Ok(Resp { status, headers, body, first_event })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap_or_else(|| panic!("bad chunk framing at {s:?}"));
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

/// Samples of a Prometheus text exposition; panics on a line that is neither a comment nor
/// `name{labels} value`.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim_start();
            assert!(c.starts_with("HELP ") || c.starts_with("TYPE "), "bad comment line {line:?}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        let name = match series.split_once('{') {
            Some((n, labels)) => {
                assert!(labels.ends_with('}') && labels.contains("=\""), "bad labels in {line:?}");
                n
            }
            None => series,
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        let v: f64 = value.parse().unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
        out.push((name.to_string(), v));
    }
    out
}

/// SSE events of a streamed body: the JSON chunks, and whether `[DONE]` ended it.
fn sse_events(body: &str) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block.strip_prefix("data: ").unwrap_or_else(|| panic!("SSE event without data: {block:?}"));
        assert!(!done, "event after [DONE]: {block:?}");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("event {data:?}: {e}")));
        }
    }
    (events, done)
}

fn sim_body(prompt_tokens: u64, hash_ids: &[u64], max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "sim-llama-7b",
        "messages": [{"role": "user", "content": "replayed"}],
        "stream": stream,
        "stream_options": {"include_usage": true},
        "ailb_sim": {"prompt_tokens": prompt_tokens, "hash_ids": hash_ids, "max_tokens": max_tokens},
    })
}

#[test]
fn cached_prefix_skips_prefill_and_sse_is_well_formed() {
    let sim = Sim::start(&["--prefill-tps", "1000", "--decode-tps", "1000", "--time-scale", "10"]);
    let ids: Vec<u64> = (0..16).collect();
    let first = sim.chat(&sim_body(16 * 512, &ids, 3, true));
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("content-type"), Some("text/event-stream; charset=utf-8"));
    assert_eq!(first.header("x-ailb-sim-cached-tokens"), Some("0"));
    assert_eq!(first.header("x-ailb-backend"), Some(sim.addr.as_str()), "the server names itself");
    let (events, done) = sse_events(&first.body);
    assert!(done, "stream must end with data: [DONE]: {}", first.body);
    assert_eq!(events.len(), 5, "the role, 3 tokens and a usage chunk: {events:?}");
    // As vLLM: the role first, alone with empty content, then the tokens.
    assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    for e in &events[1..4] {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["choices"][0]["delta"], json!({"content": "tok "}));
    }
    assert_eq!(events[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[4]["usage"]["completion_tokens"], 3);
    let ttft1 = first.first_event.expect("a first event");
    assert!(ttft1 >= Duration::from_millis(800), "8192 tokens at 1000 tok/s / 10 = 819 ms, got {ttft1:?}");

    let second = sim.chat(&sim_body(16 * 512, &ids, 3, true));
    assert_eq!(second.header("x-ailb-sim-cached-tokens"), Some("8192"));
    let ttft2 = second.first_event.expect("a first event");
    assert!(ttft2 < Duration::from_millis(400), "cached prefix: ~0.1 ms modelled, got {ttft2:?}");
    let (events, done) = sse_events(&second.body);
    assert!(done);
    assert_eq!(events[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 8192);

    // Not streamed: one JSON with usage and the model's numbers.
    let third = sim.chat(&sim_body(17 * 512, &(0..17).collect::<Vec<_>>(), 2, false));
    let v = third.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], 17 * 512);
    assert_eq!(v["ailb_sim"]["cached_tokens"], 16 * 512);
    assert!((v["ailb_sim"]["prefill_s"].as_f64().expect("prefill_s") - 0.512).abs() < 1e-9);

    assert_eq!(sim.metric("vllm:prefix_cache_queries_total"), (16 * 512 * 2 + 17 * 512) as f64);
    assert_eq!(sim.metric("vllm:prefix_cache_hits_total"), (16 * 512 * 2) as f64);
    let state = sim.get("/sim/state").json();
    assert_eq!(state["counters"]["prefix_hit_blocks"], 32);
    assert_eq!(state["kv_blocks_cached"], 17);
}

#[test]
fn text_prompts_sharing_leading_blocks_hit_the_cache() {
    // No side channel: the server keys its cache on 2048-byte chunks of the text it receives.
    let sim = Sim::start(&["--time-scale", "100"]);
    let text_body = |ids: &[u64], tokens: u64| {
        json!({"model": "sim-llama-7b", "max_tokens": 2,
               "messages": [{"role": "user", "content": ailb_sim::text::prompt_text(ids, tokens, 0)}]})
    };
    let first = sim.chat(&text_body(&[0, 1, 2], 1500)).json();
    assert_eq!(first["usage"]["prompt_tokens"], 1500);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Shares blocks 0 and 1 (and nothing after them) with the first.
    let second = sim.chat(&text_body(&[0, 1, 3, 4], 1800)).json();
    assert_eq!(second["usage"]["prompt_tokens"], 1800);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], 2 * 512);
    // The same blocks in another order share nothing: each key chains its whole prefix.
    let third = sim.chat(&text_body(&[1, 0], 1024)).json();
    assert_eq!(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let state = sim.get("/sim/state").json();
    assert_eq!(state["counters"]["prefix_hit_blocks"], 2);
    assert_eq!(state["kv_blocks_cached"], 3 + 2 + 2);
}

#[test]
fn request_that_can_never_fit_is_a_400_out_of_memory_error() {
    let sim = Sim::start(&["--profile", "rtx3090-24gb", "--time-scale", "100"]);
    // 43 blocks of 512 tokens = 22,016 tokens.
    let r = sim.chat(&sim_body(22_000, &[], 100, false));
    assert_eq!(r.status, 400, "{r:?}");
    let e = &r.json()["error"];
    assert_eq!(e["type"], "BadRequestError");
    assert_eq!(e["code"], 400);
    let msg = e["message"].as_str().expect("message");
    assert!(msg.contains("exceeds the KV cache capacity") && msg.contains("22016"), "message: {msg}");
    let state = sim.get("/sim/state").json();
    assert_eq!(state["counters"]["oom_total"], 1);
    assert_eq!(state["gpu_type"], "RTX3090-24GB");
    // The server goes on serving; one that fits runs.
    assert_eq!(sim.chat(&sim_body(21_000, &[], 1, false)).status, 200);
    // A body it cannot read is a 400 too.
    let bad = sim.chat(&json!({"ailb_sim": {"prompt_tokens": "many"}}));
    assert_eq!(bad.status, 400);
}

#[test]
fn full_batch_queues_the_next_request_until_a_slot_frees() {
    // One slot; 20 tokens at 20 tok/s keep it for ~1 s.
    let sim = Sim::start(&["--max-seqs", "1", "--decode-tps", "20"]);
    let addr = sim.addr.clone();
    let long =
        std::thread::spawn(move || request(&addr, "POST", "/v1/chat/completions", Some(&sim_body(10, &[], 20, true))));
    wait_until("the first request to run", Duration::from_secs(5), || {
        (sim.metric("vllm:num_requests_running") == 1.0).then_some(())
    });
    let addr = sim.addr.clone();
    let queued =
        std::thread::spawn(move || request(&addr, "POST", "/v1/chat/completions", Some(&sim_body(10, &[], 1, false))));
    wait_until("the second request to wait", Duration::from_secs(5), || {
        (sim.metric("vllm:num_requests_waiting") == 1.0).then_some(())
    });
    assert_eq!(sim.metric("vllm:num_requests_running"), 1.0);
    assert!(sim.metric("vllm:kv_cache_usage_perc") > 0.0);

    let long = long.join().expect("thread").expect("first request");
    assert!(sse_events(&long.body).1, "first stream completes");
    let queued = queued.join().expect("thread").expect("second request");
    assert_eq!(queued.status, 200);
    let waited = queued.json()["ailb_sim"]["queued_s"].as_f64().expect("queued_s");
    assert!(waited > 0.2, "the second request waited for the first (~0.95 s of decode), queued_s = {waited}");
    assert_eq!(sim.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(sim.metric("vllm:num_requests_waiting"), 0.0);
    assert_eq!(sim.metric("vllm:request_success_total"), 2.0);
}

#[test]
fn plain_openai_request_models_health_metrics_and_nvml_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nvml = dir.path().join("state");
    let nvml_arg = nvml.to_str().expect("UTF-8 path");
    let sim = Sim::start(&["--time-scale", "100", "--model", "m\"x", "--nvml-state", nvml_arg]);
    let r = sim
        .chat(&json!({"model": "m\"x", "messages": [{"role": "user", "content": "a".repeat(400)}], "max_tokens": 2}));
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"], 100, "400 bytes / 4");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");

    let models = sim.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m\"x");

    let text = sim.get("/metrics").body;
    let samples = parse_exposition(&text);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(samples.iter().any(|(n, _)| n == name), "{name} missing from:\n{text}");
    }
    assert!(text.contains(r#"model_name="m\"x""#), "label value escaped:\n{text}");

    let state = wait_until("the NVML state file", Duration::from_secs(5), || std::fs::read_to_string(&nvml).ok());
    let lines: Vec<&str> = state.lines().collect();
    assert_eq!(lines[..4], ["count 1", "0 name A100-80GB", lines[2], "0 total_mb 81920"], "{state}");
    assert!(lines[2].starts_with("0 uuid GPU-"), "{state}");
    assert!(
        lines.iter().any(|l| l.starts_with("0 used_mb ")) && lines.iter().any(|l| l.starts_with("0 util ")),
        "{state}"
    );
}

#[test]
fn hundreds_of_concurrent_streams_all_complete() {
    // 300 streams over 64 slots: most queue, all finish; the model ends idle.
    let sim = Sim::start(&["--time-scale", "100"]);
    let threads: Vec<_> = (0..300u64)
        .map(|i| {
            let addr = sim.addr.clone();
            std::thread::spawn(move || {
                request(&addr, "POST", "/v1/chat/completions", Some(&sim_body(600, &[i], 5, true)))
            })
        })
        .collect();
    for t in threads {
        let r = t.join().expect("thread").expect("request");
        assert_eq!(r.status, 200);
        let (events, done) = sse_events(&r.body);
        assert!(done && events.len() == 7, "the role, 5 tokens, usage, [DONE]: {}", r.body);
    }
    assert_eq!(sim.metric("vllm:request_success_total"), 300.0);
    assert_eq!(sim.metric("vllm:num_requests_running") + sim.metric("vllm:num_requests_waiting"), 0.0);
}

#[test]
fn completions_other_models_and_unknown_paths_are_answered_as_vllm_answers_them() {
    let sim = Sim::start(&["--time-scale", "100", "--model", "m"]);
    let post = |path: &str, body: Value| request(&sim.addr, "POST", path, Some(&body)).expect("a response");

    let r = post("/v1/completions", json!({"model": "m", "prompt": "abcdefgh", "max_tokens": 2}));
    let v = r.json();
    assert_eq!((r.status, v["object"].as_str()), (200, Some("text_completion")), "{v}");
    assert_eq!((v["choices"][0]["text"].as_str(), v["usage"]["prompt_tokens"].as_u64()), (Some("tok tok "), Some(2)));
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")), "{v}");

    let r = post("/v1/completions", json!({"model": "m", "prompt": "abcd", "max_tokens": 2, "stream": true}));
    let (events, done) = sse_events(&r.body);
    assert!(done && events.len() == 2, "two tokens, no role chunk: {}", r.body);
    assert_eq!(
        (events[0]["object"].as_str(), events[0]["choices"][0]["text"].as_str()),
        (Some("text_completion"), Some("tok "))
    );
    assert_eq!(events[1]["choices"][0]["finish_reason"], "length");

    // Another model's name: vLLM's 404, whichever API.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let r = post(path, json!({"model": "other", "prompt": "x", "messages": [{"role": "user", "content": "x"}]}));
        let e = &r.json()["error"];
        assert_eq!(
            (r.status, e["type"].as_str(), e["code"].as_u64()),
            (404, Some("NotFoundError"), Some(404)),
            "{path}: {e}"
        );
        assert_eq!(e["message"], "The model `other` does not exist. Valid aliases: m.");
    }
    // A malformed field: vLLM's validation error, the field under `body.`.
    let r = post("/v1/chat/completions", json!({"model": "m", "messages": "bad"}));
    let e = &r.json()["error"];
    assert_eq!(
        (r.status, e["type"].as_str(), e["param"].as_str()),
        (400, Some("Bad Request"), Some("body.messages")),
        "{e}"
    );
    // No model named: served (vLLM takes its one served model).
    assert_eq!(post("/v1/completions", json!({"prompt": "x", "max_tokens": 1})).status, 200);

    let r = sim.get("/no/such/path");
    assert_eq!((r.status, r.json()), (404, json!({"detail": "Not Found"})));

    let text = sim.get("/metrics").body;
    let info = text.lines().find(|l| l.starts_with("vllm:cache_config_info{")).unwrap_or_else(|| panic!("{text}"));
    assert!(info.contains("block_size=\"512\"") && info.contains("num_gpu_blocks=\""), "{info}");
}

/// The named events of an agents' API stream: `(event, data)` in order.
fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(d).unwrap_or_else(|e| panic!("event {d:?}: {e}")));
                }
            }
            let (name, data) = (name.expect("an event name"), data.expect("event data"));
            assert_eq!(data["type"].as_str(), Some(name.as_str()), "the event's name is its type");
            (name, data)
        })
        .collect()
}

#[test]
fn responses_are_stored_in_the_server_that_made_them_and_found_only_there() {
    let a = Sim::start(&["--time-scale", "100", "--model", "m"]);
    let b = Sim::start(&["--time-scale", "100", "--model", "m"]);
    let post = |sim: &Sim, body: Value| request(&sim.addr, "POST", "/v1/responses", Some(&body)).expect("a response");

    let r = post(&a, json!({"model": "m", "instructions": "be brief", "input": "abcdefgh", "max_output_tokens": 2}));
    let v = r.json();
    assert_eq!(
        (r.status, v["object"].as_str(), v["status"].as_str()),
        (200, Some("response"), Some("completed")),
        "{v}"
    );
    let id = v["id"].as_str().expect("an id").to_string();
    assert!(id.starts_with("resp_"), "{id}");
    assert_eq!(v["output"][0]["content"][0]["text"], "tok tok ");
    assert_eq!((v["usage"]["input_tokens"].as_u64(), v["usage"]["output_tokens"].as_u64()), (Some(4), Some(2)));

    // The follow-up continues the stored conversation on the server that stored it ...
    let r = post(&a, json!({"model": "m", "input": "more", "previous_response_id": id, "max_output_tokens": 1}));
    let v = r.json();
    assert_eq!(r.status, 200, "{v}");
    assert_eq!(v["previous_response_id"].as_str(), Some(id.as_str()));
    assert_eq!(v["usage"]["input_tokens"].as_u64(), Some(4 + 2 + 1), "the stored conversation and the new input");
    // ... and any other server answers vLLM's 404.
    let r = post(&b, json!({"model": "m", "input": "more", "previous_response_id": id}));
    let e = &r.json()["error"];
    assert_eq!(
        (r.status, e["code"].as_u64(), e["type"].as_str(), e["param"].as_str()),
        (404, Some(404), Some("invalid_request_error"), Some("response_id")),
        "{e}"
    );
    assert_eq!(e["message"].as_str(), Some(format!("Response with id '{id}' not found.").as_str()));
    // Not stored when asked not to.
    let v = post(&a, json!({"model": "m", "input": "x", "store": false, "max_output_tokens": 1})).json();
    let r = post(&a, json!({"model": "m", "input": "y", "previous_response_id": v["id"]}));
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(post(&a, json!({"model": "m"})).status, 400, "no input");
    let r = request(&a.addr, "GET", &format!("/v1/responses/{id}"), None).expect("a response");
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(id.as_str())), "retrieved where stored");
    let r = request(&b.addr, "GET", &format!("/v1/responses/{id}"), None).expect("a response");
    assert_eq!(r.status, 404, "and nowhere else: {}", r.body);
    let r = request(&a.addr, "POST", &format!("/v1/responses/{id}/cancel"), None).expect("a response");
    assert_eq!(r.status, 400, "a finished response is not cancelled: {}", r.body);

    // Streamed: the id in response.created, one delta per token, then the done events.
    let r = post(&b, json!({"model": "m", "input": "abcd", "max_output_tokens": 3, "stream": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    let events = named_events(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|(_, d)| d["sequence_number"].as_u64().expect("a number")).collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    let streamed_id = events[0].1["response"]["id"].as_str().expect("the id first").to_string();
    assert_eq!(events[10].1["response"]["id"].as_str(), Some(streamed_id.as_str()));
    let r =
        post(&b, json!({"model": "m", "input": "more", "previous_response_id": streamed_id, "max_output_tokens": 1}));
    assert_eq!(r.status, 200, "a streamed response is stored too: {}", r.body);
    assert_ne!(id, streamed_id);
}

#[test]
fn anthropic_messages_are_answered_in_anthropics_shapes() {
    let sim = Sim::start(&["--time-scale", "100", "--model", "m"]);
    let post = |body: Value| request(&sim.addr, "POST", "/v1/messages", Some(&body)).expect("a response");
    let body =
        json!({"model": "m", "system": "ab", "messages": [{"role": "user", "content": "cdefgh"}], "max_tokens": 2});

    let r = post(body.clone());
    let v = r.json();
    assert_eq!((r.status, v["type"].as_str(), v["role"].as_str()), (200, Some("message"), Some("assistant")), "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("msg_")), "{v}");
    assert_eq!((v["content"][0]["type"].as_str(), v["content"][0]["text"].as_str()), (Some("text"), Some("tok tok ")));
    assert_eq!((v["stop_reason"].as_str(), v["usage"]["input_tokens"].as_u64()), (Some("max_tokens"), Some(2)));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(streamed);
    let events = named_events(&r.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[2].1["delta"], json!({"type": "text_delta", "text": "tok "}));
    assert_eq!(events[5].1["usage"]["output_tokens"].as_u64(), Some(2));

    let r = request(
        &sim.addr,
        "POST",
        "/v1/messages/count_tokens",
        Some(&json!({"model": "m", "system": "ab", "messages": [{"role": "user", "content": "cdefgh"}]})),
    )
    .expect("a response");
    assert_eq!((r.status, r.json()["input_tokens"].as_u64()), (200, Some(2)), "{}", r.body);

    // vLLM's validation answers in its OpenAI shape on this route too; other errors are Anthropic's.
    let r = post(json!({"model": "m", "messages": []}));
    let e = &r.json()["error"];
    assert_eq!(
        (r.status, e["type"].as_str(), e["param"].as_str()),
        (400, Some("Bad Request"), Some("max_tokens")),
        "{e}"
    );
    let r = post(json!({"model": "other", "messages": [], "max_tokens": 1}));
    let v = r.json();
    assert_eq!(
        (r.status, v["type"].as_str(), v["error"]["type"].as_str()),
        (404, Some("error"), Some("NotFoundError"))
    );
}
