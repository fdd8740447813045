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

/// The geometric mean of positive finite ratios (others skipped); `None` when none. A ratio of
/// two draws of the same noise is as likely `q` as `1/q`: the plain mean of such ratios reads
/// above 1, their geometric mean does not.
pub fn geometric_mean(v: &[f64]) -> Option<f64> {
    let logs: Vec<f64> = v.iter().filter(|x| x.is_finite() && **x > 0.0).map(|x| x.ln()).collect();
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
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
mod tests;
