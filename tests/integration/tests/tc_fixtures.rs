//! `BPF_PROG_TEST_RUN` fixtures of the TC programs: the rewrite both ways (bytes, and both
//! checksums recomputed here from their definitions), the close by FIN and by RST with the
//! in-flight counters back at exactly 0, the idle reclaim, client-address affinity, the
//! bounds (one NAT port, a full flow table), and every hostile packet class: its verdict,
//! the frame untouched when it passes, and no flow or count left behind.

mod tc_support;

use std::net::Ipv4Addr;

use ailb_common::{
    TcModel, FLOW_COUNT, FLOW_FORWARD, FLOW_REPLY, MAX_FLOWS, TC_AFFINITY_CLIENT_ADDR, TC_MODE_MASQUERADE,
    TC_MODE_ROUTED,
};
use ailb_tests::packet::{checksums_ok, endpoints, tcp_checksum, Frame, ETH_HLEN, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};
use tc_support::{be_addr, Fixture, Setup, CLIENT, NAT, TC_ACT_OK, TC_ACT_SHOT, VIP};

const B1: (Ipv4Addr, u16, u32) = (Ipv4Addr::new(10, 99, 0, 11), 9001, 100);
const B2: (Ipv4Addr, u16, u32) = (Ipv4Addr::new(10, 99, 0, 12), 9002, 200);
const B3: (Ipv4Addr, u16, u32) = (Ipv4Addr::new(10, 99, 0, 13), 9003, 500);

fn backend_of(setup: &Setup, addr: (Ipv4Addr, u16)) -> u32 {
    setup.backends.iter().position(|b| (b.0, b.1) == addr).expect("rewritten to a configured backend") as u32
}

/// A SYN from `CLIENT` to the VIP, rewritten: (verdict, frame out, backend id).
fn open(f: &Fixture, setup: &Setup, client: (Ipv4Addr, u16)) -> (u32, Vec<u8>, u32) {
    let (verdict, out) = f.run(&Frame::tcp(client, VIP, TCP_SYN).build());
    let (_, dst) = endpoints(&out);
    let id = if verdict == TC_ACT_SHOT { u32::MAX } else { backend_of(setup, dst) };
    (verdict, out, id)
}

#[test]
fn masquerade_rewrites_both_ways_and_a_fin_close_leaves_nothing() {
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]);
    setup.tc_model = TcModel { required_mem_mb: 4000, affinity: 0 };
    let f = Fixture::new(&setup);
    let syn = Frame::tcp(CLIENT, VIP, TCP_SYN).build();
    let (verdict, out, id) = open(&f, &setup, CLIENT);
    // No interface to redirect to under BPF_PROG_TEST_RUN: the rewritten SYN goes to the stack.
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&out), "checksums of the rewritten SYN, recomputed from scratch");
    let ((src, sport), dst) = endpoints(&out);
    assert_eq!(src, NAT);
    assert!((setup.ports.0..=setup.ports.1).contains(&sport), "NAT port {sport} outside the range");
    let b = setup.backends[id as usize];
    assert_eq!(dst, (b.0, b.1));
    // Only the addresses, ports and checksums changed.
    let unchanged: Vec<usize> = (0..syn.len()).filter(|&i| !(26..38).contains(&i) && !(50..52).contains(&i)).collect();
    for i in unchanged.iter().filter(|&&i| i != 24 && i != 25) {
        assert_eq!(out[*i], syn[*i], "byte {i} changed");
    }
    let flows = f.flows();
    assert_eq!(flows.len(), 3, "forward, reply and count entries: {flows:?}");
    assert_eq!(f.counts(id), (1, 1, 4000), "counted in the same in-flight counters as a local connect");

    // The SYN-ACK from the backend to the NAT address and port goes back as VIP -> client.
    let reply = |flags| Frame::tcp((b.0, b.1), (NAT, sport), flags).build();
    let (verdict, back) = f.run(&reply(TCP_SYN | TCP_ACK));
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&back));
    assert_eq!(endpoints(&back), (VIP, CLIENT));

    // Data both ways, then the client's FIN: uncounted at once; the backend's FIN; the last ACK.
    let mut data = Frame::tcp(CLIENT, VIP, TCP_ACK);
    data.payload = b"GET /v1/models HTTP/1.1\r\n\r\n".to_vec();
    let (verdict, out) = f.run(&data.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&out));
    assert_eq!(endpoints(&out), ((NAT, sport), (b.0, b.1)));
    assert_eq!(f.run(&Frame::tcp(CLIENT, VIP, TCP_FIN | TCP_ACK).build()).0, TC_ACT_OK);
    assert_eq!(f.counts(id), (0, 0, 0), "a FIN ends the count");
    assert_eq!(f.flows().len(), 2, "the flow's entries stay for the rest of the close");
    let (verdict, back) = f.run(&reply(TCP_FIN | TCP_ACK));
    assert_eq!((verdict, endpoints(&back)), (TC_ACT_OK, (VIP, CLIENT)));
    let (verdict, out) = f.run(&Frame::tcp(CLIENT, VIP, TCP_ACK).build());
    assert_eq!((verdict, endpoints(&out).1), (TC_ACT_OK, (b.0, b.1)), "the last ACK is still rewritten");
    assert!(f.flows().is_empty(), "entries left after the close: {:?}", f.flows());
    assert_eq!(f.counts(id), (0, 0, 0));
    let s = f.tc_stats();
    assert_eq!((s.flows_opened, s.flows_closed, s.malformed), (1, 1, 0));
    assert_eq!((s.ended_fin(), s.ended_rst, s.ended_idle), (1, 0, 0), "a FIN ended it");
}

