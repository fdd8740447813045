//! `BPF_PROG_TEST_RUN` fixtures of the TC program's IPv6 path: the rewrite both ways (bytes,
//! and the TCP checksum recomputed here from its definition over the IPv6 pseudo-header), the
//! close by FIN and by RST with the counters back at exactly 0, the idle reclaim of IPv6
//! flows, IPv6 backends only (a mixed model's IPv4 backend is never picked; a model with only
//! IPv4 backends refuses), and the hostile classes: fragments, extension headers, truncated
//! headers, a bad checksum, traffic to no VIP; and the entry time written once per step, as
//! for IPv4 (the flows' lifecycle is one code for both families).

mod tc_support;

use std::net::Ipv6Addr;

use ailb_common::{FLOW_COUNT, FLOW_FORWARD, FLOW_REPLY, TC_MODE_MASQUERADE, TC_MODE_ROUTED};
use ailb_tests::packet::{
    endpoints6, tcp6_checksum, Ext6, Frame6, ETH_HLEN, IP6_HLEN, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
};
use std::net::Ipv4Addr;
use tc_support::{Fixture, Setup, CLIENT6, NAT6, TC_ACT_OK, TC_ACT_SHOT, VIP6};

const A1: (Ipv4Addr, u16, u32) = (Ipv4Addr::new(10, 99, 0, 11), 9001, 100);
const C1: (Ipv6Addr, u16, u32) = (Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x11), 9011, 200);
const C2: (Ipv6Addr, u16, u32) = (Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x12), 9012, 500);

/// A model of one IPv4 backend (id 0, weight 100) and two IPv6 ones (ids 1 and 2).
fn mixed(mode: u32) -> Setup {
    let mut s = Setup::new(mode, &[A1]);
    s.backends6 = vec![C1, C2];
    s
}

/// The id of the IPv6 backend at `addr`.
fn backend6_of(setup: &Setup, addr: (Ipv6Addr, u16)) -> u32 {
    let i = setup.backends6.iter().position(|b| (b.0, b.1) == addr).expect("rewritten to a configured IPv6 backend");
    (setup.backends.len() + i) as u32
}

/// A SYN from `client` to the IPv6 VIP, rewritten: (verdict, frame out, backend id).
fn open6(f: &Fixture, setup: &Setup, client: (Ipv6Addr, u16)) -> (u32, Vec<u8>, u32) {
    let (verdict, out) = f.run(&Frame6::tcp(client, VIP6, TCP_SYN).build());
    let id = if verdict == TC_ACT_SHOT { u32::MAX } else { backend6_of(setup, endpoints6(&out).1) };
    (verdict, out, id)
}

