//! The numbers of every path over the interleaved rounds, and the Markdown report. Pure: the
//! measurements come in, the text goes out.

use std::fmt::Write as _;

use super::procs::CpuTime;
use super::wrk::WrkRun;
use super::CONNECTIONS;

/// What a path is to the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// No router: the baseline every added latency is measured against.
    Direct,
    /// ailb's front door: the rows the goals are about.
    Ailb,
    /// A router users would pick instead (nginx, sglang-router, vllm-router).
    Peer,
    /// A variant of the front door that is no deployment (outside the cgroup, so no kernel
    /// pick): shown to isolate a cost, not judged against the goals.
    Reference,
    /// A relay that does no HTTP work at all (HAProxy in TCP mode): not a peer (it cannot
    /// route by model), but what the two extra loopback hops of any userspace proxy cost on this
    /// machine in this run, the floor under every proxy's added latency.
    Floor,
}

/// One round of one path: the saturated wrk run, with the CPU its router and the server used
/// in it, and the closed-loop run (one connection).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub wrk: WrkRun,
    /// The closed loop: one connection, one request at a time.
    pub closed: WrkRun,
    /// Why the run failed (non-2xx answers, socket errors, wrk itself), `None` when it did not.
    pub failure: Option<String>,
    /// The router's process tree over the wrk run (`None` for direct).
    pub router_cpu: Option<CpuTime>,
    /// The server's over the wrk run.
    pub server_cpu: Option<CpuTime>,
}

/// A path and its samples, one per round (or why it was not measured).
#[derive(Clone, Debug)]
pub struct PathResult {
    pub name: String,
    pub role: Role,
    pub settings: String,
    pub samples: Vec<Sample>,
    pub missing: Option<String>,
}

/// The figures of one path's row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub rps: f64,
    pub rps_min: f64,
    pub rps_max: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Median over rounds of (this path - direct in the same round); `None` for direct.
    pub added_p50_us: Option<f64>,
    pub added_p99_us: Option<f64>,
    /// The closed loop's req/s, p50 and p99 (medians over rounds).
    pub closed_rps: f64,
    pub closed_p50_us: f64,
    pub closed_p99_us: f64,
    /// Median over rounds of (this path - direct in the same round) in the closed loop.
    pub closed_added_p50_us: Option<f64>,
    pub closed_added_p99_us: Option<f64>,
    pub vs_direct: f64,
    /// Median req/s over that of the fastest peer; `None` without a measured peer.
    pub vs_fastest_peer: Option<f64>,
    /// Against the fastest peer round by round (the two ran in the same round, minutes apart at
    /// most, so drift of the machine hits both): the rounds this path was ahead in, the rounds
    /// both ran, and the median of the per-round ratios.
    pub vs_peer_rounds: Option<(usize, usize, f64)>,
    /// Router CPU microseconds per request (median over rounds): user, system.
    pub router_us_per_req: Option<(f64, f64)>,
    pub server_us_per_req: Option<f64>,
    /// Every failed round: "round N: why".
    pub failures: Vec<String>,
}

/// The median (the mean of the middle two for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// How often a fair coin, tossed `of` times, comes up heads `won` times or more: the chance of
/// being ahead in that many rounds of `of` if neither path were faster (a one-sided sign test).
pub fn as_often_by_chance(won: usize, of: usize) -> f64 {
    // C(of, k) / 2^of, summed for k = won..=of, in floats (no overflow for any round count).
    let mut term = 0.5f64.powi(i32::try_from(of).unwrap_or(i32::MAX));
    let mut sum = 0.0;
    for k in 0..=of {
        if k >= won {
            sum += term;
        }
        term *= (of - k) as f64 / (k + 1) as f64;
    }
    sum.min(1.0)
}

fn per_req_us(cpu_s: f64, requests: u64) -> Option<f64> {
    (requests > 0).then(|| cpu_s * 1e6 / requests as f64)
}

