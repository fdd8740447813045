//! The overload: `--overload-factor` (10) times the fleet's stable load for `--overload-s`
//! (60) seconds through the front door and the socket ABI at once, on a fresh fleet whose
//! gateway admits `--overload-max-concurrent` requests at once and runs the admission per model
//! (`gateway.admission`, each agent publishing its server's `max_seqs` as `max_inflight`; the
//! fleet-memory mode keeps `--overload-reserve` of the limit for the front door's own requests,
//! which the socket ABI's connections would otherwise hold alone).
//! Expected, as documented: the front door answers the excess 429 (the model at its capacity,
//! or `gateway.max_concurrent`) or 503 (every backend at its cap at connect), all with
//! `Retry-After`; the socket ABI's excess is refused at `connect()` (`ECONNREFUSED`: every
//! backend at its hard cap) instead of waiting in the servers' queues; admitted requests'
//! latency stays near their service time; nothing crashes; memory stays bounded.
//! A prober outside the load sends one front-door request a second and reads the answer's
//! status and `Retry-After`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ailb_tests::CgroupGuard;
use anyhow::Context;

use super::analyze::percentile;
use super::fleet::{Admission, Fleet, MODEL, VIP};
use super::load::{self, Entry, Rec, WorkerPlan};
use super::sample::{Sample, Sampler, Target};
use super::{fleet_opts, report, Args, Workers};

/// Client threads of the socket ABI's worker: at most this many of its requests wait in the
/// servers' queues at once.
const ABI_THREADS: usize = 512;
/// Client threads of the front door's worker (more than the gateway admits, so that the
/// excess is offered).
const FRONT_DOOR_THREADS: usize = 1024;

/// The front door's admission of the overload, from `--overload-admission`.
pub fn admission(args: &Args) -> anyhow::Result<Admission> {
    match args.overload_admission.as_str() {
        "inflight" => Ok(Admission::Inflight),
        "fleet_memory" => {
            if !(args.overload_max_wait_s >= 0.0 && args.overload_max_wait_s.is_finite()) {
                anyhow::bail!(
                    "--overload-max-wait-s must be a finite number of seconds >= 0, not {}",
                    args.overload_max_wait_s
                );
            }
            let max_wait_ms = (args.overload_max_wait_s * 1000.0 / args.time_scale).round() as u64;
            let (factor, reserve) = (args.overload_mem_factor, args.overload_reserve);
            if !(factor > 0.0 && factor <= 100.0) {
                anyhow::bail!("--overload-mem-factor must be above 0 and at most 100, not {factor}");
            }
            if !(0.0..=1.0).contains(&reserve) {
                anyhow::bail!("--overload-reserve must be from 0 to 1, not {reserve}");
            }
            Ok(Admission::FleetMemory { factor, max_wait_ms, reserve })
        }
        other => anyhow::bail!("--overload-admission {other:?}: expected \"fleet_memory\" or \"inflight\""),
    }
}

/// The two load workers (socket ABI, front door) at `speed` for `duration_s`, their reports
/// named after `phase`.
fn plans(
    fleet: &Fleet,
    speed: f64,
    duration_s: f64,
    dir: &std::path::Path,
    phase: &str,
) -> anyhow::Result<[WorkerPlan; 2]> {
    let vip: SocketAddrV4 = VIP.parse().context("the VIP")?;
    Ok([(Entry::Abi, vip, ABI_THREADS), (Entry::FrontDoor, fleet.gateway_listen, FRONT_DOOR_THREADS)].map(
        |(entry, target, concurrency)| WorkerPlan {
            entry,
            target,
            speed,
            duration_s,
            concurrency,
            timeout_s: 120.0,
            out: dir.join(format!("{phase}-{}.json", entry.key())),
        },
    ))
}

