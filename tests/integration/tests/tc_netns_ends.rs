//! How remote flows end and what survives, end to end in namespaces each test makes and
//! removes (`ailb_tests::remote`): the RST end and the idle-timeout end leave every counter at
//! exactly 0; `kill -9` of the daemon keeps open flows passing bytes and new connections
//! working, and a restarted daemon takes over; `ailb teardown` leaves no TC program on the
//! gateway's interfaces; and the load bound of local connections counts the remote ones.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use ailb_tests::netns::{Topology, BACKEND_ADDRS};
use ailb_tests::remote::{connect, Gateway, GatewaySpec, Remote, BACKEND_PORT};
use ailb_tests::{client::count_by_backend, run_cmd, ConnectOpts, TestClient};

fn hold(gw: &Gateway, spec: &GatewaySpec, n: usize) -> Vec<Remote> {
    (0..n)
        .map(|i| connect(&gw.topo, spec.vip, None, true).unwrap_or_else(|e| panic!("held remote connection {i}: {e}")))
        .collect()
}

fn in_flight_total(gw: &Gateway) -> u64 {
    ailb_tests::status::inflight_by_address(&gw.daemon.status()).values().sum()
}

#[test]
fn an_rst_ends_remote_flows_with_every_counter_at_0() {
    let mut spec = GatewaySpec::new("tc-rst", true);
    spec.model_extra = "required_memory_mb = 1000\n".into();
    spec.listen = true;
    let gw = Gateway::start(&spec);
    let mut held = hold(&gw, &spec, 6);
    for (i, r) in held.iter_mut().enumerate() {
        r.echo(b"ping").unwrap_or_else(|e| panic!("held connection {i}: {e}"));
    }
    assert_eq!(gw.tc()["counted"], 6, "{}", gw.tc());
    assert_eq!(in_flight_total(&gw), 6);
    for r in held {
        r.reset();
    }
    let tc = gw.wait_no_flow("every reset flow removed", Duration::from_secs(10));
    assert_eq!((tc["stats"]["flows_closed"].as_u64(), tc["stats"]["flows_reclaimed"].as_u64()), (Some(6), Some(0)));
    assert_eq!(tc["stats"]["ended_rst"].as_u64(), Some(6), "{tc}");
    // The same counters on the daemon's /metrics.
    let text = gw.metrics();
    for line in [
        "ailb_tc_flows 0",
        "ailb_tc_flows_counted 0",
        "ailb_tc_nat_ports_in_use 0",
        "ailb_tc_flows_opened_total 6",
        "ailb_tc_flows_ended_total{reason=\"rst\"} 6",
        "ailb_tc_flows_ended_total{reason=\"fin\"} 0",
        "ailb_tc_flows_ended_total{reason=\"idle\"} 0",
        "ailb_tc_dropped_total{reason=\"malformed\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not on /metrics:\n{text}");
    }
}

#[test]
fn an_idle_timeout_ends_remote_flows_with_every_counter_at_0() {
    let mut spec = GatewaySpec::new("tc-idle", true);
    spec.listen = true;
    spec.tc = "idle_timeout = \"2s\"\n".into();
    spec.model_extra = "required_memory_mb = 1000\n".into();
    let gw = Gateway::start(&spec);
    let held = hold(&gw, &spec, 4);
    assert_eq!(gw.tc()["counted"], 4, "{}", gw.tc());
    // Silent connections: the daemon's reclaim run removes them after 2 s without a packet.
    let tc = gw.wait_no_flow("the idle flows reclaimed", Duration::from_secs(15));
    assert_eq!((tc["stats"]["flows_reclaimed"].as_u64(), tc["stats"]["flows_closed"].as_u64()), (Some(4), Some(4)));
    assert_eq!(tc["stats"]["ended_idle"].as_u64(), Some(4), "{tc}");
    let text = gw.metrics();
    assert!(
        text.lines().any(|l| l == "ailb_tc_flows_ended_total{reason=\"idle\"} 4"),
        "idle ends not on /metrics:\n{text}"
    );
    drop(held);
}

