//! Network namespaces the tests create and remove (never the host's interfaces): a client
//! namespace, a gateway namespace and a backends namespace joined by two veth pairs, both
//! families on every veth (IPv6: unique local addresses), and work run inside one of them on
//! a thread of its own (`setns`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::Duration;

use crate::run_cmd;

/// A network namespace made by `ip netns add`; deleted on drop.
pub struct NetNs {
    pub name: String,
}

fn ip(args: &[&str]) {
    let out = run_cmd(Command::new("ip").args(args), Duration::from_secs(10));
    if !out.status.success() {
        panic!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
}

impl NetNs {
    pub fn new(name: String) -> Self {
        ip(&["netns", "add", &name]);
        Self { name }
    }

    /// `/run/netns/NAME`, for `nsenter --net=`.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `ip -n NAME ARGS...`.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all);
    }

    /// Writes `value` to `/proc/sys/KEY` (a `/`-separated sysctl) as seen from inside this
    /// namespace (the `net.` ones are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) {
        let (path, value) = (format!("/proc/sys/{key}"), value.to_string());
        self.run(move || std::fs::write(&path, &value).unwrap_or_else(|e| panic!("write {value} to {path}: {e}")));
    }

    /// Adds `addr/prefix` of either family to `dev`; an IPv6 one with `nodad`, so that it is
    /// usable at once instead of tentative during duplicate address detection (the addresses
    /// are unique inside the test's own namespaces).
    pub fn add_addr(&self, addr: IpAddr, prefix: u8, dev: &str) {
        let a = format!("{addr}/{prefix}");
        match addr {
            IpAddr::V4(_) => self.ip(&["addr", "add", &a, "dev", dev]),
            IpAddr::V6(_) => self.ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"]),
        }
    }

    /// Brings `dev` up; for IPv6 without duplicate address detection on its link-local
    /// address either (set before the link goes up, so no address of it is ever tentative).
    fn up(&self, dev: &str) {
        self.sysctl(&format!("net/ipv6/conf/{dev}/accept_dad"), "0");
        self.ip(&["link", "set", dev, "up"]);
    }

    /// This namespace's TCP and IP counters (`/proc/net/snmp` and `/proc/net/netstat` as seen
    /// from inside it), by `Group:Name`, e.g. `Tcp:OutRsts`, `TcpExt:TCPSynRetrans`. A fresh
    /// namespace starts them at 0, so they count what happened in it since.
    pub fn counters(&self) -> HashMap<String, u64> {
        self.run(|| {
            let mut all = HashMap::new();
            for file in ["snmp", "netstat"] {
                // `thread-self`: `self` would name the thread group leader's namespace.
                let path = format!("/proc/thread-self/net/{file}");
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
                let lines: Vec<&str> = text.lines().collect();
                for pair in lines.chunks(2) {
                    let [names, values] = pair else { continue };
                    let (Some((group, names)), Some((_, values))) = (names.split_once(':'), values.split_once(':'))
                    else {
                        continue;
                    };
                    for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
                        if let Ok(v) = v.parse::<u64>() {
                            all.insert(format!("{group}:{n}"), v);
                        }
                    }
                }
            }
            all
        })
    }

    /// Runs `f` on a new thread that has entered this namespace; sockets it makes live there.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path();
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            use std::os::fd::AsRawFd;
            // SAFETY: a valid namespace file descriptor; setns changes only this thread's
            // network namespace (a thread of its own, ended when `f` returns).
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns into {path}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_cmd(Command::new("ip").args(["netns", "del", &self.name]), Duration::from_secs(10));
    }
}

/// client (CLIENT_ADDR) -- veth -- gateway (GATEWAY_CLIENT_SIDE, GATEWAY_BACKEND_SIDE) -- veth
/// -- backends (the BACKEND_ADDRS), and the same in IPv6 (the `*6` addresses, one /64 per
/// veth). The client routes everything through the gateway, the backends too (so routed mode
/// works); the gateway forwards both families.
pub struct Topology {
    pub client: NetNs,
    pub gateway: NetNs,
    pub backends: NetNs,
    /// The gateway's interfaces towards the client and towards the backends.
    pub gateway_ifaces: [String; 2],
}

pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
pub const GATEWAY_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);
pub const GATEWAY_BACKEND_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 2, 1);
pub const BACKEND_ADDRS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(10, 201, 2, 2), Ipv4Addr::new(10, 201, 2, 3), Ipv4Addr::new(10, 201, 2, 4)];

pub const CLIENT_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa1b, 1, 0, 0, 0, 0, 2);
pub const GATEWAY_CLIENT_SIDE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa1b, 1, 0, 0, 0, 0, 1);
pub const GATEWAY_BACKEND_SIDE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa1b, 2, 0, 0, 0, 0, 1);
pub const BACKEND_ADDRS6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0xa1b, 2, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0xa1b, 2, 0, 0, 0, 0, 3),
    Ipv6Addr::new(0xfd00, 0xa1b, 2, 0, 0, 0, 0, 4),
];

impl Topology {
    pub fn new() -> Self {
        // Unique per process and per topology, so that two tests of one binary never share a
        // name (interface names stay under 15 bytes).
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 100;
        let tag = format!("{}x{seq}", std::process::id() % 100_000);
        let client = NetNs::new(format!("ailb-c{tag}"));
        let gateway = NetNs::new(format!("ailb-g{tag}"));
        let backends = NetNs::new(format!("ailb-b{tag}"));
        let (gc, gb) = (format!("gc{tag}"), format!("gb{tag}"));
        ip(&["link", "add", "c0", "netns", &client.name, "type", "veth", "peer", "name", &gc, "netns", &gateway.name]);
        ip(&[
            "link",
            "add",
            "b0",
            "netns",
            &backends.name,
            "type",
            "veth",
            "peer",
            "name",
            &gb,
            "netns",
            &gateway.name,
        ]);
        for ns in [&client, &gateway, &backends] {
            ns.ip(&["link", "set", "lo", "up"]);
        }
        // Forwarding before the links are up: it makes the gateway's interfaces routers.
        gateway.sysctl("net/ipv4/ip_forward", "1");
        gateway.sysctl("net/ipv6/conf/all/forwarding", "1");
        client.add_addr(CLIENT_ADDR.into(), 24, "c0");
        client.add_addr(CLIENT_ADDR6.into(), 64, "c0");
        client.up("c0");
        client.ip(&["route", "add", "default", "via", &GATEWAY_CLIENT_SIDE.to_string()]);
        client.ip(&["-6", "route", "add", "default", "via", &GATEWAY_CLIENT_SIDE6.to_string()]);
        gateway.add_addr(GATEWAY_CLIENT_SIDE.into(), 24, &gc);
        gateway.add_addr(GATEWAY_CLIENT_SIDE6.into(), 64, &gc);
        gateway.add_addr(GATEWAY_BACKEND_SIDE.into(), 24, &gb);
        gateway.add_addr(GATEWAY_BACKEND_SIDE6.into(), 64, &gb);
        gateway.up(&gc);
        gateway.up(&gb);
        for b in BACKEND_ADDRS {
            backends.add_addr(b.into(), 24, "b0");
        }
        for b in BACKEND_ADDRS6 {
            backends.add_addr(b.into(), 64, "b0");
        }
        backends.up("b0");
        backends.ip(&["route", "add", "default", "via", &GATEWAY_BACKEND_SIDE.to_string()]);
        backends.ip(&["-6", "route", "add", "default", "via", &GATEWAY_BACKEND_SIDE6.to_string()]);
        Self { client, gateway, backends, gateway_ifaces: [gc, gb] }
    }
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}