/// Runs `plans` to their end (their window plus the drain); their records (their reports also
/// copied to `keep`, `--keep-logs`, when given).
fn phase(cg: &CgroupGuard, plans: &[WorkerPlan], window_s: f64, keep: Option<&Path>) -> anyhow::Result<Vec<Rec>> {
    let t0 = Instant::now();
    let t0_unix = load::unix_ms();
    let mut workers = Workers::spawn(cg, plans)?;
    workers.wait(Duration::from_secs_f64(window_s + 200.0), t0)?;
    let mut recs = Vec::new();
    for p in plans {
        recs.extend(load::read(&p.out, p.entry, t0_unix, p.speed)?);
        if let Some(keep) = keep {
            let name = p.out.file_name().context("a worker report without a name")?;
            std::fs::create_dir_all(keep)
                .and_then(|()| std::fs::copy(&p.out, keep.join(name)).map(drop))
                .with_context(|| format!("keeping {} in {}", p.out.display(), keep.display()))?;
        }
    }
    Ok(recs)
}

/// Runs the overload; returns its report.
pub fn run(args: &Args, ailb: &std::path::Path, cg: &CgroupGuard) -> anyhow::Result<String> {
    let admission = admission(args)?;
    let opts = fleet_opts(args, 18_400, args.overload_max_concurrent, "overload", admission);
    let mut fleet = Fleet::start(ailb, cg, &opts)?;
    let dir = tempfile::tempdir().context("temp dir")?;
    let target = Arc::new(Target {
        ailb: ailb.to_path_buf(),
        bpffs: fleet.daemon.bpffs().to_path_buf(),
        backends: fleet.addrs(),
        procs: Mutex::new(fleet.pids()),
        cgroup: super::sample::cgroup_filter(cg),
    });
    let before = super::sample::take(&target, Instant::now(), &mut Default::default());
    let stable = stable_phase(args, cg, &fleet, dir.path())?;
    let speed = args.load * args.overload_factor * args.time_scale;
    let overload = overload_phase(args, cg, &fleet, &target, dir.path(), speed)?;
    let (final_inflight, _) = super::drained(&fleet, &target);
    let after = super::sample::take(&target, overload.t0, &mut Default::default());
    let alive = alive(&mut fleet);
    let rss = Rss::of(&before, &overload.samples, &after);
    let seen = Seen { stable, overload, final_inflight, alive, rss };
    Ok(markdown(args, admission, speed, &seen))
}

/// The stable load for `--overload-stable-s` first (no records when 0).
fn stable_phase(args: &Args, cg: &CgroupGuard, fleet: &Fleet, dir: &Path) -> anyhow::Result<Vec<Rec>> {
    if args.overload_stable_s > 0.0 {
        let speed = args.load * args.time_scale;
        eprintln!("ailb-soak: overload: first {:.0} s at the stable load (speed {speed})", args.overload_stable_s);
        let plans = plans(fleet, speed, args.overload_stable_s, dir, "stable")?;
        phase(cg, &plans, args.overload_stable_s, args.keep_logs.as_deref())
    } else {
        Ok(Vec::new())
    }
}

/// The overload phase's records, the prober's answers (status, `Retry-After`), the samples and
/// when it started.
struct Overloaded {
    recs: Vec<Rec>,
    probes: Vec<(u16, bool)>,
    samples: Vec<Sample>,
    t0: Instant,
}

/// The overload at `speed` for `--overload-s`, sampled, with the prober.
fn overload_phase(
    args: &Args,
    cg: &CgroupGuard,
    fleet: &Fleet,
    target: &Arc<Target>,
    dir: &Path,
    speed: f64,
) -> anyhow::Result<Overloaded> {
    let plans = plans(fleet, speed, args.overload_s, dir, "overload")?;
    let t0 = Instant::now();
    let sampler = Sampler::start(target.clone(), t0);
    let prober = Prober::start(fleet.gateway_listen);
    eprintln!(
        "ailb-soak: overload: {:.0} s at speed {speed} ({}x the stable load)",
        args.overload_s, args.overload_factor
    );
    // The prober runs for the offered window only; the workers then drain.
    let recs = std::thread::scope(|s| {
        let load = s.spawn(|| phase(cg, &plans, args.overload_s, args.keep_logs.as_deref()));
        std::thread::sleep(Duration::from_secs_f64(args.overload_s));
        let probes = prober.stop();
        load.join()
            .map_err(|_| anyhow::anyhow!("the overload's load thread panicked"))
            .and_then(|r| r.map(|r| (r, probes)))
    });
    let (recs, probes) = recs?;
    let samples = sampler.stop();
    Ok(Overloaded { recs, probes, samples, t0 })
}

