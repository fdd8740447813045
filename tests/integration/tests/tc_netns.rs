//! The TC datapath end to end, in namespaces each test makes and removes (client -- veth --
//! gateway -- veth -- backends; `ailb_tests::remote`): remote connections split by weight in
//! masquerade and routed mode, client-address affinity, and a memory hint that keeps a
//! model's remote flows off the backends without the memory. Afterwards no flow, count or NAT
//! entry is left and every in-flight counter is 0.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use ailb_tests::netns::{NetNs, CLIENT_ADDR};
use ailb_tests::remote::{assert_bulk_transfers, assert_shares, connect, connect_on, Gateway, GatewaySpec};

const CONNECTIONS: usize = 8000;

/// Opens `n` connections one after the other (each answered, then closed by the backend), from
/// the CPUs in turn, and counts them by backend index.
fn split(gw: &Gateway, spec: &GatewaySpec, n: usize) -> [usize; 3] {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut picked = [0usize; 3];
    for i in 0..n {
        let r = connect_on(&gw.topo, spec.vip, None, false, Some(i % cpus))
            .unwrap_or_else(|e| panic!("remote connection {i}: {e}"));
        picked[r.index()] += 1;
    }
    picked
}

fn counter(m: &BTreeMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

fn counters(ns: &NetNs) -> BTreeMap<String, u64> {
    ns.counters().into_iter().collect()
}

#[test]
fn remote_connections_split_1_2_5_one_flow_each_and_leave_no_flow_or_count() {
    let mut spec = GatewaySpec::new("tc-netns", true);
    spec.weights = [1, 2, 5];
    let gw = Gateway::start(&spec);
    let picked = split(&gw, &spec, CONNECTIONS);
    assert_eq!(gw.servers.counts().iter().sum::<u64>(), CONNECTIONS as u64);
    assert_shares(&gw, &picked, &spec.weights, false);
    let tc = gw.wait_no_flow("every remote flow removed", Duration::from_secs(10));
    // Exactly one flow per connection, with SYNs arriving on every CPU: a NAT port that came
    // round while a backend still held its last connection in TIME_WAIT would have been
    // answered with that connection's ACK, reset by the client and retried as a second flow
    // (with a SYN retransmission).
    let (c, b) = (counters(&gw.topo.client), counters(&gw.topo.backends));
    let diag = format!(
        "client: SYN retransmits {}, RSTs sent {}; backends: RSTs sent {}, passive opens {}; TC {tc}",
        counter(&c, "TcpExt:TCPSynRetrans"),
        counter(&c, "Tcp:OutRsts"),
        counter(&b, "Tcp:OutRsts"),
        counter(&b, "Tcp:PassiveOpens"),
    );
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(CONNECTIONS as u64), "{diag}");
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(CONNECTIONS as u64), "{diag}");
    assert_eq!(counter(&c, "TcpExt:TCPSynRetrans"), 0, "{diag}");
    assert_eq!(tc["stats"]["malformed"], 0, "{diag}");
    println!("picked {picked:?}; {diag}");
}

#[test]
fn routed_mode_keeps_the_client_address_and_splits_by_weight() {
    let mut spec = GatewaySpec::new("tc-routed", false);
    spec.weights = [1, 2, 5];
    let gw = Gateway::start(&spec);
    let picked = split(&gw, &spec, 2000);
    assert_shares(&gw, &picked, &spec.weights, false);
    // Routed: the backends see the client itself and answer it through the gateway.
    let peers = gw.servers.peers();
    assert_eq!(peers.keys().copied().collect::<Vec<_>>(), [CLIENT_ADDR], "peers seen by the backends: {peers:?}");
    let tc = gw.wait_no_flow("every routed flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(2000), "{tc}");
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(2000), "{tc}");
    println!("routed: picked {picked:?}; TC {tc}");
}

