use super::*;

#[test]
fn addresses_round_trip_in_network_order() {
    let a = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 1), 8080);
    let (addr, port) = addr_be(&a);
    assert_eq!(addr.to_ne_bytes(), [10, 1, 0, 1]);
    assert_eq!(port.to_ne_bytes(), 8080u16.to_be_bytes());
    assert_eq!(addr_from_be(addr, port), a);
}

#[test]
fn ipv6_addresses_round_trip_as_the_kernel_words() {
    let a: SocketAddrV6 = "[2001:db8::7:1]:8443".parse().unwrap();
    let (words, port) = addr6_be(&a);
    assert_eq!(words[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
    assert_eq!(words[3].to_ne_bytes(), [0, 0x07, 0, 0x01]);
    assert_eq!(port.to_ne_bytes(), 8443u16.to_be_bytes());
    assert_eq!(addr6_from_be(&words, port), a);
    let b = Backend { port, state: BACKEND_IPV6, ..Default::default() };
    assert_eq!(backend_address(&b, &BackendAddr6 { addr: words }), SocketAddr::V6(a));
    let v4 = Backend { addr: u32::from_ne_bytes([10, 0, 0, 1]), port, ..Default::default() };
    assert_eq!(backend_address(&v4, &BackendAddr6 { addr: words }), "10.0.0.1:8443".parse().unwrap());
}

#[test]
fn model_names_round_trip_and_ttls_never_read_as_unset() {
    let st = ModelState { name: name_bytes("llama-3"), ..Default::default() };
    assert_eq!(model_name(&st), "llama-3");
    assert_eq!(model_name(&ModelState::default()), "");
    assert_eq!(model_ttl_ns(None), 0);
    assert_eq!(model_ttl_ns(Some(Duration::ZERO)), 1);
    assert_eq!(model_ttl_ns(Some(Duration::from_secs(2))), 2_000_000_000);
}