/// What the overload saw, for its report.
struct Seen {
    stable: Vec<Rec>,
    overload: Overloaded,
    final_inflight: Option<u64>,
    alive: String,
    rss: Rss,
}

/// The report of the overload at `speed`.
fn markdown(args: &Args, admission: Admission, speed: f64, seen: &Seen) -> String {
    let Seen { stable, overload: Overloaded { recs, probes, samples, .. }, final_inflight, alive, rss } = seen;
    let mut md = String::new();
    let _ = writeln!(md, "# Overload\n");
    let _ = writeln!(
        md,
        "Reproduce (as root): `{}`. {}x the fleet's stable load ({} x A100 + {} x RTX 3090 at time scale {}; the Mooncake \
         trace at speed {speed}) for {:.0} s, split by conversation between the socket ABI ({ABI_THREADS} client threads) and \
         the front door ({FRONT_DOOR_THREADS} client threads; `gateway.max_concurrent = {}`), after {:.0} s at the stable load \
         (speed {}) on the same fleet. Front-door admission: {}.\n",
        report::command(args, " --overload-only"),
        args.overload_factor,
        args.a100,
        args.rtx3090,
        args.time_scale,
        args.overload_s,
        args.overload_max_concurrent,
        args.overload_stable_s,
        args.load * args.time_scale,
        admission.describe(),
    );
    entries_table(&mut md, &[("stable", stable), ("10x", recs)]);
    stable_table(&mut md, stable, recs);
    latency_table(&mut md, recs, args.overload_s);
    bound(&mut md, recs, args, admission);
    probes_table(&mut md, probes);
    let _ = writeln!(
        md,
        "Processes alive at the end: {alive}. In-flight after the drain: {}. {}\n",
        final_inflight.map_or("unreadable".into(), |v| v.to_string()),
        rss.line(),
    );
    kernel_line(&mut md, samples, args);
    goals(&mut md, &Goals { stable, recs, probes, alive, rss, window_s: args.overload_s });
    let _ = writeln!(
        md,
        "Model: `{MODEL}`; the front door's admission is per model (`gateway.admission`), on top of its global \
         `gateway.max_concurrent`.\n"
    );
    md
}

/// Whether every process of the fleet still runs, in words.
fn alive(fleet: &mut Fleet) -> String {
    let mut dead = Vec::new();
    if !fleet.daemon.is_running() {
        dead.push("daemon".to_string());
    }
    if let Some(g) = fleet.gateway.as_mut() {
        if g.exited().is_some() {
            dead.push("gateway".into());
        }
    }
    for s in &mut fleet.sims {
        if s.sim.exited().is_some() {
            dead.push(s.sim.name.clone());
        }
    }
    for a in &mut fleet.agents {
        if let Some(p) = a.proc.as_mut() {
            if p.exited().is_some() {
                dead.push(p.name.clone());
            }
        }
    }
    if dead.is_empty() {
        "all (daemon, gateway, every server and agent)".into()
    } else {
        format!("**not all: {} exited**", dead.join(", "))
    }
}

