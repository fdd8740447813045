//! Remote clients through the TC datapath, in the namespaces of [`crate::netns::Topology`]:
//! backend servers in the backends namespace, a daemon in the gateway namespace (started with
//! `nsenter --net`, which keeps the bpffs pins visible) attached to both of the gateway's
//! veths, and connections made from the client namespace.
//!
//! The servers speak the protocol of `ailb-testclient`: a request ending in an empty line is
//! answered with `Content-Length` and the backend's own `ip:port` as the body; a request with
//! [`crate::backend::HOLD_HEADER`] keeps the connection open and echoes whatever comes after,
//! until the client closes it; otherwise the backend closes first.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

use crate::backend::HOLD_HEADER;
use crate::netns::{Topology, BACKEND_ADDRS, GATEWAY_BACKEND_SIDE};
use crate::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, Launch, TestConfig};

/// The port every backend listens on.
pub const BACKEND_PORT: u16 = 9000;

/// What the servers saw: connections accepted per backend, and the peer addresses.
#[derive(Default)]
struct Seen {
    accepted: [u64; 3],
    peers: BTreeMap<Ipv4Addr, u64>,
}

/// Listeners on the three [`BACKEND_ADDRS`] in the backends namespace; stopped on drop.
pub struct Servers {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

impl Servers {
    pub fn start(topo: &Topology) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let listeners: Vec<TcpListener> = topo.backends.run(|| {
            BACKEND_ADDRS
                .iter()
                .map(|a| {
                    TcpListener::bind((*a, BACKEND_PORT)).unwrap_or_else(|e| panic!("bind {a}:{BACKEND_PORT}: {e}"))
                })
                .collect()
        });
        for (i, l) in listeners.into_iter().enumerate() {
            let (seen, stop) = (seen.clone(), stop.clone());
            l.set_nonblocking(true).expect("nonblocking listener");
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match l.accept() {
                        Ok((s, peer)) => {
                            {
                                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                                seen.accepted[i] += 1;
                                if let SocketAddr::V4(p) = peer {
                                    *seen.peers.entry(*p.ip()).or_default() += 1;
                                }
                            }
                            let stop = stop.clone();
                            std::thread::spawn(move || {
                                serve(s, SocketAddrV4::new(BACKEND_ADDRS[i], BACKEND_PORT), stop)
                            });
                        }
                        // Nothing to accept: poll the stop flag again shortly.
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            });
        }
        Self { seen, stop }
    }

    /// Connections accepted by each backend.
    pub fn counts(&self) -> [u64; 3] {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).accepted
    }

    /// Connections accepted, by the client address the backends saw.
    pub fn peers(&self) -> BTreeMap<Ipv4Addr, u64> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).peers.clone()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One accepted connection: the request, the reply with `me`, then (held) an echo until EOF.
