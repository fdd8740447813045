//! The soak's fleet, and the faults it can suffer: six `ailb-sim` servers (2 x A100, 4 x RTX
//! 3090 by default) on 127.0.11.x, rnacos, one `ailb agent` per GPU, `ailb run` attached to the
//! tool's child cgroup with Nacos discovery, and `ailb gateway` (the front door) inside that
//! cgroup. Every process is stopped by its pid on drop, the daemon's pins torn down.
//!
//! With the TC stream ([`FleetOpts::tc`]) the fleet is started from a thread inside the soak's
//! gateway namespace ([`super::net`]), the servers in its backends namespace on the addresses
//! the FIB forwards to, and the daemon also attaches its TC program to the gateway's veths
//! (masquerade mode) and serves the model on one TC VIP per client lane, with
//! `remote_affinity = "client_address"`.
//!
//! Each agent reads its GPU through the fake NVML library, but from a state file of its own
//! (`FAKE_NVML_STATE`), which a relay thread copies from the one its simulator keeps up to
//! date every 100 ms: so that one backend's free memory can be made to fall below what the
//! requests need (the relay then reports the GPU's memory as used but for
//! [`LOW_FREE_MB`]) while the simulator itself goes on serving.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ailb_sim::{GpuProfile, BLOCK_TOKENS};
use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::nacos::RnacosServer;
use ailb_tests::status::{ailb_status, live_backends};
use ailb_tests::{base_config, wait_until, CgroupGuard, Daemon, TestConfig};
use anyhow::{bail, Context};

use super::net::{in_netns, TcFleet};
use crate::compare::front_door::kv_bytes_per_token;
use crate::sim_gpus::{spawn_agent, Proc, SimGpu, SimOpts};

/// The model every simulated GPU serves.
pub const MODEL: &str = "sim-7b";
/// The model's VIP (the socket ABI's entry point).
pub const VIP: &str = "127.77.11.1:8000";
/// The free memory the relay reports for a GPU under the low-memory fault: below every
/// request's need in the trace (a context of 2,048 tokens or more at 0.5 MB per token).
pub const LOW_FREE_MB: u64 = 512;
/// How often each agent publishes (real time; 1 s on real GPUs is 50 ms at time scale 20).
pub const AGENT_PUBLISH: &str = "200ms";
/// The daemon's Nacos poll interval.
pub const NACOS_POLL: &str = "100ms";
/// "No GPU is under the low-memory fault".
const NONE: usize = usize::MAX;

/// What the fleet is started with.
pub struct FleetOpts {
    pub sim_bin: PathBuf,
    pub time_scale: f64,
    pub a100: usize,
    pub rtx3090: usize,
    /// The simulators' port (one fleet per port, so a new one never waits for the old sockets).
    pub port: u16,
    /// `gateway.max_concurrent`.
    pub max_concurrent: u32,
    /// A name for the cgroup's pins.
    pub name: &'static str,
    /// Admission per model: with either mode each agent publishes its server's `max_seqs` as
    /// `max_inflight` (the kernel's hard cap per backend: a socket-ABI connect past it is
    /// refused), and the front door runs the mode's `gateway.admission`.
    pub admission: Admission,
    /// The agents' `AILB_LOG`.
    pub agent_log: String,
    /// The TC datapath and the namespaces' addresses (`None`: everything on loopback).
    pub tc: Option<TcFleet>,
}

/// One GPU's agent: its files, and the process while it runs.
pub struct Agent {
    pub proc: Option<Proc>,
    config: PathBuf,
    log: PathBuf,
    env: Vec<(String, String)>,
    addr: SocketAddrV4,
}

/// The running fleet. Fields drop in order: the gateway, the daemon, the agents, the relay,
/// rnacos, the simulators.
pub struct Fleet {
    pub gateway: Option<Proc>,
    pub daemon: Daemon,
    pub agents: Vec<Agent>,
    relay: Relay,
    pub nacos: RnacosServer,
    pub sims: Vec<SimGpu>,
    /// The daemon's config (restored after the invalid one).
    pub cfg: TestConfig,
    /// The front door's address.
    pub gateway_listen: SocketAddrV4,
    pub ailb: PathBuf,
    sim_bin: PathBuf,
    time_scale: f64,
    /// The backends namespace the servers run in (`None`: this thread's).
    sims_ns: Option<String>,
    /// Logs and configs (kept until the fleet drops).
    pub dir: tempfile::TempDir,
}

