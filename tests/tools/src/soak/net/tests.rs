use super::*;

#[test]
fn every_lane_has_its_own_vip_and_client_address() {
    let vips: std::collections::BTreeSet<_> = (0..MAX_LANES).map(tc_vip).collect();
    let clients: std::collections::BTreeSet<_> = (0..MAX_LANES).map(client_addr).collect();
    assert_eq!((vips.len(), clients.len()), (MAX_LANES, MAX_LANES));
    assert_eq!(tc_vip(0).to_string(), "10.201.9.1:8000");
    assert_eq!(backend_addr(0), Ipv4Addr::new(10, 201, 2, 2), "the topology's first server address");
    assert!(!clients.contains(&GATEWAY_CLIENT_SIDE) && !clients.contains(&ailb_tests::netns::CLIENT_ADDR));
}

#[test]
fn the_lanes_are_checked() {
    let e = Net::new(6, 0, false).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("--tc-lanes") && e.contains('0'), "{e}");
    let e = Net::new(6, MAX_LANES + 1, false).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("--tc-lanes") && e.contains("33"), "{e}");
}
