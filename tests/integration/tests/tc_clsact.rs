//! The clsact (netlink) attachment of the TC datapath, the one for kernels without tcx, chosen
//! here explicitly (`[daemon.tc] attach = "clsact"`) in namespaces the test makes and removes:
//! the filter is on both of the gateway's interfaces (and no tcx link), remote connections
//! split by weight through it, it keeps forwarding after `kill -9` of the daemon, and
//! `ailb teardown` removes the filters; IPv6 goes through the same filter (the program it
//! holds tail-calls the IPv6 one).

use std::process::Command;
use std::time::Duration;

use ailb_tests::netns::Topology;
use ailb_tests::remote::{assert_shares, connect, Gateway, GatewaySpec};
use ailb_tests::run_cmd;

/// `ARGS...` inside the gateway namespace; its stdout.
fn in_gateway(topo: &Topology, args: &[&str]) -> String {
    let out = run_cmd(
        Command::new("nsenter").arg(format!("--net={}", topo.gateway.path())).arg("--").args(args),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ingress_filters(topo: &Topology, iface: &str) -> String {
    in_gateway(topo, &["tc", "filter", "show", "dev", iface, "ingress"])
}

#[test]
fn clsact_attach_forwards_survives_kill_9_and_teardown_removes_the_filters() {
    let mut spec = GatewaySpec::new("tc-clsact", true);
    spec.weights = [1, 2, 5];
    spec.tc = "attach = \"clsact\"\n".into();
    let mut gw = Gateway::start(&spec);
    for iface in &gw.topo.gateway_ifaces {
        let filters = ingress_filters(&gw.topo, iface);
        assert!(
            filters.contains("ailb_tc_ingress") && filters.contains("direct-action"),
            "{iface}: no ailb filter on clsact ingress: {filters}"
        );
    }
    let net = in_gateway(&gw.topo, &["bpftool", "net", "show"]);
    assert!(!net.contains("tcx/ingress"), "attach = \"clsact\" made a tcx link: {net}");
    let tc = gw.tc();
    let mut listed: Vec<String> = tc["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("tc.interfaces: {tc}"))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    listed.sort();
    let mut want = gw.topo.gateway_ifaces.to_vec();
    want.sort();
    assert_eq!(listed, want, "status lists the clsact interfaces");

    let mut picked = [0usize; 3];
    for i in 0..800 {
        let r = connect(&gw.topo, spec.vip, None, false).unwrap_or_else(|e| panic!("remote connection {i}: {e}"));
        picked[r.index()] += 1;
    }
    assert_shares(&gw, &picked, &spec.weights, false);
    // Fail-static: the filter holds the program, not the daemon.
    let mut held = connect(&gw.topo, spec.vip, None, true).unwrap_or_else(|e| panic!("held connection: {e}"));
    gw.daemon.kill9();
    held.echo(b"no daemon").unwrap_or_else(|e| panic!("held connection after kill -9: {e}"));
    for i in 0..20 {
        connect(&gw.topo, spec.vip, None, false).unwrap_or_else(|e| panic!("new connection {i} after kill -9: {e}"));
    }
    gw.daemon.restart();
    drop(held);
    let tc = gw.wait_no_flow("every flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(821), "{tc}");

    gw.daemon.teardown();
    for iface in &gw.topo.gateway_ifaces {
        let filters = ingress_filters(&gw.topo, iface);
        assert!(!filters.contains("ailb_tc_ingress"), "{iface}: a filter is left after teardown: {filters}");
    }
}

#[test]
fn clsact_attach_carries_ipv6_through_the_tail_called_program() {
    let mut spec = GatewaySpec::new("tc-clsact6", true);
    spec.vip6 = Some(ailb_tests::remote::VIP6);
    spec.tc = "attach = \"clsact\"\n".into();
    let mut gw = Gateway::start(&spec);
    for i in 0..100 {
        let r = connect(&gw.topo, ailb_tests::remote::VIP6, None, false)
            .unwrap_or_else(|e| panic!("IPv6 connection {i} through clsact: {e}"));
        assert!(r.is_ipv6(), "IPv6 connection {i} answered by {}", r.backend);
        let r = connect(&gw.topo, spec.vip, None, false).unwrap_or_else(|e| panic!("IPv4 connection {i}: {e}"));
        assert!(!r.is_ipv6(), "IPv4 connection {i} answered by {}", r.backend);
    }
    assert_eq!(gw.servers.counts6().iter().sum::<u64>(), 100);
    let tc = gw.wait_no_flow("every flow removed", Duration::from_secs(10));
    assert_eq!(tc["stats"]["flows_opened"].as_u64(), Some(200), "{tc}");
    gw.daemon.teardown();
    for iface in &gw.topo.gateway_ifaces {
        let filters = ingress_filters(&gw.topo, iface);
        assert!(!filters.contains("ailb_tc_ingress"), "{iface}: a filter is left after teardown: {filters}");
    }
}
