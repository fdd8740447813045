//! The v1 UDP push: ailb asks for it by sending `udpPort` and `clientIP` with every v1 list
//! read; a server that supports it then sends a datagram when a service changes (for as long
//! as the reads go on). ailb acks each push as a Nacos 1.x client does and treats it only as
//! a hint to read again at once: the pushed instance list itself is not used, so a forged
//! datagram costs one extra read and nothing more.

use std::{
    collections::HashSet,
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use reqwest::Url;
use tokio::net::UdpSocket;

use super::wire;

pub(crate) struct PushReceiver {
    socket: UdpSocket,
    port: u16,
    buf: Box<[u8]>,
    /// `group@@service` and `service` of every catalog service.
    watched: HashSet<String>,
    received: u64,
}

impl PushReceiver {
    /// Binds `0.0.0.0:0`: the address each server is told (`clientIP`) is the one the route to
    /// that server leaves from, which may differ between servers.
    pub(crate) fn bind() -> io::Result<Self> {
        let std_sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        std_sock.set_nonblocking(true)?;
        let port = std_sock.local_addr()?.port();
        let socket = UdpSocket::from_std(std_sock)?;
        Ok(Self { socket, port, buf: vec![0; 65_536].into_boxed_slice(), watched: HashSet::new(), received: 0 })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    pub(crate) fn watch(&mut self, group: &str, services: impl IntoIterator<Item = String>) {
        self.watched.clear();
        for s in services {
            self.watched.insert(format!("{group}@@{s}"));
            self.watched.insert(s);
        }
    }

    /// Completes when a push for a watched service (or one whose service cannot be told)
    /// arrives. Every push is acked. Cancel-safe: the receive is, and the ack is sent without
    /// awaiting.
    pub(crate) async fn next(&mut self) {
        loop {
            let (n, from) = match self.socket.recv_from(&mut self.buf).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "nacos udp push: receive failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let packet = match wire::parse_push(&self.buf[..n]) {
                Ok(p) => p,
                Err(reason) => {
                    tracing::warn!(%from, %reason, "nacos udp push: unreadable datagram ignored");
                    continue;
                }
            };
            self.received += 1;
            match wire::push_ack(&packet) {
                Some(ack) => {
                    if let Err(e) = self.socket.try_send_to(&ack, from) {
                        tracing::warn!(%from, error = %e, "nacos udp push: ack not sent");
                    }
                }
                None => tracing::debug!(%from, kind = %packet.kind, "nacos udp push without lastRefTime: no ack"),
            }
            let relevant = packet.kind != "dump" && packet.service.as_ref().is_none_or(|s| self.watched.contains(s));
            tracing::debug!(%from, kind = %packet.kind, service = ?packet.service, relevant, "nacos udp push");
            if relevant {
                return;
            }
        }
    }
}

/// The local IPv4 address the route to `server` leaves from (no packet is sent).
pub(crate) async fn local_ip_towards(server: &Url) -> Option<Ipv4Addr> {
    let host = server.host_str()?;
    let port = server.port_or_known_default()?;
    let target: SocketAddr = match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host, port)).await.ok()?.find(SocketAddr::is_ipv4)?,
    };
    let SocketAddr::V4(target) = target else { return None };
    let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    probe.connect(target).ok()?;
    match probe.local_addr().ok()?.ip() {
        IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}