/// The outcome of a record: "200", "HTTP 503 model_overloaded" (the status and the error's
/// `code`, which says who refused: the admission's wait, the kernel at connect, ...), or the
/// error's first words.
fn outcome(r: &Rec) -> String {
    if r.ok {
        return "200".into();
    }
    match (r.status, &r.error) {
        (Some(s), e) if s != 200 => match e.as_deref().and_then(error_code) {
            Some(code) => format!("HTTP {s} {code}"),
            None => format!("HTTP {s}"),
        },
        (_, Some(e)) => match e.split_once(": ") {
            // "connect to 127.0.0.1:80: Connection refused (os error 111)": the address's digits
            // dropped, the reason kept.
            Some((what, why)) => format!("{}: {why}", what.chars().filter(|c| !c.is_ascii_digit()).collect::<String>()),
            None => e.chars().filter(|c| !c.is_ascii_digit()).collect(),
        },
        _ => "?".into(),
    }
}

/// The `code` of an OpenAI-shaped error body quoted in a record's error
/// (`HTTP 503: {"error":{...,"code":"model_overloaded"}}`).
fn error_code(error: &str) -> Option<&str> {
    let body = error.find('{').map(|i| &error[i..])?;
    let at = body.find("\"code\":\"")? + "\"code\":\"".len();
    let code = &body[at..];
    code.find('"').map(|end| &code[..end]).filter(|c| !c.is_empty())
}

/// Whether a record is a refusal (429 or 503) and carries `Retry-After`.
fn refusal(r: &Rec) -> Option<bool> {
    matches!(r.status, Some(429 | 503)).then_some(r.retry_after.is_some())
}

/// Outcomes per phase (`stable`, `10x`), entry point and outcome, with how many of them
/// carried `Retry-After`.
fn entries_table(md: &mut String, phases: &[(&str, &[Rec])]) {
    let _ = writeln!(
        md,
        "| load | entry point | outcome | requests | with `Retry-After` |\n| --- | --- | --- | --- | --- |"
    );
    for (label, recs) in phases {
        let mut by: BTreeMap<(Entry, String), (usize, usize)> = BTreeMap::new();
        for r in *recs {
            let e = by.entry((r.entry, outcome(r))).or_default();
            e.0 += 1;
            e.1 += usize::from(r.retry_after.is_some());
        }
        for ((e, o), (n, ra)) in &by {
            let _ = writeln!(md, "| {label} | {} | {o} | {n} | {ra} |", e.title());
        }
    }
    md.push('\n');
}

/// The admitted (answered 200) requests' E2E latency per entry point, over the whole run and
/// per third of the offered window (a bounded latency stays level; a growing queue climbs).
fn latency_table(md: &mut String, recs: &[Rec], window_s: f64) {
    let _ = writeln!(
        md,
        "Admitted (200) requests' E2E latency, ms, by when they were sent:\n\n| entry point | sent in | n | p50 | p95 | p99 | max |\n| --- | --- | --- | --- | --- | --- | --- |"
    );
    for e in [Entry::Abi, Entry::FrontDoor] {
        for (lo, hi, label) in [(0.0, f64::MAX, "all")]
            .into_iter()
            .chain((0..3).map(|k| (window_s * k as f64 / 3.0, window_s * (k + 1) as f64 / 3.0, "")))
            .chain([(window_s, f64::MAX, "after the window (sent late: every client thread was busy)")])
        {
            let v: Vec<f64> = recs
                .iter()
                .filter(|r| r.entry == e && r.ok && r.sent_s >= lo && r.sent_s < hi)
                .map(|r| r.e2e_ms)
                .collect();
            let q = |p| percentile(&v, p).map_or("-".into(), |x| format!("{x:.0}"));
            let when = if label.is_empty() { format!("{lo:.0}-{hi:.0} s") } else { label.to_string() };
            let _ = writeln!(
                md,
                "| {} | {when} | {} | {} | {} | {} | {} |",
                e.title(),
                v.len(),
                q(50.0),
                q(95.0),
                q(99.0),
                q(100.0)
            );
        }
    }
    md.push('\n');
}

