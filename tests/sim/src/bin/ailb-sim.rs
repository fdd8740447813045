//! `ailb-sim`: a simulated LLM inference server (OpenAI-compatible, vLLM metrics) over a
//! model of one GPU. See `ailb_sim` (the crate docs) for the model, the request extension and the API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use ailb_sim::kv_events::KvEventsConfig;
use ailb_sim::{serve, GpuProfile, SimConfig};
use ailb_userspace::tokenize::ChatTokenizer;
use anyhow::{bail, Context};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "ailb-sim", about = "Simulated GPU inference server (OpenAI API, vLLM metrics)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// GPU preset: a100-80gb or rtx3090-24gb (7B fp16 model); the flags below override it.
    #[arg(long, default_value = "a100-80gb")]
    profile: String,
    /// Served model name.
    #[arg(long, default_value = "sim-llama-7b")]
    model: String,
    /// GPU type (published as the NVML name).
    #[arg(long)]
    gpu_type: Option<String>,
    /// Total GPU memory, MiB.
    #[arg(long)]
    gpu_memory_mb: Option<u64>,
    /// Model weights, MiB.
    #[arg(long)]
    weights_mb: Option<u64>,
    /// KV-cache bytes per token.
    #[arg(long)]
    kv_bytes_per_token: Option<u64>,
    /// Prefill tokens per second (one sequence).
    #[arg(long)]
    prefill_tps: Option<f64>,
    /// Decode tokens per second (one sequence).
    #[arg(long)]
    decode_tps: Option<f64>,
    /// Most sequences running at once.
    #[arg(long)]
    max_seqs: Option<usize>,
    /// Simulated seconds per real second (10 = ten times faster than real).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Keep this fake-NVML state file (tests/integration/fixtures/fake_nvml.c format) up to date.
    #[arg(long)]
    nvml_state: Option<PathBuf>,
    /// GPU UUID in the NVML state (default: derived from the listen address).
    #[arg(long)]
    gpu_uuid: Option<String>,
    /// Real milliseconds between utilisation samples and NVML state writes.
    #[arg(long, default_value_t = 200)]
    sample_interval_ms: u64,
    /// A model folder (tokenizer.json, tokenizer_config.json, chat template): prompts are
    /// tokenized as vLLM tokenizes them for that model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Publish KV events as vLLM's `--kv-events-config` does, on this ZMQ PUB endpoint
    /// (vLLM's default tcp://*:5557).
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    /// The replay ROUTER endpoint (vLLM's `replay_endpoint`; none by default).
    #[arg(long, requires = "kv_events_endpoint")]
    kv_events_replay_endpoint: Option<String>,
    /// The topic frame of every KV-event message (vLLM's default: empty).
    #[arg(long, default_value = "", requires = "kv_events_endpoint")]
    kv_events_topic: String,
    /// KV-event batches kept for replay (vLLM's `buffer_steps`).
    #[arg(long, default_value_t = 10_000, requires = "kv_events_endpoint")]
    kv_events_buffer_steps: usize,
    /// The engine's KV-cache block size in tokens, a divisor of 512 (vLLM's default 16).
    #[arg(long, default_value_t = 16)]
    kv_block_size: u32,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let Some(mut p) = GpuProfile::preset(&a.profile) else {
        bail!("--profile {:?}: unknown (one of {})", a.profile, GpuProfile::PRESETS.join(", "));
    };
    p.gpu_type = a.gpu_type.unwrap_or(p.gpu_type);
    p.gpu_memory_mb = a.gpu_memory_mb.unwrap_or(p.gpu_memory_mb);
    p.weights_mb = a.weights_mb.unwrap_or(p.weights_mb);
    p.kv_bytes_per_token = a.kv_bytes_per_token.unwrap_or(p.kv_bytes_per_token);
    p.prefill_tps = a.prefill_tps.unwrap_or(p.prefill_tps);
    p.decode_tps = a.decode_tps.unwrap_or(p.decode_tps);
    p.max_seqs = a.max_seqs.unwrap_or(p.max_seqs);
    if let Err(e) = p.validate() {
        bail!("invalid GPU profile: {e}");
    }
    if !(a.time_scale > 0.0 && a.time_scale.is_finite()) {
        bail!("--time-scale {}: must be a positive number", a.time_scale);
    }
    if a.sample_interval_ms == 0 {
        bail!("--sample-interval-ms: must be at least 1");
    }
    let uuid = a.gpu_uuid.unwrap_or_else(|| {
        let ip = match a.listen.ip() {
            std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
            std::net::IpAddr::V6(_) => 0,
        };
        format!("GPU-5133a1b0-0000-0000-0000-{:012x}", (ip << 16) | u64::from(a.listen.port()))
    });
    let tokenizer = match &a.tokenizer {
        None => None,
        // Through the library's whole pipeline, as vLLM's tokenizer encodes: the simulated
        // engine's tokenizing costs what a real engine's does, on the cores it shares with the
        // gateway in a race.
        Some(dir) => Some(Arc::new(
            ChatTokenizer::load(dir)
                .map_err(|e| anyhow::anyhow!("--tokenizer: {}", ailb_userspace::error_chain(&e)))?
                .with_direct_path(false),
        )),
    };
    let kv_events = match a.kv_events_endpoint {
        None => None,
        Some(endpoint) => {
            let kv = KvEventsConfig {
                endpoint,
                replay_endpoint: a.kv_events_replay_endpoint,
                topic: a.kv_events_topic,
                buffer_steps: a.kv_events_buffer_steps,
                block_size: a.kv_block_size,
            };
            if let Err(e) = kv.validate() {
                bail!("{e}");
            }
            Some(kv)
        }
    };
    let cfg = SimConfig {
        profile: p,
        model: a.model,
        time_scale: a.time_scale,
        nvml_state: a.nvml_state,
        gpu_uuid: uuid,
        sample_interval: Duration::from_millis(a.sample_interval_ms),
        tokenizer,
        kv_events,
    };
    let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener =
            tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
        eprintln!(
            "ailb-sim: {} ({} KV blocks of 512 tokens, max {} seqs, time x{}) on http://{}",
            cfg.profile.gpu_type,
            cfg.profile.kv_blocks(),
            cfg.profile.max_seqs,
            cfg.time_scale,
            a.listen
        );
        serve(listener, cfg).await.context("serving")
    })
}
