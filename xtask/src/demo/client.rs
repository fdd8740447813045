//! The demo's load generator (`xtask demo-client`, run by `cargo xtask run` inside the demo
//! cgroup): `rate` connections per second to the VIP, every other one tagged with a
//! conversation id, each sending one GET. Prints a summary line every 6 s.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ailb_common::client::{self, Tagging, Tags};
use anyhow::{Context, Result};

/// Distinct conversation ids the client cycles through (so that ids repeat and affinity shows).
const CONVERSATIONS: u64 = 12;
const SUMMARY_EVERY: Duration = Duration::from_secs(6);

#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    by_backend: BTreeMap<String, u64>,
    /// conversation id -> backends that answered it.
    conversations: BTreeMap<String, BTreeSet<String>>,
    last_error: Option<String>,
}

pub(crate) fn client(vip: &str, rate: u32) -> Result<()> {
    let vip: SocketAddrV4 = vip.parse().with_context(|| format!("VIP {vip}"))?;
    let rate = rate.max(1);
    let interval = Duration::from_secs(1) / rate;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let warned_no_ailb = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut next_summary = start + SUMMARY_EVERY;

    for i in 0u64.. {
        // Pace by absolute deadlines so slow connections do not lower the rate.
        let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let conv = (i % 2 == 0).then(|| format!("conv-{}", (i / 2) % CONVERSATIONS));
        let (shared, warned) = (Arc::clone(&tally), Arc::clone(&warned_no_ailb));
        std::thread::spawn(move || {
            let result = request(vip, conv.as_deref(), &warned);
            let mut t = shared.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(backend) => {
                    t.ok += 1;
                    *t.by_backend.entry(backend.clone()).or_default() += 1;
                    if let Some(c) = conv {
                        t.conversations.entry(c).or_default().insert(backend);
                    }
                }
                Err(e) => {
                    t.failed += 1;
                    t.last_error = Some(format!("{e:#}"));
                }
            }
        });
        if Instant::now() >= next_summary {
            next_summary += SUMMARY_EVERY;
            summary(&tally.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
    Ok(())
}

fn summary(t: &Tally) {
    let backends: Vec<String> = t.by_backend.iter().map(|(b, n)| format!("{b}={n}")).collect();
    let sticky = t.conversations.values().filter(|set| set.len() == 1).count();
    println!(
        "[client] {} ok, {} failed; replies by backend: {}; conversations answered by one backend only: {}/{}",
        t.ok,
        t.failed,
        if backends.is_empty() { "-".to_string() } else { backends.join(" ") },
        sticky,
        t.conversations.len()
    );
    if let Some(e) = &t.last_error {
        println!("[client] last error: {e}");
    }
}

/// One request through the VIP; returns the body (the backend's address).
fn request(vip: SocketAddrV4, conv: Option<&str>, warned_no_ailb: &AtomicBool) -> Result<String> {
    let mut stream = connect(vip, conv, warned_no_ailb)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET / HTTP/1.1\r\nHost: {vip}\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).context("reading the reply")?;
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_string())
        .context("reply without a header/body separator")?;
    Ok(body)
}

/// A socket tagged with the conversation (if any) before connect, connected to the VIP.
fn connect(vip: SocketAddrV4, conv: Option<&str>, warned_no_ailb: &AtomicBool) -> Result<TcpStream> {
    let tags = match conv {
        Some(id) => Tags::new().conversation(id),
        None => Tags::new(),
    };
    let (stream, outcome) = client::connect(vip, &tags, None)?;
    // No balancer: the ABI says carry on untagged.
    if outcome.tagging == Tagging::NoBalancer && !warned_no_ailb.swap(true, Ordering::Relaxed) {
        println!("[client] setsockopt(SOL_AILB): ENOPROTOOPT, ailb is not loaded for this cgroup");
    }
    Ok(stream)
}
