//! `ailb-compare` (root): balancing policies compared in one run, on the same simulated GPU
//! fleet and the same request list (issue 5).
//!
//! For each policy it starts a fresh fleet of `ailb-sim` processes on 127.0.10.x (so every
//! policy begins with empty KV caches and idle GPUs), a fresh `ailb run` attached to a child
//! cgroup created here, and runs the replay (`ailb_sim::replay`, the library of
//! `ailb-replay`, in a re-exec of this binary) inside that cgroup against the VIP, sampling
//! every GPU's `/sim/state` while it runs. Then it writes a Markdown report, an SVG of the
//! end-to-end latency CDFs and an SVG of every GPU's utilisation over time per policy under
//! `--out-dir`, and prints the report.
//!
//! ```text
//! ailb-compare [--limit 300] [--load 1.0] [--time-scale 20] [--synthetic] [--rate R]
//!              [--a100 2] [--rtx3090 4] [--policies round-robin,random,least-conn,ailb,nginx]
//!              [--out-dir target/bench] [--json FILE] [--trace PATH]
//!              [--sim-bin PATH]
//! ```
//!
//! Policies:
//! - `round-robin`: "round robin L4", the issue's baseline: equal weights, no affinity, no load
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
//! - `nginx`: nginx L7 round robin (`proxy_buffering off`), untagged, no ailb.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::net::{SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ailb_sim::fleet_model;
use ailb_sim::replay::client::RequestSpec;
use ailb_sim::replay::synthetic::SyntheticOpts;
use ailb_sim::replay::{self, percentile, trace, RunOpts, TraceSelect};
use ailb_sim::GpuProfile;
use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::nacos::RnacosServer;
use ailb_tests::status::live_backends;
use ailb_tests::{base_config, preflight, wait_until, BackendCfg, CgroupGuard, Daemon};
use ailb_tools::sim_gpus::{self, sibling_bin, Proc, SimGpu, SimOpts};
use anyhow::{bail, Context};
use clap::Parser;
use serde_json::{json, Value};

const MODEL: &str = "sim-7b";
const VIP: &str = "127.77.10.1:8000";

#[derive(Debug, Parser)]
#[command(name = "ailb-compare", about = "Balancing policies compared on one simulated GPU fleet (root)")]
struct Args {
    /// Requests to replay (the first N of the trace, or N synthetic ones).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Offered load relative to the trace's own rate (the replay runs at
    /// `--speed = load x time-scale`, so the trace's clock and the GPUs' clock agree at 1.0).
    /// The default, 0.4, is the highest load at which the default fleet is stable under a
    /// clairvoyant placement (`ailb-fleet-model`): a fleet provisioned for its traffic. At 0.5
    /// and above no placement keeps the queues from growing for as long as the run lasts.
    #[arg(long, default_value_t = 0.4)]
    load: f64,
    /// Simulated seconds per real second, for every GPU.
    #[arg(long, default_value_t = 20.0)]
    time_scale: f64,
    /// The synthetic mix instead of the Mooncake trace.
    #[arg(long)]
    synthetic: bool,
    /// New synthetic conversations per (simulated) second.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Number of simulated A100-80GB GPUs.
    #[arg(long, default_value_t = 2)]
    a100: usize,
    /// Number of simulated RTX 3090 24GB GPUs.
    #[arg(long, default_value_t = 4)]
    rtx3090: usize,
    /// Comma-separated policies, run in this order: round-robin, random, least-conn, ailb, nginx
    /// (nginx L7 round robin, `proxy_buffering off`; needs `nginx` on PATH).
    #[arg(long, default_value = "round-robin,random,least-conn,ailb,ailb-static,nginx")]
    policies: String,
    /// Where `replay.md`, `replay-cdf.svg` and `replay-util.svg` go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
    /// Also write the numbers as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Mooncake trace (default: `ailb-replay`'s, `$AILB_TRACE` or `../shared/traces/...`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// `ailb-sim` binary (default: next to this one).
    #[arg(long)]
    sim_bin: Option<PathBuf>,
    /// Internal: run the replay against this VIP (inside the cgroup) and exit.
    #[arg(long, hide = true)]
    replay_worker: Option<String>,
    /// Internal: where the replay worker writes its JSON report.
    #[arg(long, hide = true)]
    worker_out: Option<PathBuf>,
    /// Internal: the replay worker sends no conversation or memory tag.
    #[arg(long, hide = true)]
    untagged: bool,
    /// Limit of the replay of one policy, real seconds.
    #[arg(long, default_value_t = 300.0)]
    deadline_s: f64,
    /// ailb's (and ailb-static's) load bound factor c (the daemon's default, 1.25).
    #[arg(long, default_value_t = 1.25)]
    ailb_load_factor: f64,
    /// ailb's (and ailb-static's) `affinity_wait` in simulated seconds (the daemon's default,
    /// 20 s); the gateway, which runs in real time, gets it divided by the time scale.
    #[arg(long, default_value_t = 20.0)]
    ailb_affinity_wait_s: f64,
    /// The A100's GPU capability (weight) against the RTX 3090's 1, for ailb and ailb-static.
    #[arg(long, default_value_t = 3.0)]
    a100_capability: f64,
    /// How often each `ailb agent` of ailb in full publishes (real time; its default on real
    /// GPUs is 1 s, which is 50 ms at the default time scale of 20).
    #[arg(long, default_value = "200ms")]
    agent_interval: String,
    /// Also keep every request's record (the replay's JSON report) as `records-<policy>.json`
    /// in the output directory, with the gateway's log (`daemon-<policy>.log`) and, for ailb in
    /// full, the agents' logs.
    #[arg(long)]
    keep_records: bool,
    /// A `[policy]` setting of ailb in full, `KEY=VALUE` in TOML (repeatable), e.g.
    /// `--ailb-policy load_scale=16`.
    #[arg(long = "ailb-policy", value_name = "KEY=VALUE")]
    ailb_policy: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    RoundRobin,
    Random,
    LeastConn,
    Ailb,
    AilbStatic,
    Nginx,
}

