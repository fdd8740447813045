//! `ailb-soak` (root): a chaos soak that must lose nothing, and an overload that must shed.
//!
//! The soak ([`run_soak`]): a fleet ([`fleet`]: six simulated GPUs, rnacos, an agent per GPU,
//! `ailb run` on a child cgroup this tool creates, `ailb gateway` inside it), the Mooncake trace
//! looped at the fleet's stable load (0.4 of the trace's rate, `ailb-fleet-model`'s figure for
//! the default fleet) for `--minutes`, split between the socket ABI, the front door and remote
//! clients through the TC datapath ([`load`]), the faults of [`faults::SCHEDULE`] one at a
//! time, and a sample every 2 s ([`sample`]). For the TC stream the soak makes network
//! namespaces ([`net`]: client -- gateway -- backends) and runs the fleet inside them;
//! `--no-tc` runs the socket ABI and the front door alone, everything on the host's loopback.
//! Then [`analyze`] and [`report`]: `soak.md`, `soak-timeline.svg` and `soak-data.json`
//! under `--out-dir`.
//!
//! The overload ([`overload`]): ten times the fleet's capacity for a minute through both
//! entry points, on a fresh fleet whose front door admits `--overload-max-concurrent`
//! requests at once: `overload.md`.
//!
//! ```text
//! ailb-soak [--minutes 20] [--overload-only | --no-overload] [--out-dir docs/results/soak]
//! ```

pub mod affinity;
pub mod analyze;
pub mod faults;
pub mod fleet;
pub mod load;
pub mod net;
pub mod overload;
pub mod plot;
pub mod report;
pub mod sample;

use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ailb_tests::{preflight, CgroupGuard};
use anyhow::{bail, Context};
use clap::Parser;

use self::faults::{Event, SCHEDULE};
use self::fleet::{Fleet, FleetOpts, VIP};
use self::load::{Entry, Rec, Split, WorkerPlan};
use self::sample::{Remote, Sample, Sampler, Target};
use crate::sim_gpus::sibling_bin;

