//! ailb's front door as a policy: `ailb gateway` started INSIDE the child cgroup that `ailb run`
//! attached to, reading the same config file, so that the fresh upstream connection it opens
//! per request is the one the kernel steers. The replay sends it plain HTTP, as to nginx or a
//! peer router: no socket tag, the conversation as `X-Session-ID` only.
//!
//! The memory need: the replay tags ailb's own sockets with the request's whole context (prompt
//! plus output tokens) rounded up to whole 512-token KV blocks, times the KV bytes per token.
//! Untagged, the gateway estimates the same: the prompt's tokens (bytes / 4; the replay's prompt
//! text is exactly 4 bytes per token) plus `max_tokens` (the output length), rounded up to whole
//! KV blocks of `[gateway.kv_block_tokens]`, set here to the simulator's 512, times
//! `kv_bytes_per_token`, set to the simulated GPUs' own value. Without the rounding the estimate
//! could fit a GPU's free memory while the server, counting whole blocks, could not hold it.

use std::net::{SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ailb_sim::GpuProfile;
use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::CgroupGuard;
use anyhow::{bail, Context};

use super::MODEL;
use crate::sim_gpus::{Proc, SimGpu};

/// The KV bytes per token the gateway's estimate uses: the largest of the fleet's GPU
/// profiles (every preset of the 7B fp16 model has the same, 512 KiB).
pub fn kv_bytes_per_token(sims: &[SimGpu]) -> u64 {
    sims.iter().filter_map(|s| GpuProfile::preset(s.profile)).map(|p| p.kv_bytes_per_token).max().unwrap_or(0)
}

/// The `[gateway]` section appended to the config of the ailb behind the front door; with
/// `prefix_keys` the front door sends each request's text prefix keys (64-byte chunks: no
/// tokenizer is configured).
pub fn toml(listen: SocketAddrV4, kv_bytes_per_token: u64, prefix_keys: bool) -> String {
    format!(
        "\n[gateway]\nlisten = [\"{listen}\"]\n{}[gateway.kv_bytes_per_token]\n\"{MODEL}\" = {kv_bytes_per_token}\n\
         [gateway.kv_block_tokens]\n\"{MODEL}\" = {}\n",
        if prefix_keys { "prefix_keys = true\n" } else { "" },
        ailb_sim::gpu::BLOCK_TOKENS
    )
}

/// The `[gateway.tokenizers]` table of a front door in precise prefix mode, after [`toml`]: the
/// simulated GPUs' own tokenizer (`--sim-tokenizer`), so that its keys are token-exact.
pub fn tokenizer_toml(tokenizer: Option<&Path>) -> anyhow::Result<String> {
    let dir = tokenizer.context("a front door in precise prefix mode needs --sim-tokenizer")?;
    Ok(format!("[gateway.tokenizers]\n\"{MODEL}\" = \"{}\"\n", dir.display()))
}

/// The `[gateway.admission]` table of `ailb-gateway-admission`, after [`toml`]: admission by
/// fleet memory with `--admission-factor` and `--admission-max-wait-s` (simulated seconds, so
/// divided by the time scale: the gateway waits in real time).
pub fn admission_toml(args: &super::args::Args) -> String {
    let max_wait_ms = (args.admission_max_wait_s * 1000.0 / args.time_scale).round() as u64;
    format!(
        "[gateway.admission]\nmode = \"fleet_memory\"\nfactor = {:?}\nmax_wait = \"{max_wait_ms}ms\"\n",
        args.admission_factor
    )
}

/// Starts `ailb gateway --config CONFIG` inside `cg`, its log (warnings only: an access line per
/// request would cost host CPU the simulated GPUs share, as the peers' INFO logs would) in
/// `dir`; returns once it accepts connections on `listen` (20 s at most). Stopped by pid on drop.
/// Without `cg` it runs where this process runs (a bench's reference row, no kernel pick).
pub fn start(
    ailb: &Path,
    config: &Path,
    cg: Option<&CgroupGuard>,
    listen: SocketAddrV4,
    dir: &Path,
) -> anyhow::Result<Proc> {
    let log_path = dir.join("gateway.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut cmd = Command::new(ailb);
    cmd.args(["gateway", "--config"])
        .arg(config)
        .env("AILB_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    let child = match cg {
        Some(cg) => spawn_in_cgroup(&mut cmd, cg.path()),
        None => cmd.spawn().context("spawning ailb gateway")?,
    };
    let mut proc = Proc { name: "ailb gateway".into(), child };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&listen.into(), Duration::from_millis(200)).is_err() {
        if let Some(st) = proc.exited() {
            bail!("ailb gateway exited ({st}): {}", std::fs::read_to_string(&log_path).unwrap_or_default());
        }
        if Instant::now() >= deadline {
            bail!("ailb gateway did not listen on {listen} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(proc)
}

/// What the front door's own `/metrics` say of a run: the requests that opened a connection
/// (a kernel pick) and those sent on a kept one, and the time spent making prefix keys (for the
/// former only).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrontDoorStats {
    pub fresh: f64,
    pub kept: f64,
    /// Requests whose prefix keys were made, their total seconds, and the histogram's
    /// cumulative buckets (upper bound in seconds, count).
    pub keys_made: f64,
    pub keys_s: f64,
    pub keys_buckets: Vec<(f64, f64)>,
    /// Connections a later turn opened with its keys withheld (`ailb_gateway_prefix_keys_withheld`):
    /// placed by the kernel without them, and asked for them.
    pub withheld_placed: f64,
    pub withheld_asked: f64,
}

impl FrontDoorStats {
    /// Parses the front door's Prometheus text (summed over models).
    pub fn parse(text: &str) -> Self {
        let mut out = FrontDoorStats::default();
        let mut buckets = std::collections::BTreeMap::<u64, (f64, f64)>::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            match name {
                "ailb_gateway_upstream_requests_total" if labels.contains("reused=\"true\"") => out.kept += value,
                "ailb_gateway_upstream_requests_total" => out.fresh += value,
                "ailb_gateway_prefix_keys_seconds_count" => out.keys_made += value,
                "ailb_gateway_prefix_keys_seconds_sum" => out.keys_s += value,
                "ailb_gateway_prefix_keys_withheld_total" if labels.contains("outcome=\"placed\"") => {
                    out.withheld_placed += value
                }
                "ailb_gateway_prefix_keys_withheld_total" => out.withheld_asked += value,
                "ailb_gateway_prefix_keys_seconds_bucket" => {
                    let le = labels.split("le=\"").nth(1).and_then(|r| r.split('"').next());
                    let le = match le {
                        Some("+Inf") => f64::INFINITY,
                        Some(v) => v.parse().unwrap_or(f64::NAN),
                        None => continue,
                    };
                    buckets.entry(le.to_bits()).or_insert((le, 0.0)).1 += value;
                }
                _ => {}
            }
        }
        out.keys_buckets = buckets.into_values().filter(|(le, _)| !le.is_nan()).collect();
        out.keys_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// The upper bound of the bucket that holds the `q`-quantile of the key-making times
    /// (`None`: none made, or it lies past the last finite bucket).
    pub fn keys_quantile_at_most(&self, q: f64) -> Option<f64> {
        let rank = (q * self.keys_made).ceil().max(1.0);
        (self.keys_made > 0.0)
            .then(|| self.keys_buckets.iter().find(|(_, n)| *n >= rank).map(|(le, _)| *le))
            .flatten()
            .filter(|le| le.is_finite())
    }

    /// The front door at `listen`, `None` when it does not answer.
    pub fn read(listen: SocketAddrV4) -> Option<Self> {
        match crate::sim_gpus::http_get(listen, "/metrics")? {
            (200, body) => Some(Self::parse(&body)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
