use super::*;

#[test]
fn every_worker_listens_on_one_port_and_another_process_gets_address_in_use() {
    let addrs = ["127.0.0.1:0".parse().unwrap()];
    let workers = bind(&addrs, 3).expect("port 0 binds");
    assert_eq!(workers.len(), 3);
    let ports: Vec<u16> = workers.iter().map(|w| w[0].local_addr().unwrap().port()).collect();
    assert!(ports[0] != 0 && ports.iter().all(|p| *p == ports[0]), "{ports:?}");
    // A second gateway on the same address is refused, as with one plain socket, rather
    // than sharing the port.
    let taken = [SocketAddr::from(([127, 0, 0, 1], ports[0]))];
    match bind(&taken, 2) {
        Err(GatewayError::Bind { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse),
        other => panic!("expected address in use, got {:?}", other.map(|w| w.len())),
    }
}

/// The kernel's view of a process's transparent huge pages (`THP_enabled` of
/// `/proc/PID/status`: 0 once `PR_SET_THP_DISABLE` is set).
fn thp_enabled(status: &str) -> Option<&str> {
    status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(str::trim)
}

#[test]
fn the_front_door_keeps_its_memory_on_small_pages() {
    small_pages_only();
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    assert_eq!(thp_enabled(&status), Some("0"), "transparent huge pages are off for the process:\n{status}");
}