/// What bounds an admitted request's latency: the admission per model keeps the model's
/// connections in flight, from both entry points, at the fleet's running capacity (the sum of
/// the servers' `max_seqs`, published as `max_inflight`), so an admitted request starts on a
/// server at once; its latency is its service time. Compared with the latencies measured.
fn bound(md: &mut String, recs: &[Rec], args: &Args, admission: Admission) {
    let (from, to) = (args.overload_s / 6.0, args.overload_s);
    let done = recs.iter().filter(|r| r.ok && r.end_s >= from && r.end_s < to).count();
    let per_s = done as f64 / (to - from);
    let max_s = recs.iter().filter(|r| r.ok).map(|r| r.e2e_ms).fold(0.0, f64::max) / 1000.0;
    let p50 = |entry: Entry, lo: f64, hi: f64| {
        let v: Vec<f64> = recs
            .iter()
            .filter(|r| r.entry == entry && r.ok && r.sent_s >= lo && r.sent_s < hi)
            .map(|r| r.e2e_ms / 1000.0)
            .collect();
        percentile(&v, 50.0).map_or("-".into(), |x| format!("{x:.1} s"))
    };
    let third = args.overload_s / 3.0;
    let _ = writeln!(
        md,
        "The fleet answered {per_s:.1} requests/s while overloaded ({done} answers from {from:.0} s to {to:.0} s). \
         Admission: each agent publishes its server's `max_seqs` as `max_inflight` (64 per A100, 16 per RTX 3090: {} \
         for this fleet), which is the kernel's hard cap per backend, so a socket-ABI connect to a model whose backends \
         are all at their caps is refused at `connect()` (`ECONNREFUSED`) instead of queueing; the front door runs {}. \
         The slowest admitted request took {max_s:.1} s. Admitted requests' p50 in the first and the last third of the \
         minute: socket ABI {} and {}, front door {} and {}.\n",
        seqs(args),
        admission.describe(),
        p50(Entry::Abi, 0.0, third),
        p50(Entry::Abi, 2.0 * third, args.overload_s),
        p50(Entry::FrontDoor, 0.0, third),
        p50(Entry::FrontDoor, 2.0 * third, args.overload_s),
    );
}

/// Percentiles of the admitted (200) requests' E2E latency, ms, of `entry` among `recs`
/// sent in `[lo, hi)`.
fn admitted(recs: &[Rec], entry: Entry, lo: f64, hi: f64) -> Vec<f64> {
    recs.iter().filter(|r| r.entry == entry && r.ok && r.sent_s >= lo && r.sent_s < hi).map(|r| r.e2e_ms).collect()
}

/// The admitted requests' latency at the stable load against the overload's.
fn stable_table(md: &mut String, stable: &[Rec], recs: &[Rec]) {
    let _ = writeln!(
        md,
        "Admitted (200) requests' E2E latency, ms, at the stable load (before) and in the overload:\n\n\
         | entry point | load | answered 200 / sent | p50 | p95 | p99 |\n| --- | --- | --- | --- | --- | --- |"
    );
    for e in [Entry::Abi, Entry::FrontDoor] {
        for (label, rs) in [("stable", stable), ("10x", recs)] {
            let v = admitted(rs, e, 0.0, f64::MAX);
            let sent = rs.iter().filter(|r| r.entry == e).count();
            let q = |p| percentile(&v, p).map_or("-".into(), |x| format!("{x:.0}"));
            let _ = writeln!(
                md,
                "| {} | {label} | {} / {sent} | {} | {} | {} |",
                e.title(),
                v.len(),
                q(50.0),
                q(95.0),
                q(99.0)
            );
        }
    }
    md.push('\n');
}

/// Resident memory of the daemon and the gateway: before, at the peak, at the end, KiB.
struct Rss {
    daemon: [Option<u64>; 3],
    gateway: [Option<u64>; 3],
}

