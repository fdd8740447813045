//! What the in-process front-door tests share: a gateway on its own loopback port.

use std::net::SocketAddr;

use ailb_userspace::config::Config;
use ailb_userspace::gateway::Gateway;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// A gateway for the config `text` (its models and `[gateway]` section), serving on a fresh
/// loopback port until the test's runtime ends.
pub(crate) async fn serve(text: &str) -> SocketAddr {
    let config = Config::parse(text, "test").unwrap();
    let valid = config.validate().unwrap();
    let gw = config.gateway.validate(valid.models.keys().map(String::as_str)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Gateway::new(&valid, gw, Registry::default()).serve(listener));
    addr
}
