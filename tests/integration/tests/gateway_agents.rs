//! The APIs agents call, through the front door: `ailb gateway` runs INSIDE the test's child
//! cgroup in front of three `ailb-sim` servers behind one VIP; a client outside the cgroup
//! sends plain HTTP/1.1 requests.
//! - OpenAI's Responses API: 10 conversations of 11 turns each, every turn after the first
//!   naming the previous response in `previous_response_id`, with nothing else that would keep
//!   them together (each turn's input differs, no session header): each of the 100 follow-ups
//!   lands on the backend that stored its previous response, whose simulated server holds it
//!   in its memory only and would answer any other server's 404. Once not streamed (the id from
//!   the JSON body), once streamed (the id from the `response.created` event).
//! - `GET /v1/responses/{id}` reaches the backend that stored the response.
//! - Anthropic's Messages API, streamed and not: the answer and its events as the server sent
//!   them, `x-api-key` and `anthropic-version` passed upstream; and its token count.
//! - The errors: an unknown model, malformed fields (400 naming the field), an unknown
//!   `previous_response_id`, and one whose backend is gone (404 naming the id and the
//!   backend); Anthropic's error shape on its route; the next request is served as usual.
//! - The official `openai` and `anthropic` Python clients (the venv `target/client-venv` that
//!   `cargo xtask setup` creates; the test says "skipped" and why without it), unchanged and
//!   inside the cgroup: `responses.create` streamed and not with 100 follow-ups on their
//!   producers, `messages.create` streamed and not, and their NotFoundErrors; this front door
//!   runs with `http1_fast_path = false` (hyper on both sides), the other with its own HTTP/1.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ailb_tests::{base_config, preflight, run_cmd, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use serde_json::{json, Value};

const MODEL: &str = "agents-7b";
const VIP: &str = "127.77.33.1:8000";
const GATEWAY: &str = "127.0.33.1:18330";
const BACKENDS: [&str; 3] = ["127.0.33.11:18331", "127.0.33.12:18332", "127.0.33.13:18333"];
/// The same for the clients' test, on addresses of its own.
const CLIENTS_VIP: &str = "127.77.34.1:8000";
const CLIENTS_GATEWAY: &str = "127.0.34.1:18340";
const CLIENTS_BACKENDS: [&str; 3] = ["127.0.34.11:18341", "127.0.34.12:18342", "127.0.34.13:18343"];
const CHAINS: usize = 10;
/// Follow-ups per conversation: 10 x 10 = 100 in all.
const FOLLOW_UPS: usize = 10;

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn backend(&self) -> String {
        self.header("x-ailb-backend").unwrap_or_else(|| panic!("no x-ailb-backend: {}", self.body)).to_string()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// An event stream's events: (the `event:` name, the `data:` JSON).
    fn events(&self) -> Vec<(String, Value)> {
        self.body
            .split("\n\n")
            .filter(|b| !b.trim().is_empty())
            .map(|block| {
                let mut name = String::new();
                let mut data = Value::Null;
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = n.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(d).unwrap_or_else(|e| panic!("event data {d:?}: {e}"));
                    }
                }
                (name, data)
            })
            .collect()
    }
}

/// One POST on a connection of its own (`Connection: close`); a chunked body is decoded.
fn post(path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    send("POST", path, headers, body)
}

