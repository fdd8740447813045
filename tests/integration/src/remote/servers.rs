//! The backends of [`super`]: listeners on every backend address in the backends namespace,
//! counting what they accept (threads of the test), and a backend in a process of its own
//! (`ailb-testclient serve`) for a test that kills it. Both speak the protocol [`serve`] answers.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::BACKEND_PORT;
use crate::backend::HOLD_HEADER;
use crate::netns::{Topology, BACKEND_ADDRS, BACKEND_ADDRS6};

/// What the servers saw: connections accepted per listener (the three [`BACKEND_ADDRS`], then
/// the three [`BACKEND_ADDRS6`]), and the peer addresses.
#[derive(Default)]
struct Seen {
    accepted: [u64; 6],
    peers: BTreeMap<IpAddr, u64>,
}

/// The addresses the servers listen on, in the order of [`Seen::accepted`].
fn listen_addrs() -> Vec<SocketAddr> {
    let v4 = BACKEND_ADDRS.iter().map(|a| SocketAddr::from((*a, BACKEND_PORT)));
    v4.chain(BACKEND_ADDRS6.iter().map(|a| SocketAddr::from((*a, BACKEND_PORT)))).collect()
}

/// Listeners on the three [`BACKEND_ADDRS`] and the three [`BACKEND_ADDRS6`] in the backends
/// namespace; stopped on drop.
pub struct Servers {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

impl Servers {
    pub fn start(topo: &Topology) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let listeners: Vec<TcpListener> = topo.backends.run(|| {
            listen_addrs().iter().map(|a| TcpListener::bind(a).unwrap_or_else(|e| panic!("bind {a}: {e}"))).collect()
        });
        let addrs = listen_addrs();
        for (i, l) in listeners.into_iter().enumerate() {
            let (seen, stop, me) = (seen.clone(), stop.clone(), addrs[i]);
            l.set_nonblocking(true).expect("nonblocking listener");
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((s, peer)) => {
                            {
                                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                                seen.accepted[i] += 1;
                                *seen.peers.entry(peer.ip()).or_default() += 1;
                            }
                            let stop = stop.clone();
                            std::thread::spawn(move || serve(s, me, stop));
                        }
                        // Nothing to accept: wait for a connection (woken at once by it, so an
                        // accept costs no polling delay), and look at the stop flag at least
                        // every 50 ms.
                        Err(_) => wait_readable(&l, 50),
                    }
                }
            });
        }
        Self { seen, stop }
    }

    /// Connections accepted by each IPv4 backend ([`BACKEND_ADDRS`]).
    pub fn counts(&self) -> [u64; 3] {
        let a = self.seen.lock().unwrap_or_else(|e| e.into_inner()).accepted;
        [a[0], a[1], a[2]]
    }

    /// Connections accepted by each IPv6 backend ([`BACKEND_ADDRS6`]).
    pub fn counts6(&self) -> [u64; 3] {
        let a = self.seen.lock().unwrap_or_else(|e| e.into_inner()).accepted;
        [a[3], a[4], a[5]]
    }

    /// Connections accepted by the IPv4 backends, by the client address they saw.
    pub fn peers(&self) -> BTreeMap<Ipv4Addr, u64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.peers.iter().filter_map(|(a, n)| if let IpAddr::V4(a) = a { Some((*a, *n)) } else { None }).collect()
    }

    /// Connections accepted by the IPv6 backends, by the client address they saw.
    pub fn peers6(&self) -> BTreeMap<Ipv6Addr, u64> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.peers.iter().filter_map(|(a, n)| if let IpAddr::V6(a) = a { Some((*a, *n)) } else { None }).collect()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Waits until `l` has a connection to accept, at most `ms` milliseconds.
fn wait_readable(l: &TcpListener, ms: i32) {
    use std::os::fd::AsRawFd;
    let mut fds = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the listener's open descriptor, which outlives the call.
    let _ = unsafe { libc::poll(&mut fds, 1, ms) };
}

/// One accepted connection: the request, the reply with `me`, then (held) an echo until EOF
/// (or until `stop` is set). `ailb-testclient serve` runs the same, in a process of its own.
pub fn serve(mut s: TcpStream, me: SocketAddr, stop: Arc<AtomicBool>) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
            Err(e) if is_timeout(&e) && !stop.load(Ordering::SeqCst) => {}
            Err(_) => return,
        }
    }
    let body = me.to_string();
    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    if s.write_all(reply.as_bytes()).is_err() {
        return;
    }
    if !String::from_utf8_lossy(&req).contains(HOLD_HEADER) {
        return;
    }
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if is_timeout(&e) && !stop.load(Ordering::SeqCst) => {}
            Err(_) => return,
        }
    }
}

pub(super) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// A backend server in a process of its own (`ailb-testclient serve`) in the backends
/// namespace, for a test that kills it; killed on drop.
pub struct BackendProcess {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl BackendProcess {
    /// Starts `client_bin serve --listen ADDR` in `topo`'s backends namespace and waits for its
    /// `LISTENING` line (printed once the socket listens).
    pub fn start(topo: &Topology, client_bin: &str, addr: SocketAddr) -> Self {
        use std::io::BufRead;
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", topo.backends.path()))
            .args(["--", client_bin, "serve", "--listen", &addr.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {client_bin} serve --listen {addr}: {e}"));
        let out = child.stdout.take().unwrap_or_else(|| panic!("no stdout of the server on {addr}"));
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap_or_else(|e| panic!("server on {addr}: {e}"));
        assert_eq!(line.trim(), "LISTENING", "server on {addr} did not start");
        Self { child, addr }
    }

    /// SIGKILL, and waits for the process to be gone (its sockets closed by the kernel).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BackendProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
