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
