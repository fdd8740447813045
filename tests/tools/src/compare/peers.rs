//! The routers users would pick instead of ailb, started in front of the same simulated fleet:
//! `sglang-router` 0.3.2 and `vllm-router` 0.1.17 (Rust routers shipped as Python wheels),
//! installed by `cargo xtask setup` into a venv under `target/peers-venv`, and SMG 1.13.0 (the
//! Shepherd Model Gateway, `smg` on PyPI, sglang-router's successor) in a venv of its own,
//! `target/smg-venv` ([`SMG_VENV`]): sglang-router 0.3.2 also installs programs named `smg` and
//! `amg` (its own command line under the later names), so in one venv `bin/smg` belongs to
//! whichever wheel pip installed last.
//!
//! Each is one child process on loopback, ready once its port answers and its `GET /workers`
//! lists every GPU healthy (all three route to an `ailb-sim` as it is: before that they probe the
//! worker's `GET /health`; sglang's also asks `/server_info` and `/model_info`, and on 404 their
//! old names `/get_server_info` and `/get_model_info`, and registers the worker under the
//! model "unknown" without them, which routes every model's requests to it; SMG reads the
//! model from `/v1/models`, finds no engine it knows there (`owned_by` "ailb-sim", no
//! `/version`, no `/server_info`) and registers the GPU as a `generic` OpenAI-compatible worker,
//! whose load it does not poll: its load signals are its own in-flight request counts). Stopped
//! by pid on drop ([`Proc`]).
//!
//! Settings: each router's defaults (sglang `cache_aware`: cache threshold 0.3, balance
//! thresholds 64 absolute and 1.5 relative; no concurrency limit in either), plus `--log-level
//! warn(ing)` (their default logs every request at INFO, host CPU the simulated GPUs share)
//! and a Prometheus port of their own (all default to 29000). The replay sends each
//! conversation id as `X-Session-ID`, which vLLM's `consistent_hash` hashes.
//!
//! SMG gets its defaults plus what its documentation advises for this use (multi-turn
//! conversations with a shared system prompt, GPUs of unequal size, one gateway), the same
//! `--log-level warn` and a Prometheus port of its own:
//! - `smg-cache-aware`, `--policy cache_aware --balance-abs-threshold 16
//!   --balance-rel-threshold 1.25`. The docs advise lower balance thresholds than the defaults
//!   (64, 1.5) for heterogeneous workers and bursty traffic, and the absolute one by the expected
//!   queue depth: 16 is the RTX 3090's batch (its `max_seqs`), the smallest in the fleet; 1.25 is
//!   the imbalance SMG's own `prefix_hash` tolerates by default (and ailb's load bound). The
//!   cache threshold stays 0.3: the docs name 0.1-0.2 for conversations at the risk of hot spots
//!   but advise starting from 0.3 and raising it if hot spots show.
//! - `smg-prefix-hash`, `--policy prefix_hash --prefix-token-count 1024`. The policy hashes the
//!   prompt's first N tokens (4 N characters of text) onto a ring; the docs: longer keys route
//!   more precisely, shorter ones group more requests together. Every request of the Mooncake
//!   trace starts with the same 512-token block (a shared system prompt), so the default 256
//!   gives every request the same key and one worker, relieved only by the load check; 1,024
//!   covers that block and the conversation's first block of its own, and a conversation's later
//!   turns, whose prompts extend its first, keep its key. The load check keeps its defaults (1.25
//!   times the mean and 10 requests above it).
//! - `smg-least-load`, `--policy least_load`, its defaults. Its expected wait reads each
//!   worker's load reports (queued tokens, throughput, KV use), which a `generic` worker does not
//!   give; with no reports at all the docs say it takes the worker with the fewest in-flight
//!   requests, so its tuning (`--least-load-default-throughput`, the waiting-queue cap, ...)
//!   would change no pick here.
//!
//! - `smg-kv-events` (real engines only, `ailb-compare --engine vllm`): SMG `--policy cache_aware`
//!   with the same settings as `smg-cache-aware`, in front of vLLM's gRPC servers (`grpc://`
//!   workers, served by SMG's `smg-grpc-servicer`, which `cargo xtask setup` installs) that
//!   publish KV events, plus `--model-path` (the model folder: over gRPC SMG tokenizes and
//!   renders the chat template itself). SMG's docs: its cache-aware policy is event-driven, on
//!   the engine's own KV events streamed over gRPC, exactly when the worker is a gRPC one that
//!   emits them; an HTTP worker gets the approximate text tree (so a simulated GPU cannot serve
//!   this row). Its block size it learns from the first event.
//!
//! SMG's worker overload protection (on by default) reads the same load reports, so it never
//! excludes a GPU here; its concurrency bound (1,024 per core, at least 4,096) is far above the
//! replay's. On SIGTERM it keeps its listener open for 5 s (a load-balancer propagation window
//! its launcher does not expose) before it exits.

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::policy::Policy;
use crate::sim_gpus::{self, Proc};

/// The venv `cargo xtask setup` installs sglang-router and vllm-router into (relative to the
/// repository root).
pub const VENV: &str = "target/peers-venv";
/// The venv `cargo xtask setup` installs SMG into (relative to the repository root).
pub const SMG_VENV: &str = "target/smg-venv";

/// The venv of sglang-router and vllm-router: `$AILB_PEERS_VENV`, else [`VENV`] under this
/// repository.
pub fn venv() -> PathBuf {
    venv_at("AILB_PEERS_VENV", VENV)
}

