//! `ailb-testclient`: the client side of the integration tests. The harness runs it inside the
//! child cgroup the programs are attached to, so that its connects go through ailb.
//!
//! ```text
//! ailb-testclient connect --vip A:P --count N [--conversations C --prefix P] [--memory-mb M]
//!                         [--model NAME] [--hold] [--linger0]
//! ailb-testclient sockopt-hostile --vip A:P
//! ```
//! `connect` prints one JSON line per connection:
//! `{"i", "conversation", "backend", "reply", "ok", "errno", "error"}` where `backend` is the
//! peer address from getpeername() and `reply` the body the server sent (its own address).
//! With `--hold` every connection stays open; `HOLDING <n>` is printed once all were tried,
//! and they are closed when stdin gets a line or closes (then `CLOSED <n>`).
//! `sockopt-hostile` prints one JSON line per case: `{"case", "ret", "errno"}` (plus connect
//! results), see [`hostile`].

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

use serde_json::json;

const SOL_AILB: i32 = 0x41494c;
const AILB_CONVERSATION: i32 = 1;
const AILB_REQUIRED_MEMORY_MB: i32 = 2;
const AILB_MODEL: i32 = 3;
/// Bounds connect() (SO_SNDTIMEO applies to it) and every read/write.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

struct Args {
    vip: SocketAddrV4,
    count: usize,
    conversations: Option<usize>,
    prefix: String,
    memory_mb: Option<u32>,
    model: Option<String>,
    hold: bool,
    linger0: bool,
}

fn usage(msg: &str) -> ! {
    eprintln!("ailb-testclient: {msg}");
    eprintln!(
        "usage: ailb-testclient connect --vip A:P --count N [--conversations C --prefix P] \
         [--memory-mb M] [--model NAME] [--hold] [--linger0]\n       \
         ailb-testclient sockopt-hostile --vip A:P"
    );
    std::process::exit(2)
}

fn parse_args(rest: &[String]) -> Args {
    let mut a = Args {
        vip: SocketAddrV4::new([0, 0, 0, 0].into(), 0),
        count: 1,
        conversations: None,
        prefix: "conv".into(),
        memory_mb: None,
        model: None,
        hold: false,
        linger0: false,
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
        Some("sockopt-hostile") => hostile(parse_args(&argv[2..]).vip),
        _ => usage("missing mode"),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn new_socket() -> OwnedFd {
    // SAFETY: plain socket(2) call; the result is checked before it is wrapped.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        panic!("socket(AF_INET, SOCK_STREAM): errno {}", errno());
    }
    // SAFETY: fd is a freshly created socket that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval { tv_sec: IO_TIMEOUT.as_secs() as libc::time_t, tv_usec: 0 };
    let tv_bytes = as_bytes(&tv);
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, tv_bytes.as_ptr(), tv_bytes.len());
    fd
}

fn as_bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: reads size_of::<T>() bytes of a live, initialized Copy value (timeval, u32,
    // linger: integer fields only).
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }.to_vec()
}

/// setsockopt(2) with a raw pointer and length (which may lie, for the hostile cases).
/// Returns `(ret, errno)`; errno is 0 on success.
fn setsockopt(fd: &OwnedFd, level: i32, name: i32, ptr: *const u8, len: usize) -> (i32, i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: `ptr` is either null (the kernel then fails with EFAULT) or points to at least
    // `len` readable bytes owned by the caller for the duration of the call.
    let ret = unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, ptr.cast(), len as libc::socklen_t) };
    (ret, if ret == 0 { 0 } else { errno() })
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
        sin_zero: [0; 8],
    }
}

/// connect(2); on success the peer address from getpeername(2).
fn connect(fd: &OwnedFd, vip: SocketAddrV4) -> Result<SocketAddrV4, i32> {
    use std::os::fd::AsRawFd;
    let sa = sockaddr(vip);
    // SAFETY: `sa` is a valid sockaddr_in and the length matches it.
    let ret = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(errno());
    }
    let mut peer: libc::sockaddr_in = sockaddr(SocketAddrV4::new([0, 0, 0, 0].into(), 0));
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `peer` and `len` are valid for writes of a sockaddr_in.
    let ret = unsafe { libc::getpeername(fd.as_raw_fd(), (&mut peer as *mut libc::sockaddr_in).cast(), &mut len) };
    if ret != 0 {
        return Err(errno());
    }
    Ok(SocketAddrV4::new(peer.sin_addr.s_addr.to_ne_bytes().into(), u16::from_be(peer.sin_port)))
}