impl Rss {
    fn of(before: &super::sample::Sample, samples: &[super::sample::Sample], after: &super::sample::Sample) -> Self {
        let one = |s: &super::sample::Sample, role: &str| s.procs.iter().find(|p| p.role == role).map(|p| p.rss_kb);
        let peak = |role: &str| samples.iter().chain([after]).filter_map(|s| one(s, role)).max();
        let row = |role: &str| [one(before, role), peak(role), one(after, role)];
        Rss { daemon: row("daemon"), gateway: row("gateway") }
    }
    fn line(&self) -> String {
        let mib = |v: Option<u64>| v.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1024.0));
        let row = |r: &[Option<u64>; 3]| format!("{} -> {} -> {}", mib(r[0]), mib(r[1]), mib(r[2]));
        format!(
            "RSS before -> peak -> after the drain, MiB: daemon {}, gateway {}.",
            row(&self.daemon),
            row(&self.gateway)
        )
    }
    /// Whether the end is within twice the start (and 64 MiB above it at most).
    fn bounded(r: &[Option<u64>; 3]) -> Option<bool> {
        let (a, z) = (r[0]?, r[2]?);
        Some(z <= 2 * a.max(1) || z <= a + 64 * 1024)
    }
}

/// What the goals table reads.
struct Goals<'a> {
    stable: &'a [Rec],
    recs: &'a [Rec],
    probes: &'a [(u16, bool)],
    alive: &'a str,
    rss: &'a Rss,
    window_s: f64,
}

/// The overload's goals, each met or not from the numbers above.
fn goals(md: &mut String, g: &Goals) {
    let met = |ok: bool| if ok { "met" } else { "**not met**" };
    let shed: Vec<&(u16, bool)> = g.probes.iter().filter(|(s, _)| *s != 200).collect();
    let with_ra = shed.iter().filter(|(s, ra)| matches!(s, 429 | 503) && *ra).count();
    let front: Vec<&Rec> = g.stable.iter().chain(g.recs).filter(|r| r.entry == Entry::FrontDoor).collect();
    let fd_bad = front.iter().filter(|r| !r.ok && refusal(r).is_none()).count();
    let refusals: Vec<bool> = front.iter().filter_map(|r| refusal(r)).collect();
    let refusals_ra = refusals.iter().filter(|ra| **ra).count();
    let _ = writeln!(md, "| goal | measured | |\n| --- | --- | --- |");
    let _ = writeln!(
        md,
        "| front door: the excess gets 429 or 503 with `Retry-After` | load (both phases): {refusals_ra} of {} \
         refusals 429/503 with `Retry-After`, {fd_bad} front-door failures other than 429/503; prober: {with_ra} of {} \
         refusals 429/503 with `Retry-After` | {} |",
        refusals.len(),
        shed.len(),
        met(with_ra == shed.len() && fd_bad == 0 && refusals_ra == refusals.len())
    );
    let abi_other =
        g.recs.iter().filter(|r| r.entry == Entry::Abi && !r.ok && !outcome(r).starts_with("connect")).count();
    let _ = writeln!(
        md,
        "| socket ABI: the excess is refused at `connect()` (every backend at its cap) or waits in a server's queue | \
         {abi_other} socket-ABI failures other than a refused connect | {} |",
        met(abi_other == 0)
    );
    let third = g.window_s / 3.0;
    for e in [Entry::Abi, Entry::FrontDoor] {
        let p95 = |v: Vec<f64>| percentile(&v, 95.0);
        let (first, last) = (p95(admitted(g.recs, e, 0.0, third)), p95(admitted(g.recs, e, 2.0 * third, g.window_s)));
        let stable = p95(admitted(g.stable, e, 0.0, f64::MAX));
        let f = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.1} s", x / 1000.0));
        let level = matches!((first, last), (Some(a), Some(z)) if z <= 1.5 * a);
        let _ = writeln!(
            md,
            "| {}: admitted requests' latency stays bounded (the last third's p95 within 1.5x the first's) | p95 {} \
             (stable load) / {} (first third) / {} (last third) | {} |",
            e.title(),
            f(stable),
            f(first),
            f(last),
            met(level)
        );
    }
    let _ = writeln!(md, "| nothing crashes | alive at the end: {} | {} |", g.alive, met(!g.alive.contains("not all")));
    let bounded = [&g.rss.daemon, &g.rss.gateway].iter().all(|r| Rss::bounded(r) == Some(true));
    let _ = writeln!(
        md,
        "| memory stays bounded (after the drain within 2x, or 64 MiB, of the start) | {} | {} |\n",
        g.rss.line(),
        met(bounded)
    );
}