impl Fleet {
    /// Starts everything and returns once every GPU is live in the daemon's table and the
    /// front door accepts connections.
    pub fn start(ailb: &Path, cg: &CgroupGuard, o: &FleetOpts) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("ailb-soak-").tempdir().context("temp dir")?;
        let sims = match &o.tc {
            Some(tc) => in_netns(&tc.backends_ns, || start_sims(o))??,
            None => start_sims(o)?,
        };
        let relay = Relay::start(&sims, dir.path())?;
        let nacos = RnacosServer::start();
        let mut agents = Vec::new();
        for (i, s) in sims.iter().enumerate() {
            let (config, log) = s.write_agent_config(MODEL, &nacos.url(), AGENT_PUBLISH, dir.path())?;
            if o.admission != Admission::Off {
                declare_cap(&config, s)?;
            }
            let env = vec![
                ("FAKE_NVML_STATE".to_string(), relay.agent_state(i).display().to_string()),
                ("AILB_LOG".to_string(), o.agent_log.clone()),
            ];
            let proc = Some(spawn_agent(s.addr, &config, &log, &env)?);
            agents.push(Agent { proc, config, log, env, addr: s.addr });
        }
        let gateway_listen = SocketAddrV4::new([127, 0, 11, 248].into(), o.port);
        let cfg = config(o, cg, &nacos, gateway_listen, kv_bytes_per_token(&sims));
        let daemon = Daemon::start(ailb, &cfg);
        wait_until("every GPU registered by its agent and live in the table", Duration::from_secs(60), || {
            (live_backends(&daemon.status(), MODEL) == sims.len()).then_some(())
        });
        let gateway =
            Some(crate::compare::front_door::start(ailb, daemon.config_path(), Some(cg), gateway_listen, dir.path())?);
        Ok(Fleet {
            gateway,
            daemon,
            agents,
            relay,
            nacos,
            sims,
            cfg,
            gateway_listen,
            ailb: ailb.to_path_buf(),
            sim_bin: o.sim_bin.clone(),
            time_scale: o.time_scale,
            sims_ns: o.tc.as_ref().map(|t| t.backends_ns.clone()),
            dir,
        })
    }

    /// `ailb status --json` of the daemon's pins (they outlive the daemon), `None` on error.
    pub fn status(&self) -> Option<serde_json::Value> {
        ailb_status(&self.ailb, self.daemon.bpffs()).ok()
    }

    /// How many GPUs are live in the table (0 when the status cannot be read).
    pub fn live(&self) -> usize {
        self.status().map(|s| live_backends(&s, MODEL)).unwrap_or(0)
    }

    /// SIGKILL to simulator `i` (by its pid), reaped.
    pub fn kill_sim(&mut self, i: usize) {
        let _ = self.sims[i].sim.child.kill();
        let _ = self.sims[i].sim.child.wait();
    }

    /// Starts simulator `i` again on its address.
    pub fn restart_sim(&mut self, i: usize) -> anyhow::Result<()> {
        let o = SimOpts {
            sim_bin: &self.sim_bin,
            model: MODEL,
            time_scale: self.time_scale,
            sample_interval_ms: 100,
            log: None,
            tokenizer: None,
        };
        match &self.sims_ns {
            Some(ns) => {
                let sim = &mut self.sims[i];
                in_netns(ns, || sim.restart(&o))?
            }
            None => self.sims[i].restart(&o),
        }
    }

    /// SIGKILL to agent `i` (by its pid), reaped: its ephemeral instance stays in Nacos until
    /// its heartbeats are missed.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].proc.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Starts agent `i` again with the same config.
    pub fn restart_agent(&mut self, i: usize) -> anyhow::Result<()> {
        let a = &mut self.agents[i];
        if a.proc.is_some() {
            bail!("the agent of {} is still running", a.addr);
        }
        a.proc = Some(spawn_agent(a.addr, &a.config, &a.log, &a.env)?);
        Ok(())
    }

    /// Makes GPU `i`'s agent see only [`LOW_FREE_MB`] free (`Some`), or its real memory again.
    pub fn low_memory(&self, gpu: Option<usize>) {
        self.relay.state.low.store(gpu.unwrap_or(NONE), Ordering::Relaxed);
    }

    /// The pids to sample: ("daemon" | "gateway" | "agent <addr>", pid).
    pub fn pids(&mut self) -> Vec<(String, u32)> {
        let mut out = Vec::new();
        if self.daemon.is_running() {
            out.extend(self.daemon.pid().map(|p| ("daemon".to_string(), p)));
        }
        out.extend(self.gateway.as_ref().map(|g| ("gateway".to_string(), g.child.id())));
        for a in &self.agents {
            out.extend(a.proc.as_ref().map(|p| (format!("agent {}", a.addr), p.child.id())));
        }
        out
    }

    /// The simulators' addresses.
    pub fn addrs(&self) -> Vec<SocketAddrV4> {
        self.sims.iter().map(|s| s.addr).collect()
    }

    /// Copies every log of the fleet (the daemon's, the gateway's, the agents') into `to`.
    pub fn keep_logs(&self, to: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
        std::fs::write(to.join("daemon.log"), self.daemon.log()).context("writing daemon.log")?;
        for e in std::fs::read_dir(self.dir.path()).context("listing the fleet's files")? {
            let path = e.context("listing the fleet's files")?.path();
            if let (Some(name), Some("log")) = (path.file_name(), path.extension().and_then(|x| x.to_str())) {
                std::fs::copy(&path, to.join(name)).with_context(|| format!("copying {}", path.display()))?;
            }
        }
        Ok(())
    }

    /// A command run inside `cg` (the load workers).
    pub fn spawn_in(cg: &CgroupGuard, cmd: &mut std::process::Command) -> std::process::Child {
        spawn_in_cgroup(cmd, cg.path())
    }
}

