//! `ailb-compare` (root): balancing policies compared in one run, on the same simulated GPU
//! fleet and the same request list.
//!
//! For each policy it starts a fresh fleet of `ailb-sim` processes on 127.0.10.x (so every
//! policy begins with empty KV caches and idle GPUs), a fresh `ailb run` attached to a child
//! cgroup created here, and runs the replay (`ailb_sim::replay`, the library of
//! `ailb-replay`, in a re-exec of this binary) inside that cgroup against the VIP, sampling
//! every GPU's `/sim/state` while it runs. Then it writes a Markdown report, an SVG of the
//! end-to-end latency CDFs and an SVG of every GPU's utilisation over time per policy under
//! `--out-dir`, with the data they draw (`replay-plots.json`, [`plot_data`]), and prints the
//! report. `--replot` only redraws the SVGs in `--out-dir` from that data (no root, no run).
//! `--engine vllm` races the policies in front of real vLLM for CPU servers instead ([`real`]).
//!
//! ```text
//! ailb-compare [--limit 300] [--load 1.0] [--time-scale 20] [--synthetic] [--rate R]
//!              [--shared-prefix [--tenants 8] [--system-blocks 12] [--question-blocks 1] [--output-tokens 200]]
//!              [--a100 2] [--rtx3090 4] [--policies round-robin,random,least-conn,ailb,ailb-static,
//!               ailb-gateway,ailb-prefix,ailb-gateway-prefix,ailb-gateway-admission,ailb-static-gateway,nginx,sglang-cache-aware,sglang-round-robin,
//!               smg-cache-aware,smg-prefix-hash,smg-least-load,vllm-cache-aware,vllm-consistent-hash]
//!              [--out-dir target/bench] [--json FILE] [--trace PATH] [--replot]
//!              [--sim-bin PATH]
//! ```
//!
//! Policies:
//! - `round-robin`: "round robin L4", the baseline: equal weights, no affinity, no load
//!   bound, and `balancer.round_robin`: every connection takes the next backend in turn (in the
//!   kernel, a per-model turn counter). Untagged.
//! - `random`: "random L4": equal weights, no affinity, no load bound: one stateless Maglev
//!   lookup per connection. The replay does not tag these sockets (an L4 balancer knows no
//!   conversation and no memory need), so the key is the socket cookie: a uniformly random
//!   backend per connection. (A tagged socket would be hashed by its conversation.)
//! - `least-conn`: equal weights, no affinity, bounded loads with `load_factor = 1.01`: a
//!   backend is skipped once its in-flight count exceeds 1.01 x the mean, which with c ~ 1 is
//!   least-loaded placement. Untagged, like `random`.
//! - `ailb`: ailb in full. rnacos, one `ailb agent` per GPU (NVML through the fake library that
//!   the simulated GPU keeps up to date, load from its vLLM metrics, every 200 ms), and the
//!   gateway with Nacos discovery and the AI-aware policy (GPU capability A100 3, RTX 3090 1;
//!   load, utilisation, live free memory and its idle capacity), conversation affinity, load
//!   bound 1.25. Its sockets carry the conversation and memory tags.
//! - `ailb-static`: the same data plane on a static config: weights 3 / 1, each backend's
//!   `free_memory_mb` fixed at its KV budget, no telemetry. Tagged like `ailb`.
//! - `ailb-gateway`, `ailb-static-gateway`: ailb in full, or on the static config, through its
//!   front door ([`front_door`]): the same `ailb run`, plus `ailb gateway` in the same child
//!   cgroup; the replay sends it plain untagged HTTP with `X-Session-ID`, as to nginx, and the
//!   gateway estimates each request's memory from its prompt and `max_tokens`.
//! - `ailb-prefix`, `ailb-gateway-prefix`: ailb in full with the model's prefix-aware pick
//!   (`prefix = "approximate"`, `prefix_ttl` = `--ailb-prefix-ttl-s` over the time scale): through
//!   the socket ABI, whose sockets then also carry the prompt's text prefix keys, or through
//!   the front door with `prefix_keys = true` (text keys: 64-byte chunks of the messages).
//! - `ailb-gateway-precise` (with `--sim-tokenizer DIR` only): ailb in full with `prefix =
//!   "precise"` through its front door, whose keys are token-exact (the model folder's tokenizer
//!   and chat template). Every GPU of such a race tokenizes its prompts with that folder as vLLM
//!   does and publishes KV events in vLLM's format, in the simulator's 512-token blocks, on its
//!   own address; each agent carries the endpoints in its instance's metadata, and `ailb run`
//!   follows them into the kernel's map. Every other policy of the race runs on the same
//!   tokenizing fleet, so that the rows stay comparable.
//! - `ailb-gateway-admission`: `ailb-gateway` with the front door's admission by fleet memory
//!   (`[gateway.admission] mode = "fleet_memory"`, `--admission-factor`, `--admission-max-wait-s`
//!   in simulated seconds): past the fleet's KV a request waits, then gets 503, a failure.
//! - `nginx`: nginx L7 round robin (`proxy_buffering off`), untagged, no ailb.
//! - `sglang-cache-aware`, `sglang-round-robin`, `smg-cache-aware`, `smg-prefix-hash`,
//!   `smg-least-load`, `vllm-cache-aware`, `vllm-consistent-hash`: the routers users would pick
//!   instead ([`peers`]: `sglang-router` 0.3.2 and `vllm-router` 0.1.17 from `target/peers-venv`,
//!   SMG 1.13.0 from `target/smg-venv`), untagged, no ailb; they read the prompt text and the
//!   `X-Session-ID` header the replay sends. A router that is not installed is reported as such.
//!
//! Workloads: the Mooncake trace (default), `--synthetic` (conversations of short questions and
//! long generations) and `--shared-prefix` (tenants' long system prompts, every request a
//! different user's question and no conversation, `ailb_sim::replay::shared_prefix`). The report
//! gives every policy's prompt tokens served from the GPUs' prefix caches, by their own count,
//! and ailb's best against the best peer's.
//!
//! For every policy with a userspace router on the request path (nginx, the peers, ailb's front
//! door) the report gives that process's CPU seconds per 1,000 requests ([`cpu`]), and `ailb
//! run`'s, which is off the request path.

