//! The front door's request handling past hyper: the body's JSON and the headers become the
//! routing inputs (`ailb_userspace::gateway::routing_inputs`, the code `ailb gateway` runs on
//! every request). Input: header lines ("Name: value"), a blank line, then the body; the first
//! byte picks the path. Besides no panic: an answer is either inputs the kernel accepts (a
//! catalog model, a conversation key of 1..=128 bytes hashing as the kernel does, a memory need
//! with its source, at most 16 nonzero prefix keys) or a client error (4xx) with a message.
#![no_main]

use std::sync::OnceLock;

use ailb_common::abi::MAX_CONVERSATION_LEN;
use ailb_userspace::config::{gateway::ValidGateway, Config, ValidConfig};
use ailb_userspace::gateway::routing_inputs;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
[[services]]
model = "m"
vip = "127.77.0.1:8000"

[[models]]
name = "pinned"
vips = ["127.77.0.2:8000"]
required_memory_mb = 8192

[gateway]
session_header = "x-user-session"
completion_prefix_bytes = 16
prefix_keys = true
[gateway.kv_bytes_per_token]
m = 131072
"#;

fn catalog() -> &'static (ValidConfig, ValidGateway) {
    static C: OnceLock<(ValidConfig, ValidGateway)> = OnceLock::new();
    C.get_or_init(|| {
        let c = Config::parse(CONFIG, "fuzz").expect("the fuzz catalog parses");
        let v = c.validate().expect("the fuzz catalog validates");
        let g = c.gateway.validate(v.models.keys().map(String::as_str)).expect("[gateway] validates");
        (v, g)
    })
}

const PATHS: [&str; 6] =
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/other", "/v1/responses", "/v1/messages"];

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else { return };
    let path = PATHS[usize::from(first) % PATHS.len()];
    let split = rest.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match split {
        Some(i) => (&rest[..i], &rest[i + 2..]),
        None => (&[][..], rest),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(line[colon + 1..].trim_ascii()))
        else {
            continue;
        };
        headers.append(name, value);
    }
    let (config, gateway) = catalog();
    match routing_inputs(config, gateway, path, &headers, body) {
        Ok(ailb_userspace::gateway::Routing { inputs, vip, prefix_keys }) => {
            assert!(config.models.contains_key(&inputs.model), "a catalog model: {inputs:?}");
            // What the socket option takes: at most 16 keys, none of them 0.
            assert!(prefix_keys.len() <= ailb_common::prefix::PREFIX_KEYS_MAX, "{prefix_keys:?}");
            assert!(!prefix_keys.contains(&0), "{prefix_keys:?}");
            // The front door connects to the model's first IPv4 VIP.
            let first_v4 = config.models[&inputs.model].spec.vips.iter().find(|v| v.is_ipv4());
            assert_eq!(first_v4, Some(&std::net::SocketAddr::V4(vip)));
            assert_eq!(inputs.memory_mb.is_some(), inputs.memory_source.is_some(), "{inputs:?}");
            if let Some(c) = &inputs.conversation {
                assert!((1..=MAX_CONVERSATION_LEN).contains(&c.key.len()), "a key the kernel takes: {c:?}");
                assert_eq!(c.hash(), ailb_common::hash::conversation_hash(c.key.as_bytes()));
            }
        }
        Err(e) => {
            assert!(e.status.is_client_error(), "{e:?}");
            assert!(!e.message.is_empty() || e.code == Some("model_not_found"), "{e:?}");
        }
    }
});
