//! One policy's run: a fresh simulated fleet, the balancer under test in front of it, the
//! replay (a re-exec of `ailb-compare` inside the cgroup) while every GPU's utilisation is
//! sampled, and the [`Outcome`] read back.

use std::io::Read;
use std::net::{SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::nacos::RnacosServer;
use ailb_tests::status::live_backends;
use ailb_tests::{CgroupGuard, Daemon};
use anyhow::{bail, Context};
use serde_json::Value;

use super::args::Args;
use super::outcome::{GpuOutcome, Outcome};
use super::policy::{config_for, nacos_config, Policy};
use super::weights::{self, WeightSample, WeightStats};
use super::{cpu, front_door, peers};
use super::{Workload, MODEL, VIP};
use crate::sim_gpus::{self, sibling_bin, Proc, SimGpu, SimOpts};

/// Runs `policy` on a fleet of its own on `port` and returns what it measured.
pub fn run_policy(
    args: &Args,
    ailb: &Path,
    cg: &CgroupGuard,
    policy: Policy,
    port: u16,
    workload: &Workload,
) -> anyhow::Result<Outcome> {
    let sim_bin = args.sim_bin.clone().unwrap_or_else(|| sibling_bin("ailb-sim"));
    let sims = start_gpus(args, &sim_bin, port)?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let balancer = Balancer::start(args, ailb, cg, policy, port, &sims, dir.path())?;
    let out = dir.path().join("replay.json");
    let mut cmd = replay_command(args, policy, &balancer.vip, &out)?;
    eprintln!("ailb-compare: {}: replaying {} requests at speed {}", policy.title(), args.limit, args.speed());
    let cpu_before = balancer.cpu_s();
    let start = Instant::now();
    let replayed =
        sample_replay(spawn_in_cgroup(&mut cmd, cg.path()), &sims, balancer.daemon_http, policy, args, start)?;
    let cpu_after = balancer.cpu_s();
    let prefix_counters = if policy.prefix_mode().is_some() && !args.ailb_keys_only {
        balancer.daemon_http.and_then(weights::prefix_counters).unwrap_or_default()
    } else {
        Default::default()
    };
    let front_door = balancer.front_door.and_then(front_door::FrontDoorStats::read);
    if !replayed.status.success() {
        bail!("the replay failed ({}): {}", replayed.status, replayed.stderr);
    }
    let text = std::fs::read_to_string(&out).context("reading the replay report")?;
    if args.keep_records {
        keep_records(args, policy, &text, balancer.daemon.as_ref(), dir.path())?;
    }
    let report: Value = serde_json::from_str(&text).context("parsing the replay report")?;
    let (gpus, prefix_tokens) = gpu_outcomes(&sims, &replayed.samples.per_gpu);
    drop(balancer);
    drop(sims);
    let mut outcome =
        Outcome::from_replay(policy, &report, gpus, replayed.samples.series, workload.window_s, replayed.wall_s);
    outcome.prefix_tokens = prefix_tokens;
    outcome.prefix_counters = prefix_counters;
    outcome.front_door = front_door;
    outcome.router_cpu_s = cpu::used(cpu_before.0, cpu_after.0);
    outcome.daemon_cpu_s = cpu::used(cpu_before.1, cpu_after.1);
    outcome.weights = WeightStats::of(&replayed.weights, replayed.wall_s);
    Ok(outcome)
}

/// Starts the fleet on port `port` (each server keeping its fake NVML state, which the agents
/// of the full ailb read) and waits for every `/health`.
fn start_gpus(args: &Args, sim_bin: &Path, port: u16) -> anyhow::Result<Vec<SimGpu>> {
    let opts = SimOpts {
        sim_bin,
        model: MODEL,
        time_scale: args.time_scale,
        sample_interval_ms: 100,
        log: None,
        tokenizer: args.sim_tokenizer.as_deref(),
    };
    std::iter::repeat_n("a100-80gb", args.a100)
        .chain(std::iter::repeat_n("rtx3090-24gb", args.rtx3090))
        .enumerate()
        .map(|(i, profile)| SimGpu::start(SocketAddrV4::new([127, 0, 10, (i + 1) as u8].into(), port), profile, &opts))
        .collect()
}

/// The balancer under test and what it needs running, held only to be stopped on drop. The
/// fields drop in order: the router process (nginx, a peer router or ailb's front door) first,
/// then `ailb run`, then the agents (so that they deregister), then rnacos.
struct Balancer {
    /// nginx, a peer router, or `ailb gateway`: the userspace process on the request path.
    router: Option<Proc>,
    daemon: Option<Daemon>,
    _agents: Vec<Proc>,
    _registry: Option<RnacosServer>,
    /// Where the replay sends its requests.
    vip: String,
    /// `ailb run`'s HTTP endpoint (`daemon.listen`), for its weights.
    daemon_http: Option<SocketAddrV4>,
    /// `ailb gateway`'s listen address, for its own counters.
    front_door: Option<SocketAddrV4>,
}

impl Balancer {
    /// Nothing started yet; the replay addresses the VIP.
    fn bare(daemon_http: Option<SocketAddrV4>) -> Self {
        Balancer {
            router: None,
            daemon: None,
            _agents: Vec::new(),
            _registry: None,
            vip: VIP.to_string(),
            daemon_http,
            front_door: None,
        }
    }

    /// nginx for `Nginx`, the router for a peer policy; for ailb in full rnacos, an agent per GPU and the gateway with Nacos
    /// discovery (ready once every GPU is live in its table); else the gateway on a static config. A front-door
    /// policy gets its ailb so, plus `ailb gateway` in the same cgroup, which the replay then addresses.
    fn start(
        args: &Args,
        ailb: &Path,
        cg: &CgroupGuard,
        policy: Policy,
        port: u16,
        sims: &[SimGpu],
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let none = Balancer::bare(None);
        Ok(match policy {
            Policy::Nginx => {
                let vip = format!("127.0.10.250:{port}");
                Balancer { router: Some(start_nginx(dir, &vip, sims)?), vip, ..none }
            }
            p if peers::binary(p).is_some() => {
                let listen = SocketAddrV4::new([127, 0, 10, 250].into(), port);
                let metrics = SocketAddrV4::new([127, 0, 10, 249].into(), port + peers::METRICS_PORT_OFFSET);
                let gpus: Vec<SocketAddrV4> = sims.iter().map(|s| s.addr).collect();
                let router = peers::start(p, &peers::venv_of(p), listen, metrics, &gpus, dir)?;
                Balancer { router: Some(router), vip: listen.to_string(), ..none }
            }
            p => {
                let front_door = p.behind_front_door().map(|_| SocketAddrV4::new([127, 0, 10, 248].into(), port));
                let tokenizer = match p.prefix_mode() {
                    Some("precise") => front_door::tokenizer_toml(args.sim_tokenizer.as_deref())?,
                    _ => String::new(),
                };
                let extra = front_door.map(|l| {
                    let mut t = front_door::toml(l, front_door::kv_bytes_per_token(sims), p.prefix_mode().is_some());
                    t.push_str(&tokenizer);
                    if p == Policy::AilbGatewayAdmission {
                        t.push_str(&front_door::admission_toml(args));
                    }
                    t
                });
                let http = SocketAddrV4::new([127, 0, 10, 247].into(), port);
                let mut b = start_ailb(args, ailb, cg, p, sims, dir, extra.as_deref().unwrap_or_default(), http)?;
                if let (Some(listen), Some(d)) = (front_door, &b.daemon) {
                    b.router = Some(front_door::start(ailb, d.config_path(), Some(cg), listen, dir)?);
                    b.vip = listen.to_string();
                    b.front_door = Some(listen);
                }
                b
            }
        })
    }

    /// CPU seconds so far of the router process and of `ailb run` (`None` where there is none).
    fn cpu_s(&self) -> (Option<f64>, Option<f64>) {
        let router = self.router.as_ref().and_then(|r| cpu::process_cpu_s(r.child.id()));
        (router, self.daemon.as_ref().and_then(Daemon::pid).and_then(cpu::process_cpu_s))
    }
}

/// `ailb run` for `policy` (or the ailb behind its front door), its config ending in `extra`,
/// its HTTP endpoint on `http`: for ailb in full rnacos, an agent per GPU and Nacos discovery,
/// ready once every GPU is live in its table; else a static config.
#[expect(clippy::too_many_arguments, reason = "the parts of one run, as `Balancer::start` has them")]
fn start_ailb(
    args: &Args,
    ailb: &Path,
    cg: &CgroupGuard,
    policy: Policy,
    sims: &[SimGpu],
    dir: &Path,
    extra: &str,
    http: SocketAddrV4,
) -> anyhow::Result<Balancer> {
    let none = Balancer::bare(Some(http));
    if !policy.behind_front_door().unwrap_or(policy).is_full() {
        let mut cfg = config_for(policy, cg, sims, args);
        cfg.listen = Some(http.to_string());
        cfg.extra.push_str(extra);
        return Ok(Balancer { daemon: Some(Daemon::start(ailb, &cfg)), ..none });
    }
    let nacos = RnacosServer::start();
    let mut agents = Vec::new();
    for s in sims {
        agents.push(s.start_agent(MODEL, &nacos.url(), &args.agent_interval, dir)?);
    }
    let mut cfg = nacos_config(policy, cg, &nacos, args);
    cfg.listen = Some(http.to_string());
    cfg.extra.push_str(extra);
    let daemon = Daemon::start(ailb, &cfg);
    let deadline = Instant::now() + Duration::from_secs(30);
    while live_backends(&daemon.status(), MODEL) != sims.len() {
        if Instant::now() >= deadline {
            bail!(
                "after 30 s not every GPU was registered by its agent and live in the table: {}",
                not_live(&daemon, sims, &mut agents, dir)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Balancer { daemon: Some(daemon), _agents: agents, _registry: Some(nacos), ..none })
}

/// The GPUs `ailb run` does not list live, each with its agent's state and the end of its log.
fn not_live(daemon: &Daemon, sims: &[SimGpu], agents: &mut [Proc], dir: &Path) -> String {
    let status = daemon.status();
    let mut out = Vec::new();
    for (s, agent) in sims.iter().zip(agents) {
        let addr = s.addr.to_string();
        let b = ailb_tests::status::backend(&status, &addr);
        if b.is_some_and(|b| b["live"].as_bool() == Some(true)) {
            continue;
        }
        let listed = b.map_or_else(|| "not listed".to_string(), |b| format!("listed as {b}"));
        let state = agent.exited().map_or_else(|| "running".to_string(), |st| format!("exited ({st})"));
        let log = std::fs::read_to_string(s.agent_log(dir)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(12)..].join("\n");
        out.push(format!("{addr} {listed}; its agent {state}, log ends:\n{tail}"));
    }
    out.join("\n")
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

/// The replay worker's command line: this binary again, with the options that decide the
/// request list, writing its JSON report to `out`; untagged unless the policy reads the tags.
fn replay_command(args: &Args, policy: Policy, vip: &str, out: &Path) -> anyhow::Result<Command> {
    let me = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(me);
    cmd.args(["--replay-worker", vip, "--limit", &args.limit.to_string(), "--load", &args.load.to_string()])
        .args(["--time-scale", &args.time_scale.to_string(), "--seed", &args.seed.to_string()])
        .args(["--deadline-s", &args.deadline_s.to_string()])
        .arg("--worker-out")
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if args.shared_prefix {
        cmd.args(["--shared-prefix", "--rate", &args.rate.to_string(), "--tenants", &args.tenants.to_string()])
            .args(["--system-blocks", &args.system_blocks.to_string()])
            .args(["--question-blocks", &args.question_blocks.to_string()])
            .args(["--output-tokens", &args.output_tokens.to_string()]);
    } else if args.synthetic {
        cmd.args(["--synthetic", "--rate", &args.rate.to_string()]);
    } else if let Some(t) = &args.trace {
        cmd.arg("--trace").arg(t);
    }
    if !policy.tagged() {
        cmd.arg("--untagged");
    } else if policy.prefix_mode().is_some() {
        cmd.arg("--prefix-keys");
    }
    Ok(cmd)
}

/// Every GPU's utilisation sampled while the replay ran.
struct Samples {
    /// Per GPU, the samples it answered.
    per_gpu: Vec<Vec<f64>>,
    /// (seconds since the replay started, one value per GPU, NaN where it did not answer).
    series: Vec<(f64, Vec<f64>)>,
}

/// The replay worker, finished.
struct Replayed {
    status: ExitStatus,
    stderr: String,
    /// Real seconds from its start to its exit.
    wall_s: f64,
    samples: Samples,
    /// `ailb run`'s weights, once a second.
    weights: Vec<WeightSample>,
}

/// Waits for the replay `child` (started at `start`), sampling every GPU's `/sim/state` every
/// 250 ms (and `ailb run`'s weights on `daemon_http` every second) and printing the utilisation
/// every 5 s; kills it (by its pid) when it outlives the deadline.
fn sample_replay(
    mut child: Child,
    sims: &[SimGpu],
    daemon_http: Option<SocketAddrV4>,
    policy: Policy,
    args: &Args,
    start: Instant,
) -> anyhow::Result<Replayed> {
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut samples = Samples { per_gpu: vec![Vec::new(); sims.len()], series: Vec::new() };
    let mut progress = Instant::now() + Duration::from_secs(5);
    let hard = start + Duration::from_secs_f64(args.deadline_s + args.deadline_s / 2.0 + 30.0);
    let mut next = Instant::now();
    let mut weights = Vec::new();
    let mut tick = 0u64;
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the replay")? {
            break st;
        }
        if Instant::now() >= hard {
            let _ = child.kill(); // SIGKILL to this child's pid only
            let _ = child.wait();
            bail!("the replay did not finish in time");
        }
        if crate::stop::requested() {
            let _ = child.kill(); // SIGKILL to this child's pid only
            let _ = child.wait();
            crate::stop::check("the replay")?;
        }
        if Instant::now() >= next {
            next += Duration::from_millis(250);
            samples.take(sims, start);
            if tick.is_multiple_of(4) {
                weights.extend(daemon_http.and_then(weights::sample));
            }
            tick += 1;
            if Instant::now() >= progress {
                progress += Duration::from_secs(5);
                samples.print_last(policy, start);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall_s = start.elapsed().as_secs_f64();
    Ok(Replayed { status, stderr: err_thread.join().unwrap_or_default(), wall_s, samples, weights })
}

impl Samples {
    /// One sample of every GPU's `/sim/state` `utilization`.
    fn take(&mut self, sims: &[SimGpu], start: Instant) {
        let mut row = Vec::with_capacity(sims.len());
        for (i, s) in sims.iter().enumerate() {
            let u = sim_state(s).map(|v| v["utilization"].as_f64().unwrap_or(0.0));
            if let Some(u) = u {
                self.per_gpu[i].push(u);
            }
            row.push(u.unwrap_or(f64::NAN));
        }
        self.series.push((start.elapsed().as_secs_f64(), row));
    }

    /// The progress line: the last sample, in percent.
    fn print_last(&self, policy: Policy, start: Instant) {
        let now: Vec<String> = self
            .series
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

/// A GPU's `/sim/state` JSON, or `None` when it does not answer.
fn sim_state(s: &SimGpu) -> Option<Value> {
    sim_gpus::http_get(s.addr, "/sim/state").and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
}

/// Every GPU after the replay: its mean sampled utilisation (`util`, per GPU), busy share and
/// prefix-cache hit share; and the fleet's prompt tokens found in the GPUs' prefix caches and
/// asked of them, by the servers' own counters (`None` when a GPU did not answer).
fn gpu_outcomes(sims: &[SimGpu], util: &[Vec<f64>]) -> (Vec<GpuOutcome>, Option<(f64, f64)>) {
    let mut tokens = Some((0.0, 0.0));
    let gpus = sims
        .iter()
        .zip(util)
        .map(|(s, util)| {
            let st = sim_state(s);
            let busy = st.as_ref().and_then(|v| v["busy_fraction"].as_f64()).unwrap_or(0.0);
            let counts = st.as_ref().and_then(|v| {
                let q = v["counters"]["prefix_query_tokens"].as_f64()?;
                let h = v["counters"]["prefix_hit_tokens"].as_f64()?;
                Some((h, q))
            });
            tokens = tokens.zip(counts).map(|((h, q), (dh, dq))| (h + dh, q + dq));
            let prefix_hit = counts.and_then(|(h, q)| (q > 0.0).then(|| h / q));
            let util_mean = if util.is_empty() { 0.0 } else { util.iter().sum::<f64>() / util.len() as f64 };
            GpuOutcome { addr: s.addr.to_string(), profile: s.profile, util_mean, busy, prefix_hit }
        })
        .collect();
    (gpus, tokens)
}

/// `--keep-records`: the replay's JSON report as `records-<policy>.json` in the output
/// directory, with the gateway's log and, for ailb in full, the agents' logs (from `dir`).
fn keep_records(args: &Args, policy: Policy, text: &str, daemon: Option<&Daemon>, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    let keep = args.out_dir.join(format!("records-{}.json", policy.key()));
    std::fs::write(&keep, text).with_context(|| format!("writing {}", keep.display()))?;
    if let Some(d) = daemon {
        let keep = args.out_dir.join(format!("daemon-{}.log", policy.key()));
        std::fs::write(&keep, d.log()).with_context(|| format!("writing {}", keep.display()))?;
    }
    for entry in std::fs::read_dir(dir).context("listing the run's directory")?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if (name.starts_with("agent-") && name.ends_with(".log")) || name == "gateway.log" {
            let _ = std::fs::copy(entry.path(), args.out_dir.join(format!("{}-{name}", policy.key())));
        }
    }
    Ok(())
}
