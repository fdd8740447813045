//! `ailb-testclient`: the client side of the integration tests. The harness runs it inside the
//! child cgroup the programs are attached to, so that its connects go through ailb.
//!
//! ```text
//! ailb-testclient connect --vip A:P --count N [--conversations C --prefix P] [--memory-mb M]
//!                         [--model NAME] [--hold] [--linger0] [--v6only]
//! ailb-testclient sockopt-hostile --vip A:P
//! ailb-testclient serve --listen A:P
//! ailb-testclient probe --vip A:P
//! ```
//! `connect` prints one JSON line per connection:
//! `{"i", "conversation", "backend", "reply", "ok", "errno", "error"}` where `backend` is the
//! peer address from getpeername() and `reply` the body the server sent (its own address).
//! A `[ipv6]:port` VIP is connected from an IPv6 socket (dual-stack unless `--v6only`), and
//! a v4-mapped peer (an IPv4 backend reached from it) is printed as the IPv4 address it maps.
//! With `--hold` every connection stays open; `HOLDING <n>` is printed once all were tried,
//! and they are closed when stdin gets a line or closes (then `CLOSED <n>`).
//! `sockopt-hostile` prints one JSON line per case: `{"case", "ret", "errno"}` (plus connect
//! results), see [`hostile`]. `serve` is a backend in a process of its own (for a test that
//! kills it): it listens on `A:P`, prints `LISTENING`, and serves the protocol of
//! `ailb_tests::remote` until killed. `probe` asks the kernel for picks without sending
//! anything: for each line of stdin, `{"model", "conversation", "memory_mb", "keys"}` (each
//! optional; `keys` the prefix keys as numbers), one connection tagged so, closed once
//! connected, and one line out, `{"backend", "errno", "error"}`; it ends when stdin does.

#![forbid(unsafe_code)]

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use ailb_common::abi::{
    AILB_CONVERSATION, AILB_IDLE, AILB_MODEL, AILB_PREFIX, AILB_PREFIX_ON_REQUEST, AILB_REQUIRED_MEMORY_MB, SOL_AILB,
};
use ailb_common::client::{self, raw, ClientError, Field, Socket, Tagging};
use serde_json::json;

/// Bounds connect() and every read and write.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    vip: SocketAddr,
    count: usize,
    conversations: Option<usize>,
    prefix: String,
    memory_mb: Option<u32>,
    model: Option<String>,
    hold: bool,
    linger0: bool,
    v6only: bool,
    /// Connection i sends the prefix keys of a prompt of tenant `i % tenants`: the tenant's
    /// `prompt_bytes`-byte system prompt, then a question of its own.
    tenants: Option<usize>,
    prompt_bytes: usize,
}

fn usage(msg: &str) -> ! {
    eprintln!("ailb-testclient: {msg}");
    eprintln!(
        "usage: ailb-testclient connect --vip A:P --count N [--conversations C --prefix P] \
         [--memory-mb M] [--model NAME] [--hold] [--linger0] [--v6only] [--tenants T --prompt-bytes B]\n       \
         ailb-testclient sockopt-hostile --vip A:P\n       \
         ailb-testclient serve --listen A:P\n       \
         ailb-testclient probe --vip A:P   (stdin: one JSON line per connection)"
    );
    std::process::exit(2)
}

fn parse_args(rest: &[String]) -> Args {
    let mut a = Args {
        vip: SocketAddr::V4(SocketAddrV4::new([0, 0, 0, 0].into(), 0)),
        count: 1,
        conversations: None,
        prefix: "conv".into(),
        memory_mb: None,
        model: None,
        hold: false,
        linger0: false,
        v6only: false,
        tenants: None,
        prompt_bytes: 4096,
    };
    let mut have_vip = false;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--vip" => {
                let v = val();
                a.vip = v.parse().unwrap_or_else(|e| usage(&format!("--vip {v}: {e}")));
                have_vip = true;
            }
            "--count" => a.count = val().parse().unwrap_or_else(|e| usage(&format!("--count: {e}"))),
            "--conversations" => {
                a.conversations = Some(val().parse().unwrap_or_else(|e| usage(&format!("--conversations: {e}"))))
            }
            "--prefix" => a.prefix = val(),
            "--memory-mb" => a.memory_mb = Some(val().parse().unwrap_or_else(|e| usage(&format!("--memory-mb: {e}")))),
            "--model" => a.model = Some(val()),
            "--hold" => a.hold = true,
            "--linger0" => a.linger0 = true,
            "--v6only" => a.v6only = true,
            "--tenants" => a.tenants = Some(val().parse().unwrap_or_else(|e| usage(&format!("--tenants: {e}")))),
            "--prompt-bytes" => {
                a.prompt_bytes = val().parse().unwrap_or_else(|e| usage(&format!("--prompt-bytes: {e}")))
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if !have_vip {
        usage("--vip is required");
    }
    if a.conversations == Some(0) {
        usage("--conversations must be at least 1");
    }
    a
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some("connect") => connect_mode(&parse_args(&argv[2..])),
        Some("sockopt-hostile") => match parse_args(&argv[2..]).vip {
            SocketAddr::V4(vip) => hostile(vip),
            SocketAddr::V6(_) => usage("sockopt-hostile takes an IPv4 VIP"),
        },
        Some("probe") => match parse_args(&argv[2..]).vip {
            SocketAddr::V4(vip) => probe_mode(vip),
            SocketAddr::V6(_) => usage("probe takes an IPv4 VIP"),
        },
        Some("serve") => match (argv.get(2).map(String::as_str), argv.get(3).map(|a| a.parse::<SocketAddr>())) {
            (Some("--listen"), Some(Ok(addr))) => serve_mode(addr),
            _ => usage("serve takes --listen A:P"),
        },
        _ => usage("missing mode"),
    }
}

