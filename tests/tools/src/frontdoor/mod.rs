//! `ailb-frontdoor-bench` (root; `cargo xtask bench --only frontdoor`): small non-streamed
//! requests through ailb's front door, side by side with the same requests directly to the
//! server and through the routers users would pick instead, as ratios.
//!
//! Every path stands in front of ONE simulated server (`ailb-sim`, a100-80gb preset, time scale
//! [`paths::SIM_TIME_SCALE`], so that a one-token completion answers at once):
//!
//! - direct: no router;
//! - `ailb gateway`, once per value of [`GATEWAY_VARIANTS`]: `ailb run` attached to a child
//!   cgroup created here, the gateway inside it, the server the model's only backend (static
//!   config), so that every upstream connect of the gateway goes through the kernel's pick;
//! - the default front door once more, outside the cgroup with no daemon (no kernel pick): not
//!   a deployment, a reference row that shows what the kernel's part costs per request;
//! - nginx as an L7 proxy with upstream keep-alive (`keepalive` in the upstream block, HTTP/1.1
//!   and an empty `Connection` header upstream, as its docs recommend);
//! - `sglang-router` and `vllm-router` from the peers' venv, with their defaults;
//! - HAProxy in TCP mode, a relay that does no HTTP work: not a peer, the floor. Its added
//!   latency is what the two extra loopback hops of any userspace proxy cost on this machine in
//!   this round; the report gives each front door's added latency over it too.
//!
//! The load is `wrk -t1 -c16 -d5s --latency` POSTing a one-token chat completion ([`wrk`]) over
//! keep-alive client connections (saturated: the cores are busy), then the same with one
//! connection (a closed loop, one request at a time: every path sustains it), in interleaved
//! rounds (every path once per round, in turns, each round starting one path later than the one
//! before) so that drift and a path's place in the turn hit all alike. The report gives
//! per path req/s (median and range), p50 and p99, the latency it adds over direct in the same
//! round at both loads, the ratios to direct and to the fastest peer, the CPU per request of the
//! router's process tree and of the server, whether the front door meets its goals (ahead of the
//! fastest peer; under 100 us added at p50, judged on the closed loop, where "added" is the
//! router's own time rather than its share of the saturated cores), and
//! where its time goes ([`profile`]).
//!
//! Everything runs in a private network namespace (this process unshares one before it starts
//! anything, so every child is in it; loopback only) and the cgroup, both gone on exit.
//! Writes `target/bench/frontdoor.md` and prints it; progress on stderr.

pub mod args;
pub mod paths;
pub mod procs;
pub mod profile;
pub mod report;
pub mod wrk;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ailb_tests::{base_config, ensure_bpffs, require_root, BackendCfg, CgroupGuard, Daemon};
use anyhow::{bail, Context};
use clap::Parser;

use self::args::Args;
use self::paths::Target;
use self::procs::tree_cpu;
use self::report::{PathResult, Role, Sample, Setup};
use crate::compare::{peers, policy::Policy};
use crate::sim_gpus::Proc;

/// The model the server serves and the requests name.
pub const MODEL: &str = "sim-7b";
/// The front door's settings measured, one row each (`[gateway] upstream_reuse` and
/// `http1_fast_path`): a fresh upstream socket and kernel pick per request, idle upstream
/// connections kept per routing inputs (the default), both on the front door's own HTTP/1 path
/// (the default); the default reuse with every kept connection marked idle in the kernel as its
/// answer ends (`upstream_idle_mark_after = "0s"`: an idle and a busy `setsockopt` per reused
/// request, which the default's 10 ms wait saves on back-to-back requests); and the default
/// reuse with hyper on both sides (`http1_fast_path = false`).
pub const GATEWAY_VARIANTS: &[paths::Variant] = &[
    paths::Variant { reuse: "never", fast: true, idle_mark_after: None },
    paths::Variant { reuse: "conversation", fast: true, idle_mark_after: None },
    paths::Variant { reuse: "conversation", fast: true, idle_mark_after: Some("0s") },
    paths::Variant { reuse: "conversation", fast: false, idle_mark_after: None },
];
/// The front door's defaults among [`GATEWAY_VARIANTS`].
pub const DEFAULT_VARIANT: paths::Variant = paths::Variant { reuse: "conversation", fast: true, idle_mark_after: None };
/// wrk's keep-alive client connections in the saturated runs.
pub const CONNECTIONS: u32 = 16;
/// The closed loop: one connection, one request at a time. Every path sustains that rate (no
/// queue forms anywhere), so the latency a router adds over direct there is its own time per
/// request; at [`CONNECTIONS`] on shared cores the added latency mostly measures throughput.
pub const CLOSED_LOOP: u32 = 1;