#[test]
fn routed_rewrites_the_destination_only_and_an_rst_ends_the_flow() {
    let setup = Setup::new(TC_MODE_ROUTED, &[B1, B2]);
    let f = Fixture::new(&setup);
    let (verdict, out, id) = open(&f, &setup, CLIENT);
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&out));
    let b = setup.backends[id as usize];
    assert_eq!(endpoints(&out), (CLIENT, (b.0, b.1)));
    let (verdict, back) = f.run(&Frame::tcp((b.0, b.1), CLIENT, TCP_SYN | TCP_ACK).build());
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&back));
    assert_eq!(endpoints(&back), (VIP, CLIENT));
    assert_eq!(f.counts(id).0, 1);
    // An RST from the backend is rewritten back and ends the flow.
    let (verdict, back) = f.run(&Frame::tcp((b.0, b.1), CLIENT, TCP_RST).build());
    assert_eq!((verdict, endpoints(&back)), (TC_ACT_OK, (VIP, CLIENT)));
    assert!(checksums_ok(&back));
    assert!(f.flows().is_empty());
    assert_eq!(f.counts(id), (0, 0, 0));
    let s = f.tc_stats();
    assert_eq!((s.flows_closed, s.ended_rst, s.ended_idle), (1, 1, 0), "the RST ended it");
}

#[test]
fn a_retransmitted_syn_keeps_its_flow_and_count() {
    let setup = Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]);
    let f = Fixture::new(&setup);
    let (_, first, id) = open(&f, &setup, CLIENT);
    let (verdict, again, id2) = open(&f, &setup, CLIENT);
    assert_eq!((verdict, id2), (TC_ACT_OK, id));
    assert_eq!(first, again, "the same rewrite, the same NAT port");
    assert_eq!(f.counts(id).0, 1);
    assert_eq!(f.flows().len(), 3);
}

#[test]
fn idle_flows_are_reclaimed_with_their_counts() {
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]);
    setup.tc_model.required_mem_mb = 1000;
    let mut f = Fixture::new(&setup);
    for port in 0..10u16 {
        assert_eq!(open(&f, &setup, (CLIENT.0, 41000 + port)).0, TC_ACT_OK);
    }
    assert_eq!(f.tc_stats().flows_opened, 10);
    assert_eq!(f.reclaim(), 0, "timeout 0: nothing is ever idle");
    // A timeout of an hour: every flow was just seen.
    f.set_tc_config(setup.mode, setup.ports, 3_600_000_000_000);
    assert_eq!(f.reclaim(), 0);
    f.set_tc_config(setup.mode, setup.ports, 1);
    assert_eq!(f.reclaim(), 10);
    assert!(f.flows().is_empty());
    for id in 0..3 {
        assert_eq!(f.counts(id), (0, 0, 0));
    }
    let s = f.tc_stats();
    assert_eq!((s.flows_reclaimed, s.ended_idle, s.ended_rst, s.ended_fin()), (10, 10, 0, 0));
}