#[derive(Debug, Parser)]
#[command(name = "ailb-soak", about = "A chaos soak and an overload of ailb on a simulated GPU fleet (root)")]
pub struct Args {
    /// Length of the soak's load, minutes.
    #[arg(long, default_value_t = 20.0)]
    pub minutes: f64,
    /// Only the overload, no soak.
    #[arg(long, conflicts_with = "no_overload")]
    pub overload_only: bool,
    /// Only the soak, no overload.
    #[arg(long)]
    pub no_overload: bool,
    /// The soak's offered load relative to the trace's rate (0.4: the default fleet's stable load).
    #[arg(long, default_value_t = 0.4)]
    pub load: f64,
    /// The overload's offered load, in multiples of `--load`.
    #[arg(long, default_value_t = 10.0)]
    pub overload_factor: f64,
    /// Length of the overload, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub overload_s: f64,
    /// The front door's `gateway.max_concurrent` in the overload.
    #[arg(long, default_value_t = 128)]
    pub overload_max_concurrent: u32,
    /// The front door's admission in the overload: "fleet_memory" (`[gateway.admission]`) or
    /// "inflight" (`gateway.admission = true`).
    #[arg(long, default_value = "fleet_memory")]
    pub overload_admission: String,
    /// `gateway.admission.max_wait` of the fleet-memory admission, simulated seconds (the
    /// gateway gets it divided by the time scale).
    #[arg(long, default_value_t = 20.0)]
    pub overload_max_wait_s: f64,
    /// `gateway.admission.factor` of the fleet-memory admission (100: the memory compared with
    /// nothing, only the kernel's caps hold requests back).
    #[arg(long, default_value_t = 1.0)]
    pub overload_mem_factor: f64,
    /// `gateway.admission.reserve` of the fleet-memory admission: the share of the limit kept
    /// for the front door's own requests.
    #[arg(long, default_value_t = 0.5)]
    pub overload_reserve: f64,
    /// Seconds at the stable load (`--load`) on the same fleet before the overload: the
    /// latencies the overload's admitted requests are compared with (0: none).
    #[arg(long, default_value_t = 30.0)]
    pub overload_stable_s: f64,
    /// Simulated seconds per real second, for every GPU.
    #[arg(long, default_value_t = 20.0)]
    pub time_scale: f64,
    #[arg(long, default_value_t = 2)]
    pub a100: usize,
    #[arg(long, default_value_t = 4)]
    pub rtx3090: usize,
    /// Where the reports go.
    #[arg(long, default_value = "docs/results/soak")]
    pub out_dir: PathBuf,
    /// `ailb-sim` binary (default: next to this one).
    #[arg(long)]
    pub sim_bin: Option<PathBuf>,
    /// No TC stream: no namespaces, the load split between the socket ABI and the front door.
    #[arg(long)]
    pub no_tc: bool,
    /// Remote client addresses of the TC stream (each with a TC VIP and a load worker of its own).
    #[arg(long, default_value_t = 8)]
    pub tc_lanes: usize,
    /// Make the TC clients' veth send one TCP segment per packet (`gso_max_segs 1`), as the soak
    /// did before the TC path forwarded GSO packets (see `soak::net`); by default it sends GSO
    /// packets as the kernel makes them.
    #[arg(long)]
    pub tc_client_no_gso: bool,
    /// Run the soak's load without its faults (a baseline: every failure is then one a
    /// healthy backend could have served).
    #[arg(long)]
    pub no_faults: bool,
    /// The agents' log filter (`AILB_LOG`), e.g. `info,ailb_userspace::telemetry=debug` to log
    /// every failed health probe and scrape.
    #[arg(long, default_value = "info")]
    pub agent_log: String,
    /// Copy the daemon's, the gateway's and the agents' logs here when the soak ends.
    #[arg(long)]
    pub keep_logs: Option<PathBuf>,
    /// The command line that reproduces the run, for the report.
    #[arg(long, default_value = "cargo xtask soak")]
    pub reproduce: String,
    /// Internal: run a load worker for this entry point (abi, front-door) and exit.
    #[arg(long, hide = true)]
    pub load_worker: Option<String>,
    #[arg(long, hide = true)]
    pub target: Option<String>,
    #[arg(long, hide = true, default_value_t = 8.0)]
    pub worker_speed: f64,
    #[arg(long, hide = true, default_value_t = 60.0)]
    pub worker_duration_s: f64,
    #[arg(long, hide = true, default_value_t = 256)]
    pub worker_concurrency: usize,
    #[arg(long, hide = true, default_value_t = 120.0)]
    pub worker_timeout_s: f64,
    #[arg(long, hide = true)]
    pub worker_out: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 0)]
    pub worker_tc_lanes: usize,
    #[arg(long, hide = true, default_value_t = 0)]
    pub worker_lane: usize,
    #[arg(long, hide = true, default_value_t = 0)]
    pub worker_tc_max_blocks: u64,
    /// Send the TC share's requests that the smallest GPU cannot hold too (the TC path cannot
    /// tell them apart: they fail where the pick puts them on a small GPU).
    #[arg(long)]
    pub tc_all_requests: bool,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if let Some(entry) = &args.load_worker {
        let plan = WorkerPlan {
            entry: Entry::parse(entry)?,
            target: args.target.as_deref().context("--load-worker needs --target")?.parse().context("--target")?,
            speed: args.worker_speed,
            duration_s: args.worker_duration_s,
            concurrency: args.worker_concurrency,
            timeout_s: args.worker_timeout_s,
            out: args.worker_out.clone().context("--load-worker needs --worker-out")?,
        };
        let split = Split { tc_lanes: args.worker_tc_lanes, tc_max_blocks: args.worker_tc_max_blocks };
        return load::run_worker(&plan, split, args.worker_lane);
    }
    if !(args.minutes > 0.0 && args.load > 0.0 && args.time_scale > 0.0 && args.overload_factor > 0.0) {
        bail!("--minutes, --load, --time-scale and --overload-factor must be positive");
    }
    if !args.no_tc && !(1..=net::MAX_LANES).contains(&args.tc_lanes) {
        bail!("--tc-lanes must be 1 to {}, not {}", net::MAX_LANES, args.tc_lanes);
    }
    overload::admission(&args)?;
    if !(args.overload_stable_s >= 0.0 && args.overload_stable_s.is_finite()) {
        bail!("--overload-stable-s must be a finite number of seconds >= 0, not {}", args.overload_stable_s);
    }
    let ailb = preflight();
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    if !args.overload_only {
        let cg = CgroupGuard::new("soak");
        let md = if args.no_tc {
            run_soak(&args, &ailb, &cg, None)?
        } else {
            let net = net::Net::new(args.a100 + args.rtx3090, args.tc_lanes, !args.tc_client_no_gso)?;
            net::in_netns(&net.topo.gateway.path(), || run_soak(&args, &ailb, &cg, Some(&net)))??
        };
        std::fs::write(args.out_dir.join("soak.md"), &md).context("writing soak.md")?;
        println!("{md}");
    }
    if !args.no_overload {
        let cg = CgroupGuard::new("overload");
        let md = overload::run(&args, &ailb, &cg)?;
        std::fs::write(args.out_dir.join("overload.md"), &md).context("writing overload.md")?;
        println!("{md}");
    }
    Ok(())
}