const SIM: &str = "127.0.0.11:18001";
const VIP: &str = "127.77.0.1:80";
const GATEWAY_IP: &str = "127.0.0.21";
const GATEWAY_BASE_PORT: u16 = 8080;
const NGINX: &str = "127.0.0.22:8080";
const SGLANG: &str = "127.0.0.23:8080";
const VLLM: &str = "127.0.0.24:8080";
const RELAY: &str = "127.0.0.25:8080";

thread_local! {
    static START: Instant = Instant::now();
}

fn say(msg: &str) {
    eprintln!("[frontdoor {:>6.1}s] {msg}", START.with(|s| s.elapsed().as_secs_f64()));
}

/// The whole benchmark; the report is written and printed. Fails after writing it when any
/// measured path had a failed run.
pub fn main(args: Args) -> anyhow::Result<()> {
    START.with(|_| ());
    require_root();
    let ailb = binary("AILB_BIN", crate::target_dir().join("release/ailb"), "`cargo xtask build --release`")?;
    let sim_bin =
        binary("AILB_SIM_BIN", crate::sim_gpus::sibling_bin("ailb-sim"), "`cargo build --release -p ailb-sim`")?;
    for tool in ["wrk", "nginx", "ip"] {
        if !installed(tool) {
            bail!("{tool} is not installed: run `cargo xtask setup`");
        }
    }
    ensure_bpffs();
    enter_private_netns()?;
    say(&format!("measuring {} (server {})", ailb.display(), sim_bin.display()));
    let work = tempfile::Builder::new().prefix("ailb-frontdoor-").tempdir().context("temp dir")?;
    let cg = CgroupGuard::new("frontdoor");
    let sim = paths::start_sim(&sim_bin, work.path())?;
    let cfg = base_config("frontdoor", &cg).service(MODEL, VIP).backend(BackendCfg::new(MODEL, SIM, 1));
    let daemon = Daemon::start(&ailb, &cfg);
    say("server and ailb daemon ready");
    let mut targets = start_targets(&ailb, &cfg.to_toml(), &cg, work.path(), args.focus);
    let script = wrk::write_script(work.path())?;
    let results = measure(&mut targets, &sim, &script, &args);
    let breakdown = if args.profile_seconds > 0 {
        where_time_goes(&targets, &script, args.profile_seconds, work.path())
    } else {
        String::new()
    };
    drop(targets);
    drop(daemon);
    let report = report::render(&setup(&ailb, &args), &results, &breakdown);
    let path = args.out.clone().unwrap_or_else(|| crate::target_dir().join("bench/frontdoor.md"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    say(&format!("report written to {}", path.display()));
    let failed: Vec<&str> =
        results.iter().filter(|r| r.samples.iter().any(|s| s.failure.is_some())).map(|r| r.name.as_str()).collect();
    if !failed.is_empty() {
        bail!("failed runs (non-2xx answers or socket errors) on: {}", failed.join(", "));
    }
    Ok(())
}

/// `$VAR` (unless empty) or `default`; an error naming the path and how to build it when absent.
fn binary(var: &str, default: PathBuf, build: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from).unwrap_or(default);
    if !path.is_file() {
        bail!("{} is absent: build it with {build}, or name it with {var}", path.display());
    }
    Ok(path)
}

fn installed(tool: &str) -> bool {
    Command::new("which").arg(tool).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Moves this process into a network namespace of its own with `lo` up: every child started
/// after it (the server, the routers, wrk, the daemon) shares it, and it goes with the last of
/// them.
fn enter_private_netns() -> anyhow::Result<()> {
    // SAFETY: unshare(2) only changes the calling thread's network namespace; this runs before
    // the process starts any other thread, so every later thread and child inherits it.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    }
    let st = Command::new("ip").args(["link", "set", "lo", "up"]).status().context("running ip link set lo up")?;
    if !st.success() {
        bail!("ip link set lo up failed in the private network namespace ({st})");
    }
    Ok(())
}

/// Every path (with `focus`, those of [`Args::focus`]), started; each probed with one request
/// that must answer 200 (one that does not is reported as not measured, with why).
fn start_targets(ailb: &Path, catalog: &str, cg: &CgroupGuard, dir: &Path, focus: bool) -> Vec<Target> {
    let venv = peers::venv();
    let mut targets = vec![paths::direct()];
    for (i, v) in GATEWAY_VARIANTS.iter().enumerate() {
        if !focus || *v == DEFAULT_VARIANT {
            targets.push(paths::gateway(ailb, catalog, cg, v, i, dir));
        }
    }
    if !focus {
        targets.push(paths::gateway_outside(ailb, GATEWAY_VARIANTS.len(), dir));
    }
    targets.push(paths::nginx(dir));
    targets.push(paths::relay(dir));
    if !focus {
        targets.push(paths::peer(Policy::SglangCacheAware, &venv, dir));
        targets.push(paths::peer(Policy::VllmCacheAware, &venv, dir));
    }
    for t in targets.iter_mut().filter(|t| t.missing.is_none()) {
        let addr = t.url.trim_start_matches("http://").split('/').next().unwrap_or_default().to_string();
        match addr.parse().map_err(anyhow::Error::from).and_then(paths::post_status) {
            Ok((200, _)) => say(&format!("ready: {}", t.name)),
            Ok((status, head)) => t.missing = Some(format!("its probe request answered {status}: {head}")),
            Err(e) => t.missing = Some(format!("its probe request failed: {e:#}")),
        }
        if let Some(why) = &t.missing {
            say(&format!("not measured: {}: {why}", t.name));
        }
    }
    targets
}

/// `args.rounds` interleaved rounds of wrk over every measured path.
fn measure(targets: &mut [Target], sim: &Proc, script: &Path, args: &Args) -> Vec<PathResult> {
    let mut results: Vec<PathResult> = targets
        .iter()
        .map(|t| PathResult {
            name: t.name.clone(),
            role: t.role,
            settings: t.settings.clone(),
            samples: Vec::new(),
            missing: t.missing.clone(),
        })
        .collect();
    let sim_pid = sim.child.id();
    let measured: Vec<usize> = (0..targets.len()).filter(|&i| targets[i].missing.is_none()).collect();
    for round in 1..=args.rounds {
        // Each round starts one path later: which path ran just before, and how far into the
        // round a path runs, is then no lasting advantage to any of them.
        let start = (round as usize - 1) % measured.len().max(1);
        for &i in measured.iter().cycle().skip(start).take(measured.len()) {
            let (t, r) = (&mut targets[i], &mut results[i]);
            say(&format!("round {round}/{}: {}", args.rounds, t.name));
            let (router0, server0) = (t.pid().and_then(tree_cpu), tree_cpu(sim_pid));
            let run = wrk::run(&t.url, script, CONNECTIONS, args.seconds);
            let (router1, server1) = (t.pid().and_then(tree_cpu), tree_cpu(sim_pid));
            let closed = wrk::run(&t.url, script, CLOSED_LOOP, args.seconds);
            let sample = match (run, closed) {
                (Ok(w), Ok(c)) => Sample {
                    failure: failures(&w, &c),
                    wrk: w,
                    closed: c,
                    router_cpu: router0.zip(router1).map(|(a, b)| b.since(a)),
                    server_cpu: server0.zip(server1).map(|(a, b)| b.since(a)),
                },
                (Err(e), _) | (_, Err(e)) => Sample { failure: Some(format!("{e:#}")), ..Sample::default() },
            };
            if let Some(why) = &sample.failure {
                say(&format!("  FAILED: {why}"));
            } else {
                say(&format!(
                    "  {:.0} req/s, p50 {:.0} us, p99 {:.0} us; one connection: p50 {:.0} us, p99 {:.0} us",
                    sample.wrk.rps, sample.wrk.p50_us, sample.wrk.p99_us, sample.closed.p50_us, sample.closed.p99_us
                ));
            }
            r.samples.push(sample);
        }
    }
    results
}

/// Why a round failed: the saturated run's and the closed loop's failures, each named.
fn failures(saturated: &wrk::WrkRun, closed: &wrk::WrkRun) -> Option<String> {
    let why: Vec<String> = [(CONNECTIONS, saturated.failure()), (CLOSED_LOOP, closed.failure())]
        .into_iter()
        .filter_map(|(c, f)| Some(format!("at {c} connection(s): {}", f?)))
        .collect();
    (!why.is_empty()).then(|| why.join("; "))
}

/// The breakdown section: system calls per request of every front-door row and of nginx
/// (strace), and every front-door row's CPU samples by binary and symbol (perf, where installed).
fn where_time_goes(targets: &[Target], script: &Path, seconds: u32, dir: &Path) -> String {
    let mut out = String::from("## Where the front door's time goes\n\n");
    out.push_str(
        "Measured after the rounds, one traced wrk run each (tracing slows the router down, so these runs \
         give counts and shares, not speeds). The CPU split between user and system time is in the table \
         above.\n\n",
    );
    let traced = targets.iter().filter(|t| t.missing.is_none() && t.pid().is_some());
    let traced: Vec<&Target> = traced.filter(|t| t.role == Role::Ailb || t.name.starts_with("nginx")).collect();
    if installed("strace") {
        for t in &traced {
            say(&format!("strace -c -f: {}", t.name));
            let file = dir.join(format!("strace-{}.txt", out.len()));
            match profile::strace(t.pid().expect("running"), &t.url, script, seconds, &file) {
                Ok((counts, run)) => out.push_str(&format!(
                    "### {}: system calls per request\n\n`strace -c -f` on every process and thread, one {seconds} s \
                     wrk run ({} requests under tracing). A non-blocking `connect` returns EINPROGRESS, which \
                     strace counts as failed.\n\n{}\n",
                    t.name,
                    run.requests,
                    profile::syscalls_table(&counts, run.requests)
                )),
                Err(e) => out.push_str(&format!("### {}: system calls\n\nstrace failed: {e:#}\n\n", t.name)),
            }
        }
    } else {
        out.push_str("strace is not installed: no system-call counts.\n\n");
    }
    let gateways: Vec<&&Target> = traced.iter().filter(|t| t.role == Role::Ailb).collect();
    if !installed("perf") {
        out.push_str("perf is not installed: no CPU samples by symbol.\n\n");
    }
    for t in gateways.iter().filter(|_| installed("perf")) {
        say(&format!("perf record: {}", t.name));
        match profile::perf(t.pid().expect("running"), &t.url, script, seconds, dir) {
            Ok((text, run)) => out.push_str(&format!(
                "### {}: CPU samples (`perf record -F 2000`, one {seconds} s wrk run, {} requests)\n\n{text}\n",
                t.name, run.requests
            )),
            Err(e) => out.push_str(&format!("### {}: CPU samples\n\nperf failed: {e:#}\n\n", t.name)),
        }
    }
    out
}

/// The setup lines of the report: date, machine, binaries and versions, server, load.
fn setup(ailb: &Path, args: &Args) -> Setup {
    let sh = |c: &str| {
        Command::new("sh")
            .args(["-c", c])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let venv = peers::venv();
    let versions = sh(&format!(
        "{}/bin/python -m pip list --format=freeze 2>/dev/null | grep -E '^(sglang-router|vllm-router)=='",
        venv.display()
    ));
    Setup {
        date: sh("date -u '+%Y-%m-%d %H:%M UTC'"),
        machine: format!(
            "{} cores ({}), shared by wrk, the router and the server; kernel {}",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
            sh("uname -r")
        ),
        ailb: format!(
            "`{}`; peers: {}; {}; {}",
            ailb.display(),
            if versions.is_empty() { "not installed".into() } else { versions.replace('\n', ", ") },
            sh("nginx -v 2>&1"),
            sh("wrk -v 2>&1 | head -1")
        ),
        server: format!(
            "one `ailb-sim --profile a100-80gb --time-scale {}` on {SIM} (every path in front of it){}",
            paths::SIM_TIME_SCALE,
            if args.focus {
                "; paths: direct, the default front door, nginx and the HAProxy relay only (`--focus`): \
                 sglang-router, vllm-router and the other front door settings are not run"
            } else {
                ""
            }
        ),
        load: format!(
            "`wrk -t1 -c{CONNECTIONS} -d{s}s --latency -s post.lua` (saturated), then `wrk -t1 -c{CLOSED_LOOP} -d{s}s` \
             (closed loop: one request at a time): keep-alive client connections, each request a POST of `{}` \
             (Content-Type: application/json, `X-Session-ID: {}`)",
            wrk::body(),
            wrk::SESSION,
            s = args.seconds,
        ),
        rounds: args.rounds as usize,
        reproduce: reproduce(args),
    }
}

/// The command that runs this measurement again.
fn reproduce(args: &Args) -> String {
    let defaults = args::Args::parse_from(["ailb-frontdoor-bench"]);
    let mut flags = String::new();
    if args.focus {
        flags.push_str(" --focus");
    }
    if args.rounds != defaults.rounds {
        flags.push_str(&format!(" --rounds {}", args.rounds));
    }
    if args.seconds != defaults.seconds {
        flags.push_str(&format!(" --seconds {}", args.seconds));
    }
    if flags.is_empty() {
        "`cargo xtask bench --only frontdoor`".into()
    } else {
        format!("`cargo xtask build --release && cargo build --release -p ailb-tools -p ailb-sim && target/release/ailb-frontdoor-bench{flags}`")
    }
}

#[cfg(test)]
mod tests;