#[test]
fn client_address_affinity_keeps_a_client_on_its_backend() {
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]);
    setup.tc_model.affinity = TC_AFFINITY_CLIENT_ADDR;
    let f = Fixture::new(&setup);
    let (_, _, first) = open(&f, &setup, CLIENT);
    assert_eq!(f.run(&Frame::tcp(CLIENT, VIP, TCP_RST).build()).0, TC_ACT_OK);
    for port in 1..30u16 {
        let client = (CLIENT.0, CLIENT.1 + port);
        let (verdict, _, id) = open(&f, &setup, client);
        assert_eq!((verdict, id), (TC_ACT_OK, first), "connection {port} of the client moved");
        // Reset before the next: nothing in flight, so its backend is under the load bound.
        assert_eq!(f.run(&Frame::tcp(client, VIP, TCP_RST).build()).0, TC_ACT_OK);
    }
    // Held open, the client's flows leave its backend once that is at the load bound (one
    // address carries many conversations): they spread, none past the bound of the last SYN.
    let f = Fixture::new(&setup);
    let mut held = [0u64; 3];
    for port in 0..12u16 {
        let (verdict, _, id) = open(&f, &setup, (CLIENT.0, CLIENT.1 + port));
        assert_eq!(verdict, TC_ACT_OK);
        held[id as usize] += 1;
    }
    let total_weight: u64 = setup.backends.iter().map(|b| u64::from(b.2)).sum();
    for (i, b) in setup.backends.iter().enumerate() {
        let bound = ailb_common::pick::load_bound(1250, 11, b.2, total_weight);
        assert!(held[i] <= bound, "backend {i} holds {} of 12 flows from one client, bound {bound}: {held:?}", held[i]);
    }
    assert!(held.iter().filter(|&&n| n > 0).count() > 1, "12 held flows of one client all on one backend: {held:?}");
    // Without affinity the same connections spread.
    let f = Fixture::new(&Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]));
    let ids: std::collections::BTreeSet<u32> =
        (0..30u16).map(|p| open(&f, &setup, (CLIENT.0, CLIENT.1 + p)).2).collect();
    assert!(ids.len() > 1, "30 connections without affinity all went to {ids:?}");
}

#[test]
fn one_nat_port_holds_one_flow_per_backend() {
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1]);
    setup.ports = (30000, 30000);
    let f = Fixture::new(&setup);
    assert_eq!(open(&f, &setup, CLIENT).0, TC_ACT_OK);
    for port in 1..5u16 {
        assert_eq!(open(&f, &setup, (CLIENT.0, CLIENT.1 + port)).0, TC_ACT_SHOT, "no second flow on the one port");
    }
    let s = f.tc_stats();
    assert_eq!((s.flows_opened, s.nat_exhausted), (1, 4));
    assert_eq!(f.flows().len(), 3, "a refused SYN leaves no entry");
    assert_eq!(f.counts(0).0, 1);
}

/// The NAT port of the first SYN of `client` (opened, then reset by the client).
fn port_of_a_closed_flow(f: &Fixture, setup: &Setup, client: (Ipv4Addr, u16)) -> u16 {
    let (verdict, out, _) = open(f, setup, client);
    assert_eq!(verdict, TC_ACT_OK);
    let ((_, port), _) = endpoints(&out);
    assert_eq!(f.run(&Frame::tcp(client, VIP, TCP_RST).build()).0, TC_ACT_OK);
    port
}

#[test]
fn a_freed_nat_port_comes_round_only_after_the_whole_range() {
    // A backend may hold a closed connection's port in TIME_WAIT: the ports are taken in turn
    // from one cursor, so a port freed at a close is not the next one taken.
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1]);
    setup.ports = (30000, 30003);
    let f = Fixture::new(&setup);
    let ports: Vec<u16> = (0..6u16).map(|i| port_of_a_closed_flow(&f, &setup, (CLIENT.0, 42000 + i))).collect();
    assert_eq!(ports, [30000, 30001, 30002, 30003, 30000, 30001]);
    // A port still held is skipped, and the cursor moves past the one taken instead.
    let (verdict, held, _) = open(&f, &setup, (CLIENT.0, 43000));
    assert_eq!((verdict, endpoints(&held).0 .1), (TC_ACT_OK, 30002));
    let ports: Vec<u16> = (0..4u16).map(|i| port_of_a_closed_flow(&f, &setup, (CLIENT.0, 44000 + i))).collect();
    assert_eq!(ports, [30003, 30000, 30001, 30003], "30002 is held");
    assert!(f.flows().len() == 3 && f.counts(0).0 == 1, "only the held flow is left");
}