/// The kernel's connections in flight while the load was offered (the sampler's reads, every
/// backend summed) against the sum of the caps: how much of the window the fleet was full; and
/// the fewest live backends seen (a connect is refused also when a model has none).
fn kernel_line(md: &mut String, samples: &[super::sample::Sample], args: &Args) {
    let window: Vec<&super::sample::Sample> = samples.iter().filter(|s| s.t_s < args.overload_s).collect();
    let v: Vec<f64> = window.iter().filter_map(|s| s.inflight_before.map(|n| n as f64)).collect();
    // Over the drain too: requests sent late are refused then.
    let live = samples.iter().filter_map(|s| s.live).min().map_or("-".into(), |n| n.to_string());
    let cap = seqs(args) as f64;
    let full = v.iter().filter(|n| **n >= cap).count();
    let q = |p| percentile(&v, p).map_or("-".into(), |x| format!("{x:.0}"));
    let _ = writeln!(
        md,
        "The kernel's connections in flight, all backends, sampled every {} s while the load was offered: p50 {}, \
         max {}, against the caps' sum {cap:.0}; at the caps in {full} of {} samples. Fewest live backends in a \
         sample (the drain included): {live} of {}.\n",
        super::sample::PERIOD.as_secs(),
        q(50.0),
        q(100.0),
        v.len(),
        args.a100 + args.rtx3090,
    );
}

/// The fleet's running capacity: the most sequences its servers run at once.
fn seqs(args: &Args) -> usize {
    let per = |p: &str| ailb_sim::GpuProfile::preset(p).map_or(0, |p| p.max_seqs);
    args.a100 * per("a100-80gb") + args.rtx3090 * per("rtx3090-24gb")
}

fn probes_table(md: &mut String, probes: &[(u16, bool)]) {
    let _ = writeln!(md, "Prober (one front-door request a second, its answer's head read):\n\n| status | answers | with `Retry-After` |\n| --- | --- | --- |");
    let mut by: BTreeMap<u16, (usize, usize)> = BTreeMap::new();
    for (s, ra) in probes {
        let e = by.entry(*s).or_default();
        e.0 += 1;
        e.1 += usize::from(*ra);
    }
    for (s, (n, ra)) in &by {
        let _ = writeln!(md, "| {s} | {n} | {ra} |");
    }
    md.push('\n');
}

/// One front-door request a second, reading the answer's status and whether it carries
/// `Retry-After`.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(u16, bool)>>,
}

impl Prober {
    fn start(addr: SocketAddrV4) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(Ordering::Relaxed) {
                if let Some(p) = probe(addr) {
                    out.push(p);
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            out
        });
        Prober { stop, thread }
    }
    fn stop(self) -> Vec<(u16, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// A small streamed chat request to the front door: the answer's status and whether its head
/// has `Retry-After` (the body is not read).
fn probe(addr: SocketAddrV4) -> Option<(u16, bool)> {
    let body = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"probe"}}],"max_tokens":4,"stream":true}}"#
    );
    let mut s = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut retry_after = false;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
            break;
        }
        retry_after |= line.to_ascii_lowercase().starts_with("retry-after:");
    }
    Some((status, retry_after))
}

#[cfg(test)]
mod tests;
