//! Section 3: how long the daemon takes to rebuild and swap the 1,000-backend model's table
//! on a weight change, from its own log.

use std::fmt::Write as _;

use ailb_tests::{Daemon, TestConfig};

use super::http::median;

/// Five reloads (SIGHUP), each after one more backend's weight changed; the median build and
/// swap times the daemon logged.
pub(super) fn rebuild_on_weight_change(cfg: &mut TestConfig, daemon: &mut Daemon, report: &mut String) {
    let mut swaps = Vec::new();
    for i in 0..5u32 {
        let addr = format!("127.1.0.{}:9000", i + 1);
        cfg.backend_mut(&addr).weight = 7;
        daemon.reload(cfg);
        let log = daemon.log();
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("table swapped") && l.contains("bench-1000"))
            .unwrap_or_else(|| panic!("no table swap logged:\n{log}"))
            .to_string();
        let field = |k: &str| -> f64 {
            let clean = strip_ansi(&line);
            clean
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")).and_then(|v| v.parse().ok()))
                .unwrap_or(f64::NAN)
        };
        swaps.push((field("build_us"), field("swap_us")));
    }
    let mut b: Vec<f64> = swaps.iter().map(|s| s.0).collect();
    let mut s: Vec<f64> = swaps.iter().map(|s| s.1).collect();
    let _ = writeln!(
        report,
        "\n## Table rebuild on a weight change, 1000 backends (M = 65521)\n\n5 reloads (SIGHUP), median from the daemon log: \
         build {:.2} ms, swap (write the inactive table and member rows, describe, flip) {:.2} ms.",
        median(&mut b) / 1000.0,
        median(&mut s) / 1000.0
    );
}

/// The log line without its colour escapes (`ESC [ ... m`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut in_esc = false;
    for c in s.chars() {
        match (in_esc, c) {
            (false, '\u{1b}') => in_esc = true,
            (true, 'm') => in_esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}
