//! The TC datapath over IPv6 end to end, in namespaces each test makes and removes (client --
//! veth -- gateway -- veth -- backends, unique local addresses; `ailb_tests::remote`): remote
//! IPv6 connections to an IPv6 VIP through masquerade (`nat_address6`) split by weight (and
//! the IPv6 program's run time per packet, printed), client-address affinity over IPv6, the
//! FIN, RST and idle ends with every counter and `flows_ipv6` exactly 0 after, and a
//! dual-stack model reached over both families, each family on its own backends only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ailb_tests::bpfstats::{link_prog_id, prog_array_id, prog_runs, Runs, StatsEnabled};
use ailb_tests::netns::{BACKEND_ADDRS6, GATEWAY_BACKEND_SIDE6};
use ailb_tests::remote::{assert_bulk_transfers, assert_shares, connect, connect_on, Gateway, GatewaySpec, Remote};

fn hold(gw: &Gateway, vip: impl Into<SocketAddr> + Copy, n: usize) -> Vec<Remote> {
    (0..n)
        .map(|i| connect(&gw.topo, vip, None, true).unwrap_or_else(|e| panic!("held remote connection {i}: {e}")))
        .collect()
}

/// The run counters of `ailb_tc_ingress` (behind the tcx link of the gateway's first
/// interface) and of `ailb_tc_ingress6` (in its program-array slot).
struct Progs {
    ingress: u64,
    ingress6: u64,
}

impl Progs {
    fn find(gw: &Gateway) -> Result<Self, String> {
        let dir = gw.daemon.bpffs();
        let ingress = link_prog_id(&dir.join("links").join(format!("tc-{}", gw.topo.gateway_ifaces[0])))?;
        let ingress6 = prog_array_id(&dir.join(ailb_common::maps::TC_PROGS), ailb_common::TC_PROG_IPV6)?;
        Ok(Self { ingress, ingress6 })
    }

    fn runs(&self) -> Result<(Runs, Runs), String> {
        Ok((prog_runs(self.ingress)?, prog_runs(self.ingress6)?))
    }
}

/// The IPv6 program's cost, from the runs of both programs in the new-connection phase (`new`,
/// `conns` connections) and the established phase (`est`). The kernel counts a tail-called
/// program's time in its caller's statistics (`ailb_tc_ingress6` itself stays at 0 runs), so on
/// IPv6-only traffic `ailb_tc_ingress`'s numbers are the IPv6 path's: the caller's protocol
/// check, the tail call and `ailb_tc_ingress6`.
fn report(new: (Runs, Runs), conns: u64, est: (Runs, Runs)) -> String {
    let est_ns = est.0.ns_per_run();
    let syn = (new.0.ns as f64 - (new.0.cnt - conns.min(new.0.cnt)) as f64 * est_ns) / conns.max(1) as f64;
    format!(
        "IPv6 run time (ailb_tc_ingress + tail-called ailb_tc_ingress6; ailb_tc_ingress6's own counters: \
         {} and {} runs): established only {} runs, {est_ns:.0} ns per packet; {conns} new connections {} runs, \
         {:.0} ns per packet, {:.0} ns per connection; SYN derived (phase ns - non-SYN runs x established ns) / \
         SYNs: {syn:.0} ns",
        new.1.cnt,
        est.1.cnt,
        est.0.cnt,
        new.0.cnt,
        new.0.ns_per_run(),
        new.0.ns as f64 / conns.max(1) as f64,
    )
}