fn serve(mut s: TcpStream, me: SocketAddrV4, stop: Arc<AtomicBool>) {
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

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// A remote connection from the client namespace, after its request was answered.
pub struct Remote {
    pub stream: TcpStream,
    /// The backend that answered (`ip:port`).
    pub backend: String,
}

impl Remote {
    /// Index of the backend in [`BACKEND_ADDRS`].
    pub fn index(&self) -> usize {
        BACKEND_ADDRS
            .iter()
            .position(|a| self.backend == format!("{a}:{BACKEND_PORT}"))
            .unwrap_or_else(|| panic!("answered by {:?}, not a backend", self.backend))
    }

    /// Sends `data` on a held connection and reads the backend's echo of it.
    pub fn echo(&mut self, data: &[u8]) -> Result<(), std::io::Error> {
        self.stream.write_all(data)?;
        let mut back = vec![0u8; data.len()];
        self.stream.read_exact(&mut back)?;
        if back != data {
            return Err(std::io::Error::other(format!("echo {back:?}, sent {data:?}")));
        }
        Ok(())
    }

    /// Closes with SO_LINGER 0: the kernel sends an RST instead of a FIN.
    pub fn reset(self) {
        let s = Socket::from(self.stream);
        s.set_linger(Some(Duration::ZERO)).unwrap_or_else(|e| panic!("SO_LINGER 0: {e}"));
        drop(s);
    }
}

/// Connects from `topo`'s client namespace to `vip` (from `source` when given, an address of
/// the client's interface), sends a request (`hold`: the backend keeps the connection) and
/// reads the answer.
pub fn connect(topo: &Topology, vip: SocketAddrV4, source: Option<Ipv4Addr>, hold: bool) -> Result<Remote, String> {
    connect_on(topo, vip, source, hold, None)
}

/// [`connect`] from a thread bound to CPU `cpu` (when given): the SYN leaves the client's veth
/// and meets the gateway's TC program on that CPU, so a test can spread new flows over the
/// CPUs on purpose instead of wherever the scheduler ran the client.
pub fn connect_on(
    topo: &Topology,
    vip: SocketAddrV4,
    source: Option<Ipv4Addr>,
    hold: bool,
    cpu: Option<usize>,
) -> Result<Remote, String> {
    topo.client.run(move || {
        if let Some(cpu) = cpu {
            bind_to_cpu(cpu)?;
        }
        connect_here(vip, source, hold)
    })
}

/// [`connect`] from the calling thread's network namespace (a thread that entered the
/// client's, e.g. in [`crate::netns::NetNs::run`], for a loop of many connections).
pub fn connect_here(vip: SocketAddrV4, source: Option<Ipv4Addr>, hold: bool) -> Result<Remote, String> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).map_err(|e| format!("socket: {e}"))?;
    if let Some(a) = source {
        s.bind(&SocketAddrV4::new(a, 0).into()).map_err(|e| format!("bind {a}: {e}"))?;
    }
    s.connect_timeout(&SocketAddr::V4(vip).into(), Duration::from_secs(5))
        .map_err(|e| format!("connect {vip} from {source:?}: {e}"))?;
    let stream: TcpStream = s.into();
    let backend = request(&stream, vip, hold).map_err(|e| format!("request to {vip}: {e}"))?;
    Ok(Remote { stream, backend })
}