#[test]
fn masquerade6_rewrites_both_ways_and_a_fin_close_leaves_nothing() {
    let mut setup = mixed(TC_MODE_MASQUERADE);
    setup.tc_model.required_mem_mb = 4000;
    let f = Fixture::new(&setup);
    let syn = Frame6::tcp(CLIENT6, VIP6, TCP_SYN).build();
    let (verdict, out, id) = open6(&f, &setup, CLIENT6);
    // No interface to redirect to under BPF_PROG_TEST_RUN: the rewritten SYN goes to the stack.
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(tcp6_checksum(&out), 0, "TCP checksum of the rewritten SYN, recomputed from scratch");
    let ((src, sport), dst) = endpoints6(&out);
    assert_eq!(src, NAT6);
    assert!((setup.ports.0..=setup.ports.1).contains(&sport), "NAT port {sport} outside the range");
    let b = setup.backends6[id as usize - 1];
    assert_eq!(dst, (b.0, b.1));
    // Only the addresses (8..40 of the IPv6 header), ports and the TCP checksum changed.
    let (ip, tcp) = (ETH_HLEN, ETH_HLEN + IP6_HLEN);
    for i in (0..syn.len()).filter(|&i| !(ip + 8..ip + 40).contains(&i) && !(tcp..tcp + 4).contains(&i)) {
        if i != tcp + 16 && i != tcp + 17 {
            assert_eq!(out[i], syn[i], "byte {i} changed");
        }
    }
    assert_eq!(f.flows6().len(), 3, "forward, reply and count entries: {:?}", f.flows6());
    assert!(f.flows().is_empty(), "no IPv4 flow entry for an IPv6 flow");
    assert_eq!(f.counts(id), (1, 1, 4000), "counted in the same in-flight counters as an IPv4 flow");

    let reply = |flags| Frame6::tcp((b.0, b.1), (NAT6, sport), flags).build();
    let (verdict, back) = f.run(&reply(TCP_SYN | TCP_ACK));
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(tcp6_checksum(&back), 0);
    assert_eq!(endpoints6(&back), (VIP6, CLIENT6));

    let mut data = Frame6::tcp(CLIENT6, VIP6, TCP_ACK);
    data.payload = b"GET /v1/models HTTP/1.1\r\n\r\n".to_vec();
    let (verdict, out) = f.run(&data.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(tcp6_checksum(&out), 0, "a segment with data");
    assert_eq!(endpoints6(&out), ((NAT6, sport), (b.0, b.1)));
    assert_eq!(f.run(&Frame6::tcp(CLIENT6, VIP6, TCP_FIN | TCP_ACK).build()).0, TC_ACT_OK);
    assert_eq!(f.counts(id), (0, 0, 0), "a FIN ends the count");
    assert_eq!(f.flows6().len(), 2, "the flow's entries stay for the rest of the close");
    let (verdict, back) = f.run(&reply(TCP_FIN | TCP_ACK));
    assert_eq!((verdict, endpoints6(&back)), (TC_ACT_OK, (VIP6, CLIENT6)));
    let (verdict, out) = f.run(&Frame6::tcp(CLIENT6, VIP6, TCP_ACK).build());
    assert_eq!((verdict, endpoints6(&out).1), (TC_ACT_OK, (b.0, b.1)), "the last ACK is still rewritten");
    assert!(f.flows6().is_empty(), "entries left after the close: {:?}", f.flows6());
    assert_eq!(f.counts(id), (0, 0, 0));
    let s = f.tc_stats();
    assert_eq!((s.flows_opened, s.flows_closed, s.malformed), (1, 1, 0), "the same counters as IPv4");
    assert_eq!((s.ended_fin(), s.ended_rst, s.ended_idle), (1, 0, 0));
}

#[test]
fn routed6_rewrites_the_destination_only_and_an_rst_ends_the_flow() {
    let setup = mixed(TC_MODE_ROUTED);
    let f = Fixture::new(&setup);
    let (verdict, out, id) = open6(&f, &setup, CLIENT6);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(tcp6_checksum(&out), 0);
    let b = setup.backends6[id as usize - 1];
    assert_eq!(endpoints6(&out), (CLIENT6, (b.0, b.1)));
    let (verdict, back) = f.run(&Frame6::tcp((b.0, b.1), CLIENT6, TCP_SYN | TCP_ACK).build());
    assert_eq!((verdict, tcp6_checksum(&back), endpoints6(&back)), (TC_ACT_OK, 0, (VIP6, CLIENT6)));
    assert_eq!(f.counts(id).0, 1);
    let (verdict, back) = f.run(&Frame6::tcp((b.0, b.1), CLIENT6, TCP_RST).build());
    assert_eq!((verdict, endpoints6(&back)), (TC_ACT_OK, (VIP6, CLIENT6)));
    assert_eq!(tcp6_checksum(&back), 0);
    assert!(f.flows6().is_empty());
    assert_eq!(f.counts(id), (0, 0, 0));
    let s = f.tc_stats();
    assert_eq!((s.flows_closed, s.ended_rst, s.ended_idle), (1, 1, 0), "the RST ended it");
}

#[test]
fn ipv6_clients_reach_ipv6_backends_only_and_idle_flows_are_reclaimed() {
    let setup = mixed(TC_MODE_MASQUERADE);
    let mut f = Fixture::new(&setup);
    let mut per = [0u32; 3];
    for port in 0..200u16 {
        let (verdict, _, id) = open6(&f, &setup, (CLIENT6.0, 41000 + port));
        assert_eq!(verdict, TC_ACT_OK);
        per[id as usize] += 1;
    }
    assert_eq!(per[0], 0, "the IPv4 backend got IPv6 flows: {per:?} (no NAT64)");
    assert!(per[1] > 0 && per[2] > per[1], "weights 200:500 over 200 flows: {per:?}");
    assert_eq!(f.flows6().len(), 600);
    f.set_tc_config(setup.mode, setup.ports, 1);
    assert_eq!(f.reclaim(), 200);
    assert!(f.flows6().is_empty());
    for id in 0..3 {
        assert_eq!(f.counts(id), (0, 0, 0), "backend {id}");
    }
    let s = f.tc_stats();
    assert_eq!((s.flows_opened, s.flows_reclaimed, s.ended_idle), (200, 200, 200));

    // A model whose only backend is IPv4: an IPv6 SYN is refused, not translated.
    let v4_only = Setup::new(TC_MODE_MASQUERADE, &[A1]);
    let f = Fixture::new(&v4_only);
    let (verdict, _) = f.run(&Frame6::tcp(CLIENT6, VIP6, TCP_SYN).build());
    assert_eq!(verdict, TC_ACT_SHOT);
    assert_eq!((f.tc_stats().refused, f.flows6().len(), f.counts(0)), (1, 0, (0, 0, 0)));
}

/// A frame that must pass untouched (verdict OK, same bytes) or be dropped, leaving no flow.
fn check_hostile(f: &Fixture, name: &str, frame: &[u8], expected: u32) {
    let malformed = f.tc_stats().malformed;
    let (verdict, out) = f.run(frame);
    assert_eq!(verdict, expected, "{name}: verdict");
    if expected == TC_ACT_OK {
        assert_eq!(out, frame, "{name}: passed, but changed");
        assert_eq!(f.tc_stats().malformed, malformed, "{name}: passed, but counted malformed");
    } else {
        assert_eq!(f.tc_stats().malformed, malformed + 1, "{name}: dropped, but not counted malformed");
    }
    assert!(f.flows6().is_empty(), "{name}: left flow entries {:?}", f.flows6());
    assert!(f.flows().is_empty(), "{name}: left IPv4 flow entries");
    for id in 0..3 {
        assert_eq!(f.counts(id), (0, 0, 0), "{name}: counted at backend {id}");
    }
}

#[test]
fn hostile_ipv6_packets_pass_untouched_or_are_dropped_never_tracked() {
    let setup = mixed(TC_MODE_MASQUERADE);
    let f = Fixture::new(&setup);
    let syn = Frame6::tcp(CLIENT6, VIP6, TCP_SYN);
    let with = |ext: Vec<Ext6>| Frame6 { ext, ..syn.clone() }.build();
    check_hostile(&f, "a first fragment to a VIP", &with(vec![Ext6::Fragment { offset: 0, more: true }]), TC_ACT_SHOT);
    check_hostile(
        &f,
        "an atomic fragment to a VIP",
        &with(vec![Ext6::Fragment { offset: 0, more: false }]),
        TC_ACT_SHOT,
    );
    check_hostile(&f, "a later fragment (no ports)", &with(vec![Ext6::Fragment { offset: 8, more: false }]), TC_ACT_OK);
    check_hostile(&f, "hop-by-hop options to a VIP", &with(vec![Ext6::HopByHop]), TC_ACT_SHOT);
    check_hostile(&f, "a routing header to a VIP", &with(vec![Ext6::Routing]), TC_ACT_SHOT);
    check_hostile(
        &f,
        "three extension headers",
        &with(vec![Ext6::HopByHop, Ext6::Routing, Ext6::DestOpts]),
        TC_ACT_SHOT,
    );
    let five = vec![Ext6::DestOpts; 5];
    check_hostile(&f, "more extension headers than walked", &with(five), TC_ACT_OK);
    let mut ack = Frame6::tcp(CLIENT6, VIP6, TCP_ACK);
    ack.ext = vec![Ext6::DestOpts];
    check_hostile(&f, "a stray ACK to a VIP with options", &ack.build(), TC_ACT_SHOT);
    let elsewhere = Frame6 { dst: ("fd00:77::2".parse().unwrap(), VIP6.1), ..syn.clone() };
    check_hostile(
        &f,
        "options to no VIP",
        &Frame6 { ext: vec![Ext6::HopByHop], ..elsewhere.clone() }.build(),
        TC_ACT_OK,
    );
    check_hostile(&f, "a SYN to no VIP", &elsewhere.build(), TC_ACT_OK);
    check_hostile(
        &f,
        "a SYN to another port of the VIP",
        &Frame6 { dst: (VIP6.0, 8001), ..syn.clone() }.build(),
        TC_ACT_OK,
    );
    check_hostile(&f, "a stray ACK to a VIP", &Frame6 { flags: TCP_ACK, ..syn.clone() }.build(), TC_ACT_OK);

    let full = syn.build();
    check_hostile(&f, "a TCP header cut short", &full[..ETH_HLEN + IP6_HLEN + 12], TC_ACT_OK);
    // A frame cut inside the fixed header cannot be run: BPF_PROG_TEST_RUN refuses an IPv6
    // frame shorter than its 40-byte header (EINVAL); the parser's bounds check covers it.
    let mut long = full.clone();
    long[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&200u16.to_be_bytes());
    check_hostile(&f, "a payload length past the frame", &long, TC_ACT_SHOT);
    let mut short_doff = full.clone();
    short_doff[ETH_HLEN + IP6_HLEN + 12] = 4 << 4;
    check_hostile(&f, "a TCP data offset under 5", &short_doff, TC_ACT_SHOT);
    let mut version = full.clone();
    version[ETH_HLEN] = 0x40;
    check_hostile(&f, "version 4 in an IPv6 frame", &version, TC_ACT_OK);
    let mut udp = full.clone();
    udp[ETH_HLEN + 6] = 17;
    check_hostile(&f, "UDP to a VIP", &udp, TC_ACT_OK);
}

#[test]
fn a_bad_tcp_checksum_stays_bad_and_masquerade_without_an_ipv6_address_passes() {
    let setup = mixed(TC_MODE_MASQUERADE);
    let mut f = Fixture::new(&setup);
    // A SYN whose TCP checksum is off by one: rewritten incrementally, it stays off by one,
    // so the backend drops it as it would have dropped the original.
    let mut bad = Frame6::tcp(CLIENT6, VIP6, TCP_SYN).build();
    let at = ETH_HLEN + IP6_HLEN + 16;
    let sum = u16::from_be_bytes([bad[at], bad[at + 1]]).wrapping_add(1);
    bad[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let before = tcp6_checksum(&bad);
    assert_ne!(before, 0);
    let (verdict, out) = f.run(&bad);
    assert_eq!(verdict, TC_ACT_OK);
    assert_ne!(endpoints6(&out), endpoints6(&bad), "rewritten");
    assert_eq!(tcp6_checksum(&out), before, "the error is carried, not repaired");
    let kinds: Vec<u32> = f.flows6().iter().map(|(k, _)| k.kind).collect();
    for kind in [FLOW_FORWARD, FLOW_REPLY, FLOW_COUNT] {
        assert_eq!(kinds.iter().filter(|&&k| k == kind).count(), 1, "kind {kind}");
    }
    // Masquerade with no IPv6 NAT address: IPv6 is not balanced, even an established flow's
    // packets pass as they are.
    f.set_tc_config_nat6(TC_MODE_MASQUERADE, setup.ports, 0, [0; 4]);
    let syn = Frame6::tcp((CLIENT6.0, CLIENT6.1 + 1), VIP6, TCP_SYN).build();
    let (verdict, out) = f.run(&syn);
    assert_eq!((verdict, &out), (TC_ACT_OK, &syn));
    assert_eq!(f.tc_stats().flows_opened, 1);
}

#[test]
fn an_ipv6_flow_entry_time_is_written_once_per_step_as_an_ipv4_one() {
    let mut setup = mixed(TC_MODE_MASQUERADE);
    setup.idle_timeout_ns = 3_600_000_000_000;
    let mut f = Fixture::new(&setup);
    let opened = std::time::Instant::now();
    assert_eq!(open6(&f, &setup, CLIENT6).0, TC_ACT_OK);
    let seen = |f: &Fixture| {
        let flows = f.flows6();
        flows.iter().find(|(k, _)| k.kind == FLOW_FORWARD).expect("forward entry").1.last_seen_ns
    };
    let t0 = seen(&f);
    assert_eq!(f.run(&Frame6::tcp(CLIENT6, VIP6, TCP_ACK).build()).0, TC_ACT_OK);
    // A second step (a sixteenth of an hour, at most a second): the packet came less than a
    // second after the open unless this run stalled.
    if opened.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(seen(&f), t0, "a packet within the step left the entry's time as it was");
    }
    f.set_tc_config(setup.mode, setup.ports, 16);
    assert_eq!(f.run(&Frame6::tcp(CLIENT6, VIP6, TCP_ACK).build()).0, TC_ACT_OK);
    assert!(seen(&f) > t0, "a 1 ns step: the packet wrote the entry's time");
}