#[test]
fn kill_9_keeps_remote_flows_and_new_connections_and_a_restarted_daemon_takes_over() {
    let spec = GatewaySpec::new("tc-kill9", true);
    let mut gw = Gateway::start(&spec);
    let mut held = hold(&gw, &spec, 5);
    gw.daemon.kill9();
    for (i, r) in held.iter_mut().enumerate() {
        r.echo(b"still there").unwrap_or_else(|e| panic!("held connection {i} after kill -9: {e}"));
    }
    for i in 0..50 {
        connect(&gw.topo, spec.vip, None, false).unwrap_or_else(|e| panic!("new connection {i} without a daemon: {e}"));
    }
    gw.daemon.restart();
    let tc = gw.tc();
    assert_eq!((tc["flows"].as_u64(), tc["counted"].as_u64()), (Some(5), Some(5)), "after the restart: {tc}");
    for (i, r) in held.iter_mut().enumerate() {
        r.echo(b"after the restart").unwrap_or_else(|e| panic!("held connection {i} after the restart: {e}"));
    }
    for i in 0..50 {
        connect(&gw.topo, spec.vip, None, false)
            .unwrap_or_else(|e| panic!("new connection {i} after the restart: {e}"));
    }
    drop(held);
    let tc = gw.wait_no_flow("every flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(105), "{tc}");
    assert_eq!(tc["stats"]["flows_closed"].as_u64(), Some(105), "{tc}");
}

/// The names of the programs on `iface`'s tcx ingress in `topo`'s gateway namespace, as the
/// kernel lists them (bpftool before 7.3 does not show tcx).
fn tcx_ingress(topo: &Topology, iface: &str) -> Vec<String> {
    let iface = iface.to_string();
    topo.gateway.run(move || {
        let (_, progs) = aya::programs::SchedClassifier::query_tcx(&iface, aya::programs::TcAttachType::Ingress)
            .unwrap_or_else(|e| panic!("query tcx ingress of {iface}: {e}"));
        progs.iter().map(|p| p.name_as_str().unwrap_or("?").to_string()).collect()
    })
}

#[test]
fn teardown_leaves_no_tc_program_on_the_gateways_interfaces() {
    let spec = GatewaySpec::new("tc-teardown", true);
    let mut gw = Gateway::start(&spec);
    for iface in &gw.topo.gateway_ifaces {
        let progs = tcx_ingress(&gw.topo, iface);
        assert_eq!(progs, ["ailb_tc_ingress"], "{iface}: tcx ingress before teardown");
    }
    gw.daemon.teardown();
    for iface in &gw.topo.gateway_ifaces {
        let progs = tcx_ingress(&gw.topo, iface);
        assert!(progs.is_empty(), "{iface}: tcx ingress after teardown: {progs:?}");
        let out = run_cmd(
            Command::new("nsenter")
                .arg(format!("--net={}", gw.topo.gateway.path()))
                .args(["--", "tc", "filter", "show", "dev", iface, "ingress"]),
            Duration::from_secs(10),
        );
        let filters = String::from_utf8_lossy(&out.stdout);
        assert!(!filters.contains("ailb"), "{iface}: a clsact filter after teardown: {filters}");
    }
}

#[test]
fn the_load_bound_of_local_connections_counts_held_remote_flows() {
    // Remote flows spread under the load bound too (a client address's entry holds only under
    // it), so they cannot be piled on one backend: 12 are held where the pick puts them, and
    // the 12 local connections that follow must keep every backend's total, remote and local,
    // within the bound of the last connect: ceil(1.25 x 24 / 3) = 10 over 3 equal backends.
    let mut spec = GatewaySpec::new("tc-bound", true);
    spec.model_extra = "remote_affinity = \"client_address\"\n".into();
    let gw = Gateway::start(&spec);
    let remote = hold(&gw, &spec, 12);
    let inflight = ailb_tests::status::inflight_by_address(&gw.daemon.status());
    assert_eq!(inflight.values().sum::<u64>(), 12, "remote flows counted at their backends: {inflight:?}");
    let client = TestClient::new(ailb_tests::client_bin!()).wrapped(vec![
        "nsenter".into(),
        format!("--net={}", gw.topo.gateway.path()),
        "--".into(),
    ]);
    let local = client.hold(Some(&gw.cg), &ConnectOpts::new(&spec.vip.to_string(), 12));
    let by: BTreeMap<String, usize> = count_by_backend(local.results());
    assert_eq!(by.values().sum::<usize>(), 12, "local connections: {:?}", local.results());
    let backends: Vec<String> = BACKEND_ADDRS.iter().map(|a| format!("{a}:{BACKEND_PORT}")).collect();
    assert!(by.keys().all(|b| backends.contains(b)), "{by:?}");
    let total = ailb_tests::status::inflight_by_address(&gw.daemon.status());
    assert_eq!(total.values().sum::<u64>(), 24, "remote and local in flight: {total:?}");
    assert!(
        total.values().all(|&n| n <= 10),
        "a backend past the load bound: {total:?} (remote {inflight:?}, local {by:?})"
    );
    local.release();
    drop(remote);
    gw.wait_no_flow("every flow removed", Duration::from_secs(10));
}