/// The fleet's options for a run.
pub fn fleet_opts(
    args: &Args,
    port: u16,
    max_concurrent: u32,
    name: &'static str,
    admission: fleet::Admission,
) -> FleetOpts {
    FleetOpts {
        sim_bin: args.sim_bin.clone().unwrap_or_else(|| sibling_bin("ailb-sim")),
        time_scale: args.time_scale,
        a100: args.a100,
        rtx3090: args.rtx3090,
        port,
        max_concurrent,
        name,
        admission,
        agent_log: args.agent_log.clone(),
        tc: None,
    }
}

/// The schedule: warm-up, one slot per fault, cool-down (seconds), and the outage length.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Plan {
    pub duration_s: f64,
    pub warm_s: f64,
    pub slot_s: f64,
    pub outage_s: f64,
}

impl Plan {
    /// A minute of warm-up and 90 s of cool-down in a full run (less in a short one: a
    /// twentieth of the run each, 15 s at least), the faults spread evenly between; outages
    /// of 60 s, or 40 % of a slot when that is shorter.
    pub fn of(minutes: f64) -> Self {
        let duration_s = minutes * 60.0;
        let warm_s = (duration_s / 20.0).clamp(15.0, 60.0);
        let cool_s = (duration_s / 13.0).clamp(15.0, 90.0);
        let slot_s = ((duration_s - warm_s - cool_s) / SCHEDULE.len() as f64).max(1.0);
        Plan { duration_s, warm_s, slot_s, outage_s: (slot_s * 0.4).min(60.0) }
    }
}

/// Everything a soak measured.
pub struct SoakRun {
    pub plan: Plan,
    pub records: Vec<Rec>,
    pub samples: Vec<Sample>,
    pub events: Vec<Event>,
    /// The in-flight sum and the open connections once the load had stopped and drained.
    pub final_inflight: Option<u64>,
    pub final_open: u64,
    pub backends: Vec<String>,
    pub speed: f64,
    /// How the conversations were split between the entry points.
    pub split: Split,
    /// The `tc` object of `ailb status` once the load had drained (`None`: no TC stream).
    pub final_tc: Option<serde_json::Value>,
    /// The TC share's requests not sent (needing more than the smallest GPU's pool), of all.
    pub tc_left_out: (usize, usize),
}

impl SoakRun {
    /// The entry points that got load.
    pub fn entries(&self) -> Vec<Entry> {
        self.split.entries()
    }
}

/// The KV blocks of the smallest GPU's pool in the fleet.
fn smallest_pool(args: &Args) -> anyhow::Result<u64> {
    let presets = [("a100-80gb", args.a100), ("rtx3090-24gb", args.rtx3090)];
    let mut least = None;
    for (name, n) in presets.into_iter().filter(|(_, n)| *n > 0) {
        let p = ailb_sim::GpuProfile::preset(name).with_context(|| format!("GPU preset {name} ({n} of them)"))?;
        least = Some(least.map_or(p.kv_blocks(), |l: u64| l.min(p.kv_blocks())));
    }
    least.context("the fleet has no GPU (--a100 and --rtx3090 are both 0)")
}

/// One request's limit, seconds.
const REQUEST_TIMEOUT_S: f64 = 120.0;
/// Threads of each TC lane's worker (requests in flight at most).
const TC_LANE_THREADS: usize = 64;

