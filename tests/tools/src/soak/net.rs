//! The soak's network namespaces, so that remote clients can reach the model through the TC
//! datapath: a client namespace -- veth -- a gateway namespace -- veth -- a backends namespace
//! ([`ailb_tests::netns::Topology`], made by the soak and deleted on drop, also on failure).
//!
//! - **backends**: the simulated GPU servers, on `10.201.2.2..` (the backends namespace routes
//!   everything back through the gateway).
//! - **gateway**: everything else the soak runs (rnacos, the agents, `ailb run` with its TC
//!   program on the gateway's two veths, `ailb gateway`, the socket-ABI and front-door load
//!   workers, the sampler): their loopback addresses (the VIP 127.77.11.1, the front door on
//!   127.0.11.248, rnacos on 127.0.0.1) work inside it as in the host's namespace, and they reach
//!   the servers through the veth.
//! - **client**: the TC load workers, one per *lane*: lane `k` connects to the TC VIP
//!   `10.201.9.(k+1):8000` from the client address `10.201.1.(10+k)` (a route to that VIP with
//!   that source), so that `remote_affinity = "client_address"` sees [`lanes`] distinct remote
//!   clients, each conversation always from the same one.
//!
//! Nothing here touches the host's interfaces: every veth is created inside the namespaces.
//!
//! The client's veth sends GSO packets as the kernel makes them (many segments, up to 64 KB),
//! which the TC path must forward as they are. It once did not: the program asked the FIB about
//! a rewritten packet with its IP total length, past the veth's MTU for a GSO packet, so the FIB
//! answered "needs fragmenting" and the packet went to the gateway's stack, which does not
//! forward a masqueraded packet whose source is the gateway's own NAT address; only the
//! single-segment retransmissions passed, and a flow with a 700 kB prompt stalled for minutes.
//! The lookups now leave the length at 0 (the kernel checks the skb against the MTU itself).
//! `--tc-client-no-gso` sets `gso_max_segs 1` on the client veth, as the soak did meanwhile.
//!
//! [`lanes`]: Net::lanes

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use ailb_tests::netns::{Topology, GATEWAY_BACKEND_SIDE, GATEWAY_CLIENT_SIDE};
use anyhow::{bail, Context};

/// The port of every TC VIP.
pub const TC_VIP_PORT: u16 = 8000;
/// The most lanes (client addresses and TC VIPs).
pub const MAX_LANES: usize = 32;

/// What the fleet needs to know of the namespaces: where the servers run and on which
/// addresses, which interfaces carry the TC program, the NAT address, the TC VIPs.
#[derive(Debug, Clone)]
pub struct TcFleet {
    /// `/run/netns/NAME` of the backends namespace.
    pub backends_ns: String,
    /// The servers' addresses, one per GPU.
    pub backend_addrs: Vec<Ipv4Addr>,
    /// The gateway's veths (towards the clients, towards the backends).
    pub interfaces: [String; 2],
    /// The masquerade source of TC flows: the gateway's address on the backends' side.
    pub nat_address: Ipv4Addr,
    /// The model's TC VIPs, one per lane.
    pub vips: Vec<SocketAddrV4>,
}

/// The soak's namespaces; deleted on drop.
pub struct Net {
    pub topo: Topology,
    pub tc: TcFleet,
}

/// The server address of GPU `i` in the backends namespace.
pub fn backend_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 2, 2 + i as u8)
}

/// The TC VIP of lane `k`.
pub fn tc_vip(k: usize) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 201, 9, 1 + k as u8), TC_VIP_PORT)
}

/// The client address of lane `k`.
pub fn client_addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 201, 1, 10 + k as u8)
}

impl Net {
    /// The three namespaces, `gpus` server addresses in the backends one, `lanes` client
    /// addresses with their routes in the client one.
    /// `client_gso`: leave the client veth's GSO as the kernel sets it.
    pub fn new(gpus: usize, lanes: usize, client_gso: bool) -> anyhow::Result<Self> {
        if lanes == 0 || lanes > MAX_LANES {
            bail!("--tc-lanes must be 1 to {MAX_LANES}, not {lanes}");
        }
        if gpus == 0 || gpus > 200 {
            bail!("the fleet's GPUs (--a100 + --rtx3090) must be 1 to 200 with the TC stream, not {gpus}");
        }
        let topo = Topology::new();
        if !client_gso {
            topo.client.ip(&["link", "set", "c0", "gso_max_segs", "1"]);
        }
        // The topology has the first three server addresses already (10.201.2.2-4).
        for i in 3..gpus {
            topo.backends.add_addr(backend_addr(i).into(), 24, "b0");
        }
        for k in 0..lanes {
            let (a, vip) = (client_addr(k), tc_vip(k));
            topo.client.add_addr(a.into(), 24, "c0");
            topo.client.ip(&[
                "route",
                "add",
                &format!("{}/32", vip.ip()),
                "via",
                &GATEWAY_CLIENT_SIDE.to_string(),
                "src",
                &a.to_string(),
            ]);
        }
        let tc = TcFleet {
            backends_ns: topo.backends.path(),
            backend_addrs: (0..gpus).map(backend_addr).collect(),
            interfaces: topo.gateway_ifaces.clone(),
            nat_address: GATEWAY_BACKEND_SIDE,
            vips: (0..lanes).map(tc_vip).collect(),
        };
        Ok(Net { topo, tc })
    }

    pub fn lanes(&self) -> usize {
        self.tc.vips.len()
    }
}

/// Runs `f` on a thread of its own that has entered the network namespace at `path`
/// (`/run/netns/NAME`): sockets it opens, threads it starts and processes it spawns live there.
pub fn in_netns<T: Send>(path: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let file = std::fs::File::open(path).with_context(|| format!("opening the network namespace {path}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a valid namespace file descriptor, open for the call; setns changes
            // only this thread's network namespace (a scoped thread, ended when `f` returns).
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if r != 0 {
                bail!("setns into {path}: {}", std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

#[cfg(test)]
mod tests;
