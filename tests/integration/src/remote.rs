//! Remote clients through the TC datapath, in the namespaces of [`crate::netns::Topology`]:
//! backend servers in the backends namespace, a daemon in the gateway namespace (started with
//! `nsenter --net`, which keeps the bpffs pins visible) attached to both of the gateway's
//! veths, and connections made from the client namespace, over IPv4 or IPv6 (every backend
//! address listens in both families: [`BACKEND_ADDRS`] and [`BACKEND_ADDRS6`]).
//!
//! The servers speak the protocol of `ailb-testclient`: a request ending in an empty line is
//! answered with `Content-Length` and the backend's own `ip:port` as the body; a request with
//! [`crate::backend::HOLD_HEADER`] keeps the connection open and echoes whatever comes after,
//! until the client closes it; otherwise the backend closes first.

mod servers;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns::{Topology, BACKEND_ADDRS, BACKEND_ADDRS6, GATEWAY_BACKEND_SIDE, GATEWAY_BACKEND_SIDE6};
use crate::{base_config, preflight, BackendCfg, CgroupGuard, Daemon, Launch, TestConfig};

use self::servers::is_timeout;
pub use self::servers::{serve, BackendProcess, Servers};

/// The port every backend listens on.
pub const BACKEND_PORT: u16 = 9000;

/// A remote connection from the client namespace, after its request was answered.
pub struct Remote {
    pub stream: TcpStream,
    /// The backend that answered (`ip:port`).
    pub backend: String,
}

impl Remote {
    /// The address of the backend that answered.
    pub fn backend_addr(&self) -> SocketAddr {
        self.backend.parse().unwrap_or_else(|e| panic!("answered by {:?}, not an address: {e}", self.backend))
    }

    /// Index of the backend's address in [`BACKEND_ADDRS`] or, for an IPv6 one, in
    /// [`BACKEND_ADDRS6`] (whatever its port).
    pub fn index(&self) -> usize {
        match self.backend_addr().ip() {
            IpAddr::V4(a) => BACKEND_ADDRS.iter().position(|b| *b == a),
            IpAddr::V6(a) => BACKEND_ADDRS6.iter().position(|b| *b == a),
        }
        .unwrap_or_else(|| panic!("answered by {:?}, not a backend", self.backend))
    }

