//! The demo's live view: the front door's address, then one row per server, from the
//! balancer's pinned maps and the server itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Instant;

use ailb_tests::status::model_backends;
use ailb_tests::Daemon;
use serde_json::Value;

use super::fleet::{Node, Sample};

/// The live view: the front door at `front`, then one row per server of `model`, joined from
/// the balancer's pinned maps and the server itself.
pub(super) fn view(daemon: &Daemon, model: &str, front: SocketAddr, nodes: &[Node], started: Instant) -> String {
    // Each server's state, read once per view.
    let samples: Vec<Sample> = nodes.iter().map(|n| n.server.sample()).collect();
    let replay_done: u64 = samples.iter().filter_map(|s| s.finished).sum();
    let st = daemon.status();
    let by_addr: BTreeMap<&str, &Value> =
        model_backends(&st, model).into_iter().filter_map(|b| Some((b["address"].as_str()?, b))).collect();
    let s = &st["stats"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n--- t = {:>3} s   front door http://{front}   requests answered {replay_done}   \
         kernel: picks {}  affinity hits {}  spills {}  refused {}",
        started.elapsed().as_secs(),
        s["picks"],
        s["affinity_hits"],
        s["spills"],
        s["no_backend"].as_u64().unwrap_or(0) + s["no_fit"].as_u64().unwrap_or(0),
    );
    let _ = writeln!(
        out,
        "{:<17} {:<13} {:>6} {:>6} {:>8} {:>6} | {:>5} {:>5} {:>7} {:>7} {:>9}",
        "backend", "GPU", "weight", "share", "inflight", "picks", "util", "KV", "running", "waiting", "free MiB"
    );
    for (node, sample) in nodes.iter().zip(&samples) {
        let a = node.server.addr().to_string();
        let b = by_addr.get(a.as_str());
        let field = |v: Option<&Value>, k: &str| v.map(|v| v[k].clone()).unwrap_or(Value::Null);
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0));
        let int = |v: Option<u64>| v.map_or("-".to_string(), |x| x.to_string());
        let live = b.is_some_and(|b| b["live"].as_bool() == Some(true));
        let _ = writeln!(
            out,
            "{:<17} {:<13} {:>6} {:>6} {:>8} {:>6} | {:>5} {:>5} {:>7} {:>7} {:>9}",
            a,
            node.server.label(),
            if live { int(field(b.copied(), "weight").as_u64()) } else { "out".into() },
            pct(field(b.copied(), "table_share").as_f64()),
            int(field(b.copied(), "inflight").as_u64()),
            int(field(b.copied(), "picks").as_u64()),
            pct(sample.utilization),
            pct(sample.kv_cache_usage),
            int(sample.running),
            int(sample.waiting),
            int(field(b.copied(), "free_mem_mb").as_u64()),
        );
    }
    out
}
