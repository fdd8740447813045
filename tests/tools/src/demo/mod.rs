//! `ailb-demo` (root; `cargo xtask run` builds and starts it): the whole system on this machine.
//!
//! - **rnacos**, a Nacos-compatible registry, on free loopback ports with its own data dir;
//! - a **simulated GPU fleet**: one `ailb-sim` per GPU (A100-80GB and RTX 3090 profiles, a 7B
//!   model) on 127.0.20.x:8000, each keeping a fake-NVML state file up to date; or, with
//!   `--engine vllm`, **real vLLM for CPU servers** (1 to 3) serving the tiny model that
//!   `cargo xtask setup` makes, in real time;
//! - one **`ailb agent`** per server, reading its GPU through a fake `libnvidia-ml.so` (built here
//!   with gcc from `tests/integration/fixtures/fake_nvml.c`; none for the real servers, whose free
//!   memory is their free KV cache) and the server's vLLM metrics, and registering the instance
//!   in rnacos with its metadata;
//! - the **balancer**, `ailb run` with Nacos discovery and the AI-aware policy, attached to a
//!   child cgroup created here (never the cgroup2 root);
//! - the **front door**, `ailb gateway`, inside that cgroup: an OpenAI-style HTTP server that
//!   opens a fresh upstream connection per request, tagged with the request's model, memory
//!   and conversation, so the kernel picks a backend per request;
//! - a **load generator**, `ailb-replay` (the synthetic mix of short questions and long
//!   generations, or `--trace` for the Mooncake trace), speaking plain HTTP to the front door
//!   as users' clients would (the model in the body, the conversation as `X-Session-ID`, no
//!   socket tag); with `--socket-abi` it runs inside the cgroup instead and tags each of its
//!   own connections to the VIP through the ailb client ABI;
//! - a **live view** every `--every-s` seconds: per backend its policy weight, table share,
//!   in-flight connections, picks, and the GPU's utilisation, KV-cache use and queue.
//!
//! Traffic stays on loopback. Ctrl-C (or the replay finishing, or `--duration-s`) stops
//! everything: each process by its pid, the pins (`ailb teardown`), the cgroup, the temp dirs
//! (RAII guards, also on a panic).

mod fleet;
mod view;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ailb_sim::replay;
use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::nacos::{free_port, RnacosServer};
use ailb_tests::status::live_backends;
use ailb_tests::{base_config, preflight, wait_until, CgroupGuard, Daemon, GatewayProcess};
use anyhow::{bail, Context};
use clap::Parser;
use serde_json::Value;

use self::fleet::Node;
use self::view::view;
use crate::sim_gpus::{sibling_bin, Proc};

/// The model the simulated fleet serves.
const SIM_MODEL: &str = "sim-7b";
/// The name the real servers serve the tiny model under.
const VLLM_MODEL: &str = "tiny-llama";
const VIP: &str = "127.77.20.1:8000";

/// The model servers of the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Simulated GPUs (`ailb-sim`), time-scaled.
    Sim,
    /// Real vLLM for CPU servers with the tiny model, in real time.
    Vllm,
}

#[derive(Debug, Parser)]
#[command(name = "ailb-demo", about = "rnacos + model servers + agents + ailb + load, live (root)")]
pub struct Args {
    /// The model servers: simulated GPUs, or real vLLM for CPU servers (`cargo xtask setup`
    /// installs the engine and makes its tiny model).
    #[arg(long, value_enum, default_value_t = EngineKind::Sim)]
    pub engine: EngineKind,
    /// With `--engine vllm`: how many real servers (1 to 3).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Simulated A100-80GB GPUs.
    #[arg(long, default_value_t = 2)]
    pub a100: usize,
    /// Simulated RTX 3090 24GB GPUs.
    #[arg(long, default_value_t = 2)]
    pub rtx3090: usize,
    /// Simulated seconds per real second (GPUs and load together; real servers run at 1).
    #[arg(long, default_value_t = 10.0)]
    pub time_scale: f64,
    /// Requests the load generator sends (default 1500; 60 on real servers).
    #[arg(long)]
    pub requests: Option<usize>,
    /// New synthetic conversations per second of the load's clock (default 2; 0.3 on real
    /// servers, which serve a few requests a second on this machine's cores).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Replay the Mooncake trace instead of the synthetic mix.
    #[arg(long)]
    pub trace: bool,
    /// Stop after this many seconds even if the load is not done (0: when it is done).
    #[arg(long, default_value_t = 0)]
    pub duration_s: u64,
    /// Seconds between two live views.
    #[arg(long, default_value_t = 2)]
    pub every_s: u64,
    /// The load skips the front door: it runs inside the cgroup and tags each of its own
    /// connections to the VIP through the ailb client ABI (the socket-ABI path).
    #[arg(long)]
    pub socket_abi: bool,
}

