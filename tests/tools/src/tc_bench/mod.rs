//! `ailb-tc-bench` (root): remote clients through the TC datapath, in namespaces it makes and
//! removes (client -- gateway -- backends, `ailb_tests::remote`). Side by side in one run, in
//! interleaved rounds: new connections per second (connect, one short request and answer,
//! close; the backend closes first) from the client namespace through the TC VIP, routed
//! directly to the three backends in turn (round robin in the client, as the VIP spreads its
//! connections over them), and through HAProxy in TCP mode in the gateway namespace. Then the
//! TC program's run time per packet from the kernel's BPF statistics (`run_time_ns / run_cnt`),
//! for established packets (a phase of echoes on held connections only) and for SYNs (derived
//! from the new-connection phase: its time less its established packets at the established
//! rate, over the SYNs it opened).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ailb_tests::netns::{BACKEND_ADDRS, GATEWAY_CLIENT_SIDE};
use ailb_tests::remote::{connect_here, Gateway, GatewaySpec, Remote, BACKEND_PORT};
use anyhow::{bail, Context, Result};

mod floor;

use floor::{Floors, FLOORS};

/// Options of `ailb-tc-bench`.
#[derive(Debug, clap::Parser)]
#[command(
    about = "New connections per second through the TC VIP vs direct vs HAProxy, and the TC program's ns per packet"
)]
pub struct Args {
    /// Rounds; each measures every path once, in turn.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds each path runs per round. At about 10,000 new connections a second through the
    /// VIP, 3 rounds of 1 s and the warm-up stay under the NAT range's 48,976 ports: past them a
    /// port comes round while its backend may hold the last connection on it in TIME_WAIT, and
    /// what is then measured is that, not the datapath.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Client threads, each a loop of connections.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Where the report goes.
    #[arg(long, default_value = "target/bench/tc.md")]
    pub out: PathBuf,
}

/// The NAT ports of the run (the gateway's ephemeral ports are set above them).
const NAT_PORTS: (u16, u16) = (1024, 49999);

/// HAProxy's frontends, on the gateway's client-side address: its defaults, and tuned.
const HAPROXY_PORT: u16 = 8001;
const HAPROXY_TUNED_PORT: u16 = 8002;

/// The paths measured: the TC VIP, direct, HAProxy with its defaults and tuned.
const PATHS: usize = 4;

/// TCP counters read in the client and the backends namespaces before and after each path's
/// run: where a connection loses time other than in the datapath's programs (a retransmission
/// timeout costs 200 ms or more, a delayed ACK up to 40 ms).
const TCP_COUNTERS: &[&str] = &[
    "Tcp:RetransSegs",
    "TcpExt:TCPTimeouts",
    "TcpExt:TCPSynRetrans",
    "TcpExt:DelayedACKs",
    "TcpExt:ListenOverflows",
    "TcpExt:ListenDrops",
    "Tcp:AttemptFails",
    "Tcp:EstabResets",
    "Tcp:OutRsts",
];

/// The tuned HAProxy's options beyond the defaults, as its manual recommends for TCP mode:
/// kernel splicing of the payload between the sockets where it pays, and the server-side
/// connect that sends the first data with its ACK instead of a bare ACK first. Both instances
/// cap the splice pipes (`maxpipes 1000`) so that the descriptors they need stay under the
/// process limit.
const HAPROXY_TUNING: &str = "option splice-auto\n  option tcp-smart-connect";

fn say(msg: &str) {
    eprintln!("[ailb-tc-bench] {msg}");
}