pub mod args;
pub mod cpu;
pub mod front_door;
pub mod outcome;
pub mod peers;
pub mod plot_data;
pub mod plots;
pub mod policy;
pub mod real;
pub mod report;
pub mod run;
pub mod seeds;
pub mod weights;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ailb_sim::fleet_model;
use ailb_sim::replay::synthetic::SyntheticOpts;
use ailb_sim::replay::{self, trace, RequestSpec, RunOpts, TraceSelect};
use ailb_tests::{preflight, CgroupGuard};
use anyhow::Context;

use self::args::Args;
use self::outcome::Outcome;
use self::policy::Policy;

/// The model every simulated GPU serves.
pub const MODEL: &str = "sim-7b";
/// The gateway's VIP for the model (nginx listens elsewhere, on the fleet's port).
pub const VIP: &str = "127.77.10.1:8000";

/// `ailb-compare`: either the replay worker of one policy (`--replay-worker`), or the whole
/// comparison.
pub fn main(args: Args) -> anyhow::Result<()> {
    if let Some(vip) = &args.replay_worker {
        let out = args.worker_out.clone().context("--replay-worker needs --worker-out")?;
        return replay_worker(&args, vip, &out);
    }
    if let Some(addr) = &args.real_worker {
        return real::worker(&args, addr);
    }
    if args.engine == args::Engine::Vllm {
        crate::stop::install()?;
        return real::main(&args);
    }
    if args.replot {
        return plot_data::replot(&args.out_dir);
    }
    args.validate()?;
    crate::stop::install()?;
    if args.seeds > 1 {
        return seeds::main(&args);
    }
    let (_, md) = compare(&args, &build_specs(&args)?)?;
    println!("{md}");
    Ok(())
}