fn say(msg: &str) {
    eprintln!("[demo] {msg}");
}

impl Args {
    fn model(&self) -> &'static str {
        match self.engine {
            EngineKind::Sim => SIM_MODEL,
            EngineKind::Vllm => VLLM_MODEL,
        }
    }

    /// The load's speed: the simulated fleet's time scale, or real time.
    fn speed(&self) -> f64 {
        match self.engine {
            EngineKind::Sim => self.time_scale,
            EngineKind::Vllm => 1.0,
        }
    }

    fn requests(&self) -> usize {
        self.requests.unwrap_or(if self.engine == EngineKind::Vllm { 60 } else { 1500 })
    }

    fn rate(&self) -> f64 {
        self.rate.unwrap_or(if self.engine == EngineKind::Vllm { 0.3 } else { 2.0 })
    }
}

/// `ailb-demo`: starts everything, shows the live view until the load is done (or Ctrl-C, or
/// `--duration-s`), reports the load and stops everything in order.
pub fn main(args: Args) -> anyhow::Result<()> {
    if args.engine == EngineKind::Sim && (args.a100 + args.rtx3090 == 0 || args.a100 + args.rtx3090 > 200) {
        bail!("--a100 + --rtx3090: 1 to 200 GPUs");
    }
    if !(args.time_scale > 0.0 && args.rate() > 0.0) {
        bail!("--time-scale and --rate must be positive");
    }
    let ailb = preflight();
    crate::stop::install()?;
    let dir = tempfile::Builder::new().prefix("ailb-demo-").tempdir().context("temp dir")?;
    say(&format!("logs and configs: {} (removed at exit)", dir.path().display()));

    let cg = CgroupGuard::new("demo");
    say(&format!("child cgroup {} (the programs attach here only)", cg.path().display()));
    let nacos = RnacosServer::start();
    say(&format!("rnacos at {}", nacos.url()));

    let mut gpus = fleet::start(&args, args.model(), &nacos, dir.path())?;
    let front_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let daemon = start_balancer(&ailb, &cg, &nacos, args.model(), gpus.len(), front_addr);
    let mut front = GatewayProcess::start(&ailb, daemon.config_path(), &cg, front_addr);
    say(&format!(
        "front door `ailb gateway` (pid {}) in the cgroup: http://{front_addr}/v1/chat/completions",
        front.pid()
    ));

    let out = dir.path().join("replay.json");
    let mut load = start_load(&args, &cg, front_addr, dir.path(), &out)?;
    let started = Instant::now();
    let mut world = World { daemon: &daemon, front: &mut front, gpus: &mut gpus };
    let finished = watch(&args, &mut world, &mut load, dir.path(), started)?;
    print!("{}", view(&daemon, args.model(), front_addr, &gpus, started));
    if let Some(st) = finished {
        load_done(st, dir.path(), &out)?;
    }
    say("tearing down: load, front door, agents (they deregister), servers, balancer (pins removed), rnacos, cgroup");
    drop(load);
    drop(front);
    drop(gpus);
    drop(daemon);
    drop(nacos);
    drop(cg);
    say("done: nothing left running, no pins, no cgroup");
    Ok(())
}

/// The balancer, `ailb run` with Nacos discovery and the AI-aware policy, ready once all `n`
/// GPUs are live in its table. Its config also holds the front door's `[gateway]` section
/// (listening on `front`), which `ailb run` ignores.
fn start_balancer(
    ailb: &Path,
    cg: &CgroupGuard,
    nacos: &RnacosServer,
    model: &str,
    n: usize,
    front: SocketAddr,
) -> Daemon {
    let listen = format!("127.0.0.1:{}", free_port());
    // GPU capability: the simulated A100 prefills 2.7x and decodes 1.6x as fast as the 3090.
    // The tiny model's requests need megabytes, not the simulated 7B's 2 GB.
    let required = if model == SIM_MODEL { "required_memory_mb = 2048\n" } else { "" };
    let mut cfg = base_config("demo", cg);
    cfg.listen = Some(listen.clone());
    cfg.extra = format!(
        "[[models]]\nname = \"{model}\"\nvips = [\"{VIP}\"]\n{required}affinity_ttl = \"10m\"\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"200ms\"\n\n\
         [policy.gpu_capability]\n\"A100-80GB\" = 2.0\n\"RTX3090-24GB\" = 1.0\n\n\
         [gateway]\nlisten = [\"{front}\"]\n",
        nacos.url()
    );
    let daemon = Daemon::start(ailb, &cfg);
    say(&format!(
        "balancer `ailb run` ready: VIP {VIP}, metrics http://{listen}/metrics, plan http://{listen}/v1/plan"
    ));
    wait_until(
        "every server registered by its agent and live in the balancer's table",
        Duration::from_secs(30),
        || (live_backends(&daemon.status(), model) == n).then_some(()),
    );
    say(&format!("all {n} servers are in the table; starting the load"));
    daemon
}

