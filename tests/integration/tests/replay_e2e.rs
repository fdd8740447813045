//! A short version of `ailb-compare`: on the same simulated fleet (2 x A100-80GB +
//! 4 x RTX 3090) and the same 300 requests (the first of the Mooncake trace) at the benchmark's
//! load, 0.4 x the trace's rate (the highest load the fleet carries, see `ailb-fleet-model`), ailb in full
//! (rnacos, an `ailb agent` per simulated GPU, Nacos discovery and the AI-aware policy, memory fit
//! with the client's hints, affinity, load bound 1.25) beats round robin L4 (untagged sockets,
//! `balancer.round_robin`: each connection to the next backend in turn) on P95 end-to-end latency
//! and fails no more requests, at most 1 % (the failure goal).
//!
//! Margin: on these 300 requests, runs of ailb in full against round robin read 0.23x, 0.25x and
//! 0.22x (debug build), round robin failing 34-37 requests and ailb none. The test asks for
//! < 0.4x, 1.6 times the worst of those, so it fails if ailb is not clearly better; before the
//! pick queued a request that fits nowhere now where it should finish first, runs read
//! 0.32x-0.47x. (Over 1000 requests, as `cargo xtask bench` runs it, round robin's queue keeps
//! growing and the ratio is lower, 0.12x-0.14x; a CI run that long would take 5 minutes.)
//!
//! And `ailb-compare` interrupted by SIGTERM in the middle of a replay tears down everything it
//! started.
//!
//! It needs the Mooncake trace shipped in `tests/data/` and fails, naming it, without it: the
//! synthetic mix is no substitute (it has no request too large for a 3090, and on 120 of its
//! requests one run, random still hashed by conversation then, read 0.71x, too close to the
//! margin to assert on).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use ailb_sim::replay;
use ailb_tests::interrupt::{self, Watched};
use ailb_tests::{preflight, run_cmd, workspace_bin};
use serde_json::Value;

/// ailb's E2E P95 must be below this share of round robin's.
const P95_RATIO_MAX: f64 = 0.4;
/// ailb's failure rate must be at most this (the failure goal: <= 1 %).
const FAILURE_RATE_MAX: f64 = 0.01;
const REQUESTS: u64 = 300;

#[test]
fn ailb_beats_round_robin_on_p95_and_failures() {
    let ailb = preflight();
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("compare.json");
    let mut cmd = Command::new(workspace_bin("ailb-tools", "ailb-compare"));
    cmd.env("AILB_BIN", &ailb)
        .args([
            "--policies",
            "round-robin,ailb",
            "--limit",
            &REQUESTS.to_string(),
            "--time-scale",
            "20",
            "--load",
            "0.4",
        ])
        .args(["--deadline-s", "90"])
        .arg("--sim-bin")
        .arg(workspace_bin("ailb-sim", "ailb-sim"))
        .arg("--out-dir")
        .arg(dir.path())
        .arg("--json")
        .arg(&json);
    let trace = Path::new(replay::SHIPPED_TRACE);
    assert!(
        trace.is_file(),
        "the Mooncake trace {} is absent (it ships in the repository: see tests/data/README.md)",
        trace.display()
    );
    cmd.arg("--trace").arg(trace);
    let workload = format!("trace {}", trace.display());
    let out = run_cmd(&mut cmd, Duration::from_secs(600));
    let report = std::fs::read_to_string(dir.path().join("replay.md")).unwrap_or_default();
    assert!(
        out.status.success(),
        "ailb-compare failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{report}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("compare JSON")).expect("JSON");
    let pol = |k: &str| -> &Value {
        v["policies"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["policy"] == k))
            .unwrap_or_else(|| panic!("policy {k} missing in {v}"))
    };
    let (rr, ours) = (pol("round-robin"), pol("ailb"));
    for p in [rr, ours] {
        assert_eq!(p["summary"]["requests"], REQUESTS, "every request is accounted for: {p}");
    }
    let p95 =
        |p: &Value| p["summary"]["e2e_ms"]["p95"].as_f64().unwrap_or_else(|| panic!("no successful request in {p}"));
    let fails = |p: &Value| p["summary"]["failures"].as_u64().expect("failures");
    let (r95, a95) = (p95(rr), p95(ours));
    assert!(
        a95 < P95_RATIO_MAX * r95,
        "{workload}: ailb's E2E P95 {a95:.0} ms is not below {P95_RATIO_MAX} x round robin's {r95:.0} ms\n{report}"
    );
    let common = |p: &Value| p["e2e_p95_common_ms"].as_f64().expect("a request every policy served");
    assert!(
        common(ours) < P95_RATIO_MAX * common(rr),
        "{workload}: on the requests both served, ailb's E2E P95 {:.0} ms is not below {P95_RATIO_MAX} x round robin's \
         {:.0} ms\n{report}",
        common(ours),
        common(rr)
    );
    assert!(
        fails(ours) as f64 <= FAILURE_RATE_MAX * REQUESTS as f64,
        "{workload}: ailb failed {} of {REQUESTS} requests (goal: at most {FAILURE_RATE_MAX})\n{report}",
        fails(ours)
    );
    assert!(
        fails(ours) <= fails(rr),
        "{workload}: ailb failed {} requests, round robin {}\n{report}",
        fails(ours),
        fails(rr)
    );
}

/// SIGTERM (as Ctrl-C) in the middle of a replay: `ailb-compare` stops, kills its replay, and
/// its guards tear down the fleet, the daemon (pins and links) and its child cgroup; it exits
/// with an error that says so.
#[test]
fn an_interrupted_compare_tears_everything_down() {
    let ailb = preflight();
    let dir = tempfile::tempdir().expect("temp dir");
    let compare = Watched::spawn(
        Command::new(workspace_bin("ailb-tools", "ailb-compare"))
            .env("AILB_BIN", &ailb)
            .args(["--policies", "ailb,round-robin", "--limit", "300", "--time-scale", "20", "--load", "0.4"])
            .arg("--sim-bin")
            .arg(workspace_bin("ailb-sim", "ailb-sim"))
            .arg("--out-dir")
            .arg(dir.path()),
    );
    let pid = compare.pid();
    // Readiness from its own output: the first policy's replay has started.
    if !compare.wait_for_line("replaying", Duration::from_secs(180)) {
        compare.fail("ailb-compare never started its replay");
    }
    let started = interrupt::descendants(pid);
    if !started.iter().any(|(_, c)| c.contains("ailb-sim")) {
        compare.fail(&format!("no simulated GPU among its processes {started:?}"));
    }
    let (status, log) = compare.interrupt(libc::SIGTERM, Duration::from_secs(60));
    assert!(!status.success(), "an interrupted race reports no success:\n{log}");
    assert!(log.contains("interrupted (SIGINT or SIGTERM)"), "{log}");
    let left = interrupt::still_running(&started);
    assert!(left.is_empty(), "still running after ailb-compare exited: {left:?}\n{log}");
    // Its pins and its cgroup are named after its pid.
    let suffix = format!("-{pid}");
    let left = interrupt::leftovers(|n| n.starts_with("ailb-test-") && n.ends_with(&suffix));
    assert!(left.is_empty(), "pins or cgroup left behind: {left:?}\n{log}");
}