/// One comparison: every policy of `--policies` on `specs` (the requests `args` describes: the
/// replay workers build the same list), its reports written under `--out-dir`; returns the
/// outcomes and the report.
pub fn compare(args: &Args, specs: &[RequestSpec]) -> anyhow::Result<(Vec<Outcome>, String)> {
    let (policies, not_run) = policies(args)?;
    let workload = Workload::of(specs, args);
    let ailb = preflight();
    let cg = CgroupGuard::new("compare");
    let mut outs = Vec::new();
    for (k, p) in policies.iter().enumerate() {
        crate::stop::check("the race")?;
        // A port per policy, so that a new fleet never waits for the old one's sockets.
        let out = run::run_policy(args, &ailb, &cg, *p, 18_100 + k as u16, &workload)?;
        eprintln!(
            "ailb-compare: {}: {} failures of {}, e2e p95 {:?} ms",
            p.title(),
            out.failures(),
            out.requests(),
            out.pct("e2e_ms", "p95")
        );
        outs.push(out);
    }
    let md = write_reports(args, &outs, &workload, &not_run)?;
    Ok((outs, md))
}

/// A policy asked for that could not run, and why.
pub type NotRun = (Policy, String);

/// `--policies`, without nginx when it is not installed; and the peer routers that are not
/// installed, with the reason (a row of their own in the report).
fn policies(args: &Args) -> anyhow::Result<(Vec<Policy>, Vec<NotRun>)> {
    let mut policies = args.policies.split(',').map(Policy::parse).collect::<anyhow::Result<Vec<_>>>()?;
    if policies.contains(&Policy::SmgKvEvents) {
        anyhow::bail!(
            "--policies: smg-kv-events runs only with --engine vllm: SMG reads KV events only from gRPC workers \
             (an engine behind SMG's gRPC servicer), and a simulated GPU is an HTTP worker"
        );
    }
    if let Some(p) = policies.iter().find(|p| p.real_engines_only()) {
        anyhow::bail!("--policies: {} runs only with --engine vllm (in front of real servers)", p.key());
    }
    if policies.contains(&Policy::AilbGatewayPrecise) && args.sim_tokenizer.is_none() {
        anyhow::bail!(
            "--policies: ailb-gateway-precise on simulated GPUs needs --sim-tokenizer DIR (the GPUs then tokenize \
             and publish KV events, for every policy of the race)"
        );
    }
    let have_nginx = Command::new("nginx").arg("-v").stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if policies.contains(&Policy::Nginx) && !have_nginx {
        eprintln!("ailb-compare: nginx is not installed (cargo xtask setup installs nginx-light): skipping it");
        policies.retain(|p| *p != Policy::Nginx);
    }
    let mut not_run = Vec::new();
    policies.retain(|p| match peers::missing(*p, &peers::venv_of(*p)) {
        Some(why) => {
            eprintln!("ailb-compare: {}: {why}: skipping it", p.title());
            not_run.push((*p, why));
            false
        }
        None => true,
    });
    Ok((policies, not_run))
}

/// Writes `replay.md`, `replay-cdf.svg`, `replay-util.svg` and the plots' data
/// (`replay-plots.json`) under `--out-dir` (and `--json`); returns the Markdown.
fn write_reports(args: &Args, outs: &[Outcome], workload: &Workload, not_run: &[NotRun]) -> anyhow::Result<String> {
    let mut md = report::markdown(args, outs, workload);
    md.push_str(&report::peers(outs, not_run));
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    std::fs::write(args.out_dir.join("replay.md"), &md).context("writing replay.md")?;
    std::fs::write(args.out_dir.join("replay-cdf.svg"), plots::cdf_svg(outs)?).context("writing replay-cdf.svg")?;
    std::fs::write(args.out_dir.join("replay-util.svg"), plots::util_svg(outs)?).context("writing replay-util.svg")?;
    plot_data::save(&args.out_dir, outs)?;
    if let Some(j) = &args.json {
        std::fs::write(j, format!("{:#}\n", report::json(outs, workload))).context("writing the JSON")?;
    }
    Ok(md)
}

