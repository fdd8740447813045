//! Section 3: connect4 run time with one model and with 1,024 models loaded.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ailb_tests::{base_config, BackendCfg, BackendServer, CgroupGuard, Daemon};

use super::{backend, model, say, PER_MODEL};
use crate::bench::{
    bpf::{connect4_stats, program_ids, BpfStats},
    netns::output_in,
};

/// Connects per measured case.
const CONNECTS: usize = 20_000;

/// `CONNECTS` connects to `vip` from a child in `cg`, between two reads of connect4's
/// statistics: (runs, ns per run).
fn measure(cg: &CgroupGuard, prog: u64, vip: &str) -> (u64, f64) {
    let me = std::env::current_exe().expect("current exe");
    let before = connect4_stats(prog);
    let out = output_in(
        {
            let mut c = Command::new(me);
            c.args(["--connect-loop", vip, &CONNECTS.to_string(), "0", "-"]);
            c
        },
        Some(cg),
    );
    assert!(out.status.success(), "connect loop failed: {}", String::from_utf8_lossy(&out.stderr));
    let after = connect4_stats(prog);
    let runs = after.0 - before.0;
    (runs, (after.1 - before.1) as f64 / runs.max(1) as f64)
}

/// One daemon with `n` models of [`PER_MODEL`] backends; connect4's time per run to the VIP
/// of its middle model.
fn case(bin: &Path, n: usize, servers: &[BackendServer]) -> (u64, f64) {
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
    let vip = model(n / 2).1;
    let before: u64 = servers.iter().map(BackendServer::accepted).sum();
    let r = measure(&cg, progs[0], &vip);
    // A connect returns at the handshake; the listeners' threads accept a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after: u64 = servers.iter().map(BackendServer::accepted).sum();
    while after - before < CONNECTS as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        after = servers.iter().map(BackendServer::accepted).sum();
    }
    assert_eq!(after - before, CONNECTS as u64, "every connect reached a backend");
    drop(daemon);
    r
}

pub(super) fn run_time(bin: &Path, report: &mut String) {
    let addrs: Vec<String> = (0..PER_MODEL).map(backend).collect();
    let servers = BackendServer::start_all(&addrs.iter().map(String::as_str).collect::<Vec<_>>());
    let stats = BpfStats::enable();
    let _ = writeln!(
        report,
        "\n## connect4 run time, 1 vs 1,024 models\n\n`kernel.bpf_stats_enabled=1`, `run_time_ns / run_cnt` of \
         `ailb_connect4` over {CONNECTS} unhinted connects to one model's VIP ({PER_MODEL} backends), median of 3 \
         interleaved rounds.\n\n| models loaded | connect4 runs | ns per run |\n|---:|---:|---:|"
    );
    let mut rows: Vec<(usize, Vec<(u64, f64)>)> = vec![(1, Vec::new()), (1024, Vec::new())];
    for round in 0..3 {
        for (n, runs) in rows.iter_mut() {
            let r = case(bin, *n, &servers);
            say(&format!("round {round}, {n} models: {:.0} ns per connect4 run ({} runs)", r.1, r.0));
            runs.push(r);
        }
    }
    drop(stats);
    for (n, mut runs) in rows {
        runs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (count, ns) = runs[1];
        let _ = writeln!(report, "| {n} | {count} | {ns:.0} |");
    }
}