/// The load generator, `ailb-replay`, writing its report to `out` and its output to `dir`: plain
/// HTTP to the front door at `front` from outside the cgroup (its clients need not be in it),
/// or with `--socket-abi` inside the cgroup, tagging its own connections to the VIP.
fn start_load(args: &Args, cg: &CgroupGuard, front: SocketAddr, dir: &Path, out: &Path) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(sibling_bin("ailb-replay"));
    if args.socket_abi {
        cmd.args(["--vip", VIP]);
    } else {
        cmd.arg("--gateway").arg(front.to_string());
    }
    cmd.args(["--model", args.model(), "--limit", &args.requests().to_string()])
        .args(["--speed", &args.speed().to_string(), "--concurrency", "256", "--quiet"])
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("replay.log"))?)
        .stderr(std::fs::File::create(dir.join("replay.err"))?);
    if args.trace {
        cmd.arg("--trace").arg(replay::default_trace_path());
    } else {
        cmd.args(["--synthetic", "--rate", &args.rate().to_string()]);
    }
    let (child, path) = if args.socket_abi {
        (spawn_in_cgroup(&mut cmd, cg.path()), format!("in the cgroup, socket tags to the VIP {VIP}"))
    } else {
        (cmd.spawn().context("starting ailb-replay")?, format!("plain HTTP to the front door http://{front}"))
    };
    let load = Proc { name: "ailb-replay".into(), child };
    say(&format!(
        "load: ailb-replay ({}, {} requests, speed x{}), {path}; Ctrl-C stops the demo",
        if args.trace { "Mooncake trace" } else { "synthetic mix" },
        args.requests(),
        args.speed()
    ));
    Ok(load)
}

/// What the live view watches besides the load.
struct World<'a> {
    daemon: &'a Daemon,
    front: &'a mut GatewayProcess,
    gpus: &'a mut [Node],
}

/// Shows the live view every `--every-s` until the load exits (its status), or Ctrl-C or
/// `--duration-s` (`None`); an error when a GPU, an agent or the front door exits first.
fn watch(
    args: &Args,
    w: &mut World<'_>,
    load: &mut Proc,
    dir: &Path,
    started: Instant,
) -> anyhow::Result<Option<ExitStatus>> {
    let every = Duration::from_secs(args.every_s.max(1));
    let mut next = started;
    let finished = loop {
        if crate::stop::requested() {
            say("Ctrl-C: stopping");
            break None;
        }
        if args.duration_s > 0 && started.elapsed() >= Duration::from_secs(args.duration_s) {
            say("--duration-s reached: stopping");
            break None;
        }
        if let Some(st) = load.exited() {
            break Some(st);
        }
        if let Some(st) = w.front.exited() {
            bail!("the front door `ailb gateway` exited ({st}):\n{}", w.front.log());
        }
        for g in w.gpus.iter_mut() {
            if let Some(st) = g.agent.exited() {
                bail!("{} exited ({st}); logs in {}", g.agent.name, dir.display());
            }
            if let Some((name, st)) = g.server.exited() {
                bail!("{name} exited ({st}); logs in {}", dir.display());
            }
        }
        if Instant::now() >= next {
            next += every;
            print!("{}", view(w.daemon, args.model(), w.front.addr(), w.gpus, started));
            let _ = std::io::stdout().flush();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(finished)
}

/// The load's summary line, from its report at `out` (or its stderr in `dir` when it failed).
fn load_done(st: ExitStatus, dir: &Path, out: &Path) -> anyhow::Result<()> {
    if !st.success() {
        let err = std::fs::read_to_string(dir.join("replay.err")).unwrap_or_default();
        bail!("the load generator failed ({st}): {err}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(out).context("reading the replay report")?)
        .context("parsing the replay report")?;
    let s = &v["summary"];
    let ms = |k: &str, p: &str| s[k][p].as_f64().map_or("-".into(), |x| format!("{x:.0} ms"));
    let pc = |k: &str| s[k].as_f64().map_or("-".into(), |x| format!("{:.1} %", x * 100.0));
    say(&format!(
        "load done: {} requests, {} failed; TTFT p50 {} p95 {}; end-to-end p50 {} p95 {}; affinity hits {}, \
         prefix-cache hits {}",
        s["requests"],
        s["failures"],
        ms("ttft_ms", "p50"),
        ms("ttft_ms", "p95"),
        ms("e2e_ms", "p50"),
        ms("e2e_ms", "p95"),
        pc("affinity_hit_rate"),
        pc("prefix_cache_hit_rate"),
    ));
    Ok(())
}