#[test]
fn client_address_affinity_sticks_and_many_addresses_spread() {
    let mut spec = GatewaySpec::new("tc-affinity", true);
    spec.model_extra = "remote_affinity = \"client_address\"\n".into();
    let gw = Gateway::start(&spec);
    let sources: Vec<Ipv4Addr> = (10..42u8).map(|i| Ipv4Addr::new(10, 201, 1, i)).collect();
    for a in &sources {
        gw.topo.client.ip(&["addr", "add", &format!("{a}/24"), "dev", "c0"]);
    }
    let mut by_source: BTreeMap<Ipv4Addr, BTreeSet<usize>> = BTreeMap::new();
    for a in &sources {
        for i in 0..8 {
            let r = connect(&gw.topo, spec.vip, Some((*a).into()), false)
                .unwrap_or_else(|e| panic!("{a} connection {i}: {e}"));
            by_source.entry(*a).or_default().insert(r.index());
        }
    }
    for (a, b) in &by_source {
        assert_eq!(b.len(), 1, "client {a} reached backends {b:?}: affinity did not stick");
    }
    let used: BTreeSet<usize> = by_source.values().flatten().copied().collect();
    assert_eq!(used.len(), 3, "32 client addresses all landed on {used:?}");
    gw.wait_no_flow("every flow removed", Duration::from_secs(10));
}

/// One client address carries many conversations, so its entry holds only while its backend is
/// under the load bound: 12 flows held open from one address spread over the backends, none
/// past the bound of the last connect (ceil(1.25 x 12 / 3) = 5 with the default load factor).
#[test]
fn a_client_address_keeps_its_backend_only_under_the_load_bound() {
    let mut spec = GatewaySpec::new("tc-affinity-bound", true);
    spec.model_extra = "remote_affinity = \"client_address\"\n".into();
    let gw = Gateway::start(&spec);
    let source = Ipv4Addr::new(10, 201, 1, 50);
    gw.topo.client.ip(&["addr", "add", &format!("{source}/24"), "dev", "c0"]);
    let mut held = Vec::new();
    for i in 0..12 {
        let r = connect(&gw.topo, spec.vip, Some(source.into()), true)
            .unwrap_or_else(|e| panic!("held connection {i} from {source}: {e}"));
        held.push(r);
    }
    let mut per_backend: BTreeMap<usize, usize> = BTreeMap::new();
    for r in &held {
        *per_backend.entry(r.index()).or_default() += 1;
    }
    assert!(per_backend.len() > 1, "12 flows held from one address all on {per_backend:?}: the entry ignored the load");
    assert!(per_backend.values().all(|&n| n <= 5), "a backend past the load bound: {per_backend:?}");
    let stats = gw.daemon.status()["stats"].clone();
    assert!(stats["affinity_breaks"].as_u64().is_some_and(|b| b > 0), "no affinity break counted: {stats}");
    drop(held);
    // Unloaded again, the address keeps one backend (its entry holds under the bound).
    let mut reached = BTreeSet::new();
    for i in 0..6 {
        let r = connect(&gw.topo, spec.vip, Some(source.into()), false)
            .unwrap_or_else(|e| panic!("connection {i} from {source}: {e}"));
        reached.insert(r.index());
    }
    assert_eq!(reached.len(), 1, "{source} reached {reached:?} with nothing in flight");
    gw.wait_no_flow("every flow removed", Duration::from_secs(10));
}

#[test]
fn a_memory_hinted_models_remote_flows_only_reach_backends_with_the_memory() {
    let mut spec = GatewaySpec::new("tc-memory", true);
    spec.model_extra = "required_memory_mb = 8000\n".into();
    spec.free_memory_mb = [Some(4000), Some(16000), Some(6000)];
    let gw = Gateway::start(&spec);
    let mut held = Vec::new();
    for i in 0..40 {
        let r = connect(&gw.topo, spec.vip, None, true).unwrap_or_else(|e| panic!("remote connection {i}: {e}"));
        assert_eq!(r.index(), 1, "connection {i} reached {} without 8000 MB free", r.backend);
        held.push(r);
    }
    // While held, the memory hint is counted against the backend, as for local connections.
    let st = gw.daemon.status();
    let mem = ailb_tests::status::inflight_mem_by_address(&st);
    assert_eq!(mem.values().copied().max(), Some(40 * 8000), "memory in flight: {mem:?}");
    drop(held);
    assert_eq!(gw.servers.counts(), [0, 40, 0]);
    gw.wait_no_flow("every flow removed", Duration::from_secs(10));
}

#[test]
fn bulk_transfers_of_gso_packets_pass_through_masquerade() {
    let spec = GatewaySpec::new("tc-bulk", true);
    assert_bulk_transfers(&spec, spec.vip);
}

#[test]
fn bulk_transfers_of_gso_packets_pass_through_routed_mode() {
    let spec = GatewaySpec::new("tc-bulk-routed", false);
    assert_bulk_transfers(&spec, spec.vip);
}
