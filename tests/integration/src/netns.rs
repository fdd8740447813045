//! Network namespaces the tests create and remove (never the host's interfaces): a client
//! namespace, a gateway namespace and a backends namespace joined by two veth pairs, and
//! work run inside one of them on a thread of its own (`setns`).

use std::collections::HashMap;
use std::net::Ipv4Addr;
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
/// -- backends (the BACKEND_ADDRS). The client routes everything through the gateway, the
/// backends too (so routed mode works); the gateway forwards.
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
        client.ip(&["addr", "add", &format!("{CLIENT_ADDR}/24"), "dev", "c0"]);
        client.ip(&["link", "set", "c0", "up"]);
        client.ip(&["route", "add", "default", "via", &GATEWAY_CLIENT_SIDE.to_string()]);
        gateway.ip(&["addr", "add", &format!("{GATEWAY_CLIENT_SIDE}/24"), "dev", &gc]);
        gateway.ip(&["addr", "add", &format!("{GATEWAY_BACKEND_SIDE}/24"), "dev", &gb]);
        gateway.ip(&["link", "set", &gc, "up"]);
        gateway.ip(&["link", "set", &gb, "up"]);
        for b in BACKEND_ADDRS {
            backends.ip(&["addr", "add", &format!("{b}/24"), "dev", "b0"]);
        }
        backends.ip(&["link", "set", "b0", "up"]);
        backends.ip(&["route", "add", "default", "via", &GATEWAY_BACKEND_SIDE.to_string()]);
        gateway
            .run(|| std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap_or_else(|e| panic!("ip_forward: {e}")));
        Self { client, gateway, backends, gateway_ifaces: [gc, gb] }
    }
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}