/// One tagged connection per line of stdin, closed once connected (nothing is sent): the
/// backend the kernel picked for those tags.
fn probe_mode(vip: SocketAddrV4) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap_or_else(|e| panic!("stdin: {e}"));
        let req: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| usage(&format!("probe {line:?}: {e}")));
        let sock = new_socket();
        let mut hint_err = None;
        if let Some(m) = req["model"].as_str() {
            hint_err = hint_error(Field::Model, client::tag_model(&sock, m.as_bytes())).or(hint_err);
        }
        if let Some(c) = req["conversation"].as_str() {
            hint_err = hint_error(Field::Conversation, client::tag_conversation(&sock, c.as_bytes())).or(hint_err);
        }
        if let Some(m) = req["memory_mb"].as_u64() {
            let m = u32::try_from(m).unwrap_or_else(|_| usage(&format!("probe memory_mb {m}: over u32")));
            hint_err = hint_error(Field::RequiredMemoryMb, client::tag_required_memory_mb(&sock, m)).or(hint_err);
        }
        if let Some(keys) = req["keys"].as_array().filter(|k| !k.is_empty()) {
            let keys: Vec<u64> = keys
                .iter()
                .map(|k| k.as_u64().unwrap_or_else(|| usage(&format!("probe key {k}: not a u64"))))
                .collect();
            hint_err = hint_error(Field::Prefix, client::tag_prefix(&sock, &keys)).or(hint_err);
        }
        let line = match sock.connect(vip, Some(IO_TIMEOUT)) {
            Ok((_stream, peer)) => json!({"backend": peer.to_string(), "errno": null, "error": hint_err}),
            Err(e) => json!({"backend": null, "errno": e.raw_os_error(), "error": hint_err}),
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Listens on `addr` and serves every connection on a thread of its own, until killed.
fn serve_mode(addr: SocketAddr) -> ! {
    let listener = std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    println!("LISTENING");
    std::io::stdout().flush().unwrap_or_else(|e| panic!("stdout: {e}"));
    let never = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        let (s, _) = listener.accept().unwrap_or_else(|e| panic!("accept on {addr}: {e}"));
        let never = never.clone();
        std::thread::spawn(move || ailb_tests::remote::serve(s, addr, never));
    }
}

fn new_socket() -> Socket {
    Socket::new().unwrap_or_else(|e| panic!("{e}: errno {:?}", e.raw_os_error()))
}

/// A socket of the VIP's family: the client library's IPv4 one, or an IPv6 one.
enum AnySocket {
    V4(Socket),
    V6(socket2::Socket),
}

impl AnySocket {
    fn for_vip(vip: &SocketAddr, v6only: bool) -> Self {
        match vip {
            SocketAddr::V4(_) => AnySocket::V4(new_socket()),
            SocketAddr::V6(_) => {
                let s =
                    socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
                        .unwrap_or_else(|e| panic!("IPv6 socket: {e}"));
                s.set_only_v6(v6only).unwrap_or_else(|e| panic!("IPV6_V6ONLY: {e}"));
                AnySocket::V6(s)
            }
        }
    }

    /// Connects and returns the stream and its peer (a v4-mapped peer as its IPv4 address);
    /// `Err`: the connect's errno.
    fn connect(self, vip: SocketAddr) -> Result<(TcpStream, SocketAddr), Option<i32>> {
        match (self, vip) {
            (AnySocket::V4(s), SocketAddr::V4(v4)) => {
                s.connect(v4, Some(IO_TIMEOUT)).map(|(st, p)| (st, SocketAddr::V4(p))).map_err(|e| e.raw_os_error())
            }
            (AnySocket::V6(s), vip) => {
                s.connect_timeout(&vip.into(), IO_TIMEOUT).map_err(|e| e.raw_os_error())?;
                let stream = TcpStream::from(s);
                let peer = stream.peer_addr().map_err(|e| e.raw_os_error())?;
                let peer = match peer {
                    SocketAddr::V6(p) => match p.ip().to_ipv4_mapped() {
                        Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, p.port())),
                        None => peer,
                    },
                    v4 => v4,
                };
                Ok((stream, peer))
            }
            (AnySocket::V4(_), SocketAddr::V6(_)) => unreachable!("for_vip makes a socket of the VIP's family"),
        }
    }
}

