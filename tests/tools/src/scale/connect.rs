//! Section 3: connect4 run time with one model and with 1,024 models loaded.
//!
//! The same traffic in both: unhinted connects to model 0's VIP (`scale-0000`, 16 backends,
//! backend ids 0..15 either way). With 1,024 models loaded a second row spreads the connects
//! over every model's VIP in turn (each connect finds another model's entry, table and
//! backends: the cache-cold case), which is other traffic and is labelled so. Rounds
//! interleave the cases, so that the machine's drift falls on all of them; the ratio of the
//! same-traffic rows is taken per round (the two runs side by side) and its median reported.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ailb_common::client::{self, Tags};
use ailb_tests::{base_config, BackendCfg, BackendServer, CgroupGuard, Daemon};

use super::{backend, model, say, PER_MODEL};
use crate::bench::{
    bpf::{connect4_stats, program_ids, BpfStats},
    netns::output_in,
};

/// Connects per measured case. Each closes at once and leaves its client port in TIME_WAIT
/// for 60 s (loopback connects reuse such ports, `net.ipv4.tcp_tw_reuse` 2, the default);
/// 10,000 a case keeps a round (3 cases) well within the ephemeral ports of 16 backend
/// addresses.
const CONNECTS: usize = 10_000;
/// Interleaved rounds: 15 give a distribution-free 96 % interval of the paired ratio's
/// median between its 4th and 12th smallest values.
const ROUNDS: usize = 15;
/// Models loaded in the large case.
const MANY: usize = 1024;

/// Child mode: `--connect-spread MODELS COUNT` makes COUNT unhinted connects, connect `i` to
/// model `i % MODELS`'s VIP, each closed at once; prints `ok refused other`.
pub(super) fn connect_spread(args: &[String]) {
    let models: usize = args[0].parse().expect("models");
    let count: usize = args[1].parse().expect("count");
    let vips: Vec<std::net::SocketAddrV4> = (0..models).map(|i| model(i).1.parse().expect("vip")).collect();
    let (mut ok, mut refused, mut other) = (0u64, 0u64, 0u64);
    for i in 0..count {
        match client::connect(vips[i % models], &Tags::new(), None) {
            Ok(_) => ok += 1,
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => refused += 1,
            Err(_) => other += 1,
        }
    }
    println!("{ok} {refused} {other}");
}

/// The traffic of one measured case.
#[derive(Clone, Copy)]
enum Traffic {
    /// Every connect to model 0's VIP.
    OneVip,
    /// Connect `i` to model `i % n`'s VIP.
    Spread(usize),
}

/// `CONNECTS` connects from a child in `cg`, between two reads of connect4's statistics:
/// (runs, ns per run). Every connect must reach a backend.
fn measure(cg: &CgroupGuard, prog: u64, servers: &[BackendServer], traffic: Traffic) -> (u64, f64) {
    let me = std::env::current_exe().expect("current exe");
    let accepted_before: u64 = servers.iter().map(BackendServer::accepted).sum();
    let before = connect4_stats(prog);
    let mut c = Command::new(me);
    match traffic {
        Traffic::OneVip => c.args(["--connect-loop", &model(0).1, &CONNECTS.to_string(), "0", "-"]),
        Traffic::Spread(n) => c.args(["--connect-spread", &n.to_string(), &CONNECTS.to_string()]),
    };
    let out = output_in(c, Some(cg));
    assert!(out.status.success(), "connect loop failed: {}", String::from_utf8_lossy(&out.stderr));
    let after = connect4_stats(prog);
    // A connect returns at the handshake; the listeners' threads accept a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut accepted: u64 = servers.iter().map(BackendServer::accepted).sum();
    while accepted - accepted_before < CONNECTS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        accepted = servers.iter().map(BackendServer::accepted).sum();
    }
    assert_eq!(accepted - accepted_before, CONNECTS as u64, "every connect reached a backend");
    let runs = after.0 - before.0;
    (runs, (after.1 - before.1) as f64 / runs.max(1) as f64)
}

/// A daemon with `n` models of [`PER_MODEL`] backends, attached to its own child cgroup; each
/// of `traffics` measured in turn.
fn case(bin: &Path, n: usize, servers: &[BackendServer], traffics: &[Traffic]) -> Vec<(u64, f64)> {
    let cg = CgroupGuard::new("scale-bench");
    let mut cfg = base_config("scale-bench", &cg);
    for i in 0..n {
        let (name, vip) = model(i);
        cfg = cfg.service(&name, &vip);
        for j in 0..PER_MODEL {
            cfg = cfg.backend(BackendCfg::new(&name, &backend(j), 1));
        }
    }
    let daemon = Daemon::start(bin, &cfg);
    let progs = program_ids(&cg);
    let out = traffics.iter().map(|&t| measure(&cg, progs[0], servers, t)).collect();
    drop(daemon);
    out
}