/// The venv of SMG: `$AILB_SMG_VENV`, else [`SMG_VENV`] under this repository.
pub fn smg_venv() -> PathBuf {
    venv_at("AILB_SMG_VENV", SMG_VENV)
}

/// The venv that holds `policy`'s router.
pub fn venv_of(policy: Policy) -> PathBuf {
    if smg(policy) {
        smg_venv()
    } else {
        venv()
    }
}

fn venv_at(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(default),
    }
}

fn smg(policy: Policy) -> bool {
    matches!(policy, Policy::SmgCacheAware | Policy::SmgPrefixHash | Policy::SmgLeastLoad | Policy::SmgKvEvents)
}

/// A router's Prometheus port in the comparison: its own port plus this (on another address
/// too): SMG refuses a Prometheus port equal to the one it listens on, whatever the addresses.
pub const METRICS_PORT_OFFSET: u16 = 1000;

/// The router binary of a peer policy (`None` for ailb's own and the other baselines).
pub fn binary(policy: Policy) -> Option<&'static str> {
    match policy {
        Policy::SglangCacheAware | Policy::SglangRoundRobin => Some("sglang-router"),
        Policy::SmgCacheAware | Policy::SmgPrefixHash | Policy::SmgLeastLoad | Policy::SmgKvEvents => Some("smg"),
        Policy::VllmCacheAware | Policy::VllmConsistentHash => Some("vllm-router"),
        _ => None,
    }
}

/// Why a peer policy cannot run here (`None` when its router is installed in `venv`).
pub fn missing(policy: Policy, venv: &Path) -> Option<String> {
    let bin = venv.join("bin").join(binary(policy)?);
    if !bin.is_file() {
        return Some(format!("not installed ({} missing; `cargo xtask setup` installs it)", bin.display()));
    }
    // sglang-router's `smg` would run sglang-router under SMG's name: a venv given for SMG
    // that holds sglang-router too may have that one.
    let script = std::fs::read_to_string(&bin).unwrap_or_default();
    (smg(policy) && script.contains("sglang_router")).then(|| {
        format!(
            "not installed ({} is sglang-router's `smg`, not SMG's; `cargo xtask setup` installs SMG into {SMG_VENV})",
            bin.display()
        )
    })
}

/// The balance thresholds `smg-cache-aware` (and SMG with KV events) sets, absolute and
/// relative (the module docs say why); `ailb-fleet-model` models the same policy with them.
pub const SMG_BALANCE_ABS: u64 = 16;
pub const SMG_BALANCE_REL: f64 = 1.25;

/// SMG `cache_aware`'s default cache threshold, which `smg-cache-aware` keeps.
pub const SMG_DEFAULT_CACHE_THRESHOLD: f64 = 0.3;

/// The command line of `policy`'s router on `listen`, with its Prometheus endpoint on
/// `metrics`, in front of `workers` (URLs).
pub fn args(policy: Policy, listen: SocketAddrV4, metrics: SocketAddrV4, workers: &[String]) -> Vec<String> {
    // (subcommand, policy, log level, the settings beyond the defaults: the module docs say why).
    let (sub, kind, log, tuning): (_, _, _, Vec<String>) = match policy {
        Policy::SglangCacheAware => (Some("launch"), "cache_aware", "warn", vec![]),
        Policy::SglangRoundRobin => (Some("launch"), "round_robin", "warn", vec![]),
        Policy::SmgCacheAware | Policy::SmgKvEvents => (
            Some("launch"),
            "cache_aware",
            "warn",
            vec![
                "--balance-abs-threshold".into(),
                SMG_BALANCE_ABS.to_string(),
                "--balance-rel-threshold".into(),
                SMG_BALANCE_REL.to_string(),
            ],
        ),
        Policy::SmgPrefixHash => {
            (Some("launch"), "prefix_hash", "warn", vec!["--prefix-token-count".into(), "1024".into()])
        }
        Policy::SmgLeastLoad => (Some("launch"), "least_load", "warn", vec![]),
        Policy::VllmCacheAware => (None, "cache_aware", "warning", vec![]),
        _ => (None, "consistent_hash", "warning", vec![]),
    };
    let mut a: Vec<String> = sub.into_iter().map(String::from).collect();
    a.extend(["--host".into(), listen.ip().to_string(), "--port".into(), listen.port().to_string()]);
    a.push("--worker-urls".into());
    a.extend(workers.iter().cloned());
    a.extend(["--policy".into(), kind.into()]);
    a.extend(tuning);
    a.extend(["--log-level".into(), log.into()]);
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
    let workers: Vec<String> = gpus.iter().map(|a| format!("http://{a}")).collect();
    start_with_args(policy, venv, listen, args(policy, listen, metrics, &workers), gpus.len(), dir)
}

/// [`start`] with the command line `argv` (from [`args`], a setting changed): returns once the
/// router on `listen` lists `workers` healthy workers (30 s at most).
pub fn start_with_args(
    policy: Policy,
    venv: &Path,
    listen: SocketAddrV4,
    argv: Vec<String>,
    workers: usize,
    dir: &Path,
) -> anyhow::Result<Proc> {
    let name = binary(policy).context("not a peer router")?;
    let log_path = dir.join(format!("{}.log", policy.key()));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(venv.join("bin").join(name))
        .args(argv)
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
        if healthy_workers(listen) == Some(workers) {
            return Ok(proc);
        }
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("{name} did not list {workers} healthy workers on {listen} within 30 s: {}", tail(&log));
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