/// The simulators on 127.0.11.1.. (or the backends namespace's addresses) at `o.port`.
fn start_sims(o: &FleetOpts) -> anyhow::Result<Vec<SimGpu>> {
    let opts = SimOpts {
        sim_bin: &o.sim_bin,
        model: MODEL,
        time_scale: o.time_scale,
        sample_interval_ms: 100,
        log: None,
        tokenizer: None,
    };
    std::iter::repeat_n("a100-80gb", o.a100)
        .chain(std::iter::repeat_n("rtx3090-24gb", o.rtx3090))
        .enumerate()
        .map(|(i, profile)| {
            let ip = match &o.tc {
                Some(tc) => *tc.backend_addrs.get(i).with_context(|| format!("no server address for GPU {i}"))?,
                None => Ipv4Addr::new(127, 0, 11, (i + 1) as u8),
            };
            SimGpu::start(SocketAddrV4::new(ip, o.port), profile, &opts)
        })
        .collect()
}

/// The daemon's config: ailb in full (Nacos discovery every 100 ms, the AI-aware policy with
/// A100 capability 3, affinity with `affinity_wait` 1 s real = 20 s simulated, load bound 1.25),
/// and the front door's section. The front door opens a fresh upstream connection per request
/// (`upstream_reuse = "never"`): the kernel does not count a pooled idle connection in flight,
/// and nothing outside the gateway can tell an idle one from a busy one, so only without the
/// pool can the in-flight count be checked against the open connections exactly.
fn config(o: &FleetOpts, cg: &CgroupGuard, nacos: &RnacosServer, listen: SocketAddrV4, kv: u64) -> TestConfig {
    let mut cfg = base_config(o.name, cg);
    let (vips, model_extra) = match &o.tc {
        Some(tc) => {
            cfg.daemon_extra = format!(
                "interfaces = [{:?}, {:?}]\n\n[daemon.tc]\nmode = \"masquerade\"\nnat_address = \"{}\"\n",
                tc.interfaces[0], tc.interfaces[1], tc.nat_address
            );
            let all: Vec<String> =
                std::iter::once(VIP.to_string()).chain(tc.vips.iter().map(ToString::to_string)).collect();
            (all, "remote_affinity = \"client_address\"\n")
        }
        None => (vec![VIP.to_string()], ""),
    };
    cfg.affinity = true;
    cfg.load_bound = true;
    cfg.load_factor = 1.25;
    cfg.affinity_wait = format!("{}ms", (20_000.0 / o.time_scale).round() as u64);
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = {vips:?}\n{model_extra}\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"{NACOS_POLL}\"\n\n\
         [policy]\n[policy.gpu_capability]\n\"A100-80GB\" = 3.0\n\"RTX3090-24GB\" = 1.0\n\n\
         [gateway]\nlisten = [\"{listen}\"]\nmax_concurrent = {}\nupstream_reuse = \"never\"\n{}[gateway.kv_bytes_per_token]\n\"{MODEL}\" = {kv}\n\
         [gateway.kv_block_tokens]\n\"{MODEL}\" = {BLOCK_TOKENS}\n",
        nacos.url(),
        o.max_concurrent,
        o.admission.flag(),
    );
    cfg.extra.push_str(&o.admission.table());
    if cfg.listen.is_none() {
        // The front door's admission reads each model's capacity from the daemon's plan.
        cfg.listen = Some(format!("127.0.0.1:{}", ailb_tests::nacos::free_port()));
    }
    cfg
}