impl Policy {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s.trim() {
            "round-robin" => Self::RoundRobin,
            "random" => Self::Random,
            "least-conn" => Self::LeastConn,
            "ailb" => Self::Ailb,
            "ailb-static" => Self::AilbStatic,
            "nginx" => Self::Nginx,
            other => bail!("unknown policy {other:?} (round-robin, random, least-conn, ailb, ailb-static, nginx)"),
        })
    }
    fn key(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::Random => "random",
            Self::LeastConn => "least-conn",
            Self::Ailb => "ailb",
            Self::AilbStatic => "ailb-static",
            Self::Nginx => "nginx",
        }
    }
    fn title(self) -> &'static str {
        match self {
            Self::RoundRobin => "round robin L4",
            Self::Random => "random L4",
            Self::LeastConn => "least connections",
            Self::Ailb => "ailb",
            Self::AilbStatic => "ailb, static config",
            Self::Nginx => "nginx L7 round robin",
        }
    }
}

/// Starts the fleet on port `port` (each server keeping its fake NVML state, which the agents
/// of the full ailb read) and waits for every `/health`.
fn start_fleet(args: &Args, sim_bin: &Path, port: u16) -> anyhow::Result<Vec<SimGpu>> {
    let opts = SimOpts { sim_bin, model: MODEL, time_scale: args.time_scale, sample_interval_ms: 100, log: None };
    std::iter::repeat_n("a100-80gb", args.a100)
        .chain(std::iter::repeat_n("rtx3090-24gb", args.rtx3090))
        .enumerate()
        .map(|(i, profile)| SimGpu::start(SocketAddrV4::new([127, 0, 10, (i + 1) as u8].into(), port), profile, &opts))
        .collect()
}

