//! The demo's model servers, each with its `ailb agent`: simulated GPUs (`ailb-sim` with a fake
//! NVML, the default) or real vLLM for CPU servers serving the tiny model (`--engine vllm`).

use std::net::SocketAddrV4;
use std::path::Path;
use std::process::ExitStatus;

use ailb_tests::nacos::{free_port, RnacosServer};
use ailb_tests::vllm::{self, metric_sum, Engine, VllmServer};
use anyhow::{bail, Context};
use serde_json::Value;

use super::{say, Args, EngineKind};
use crate::sim_gpus::{get_ok, sibling_bin, spawn_agent, Proc, SimGpu, SimOpts};

/// One model server.
pub(super) enum Server {
    Sim(SimGpu),
    Vllm(VllmServer),
}

/// A model server and its agent (declared first, so dropped first: it deregisters while the
/// server still runs).
pub(super) struct Node {
    pub(super) agent: Proc,
    pub(super) server: Server,
}

/// What the live view shows of a server, read from it once per view.
#[derive(Debug, Default)]
pub(super) struct Sample {
    pub(super) utilization: Option<f64>,
    pub(super) kv_cache_usage: Option<f64>,
    pub(super) running: Option<u64>,
    pub(super) waiting: Option<u64>,
    /// Requests it has answered.
    pub(super) finished: Option<u64>,
}

impl Server {
    pub(super) fn addr(&self) -> SocketAddrV4 {
        match self {
            Server::Sim(g) => g.addr,
            Server::Vllm(v) => SocketAddrV4::new([127, 0, 0, 1].into(), v.port()),
        }
    }

    /// The GPU column: the simulated GPU's profile, or what a real server runs on.
    pub(super) fn label(&self) -> &str {
        match self {
            Server::Sim(g) => g.profile,
            Server::Vllm(_) => "vLLM CPU",
        }
    }

    /// Its state now: the simulator's `/sim/state`, or a real server's `/metrics`.
    pub(super) fn sample(&self) -> Sample {
        match self {
            Server::Sim(g) => {
                let Some(v) = get_ok(g.addr, "/sim/state").and_then(|t| serde_json::from_str::<Value>(&t).ok()) else {
                    return Sample::default();
                };
                Sample {
                    utilization: v["utilization"].as_f64(),
                    kv_cache_usage: v["kv_cache_usage"].as_f64(),
                    running: v["running"].as_u64(),
                    waiting: v["waiting"].as_u64(),
                    finished: v["counters"]["finished_total"].as_u64(),
                }
            }
            Server::Vllm(_) => {
                let Some(text) = get_ok(self.addr(), "/metrics") else { return Sample::default() };
                let m = |name: &str| metric_sum(&text, name);
                Sample {
                    utilization: None,
                    kv_cache_usage: m("vllm:kv_cache_usage_perc"),
                    running: m("vllm:num_requests_running").map(|v| v as u64),
                    waiting: m("vllm:num_requests_waiting").map(|v| v as u64),
                    finished: m("vllm:request_success_total").map(|v| v as u64),
                }
            }
        }
    }

    /// `(name, status)` once the server has exited.
    pub(super) fn exited(&mut self) -> Option<(String, ExitStatus)> {
        match self {
            Server::Sim(g) => g.sim.exited().map(|st| (g.sim.name.clone(), st)),
            Server::Vllm(v) => v.exited().map(|st| (format!("vLLM on {}", v.addr()), st)),
        }
    }
}

/// Starts the fleet `args` asks for, each server with its agent registered in `nacos`.
pub(super) fn start(args: &Args, model: &str, nacos: &RnacosServer, dir: &Path) -> anyhow::Result<Vec<Node>> {
    match args.engine {
        EngineKind::Sim => start_sims(args, model, nacos, dir),
        EngineKind::Vllm => start_vllm(args, model, nacos, dir),
    }
}

fn start_sims(args: &Args, model: &str, nacos: &RnacosServer, dir: &Path) -> anyhow::Result<Vec<Node>> {
    let profiles = std::iter::repeat_n("a100-80gb", args.a100).chain(std::iter::repeat_n("rtx3090-24gb", args.rtx3090));
    let mut nodes = Vec::new();
    for (i, profile) in profiles.enumerate() {
        let addr = SocketAddrV4::new([127, 0, 20, (i + 1) as u8].into(), 8000);
        let opts = SimOpts {
            sim_bin: &sibling_bin("ailb-sim"),
            model,
            time_scale: args.time_scale,
            sample_interval_ms: 250,
            log: Some(dir.join(format!("sim-{i}.log"))),
            tokenizer: None,
        };
        let gpu = SimGpu::start(addr, profile, &opts)?;
        let agent = gpu.start_agent(model, &nacos.url(), "500ms", dir)?;
        say(&format!("GPU {i}: ailb-sim {profile} on {addr} with its agent"));
        nodes.push(Node { agent, server: Server::Sim(gpu) });
    }
    Ok(nodes)
}

/// Real servers: the engine `cargo xtask setup` installed, started side by side (about a
/// minute and a half for two on 2 cores), then one agent each.
fn start_vllm(args: &Args, model: &str, nacos: &RnacosServer, dir: &Path) -> anyhow::Result<Vec<Node>> {
    if !(1..=3).contains(&args.servers) {
        bail!("--servers {}: 1 to 3 real vLLM servers (each takes about 3 GB and shares the CPU cores)", args.servers);
    }
    let engine = Engine::find().map_err(|why| anyhow::anyhow!("--engine vllm: {why}"))?;
    say(&format!(
        "starting {} vLLM server(s) for CPU with the tiny model {} (about 90 s for two on 2 cores)...",
        args.servers,
        engine.model.display()
    ));
    let names = vec![model; args.servers];
    // The synthetic mix's longest conversations outgrow 8,192 tokens; the tiny model has 16,384
    // positions. The cached share of each prompt comes back in `usage.prompt_tokens_details`.
    let extra = ["--max-model-len", "16384", "--enable-prompt-tokens-details"];
    let servers = vllm::start_servers(&engine, &names, &extra, std::time::Duration::from_secs(600));
    let mut nodes = Vec::new();
    for (i, s) in servers.into_iter().enumerate() {
        let addr = SocketAddrV4::new([127, 0, 0, 1].into(), s.port());
        let config = dir.join(format!("agent-vllm-{i}.toml"));
        let text = vllm::agent_config(&s, model, &nacos.url(), free_port(), "500ms");
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let agent = spawn_agent(addr, &config, &dir.join(format!("agent-vllm-{i}.log")), &[])?;
        say(&format!("server {i}: vLLM on {addr} ({} MiB resident) with its agent", s.rss_mib()));
        nodes.push(Node { agent, server: Server::Vllm(s) });
    }
    Ok(nodes)
}