/// Median and range of `xs`.
fn summary(xs: &[f64]) -> (f64, f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A distribution-free confidence interval of the median of `xs` (independent rounds, no
/// assumption on their distribution): the `k`-th smallest and `k`-th largest values, `k` the
/// largest with `P(Binomial(n, 1/2) < k) <= (1 - level) / 2`; returns (low, high, the
/// interval's exact coverage). `None` when `xs` is too short for `level`.
pub(super) fn median_interval(xs: &[f64], level: f64) -> Option<(f64, f64, f64)> {
    let n = xs.len();
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    // cdf[j] = P(B <= j) for B ~ Binomial(n, 1/2).
    let mut cdf = Vec::with_capacity(n + 1);
    let (mut term, mut sum) = (0.5f64.powi(n as i32), 0.0);
    for j in 0..=n {
        sum += term;
        cdf.push(sum);
        term *= (n - j) as f64 / (j + 1) as f64;
    }
    let k = (1..=n / 2).take_while(|&k| cdf[k - 1] <= (1.0 - level) / 2.0).last()?;
    Some((v[k - 1], v[n - k], 1.0 - 2.0 * cdf[k - 1]))
}

pub(super) fn run_time(bin: &Path, report: &mut String) {
    let addrs: Vec<String> = (0..PER_MODEL).map(backend).collect();
    let servers = BackendServer::start_all(&addrs.iter().map(String::as_str).collect::<Vec<_>>());
    let stats = BpfStats::enable();
    // Per round: one model (same traffic); 1,024 models (same traffic, then spread).
    let (mut one, mut many, mut spread, mut ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut runs = [0u64; 3];
    for round in 0..ROUNDS {
        let a = case(bin, 1, &servers, &[Traffic::OneVip])[0];
        let b = case(bin, MANY, &servers, &[Traffic::OneVip, Traffic::Spread(MANY)]);
        say(&format!(
            "round {round}: {:.0} ns (1 model), {:.0} ns ({MANY} models, same VIP), {:.0} ns ({MANY} models, spread)",
            a.1, b[0].1, b[1].1
        ));
        for (k, r) in [a, b[0], b[1]].iter().enumerate() {
            runs[k] += r.0;
        }
        one.push(a.1);
        many.push(b[0].1);
        spread.push(b[1].1);
        ratio.push(b[0].1 / a.1);
    }
    drop(stats);
    let _ = writeln!(
        report,
        "\n## connect4 run time, 1 vs {MANY} models\n\n`kernel.bpf_stats_enabled=1`, `run_time_ns / run_cnt` of \
         `ailb_connect4`, {CONNECTS} unhinted connects per case ({PER_MODEL} backends a model), {ROUNDS} interleaved \
         rounds (a fresh daemon per case): median and range over the rounds.\n\n\
         | models loaded | traffic | connect4 runs | ns per run, median | range |\n|---:|---|---:|---:|---:|"
    );
    let rows = [
        (1, "one VIP (model 0)", &one, runs[0]),
        (MANY, "one VIP (model 0), the same traffic", &many, runs[1]),
        (MANY, "spread over all 1,024 VIPs (cache-cold, other traffic)", &spread, runs[2]),
    ];
    for (n, traffic, xs, count) in rows {
        let (med, lo, hi) = summary(xs);
        let _ = writeln!(report, "| {n} | {traffic} | {count} | {med:.0} | {lo:.0}-{hi:.0} |");
    }
    let (med, lo, hi) = summary(&ratio);
    let (ci_lo, ci_hi, coverage) = median_interval(&ratio, 0.95).expect("enough rounds for a 95 % interval");
    let _ = writeln!(
        report,
        "\nSame traffic, {MANY} models over 1 model, per round: median {med:.3} (range {lo:.3}-{hi:.3}; 1.000 = equal); \
         {:.1} % interval of the median (order statistics, distribution-free): {ci_lo:.3}-{ci_hi:.3}. Rounds: {}.",
        coverage * 100.0,
        ratio.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(", ")
    );
    say(&format!(
        "same traffic, {MANY} / 1 model: median ratio {med:.3} ({lo:.3}-{hi:.3}), {:.1} % interval {ci_lo:.3}-{ci_hi:.3}",
        coverage * 100.0
    ));
}

#[cfg(test)]
mod tests;
