//! Routed mode (`[daemon.tc] mode = "routed"`: the destination rewritten, the client's own
//! address kept, the backends answering it through the gateway) end to end over IPv4 and
//! IPv6, in namespaces each test makes and removes (`ailb_tests::remote`): the split by
//! weight over IPv6, and how flows end (FIN, RST, idle, and a backend process killed with
//! SIGKILL mid-flow), each with every counter exactly 0 after.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ailb_tests::netns::{BACKEND_ADDRS, BACKEND_ADDRS6, CLIENT_ADDR, CLIENT_ADDR6};
use ailb_tests::remote::{
    assert_shares, connect, connect_on, BackendProcess, Gateway, GatewaySpec, Remote, BACKEND_PORT, VIP6,
};
use serde_json::Value;

/// The port of backend 0 when a test serves it from a process of its own.
const PROCESS_PORT: u16 = BACKEND_PORT + 1;

fn hold(gw: &Gateway, vip: SocketAddr, n: usize) -> Vec<Remote> {
    (0..n)
        .map(|i| connect(&gw.topo, vip, None, true).unwrap_or_else(|e| panic!("held connection {i} to {vip}: {e}")))
        .collect()
}

/// (flows closed, ended by RST, ended idle).
fn ends(tc: &Value) -> [u64; 3] {
    ["flows_closed", "ended_rst", "ended_idle"].map(|k| tc["stats"][k].as_u64().unwrap_or(u64::MAX))
}