/// Binds the calling thread to CPU `cpu`.
fn bind_to_cpu(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it (cpu is checked
    // against its size); sched_setaffinity(0, ..) changes only the calling thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(format!("cpu {cpu} is past the cpu set"));
        }
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(format!("binding to cpu {cpu}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Writes one request and reads the reply's body.
fn request(mut stream: &TcpStream, vip: SocketAddrV4, hold: bool) -> Result<String, std::io::Error> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = format!("GET / HTTP/1.1\r\nHost: {vip}\r\n{}\r\n", if hold { "X-Ailb-Hold: 1\r\n" } else { "" });
    stream.write_all(req.as_bytes())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| std::io::Error::other(format!("reply without Content-Length: {head:?}")))?;
            if body.len() >= len {
                return Ok(body[..len].to_string());
            }
        }
        match stream.read(&mut buf)? {
            0 => return Err(std::io::Error::other(format!("closed after {} bytes", got.len()))),
            n => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// How a test's gateway is set up.
pub struct GatewaySpec {
    /// Names the pin directory and the cgroup.
    pub name: &'static str,
    pub model: &'static str,
    pub vip: SocketAddrV4,
    pub weights: [u32; 3],
    /// `free_memory_mb` of each backend (None: not reported).
    pub free_memory_mb: [Option<u32>; 3],
    /// Lines of `[daemon.tc]` (the mode, `nat_address` added for masquerade).
    pub tc: String,
    /// Lines of the model's `[[models]]` entry besides its name and VIP.
    pub model_extra: String,
    pub masquerade: bool,
    /// Serve the daemon's HTTP endpoints (`/metrics`) on [`METRICS_ADDR`] in the gateway
    /// namespace.
    pub listen: bool,
}

/// Where the daemon listens when [`GatewaySpec::listen`] (inside the gateway namespace).
pub const METRICS_ADDR: &str = "127.0.0.1:9464";

impl GatewaySpec {
    pub fn new(name: &'static str, masquerade: bool) -> Self {
        Self {
            name,
            model: "remote-7b",
            vip: SocketAddrV4::new(Ipv4Addr::new(10, 201, 9, 1), 8000),
            weights: [1, 1, 1],
            free_memory_mb: [None; 3],
            tc: String::new(),
            model_extra: String::new(),
            masquerade,
            listen: false,
        }
    }
}

/// The three namespaces, the servers, and a daemon in the gateway namespace.
pub struct Gateway {
    pub daemon: Daemon,
    pub cfg: TestConfig,
    pub servers: Servers,
    pub cg: CgroupGuard,
    pub topo: Topology,
    pub bin: std::path::PathBuf,
}

impl Gateway {
    pub fn start(spec: &GatewaySpec) -> Self {
        let bin = preflight();
        let topo = Topology::new();
        let servers = Servers::start(&topo);
        let cg = CgroupGuard::new(spec.name);
        let mut cfg = base_config(spec.name, &cg);
        cfg.listen = spec.listen.then(|| METRICS_ADDR.to_string());
        for (i, a) in BACKEND_ADDRS.iter().enumerate() {
            let mut b = BackendCfg::new(spec.model, &format!("{a}:{BACKEND_PORT}"), spec.weights[i]);
            b.free_memory_mb = spec.free_memory_mb[i];
            cfg = cfg.backend(b);
        }
        let mode = if spec.masquerade {
            format!("mode = \"masquerade\"\nnat_address = \"{GATEWAY_BACKEND_SIDE}\"\n")
        } else {
            "mode = \"routed\"\n".to_string()
        };
        cfg.daemon_extra = format!(
            "interfaces = [{:?}, {:?}]\n\n[daemon.tc]\n{mode}{}",
            topo.gateway_ifaces[0], topo.gateway_ifaces[1], spec.tc
        );
        cfg.extra = format!("[[models]]\nname = {:?}\nvips = [\"{}\"]\n{}\n", spec.model, spec.vip, spec.model_extra);
        let launch = Self::launch(&topo);
        let mut daemon = Daemon::start_with(&bin, &cfg, Launch { wrapper: launch.wrapper.clone(), env: Vec::new() });
        daemon.set_teardown_wrapper(launch.wrapper);
        let gw = Self { daemon, cfg, servers, cg, topo, bin };
        assert!(gw.tc().is_object(), "status shows no TC datapath: {}", gw.daemon.status());
        gw
    }

    /// The daemon runs in the gateway namespace.
    pub fn launch(topo: &Topology) -> Launch {
        Launch {
            wrapper: vec!["nsenter".into(), format!("--net={}", topo.gateway.path()), "--".into()],
            env: Vec::new(),
        }
    }

    /// The `tc` object of `ailb status --json`.
    pub fn tc(&self) -> Value {
        self.daemon.status().get("tc").cloned().unwrap_or(Value::Null)
    }

    /// Polls until no flow, count or NAT entry is left and every in-flight counter is 0.
    pub fn wait_no_flow(&self, what: &str, timeout: Duration) -> Value {
        crate::wait_until(what, timeout, || {
            let tc = self.tc();
            (tc["flows"] == 0 && tc["counted"] == 0 && tc["nat_ports"] == 0).then_some(tc)
        });
        self.daemon.wait_inflight_zero(timeout);
        self.tc()
    }

    /// The daemon's `/metrics`, fetched inside the gateway namespace.
    pub fn metrics(&self) -> String {
        self.topo.gateway.run(|| crate::sim::http_get(METRICS_ADDR, "/metrics"))
    }

    /// A TC counter of `ailb status` (`tc.stats.NAME`).
    pub fn stat(&self, name: &str) -> u64 {
        self.tc()["stats"][name].as_u64().unwrap_or_else(|| panic!("tc.stats.{name} missing: {}", self.tc()))
    }
}