/// Sends one request and reads the reply body (the server's address).
fn exchange(stream: &mut TcpStream, vip: SocketAddrV4, hold: bool) -> Result<String, String> {
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
    use std::os::fd::AsFd;
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    let b = as_bytes(&l);
    let fd = stream.as_fd().try_clone_to_owned().expect("dup for SO_LINGER");
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_LINGER, b.as_ptr(), b.len());
}

fn connect_mode(a: &Args) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut held: Vec<TcpStream> = Vec::new();
    for i in 0..a.count {
        let conversation = a.conversations.map(|c| format!("{}-{}", a.prefix, i % c));
        let fd = new_socket();
        let mut hint_err = None;
        if let Some(c) = &conversation {
            let (r, e) = setsockopt(&fd, SOL_AILB, AILB_CONVERSATION, c.as_ptr(), c.len());
            if r != 0 {
                hint_err = Some(format!("setsockopt AILB_CONVERSATION: errno {e}"));
            }
        }
        if let Some(m) = a.memory_mb {
            let b = m.to_ne_bytes();
            let (r, e) = setsockopt(&fd, SOL_AILB, AILB_REQUIRED_MEMORY_MB, b.as_ptr(), b.len());
            if r != 0 {
                hint_err = Some(format!("setsockopt AILB_REQUIRED_MEMORY_MB: errno {e}"));
            }
        }
        if let Some(m) = &a.model {
            let (r, e) = setsockopt(&fd, SOL_AILB, AILB_MODEL, m.as_ptr(), m.len());
            if r != 0 {
                hint_err = Some(format!("setsockopt AILB_MODEL: errno {e}"));
            }
        }
        let line = match connect(&fd, a.vip) {
            Err(e) => json!({"i": i, "conversation": conversation, "backend": null, "reply": null,
                             "ok": false, "errno": e, "error": hint_err}),
            Ok(peer) => {
                let mut stream = TcpStream::from(fd);
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
    let fd = new_socket();
    let big = vec![b'a'; 8192];
    let four = 7u32.to_ne_bytes();
    let eight = 8000u64.to_ne_bytes();
    let one = 1i32.to_ne_bytes();
    let cases: Vec<(&str, i32, i32, *const u8, usize)> = vec![
        ("conversation_len0", SOL_AILB, AILB_CONVERSATION, big.as_ptr(), 0),
        ("conversation_len129", SOL_AILB, AILB_CONVERSATION, big.as_ptr(), 129),
        ("conversation_len4096", SOL_AILB, AILB_CONVERSATION, big.as_ptr(), 4096),
        ("conversation_len8192", SOL_AILB, AILB_CONVERSATION, big.as_ptr(), 8192),
        ("conversation_null_len16", SOL_AILB, AILB_CONVERSATION, std::ptr::null(), 16),
        ("memory_len3", SOL_AILB, AILB_REQUIRED_MEMORY_MB, four.as_ptr(), 3),
        ("memory_len8", SOL_AILB, AILB_REQUIRED_MEMORY_MB, eight.as_ptr(), 8),
        ("model_len0", SOL_AILB, AILB_MODEL, big.as_ptr(), 0),
        ("model_len65", SOL_AILB, AILB_MODEL, big.as_ptr(), 65),
        ("unknown_0", SOL_AILB, 0, four.as_ptr(), 4),
        ("unknown_4", SOL_AILB, 4, four.as_ptr(), 4),
        ("unknown_999", SOL_AILB, 999, four.as_ptr(), 4),
        ("unknown_neg1", SOL_AILB, -1, four.as_ptr(), 4),
        // A valid conversation at the length limit: must be accepted and used by the connect.
        ("conversation_len128", SOL_AILB, AILB_CONVERSATION, big.as_ptr(), 128),
        ("so_reuseaddr", libc::SOL_SOCKET, libc::SO_REUSEADDR, one.as_ptr(), 4),
        ("tcp_nodelay", libc::IPPROTO_TCP, libc::TCP_NODELAY, one.as_ptr(), 4),
    ];
    for (case, level, name, ptr, len) in cases {
        let (ret, e) = setsockopt(&fd, level, name, ptr, len);
        let _ = writeln!(out, "{}", json!({"case": case, "ret": ret, "errno": e}));
    }
    let _ = out.flush();
    for (case, fd) in [("connect_after_hostile", fd), ("connect_fresh_socket", new_socket())] {
        let line = match connect(&fd, vip) {
            Err(e) => {
                json!({"case": case, "ok": false, "errno": e, "backend": null, "reply": null})
            }
            Ok(peer) => {
                let mut s = TcpStream::from(fd);
                let r = exchange(&mut s, vip, false);
                json!({"case": case, "ok": r.is_ok(), "errno": 0, "backend": peer.to_string(),
                       "reply": r.as_ref().ok(), "error": r.err()})
            }
        };
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}