fn send(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = TcpStream::connect(GATEWAY).unwrap_or_else(|e| panic!("connecting to the gateway: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("a read timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    s.write_all(format!("{head}\r\n{body}").as_bytes()).expect("request written");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap_or_else(|e| panic!("reading the answer to {method} {path}: {e}"));
    let r = ailb_tests::http::parse_reply(&raw).unwrap_or_else(|e| panic!("the answer to {method} {path}: {e}"));
    Resp { status: r.status, headers: r.headers, body: r.body }
}

/// A Responses request; (its answer, the response's id, the backend that answered).
fn respond(input: &str, previous: Option<&str>, stream: bool) -> (Resp, String, String) {
    let mut body = json!({"model": MODEL, "input": input, "max_output_tokens": 2, "stream": stream});
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    let r = post("/v1/responses", &[], &body.to_string());
    assert_eq!(r.status, 200, "{input} after {previous:?}: {}", r.body);
    let id = if stream {
        let events = r.events();
        assert_eq!(events.first().map(|e| e.0.as_str()), Some("response.created"), "{}", r.body);
        assert_eq!(events.last().map(|e| e.0.as_str()), Some("response.completed"), "the whole stream: {}", r.body);
        events[0].1["response"]["id"].as_str().expect("an id").to_string()
    } else {
        r.json()["id"].as_str().expect("an id").to_string()
    };
    let backend = r.backend();
    (r, id, backend)
}

/// `ailb run` with `backends` (equal weights) behind `vip`, one `ailb-sim` per backend, and the
/// gateway on `listen` inside `cg`.
fn front_door(
    cg: &CgroupGuard,
    vip: &str,
    listen: &str,
    backends: &[&str; 3],
    gateway_extra: &str,
) -> (Vec<SimServer>, Daemon, GatewayProcess) {
    let bin = preflight();
    let sims: Vec<SimServer> = backends.iter().map(|b| SimServer::start(b, MODEL, &["--time-scale", "50"])).collect();
    let mut cfg = base_config("gw-agents", cg).service(MODEL, vip);
    for addr in backends {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1).free_memory_mb(20000));
    }
    cfg.extra = format!("[gateway]\nlisten = [\"{listen}\"]\n{gateway_extra}");
    let daemon = Daemon::start(&bin, &cfg);
    let listen: SocketAddr = listen.parse().expect("gateway address");
    let gateway = GatewayProcess::start(&bin, daemon.config_path(), cg, listen);
    (sims, daemon, gateway)
}