/// The soak; returns its report. With `net`, this thread is in its gateway namespace.
fn run_soak(args: &Args, ailb: &std::path::Path, cg: &CgroupGuard, net: Option<&net::Net>) -> anyhow::Result<String> {
    let plan = Plan::of(args.minutes);
    let speed = args.load * args.time_scale;
    let split = Split {
        tc_lanes: net.map_or(0, net::Net::lanes),
        tc_max_blocks: if args.tc_all_requests { 0 } else { smallest_pool(args)? },
    };
    let tc_left_out = load::tc_left_out(split, speed, plan.duration_s)?;
    let mut opts = fleet_opts(args, 18_300, 1024, "soak", fleet::Admission::Off);
    opts.tc = net.map(|n| n.tc.clone());
    let mut fleet = Fleet::start(ailb, cg, &opts)?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let t0 = Instant::now();
    let t0_unix = load::unix_ms();
    let (plans, tc_plans) = worker_plans(&plan, speed, &fleet, net, dir.path())?;
    let mut workers = spawn_workers(cg, &plans, &tc_plans, split, net)?;
    let target = Arc::new(Target {
        ailb: ailb.to_path_buf(),
        bpffs: fleet.daemon.bpffs().to_path_buf(),
        backends: fleet.addrs(),
        procs: Mutex::new(fleet.pids()),
        cgroup: sample::cgroup_filter(cg),
    });
    let remote = net.map(|n| Remote {
        netns: n.topo.client.name.clone(),
        vips: n.tc.vips.iter().map(ToString::to_string).collect(),
    });
    let sampler = Sampler::start_with(target.clone(), t0, remote.clone());
    let events = run_faults(args, &plan, speed, &mut fleet, &target, t0)?;
    // A worker returns within its arrivals plus two request timeouts (the replay's bound).
    workers.wait(Duration::from_secs_f64(plan.duration_s + 2.0 * REQUEST_TIMEOUT_S + 60.0), t0)?;
    let samples = sampler.stop();
    let (final_inflight, final_open) = drained_with(&fleet, &target, remote.as_ref());
    let final_tc = net.and_then(|_| fleet.status()).map(|s| s["tc"].clone());
    if let Some(to) = &args.keep_logs {
        fleet.keep_logs(to)?;
    }
    let mut records = Vec::new();
    for p in plans.iter().chain(&tc_plans) {
        records.extend(load::read(&p.out, p.entry, t0_unix, p.speed)?);
    }
    let run = SoakRun {
        plan,
        records,
        samples,
        events,
        final_inflight,
        final_open,
        backends: fleet.addrs().iter().map(ToString::to_string).collect(),
        speed,
        split,
        final_tc,
        tc_left_out,
    };
    report::write(args, &run)
}

/// The load workers' plans at `speed`: the socket ABI's and the front door's, and one per TC
/// lane of `net` (none without it); their reports go to `dir`.
fn worker_plans(
    plan: &Plan,
    speed: f64,
    fleet: &Fleet,
    net: Option<&net::Net>,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<WorkerPlan>, Vec<WorkerPlan>)> {
    let vip: SocketAddrV4 = VIP.parse().context("the VIP")?;
    let plan_of = |entry: Entry, target, concurrency, name: String| WorkerPlan {
        entry,
        target,
        speed,
        duration_s: plan.duration_s,
        concurrency,
        timeout_s: REQUEST_TIMEOUT_S,
        out: dir.join(format!("{name}.json")),
    };
    let plans: Vec<WorkerPlan> = [(Entry::Abi, vip), (Entry::FrontDoor, fleet.gateway_listen)]
        .into_iter()
        .map(|(entry, target)| plan_of(entry, target, 256, entry.key().to_string()))
        .collect();
    let tc_plans: Vec<WorkerPlan> = net
        .iter()
        .flat_map(|n| n.tc.vips.iter().enumerate())
        .map(|(k, vip)| plan_of(Entry::Tc, *vip, TC_LANE_THREADS, format!("tc-{k}")))
        .collect();
    Ok((plans, tc_plans))
}

