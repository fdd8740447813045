//! `ailb-soak` (root): a chaos soak that must lose nothing, and an overload that must shed.
//!
//! The soak ([`run_soak`]): a fleet ([`fleet`]: six simulated GPUs, rnacos, an agent per GPU,
//! `ailb run` on a child cgroup this tool creates, `ailb gateway` inside it), the Mooncake trace
//! looped at the fleet's stable load (0.4 of the trace's rate, `ailb-fleet-model`'s figure for
//! the default fleet) for `--minutes`, split between the socket ABI and the front door
//! ([`load`]), the faults of [`faults::SCHEDULE`] one at a time, and a sample every 2 s
//! ([`sample`]). The TC datapath is not driven: its clients must come from another host or
//! network namespace.
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

pub mod analyze;
pub mod faults;
pub mod fleet;
pub mod load;
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
use self::load::{Entry, Rec, WorkerPlan};
use self::sample::{Sample, Sampler, Target};
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
        return load::run_worker(&plan);
    }
    if !(args.minutes > 0.0 && args.load > 0.0 && args.time_scale > 0.0 && args.overload_factor > 0.0) {
        bail!("--minutes, --load, --time-scale and --overload-factor must be positive");
    }
    overload::admission(&args)?;
    if !(args.overload_stable_s >= 0.0 && args.overload_stable_s.is_finite()) {
        bail!("--overload-stable-s must be a finite number of seconds >= 0, not {}", args.overload_stable_s);
    }
    let ailb = preflight();
    std::fs::create_dir_all(&args.out_dir).with_context(|| format!("creating {}", args.out_dir.display()))?;
    if !args.overload_only {
        let cg = CgroupGuard::new("soak");
        let md = run_soak(&args, &ailb, &cg)?;
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
}

/// The soak; returns its report.
fn run_soak(args: &Args, ailb: &std::path::Path, cg: &CgroupGuard) -> anyhow::Result<String> {
    let plan = Plan::of(args.minutes);
    let speed = args.load * args.time_scale;
    let mut fleet = Fleet::start(ailb, cg, &fleet_opts(args, 18_300, 1024, "soak", fleet::Admission::Off))?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let t0 = Instant::now();
    let t0_unix = load::unix_ms();
    let vip: SocketAddrV4 = VIP.parse().context("the VIP")?;
    let plans = [(Entry::Abi, vip), (Entry::FrontDoor, fleet.gateway_listen)].map(|(entry, target)| WorkerPlan {
        entry,
        target,
        speed,
        duration_s: plan.duration_s,
        concurrency: 256,
        timeout_s: 120.0,
        out: dir.path().join(format!("{}.json", entry.key())),
    });
    let mut workers = Workers::spawn(cg, &plans)?;
    let target = Arc::new(Target {
        ailb: ailb.to_path_buf(),
        bpffs: fleet.daemon.bpffs().to_path_buf(),
        backends: fleet.addrs(),
        procs: Mutex::new(fleet.pids()),
        cgroup: sample::cgroup_filter(cg),
    });
    let sampler = Sampler::start(target.clone(), t0);
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
        let ev = faults::run(*f, &mut fleet, t0, Duration::from_secs_f64(plan.outage_s))?;
        eprintln!("ailb-soak: {:.0} s: {}", t0.elapsed().as_secs_f64(), ev.detail);
        *target.procs.lock().unwrap_or_else(|p| p.into_inner()) = fleet.pids();
        events.push(ev);
    }
    workers.wait(Duration::from_secs_f64(plan.duration_s + 200.0), t0)?;
    let samples = sampler.stop();
    let (final_inflight, final_open) = drained(&fleet, &target);
    if let Some(to) = &args.keep_logs {
        fleet.keep_logs(to)?;
    }
    let mut records = Vec::new();
    for p in &plans {
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
    };
    report::write(args, &run)
}

/// The in-flight sum once every connection has closed (polled for 30 s), and the open
/// connections then.
fn drained(fleet: &Fleet, target: &Target) -> (Option<u64>, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = fleet.status().map(|s| sample::inflight_sum(&s));
    while last != Some(0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        last = fleet.status().map(|s| sample::inflight_sum(&s));
    }
    (last, sample::open_connections(&target.backends, &target.cgroup))
}

/// The load workers, inside the cgroup; killed by pid on drop if they still run.
pub struct Workers {
    children: Vec<Child>,
}

impl Workers {
    pub fn spawn(cg: &CgroupGuard, plans: &[WorkerPlan]) -> anyhow::Result<Self> {
        let mut children = Vec::new();
        for p in plans {
            children.push(Fleet::spawn_in(cg, &mut load::command(p)?));
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
