//! The Nacos login answer. Besides no panic: an accepted token is one an HTTP header can carry,
//! a TTL is positive, and the answer written back parses the same.
#![no_main]

use ailb_userspace::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok((token, ttl)) = fuzzing::nacos_login(body) else { return };
    assert!(!token.is_empty() && token.len() <= 8192 && token.bytes().all(|b| b.is_ascii_graphic()), "{token:?}");
    assert_ne!(ttl, Some(0));
    let again = serde_json::json!({ "accessToken": token, "tokenTtl": ttl }).to_string();
    assert_eq!(fuzzing::nacos_login(again.as_bytes()).expect("a written-back login parses"), (token, ttl));
});
