//! Tiny HTTP backends for the demo: each answers any request with `200 OK` and its own address,
//! after a short pause that stands in for inference (so in-flight counts are visible).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result};

/// How long a backend "thinks" before it answers.
const SERVICE_TIME: Duration = Duration::from_millis(200);

/// Binds every address and serves each on its own thread (threads end with the process).
pub(crate) fn start(addresses: &[&str]) -> Result<()> {
    let mut listeners = Vec::new();
    for addr in addresses {
        let sa: SocketAddr = addr.parse().with_context(|| format!("backend address {addr}"))?;
        let listener =
            TcpListener::bind(sa).with_context(|| format!("binding demo backend {sa} (is another demo running?)"))?;
        listeners.push((sa, listener));
    }
    for (sa, listener) in listeners {
        std::thread::Builder::new()
            .name(format!("backend {sa}"))
            .spawn(move || serve(sa, listener))
            .context("spawning a backend thread")?;
    }
    Ok(())
}

fn serve(me: SocketAddr, listener: TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let spawned = std::thread::Builder::new().spawn(move || {
                    if let Err(e) = answer(me, stream) {
                        eprintln!("[backend {me}] connection: {e}");
                    }
                });
                if let Err(e) = spawned {
                    eprintln!("[backend {me}] cannot spawn a connection thread: {e}");
                }
            }
            Err(e) => eprintln!("[backend {me}] accept: {e}"),
        }
    }
}

fn answer(me: SocketAddr, mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // Read the request head (up to the blank line); the body, if any, is ignored.
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    std::thread::sleep(SERVICE_TIME);
    let body = me.to_string();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes())?;
    stream.flush()
}