/// A child process stopped by pid on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// HAProxy in TCP mode in the gateway namespace, round robin over the backends, one thread per
/// CPU (`nbthread`), listening on `port` with `options` in its defaults, its config in `work`.
fn start_haproxy(gw: &Gateway, work: &Path, port: u16, options: &str) -> Result<Proc> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let servers: String =
        BACKEND_ADDRS.iter().enumerate().map(|(i, a)| format!("  server s{i} {a}:{BACKEND_PORT}\n")).collect();
    let conf = work.join(format!("haproxy-{port}.cfg"));
    std::fs::write(
        &conf,
        format!(
            "global\n  maxconn 8000\n  maxpipes 1000\n  nbthread {threads}\ndefaults\n  mode tcp\n  {options}\n  timeout connect 5s\n  \
             timeout client 30s\n  timeout server 30s\nfrontend f\n  bind {GATEWAY_CLIENT_SIDE}:{port}\n  \
             default_backend b\nbackend b\n  balance roundrobin\n{servers}"
        ),
    )
    .with_context(|| format!("writing {}", conf.display()))?;
    let child = Command::new("nsenter")
        .arg(format!("--net={}", gw.topo.gateway.path()))
        .args(["--", "haproxy", "-db", "-f"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting haproxy (install it: `cargo xtask setup`)")?;
    Ok(Proc(child))
}

/// `threads` loops of new connections from the client namespace for `secs`, each thread's
/// connections going to the addresses of `to` in turn (starting at its own): the connections
/// completed per second, and the failures.
fn rate(gw: &Gateway, to: &[SocketAddrV4], threads: usize, secs: f64) -> (f64, u64) {
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (done, failed) = (&done, &failed);
            let path = gw.topo.client.path();
            s.spawn(move || {
                enter(&path);
                let mut next = t;
                while Instant::now() < deadline {
                    next = (next + 1) % to.len();
                    match connect_here(to[next], None, false) {
                        Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    });
    (done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(), failed.load(Ordering::Relaxed))
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: a valid namespace fd; setns changes only this thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// (run_cnt, run_time_ns) of the ingress program behind the tcx link pinned at `pin`.
fn prog_stats(pin: &Path) -> Result<(u64, u64)> {
    let link = json(Command::new("bpftool").args(["link", "show", "pinned"]).arg(pin).arg("--json"))?;
    let id = link["prog_id"].as_u64().with_context(|| format!("no prog_id for {}: {link}", pin.display()))?;
    let prog = json(Command::new("bpftool").args(["prog", "show", "id", &id.to_string(), "--json"]))?;
    Ok((prog["run_cnt"].as_u64().unwrap_or(0), prog["run_time_ns"].as_u64().unwrap_or(0)))
}

fn json(cmd: &mut Command) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{cmd:?}: not JSON"))
}

/// Restores `kernel.bpf_stats_enabled` on drop.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Result<Self> {
        let path = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        std::fs::write(path, "1").with_context(|| format!("enabling {path}"))?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The run: rates, then the per-packet run time; the report is written to `args.out`.
pub fn main(args: Args) -> Result<()> {
    if args.rounds == 0 || args.threads == 0 || args.seconds <= 0.0 {
        bail!(
            "--rounds, --threads and --seconds must be positive (got {}, {}, {})",
            args.rounds,
            args.threads,
            args.seconds
        );
    }
    let (spec, gw) = start_gateway()?;
    let work = tempfile::tempdir().context("temp dir")?;
    let _haproxy = start_haproxy(&gw, work.path(), HAPROXY_PORT, "")?;
    let _haproxy_tuned = start_haproxy(&gw, work.path(), HAPROXY_TUNED_PORT, HAPROXY_TUNING)?;
    let haproxy = SocketAddrV4::new(GATEWAY_CLIENT_SIDE, HAPROXY_PORT);
    let haproxy_tuned = SocketAddrV4::new(GATEWAY_CLIENT_SIDE, HAPROXY_TUNED_PORT);
    let direct = BACKEND_ADDRS.map(|a| SocketAddrV4::new(a, BACKEND_PORT));
    let paths: [(&str, &[SocketAddrV4]); PATHS] = [
        ("TC VIP", &[spec.vip]),
        ("direct to the 3 backends in turn", &direct),
        ("HAProxy, TCP mode, defaults", &[haproxy]),
        ("HAProxy, TCP mode, tuned", &[haproxy_tuned]),
    ];
    // HAProxy is ready when it answers; warm every path up.
    wait_for_haproxy(&gw, [haproxy, haproxy_tuned])?;
    for (_, to) in paths {
        rate(&gw, to, args.threads, 0.2);
    }
    let pin = gw.daemon.bpffs().join("links").join(format!("tc-{}", gw.topo.gateway_ifaces[0]));
    let mut floors = Floors::load()?;
    // What the statistics add to a run: the empty program's test runs with them off, then on.
    let stats_off = floors.test_run_empty(TEST_RUNS)?;
    let stats = BpfStats::enable()?;
    let stats_on = floors.test_run_empty(TEST_RUNS)?;
    let mut rounds = rate_rounds(&args, &gw, &paths, &pin)?;
    let established = established_phase(&gw, &spec, &pin, args.threads, &mut floors)?;
    drop(floors);
    drop(stats);
    let report = full_report(&args, &gw, &paths.map(|p| p.0), &mut rounds, &established, (stats_off, stats_on));
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&args.out, &report).with_context(|| format!("writing {}", args.out.display()))?;
    println!("{report}");
    say(&format!("report: {}", args.out.display()));
    Ok(())
}

/// The namespaces and `ailb run` with a TC VIP, the gateway's ephemeral ports above the NAT
/// ports.
fn start_gateway() -> Result<(GatewaySpec, Gateway)> {
    let mut spec = GatewaySpec::new("tc-bench", true);
    // Room for the run's connections: a NAT port comes round only after the whole range, and
    // one that comes round while its backend holds the last connection in TIME_WAIT (60 s) costs
    // the client a SYN retransmission (docs/ARCHITECTURE.md, NAT port allocation). The gateway's
    // own ephemeral ports (HAProxy's) are moved above the range.
    spec.tc = format!("nat_ports = \"{}-{}\"\n", NAT_PORTS.0, NAT_PORTS.1);
    let gw = Gateway::start(&spec);
    gw.topo
        .gateway
        .run(|| std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "50000 60999"))
        .context("setting the gateway's ip_local_port_range")?;
    Ok((spec, gw))
}

/// Waits up to 10 s for each HAProxy frontend in `to` to accept a connection from the client
/// namespace.
fn wait_for_haproxy(gw: &Gateway, to: [SocketAddrV4; 2]) -> Result<()> {
    let ready = Instant::now() + Duration::from_secs(10);
    for to in to {
        while gw.topo.client.run(move || connect_here(to, None, false)).is_err() {
            if Instant::now() > ready {
                bail!("haproxy did not answer on {to} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The rate rounds' measurements, per path in the order of the paths.
struct Rounds {
    /// Connections per second, one per round.
    rates: Vec<Vec<f64>>,
    failures: [u64; PATHS],
    /// The TC program's runs and ns during the TC VIP's rounds, and the flows (SYNs) opened.
    tc: (u64, u64, u64),
    /// The connections made, and each TCP counter's change (client, backends).
    made: [f64; PATHS],
    tcp: Vec<[(u64, u64); TCP_COUNTERS.len()]>,
}

/// `args.rounds` rounds, each measuring every path in turn for `args.seconds`.
fn rate_rounds(args: &Args, gw: &Gateway, paths: &[(&str, &[SocketAddrV4]); PATHS], pin: &Path) -> Result<Rounds> {
    let mut m = Rounds {
        rates: vec![Vec::new(); paths.len()],
        failures: [0u64; PATHS],
        tc: (0, 0, 0),
        made: [0f64; PATHS],
        tcp: vec![[(0u64, 0u64); TCP_COUNTERS.len()]; PATHS],
    };
    for round in 0..args.rounds {
        for (i, (name, to)) in paths.iter().enumerate() {
            let (before, opened) = (prog_stats(pin)?, gw.stat("flows_opened"));
            let counters_before = (gw.topo.client.counters(), gw.topo.backends.counters());
            let (r, failed) = rate(gw, to, args.threads, args.seconds);
            let counters_after = (gw.topo.client.counters(), gw.topo.backends.counters());
            m.made[i] += r * args.seconds;
            for (k, name) in TCP_COUNTERS.iter().enumerate() {
                let delta = |a: &HashMap<String, u64>, b: &HashMap<String, u64>| {
                    b.get(*name).copied().unwrap_or(0).saturating_sub(a.get(*name).copied().unwrap_or(0))
                };
                m.tcp[i][k].0 += delta(&counters_before.0, &counters_after.0);
                m.tcp[i][k].1 += delta(&counters_before.1, &counters_after.1);
            }
            let after = prog_stats(pin)?;
            if i == 0 {
                m.tc.0 += after.0 - before.0;
                m.tc.1 += after.1 - before.1;
                m.tc.2 += gw.stat("flows_opened") - opened;
            }
            m.failures[i] += failed;
            say(&format!("round {}: {name}: {r:.0} connections/s ({failed} failed)", round + 1));
            m.rates[i].push(r);
        }
    }
    Ok(m)
}

/// The whole report: the rates and the run times, what the gateway counted after the run, the
/// TCP counters and where the established packet's time goes (`stats`: the statistics' cost,
/// off and on). Sorts each path's rates (for their median).
fn full_report(
    args: &Args,
    gw: &Gateway,
    names: &[&str; PATHS],
    rounds: &mut Rounds,
    established: &Established,
    stats: (f64, f64),
) -> String {
    let (tc_runs, tc_ns, tc_syns) = rounds.tc;
    let (est_runs, echoes) = (established.runs, established.echoes);
    let est = established.ns as f64 / est_runs.max(1) as f64;
    let syn = (tc_ns as f64 - (tc_runs - tc_syns) as f64 * est) / tc_syns.max(1) as f64;
    let med: Vec<f64> = rounds.rates.iter_mut().map(|v| median(v)).collect();
    let tc = gw.tc();
    let retrans = gw.topo.client.counters().get("TcpExt:TCPSynRetrans").copied().unwrap_or(0);
    let mut report = report(
        args,
        names,
        &rounds.rates,
        &med,
        &rounds.failures,
        (tc_runs, tc_ns, tc_syns),
        (est_runs, echoes),
        syn,
        est,
    );
    let nat_range = u64::from(NAT_PORTS.1 - NAT_PORTS.0 + 1);
    let opened = tc["stats"]["flows_opened"].as_u64().unwrap_or(0);
    if opened > nat_range {
        let _ = writeln!(
            report,
            "\n**The run opened {opened} flows through the VIP, more than the {nat_range} NAT ports: ports came round \
             within the backends' TIME_WAIT, so its last VIP rounds measure that, not the datapath (fewer or shorter \
             rounds: `--rounds`, `--seconds`).**"
        );
    }
    let _ = writeln!(
        report,
        "\nAfter the run: client SYN retransmissions {retrans}; TC counters {}. NAT ports {}-{}: a port comes round \
         after {} flows, so above {:.0} new remote flows a second sustained for a minute a port meets its backend's \
         TIME_WAIT and costs a SYN retransmission.",
        tc["stats"],
        NAT_PORTS.0,
        NAT_PORTS.1,
        nat_range,
        nat_range as f64 / 60.0
    );
    report.push_str(&tcp_report(names, &rounds.made, &rounds.tcp));
    report.push_str(&floor_report(established, est, stats));
    report
}

/// The TCP counters' changes per path, per 1,000 connections (client / backends).
fn tcp_report(names: &[&str; PATHS], made: &[f64; PATHS], tcp: &[[(u64, u64); TCP_COUNTERS.len()]]) -> String {
    let mut r = String::from(
        "\n## TCP counters during the rate rounds\n\nChange of each counter over every round of a path, per 1,000 \
         connections made (`/proc/net/snmp` and `netstat` of the client namespace / of the backends namespace).\n\n| path |",
    );
    for name in TCP_COUNTERS {
        let _ = write!(r, " {} |", name.split_once(':').map_or(*name, |(_, n)| n));
    }
    r.push_str("\n|---|");
    r.push_str(&"---:|".repeat(TCP_COUNTERS.len()));
    r.push('\n');
    for i in 0..PATHS {
        let per = 1000.0 / made[i].max(1.0);
        let _ = write!(r, "| {} |", names[i]);
        for &(c, b) in &tcp[i] {
            let _ = write!(r, " {:.1} / {:.1} |", c as f64 * per, b as f64 * per);
        }
        r.push('\n');
    }
    r
}

/// The established phase's measurements: `ailb_tc_ingress`'s and each reference program's
/// (runs, ns) over the same packets, and the echoes made.
struct Established {
    runs: u64,
    ns: u64,
    echoes: u64,
    floors: Vec<(u64, u64)>,
}

/// Echoes on held connections through the VIP (established packets only, both ways), with the
/// reference programs ([`floor`]) in front of `ailb_tc_ingress` on the same interfaces.
fn established_phase(
    gw: &Gateway,
    spec: &GatewaySpec,
    pin: &Path,
    threads: usize,
    floors: &mut Floors,
) -> Result<Established> {
    let vip = spec.vip;
    let mut held: Vec<Remote> = (0..threads)
        .map(|_| gw.topo.client.run(move || connect_here(vip, None, true)))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("held connection: {e}"))?;
    let copied = floors.copy_flows(gw.daemon.bpffs())?;
    say(&format!("established phase: {copied} flow entries copied to the reference programs' map"));
    floors.attach(gw)?;
    let (before, floors_before) = (prog_stats(pin)?, floors.stats()?);
    let echoes = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|s| {
        for r in held.iter_mut() {
            let echoes = &echoes;
            s.spawn(move || {
                while Instant::now() < deadline && r.echo(b"x").is_ok() {
                    echoes.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let (after, floors_after) = (prog_stats(pin)?, floors.stats()?);
    drop(held);
    let floors = floors_after.iter().zip(&floors_before).map(|(a, b)| (a.0 - b.0, a.1 - b.1)).collect();
    Ok(Established { runs: after.0 - before.0, ns: after.1 - before.1, echoes: echoes.load(Ordering::Relaxed), floors })
}

/// The empty program's test runs, for the statistics' own cost.
const TEST_RUNS: u32 = 1_000_000;

/// The reference programs' ns per run next to `ailb_tc_ingress`'s (`est`) on the same
/// packets, and the statistics' cost (`stats`: the empty program's test run off, on).
fn floor_report(e: &Established, est: f64, (off, on): (f64, f64)) -> String {
    let mut r = String::from(
        "\n## Where the established packet's time goes (reference programs, same packets)\n\nIn front of \
         `ailb_tc_ingress` on the same tcx ingresses during the established phase (each returns `TCX_NEXT` and \
         leaves the packet as it was; `ailb-ebpf/src/tc_floor.rs`); each row adds one stage to the row above.\n\n\
         | program | runs | ns per run | stage adds |\n|---|---:|---:|---:|\n",
    );
    let mut prev = 0.0;
    for ((name, what), (runs, ns)) in FLOORS.iter().zip(&e.floors) {
        let per = *ns as f64 / (*runs).max(1) as f64;
        let _ = writeln!(r, "| `{name}`: {what} | {runs} | {per:.0} | {:.0} |", per - prev);
        prev = per;
    }
    let _ = writeln!(
        r,
        "| `ailb_tc_ingress` (the rest: time, flow entry write, close tracking, TTL, MACs, counters, redirect) | {} | \
         {est:.0} | {:.0} |\n\nThe statistics' own cost: the empty program under `BPF_PROG_TEST_RUN` ({TEST_RUNS} \
         runs on a 64-byte frame) {off:.1} ns per run with `bpf_stats_enabled=0`, {on:.1} ns with it on: \
         **{:.1} ns** of each run above is the statistics' clock reads and counter.",
        e.runs,
        est - prev,
        on - off
    );
    r
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    names: &[&str; PATHS],
    rates: &[Vec<f64>],
    med: &[f64],
    failures: &[u64; PATHS],
    (tc_runs, tc_ns, tc_syns): (u64, u64, u64),
    (est_runs, echoes): (u64, u64),
    syn: f64,
    est: f64,
) -> String {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# TC datapath: remote new connections\n\nClient namespace -> gateway namespace -> backends namespace (veth), \
         {} client threads, {} rounds of {} s per path, interleaved; each connection: connect, one short request \
         and answer, close (the backend closes first). HAProxy {} in TCP mode, nbthread = CPUs. Median of the rounds.\n",
        args.threads,
        args.rounds,
        args.seconds,
        haproxy_version()
    );
    let _ = writeln!(r, "| path | connections/s (median) | rounds | failed |\n|---|---:|---|---:|");
    for i in 0..PATHS {
        let rounds: Vec<String> = rates[i].iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(r, "| {} | {:.0} | {} | {} |", names[i], med[i], rounds.join(", "), failures[i]);
    }
    let _ = writeln!(
        r,
        "\nRatios: TC VIP / direct = **{:.2}x** (goal >= 0.95), TC VIP / HAProxy = **{:.2}x** with its defaults, \
         **{:.2}x** tuned (goal >= 1.5). The tuned HAProxy adds to the defaults: `{}`.\n",
        med[0] / med[1],
        med[0] / med[2],
        med[0] / med[3],
        HAPROXY_TUNING.replace("\n  ", "`, `")
    );
    let _ = writeln!(
        r,
        "## TC program run time (kernel BPF statistics)\n\n`kernel.bpf_stats_enabled=1`, `run_time_ns / run_cnt` of \
         `ailb_tc_ingress` (both interfaces).\n\n| phase | runs | ns per run |\n|---|---:|---:|\n\
         | established only ({echoes} one-byte echoes on {} held connections) | {est_runs} | **{est:.0}** (goal <= 150) |\n\
         | new connections through the VIP ({tc_syns} SYNs) | {tc_runs} | {:.0} |\n\
         | SYN, derived: (phase ns - non-SYN runs x established ns) / SYNs | {tc_syns} | {syn:.0} |",
        args.threads,
        tc_ns as f64 / tc_runs.max(1) as f64,
    );
    r
}

fn haproxy_version() -> String {
    Command::new("haproxy")
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.split_whitespace().nth(2).unwrap_or("").to_string())
        })
        .unwrap_or_default()
}