/// The workers of `plans` in the cgroup, then those of `tc_plans` in `net`'s client namespace.
fn spawn_workers(
    cg: &CgroupGuard,
    plans: &[WorkerPlan],
    tc_plans: &[WorkerPlan],
    split: Split,
    net: Option<&net::Net>,
) -> anyhow::Result<Workers> {
    let mut workers = Workers::spawn_split(cg, plans, split)?;
    if let Some(n) = net {
        for (k, p) in tc_plans.iter().enumerate() {
            let mut cmd = load::command_of(p, split, k)?;
            let child = net::in_netns(&n.topo.client.path(), || cmd.spawn())?.context("spawning a TC load worker")?;
            workers.children.push(child);
        }
    }
    Ok(workers)
}

/// The faults of the schedule (none with `--no-faults`), each at its slot; after each the
/// sampler's processes are the fleet's again (a restart changes pids).
fn run_faults(
    args: &Args,
    plan: &Plan,
    speed: f64,
    fleet: &mut Fleet,
    target: &Target,
    t0: Instant,
) -> anyhow::Result<Vec<Event>> {
    if args.no_faults {
        eprintln!("ailb-soak: {:.0} s of load at speed {speed}, no faults", plan.duration_s);
    } else {
        eprintln!(
            "ailb-soak: {:.0} s of load at speed {speed}; faults every {:.0} s from {:.0} s",
            plan.duration_s, plan.slot_s, plan.warm_s
        );
    }
    let mut events = Vec::new();
    let schedule = if args.no_faults { &[][..] } else { &SCHEDULE[..] };
    for (k, f) in schedule.iter().enumerate() {
        let at = Duration::from_secs_f64(plan.warm_s + k as f64 * plan.slot_s);
        std::thread::sleep(at.saturating_sub(t0.elapsed()));
        eprintln!("ailb-soak: {:.0} s: {}", t0.elapsed().as_secs_f64(), f.title());
        let ev = faults::run(*f, fleet, t0, Duration::from_secs_f64(plan.outage_s))?;
        eprintln!("ailb-soak: {:.0} s: {}", t0.elapsed().as_secs_f64(), ev.detail);
        *target.procs.lock().unwrap_or_else(|p| p.into_inner()) = fleet.pids();
        events.push(ev);
    }
    Ok(events)
}

/// The in-flight sum once every connection has closed (polled for 30 s), and the open
/// connections then.
fn drained(fleet: &Fleet, target: &Target) -> (Option<u64>, u64) {
    drained_with(fleet, target, None)
}

/// [`drained`], the open connections counting `remote`'s too.
fn drained_with(fleet: &Fleet, target: &Target, remote: Option<&Remote>) -> (Option<u64>, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = fleet.status().map(|s| sample::inflight_sum(&s));
    while last != Some(0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        last = fleet.status().map(|s| sample::inflight_sum(&s));
    }
    let open = sample::open_connections(&target.backends, &target.cgroup);
    (last, open + remote.map_or(0, sample::remote_connections))
}

/// The load workers, inside the cgroup; killed by pid on drop if they still run.
pub struct Workers {
    children: Vec<Child>,
}

impl Workers {
    pub fn spawn(cg: &CgroupGuard, plans: &[WorkerPlan]) -> anyhow::Result<Self> {
        Self::spawn_split(cg, plans, Split::default())
    }

    /// Workers whose conversations are split by `split` (each plan's lane 0).
    pub fn spawn_split(cg: &CgroupGuard, plans: &[WorkerPlan], split: Split) -> anyhow::Result<Self> {
        let mut children = Vec::new();
        for p in plans {
            children.push(Fleet::spawn_in(cg, &mut load::command_of(p, split, 0)?));
        }
        Ok(Workers { children })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Waits for every worker, `limit` after `t0` at most.
    pub fn wait(&mut self, limit: Duration, t0: Instant) -> anyhow::Result<()> {
        for c in &mut self.children {
            loop {
                if let Some(st) = c.try_wait().context("waiting for a load worker")? {
                    if !st.success() {
                        bail!("a load worker failed ({st})");
                    }
                    break;
                }
                if t0.elapsed() > limit {
                    bail!("a load worker did not finish within {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill(); // SIGKILL to this child's pid only
                let _ = c.wait();
            }
        }
    }
}