#[test]
fn a_syn_flood_fills_the_flow_table_and_established_flows_go_on() {
    let setup = Setup::new(TC_MODE_ROUTED, &[B1, B2, B3]);
    let mut f = Fixture::new(&setup);
    let client = |i: u32| (Ipv4Addr::from(0x0a42_0000 + (i >> 14)), 1024 + (i & 0x3fff) as u16);
    for i in 0..MAX_FLOWS {
        assert_eq!(f.run(&Frame::tcp(client(i), VIP, TCP_SYN).build()).0, TC_ACT_OK, "SYN {i}");
    }
    let (verdict, _) = f.run(&Frame::tcp(client(MAX_FLOWS), VIP, TCP_SYN).build());
    assert_eq!(verdict, TC_ACT_SHOT, "the table is full: the SYN is dropped");
    assert_eq!(f.tc_stats().flows_full, 1);
    let (verdict, out) = f.run(&Frame::tcp(client(7), VIP, TCP_ACK).build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_ne!(endpoints(&out).1, VIP, "an established flow is still rewritten");
    let total: u64 = (0..3).map(|id| f.counts(id).0).sum();
    assert_eq!(total, MAX_FLOWS as u64);
    f.set_tc_config(setup.mode, setup.ports, 1);
    assert_eq!(f.reclaim(), MAX_FLOWS);
    assert!(f.flows().is_empty());
    assert_eq!((0..3).map(|id| f.counts(id).0).sum::<u64>(), 0);
}

/// A frame that must pass untouched (verdict OK, same bytes) or be dropped, leaving no flow.
fn check_hostile(f: &Fixture, name: &str, frame: &[u8], expected: u32) {
    let (verdict, out) = f.run(frame);
    assert_eq!(verdict, expected, "{name}: verdict");
    if expected == TC_ACT_OK {
        assert_eq!(out, frame, "{name}: passed, but changed");
    }
    assert!(f.flows().is_empty(), "{name}: left flow entries {:?}", f.flows());
    assert_eq!(f.counts(0), (0, 0, 0), "{name}: counted");
}

#[test]
fn hostile_packets_pass_untouched_or_are_dropped_never_tracked() {
    let setup = Setup::new(TC_MODE_MASQUERADE, &[B1]);
    let f = Fixture::new(&setup);
    let syn = Frame::tcp(CLIENT, VIP, TCP_SYN);
    let good = syn.build();

    // BPF_PROG_TEST_RUN itself refuses an IPv4 frame shorter than an IPv4 header (EINVAL),
    // so the shortest truncation it can feed is a bare IPv4 header.
    check_hostile(&f, "IPv4 header without TCP", &good[..ETH_HLEN + 20], TC_ACT_OK);
    check_hostile(&f, "TCP header cut at the ports", &good[..ETH_HLEN + 24], TC_ACT_OK);
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    check_hostile(&f, "not IPv4", &arp, TC_ACT_OK);
    let mut udp = syn.clone();
    udp.protocol = 17;
    check_hostile(&f, "UDP to the VIP", &udp.build(), TC_ACT_OK);
    let mut later = syn.clone();
    later.frag = 10;
    check_hostile(&f, "a later fragment", &later.build(), TC_ACT_OK);
    check_hostile(&f, "an ACK to the VIP without a flow", &Frame::tcp(CLIENT, VIP, TCP_ACK).build(), TC_ACT_OK);
    check_hostile(&f, "a SYN-ACK to the VIP", &Frame::tcp(CLIENT, VIP, TCP_SYN | TCP_ACK).build(), TC_ACT_OK);
    check_hostile(
        &f,
        "to the NAT address, no flow",
        &Frame::tcp((B1.0, B1.1), (NAT, 20000), TCP_ACK).build(),
        TC_ACT_OK,
    );
    let mut ihl4 = good.clone();
    ihl4[ETH_HLEN] = 0x44;
    check_hostile(&f, "IHL 4", &ihl4, TC_ACT_OK);

    let mut first = syn.clone();
    first.frag = 0x2000;
    check_hostile(&f, "a first fragment SYN", &first.build(), TC_ACT_SHOT);
    let mut bad_ip = good.clone();
    bad_ip[ETH_HLEN + 10] ^= 0xff;
    check_hostile(&f, "a bad IPv4 checksum", &bad_ip, TC_ACT_SHOT);
    let mut long = good.clone();
    long[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&200u16.to_be_bytes());
    fix_ip_checksum(&mut long);
    check_hostile(&f, "total length past the frame", &long, TC_ACT_SHOT);
    let mut doff = good.clone();
    doff[ETH_HLEN + 20 + 12] = 4 << 4;
    check_hostile(&f, "TCP data offset 4", &doff, TC_ACT_SHOT);
    assert_eq!(f.tc_stats().malformed, 4);
    assert_eq!(f.tc_stats().flows_opened, 0);
}

fn fix_ip_checksum(frame: &mut [u8]) {
    let ihl = ((frame[ETH_HLEN] & 0xf) as usize) * 4;
    frame[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&[0, 0]);
    let c = ailb_tests::packet::ones_complement(&frame[ETH_HLEN..ETH_HLEN + ihl]);
    frame[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn ip_options_are_kept_and_a_bad_tcp_checksum_stays_bad() {
    let setup = Setup::new(TC_MODE_MASQUERADE, &[B1]);
    let f = Fixture::new(&setup);
    let mut opts = Frame::tcp(CLIENT, VIP, TCP_SYN);
    opts.ip_options = vec![1, 1, 1, 0]; // NOP, NOP, NOP, end of options
    let frame = opts.build();
    let (verdict, out) = f.run(&frame);
    assert_eq!(verdict, TC_ACT_OK);
    assert!(checksums_ok(&out), "checksums with a 24-byte IPv4 header");
    assert_eq!(out[ETH_HLEN + 20..ETH_HLEN + 24], frame[ETH_HLEN + 20..ETH_HLEN + 24], "options kept");
    assert_eq!(endpoints(&out).1, (B1.0, B1.1));

    // A SYN whose TCP checksum is off by one: rewritten incrementally, it stays off by one,
    // so the backend drops it as it would have dropped the original.
    let mut bad = Frame::tcp((CLIENT.0, CLIENT.1 + 1), VIP, TCP_SYN).build();
    let at = ETH_HLEN + 20 + 16;
    let sum = u16::from_be_bytes([bad[at], bad[at + 1]]).wrapping_add(1);
    bad[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let before = tcp_checksum(&bad);
    assert_ne!(before, 0);
    let (verdict, out) = f.run(&bad);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(tcp_checksum(&out), before, "the error is carried, not repaired");
    let kinds: Vec<u32> = f.flows().iter().map(|(k, _)| k.kind).collect();
    for kind in [FLOW_FORWARD, FLOW_REPLY, FLOW_COUNT] {
        assert_eq!(kinds.iter().filter(|&&k| k == kind).count(), 2, "kind {kind} of two flows");
    }
    let _ = be_addr;
}

/// The flow entry's time is written only when it moved by a sixteenth of the idle timeout (at
/// most a second), not at every packet; with a timeout that makes that step 1 ns, every packet
/// writes it.
#[test]
fn a_flow_entry_time_is_written_once_per_step() {
    let mut setup = Setup::new(TC_MODE_MASQUERADE, &[B1, B2, B3]);
    setup.idle_timeout_ns = 3_600_000_000_000;
    let mut f = Fixture::new(&setup);
    let opened = std::time::Instant::now();
    assert_eq!(open(&f, &setup, CLIENT).0, TC_ACT_OK);
    let seen = |f: &Fixture| {
        let flows = f.flows();
        flows.iter().find(|(k, _)| k.kind == FLOW_FORWARD).expect("forward entry").1.last_seen_ns
    };
    let t0 = seen(&f);
    assert_eq!(f.run(&Frame::tcp(CLIENT, VIP, TCP_ACK).build()).0, TC_ACT_OK);
    // A second step: the packet came less than a second after the open unless this run stalled.
    if opened.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(seen(&f), t0, "a packet within the step left the entry's time as it was");
    }
    f.set_tc_config(setup.mode, setup.ports, 16);
    assert_eq!(f.run(&Frame::tcp(CLIENT, VIP, TCP_ACK).build()).0, TC_ACT_OK);
    assert!(seen(&f) > t0, "a 1 ns step: the packet wrote the entry's time");
}