#[test]
fn ipv6_remote_connections_split_1_2_5_through_masquerade_and_leave_no_flow() {
    const N: usize = 2000;
    let mut spec = GatewaySpec::ipv6("tc6-split", true);
    spec.weights6 = [1, 2, 5];
    let vip = spec.vip6.unwrap_or_else(|| panic!("an IPv6 spec without vip6"));
    let gw = Gateway::start(&spec);
    let stats = StatsEnabled::enable();
    let progs = stats.as_ref().map_err(String::clone).and_then(|_| Progs::find(&gw));
    let before = progs.as_ref().ok().and_then(|p| p.runs().ok());

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut picked = [0usize; 3];
    for i in 0..N {
        let r = connect_on(&gw.topo, vip, None, false, Some(i % cpus))
            .unwrap_or_else(|e| panic!("remote IPv6 connection {i}: {e}"));
        assert!(r.is_ipv6(), "connection {i} answered by {}", r.backend);
        picked[r.index()] += 1;
    }
    let after_new = progs.as_ref().ok().and_then(|p| p.runs().ok());
    assert_eq!(gw.servers.counts6().iter().sum::<u64>(), N as u64);
    assert_eq!(gw.servers.counts(), [0; 3], "IPv6 clients reached IPv4 backends");
    assert_shares(&gw, &picked, &spec.weights6, true);
    // Masquerade: the backends see the gateway's nat_address6, never the client.
    let peers = gw.servers.peers6();
    assert_eq!(peers.keys().copied().collect::<Vec<_>>(), [GATEWAY_BACKEND_SIDE6], "peers: {peers:?}");
    let tc = gw.wait_no_flow("every IPv6 flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(N as u64), "{tc}");
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(N as u64), "{tc}");
    assert_eq!((tc["stats"]["malformed"].as_u64(), tc["stats"]["refused"].as_u64()), (Some(0), Some(0)), "{tc}");
    println!("IPv6 masquerade: picked {picked:?}; TC {tc}");

    // Established packets alone: one-byte echoes on held connections (each echo is a data
    // segment each way plus the ACKs, all of established flows).
    let mut held = hold(&gw, vip, 16);
    let before_est = progs.as_ref().ok().and_then(|p| p.runs().ok());
    for round in 0..100 {
        for (i, r) in held.iter_mut().enumerate() {
            r.echo(b"x").unwrap_or_else(|e| panic!("echo {round} on held connection {i}: {e}"));
        }
    }
    let after_est = progs.as_ref().ok().and_then(|p| p.runs().ok());
    drop(held);
    gw.wait_no_flow("the held IPv6 flows removed", Duration::from_secs(10));
    match (&progs, before, after_new, before_est, after_est) {
        (Ok(_), Some(b), Some(a), Some(be), Some(ae)) => {
            let new = (a.0.since(b.0), a.1.since(b.1));
            println!("{}", report(new, N as u64, (ae.0.since(be.0), ae.1.since(be.1))));
        }
        (Err(e), ..) => println!("run time: skipped ({e})"),
        _ => println!("run time: skipped (bpftool prog show failed)"),
    }
}

#[test]
fn ipv6_client_address_affinity_sticks_and_many_addresses_spread() {
    let mut spec = GatewaySpec::ipv6("tc6-affinity", true);
    spec.model_extra = "remote_affinity = \"client_address\"\n".into();
    let vip = spec.vip6.unwrap_or_else(|| panic!("an IPv6 spec without vip6"));
    let gw = Gateway::start(&spec);
    let sources: Vec<Ipv6Addr> = (0x10..0x30u16).map(|i| Ipv6Addr::new(0xfd00, 0xa1b, 1, 0, 0, 0, 0, i)).collect();
    for a in &sources {
        gw.topo.client.add_addr((*a).into(), 64, "c0");
    }
    let mut by_source: BTreeMap<Ipv6Addr, BTreeSet<usize>> = BTreeMap::new();
    for a in &sources {
        for i in 0..6 {
            let r = connect(&gw.topo, vip, Some(IpAddr::V6(*a)), false)
                .unwrap_or_else(|e| panic!("{a} connection {i}: {e}"));
            by_source.entry(*a).or_default().insert(r.index());
        }
    }
    for (a, b) in &by_source {
        assert_eq!(b.len(), 1, "client {a} reached backends {b:?}: affinity did not stick");
    }
    let used: BTreeSet<usize> = by_source.values().flatten().copied().collect();
    assert_eq!(used.len(), 3, "{} client addresses all landed on {used:?}", sources.len());
    let tc = gw.wait_no_flow("every flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(6 * sources.len() as u64), "{tc}");
}

#[test]
fn ipv6_fin_and_rst_ends_leave_every_counter_at_0() {
    let mut spec = GatewaySpec::ipv6("tc6-ends", true);
    spec.model_extra = "required_memory_mb = 1000\n".into();
    let vip = spec.vip6.unwrap_or_else(|| panic!("an IPv6 spec without vip6"));
    let gw = Gateway::start(&spec);
    // FIN: the client closes held connections normally.
    let mut held = hold(&gw, vip, 5);
    for (i, r) in held.iter_mut().enumerate() {
        r.echo(b"ping").unwrap_or_else(|e| panic!("held connection {i}: {e}"));
    }
    let tc = gw.tc();
    assert_eq!((tc["counted"].as_u64(), tc["flows_ipv6"].as_u64()), (Some(5), Some(5)), "{tc}");
    drop(held);
    let tc = gw.wait_no_flow("the FIN-closed IPv6 flows removed", Duration::from_secs(10));
    let ends = |tc: &serde_json::Value| {
        ["flows_closed", "ended_rst", "ended_idle"].map(|k| tc["stats"][k].as_u64().unwrap_or(u64::MAX))
    };
    assert_eq!(ends(&tc), [5, 0, 0], "closed, RST, idle after the FIN ends: {tc}");
    // RST: SO_LINGER 0.
    let held = hold(&gw, vip, 6);
    assert_eq!(gw.tc()["counted"], 6, "{}", gw.tc());
    for r in held {
        r.reset();
    }
    let tc = gw.wait_no_flow("the reset IPv6 flows removed", Duration::from_secs(10));
    assert_eq!(ends(&tc), [11, 6, 0], "closed, RST, idle after the RST ends: {tc}");
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(11), "{tc}");
}

