//! The routers users would pick instead of ailb, started in front of the same simulated fleet:
//! `sglang-router` 0.3.2 and `vllm-router` 0.1.17 (Rust routers shipped as Python wheels),
//! installed by `cargo xtask setup` into a venv under `target/peers-venv`.
//!
//! Each is one child process on loopback, ready once its port answers and its `GET /workers`
//! lists every GPU healthy (both route to an `ailb-sim` as it is: before that they probe the
//! worker's `GET /health`; sglang's also asks `/server_info` and `/model_info`, and on 404 their
//! old names `/get_server_info` and `/get_model_info`, and registers the worker under the
//! model "unknown" without them, which routes every model's requests to it). Stopped by pid
//! on drop ([`Proc`]).
//!
//! Settings: each router's defaults (sglang `cache_aware`: cache threshold 0.3, balance
//! thresholds 64 absolute and 1.5 relative; no concurrency limit in either), plus `--log-level
//! warn(ing)` (their default logs every request at INFO, host CPU the simulated GPUs share)
//! and a Prometheus port of their own (both default to 29000). The replay sends each
//! conversation id as `X-Session-ID`, which vLLM's `consistent_hash` hashes.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::policy::Policy;
use crate::sim_gpus::{self, Proc};

/// The venv `cargo xtask setup` installs the routers into (relative to the repository root).
pub const VENV: &str = "target/peers-venv";

/// The venv: `$AILB_PEERS_VENV`, else [`VENV`] under this repository.
pub fn venv() -> PathBuf {
    match std::env::var_os("AILB_PEERS_VENV").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(VENV),
    }
}

/// The router binary of a peer policy (`None` for ailb's own and the other baselines).
pub fn binary(policy: Policy) -> Option<&'static str> {
    match policy {
        Policy::SglangCacheAware | Policy::SglangRoundRobin => Some("sglang-router"),
        Policy::VllmCacheAware | Policy::VllmConsistentHash => Some("vllm-router"),
        _ => None,
    }
}

/// Why a peer policy cannot run here (`None` when its router is installed in `venv`).
pub fn missing(policy: Policy, venv: &Path) -> Option<String> {
    let bin = venv.join("bin").join(binary(policy)?);
    (!bin.is_file()).then(|| format!("not installed ({} missing; `cargo xtask setup` installs it)", bin.display()))
}

/// The command line of `policy`'s router on `listen`, with its Prometheus endpoint on
/// `metrics`, in front of `workers` (URLs).
pub fn args(policy: Policy, listen: SocketAddrV4, metrics: SocketAddrV4, workers: &[String]) -> Vec<String> {
    let (sub, kind, log) = match policy {
        Policy::SglangCacheAware => (Some("launch"), "cache_aware", "warn"),
        Policy::SglangRoundRobin => (Some("launch"), "round_robin", "warn"),
        Policy::VllmCacheAware => (None, "cache_aware", "warning"),
        _ => (None, "consistent_hash", "warning"),
    };
    let mut a: Vec<String> = sub.into_iter().map(String::from).collect();
    a.extend(["--host".into(), listen.ip().to_string(), "--port".into(), listen.port().to_string()]);
    a.push("--worker-urls".into());
    a.extend(workers.iter().cloned());
    a.extend(["--policy".into(), kind.into(), "--log-level".into(), log.into()]);
    a.extend(["--prometheus-host".into(), metrics.ip().to_string(), "--prometheus-port".into()]);
    a.push(metrics.port().to_string());
    a
}

/// Starts `policy`'s router from `venv` on `listen` in front of the simulated GPUs at `gpus`,
/// its log in `dir`; returns once it lists every GPU healthy (30 s at most).
pub fn start(
    policy: Policy,
    venv: &Path,
    listen: SocketAddrV4,
    metrics: SocketAddrV4,
    gpus: &[SocketAddrV4],
    dir: &Path,
) -> anyhow::Result<Proc> {
    let name = binary(policy).context("not a peer router")?;
    let workers: Vec<String> = gpus.iter().map(|a| format!("http://{a}")).collect();
    let log_path = dir.join(format!("{}.log", policy.key()));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(venv.join("bin").join(name))
        .args(args(policy, listen, metrics, &workers))
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("log file")?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("spawning {name} from {}", venv.display()))?;
    let mut proc = Proc { name: name.into(), child };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = proc.exited() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("{name} exited ({st}): {}", tail(&log));
        }
        if healthy_workers(listen) == Some(gpus.len()) {
            return Ok(proc);
        }
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("{name} did not list {} healthy workers on {listen} within 30 s: {}", gpus.len(), tail(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many workers the router on `addr` lists as healthy (`GET /workers`), `None` while it
/// does not answer.
fn healthy_workers(addr: SocketAddrV4) -> Option<usize> {
    let (status, body) = sim_gpus::http_get(addr, "/workers")?;
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    let workers = v["workers"].as_array()?;
    Some(workers.iter().filter(|w| w["is_healthy"].as_bool() == Some(true)).count())
}

/// The last lines of a log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