impl AsFd for AnySocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            AnySocket::V4(s) => s.as_fd(),
            AnySocket::V6(s) => s.as_fd(),
        }
    }
}

/// The `error` text of a hint that did not take: `ENOPROTOOPT` (no balancer) counts as one.
fn hint_error(field: Field, res: Result<Tagging, ClientError>) -> Option<String> {
    let name = field.option_name();
    match res {
        Ok(Tagging::Accepted | Tagging::NoTags) => None,
        Ok(Tagging::NoBalancer) => Some(format!("setsockopt {name}: errno {}", libc::ENOPROTOOPT)),
        Err(e) => Some(format!("setsockopt {name}: errno {}: {e}", e.raw_os_error().unwrap_or(0))),
    }
}

/// Sends one request and reads the reply body (the server's address).
fn exchange(stream: &mut TcpStream, vip: SocketAddr, hold: bool) -> Result<String, String> {
    stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(|e| e.to_string())?;
    let req = format!("GET / HTTP/1.1\r\nHost: {vip}\r\n{}\r\n", if hold { "X-Ailb-Hold: 1\r\n" } else { "" });
    stream.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut resp = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        if let Some(end) = resp.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&resp[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("reply without Content-Length: {head:?}"))?;
            if resp.len() >= end + 4 + len {
                return Ok(String::from_utf8_lossy(&resp[end + 4..end + 4 + len]).into_owned());
            }
        }
        if resp.len() > 64 * 1024 {
            return Err("reply too long".into());
        }
        match stream.read(&mut buf) {
            Ok(0) => return Err(format!("eof after {} bytes", resp.len())),
            Ok(n) => resp.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

fn set_linger0(stream: &TcpStream) {
    // Best effort, as the close that follows is: an error leaves the ordinary close.
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// The keys a prompt of tenant `tenant` sends for its `i`-th question: `prompt_bytes` of
/// the tenant's system prompt, then the question (two text chunks of its own).
fn tenant_prompt_keys(tenant: usize, i: usize, prompt_bytes: usize) -> Vec<u64> {
    let mut prompt: Vec<u8> =
        format!("You are the assistant of tenant {tenant}. ").bytes().cycle().take(prompt_bytes).collect();
    prompt.extend(format!("question {i}: ").bytes().cycle().take(2 * ailb_common::prefix::TEXT_CHUNK_BYTES));
    let keys = ailb_common::prefix::text_keys(&prompt);
    ailb_common::prefix::sent(&keys).map(|(_, k)| k).collect()
}

fn connect_mode(a: &Args) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut held: Vec<TcpStream> = Vec::new();
    for i in 0..a.count {
        let conversation = a.conversations.map(|c| format!("{}-{}", a.prefix, i % c));
        let sock = AnySocket::for_vip(&a.vip, a.v6only);
        // One call per option, so that every option is tried; the last failure is reported.
        let mut hint_err = None;
        if let Some(c) = &conversation {
            hint_err = hint_error(Field::Conversation, client::tag_conversation(&sock, c.as_bytes())).or(hint_err);
        }
        if let Some(m) = a.memory_mb {
            hint_err = hint_error(Field::RequiredMemoryMb, client::tag_required_memory_mb(&sock, m)).or(hint_err);
        }
        if let Some(m) = &a.model {
            hint_err = hint_error(Field::Model, client::tag_model(&sock, m.as_bytes())).or(hint_err);
        }
        if let Some(t) = a.tenants {
            let keys = tenant_prompt_keys(i % t, i, a.prompt_bytes);
            hint_err = hint_error(Field::Prefix, client::tag_prefix(&sock, &keys)).or(hint_err);
        }
        let line = match sock.connect(a.vip) {
            Err(errno) => json!({"i": i, "conversation": conversation, "backend": null, "reply": null,
                             "ok": false, "errno": errno, "error": hint_err}),
            Ok((mut stream, peer)) => {
                let reply = exchange(&mut stream, a.vip, a.hold);
                let ok = reply.is_ok() && hint_err.is_none();
                let (reply, err) = match reply {
                    Ok(r) => (Some(r), hint_err),
                    Err(e) => (None, Some(e)),
                };
                if a.linger0 {
                    set_linger0(&stream);
                }
                if a.hold {
                    held.push(stream);
                }
                json!({"i": i, "conversation": conversation, "backend": peer.to_string(), "reply": reply,
                       "ok": ok, "errno": null, "error": err})
            }
        };
        let _ = writeln!(out, "{line}");
    }
    if a.hold {
        let _ = writeln!(out, "HOLDING {}", held.len());
        let _ = out.flush();
        let mut l = String::new();
        let _ = std::io::stdin().lock().read_line(&mut l);
        let n = held.len();
        drop(held);
        let _ = writeln!(out, "CLOSED {n}");
    }
    let _ = out.flush();
}

/// Hostile `SOL_AILB` options on one socket, then an ordinary option, then a connect on that
/// same socket and on a fresh one. Every case prints `{"case", "ret", "errno"}`.
fn hostile(vip: SocketAddrV4) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let sock = new_socket();
    let big = vec![b'a'; 8192];
    let four = 7u32.to_ne_bytes();
    let eight = 8000u64.to_ne_bytes();
    let eight_zero = 0u64.to_ne_bytes();
    let one = 1i32.to_ne_bytes();
    let two = 2u32.to_ne_bytes();
    // `None`: a null buffer of 16 bytes.
    let cases: Vec<(&str, i32, i32, Option<&[u8]>)> = vec![
        ("conversation_len0", SOL_AILB, AILB_CONVERSATION, Some(&big[..0])),
        ("conversation_len129", SOL_AILB, AILB_CONVERSATION, Some(&big[..129])),
        ("conversation_len4096", SOL_AILB, AILB_CONVERSATION, Some(&big[..4096])),
        ("conversation_len8192", SOL_AILB, AILB_CONVERSATION, Some(&big[..8192])),
        ("conversation_null_len16", SOL_AILB, AILB_CONVERSATION, None),
        ("memory_len3", SOL_AILB, AILB_REQUIRED_MEMORY_MB, Some(&four[..3])),
        ("memory_len8", SOL_AILB, AILB_REQUIRED_MEMORY_MB, Some(&eight[..])),
        ("model_len0", SOL_AILB, AILB_MODEL, Some(&big[..0])),
        ("model_len65", SOL_AILB, AILB_MODEL, Some(&big[..65])),
        ("unknown_0", SOL_AILB, 0, Some(&four[..])),
        ("idle_value2", SOL_AILB, AILB_IDLE, Some(&two[..])),
        ("idle_len8", SOL_AILB, AILB_IDLE, Some(&eight[..])),
        ("prefix_len4", SOL_AILB, AILB_PREFIX, Some(&four[..])),
        ("prefix_key0", SOL_AILB, AILB_PREFIX, Some(&eight_zero[..])),
        ("prefix_len136", SOL_AILB, AILB_PREFIX, Some(&big[..136])),
        ("prefix_on_request_value2", SOL_AILB, AILB_PREFIX_ON_REQUEST, Some(&two[..])),
        ("prefix_on_request_len8", SOL_AILB, AILB_PREFIX_ON_REQUEST, Some(&eight[..])),
        ("unknown_7", SOL_AILB, 7, Some(&four[..])),
        ("unknown_999", SOL_AILB, 999, Some(&four[..])),
        ("unknown_neg1", SOL_AILB, -1, Some(&four[..])),
        // A valid conversation at the length limit: must be accepted and used by the connect.
        ("conversation_len128", SOL_AILB, AILB_CONVERSATION, Some(&big[..128])),
        ("so_reuseaddr", libc::SOL_SOCKET, libc::SO_REUSEADDR, Some(&one[..])),
        ("tcp_nodelay", libc::IPPROTO_TCP, libc::TCP_NODELAY, Some(&one[..])),
    ];
    for (case, level, name, value) in cases {
        let res = match value {
            Some(v) => raw::setsockopt(&sock, level, name, v),
            None => raw::setsockopt_null(&sock, level, name, 16),
        };
        let (ret, e) = match res {
            Ok(()) => (0, 0),
            Err(e) => (-1, e.raw_os_error().unwrap_or(0)),
        };
        let _ = writeln!(out, "{}", json!({"case": case, "ret": ret, "errno": e}));
    }
    let _ = out.flush();
    for (case, sock) in [("connect_after_hostile", sock), ("connect_fresh_socket", new_socket())] {
        let line = match sock.connect(vip, Some(IO_TIMEOUT)) {
            Err(e) => {
                json!({"case": case, "ok": false, "errno": e.raw_os_error(), "backend": null, "reply": null})
            }
            Ok((mut s, peer)) => {
                let r = exchange(&mut s, SocketAddr::V4(vip), false);
                json!({"case": case, "ok": r.is_ok(), "errno": 0, "backend": peer.to_string(),
                       "reply": r.as_ref().ok(), "error": r.err()})
            }
        };
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}