#[test]
fn ipv6_idle_flows_are_reclaimed_with_every_counter_at_0() {
    let mut spec = GatewaySpec::ipv6("tc6-idle", true);
    spec.tc = "idle_timeout = \"2s\"\n".into();
    let vip = spec.vip6.unwrap_or_else(|| panic!("an IPv6 spec without vip6"));
    let gw = Gateway::start(&spec);
    let held = hold(&gw, vip, 4);
    let tc = gw.tc();
    assert_eq!((tc["counted"].as_u64(), tc["flows_ipv6"].as_u64()), (Some(4), Some(4)), "{tc}");
    // Silent connections: the daemon's reclaim run removes them after 2 s without a packet.
    let tc = gw.wait_no_flow("the idle IPv6 flows reclaimed", Duration::from_secs(15));
    assert_eq!(tc["stats"]["ended_idle"].as_u64(), Some(4), "{tc}");
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(4), "{tc}");
    drop(held);
}

#[test]
fn a_dual_stack_model_is_reached_over_both_families_each_on_its_own_backends() {
    const N: usize = 300;
    let mut spec = GatewaySpec::new("tc6-dual", true);
    spec.vip6 = Some(ailb_tests::remote::VIP6);
    let (vip4, vip6) = (spec.vip, ailb_tests::remote::VIP6);
    let gw = Gateway::start(&spec);
    let (mut by4, mut by6) = ([0usize; 3], [0usize; 3]);
    for i in 0..N {
        let r = connect(&gw.topo, vip4, None, false).unwrap_or_else(|e| panic!("IPv4 connection {i}: {e}"));
        assert!(!r.is_ipv6(), "IPv4 connection {i} answered by {}", r.backend);
        by4[r.index()] += 1;
        let r = connect(&gw.topo, vip6, None, false).unwrap_or_else(|e| panic!("IPv6 connection {i}: {e}"));
        assert!(r.is_ipv6(), "IPv6 connection {i} answered by {}", r.backend);
        by6[r.index()] += 1;
    }
    assert!(by4.iter().chain(&by6).all(|n| *n > 0), "a backend unused: IPv4 {by4:?}, IPv6 {by6:?}");
    assert_eq!(gw.servers.counts().map(|n| n as usize), by4);
    assert_eq!(gw.servers.counts6().map(|n| n as usize), by6);
    let tc = gw.wait_no_flow("every flow of both families removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(2 * N as u64), "{tc}");
    assert_eq!(tc["stats"]["refused"].as_u64(), Some(0), "{tc}");
    println!("dual stack: IPv4 {by4:?}, IPv6 {by6:?} over {:?}", BACKEND_ADDRS6);
}

#[test]
fn bulk_transfers_of_gso_packets_pass_through_masquerade_over_ipv6() {
    let spec = GatewaySpec::ipv6("tc-bulk6", true);
    assert_bulk_transfers(&spec, spec.vip6.unwrap_or_else(|| panic!("an IPv6 spec without vip6")));
}