/// The rows of `paths` (`None` for a path not measured), and the index of the fastest peer.
pub fn rows(paths: &[PathResult]) -> (Vec<Option<Row>>, Option<usize>) {
    let direct = paths.iter().find(|p| p.role == Role::Direct && p.missing.is_none());
    let med = |p: &PathResult, f: &dyn Fn(&Sample) -> Option<f64>| {
        median(&p.samples.iter().filter_map(f).collect::<Vec<_>>())
    };
    let ok = |s: &Sample| s.wrk.requests > 0 && s.closed.requests > 0;
    let rps_of = |p: &PathResult| med(p, &|s| ok(s).then_some(s.wrk.rps));
    let direct_rps = direct.and_then(rps_of);
    let fastest = paths
        .iter()
        .enumerate()
        .filter(|(_, p)| p.role == Role::Peer && p.missing.is_none())
        .filter_map(|(i, p)| Some((i, rps_of(p)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let paired = |p: &PathResult| -> Option<(usize, usize, f64)> {
        let peer = &paths[fastest?.0];
        let ratios: Vec<f64> = p
            .samples
            .iter()
            .zip(&peer.samples)
            .filter(|(s, b)| ok(s) && ok(b) && b.wrk.rps > 0.0)
            .map(|(s, b)| s.wrk.rps / b.wrk.rps)
            .collect();
        Some((ratios.iter().filter(|r| **r > 1.0).count(), ratios.len(), median(&ratios)?))
    };
    let added = |p: &PathResult, pick: fn(&Sample) -> f64| -> Option<f64> {
        let d = direct?;
        let diffs: Vec<f64> =
            p.samples.iter().zip(&d.samples).filter(|(s, b)| ok(s) && ok(b)).map(|(s, b)| pick(s) - pick(b)).collect();
        median(&diffs)
    };
    let out = paths
        .iter()
        .map(|p| {
            if p.missing.is_some() {
                return None;
            }
            let rps = rps_of(p)?;
            let good: Vec<f64> = p.samples.iter().filter(|s| ok(s)).map(|s| s.wrk.rps).collect();
            let is_direct = p.role == Role::Direct;
            let user = med(p, &|s| per_req_us(s.router_cpu?.user_s, s.wrk.requests));
            let sys = med(p, &|s| per_req_us(s.router_cpu?.sys_s, s.wrk.requests));
            Some(Row {
                rps,
                rps_min: good.iter().copied().fold(f64::INFINITY, f64::min),
                rps_max: good.iter().copied().fold(0.0, f64::max),
                p50_us: med(p, &|s| ok(s).then_some(s.wrk.p50_us))?,
                p99_us: med(p, &|s| ok(s).then_some(s.wrk.p99_us))?,
                added_p50_us: if is_direct { None } else { added(p, |s| s.wrk.p50_us) },
                added_p99_us: if is_direct { None } else { added(p, |s| s.wrk.p99_us) },
                closed_rps: med(p, &|s| ok(s).then_some(s.closed.rps))?,
                closed_p50_us: med(p, &|s| ok(s).then_some(s.closed.p50_us))?,
                closed_p99_us: med(p, &|s| ok(s).then_some(s.closed.p99_us))?,
                closed_added_p50_us: if is_direct { None } else { added(p, |s| s.closed.p50_us) },
                closed_added_p99_us: if is_direct { None } else { added(p, |s| s.closed.p99_us) },
                vs_direct: direct_rps.map_or(f64::NAN, |d| rps / d),
                vs_fastest_peer: fastest.map(|(_, f)| rps / f),
                vs_peer_rounds: if p.role == Role::Peer { None } else { paired(p) },
                router_us_per_req: user.zip(sys),
                server_us_per_req: med(p, &|s| per_req_us(s.server_cpu?.total_s(), s.wrk.requests)),
                failures: p
                    .samples
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| Some(format!("round {}: {}", i + 1, s.failure.as_ref()?)))
                    .collect(),
            })
        })
        .collect();
    (out, fastest.map(|(i, _)| i))
}

/// What the report says about the machine and the method.
pub struct Setup {
    pub date: String,
    pub machine: String,
    pub ailb: String,
    pub server: String,
    pub load: String,
    pub rounds: usize,
    /// The command that runs it again.
    pub reproduce: String,
}

/// The whole report: setup, the table, the goals, each path's settings, and `breakdown`
/// (where the front door's time goes, already Markdown).
pub fn render(setup: &Setup, paths: &[PathResult], breakdown: &str) -> String {
    let (rows, fastest) = rows(paths);
    let mut r = String::new();
    let _ = writeln!(r, "# The front door: small non-streamed requests, side by side\n");
    let _ = writeln!(
        r,
        "Run of {}. {}. Reproduce: {} (as root).\n\n\
         - ailb: {}\n- Server: {}\n- Load: {}\n- {} interleaved rounds (every path once per round, in turns, \
         each round starting one path later); req/s is the median of the rounds (range in brackets), latencies the median of the rounds' \
         percentiles, \"added\" the median of (path - direct in the same round).\n",
        setup.date, setup.machine, setup.reproduce, setup.ailb, setup.server, setup.load, setup.rounds
    );
    let _ = writeln!(
        r,
        "| path | req/s | p50 | p99 | added p50 | added p99 | vs direct | vs fastest peer | router CPU/req (user + sys) | server CPU/req | runs |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for (p, row) in paths.iter().zip(&rows) {
        let Some(row) = row else {
            let why = p.missing.as_deref().unwrap_or("no successful run");
            let _ = writeln!(r, "| {} | - | - | - | - | - | - | - | - | - | not measured: {why} |", p.name);
            continue;
        };
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.0} us"));
        let cpu = row.router_us_per_req.map_or("-".into(), |(u, s)| format!("{:.1} us ({u:.1} + {s:.1})", u + s));
        let runs = if row.failures.is_empty() {
            "all 2xx".to_string()
        } else {
            format!("FAILED: {}", row.failures.join("; "))
        };
        let _ = writeln!(
            r,
            "| {} | {:.0} ({:.0}-{:.0}) | {:.0} us | {:.0} us | {} | {} | {:.2}x | {} | {cpu} | {} | {runs} |",
            p.name,
            row.rps,
            row.rps_min,
            row.rps_max,
            row.p50_us,
            row.p99_us,
            us(row.added_p50_us),
            us(row.added_p99_us),
            row.vs_direct,
            row.vs_fastest_peer.map_or("-".into(), |v| format!("{v:.2}x")),
            row.server_us_per_req.map_or("-".into(), |v| format!("{v:.1} us")),
        );
    }
    let _ = writeln!(r);
    closed_loop_table(&mut r, paths, &rows);
    goals(&mut r, paths, &rows, fastest);
    let _ = writeln!(r, "\n### Settings of each path\n");
    for p in paths.iter().filter(|p| !p.settings.is_empty()) {
        let _ = writeln!(r, "- {}: {}", p.name, p.settings);
    }
    let _ = writeln!(
        r,
        "\nCPU per request: utime + stime of the router's process tree (`/proc/PID/stat`, every thread and \
         worker process) over the wrk run, divided by the requests it completed; clock ticks of 10 ms, so \
         about 0.2 us per request of resolution over a 5 s run. The machine's cores are shared by wrk, the \
         router and the server: every microsecond a router spends is one the server and wrk do not get, \
         which is why a router's CPU per request shows in everyone's req/s.\n"
    );
    r.push_str(breakdown);
    r
}

/// The closed loop's table: one connection, one request at a time, so the added latency is the
/// router's own time per request (at 16 connections on shared cores it is mostly throughput).
fn closed_loop_table(r: &mut String, paths: &[PathResult], rows: &[Option<Row>]) {
    let _ = writeln!(
        r,
        "### Added latency at one connection (closed loop)\n\n\
         The same request with `wrk -c1`: one request at a time, a rate every path sustains, so no queue forms \
         and \"added\" is the router's own time per request. At 16 connections the cores are saturated and the \
         added latency there mostly measures how much CPU a router takes from wrk and the server.\n\n\
         | path | req/s at 1 connection | p50 | p99 | added p50 | added p99 |\n|---|---:|---:|---:|---:|---:|"
    );
    for (p, row) in paths.iter().zip(rows) {
        let Some(row) = row else {
            let _ = writeln!(r, "| {} | - | - | - | - | - |", p.name);
            continue;
        };
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.0} us"));
        let _ = writeln!(
            r,
            "| {} | {:.0} | {:.0} us | {:.0} us | {} | {} |",
            p.name,
            row.closed_rps,
            row.closed_p50_us,
            row.closed_p99_us,
            us(row.closed_added_p50_us),
            us(row.closed_added_p99_us)
        );
    }
    let _ = writeln!(r);
}