/// The front door's admission in a fleet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admission {
    Off,
    /// `gateway.admission = true`: connections in flight against the sum of the caps, 429.
    Inflight,
    /// `[gateway.admission] mode = "fleet_memory"`: hinted memory in flight against the KV
    /// pools, a wait of at most `max_wait_ms` (real time), then 503; `reserve` of the limit
    /// kept for the front door's own requests.
    FleetMemory {
        factor: f64,
        max_wait_ms: u64,
        reserve: f64,
    },
}

impl Admission {
    /// The `admission = ...` line of `[gateway]` (none for the table).
    fn flag(self) -> &'static str {
        match self {
            Admission::Off => "admission = false\n",
            Admission::Inflight => "admission = true\n",
            Admission::FleetMemory { .. } => "",
        }
    }
    /// The `[gateway.admission]` table, at the config's end (empty for the flag).
    fn table(self) -> String {
        match self {
            Admission::FleetMemory { factor, max_wait_ms, reserve } => format!(
                "[gateway.admission]\nmode = \"fleet_memory\"\nfactor = {factor:?}\nmax_wait = \"{max_wait_ms}ms\"\n\
                 reserve = {reserve:?}\n"
            ),
            _ => String::new(),
        }
    }
    /// In words, for the reports.
    pub fn describe(self) -> String {
        match self {
            Admission::Off => "off".into(),
            Admission::Inflight => {
                "`gateway.admission = true` (connections in flight against the sum of the caps, 429)".into()
            }
            Admission::FleetMemory { factor, max_wait_ms, reserve } => format!(
                "`[gateway.admission] mode = \"fleet_memory\"`, factor {factor}, max_wait {max_wait_ms} ms, reserve \
                 {reserve} (hinted memory in flight, both entry points, against the KV pools, the front door's own \
                 requests keeping {reserve} of it; a backend under its `max_inflight` needed too; a \
                 first-come-first-served wait, then 503)"
            ),
        }
    }
}

/// Adds `max_inflight` = the simulated server's `max_seqs` to the agent's config at `path`
/// (its `[[instances]]` table is the file's last).
fn declare_cap(path: &Path, s: &SimGpu) -> anyhow::Result<()> {
    let profile = GpuProfile::preset(s.profile).with_context(|| format!("no preset {}", s.profile))?;
    let mut text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.push_str(&format!("max_inflight = {}\n", profile.max_seqs));
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// What the relay thread shares.
struct RelayState {
    stop: AtomicBool,
    /// The GPU under the low-memory fault, or [`NONE`].
    low: AtomicUsize,
    /// Per GPU: the simulator's state file, the agent's, the GPU's total memory.
    files: Vec<(PathBuf, PathBuf, u64)>,
}

/// Copies every simulator's NVML state to its agent's every 100 ms; stopped on drop.
struct Relay {
    state: Arc<RelayState>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Copies once (so that each agent finds its state file when it starts), then every 100 ms.
    fn start(sims: &[SimGpu], dir: &Path) -> anyhow::Result<Self> {
        let files = sims
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let total = GpuProfile::preset(s.profile).map(|p| p.gpu_memory_mb).unwrap_or(0);
                (s.nvml_state(), dir.join(format!("nvml-agent-{i}.state")), total)
            })
            .collect();
        let state = Arc::new(RelayState { stop: AtomicBool::new(false), low: AtomicUsize::new(NONE), files });
        copy_all(&state).context("copying the simulators' NVML state")?;
        let s = state.clone();
        let thread = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let _ = copy_all(&s);
            }
        });
        Ok(Relay { state, thread: Some(thread) })
    }

    fn agent_state(&self, i: usize) -> &Path {
        &self.state.files[i].1
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One copy of every GPU's state, the low-memory GPU's `used_mb` raised to leave
/// [`LOW_FREE_MB`] free.
fn copy_all(s: &RelayState) -> std::io::Result<()> {
    let low = s.low.load(Ordering::Relaxed);
    for (i, (from, to, total)) in s.files.iter().enumerate() {
        let text = std::fs::read_to_string(from)?;
        let text = if i == low { with_used(&text, total.saturating_sub(LOW_FREE_MB)) } else { text };
        let tmp = to.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, to)?;
    }
    Ok(())
}

/// `state` with GPU 0's `used_mb` line set to `used`.
fn with_used(state: &str, used: u64) -> String {
    state
        .lines()
        .map(|l| if l.starts_with("0 used_mb ") { format!("0 used_mb {used}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[cfg(test)]
mod tests;