    /// Whether an IPv6 backend answered.
    pub fn is_ipv6(&self) -> bool {
        self.backend_addr().is_ipv6()
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

    /// Sends `len` bytes on a held connection from a thread of its own while this one reads the
    /// backend's echo back (one thread for both would stall once both directions' buffers
    /// filled), all within `timeout`: a bulk transfer in both directions, whose segments the
    /// client's stack hands to its veth as GSO packets larger than the MTU. A transfer that only
    /// creeps on in retransmissions fails at the deadline; the socket is shut down then, so the
    /// writer ends too.
    pub fn echo_bulk(&mut self, len: usize, timeout: Duration) -> Result<(), std::io::Error> {
        let deadline = std::time::Instant::now() + timeout;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut w = self.stream.try_clone()?;
        w.set_write_timeout(Some(timeout))?;
        let sent = data.clone();
        let writer = std::thread::spawn(move || w.write_all(&sent));
        let mut back = vec![0u8; len];
        let mut got = 0;
        let read = loop {
            if got == len {
                break Ok(());
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{got} of {len} bytes echoed in {timeout:?}"),
                ));
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut back[got..]) {
                Ok(0) => break Err(std::io::Error::other(format!("EOF after {got} of {len} echoed bytes"))),
                Ok(n) => got += n,
                Err(e) if is_timeout(&e) => {}
                Err(e) => break Err(std::io::Error::new(e.kind(), format!("after {got} of {len} echoed bytes: {e}"))),
            }
        };
        if read.is_err() {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
        let wrote = writer.join().map_err(|_| std::io::Error::other("the writer thread panicked"))?;
        read?;
        wrote?;
        if back != data {
            return Err(std::io::Error::other("the echo differs from what was sent"));
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

/// Connects from `topo`'s client namespace to `vip` of either family (from `source` when
/// given, an address of the client's interface), sends a request (`hold`: the backend keeps
/// the connection) and reads the answer.
pub fn connect(
    topo: &Topology,
    vip: impl Into<SocketAddr>,
    source: Option<IpAddr>,
    hold: bool,
) -> Result<Remote, String> {
    connect_on(topo, vip, source, hold, None)
}

/// [`connect`] from a thread bound to CPU `cpu` (when given): the SYN leaves the client's veth
/// and meets the gateway's TC program on that CPU, so a test can spread new flows over the
/// CPUs on purpose instead of wherever the scheduler ran the client.
pub fn connect_on(
    topo: &Topology,
    vip: impl Into<SocketAddr>,
    source: Option<IpAddr>,
    hold: bool,
    cpu: Option<usize>,
) -> Result<Remote, String> {
    let vip = vip.into();
    topo.client.run(move || {
        if let Some(cpu) = cpu {
            bind_to_cpu(cpu)?;
        }
        connect_addr(vip, source, hold)
    })
}

/// [`connect`] from the calling thread's network namespace (a thread that entered the
/// client's, e.g. in [`crate::netns::NetNs::run`], for a loop of many connections).
pub fn connect_here(vip: SocketAddrV4, source: Option<Ipv4Addr>, hold: bool) -> Result<Remote, String> {
    connect_addr(vip.into(), source.map(IpAddr::V4), hold)
}

/// [`connect_here`] to a VIP of either family (a socket of the VIP's family).
pub fn connect_addr(vip: SocketAddr, source: Option<IpAddr>, hold: bool) -> Result<Remote, String> {
    let s =
        Socket::new(Domain::for_address(vip), Type::STREAM, Some(Protocol::TCP)).map_err(|e| format!("socket: {e}"))?;
    if let Some(a) = source {
        s.bind(&SocketAddr::new(a, 0).into()).map_err(|e| format!("bind {a}: {e}"))?;
    }
    s.connect_timeout(&vip.into(), Duration::from_secs(5))
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

/// Writes one request and reads the reply's body; unless `hold`, then the server's close too
/// (EOF): the connection has then ended on the backend's side, whose FIN the TC program has
/// seen on its way here and uncounted, so a next connection is picked with this one no longer
/// in flight (a client address's affinity holds only under the load bound).
fn request(stream: &TcpStream, vip: SocketAddr, hold: bool) -> Result<String, std::io::Error> {
    let body = reply(stream, vip, hold)?;
    if !hold {
        let mut rest = [0u8; 512];
        let mut stream = stream;
        let n = stream.read(&mut rest)?;
        if n != 0 {
            return Err(std::io::Error::other(format!("{n} bytes after the reply's body")));
        }
    }
    Ok(body)
}

/// Writes one request and reads the reply's body.
fn reply(mut stream: &TcpStream, vip: SocketAddr, hold: bool) -> Result<String, std::io::Error> {
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
    /// Whether the model has the IPv4 VIP `vip` and the IPv4 backends ([`BACKEND_ADDRS`],
    /// weighted by `weights`).
    pub ipv4: bool,
    pub vip: SocketAddrV4,
    pub weights: [u32; 3],
    /// The model's IPv6 VIP, with the IPv6 backends ([`BACKEND_ADDRS6`], weighted by
    /// `weights6`; masquerade gets `nat_address6` too). None: an IPv4-only model.
    pub vip6: Option<SocketAddrV6>,
    pub weights6: [u32; 3],
    /// The port of each backend in the config (of both families); the servers listen on
    /// [`BACKEND_PORT`], another port is one a test serves itself ([`BackendProcess`]).
    pub ports: [u16; 3],
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

/// The IPv6 VIP of [`GatewaySpec::ipv6`] (on no interface: the client routes it to the gateway).
pub const VIP6: SocketAddrV6 = SocketAddrV6::new(Ipv6Addr::new(0xfd00, 0xa1b, 9, 0, 0, 0, 0, 1), 8000, 0, 0);

impl GatewaySpec {
    pub fn new(name: &'static str, masquerade: bool) -> Self {
        Self {
            name,
            model: "remote-7b",
            ipv4: true,
            vip: SocketAddrV4::new(Ipv4Addr::new(10, 201, 9, 1), 8000),
            weights: [1, 1, 1],
            vip6: None,
            weights6: [1, 1, 1],
            ports: [BACKEND_PORT; 3],
            free_memory_mb: [None; 3],
            tc: String::new(),
            model_extra: String::new(),
            masquerade,
            listen: false,
        }
    }

    /// An IPv6-only model: the VIP [`VIP6`] and the IPv6 backends.
    pub fn ipv6(name: &'static str, masquerade: bool) -> Self {
        Self { ipv4: false, vip6: Some(VIP6), ..Self::new(name, masquerade) }
    }

    /// The model's backends as the config names them, with their weights.
    fn backends(&self) -> Vec<(String, u32)> {
        let mut all = Vec::new();
        if self.ipv4 {
            all.extend((0..3).map(|i| (SocketAddr::from((BACKEND_ADDRS[i], self.ports[i])), self.weights[i])));
        }
        if self.vip6.is_some() {
            all.extend((0..3).map(|i| (SocketAddr::from((BACKEND_ADDRS6[i], self.ports[i])), self.weights6[i])));
        }
        all.into_iter().map(|(a, w)| (a.to_string(), w)).collect()
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
    /// Each backend's share of its model's table slots, in percent, by its index in
    /// [`BACKEND_ADDRS`] (or [`BACKEND_ADDRS6`] with `v6`), from `ailb status`.
    pub fn table_shares(&self, v6: bool) -> [f64; 3] {
        let st = self.daemon.status();
        let mut slots = [0u64; 3];
        for b in
            st["models"].as_array().into_iter().flatten().flat_map(|m| m["backends"].as_array().into_iter().flatten())
        {
            let Some(addr) = b["address"].as_str().and_then(|a| a.parse::<SocketAddr>().ok()) else { continue };
            let index = match addr.ip() {
                IpAddr::V4(a) if !v6 => BACKEND_ADDRS.iter().position(|x| *x == a),
                IpAddr::V6(a) if v6 => BACKEND_ADDRS6.iter().position(|x| *x == a),
                _ => None,
            };
            if let Some(i) = index {
                slots[i] += b["table_slots"].as_u64().unwrap_or_else(|| panic!("no table_slots in {b}"));
            }
        }
        let all: u64 = slots.iter().sum();
        assert!(all > 0, "no table slots for the backends in {st}");
        slots.map(|s| 100.0 * s as f64 / all as f64)
    }

    pub fn start(spec: &GatewaySpec) -> Self {
        let bin = preflight();
        let topo = Topology::new();
        let servers = Servers::start(&topo);
        let cg = CgroupGuard::new(spec.name);
        let mut cfg = base_config(spec.name, &cg);
        cfg.listen = spec.listen.then(|| METRICS_ADDR.to_string());
        for (i, (address, weight)) in spec.backends().into_iter().enumerate() {
            let mut b = BackendCfg::new(spec.model, &address, weight);
            b.free_memory_mb = spec.free_memory_mb[i % 3];
            cfg = cfg.backend(b);
        }
        let mode = match (spec.masquerade, spec.vip6) {
            (true, None) => format!("mode = \"masquerade\"\nnat_address = \"{GATEWAY_BACKEND_SIDE}\"\n"),
            (true, Some(_)) => format!(
                "mode = \"masquerade\"\nnat_address = \"{GATEWAY_BACKEND_SIDE}\"\nnat_address6 = \"{GATEWAY_BACKEND_SIDE6}\"\n"
            ),
            (false, _) => "mode = \"routed\"\n".to_string(),
        };
        cfg.daemon_extra = format!(
            "interfaces = [{:?}, {:?}]\n\n[daemon.tc]\n{mode}{}",
            topo.gateway_ifaces[0], topo.gateway_ifaces[1], spec.tc
        );
        let vips: Vec<String> =
            spec.ipv4.then(|| spec.vip.to_string()).into_iter().chain(spec.vip6.map(|v| v.to_string())).collect();
        cfg.extra = format!("[[models]]\nname = {:?}\nvips = {vips:?}\n{}\n", spec.model, spec.model_extra);
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
    /// On a timeout it panics with the last status and the flow entries left (`bpftool`), so a
    /// flow that never ended shows how far its close got (`flags`: the FINs seen).
    pub fn wait_no_flow(&self, what: &str, timeout: Duration) -> Value {
        let left = |map: &str| {
            let pin = self.daemon.bpffs().join(map);
            match Command::new("bpftool").args(["map", "dump", "pinned"]).arg(&pin).output() {
                Ok(o) => String::from_utf8_lossy(&o.stdout).lines().take(80).collect::<Vec<_>>().join("\n"),
                Err(e) => format!("bpftool: {e}"),
            }
        };
        ailb_sim::poll::wait_until_or(
            what,
            timeout,
            || {
                let tc = self.tc();
                (tc["flows"] == 0 && tc["flows_ipv6"] == 0 && tc["counted"] == 0 && tc["nat_ports"] == 0).then_some(())
            },
            || format!("tc {}\nAILB_FLOWS:\n{}\nAILB_FLOWS6:\n{}", self.tc(), left("AILB_FLOWS"), left("AILB_FLOWS6")),
        );
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

/// Asserts that `picked` (connections per backend, IPv4 or IPv6 ones: `v6`) splits as the
/// model's table does within the sampling noise of that many picks
/// ([`crate::share_tolerance_pp`]), and that the table splits as `weights` within 1
/// point (a small model's table holds each share within the fill's slack of 8 slots: 0.8 points
/// at 1,021 slots). Hashes sample the table, so the table's own shares are what the picks
/// follow.
pub fn assert_shares(gw: &Gateway, picked: &[usize; 3], weights: &[u32; 3], v6: bool) {
    let table = gw.table_shares(v6);
    let n: usize = picked.iter().sum();
    let total: u32 = weights.iter().sum();
    for (i, w) in weights.iter().enumerate() {
        let want = 100.0 * *w as f64 / total as f64;
        assert!(
            (table[i] - want).abs() <= 1.0,
            "backend {i}: {:.2} % of the table's slots, weight {want:.1} %",
            table[i]
        );
        let share = 100.0 * picked[i] as f64 / n as f64;
        let points = crate::share_tolerance_pp(table[i] / 100.0, n, 0.0);
        assert!(
            (share - table[i]).abs() <= points,
            "backend {i}: {share:.1} % of remote connections ({picked:?}), its table share {:.1} % +- {points:.1}",
            table[i]
        );
    }
}

/// Bulk data both ways through `vip` of a gateway started from `spec`: 4 held connections, each
/// echoing 4 MiB. The client's veth hands its stack's GSO packets (up to 64 KiB, past the
/// 1500-byte MTU) to the gateway as they are, and the backends' replies come back the same way:
/// each must be redirected like any other packet. A forwarded packet that the program handed to
/// the stack instead (`to_stack`) would, in masquerade mode, carry the gateway's own NAT address
/// as its source, which the stack refuses to forward: the transfer stalls in retransmissions.
pub fn assert_bulk_transfers(spec: &GatewaySpec, vip: impl Into<SocketAddr> + Copy) {
    let gw = Gateway::start(spec);
    let to_stack = |tc: &Value| tc["stats"]["to_stack"].as_u64().unwrap_or_else(|| panic!("no to_stack in {tc}"));
    let before = to_stack(&gw.tc());
    for i in 0..4 {
        let mut r = connect(&gw.topo, vip, None, true).unwrap_or_else(|e| panic!("remote connection {i}: {e}"));
        r.echo_bulk(4 << 20, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("4 MiB echo {i} through {}: {e}; TC {}", r.backend, gw.tc()));
    }
    let tc = gw.wait_no_flow("every bulk flow removed", Duration::from_secs(10));
    assert_eq!(to_stack(&tc), before, "forwarded packets handed to the stack: {tc}");
    println!("4 x 4 MiB echoed through {}; TC {tc}", vip.into());
}