#[test]
fn responses_follow_ups_reach_the_backend_that_stored_their_response_and_anthropic_messages_pass_through() {
    let cg = CgroupGuard::new("gw-agents");
    let (mut sims, daemon, gateway) = front_door(&cg, VIP, GATEWAY, &BACKENDS, "");
    let names: BTreeSet<String> = BACKENDS.iter().map(|b| b.to_string()).collect();

    for stream in [false, true] {
        let mut producers = BTreeMap::<String, usize>::new();
        let mut landed = 0;
        for chain in 0..CHAINS {
            let (_, mut id, mut backend) =
                respond(&format!("conversation {chain} (stream {stream}) begins"), None, stream);
            assert!(names.contains(&backend), "{backend}");
            *producers.entry(backend.clone()).or_default() += 1;
            let mut conversation = None;
            for turn in 0..FOLLOW_UPS {
                let (r, next, at) = respond(&format!("turn {turn} of {chain}: go on"), Some(&id), stream);
                assert_eq!(
                    at, backend,
                    "conversation {chain} turn {turn} (stream {stream}): previous response {id} was stored by {backend}"
                );
                // The chain keeps one conversation key, the first request's.
                let conv = r.header("x-ailb-conversation").map(str::to_string);
                assert!(conv.is_some(), "a conversation hash: {:?}", r.headers);
                assert!(conversation.is_none() || conversation == conv, "turn {turn}: {conv:?} after {conversation:?}");
                conversation = conv;
                landed += 1;
                (id, backend) = (next, at);
            }
        }
        assert_eq!(landed, CHAINS * FOLLOW_UPS);
        eprintln!("stream {stream}: {landed} of {landed} follow-ups on their producer; first turns on {producers:?}");
        assert!(
            producers.len() > 1,
            "the first turns all reached one backend, so pinning was not exercised: {producers:?}"
        );
    }

    // A stored response by its id: retrieved from the backend that stored it, whichever it is.
    let (_, id, backend) = respond("a response to fetch again", None, false);
    let r = send("GET", &format!("/v1/responses/{id}"), &[], "");
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(id.as_str())), "{}", r.body);
    assert_eq!(r.backend(), backend);
    let r = send("GET", "/v1/responses/resp_never", &[], "");
    let e = &r.json()["error"];
    assert_eq!(
        (r.status, e["code"].as_str(), e["param"].as_str()),
        (404, Some("response_not_found"), Some("response_id"))
    );

    // Anthropic's Messages API, not streamed and streamed, its headers passed upstream.
    let body = json!({"model": MODEL, "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3});
    let anthropic = [("x-api-key", "sk-ant-test-key"), ("anthropic-version", "2023-06-01")];
    let r = post("/v1/messages", &anthropic, &body.to_string());
    let v = r.json();
    assert_eq!(
        (r.status, v["type"].as_str(), v["content"][0]["text"].as_str()),
        (200, Some("message"), Some("tok tok tok "))
    );
    assert!(names.contains(&r.backend()));
    assert_eq!(r.header("x-ailb-sim-anthropic-version"), Some("2023-06-01"), "{:?}", r.headers);
    assert_eq!(r.header("x-ailb-sim-x-api-key"), Some("sk-ant-test-key".len().to_string().as_str()));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post("/v1/messages", &anthropic, &streamed.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let names_seen: Vec<String> = r.events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        names_seen,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(r.header("x-ailb-sim-anthropic-version"), Some("2023-06-01"));

    let mut count = body.clone();
    count.as_object_mut().expect("an object").remove("max_tokens");
    let r = post("/v1/messages/count_tokens", &anthropic, &count.to_string());
    assert_eq!((r.status, r.json()["input_tokens"].as_u64().is_some()), (200, true), "{}", r.body);
    assert!(names.contains(&r.backend()));

    // Errors, each in its API's shape, naming the field or id.
    let r = post("/v1/responses", &[], &json!({"model": "no-such-model", "input": "x"}).to_string());
    let e = &r.json()["error"];
    assert_eq!((r.status, e["code"].as_str()), (404, Some("model_not_found")), "{}", r.body);
    assert!(e["message"].as_str().is_some_and(|m| m.contains("no-such-model")), "{e}");
    let r = post("/v1/messages", &[], &json!({"model": "no-such-model", "messages": [], "max_tokens": 1}).to_string());
    let v = r.json();
    assert_eq!(
        (r.status, v["type"].as_str(), v["error"]["type"].as_str()),
        (404, Some("error"), Some("not_found_error"))
    );
    let r = post("/v1/responses", &[], &json!({"model": MODEL, "input": 42}).to_string());
    let e = &r.json()["error"];
    assert_eq!((r.status, e["param"].as_str()), (400, Some("input")), "{}", r.body);
    assert!(e["message"].as_str().is_some_and(|m| m.contains("`input`") && m.contains("42")), "{e}");
    let r =
        post("/v1/messages", &[], &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).to_string());
    let v = r.json();
    assert_eq!((r.status, v["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{}", r.body);
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("max_tokens")), "{v}");
    let r = post("/v1/responses", &[], "{\"model\": ");
    assert_eq!(r.status, 400, "{}", r.body);
    let r = post(
        "/v1/responses",
        &[],
        &json!({"model": MODEL, "input": "x", "previous_response_id": "resp_never"}).to_string(),
    );
    let e = &r.json()["error"];
    assert_eq!(
        (r.status, e["code"].as_str(), e["param"].as_str()),
        (404, Some("previous_response_not_found"), Some("previous_response_id")),
        "{}",
        r.body
    );
    assert!(e["message"].as_str().is_some_and(|m| m.contains("'resp_never'")), "{e}");

    // None of it disturbed the next request.
    let (_, id, backend) = respond("a conversation whose server will go", None, false);
    assert!(names.contains(&backend), "{backend}");

    // A response whose backend is gone.
    let gone = sims.iter().position(|s| s.addr() == backend).expect("one of the servers");
    drop(sims.remove(gone));
    let r = post("/v1/responses", &[], &json!({"model": MODEL, "input": "x", "previous_response_id": id}).to_string());
    let e = &r.json()["error"];
    assert_eq!((r.status, e["code"].as_str()), (404, Some("previous_response_not_found")), "{}", r.body);
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains(&format!("'{id}'")) && m.contains(&backend)),
        "the id and the backend named: {e}"
    );
    // What a user sees: every follow-up counted by its outcome, the ids remembered.
    let metrics = send("GET", "/metrics", &[], "").body;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
    };
    assert_eq!(value("ailb_gateway_previous_responses_total{outcome=\"pinned\"}"), 200.0);
    assert_eq!(value("ailb_gateway_previous_responses_total{outcome=\"unknown\"}"), 1.0);
    assert_eq!(value("ailb_gateway_previous_responses_total{outcome=\"gone\"}"), 1.0);
    // 2 x (10 first turns + 100 follow-ups), the one fetched again and the one whose server went.
    assert_eq!(value("ailb_gateway_responses_remembered"), 222.0);
    eprintln!("gateway log:\n{}", gateway.log());
    drop(gateway);
    drop(daemon);
}