/// FIN ends, RST ends, then SIGKILL of the backend process serving backend 0 while flows to
/// it are open: the kernel closes the dead process's sockets (a FIN, which uncounts those
/// flows: FIN ends), the client's next segment meets the closed socket, whose RST removes
/// the flows' entries; the other flows go on, and after all closed every counter is 0.
fn fin_rst_and_killed_backend(gw: &Gateway, vip: SocketAddr, process: &mut BackendProcess) {
    let tc = gw.tc();
    let (base, opened) = (ends(&tc), tc["stats"]["flows_opened"].as_u64().unwrap_or(u64::MAX));
    let since = |tc: &Value| {
        let e = ends(tc);
        [e[0] - base[0], e[1] - base[1], e[2] - base[2]]
    };
    let mut held = hold(gw, vip, 6);
    for (i, r) in held.iter_mut().enumerate() {
        r.echo(b"ping").unwrap_or_else(|e| panic!("held connection {i}: {e}"));
    }
    assert_eq!(gw.tc()["counted"], 6, "{}", gw.tc());
    drop(held);
    let tc = gw.wait_no_flow("the FIN-closed flows removed", Duration::from_secs(10));
    assert_eq!(since(&tc), [6, 0, 0], "closed, RST, idle after the FIN ends: {tc}");

    for r in hold(gw, vip, 6) {
        r.reset();
    }
    let tc = gw.wait_no_flow("the reset flows removed", Duration::from_secs(10));
    assert_eq!(since(&tc), [12, 6, 0], "closed, RST, idle after the RST ends: {tc}");

    // Held connections until backend 0 (the process) has two and the others one at least.
    let (mut victims, mut others) = (Vec::new(), Vec::new());
    for i in 0..60 {
        if victims.len() >= 2 && !others.is_empty() {
            break;
        }
        let r = connect(&gw.topo, vip, None, true).unwrap_or_else(|e| panic!("held connection {i}: {e}"));
        if r.backend_addr() == process.addr {
            victims.push(r);
        } else {
            others.push(r);
        }
    }
    assert!(victims.len() >= 2 && !others.is_empty(), "60 connections: {} to {}", victims.len(), process.addr);
    let n = (victims.len() + others.len()) as u64;
    assert_eq!(gw.tc()["counted"].as_u64(), Some(n), "{}", gw.tc());
    process.kill9();
    for (i, r) in victims.iter_mut().enumerate() {
        assert!(r.echo(b"anyone?").is_err(), "held connection {i} to the killed backend still echoes");
    }
    let left = others.len() as u64;
    let tc = ailb_tests::wait_until("the killed backend's flows removed", Duration::from_secs(10), || {
        let tc = gw.tc();
        (tc["counted"].as_u64() == Some(left) && tc["flows"].as_u64() == Some(left)).then_some(tc)
    });
    let killed = victims.len() as u64;
    assert_eq!(since(&tc), [12 + killed, 6, 0], "closed, RST, idle after the kill: {tc}");
    for (i, r) in others.iter_mut().enumerate() {
        r.echo(b"still here").unwrap_or_else(|e| panic!("held connection {i} to a live backend: {e}"));
    }
    drop((victims, others));
    let tc = gw.wait_no_flow("every flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(opened + 12 + n), "{tc}");
    println!("routed ends over {vip}: {tc}");
}

#[test]
fn routed_ipv4_flows_end_by_fin_rst_and_a_killed_backend_with_every_counter_at_0() {
    let mut spec = GatewaySpec::new("tc-routed-ends", false);
    spec.ports[0] = PROCESS_PORT;
    let gw = Gateway::start(&spec);
    let mut process =
        BackendProcess::start(&gw.topo, ailb_tests::client_bin!(), SocketAddr::from((BACKEND_ADDRS[0], PROCESS_PORT)));
    fin_rst_and_killed_backend(&gw, spec.vip.into(), &mut process);
    let peers = gw.servers.peers();
    assert_eq!(peers.keys().copied().collect::<Vec<_>>(), [CLIENT_ADDR], "peers seen by the backends: {peers:?}");
}

#[test]
fn routed_ipv6_splits_1_2_5_keeps_the_client_address_and_ends_with_every_counter_at_0() {
    const N: usize = 4000;
    let mut spec = GatewaySpec::ipv6("tc6-routed", false);
    spec.weights6 = [1, 2, 5];
    spec.ports[0] = PROCESS_PORT;
    let gw = Gateway::start(&spec);
    let mut process =
        BackendProcess::start(&gw.topo, ailb_tests::client_bin!(), SocketAddr::from((BACKEND_ADDRS6[0], PROCESS_PORT)));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut picked = [0usize; 3];
    for i in 0..N {
        let r = connect_on(&gw.topo, VIP6, None, false, Some(i % cpus))
            .unwrap_or_else(|e| panic!("routed IPv6 connection {i}: {e}"));
        assert!(r.is_ipv6(), "connection {i} answered by {}", r.backend);
        picked[r.index()] += 1;
    }
    let stats = gw.daemon.status()["stats"].clone();
    println!("routed IPv6: picked {picked:?}, pick stats {stats}");
    assert_shares(&gw, &picked, &spec.weights6, true);
    let tc = gw.wait_no_flow("every routed IPv6 flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(N as u64), "{tc}");
    assert_eq!(ends(&tc), [N as u64, 0, 0], "closed, RST, idle after the split: {tc}");
    fin_rst_and_killed_backend(&gw, VIP6.into(), &mut process);
    let peers = gw.servers.peers6();
    assert_eq!(peers.keys().copied().collect::<Vec<_>>(), [CLIENT_ADDR6], "peers seen by the backends: {peers:?}");
}

#[test]
fn routed_idle_flows_of_both_families_are_reclaimed_with_every_counter_at_0() {
    let mut spec = GatewaySpec::new("tc-routed-idle", false);
    spec.vip6 = Some(VIP6);
    spec.tc = "idle_timeout = \"2s\"\n".into();
    let gw = Gateway::start(&spec);
    let mut held = hold(&gw, spec.vip.into(), 2);
    held.extend(hold(&gw, VIP6.into(), 2));
    let tc = gw.tc();
    assert_eq!((tc["counted"].as_u64(), tc["flows_ipv6"].as_u64()), (Some(4), Some(2)), "{tc}");
    // Silent connections: the daemon's reclaim run removes them after 2 s without a packet.
    let tc = gw.wait_no_flow("the idle flows reclaimed", Duration::from_secs(15));
    assert_eq!(ends(&tc), [4, 0, 4], "closed, RST, idle: {tc}");
    let families: Vec<bool> = held.iter().map(|r| matches!(r.backend_addr().ip(), IpAddr::V6(_))).collect();
    assert_eq!(families, [false, false, true, true], "each family on its own backends");
    drop(held);
}