/// What every policy's run shares: the request list's arrival window and the oracles' prefix
/// hit rates (the trace is parsed once, here and in each replay worker).
pub struct Workload {
    /// Real seconds from the first to the last planned arrival.
    pub window_s: f64,
    /// Caches that never evict: an upper bound no placement reaches on finite GPUs.
    pub unbounded_prefix_hit_rate: Option<f64>,
    /// The prefix-cache oracle: the placement that sends every request to the GPU holding its
    /// conversation's longest cached prefix, on the same GPUs and load, in the fleet model.
    pub oracle_prefix_hit_rate: f64,
}

impl Workload {
    /// The window and the oracles of `specs` replayed as `args` say.
    pub fn of(specs: &[RequestSpec], args: &Args) -> Self {
        let profiles = fleet_model::fleet_profiles(args.a100, args.rtx3090);
        Workload {
            window_s: specs.iter().map(|s| s.at_ms).max().unwrap_or(0) as f64 / 1000.0 / args.speed(),
            unbounded_prefix_hit_rate: replay::oracle_prefix_hit_rate(specs),
            oracle_prefix_hit_rate: fleet_model::run(specs, &profiles, args.load, fleet_model::Placement::CacheOracle)
                .prefix_hit_rate,
        }
    }
}

/// The request list of a run (the same in every policy's replay and in the report).
pub fn build_specs(args: &Args) -> anyhow::Result<Vec<RequestSpec>> {
    Ok(if args.shared_prefix {
        replay::shared_prefix_specs(&args.shared_prefix_opts(), trace::DEFAULT_KV_MB_PER_TOKEN, MODEL)
    } else if args.synthetic {
        let opts = SyntheticOpts {
            requests: args.limit,
            conversations_per_s: args.rate,
            seed: args.seed,
            ..Default::default()
        };
        replay::synthetic_specs(&opts, trace::DEFAULT_KV_MB_PER_TOKEN, MODEL)
    } else {
        let path = args.trace.clone().unwrap_or_else(replay::default_trace_path);
        let (requests, _issues) = trace::load(&path)?;
        let (convs, _stats) = trace::conversations(&requests, trace::DEFAULT_COMMON_SHARE);
        let sel = TraceSelect { limit: Some(args.limit), model: MODEL.to_string(), ..Default::default() };
        replay::trace_specs(&requests, &convs, &sel)
    })
}

/// The replay of one policy, run inside the cgroup: the same requests as `ailb-replay` would
/// send for these options, untagged when asked.
fn replay_worker(args: &Args, vip: &str, out: &Path) -> anyhow::Result<()> {
    let mut specs = build_specs(args)?;
    if args.untagged {
        // The conversation stays: it is the `X-Session-ID` header an L7 router may read.
        replay::untag(&mut specs);
    } else if args.prefix_keys {
        for s in &mut specs {
            s.prefix_keys = true;
        }
    }
    let opts = RunOpts {
        vip: vip.parse().with_context(|| format!("--replay-worker {vip}"))?,
        speed: args.speed(),
        concurrency: 512,
        request_timeout: Duration::from_secs_f64(args.deadline_s / 2.0),
        deadline: Duration::from_secs_f64(args.deadline_s),
        progress: false,
    };
    let (records, summary) = replay::run(&specs, &opts);
    std::fs::write(out, format!("{:#}\n", replay::report_json(&summary, &records))).context("writing the report")?;
    Ok(())
}
