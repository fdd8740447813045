//! Real backend servers on 127.0.0.x or ::1: each answers any request with its own address as the
//! body, so a client can cross-check where the kernel sent it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Request header that asks the server to keep the connection open after replying, until
/// the client closes it ("hold" mode, for in-flight tests).
pub const HOLD_HEADER: &str = "X-Ailb-Hold: 1";

/// How long a connection thread waits between checks of the stop flag.
const POLL: Duration = Duration::from_millis(200);
/// A connection that sends nothing for this long is dropped (bounds every thread).
const IDLE_LIMIT: Duration = Duration::from_secs(120);

/// A listening server on `addr`; stops (bounded) on drop.
pub struct BackendServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    open: Arc<AtomicI64>,
    thread: Option<JoinHandle<()>>,
}

impl BackendServer {
    /// Binds `addr` (a 127.0.0.0/8 `ip:port`, or `[::1]:port`) and starts accepting. std sets SO_REUSEADDR
    /// on listeners, so sequential tests may reuse an address.
    pub fn start(addr: &str) -> Self {
        let addr: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("backend address {addr}: {e}"));
        match addr {
            SocketAddr::V4(a) if a.ip().octets()[0] == 127 => {}
            SocketAddr::V6(a) if a.ip().is_loopback() => {}
            _ => panic!("backend {addr}: tests only use 127.0.0.0/8 and ::1"),
        }
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding backend {addr}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicI64::new(0));
        let (s, a, o) = (stop.clone(), accepted.clone(), open.clone());
        let thread = std::thread::Builder::new()
            .name(format!("backend-{addr}"))
            .spawn(move || accept_loop(listener, addr, s, a, o))
            .unwrap_or_else(|e| panic!("spawning backend thread {addr}: {e}"));
        Self { addr, stop, accepted, open, thread: Some(thread) }
    }

    /// Starts one server per address.
    pub fn start_all(addrs: &[&str]) -> Vec<Self> {
        addrs.iter().map(|a| Self::start(a)).collect()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `ip:port`, the form `ailb status` and the client use.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open on the server side.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for BackendServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Unblock accept(). The test process is outside the child cgroup, so this connect is
        // never rewritten by ailb.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                eprintln!("backend {}: accept thread did not stop within 5 s", self.addr);
            }
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    open: Arc<AtomicI64>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        accepted.fetch_add(1, Ordering::SeqCst);
        open.fetch_add(1, Ordering::SeqCst);
        let (s, o) = (stop.clone(), open.clone());
        let spawned = std::thread::Builder::new().spawn(move || {
            serve(stream, addr, &s);
            o.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one request head, replies with `addr` as the body, then either closes
/// (`Connection: close`) or, for a hold request, waits until the client closes.
fn serve(mut stream: TcpStream, addr: SocketAddr, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let started = Instant::now();
    // Read the request head (bounded by size, idle time and the stop flag).
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.len() > 16 * 1024 {
            break;
        }
        if stop.load(Ordering::SeqCst) || started.elapsed() > IDLE_LIMIT {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if is_timeout(&e) => continue,
            Err(_) => return,
        }
    }
    let hold = String::from_utf8_lossy(&head).contains(HOLD_HEADER);
    let body = addr.to_string();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n{body}",
        body.len(),
        if hold { "keep-alive" } else { "close" }
    );
    if stream.write_all(reply.as_bytes()).is_err() || !hold {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    // Hold: wait for the client's FIN (or the stop flag).
    let held = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) || held.elapsed() > IDLE_LIMIT {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if is_timeout(&e) => continue,
            Err(_) => return,
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}