/// One line per ailb row: is it ahead of the fastest peer, and under 100 us added at p50 (judged
/// on the closed loop, with the saturated figure beside it)?
fn goals(r: &mut String, paths: &[PathResult], rows: &[Option<Row>], fastest: Option<usize>) {
    let _ = writeln!(r, "### Goals (as measured in this run)\n");
    let peer = fastest.and_then(|i| Some((&paths[i], rows[i].as_ref()?)));
    let floor = paths
        .iter()
        .zip(rows)
        .filter(|(p, _)| p.role == Role::Floor)
        .find_map(|(p, row)| Some((p, row.as_ref()?.closed_added_p50_us?)));
    for (p, row) in paths.iter().zip(rows).filter(|(p, _)| p.role == Role::Ailb) {
        let Some(row) = row else {
            let _ = writeln!(r, "- {}: not measured, so neither goal is shown as met.", p.name);
            continue;
        };
        let failed = if row.failures.is_empty() { "" } else { " (but it had failed runs: not met)" };
        let ahead = match (peer, row.vs_peer_rounds) {
            (Some((pp, prow)), Some((won, of, ratio))) => {
                // Ahead by the medians AND in most rounds, each against the peer's run of the
                // same round: on shared cores a single round can move either way by more than
                // the gap between two close proxies.
                let met = row.failures.is_empty() && row.rps > prow.rps && 2 * won > of;
                format!(
                    "ahead of the fastest peer ({}, {:.0} req/s): {} ({:.0} req/s, {:.2}x; ahead in {won} of {of} rounds, \
                     median ratio of the rounds {ratio:.2}x; a coin gives {won} or more of {of} {:.0} % of the time){failed}",
                    pp.name,
                    prow.rps,
                    if met { "met" } else { "NOT met" },
                    row.rps,
                    row.rps / prow.rps,
                    100.0 * as_often_by_chance(won, of),
                )
            }
            _ => "ahead of the fastest peer: no peer was measured".into(),
        };
        let lat = match (row.closed_added_p50_us, row.added_p50_us) {
            (Some(a), Some(sat)) => format!(
                "under 100 us added at p50 (closed loop): {} ({a:+.0} us; {sat:+.0} us at {CONNECTIONS} \
                 connections){failed}",
                if row.failures.is_empty() && a < 100.0 { "met" } else { "NOT met" }
            ),
            _ => "under 100 us added at p50: no direct baseline".into(),
        };
        let over_floor = match (floor, row.closed_added_p50_us) {
            (Some((fp, f)), Some(a)) => format!("; {:+.0} us over the {} ({f:+.0} us)", a - f, fp.name),
            _ => String::new(),
        };
        let _ = writeln!(r, "- {}: {ahead}; {lat}{over_floor}.", p.name);
    }
    if let Some((fp, f)) = floor {
        let _ = writeln!(
            r,
            "- The floor: the {} added {f:+.0} us at p50 (closed loop) with no HTTP work at all: what the two extra \
             loopback hops of any userspace proxy cost on this machine in this run. {}",
            fp.name,
            if f >= 100.0 {
                "It is over 100 us by itself, so no proxy could meet that goal in this run."
            } else {
                "The rest of a path's added latency is its own work."
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round at `rps` (saturated) whose closed loop answers at a third of `p50` and `p99`.
    fn sample(rps: f64, p50: f64, p99: f64, cpu: Option<(f64, f64)>) -> Sample {
        let requests = (rps * 5.0) as u64;
        let (c50, c99) = (p50 / 3.0, p99 / 3.0);
        Sample {
            wrk: WrkRun { requests, rps, p50_us: p50, p99_us: p99, ..WrkRun::default() },
            closed: WrkRun { requests: 5_000, rps: 1e6 / c50, p50_us: c50, p99_us: c99, ..WrkRun::default() },
            failure: None,
            router_cpu: cpu.map(|(u, s)| CpuTime { user_s: u, sys_s: s }),
            server_cpu: Some(CpuTime { user_s: requests as f64 * 20e-6, sys_s: 0.0 }),
        }
    }

    fn path(name: &str, role: Role, samples: Vec<Sample>) -> PathResult {
        PathResult { name: name.into(), role, settings: format!("{name} settings"), samples, missing: None }
    }

    fn setup() -> Setup {
        Setup {
            date: "d".into(),
            machine: "m".into(),
            ailb: "a".into(),
            server: "s".into(),
            load: "l".into(),
            rounds: 3,
            reproduce: "r".into(),
        }
    }

    fn fixture() -> Vec<PathResult> {
        vec![
            path("direct", Role::Direct, vec![sample(10_000.0, 1000.0, 2000.0, None); 3]),
            path(
                "gateway",
                Role::Ailb,
                vec![
                    sample(9_000.0, 1080.0, 2100.0, Some((0.5, 0.25))),
                    sample(8_000.0, 1090.0, 2300.0, Some((0.5, 0.25))),
                    sample(8_500.0, 1200.0, 2500.0, Some((0.5, 0.25))),
                ],
            ),
            path("nginx", Role::Peer, vec![sample(6_000.0, 1500.0, 3000.0, Some((0.5, 0.5))); 3]),
            path("vllm", Role::Peer, vec![sample(7_000.0, 1400.0, 2900.0, Some((1.0, 0.5))); 3]),
            PathResult {
                name: "sglang".into(),
                role: Role::Peer,
                settings: String::new(),
                samples: vec![],
                missing: Some("not installed".into()),
            },
        ]
    }

    #[test]
    fn medians_ratios_and_added_latency_per_round() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let (rows, fastest) = rows(&fixture());
        assert_eq!(fastest, Some(3), "vllm is the fastest peer");
        let gw = rows[1].as_ref().expect("gateway row");
        assert_eq!((gw.rps, gw.rps_min, gw.rps_max), (8_500.0, 8_000.0, 9_000.0));
        assert_eq!(gw.added_p50_us, Some(90.0));
        assert_eq!(gw.added_p99_us, Some(300.0));
        // The closed loop's medians and its own per-round differences.
        assert_eq!((gw.closed_p50_us, gw.closed_p99_us), (1090.0 / 3.0, 2300.0 / 3.0));
        assert!((gw.closed_added_p50_us.expect("closed p50") - 30.0).abs() < 1e-9);
        assert!((gw.closed_added_p99_us.expect("closed p99") - 100.0).abs() < 1e-9);
        assert!((gw.vs_direct - 0.85).abs() < 1e-9);
        assert!((gw.vs_fastest_peer.expect("peer") - 8_500.0 / 7_000.0).abs() < 1e-9);
        // 0.5 s user over 45,000 requests in the 9,000 req/s round, and so on: the median.
        let (u, s) = gw.router_us_per_req.expect("cpu");
        assert!((u - 0.5e6 / 42_500.0).abs() < 1e-6 && (s - 0.25e6 / 42_500.0).abs() < 1e-6, "{u} {s}");
        assert!((gw.server_us_per_req.expect("server") - 20.0).abs() < 1e-6);
        assert!(rows[0].as_ref().expect("direct").added_p50_us.is_none());
        assert!(rows[4].is_none());
    }

    #[test]
    fn the_report_states_the_goals_as_measured() {
        let setup = Setup {
            date: "2026-12-01".into(),
            machine: "2 cores".into(),
            ailb: "/tmp/ailb".into(),
            server: "ailb-sim".into(),
            load: "wrk".into(),
            rounds: 3,
            reproduce: "`ailb-frontdoor-bench --focus`".into(),
        };
        let mut paths = fixture();
        let text = render(&setup, &paths, "## Where the time goes\n");
        assert!(text.contains("Reproduce: `ailb-frontdoor-bench --focus` (as root)."), "{text}");
        assert!(
            text.contains("| gateway | 8500 (8000-9000) | 1090 us | 2300 us | +90 us | +300 us | 0.85x | 1.21x |"),
            "{text}"
        );
        assert!(
            text.contains(
                "ahead of the fastest peer (vllm, 7000 req/s): met (8500 req/s, 1.21x; ahead in 3 of 3 rounds, median \
                 ratio of the rounds 1.21x; a coin gives 3 or more of 3 12 % of the time)"
            ),
            "{text}"
        );
        assert!(
            text.contains("under 100 us added at p50 (closed loop): met (+30 us; +90 us at 16 connections)"),
            "{text}"
        );
        assert!(text.contains("| gateway | 2752 | 363 us | 767 us | +30 us | +100 us |"), "{text}");
        assert!(text.contains("| sglang | - |") && text.contains("not measured: not installed"), "{text}");
        assert!(text.ends_with("## Where the time goes\n"));
        // One failed round fails the row and its goals; a slower median misses the first.
        paths[1].samples[2].failure = Some("3 non-2xx/3xx responses".into());
        paths[1].samples[2].wrk.non_2xx = 3;
        paths[3].samples = vec![sample(9_500.0, 1400.0, 2900.0, None); 3];
        let text = render(&setup, &paths, "");
        assert!(text.contains("FAILED: round 3: 3 non-2xx/3xx responses"), "{text}");
        assert!(
            text.contains(
                "ahead of the fastest peer (vllm, 9500 req/s): NOT met (8500 req/s, 0.89x; ahead in 0 of 3 rounds, \
                 median ratio of the rounds 0.89x; a coin gives 0 or more of 3 100 % of the time) (but it had failed \
                 runs: not met)"
            ),
            "{text}"
        );
        assert!(text.contains("under 100 us added at p50 (closed loop): NOT met (+30 us"), "{text}");
    }

    #[test]
    fn the_chance_of_as_many_rounds_ahead_is_a_sign_test() {
        let close = |won, of, want: f64| {
            let got = as_often_by_chance(won, of);
            assert!((got - want).abs() < 5e-5, "{won} of {of}: {got}, want {want}");
        };
        // Binomial tail sums, 1/2 each toss.
        close(0, 3, 1.0);
        close(3, 3, 0.125);
        close(2, 3, 0.5);
        close(12, 15, 0.017_578);
        close(9, 15, 0.303_619);
        close(24, 37, 0.049_437);
        close(0, 0, 1.0);
        close(1, 0, 0.0);
        assert!(as_often_by_chance(600, 1000) > 0.0 && as_often_by_chance(600, 1000) < 1e-9);
    }

    #[test]
    fn ahead_by_the_medians_but_in_one_round_of_three_is_not_ahead() {
        let mut paths = fixture();
        let rounds = |rps: [f64; 3]| rps.map(|r| sample(r, 1100.0, 2200.0, Some((0.5, 0.25)))).to_vec();
        paths[1].samples = rounds([5_000.0, 6_500.0, 10_000.0]);
        paths[2].samples = rounds([5_000.0; 3]);
        paths[3].samples = rounds([6_000.0, 7_000.0, 1_000.0]);
        let (rows, fastest) = rows(&paths);
        assert_eq!(fastest, Some(3));
        let (won, of, ratio) = rows[1].as_ref().expect("gateway").vs_peer_rounds.expect("paired");
        assert_eq!((won, of), (1, 3));
        assert!((ratio - 6_500.0 / 7_000.0).abs() < 1e-9, "{ratio}");
        let text = render(&setup(), &paths, "");
        assert!(
            text.contains(
                "ahead of the fastest peer (vllm, 6000 req/s): NOT met (6500 req/s, 1.08x; ahead in 1 of 3 rounds, \
                 median ratio of the rounds 0.93x; a coin gives 1 or more of 3 88 % of the time)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_reference_row_is_shown_and_not_judged() {
        let setup = setup();
        let mut paths = fixture();
        paths.push(path("outside", Role::Reference, vec![sample(9_500.0, 1050.0, 2050.0, Some((0.4, 0.2))); 3]));
        let (_, fastest) = rows(&paths);
        assert_eq!(fastest, Some(3), "a reference row is no peer");
        let text = render(&setup, &paths, "");
        assert!(text.contains("| outside | 9500 (9500-9500) |"), "{text}");
        assert!(!text.contains("- outside: ahead of the fastest peer"), "no goal line for it: {text}");
    }

    #[test]
    fn a_relay_is_the_floor_not_a_peer() {
        let setup = setup();
        let mut paths = fixture();
        // Faster than every peer, and still not the fastest peer: it routes nothing.
        paths.push(path("relay", Role::Floor, vec![sample(9_900.0, 1030.0, 2050.0, Some((0.1, 0.2))); 3]));
        let (rows, fastest) = rows(&paths);
        assert_eq!(fastest, Some(3), "vllm stays the fastest peer");
        assert!((rows[5].as_ref().expect("relay").closed_added_p50_us.expect("added") - 10.0).abs() < 1e-9);
        let text = render(&setup, &paths, "");
        assert!(text.contains("(+30 us; +90 us at 16 connections); +20 us over the relay (+10 us)."), "{text}");
        assert!(text.contains("- The floor: the relay added +10 us at p50 (closed loop)"), "{text}");
        assert!(text.contains("The rest of a path's added latency is its own work."), "{text}");
        paths[5].samples = vec![sample(9_900.0, 1400.0, 2050.0, None); 3];
        let text = render(&setup, &paths, "");
        assert!(text.contains("It is over 100 us by itself, so no proxy could meet that goal in this run."), "{text}");
    }
}
