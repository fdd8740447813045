//! The demo's live view: the front door's address, then one row per GPU, from the balancer's
//! pinned maps and the GPU itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Instant;

use ailb_tests::status::model_backends;
use ailb_tests::Daemon;
use serde_json::Value;

use super::{Gpu, MODEL};
use crate::sim_gpus::get_ok;

/// The live view: the front door at `front`, then one row per GPU, joined from the balancer's
/// pinned maps and the GPU itself.
pub(super) fn view(daemon: &Daemon, front: SocketAddr, gpus: &[Gpu], started: Instant) -> String {
    // Each GPU's state, read once per view.
    let sims: Vec<Option<Value>> =
        gpus.iter().map(|g| get_ok(g.gpu.addr, "/sim/state").and_then(|t| serde_json::from_str(&t).ok())).collect();
    let replay_done: u64 = sims.iter().flatten().filter_map(|v| v["counters"]["finished_total"].as_u64()).sum();
    let st = daemon.status();
    let by_addr: BTreeMap<&str, &Value> =
        model_backends(&st, MODEL).into_iter().filter_map(|b| Some((b["address"].as_str()?, b))).collect();
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
    for (Gpu { gpu: g, .. }, sim) in gpus.iter().zip(&sims) {
        let a = g.addr.to_string();
        let b = by_addr.get(a.as_str());
        let field = |v: Option<&Value>, k: &str| v.map(|v| v[k].clone()).unwrap_or(Value::Null);
        let pct = |v: Value| v.as_f64().map_or("-".to_string(), |x| format!("{:.0}%", x * 100.0));
        let int = |v: Value| v.as_u64().map_or("-".to_string(), |x| x.to_string());
        let live = b.is_some_and(|b| b["live"].as_bool() == Some(true));
        let _ = writeln!(
            out,
            "{:<17} {:<13} {:>6} {:>6} {:>8} {:>6} | {:>5} {:>5} {:>7} {:>7} {:>9}",
            a,
            g.profile,
            if live { int(field(b.copied(), "weight")) } else { "out".into() },
            pct(field(b.copied(), "table_share")),
            int(field(b.copied(), "inflight")),
            int(field(b.copied(), "picks")),
            pct(field(sim.as_ref(), "utilization")),
            pct(field(sim.as_ref(), "kv_cache_usage")),
            int(field(sim.as_ref(), "running")),
            int(field(sim.as_ref(), "waiting")),
            int(field(b.copied(), "free_mem_mb")),
        );
    }
    out
}