/// nginx as an L7 round-robin proxy of the fleet on `listen`, SSE passed through unbuffered: a
/// single process (`master_process off`), stopped by pid on drop.
fn start_nginx(dir: &Path, listen: &str, sims: &[SimGpu]) -> anyhow::Result<Proc> {
    let servers: String = sims.iter().map(|s| format!("    server {};\n", s.addr)).collect();
    let d = dir.display();
    let conf = format!(
        "master_process off;\ndaemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
         proxy_temp_path {d}/proxy;\n  upstream sims {{\n{servers}  }}\n  server {{\n    listen {listen};\n\
         location / {{\n      proxy_pass http://sims;\n      proxy_http_version 1.1;\n\
         proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_read_timeout 600s;\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).context("writing nginx.conf")?;
    let mut child = Command::new("nginx")
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning nginx (is nginx-light installed?)")?;
    let addr: SocketAddrV4 = listen.parse().context("nginx listen address")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
            bail!("nginx exited ({st}): {log}");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("nginx did not listen on {listen} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Proc { name: "nginx".into(), child })
}

/// What one policy measured.
struct Outcome {
    policy: Policy,
    summary: Value,
    /// E2E of the successful requests, ms, sorted.
    e2e_sorted: Vec<f64>,
    /// Per request index: E2E ms when it succeeded.
    e2e_by_index: BTreeMap<u64, f64>,
    /// Per GPU: (address, profile, mean sampled utilisation, busy fraction, prefix hit share).
    gpus: Vec<(String, &'static str, f64, f64, Option<f64>)>,
    /// Failed requests by kind ("HTTP 400", "connect refused", ...).
    failure_kinds: BTreeMap<String, usize>,
    /// Utilisation samples over time: (seconds since the replay started, one value per GPU).
    util_series: Vec<(f64, Vec<f64>)>,
    /// Real seconds from the first to the last planned arrival: the window in which the
    /// balancer places requests (after it, GPUs only drain their queues).
    window_s: f64,
    wall_s: f64,
}

impl Outcome {
    fn util_mean(&self) -> f64 {
        self.gpus.iter().map(|g| g.2).sum::<f64>() / self.gpus.len().max(1) as f64
    }
    /// Max - min over the GPUs of their mean utilisation during the whole run.
    fn util_spread(&self) -> f64 {
        spread(self.gpus.iter().map(|g| g.2))
    }
    /// Mean utilisation per GPU over the samples taken while requests were still arriving.
    fn window_means(&self) -> Vec<f64> {
        let rows: Vec<&Vec<f64>> = self.util_series.iter().filter(|(t, _)| *t <= self.window_s).map(|r| &r.1).collect();
        (0..self.gpus.len())
            .map(|g| {
                let v: Vec<f64> = rows.iter().filter_map(|r| r.get(g).copied().filter(|u| u.is_finite())).collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            })
            .collect()
    }
    fn window_mean(&self) -> f64 {
        let m = self.window_means();
        m.iter().sum::<f64>() / m.len().max(1) as f64
    }
    /// The issue's utilisation spread: max - min of the per-GPU means while requests arrive.
    fn window_spread(&self) -> f64 {
        spread(self.window_means().into_iter())
    }
    fn failures(&self) -> u64 {
        self.summary["failures"].as_u64().unwrap_or(0)
    }
    fn requests(&self) -> u64 {
        self.summary["requests"].as_u64().unwrap_or(0)
    }
    fn pct(&self, what: &str, p: &str) -> Option<f64> {
        self.summary[what][p].as_f64()
    }
}

/// Why a request failed, in a few words; `None` when it succeeded.
fn failure_kind(r: &Value) -> Option<String> {
    if r["status"].as_u64() == Some(200) && r["error"].is_null() {
        return None;
    }
    let err = r["error"].as_str().unwrap_or_default();
    Some(if err.starts_with("connect") && err.contains("refused") {
        "connect refused (no backend fits)".to_string()
    } else if err.starts_with("connect") {
        "connect failed".to_string()
    } else if let Some(st) = r["status"].as_u64().filter(|&s| s != 200) {
        format!("HTTP {st}")
    } else if err.contains("timed out") || err.contains("deadline") {
        "timed out".to_string()
    } else {
        "stream error".to_string()
    })
}

fn spread(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.iter().copied().fold(f64::MIN, f64::max) - v.iter().copied().fold(f64::MAX, f64::min)
}

/// `balancer.affinity_wait` in real time: the simulated GPUs run `time_scale` times faster, and
/// so do their prefix caches turn over.
fn affinity_wait(args: &Args) -> String {
    format!("{}ms", (args.ailb_affinity_wait_s * 1000.0 / args.time_scale).round() as u64)
}

/// The gateway of the full ailb: instances, metadata and weights from the agents through rnacos
/// (the AI-aware policy), the same capability ratio as the static config's weights.
fn nacos_config(cg: &CgroupGuard, nacos: &RnacosServer, args: &Args) -> ailb_tests::TestConfig {
    let a100 = args.a100_capability;
    let mut cfg = base_config("cmp-ailb", cg);
    cfg.affinity = true;
    cfg.load_bound = true;
    cfg.load_factor = args.ailb_load_factor;
    cfg.affinity_wait = affinity_wait(args);
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\n\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n\n\
         [policy]\n{}\n[policy.gpu_capability]\n\"A100-80GB\" = {a100:?}\n\"RTX3090-24GB\" = 1.0\n",
        nacos.url(),
        args.ailb_policy.join("\n"),
    );
    cfg
}

fn config_for(policy: Policy, cg: &CgroupGuard, sims: &[SimGpu], args: &Args) -> ailb_tests::TestConfig {
    let mut cfg = base_config(&format!("cmp-{}", policy.key()), cg).service(MODEL, VIP);
    match policy {
        Policy::RoundRobin => {
            cfg.affinity = false;
            cfg.load_bound = false;
            cfg.round_robin = true;
        }
        Policy::Random => {
            cfg.affinity = false;
            cfg.load_bound = false;
        }
        Policy::LeastConn => {
            cfg.affinity = false;
            cfg.load_bound = true;
            cfg.load_factor = 1.01;
        }
        Policy::Ailb | Policy::AilbStatic => {
            cfg.affinity = true;
            cfg.load_bound = true;
            cfg.load_factor = args.ailb_load_factor;
            cfg.affinity_wait = affinity_wait(args);
        }
        // Never started for nginx (it proxies instead of ailb); the defaults would do.
        Policy::Nginx => {}
    }
    for s in sims {
        let addr = s.addr.to_string();
        let b = match policy {
            Policy::Ailb | Policy::AilbStatic => {
                let p = GpuProfile::preset(s.profile).expect("preset");
                let kv_mb = ((p.kv_blocks() * p.block_bytes()) >> 20) as u32;
                // Static weights are whole numbers: the capability ratio in tenths.
                let w = if s.profile.starts_with("a100") { (args.a100_capability * 10.0).round() as u32 } else { 10 };
                BackendCfg::new(MODEL, &addr, w).free_memory_mb(kv_mb)
            }
            _ => BackendCfg::new(MODEL, &addr, 1),
        };
        cfg = cfg.backend(b);
    }
    cfg
}

/// What every policy's run shares: the request list's arrival window and the oracles' prefix
/// hit rates (the trace is parsed once, here and in each replay worker).
struct Workload {
    /// Real seconds from the first to the last planned arrival.
    window_s: f64,
    /// Caches that never evict: an upper bound no placement reaches on finite GPUs.
    unbounded_prefix_hit_rate: Option<f64>,
    /// The issue's oracle: the placement that sends every request to the GPU holding its
    /// conversation's longest cached prefix, on the same GPUs and load, in the fleet model.
    oracle_prefix_hit_rate: f64,
}

fn run_policy(
    args: &Args,
    ailb: &Path,
    cg: &CgroupGuard,
    policy: Policy,
    port: u16,
    workload: &Workload,
) -> anyhow::Result<Outcome> {
    let sim_bin = args.sim_bin.clone().unwrap_or_else(|| sibling_bin("ailb-sim"));
    let sims = start_fleet(args, &sim_bin, port)?;
    let dir = tempfile::tempdir().context("temp dir")?;
    // The full ailb: rnacos, an agent per GPU, the gateway with Nacos discovery; dropped after
    // the daemon (agents first, so that they deregister).
    let mut registry = None;
    let mut agents = Vec::new();
    let (daemon, nginx, vip) = match policy {
        Policy::Nginx => {
            let vip = format!("127.0.10.250:{port}");
            (None, Some(start_nginx(dir.path(), &vip, &sims)?), vip)
        }
        Policy::Ailb => {
            let nacos = registry.insert(RnacosServer::start());
            for s in &sims {
                agents.push(s.start_agent(MODEL, &nacos.url(), &args.agent_interval, dir.path())?);
            }
            let daemon = Daemon::start(ailb, &nacos_config(cg, nacos, args));
            wait_until("every GPU registered by its agent and live in the table", Duration::from_secs(30), || {
                (live_backends(&daemon.status(), MODEL) == sims.len()).then_some(())
            });
            (Some(daemon), None, VIP.to_string())
        }
        _ => (Some(Daemon::start(ailb, &config_for(policy, cg, &sims, args))), None, VIP.to_string()),
    };
    let out = dir.path().join("replay.json");
    let speed = args.load * args.time_scale;
    let me = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(me);
    cmd.args(["--replay-worker", &vip, "--limit", &args.limit.to_string(), "--load", &args.load.to_string()])
        .args(["--time-scale", &args.time_scale.to_string(), "--seed", &args.seed.to_string()])
        .args(["--deadline-s", &args.deadline_s.to_string()])
        .arg("--worker-out")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if args.synthetic {
        cmd.args(["--synthetic", "--rate", &args.rate.to_string()]);
    } else if let Some(t) = &args.trace {
        cmd.arg("--trace").arg(t);
    }
    if !matches!(policy, Policy::Ailb | Policy::AilbStatic) {
        cmd.arg("--untagged");
    }
    eprintln!("ailb-compare: {}: replaying {} requests at speed {speed}", policy.title(), args.limit);
    let start = Instant::now();
    let mut child = spawn_in_cgroup(&mut cmd, cg.path());
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut util: Vec<Vec<f64>> = vec![Vec::new(); sims.len()];
    let mut util_series: Vec<(f64, Vec<f64>)> = Vec::new();
    let mut progress = Instant::now() + Duration::from_secs(5);
    let hard = start + Duration::from_secs_f64(args.deadline_s + args.deadline_s / 2.0 + 30.0);
    let mut next = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the replay")? {
            break st;
        }
        if Instant::now() >= hard {
            let _ = child.kill(); // SIGKILL to this child's pid only
            let _ = child.wait();
            bail!("the replay did not finish in time");
        }
        if Instant::now() >= next {
            next += Duration::from_millis(250);
            let mut row = Vec::with_capacity(sims.len());
            for (i, s) in sims.iter().enumerate() {
                let u = sim_gpus::http_get(s.addr, "/sim/state")
                    .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
                    .map(|v| v["utilization"].as_f64().unwrap_or(0.0));
                if let Some(u) = u {
                    util[i].push(u);
                }
                row.push(u.unwrap_or(f64::NAN));
            }
            util_series.push((start.elapsed().as_secs_f64(), row));
            if Instant::now() >= progress {
                progress += Duration::from_secs(5);
                let now: Vec<String> = util_series
                    .last()
                    .map(|(_, r)| r.iter().map(|u| format!("{:.0}", u * 100.0)).collect())
                    .unwrap_or_default();
                eprintln!(
                    "ailb-compare: {}: {:.0} s, GPU utilisation now [{}] %",
                    policy.title(),
                    start.elapsed().as_secs_f64(),
                    now.join(" ")
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall_s = start.elapsed().as_secs_f64();
    let err_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        bail!("the replay failed ({status}): {err_text}");
    }
    let text = std::fs::read_to_string(&out).context("reading the replay report")?;
    if args.keep_records {
        std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
        let keep = args.out_dir.join(format!("records-{}.json", policy.key()));
        std::fs::write(&keep, &text).with_context(|| format!("writing {}", keep.display()))?;
        // And the logs: the gateway's, and for ailb in full the agents'.
        if let Some(d) = &daemon {
            let keep = args.out_dir.join(format!("daemon-{}.log", policy.key()));
            std::fs::write(&keep, d.log()).with_context(|| format!("writing {}", keep.display()))?;
        }
        for entry in std::fs::read_dir(dir.path()).context("listing the run's directory")?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("agent-") && name.ends_with(".log") {
                let _ = std::fs::copy(entry.path(), args.out_dir.join(format!("{}-{name}", policy.key())));
            }
        }
    }
    let report: Value = serde_json::from_str(&text).context("parsing the replay report")?;
    let mut gpus = Vec::new();
    for (i, s) in sims.iter().enumerate() {
        let st = sim_gpus::http_get(s.addr, "/sim/state").and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok());
        let busy = st.as_ref().and_then(|v| v["busy_fraction"].as_f64()).unwrap_or(0.0);
        let hit = st.as_ref().and_then(|v| {
            let q = v["counters"]["prefix_query_tokens"].as_f64()?;
            let h = v["counters"]["prefix_hit_tokens"].as_f64()?;
            (q > 0.0).then(|| h / q)
        });
        let mean = if util[i].is_empty() { 0.0 } else { util[i].iter().sum::<f64>() / util[i].len() as f64 };
        gpus.push((s.addr.to_string(), s.profile, mean, busy, hit));
    }
    drop(daemon);
    drop(nginx);
    drop(agents);
    drop(registry);
    drop(sims);
    let mut e2e_by_index = BTreeMap::new();
    let mut failure_kinds = BTreeMap::new();
    for r in report["requests"].as_array().map(Vec::as_slice).unwrap_or_default() {
        if let Some(kind) = failure_kind(r) {
            *failure_kinds.entry(kind).or_insert(0) += 1;
        }
        if r["status"].as_u64() == Some(200) && r["error"].is_null() {
            if let (Some(i), Some(e)) = (r["index"].as_u64(), r["e2e_ms"].as_f64()) {
                e2e_by_index.insert(i, e);
            }
        }
    }
    let mut e2e_sorted: Vec<f64> = e2e_by_index.values().copied().collect();
    e2e_sorted.sort_by(f64::total_cmp);
    let window_s = workload.window_s;
    Ok(Outcome {
        policy,
        summary: report["summary"].clone(),
        e2e_sorted,
        e2e_by_index,
        gpus,
        failure_kinds,
        util_series,
        window_s,
        wall_s,
    })
}

fn f1(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.0}"))
}

fn pct1(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{:.1} %", v * 100.0))
}

/// P95 E2E over the requests every policy served (the same request set for all).
fn common_p95(outs: &[Outcome], o: &Outcome) -> Option<f64> {
    let common: Vec<f64> = o
        .e2e_by_index
        .iter()
        .filter(|(i, _)| outs.iter().all(|x| x.e2e_by_index.contains_key(i)))
        .map(|(_, e)| *e)
        .collect();
    percentile(&common, 95.0)
}

fn report(args: &Args, outs: &[Outcome], workload: &Workload) -> String {
    let mut s = String::new();
    let described = if args.synthetic {
        format!("synthetic mix, {} requests, {} conversations/s (seed {})", args.limit, args.rate, args.seed)
    } else {
        format!("Mooncake conversation trace, first {} requests", args.limit)
    };
    let _ = writeln!(s, "# Policies compared on one simulated fleet\n");
    let _ = writeln!(
        s,
        "Fleet: {} x A100-80GB + {} x RTX 3090 24GB (`ailb-sim`, 7B fp16 model), time scale x{}. \
         Workload: {described}, offered at {} x the trace's rate (replay speed {}). Every policy gets a \
         freshly started fleet (empty KV caches) and a fresh `ailb run` (nginx: a fresh nginx and no ailb); the replay client runs in the \
         attached child cgroup.\n",
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.load,
        args.load * args.time_scale
    );
    let _ = writeln!(
        s,
        "| policy | TTFT p50 / p95 / p99 (ms) | E2E p50 / p95 / p99 (ms) | E2E p95, requests all served (ms) | \
         failures | prefix-cache hits | affinity hits | tokens/s | GPU util mean | util spread (max-min) | \
         util spread while arriving |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in outs {
        let _ = writeln!(
            s,
            "| {} | {} / {} / {} | {} / {} / {} | {} | {} of {} ({}) | {} | {} | {:.0} | {:.1} % | {:.1} pts | {:.1} pts |",
            o.policy.title(),
            f1(o.pct("ttft_ms", "p50")),
            f1(o.pct("ttft_ms", "p95")),
            f1(o.pct("ttft_ms", "p99")),
            f1(o.pct("e2e_ms", "p50")),
            f1(o.pct("e2e_ms", "p95")),
            f1(o.pct("e2e_ms", "p99")),
            f1(common_p95(outs, o)),
            o.failures(),
            o.requests(),
            pct1(o.summary["failure_rate"].as_f64()),
            pct1(o.summary["prefix_cache_hit_rate"].as_f64()),
            o.summary["affinity_hit_rate"].as_f64().map_or_else(|| "n/a".into(), |v| format!("{:.1} %", v * 100.0)),
            o.summary["token_throughput"].as_f64().unwrap_or(0.0),
            o.util_mean() * 100.0,
            o.util_spread() * 100.0,
            o.window_spread() * 100.0,
        );
    }
    if let Some(a) =
        outs.iter().find(|o| o.policy == Policy::Ailb).and_then(|o| o.summary["prefix_cache_hit_rate"].as_f64())
    {
        let oracle = workload.oracle_prefix_hit_rate;
        let unbounded = workload.unbounded_prefix_hit_rate.unwrap_or(0.0);
        let bound = if unbounded > oracle * 1.1 {
            format!(
                "Caches that never evict would hold {:.1} % of the prompt tokens: no placement gets there, because a \
                 conversation's next turn comes after the GPUs have filled their KV pools many times over (see \
                 `ailb-fleet-model`).",
                unbounded * 100.0
            )
        } else {
            format!(
                "Caches that never evict would hold {:.1} % of the prompt tokens: here the GPUs' own caches keep a \
                 conversation's prefix until its next turn, so the oracle placement gets as much.",
                unbounded * 100.0
            )
        };
        let _ = writeln!(
            s,
            "\nPrefix-cache hits of the oracle placement (every request sent to the GPU that holds the longest \
             cached run of its conversation's blocks, same GPUs, same caches, same load; computed in simulated \
             time by `ailb_sim::fleet_model`, the model `ailb-sim` serves): {:.1} %; ailb reaches {:.0} % of it \
             (the issue's goal: >= 90 %). {bound}",
            oracle * 100.0,
            if oracle > 0.0 { a / oracle * 100.0 } else { 0.0 },
        );
    }
    let get = |p: Policy| outs.iter().find(|o| o.policy == p);
    for base in [Policy::RoundRobin, Policy::Random] {
        let (Some(a), Some(r)) = (get(Policy::Ailb), get(base)) else { continue };
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}x", x / y),
            _ => "n/a".into(),
        };
        let fr = |o: &Outcome| o.summary["failure_rate"].as_f64();
        let _ = writeln!(
            s,
            "\nailb / {}: E2E p95 {}, E2E p95 over the requests all served {}, TTFT p95 {}, failure rate {} \
             ({} vs {} failures); GPU utilisation spread {:.1} vs {:.1} points.",
            base.title(),
            ratio(a.pct("e2e_ms", "p95"), r.pct("e2e_ms", "p95")),
            ratio(common_p95(outs, a), common_p95(outs, r)),
            ratio(a.pct("ttft_ms", "p95"), r.pct("ttft_ms", "p95")),
            ratio(fr(a), fr(r)),
            a.failures(),
            r.failures(),
            a.util_spread() * 100.0,
            r.util_spread() * 100.0,
        );
    }
    let _ = writeln!(
        s,
        "\nLatencies are of the successful requests; a policy that fails the largest requests drops them from \
         its own percentiles, so the column \"requests all served\" takes P95 over the requests that every \
         policy served. Affinity hits: the share of a conversation's later turns served by the same GPU as \
         the turn before (`ailb-sim` names itself in `x-ailb-backend`). Only ailb's sockets carry the conversation and memory \
         tags; the others connect untagged, as to an L4 or L7 balancer that knows neither. GPU utilisation: `/sim/state` `utilization` (the busy \
         share of the last sampling interval, as NVML's) sampled every 250 ms from the first request to the last answer, mean per GPU, then mean and max - min over the GPUs (the issue's \
         spread: a GPU left with a long queue works on alone while others idle). \"While arriving\" takes only the samples up to \
         the last planned arrival: near 0 for every policy when the offered load saturates all GPUs in that window.\n"
    );
    let _ = writeln!(s, "Per GPU (sampled utilisation mean / busy share since start / prefix-cache hit share):\n");
    let _ = write!(s, "| GPU |");
    for o in outs {
        let _ = write!(s, " {} |", o.policy.title());
    }
    let _ = writeln!(s, "\n|---|{}", "---:|".repeat(outs.len()));
    if let Some(first) = outs.first() {
        for (i, g) in first.gpus.iter().enumerate() {
            let host = g.0.split(':').next().unwrap_or_default();
            let _ = write!(s, "| {host} {} |", g.1);
            for o in outs {
                if let Some(g) = o.gpus.get(i) {
                    let _ = write!(s, " {:.0} % / {:.0} % / {} |", g.2 * 100.0, g.3 * 100.0, pct1(g.4));
                }
            }
            let _ = writeln!(s);
        }
    }
    let _ = writeln!(s, "\nFailures by kind: {}.", {
        outs.iter()
            .map(|o| {
                let kinds: Vec<String> = o.failure_kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
                format!("{}: {}", o.policy.title(), if kinds.is_empty() { "none".into() } else { kinds.join(", ") })
            })
            .collect::<Vec<_>>()
            .join("; ")
    });
    let _ = writeln!(s, "\nWall time per policy: {}.", {
        outs.iter().map(|o| format!("{} {:.1} s", o.policy.title(), o.wall_s)).collect::<Vec<_>>().join(", ")
    });
    s
}

/// A hand-written SVG: the E2E latency CDF of every policy (log x axis).
fn cdf_svg(outs: &[Outcome]) -> String {
    let (w, h, ml, mb) = (720.0, 420.0, 60.0, 40.0);
    let all: Vec<f64> = outs.iter().flat_map(|o| o.e2e_sorted.iter().copied()).filter(|v| *v > 0.0).collect();
    let lo = all.iter().copied().fold(f64::MAX, f64::min).max(1.0).log10().floor();
    let hi = all.iter().copied().fold(1.0, f64::max).log10().ceil().max(lo + 1.0);
    let x = |v: f64| ml + (v.max(1.0).log10() - lo) / (hi - lo) * (w - ml - 20.0);
    let y = |q: f64| h - mb - q * (h - mb - 20.0);
    let colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{ml}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{ml}\" y1=\"20\" x2=\"{ml}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - mb,
        w - 20.0,
        h - mb,
        h - mb
    );
    let mut e = lo;
    while e <= hi {
        let px = x(10f64.powf(e));
        let _ =
            writeln!(s, "<text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>", h - mb + 16.0, 10f64.powf(e));
        e += 1.0;
    }
    for q in [0.0, 0.5, 0.95, 1.0] {
        let _ = writeln!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{q}</text>", ml - 6.0, y(q) + 4.0);
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">end-to-end latency, ms (log), successful requests; y: share of all requests</text>",
        w / 2.0,
        h - 6.0
    );
    for (k, o) in outs.iter().enumerate() {
        let n = o.requests().max(1) as f64;
        let pts: Vec<String> = o
            .e2e_sorted
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(*v), y((i + 1) as f64 / n)))
            .collect();
        let c = colors[k % colors.len()];
        let _ = writeln!(s, "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>", pts.join(" "));
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            ml + 10.0,
            30.0 + 16.0 * k as f64,
            o.policy.title()
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A hand-written SVG: every GPU's sampled utilisation over time, one panel per policy (same
/// axes), with the spread of the per-GPU means in each panel's title.
fn util_svg(outs: &[Outcome]) -> String {
    let (pw, ph, ml, mt, gap) = (640.0, 150.0, 50.0, 30.0, 40.0);
    let w = ml + pw + 170.0;
    let h = mt + outs.len() as f64 * (ph + gap) + 20.0;
    let t_max = outs.iter().filter_map(|o| o.util_series.last().map(|r| r.0)).fold(1.0, f64::max);
    let colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{ml}\" y=\"18\">GPU utilisation over time (sampled every 250 ms), per policy; x: seconds of replay</text>\n"
    );
    for (k, o) in outs.iter().enumerate() {
        let top = mt + k as f64 * (ph + gap) + 16.0;
        let x = |t: f64| ml + t / t_max * pw;
        let y = |u: f64| top + ph - u.clamp(0.0, 1.0) * ph;
        let _ = writeln!(
            s,
            "<text x=\"{ml}\" y=\"{:.1}\" font-weight=\"bold\">{}: mean {:.0} %, spread of the per-GPU means {:.0} points \
             (dashed: last arrival)</text>",
            top - 4.0,
            o.policy.title(),
            o.util_mean() * 100.0,
            o.util_spread() * 100.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{top:.1}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>",
            x(o.window_s.min(t_max)),
            top + ph
        );
        let _ = writeln!(
            s,
            "<rect x=\"{ml}\" y=\"{top:.1}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>"
        );
        for u in [0.0, 0.5, 1.0] {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text>",
                ml - 4.0,
                y(u) + 4.0,
                u * 100.0
            );
        }
        let mut t = 0.0;
        let step = (t_max / 6.0).max(1.0).round();
        while t <= t_max {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t:.0}</text>",
                x(t),
                top + ph + 14.0
            );
            t += step;
        }
        for (g, gpu) in o.gpus.iter().enumerate() {
            let pts: Vec<String> = o
                .util_series
                .iter()
                .filter_map(|(t, row)| {
                    row.get(g).filter(|u| u.is_finite()).map(|u| format!("{:.1},{:.1}", x(*t), y(*u)))
                })
                .collect();
            let c = colors[g % colors.len()];
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"1.2\" points=\"{}\"/>",
                pts.join(" ")
            );
            if k == 0 {
                let host = gpu.0.split(':').next().unwrap_or_default();
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{host} {}</text>",
                    ml + pw + 10.0,
                    top + 12.0 + 14.0 * g as f64,
                    gpu.1
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The request list of a run (the same in every policy's replay and in the report).
fn build_specs(args: &Args) -> anyhow::Result<Vec<RequestSpec>> {
    Ok(if args.synthetic {
        let opts = SyntheticOpts {
            requests: args.limit,
            conversations_per_s: args.rate,
            seed: args.seed,
            ..Default::default()
        };
        replay::synthetic_specs(&opts, trace::DEFAULT_KV_MB_PER_TOKEN, MODEL)
    } else {
        let path = args.trace.clone().unwrap_or_else(replay::default_trace_path);
        let file = std::fs::File::open(&path).with_context(|| format!("opening trace {}", path.display()))?;
        let (requests, _issues) = trace::parse(std::io::BufReader::new(file));
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
        for s in &mut specs {
            s.conversation.clear();
            s.memory_mb = 0;
        }
    }
    let opts = RunOpts {
        vip: vip.parse().with_context(|| format!("--replay-worker {vip}"))?,
        speed: args.load * args.time_scale,
        concurrency: 512,
        request_timeout: Duration::from_secs_f64(args.deadline_s / 2.0),
        deadline: Duration::from_secs_f64(args.deadline_s),
        progress: false,
    };
    let (records, summary) = replay::run(&specs, &opts);
    std::fs::write(out, format!("{:#}\n", replay::report_json(&summary, &records))).context("writing the report")?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(vip) = &args.replay_worker {
        let out = args.worker_out.clone().context("--replay-worker needs --worker-out")?;
        return replay_worker(&args, vip, &out);
    }
    if !(args.load > 0.0 && args.time_scale > 0.0 && args.deadline_s > 0.0) {
        bail!("--load, --time-scale and --deadline-s must be positive");
    }
    if !(args.ailb_affinity_wait_s >= 0.0 && args.ailb_affinity_wait_s.is_finite()) {
        bail!("--ailb-affinity-wait-s must be a finite number of seconds >= 0, not {}", args.ailb_affinity_wait_s);
    }
    if args.a100 + args.rtx3090 == 0 || args.a100 + args.rtx3090 > 250 {
        bail!("the fleet needs 1..=250 GPUs");
    }
    let mut policies = args.policies.split(',').map(Policy::parse).collect::<anyhow::Result<Vec<_>>>()?;
    let have_nginx = Command::new("nginx").arg("-v").stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if policies.contains(&Policy::Nginx) && !have_nginx {
        eprintln!("ailb-compare: nginx is not installed (cargo xtask setup installs nginx-light): skipping it");
        policies.retain(|p| *p != Policy::Nginx);
    }
    let specs = build_specs(&args)?;
    let workload = Workload {
        window_s: specs.iter().map(|s| s.at_ms).max().unwrap_or(0) as f64 / 1000.0 / (args.load * args.time_scale),
        unbounded_prefix_hit_rate: replay::oracle_prefix_hit_rate(&specs),
        oracle_prefix_hit_rate: {
            let profiles = fleet_model::fleet_profiles(args.a100, args.rtx3090);
            fleet_model::run(&specs, &profiles, args.load, fleet_model::Placement::CacheOracle).prefix_hit_rate
        },
    };
    let ailb = preflight();
    let cg = CgroupGuard::new("compare");
    let mut outs = Vec::new();
    for (k, p) in policies.iter().enumerate() {
        // A port per policy, so that a new fleet never waits for the old one's sockets.
        let out = run_policy(&args, &ailb, &cg, *p, 18_100 + k as u16, &workload)?;
        eprintln!(
            "ailb-compare: {}: {} failures of {}, e2e p95 {:?} ms",
            p.title(),
            out.failures(),
            out.requests(),
            out.pct("e2e_ms", "p95")
        );
        outs.push(out);
    }
    let md = report(&args, &outs, &workload);
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    std::fs::write(args.out_dir.join("replay.md"), &md).context("writing replay.md")?;
    std::fs::write(args.out_dir.join("replay-cdf.svg"), cdf_svg(&outs)).context("writing replay-cdf.svg")?;
    std::fs::write(args.out_dir.join("replay-util.svg"), util_svg(&outs)).context("writing replay-util.svg")?;
    if let Some(j) = &args.json {
        let v: Vec<Value> = outs
            .iter()
            .map(|o| {
                json!({
                    "policy": o.policy.key(), "summary": o.summary, "e2e_p95_common_ms": common_p95(&outs, o),
                    "util_mean": o.util_mean(), "util_spread": o.util_spread(), "wall_s": o.wall_s,
                    "util_mean_arrivals": o.window_mean(), "util_spread_arrivals": o.window_spread(),
                    "window_s": o.window_s,
                })
            })
            .collect();
        let doc = json!({
            "policies": v,
            "oracle_prefix_hit_rate": workload.oracle_prefix_hit_rate,
            "unbounded_prefix_hit_rate": workload.unbounded_prefix_hit_rate,
        });
        std::fs::write(j, format!("{doc:#}\n")).context("writing the JSON")?;
    }
    println!("{md}");
    Ok(())
}
