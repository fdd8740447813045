//! The test client and backend servers on their own, without ailb (no root, no daemon): the
//! baseline that the privileged tests compare against.

use std::time::Duration;

use ailb_tests::client::{assert_all_ok, count_by_backend};
use ailb_tests::{client_bin, wait_until, BackendServer, ConnectOpts, TestClient};

const ENOPROTOOPT: i64 = libc::ENOPROTOOPT as i64;

#[test]
fn connect_reports_the_server_it_reached() {
    let server = BackendServer::start("127.0.0.201:19001");
    let client = TestClient::new(client_bin!());
    let results = client.connect(None, &ConnectOpts::new(&server.address(), 20));
    assert_all_ok(&results, "plain connects to a backend");
    assert_eq!(count_by_backend(&results).get(&server.address()), Some(&20));
    assert_eq!(server.accepted(), 20);
}

#[test]
fn refused_connects_report_econnrefused() {
    // Nothing listens on this address.
    let client = TestClient::new(client_bin!());
    let results = client.connect(None, &ConnectOpts::new("127.0.0.202:19002", 3));
    for r in &results {
        assert!(!r.ok);
        assert_eq!(r.errno, Some(libc::ECONNREFUSED), "{r:?}");
    }
}

#[test]
fn hold_keeps_connections_open_until_released() {
    let server = BackendServer::start("127.0.0.203:19003");
    let client = TestClient::new(client_bin!());
    let held = client.hold(None, &ConnectOpts::new(&server.address(), 10));
    assert_all_ok(held.results(), "held connects");
    wait_until("10 open server connections", Duration::from_secs(5), || (server.open() == 10).then_some(()));
    held.release();
    wait_until("0 open server connections", Duration::from_secs(5), || (server.open() == 0).then_some(()));
}

/// Without ailb the kernel knows no level 0x41494c: every SOL_AILB option fails with
/// ENOPROTOOPT, ordinary options work, and connects are unaffected.
#[test]
fn hostile_mode_without_ailb_sees_enoprotoopt() {
    let server = BackendServer::start("127.0.0.204:19004");
    let client = TestClient::new(client_bin!());
    let cases = client.hostile(None, &server.address());
    for (case, v) in &cases {
        match case.as_str() {
            "so_reuseaddr" | "tcp_nodelay" => assert_eq!(v["ret"], 0, "{case}: {v}"),
            "conversation_null_len16" => assert_eq!(v["ret"], -1, "{case}: {v}"),
            c if c.starts_with("connect_") => {
                assert_eq!(v["ok"], true, "{case}: {v}");
                assert_eq!(v["backend"].as_str(), Some(server.address().as_str()), "{case}: {v}");
            }
            _ => assert_eq!(v["errno"].as_i64(), Some(ENOPROTOOPT), "{case}: {v}"),
        }
    }
    assert!(cases.len() >= 18, "expected every hostile case to be reported: {cases:?}");
}