/// The python of the client venv with both clients, or why there is none.
fn client_python() -> Result<PathBuf, String> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/client-venv/bin/python3");
    if !python.is_file() {
        return Err(format!("no {} (`cargo xtask setup` creates it with the clients)", python.display()));
    }
    let probe = Command::new(&python).args(["-c", "import openai, anthropic"]).output();
    match probe {
        Ok(out) if out.status.success() => Ok(python),
        Ok(out) => Err(format!(
            "{} cannot import openai and anthropic: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("running {}: {e}", python.display())),
    }
}

#[test]
fn the_official_openai_and_anthropic_clients_work_unchanged() {
    let python = match client_python() {
        Ok(p) => p,
        Err(why) => {
            return ailb_tests::report_skipped("the_official_openai_and_anthropic_clients_work_unchanged", &why)
        }
    };
    let cg = CgroupGuard::new("gw-agents-clients");
    let (_sims, daemon, gateway) =
        front_door(&cg, CLIENTS_VIP, CLIENTS_GATEWAY, &CLIENTS_BACKENDS, "http1_fast_path = false\n");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agents_clients.py");
    // The client moves itself into the cgroup before its first socket (a shell writes its own
    // pid to cgroup.procs, then execs).
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo $$ > \"$0/cgroup.procs\" && exec \"$@\""])
        .arg(cg.path())
        .arg(&python)
        .arg(&script)
        .args([CLIENTS_GATEWAY, MODEL]);
    let out = run_cmd(&mut cmd, Duration::from_secs(300));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the clients' script failed ({}):\n{stderr}\n{stdout}\ngateway log:\n{}",
        out.status,
        gateway.log()
    );
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let by_case = |case: &str| -> Vec<&Value> { lines.iter().filter(|l| l["case"] == case).collect() };
    let names: BTreeSet<&str> = CLIENTS_BACKENDS.into_iter().collect();

    let cg_name = cg.path().file_name().and_then(|n| n.to_str()).expect("cgroup name");
    assert!(by_case("cgroup")[0]["path"].as_str().is_some_and(|p| p.ends_with(cg_name)), "{stdout}");
    let follows = by_case("follow");
    assert_eq!(follows.len(), 100, "{stdout}");
    for f in &follows {
        assert_eq!(f["backend"], f["stored_by"], "a follow-up off its producer: {f}");
        assert!(f["backend"].as_str().is_some_and(|b| names.contains(b)), "{f}");
    }
    assert_eq!(follows.iter().filter(|f| f["stream"] == true).count(), 50);
    let producers: BTreeSet<&str> = by_case("first").iter().filter_map(|f| f["backend"].as_str()).collect();
    assert!(producers.len() > 1, "the first turns all reached {producers:?}: pinning not exercised");
    let retrieved = by_case("retrieve");
    assert_eq!(retrieved[0]["backend"], retrieved[0]["stored_by"], "{stdout}");
    let unknown = by_case("unknown_previous");
    assert_eq!(
        (unknown[0]["status"].as_u64(), unknown[0]["code"].as_str(), unknown[0]["param"].as_str()),
        (Some(404), Some("previous_response_not_found"), Some("previous_response_id")),
        "{stdout}"
    );
    let claude = by_case("anthropic");
    assert_eq!(claude.len(), 2, "{stdout}");
    for c in &claude {
        assert!(
            c["sent"].is_string() && c["version"] == c["sent"],
            "the client's anthropic-version reached the server: {c}"
        );
        assert_eq!(c["text"], "tok tok tok ", "{c}");
        assert!(c["backend"].as_str().is_some_and(|b| names.contains(b)), "{c}");
    }
    let events: Vec<&str> = claude[1]["events"].as_array().expect("events").iter().filter_map(Value::as_str).collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    let unknown = by_case("anthropic_unknown");
    assert_eq!(
        (unknown[0]["status"].as_u64(), unknown[0]["type"].as_str()),
        (Some(404), Some("not_found_error")),
        "{stdout}"
    );
    eprintln!("clients: {stdout}");
    drop(gateway);
    drop(daemon);
}
