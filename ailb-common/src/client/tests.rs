//! Without root and without ailb: the kernel answers `ENOPROTOOPT` for level `SOL_AILB`, and
//! connects go where they are addressed.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::time::Duration;

use super::*;
use crate::abi::SOL_AILB;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

fn listener() -> (TcpListener, SocketAddrV4) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    let SocketAddr::V4(addr) = l.local_addr().expect("listener address") else { unreachable!("bound to IPv4") };
    (l, addr)
}

/// An address on 127.0.0.1 where nothing listens (a port just released).
fn closed_port() -> SocketAddrV4 {
    let (l, addr) = listener();
    drop(l);
    addr
}

const NO_AILB: &str = "ailb is loaded for this test's cgroup: these tests expect the kernel without it";

#[test]
fn tagging_without_ailb_reports_no_balancer() {
    let s = Socket::new().expect("socket");
    assert_eq!(tag_conversation(&s, b"conversation-42").expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    assert_eq!(tag_required_memory_mb(&s, 2048).expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    assert_eq!(tag_model(&s, b"llama-3-8b").expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    let tags = Tags::new().conversation("c").required_memory_mb(1).model("m");
    assert_eq!(s.tag(&tags).expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    assert_eq!(tag(&s, &Tags::new().required_memory_mb(0)).expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    assert!(!Tagging::NoBalancer.is_accepted());
}

#[test]
fn empty_tags_ask_nothing() {
    let s = Socket::new().expect("socket");
    assert!(Tags::new().is_empty());
    assert_eq!(s.tag(&Tags::new()).expect("tag"), Tagging::NoTags);
    assert!(!Tags::new().model("m").is_empty());
}

#[test]
fn bad_lengths_are_refused_with_the_field_named() {
    let long = [b'a'; 129];
    let cases: [(Tags<'_>, Field, usize, usize); 4] = [
        (Tags::new().conversation(""), Field::Conversation, 0, MAX_CONVERSATION_LEN),
        (Tags::new().conversation(&long[..]), Field::Conversation, 129, MAX_CONVERSATION_LEN),
        (Tags::new().model(""), Field::Model, 0, MAX_MODEL_NAME_LEN),
        (Tags::new().conversation("ok").model(&long[..65]), Field::Model, 65, MAX_MODEL_NAME_LEN),
    ];
    let s = Socket::new().expect("socket");
    for (tags, want_field, want_len, want_max) in cases {
        let err = tags.validate().expect_err("a bad length must be refused");
        let msg = err.to_string();
        match err {
            ClientError::Length { field, len, max, .. } => {
                assert_eq!((field, len, max), (want_field, want_len, want_max), "{msg}");
            }
            other => panic!("expected a length error for {want_field}, got {other:?}"),
        }
        assert!(msg.contains(&format!("`{want_field}`")), "the message names the field: {msg}");
        assert!(msg.contains(&format!("({want_len} bytes)")), "the message gives the length: {msg}");
        assert!(msg.contains(&format!("1..={want_max}")), "the message gives the range: {msg}");
        assert_eq!(err.raw_os_error(), None);
        // The same checks run in tag() and connect(), before any system call.
        assert!(matches!(s.tag(&tags), Err(ClientError::Length { .. })));
        assert!(matches!(connect(closed_port(), &tags, TIMEOUT), Err(ClientError::Length { .. })));
    }
    assert!(matches!(tag_conversation(&s, &long), Err(ClientError::Length { field: Field::Conversation, .. })));
    assert!(matches!(tag_model(&s, b""), Err(ClientError::Length { field: Field::Model, .. })));
    // The limits themselves are accepted.
    Tags::new().conversation(&long[..128]).model(&long[..64]).validate().expect("lengths at the limits");
}

#[test]
fn a_rejected_value_is_shown_escaped_and_cut() {
    let binary = [0xffu8; 200];
    let msg = Tags::new().conversation(&binary[..]).validate().expect_err("200 bytes").to_string();
    assert!(msg.contains(r#""\xff\xff"#), "binary bytes are escaped: {msg}");
    assert!(msg.contains(r#"\xff..." (200 bytes)"#), "a long value is cut: {msg}");
    assert_eq!(msg.matches(r"\xff").count(), 32, "{msg}");
    let msg = Tags::new().model("").validate().expect_err("empty").to_string();
    assert_eq!(msg, "tag `model`: invalid value \"\" (0 bytes): must be 1..=64 bytes");
}

#[test]
fn connect_reports_the_peer_and_the_tagging() {
    let (l, addr) = listener();
    for (tags, timeout, want) in [
        (Tags::new().conversation("conversation-42").required_memory_mb(512), TIMEOUT, Tagging::NoBalancer),
        (Tags::new(), None, Tagging::NoTags),
    ] {
        let (mut stream, outcome) = connect(addr, &tags, timeout).expect("connect to the listener");
        assert_eq!(outcome, Outcome { tagging: want, backend: addr });
        let (mut accepted, from) = l.accept().expect("accept");
        assert_eq!(from, stream.local_addr().expect("local address"), "the listener got this connection");
        stream.write_all(b"ping").expect("write");
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"ping");
    }
}

#[test]
fn a_socket_tagged_by_hand_connects() {
    let (l, addr) = listener();
    let s = Socket::new().expect("socket");
    assert_eq!(tag_conversation(&s, b"c-1").expect("tag"), Tagging::NoBalancer, "{NO_AILB}");
    raw::setsockopt(&s, SOL_AILB, 999, &7u32.to_ne_bytes()).expect_err("unknown level");
    let (stream, backend) = s.connect(addr, TIMEOUT).expect("connect");
    assert_eq!(backend, addr);
    let (_accepted, from) = l.accept().expect("accept");
    assert_eq!(from, stream.local_addr().expect("local address"));
}

#[test]
fn a_refused_connect_has_its_errno() {
    let addr = closed_port();
    for timeout in [TIMEOUT, None] {
        let err = connect(addr, &Tags::new().conversation("c"), timeout).expect_err("nothing listens there");
        assert!(matches!(err, ClientError::Connect { vip, .. } if vip == addr), "{err:?}");
        assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err:?}");
        assert_eq!(err.to_string(), format!("connect to {addr}"));
    }
}

#[test]
fn a_zero_timeout_is_refused() {
    let (_l, addr) = listener();
    let err = connect(addr, &Tags::new(), Some(Duration::ZERO)).expect_err("zero timeout");
    assert!(matches!(err, ClientError::ZeroTimeout), "{err:?}");
    let s = Socket::new().expect("socket");
    assert!(matches!(s.connect(addr, Some(Duration::ZERO)), Err(ClientError::ZeroTimeout)));
}

#[test]
fn raw_options_reach_the_kernel_unchecked() {
    let s = Socket::new().expect("socket");
    let big = vec![b'a'; 8192];
    for (name, len) in [(crate::abi::AILB_CONVERSATION, 0), (crate::abi::AILB_CONVERSATION, 8192), (-1, 4)] {
        let e = raw::setsockopt(&s, SOL_AILB, name, &big[..len]).expect_err("no ailb: unknown level");
        assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{NO_AILB}: optname {name}, {len} bytes: {e}");
    }
    raw::setsockopt(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32.to_ne_bytes()).expect("SO_REUSEADDR");
    let e = raw::setsockopt_null(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 4).expect_err("null buffer");
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
}

#[test]
fn fields_map_to_the_abi() {
    assert_eq!(Field::Conversation.optname(), crate::abi::AILB_CONVERSATION);
    assert_eq!(Field::RequiredMemoryMb.optname(), crate::abi::AILB_REQUIRED_MEMORY_MB);
    assert_eq!(Field::Model.optname(), crate::abi::AILB_MODEL);
    assert_eq!(Field::RequiredMemoryMb.to_string(), "required_memory_mb");
    assert_eq!(Field::Model.option_name(), "AILB_MODEL");
}

#[test]
fn bad_prefix_keys_are_refused_before_any_call() {
    let s = Socket::new().expect("socket");
    let seventeen = [7u64; 17];
    for (keys, count, zeros) in [(&[][..], 0, 0), (&seventeen[..], 17, 0), (&[1, 0, 2][..], 3, 1)] {
        let err = Tags::new().prefix(keys).validate().expect_err("bad keys");
        let msg = err.to_string();
        assert!(
            matches!(err, ClientError::PrefixKeys { count: c, zeros: z, max: 16 } if c == count && z == zeros),
            "{msg}"
        );
        assert!(msg.starts_with("tag `prefix`: invalid value"), "{msg}");
        assert!(matches!(tag_prefix(&s, keys), Err(ClientError::PrefixKeys { .. })));
    }
    Tags::new().prefix(&[1; 16]).validate().expect("16 keys are the limit");
    assert!(!Tags::new().prefix(&[1]).is_empty());
    // Without ailb loaded the option is the kernel's unknown level.
    assert_eq!(tag_prefix(&s, &[42, 43]).expect("no balancer is not an error"), Tagging::NoBalancer);
}

/// `ENOKEY` from `connect()` is the kernel asking for the keys a socket withheld; the same errno
/// from another call, or another errno from connect, is not.
#[test]
fn only_enokey_from_connect_asks_for_the_keys() {
    let vip: SocketAddrV4 = "127.77.0.1:8000".parse().expect("an address");
    let connect = |errno| ClientError::Connect { vip, source: io::Error::from_raw_os_error(errno) };
    assert!(connect(libc::ENOKEY).keys_wanted());
    assert!(!connect(libc::ECONNREFUSED).keys_wanted());
    let set =
        ClientError::SetOption { field: Field::PrefixOnRequest, source: io::Error::from_raw_os_error(libc::ENOKEY) };
    assert!(!set.keys_wanted());
    assert!(!Tags::new().prefix_on_request().is_empty(), "withholding is a tag");
    assert_eq!(Field::PrefixOnRequest.optname(), crate::abi::AILB_PREFIX_ON_REQUEST);
}
