//! A short replay of the shipped trace, ailb (in full: rnacos, agents, dynamic weights)
//! against `sglang-router --policy cache_aware` on the same simulated fleet, one after the
//! other in one run (`ailb-compare`): ailb's end-to-end P95 must be no worse than the router's.
//!
//! "No worse", with a margin derived from the run itself:
//! - no more failed requests than the router;
//! - the P95 of the ANSWERED requests, each policy its own: this favours the router, whose
//!   failures (requests too large for the GPU it chose) drop its largest requests from its
//!   percentile. The ratio of the two P95s is bootstrapped over the requests (2,000 resamples),
//!   and the test fails when even the low end of its 95 % interval is above 1, i.e. when ailb
//!   is slower by more than this run's own noise explains.
//!
//! Also printed: the P95 with failures counted as slower than any answer. Skipped, saying so,
//! when the router is not installed (`cargo xtask setup` installs it into `target/peers-venv`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ailb_tests::{preflight, run_cmd, workspace_bin};
use serde_json::Value;

/// Requests replayed: about a minute for both policies on two cores.
const REQUESTS: &str = "300";
const RESAMPLES: usize = 2000;

fn peers_venv() -> PathBuf {
    match std::env::var_os("AILB_PEERS_VENV").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers-venv"),
    }
}

/// The P95 of `e2e_sorted` (ms) among `sent` requests, the ones missing (failed) counted as
/// infinitely slow.
fn p95(e2e_sorted: &[f64], sent: usize) -> f64 {
    let rank = (sent * 95).div_ceil(100).max(1);
    e2e_sorted.get(rank - 1).copied().unwrap_or(f64::INFINITY)
}

/// A policy's answered requests' E2E (ms, sorted) and how many it sent.
fn answered(policy: &Value) -> (Vec<f64>, usize) {
    let sent = policy["requests"].as_u64().unwrap_or_else(|| panic!("no request count: {policy}")) as usize;
    let v: Vec<f64> = policy["e2e_sorted_ms"]
        .as_array()
        .unwrap_or_else(|| panic!("no latencies: {policy}"))
        .iter()
        .map(|x| x.as_f64().expect("a latency"))
        .collect();
    assert!(v.len() <= sent, "more answers than requests: {policy}");
    (v, sent)
}

/// A small deterministic generator (splitmix64): the interval is the same on every run of the
/// same data.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// P95 of one resample of `s`.
fn resampled_p95(s: &[f64], rng: &mut Rng) -> f64 {
    let mut r: Vec<f64> = (0..s.len()).map(|_| s[rng.below(s.len())]).collect();
    r.sort_by(f64::total_cmp);
    p95(&r, r.len())
}

/// The 2.5 %, 50 % and 97.5 % points of the bootstrapped ratio P95(a) / P95(b).
fn ratio_interval(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let mut rng = Rng(0x00a1_1b5e_ed00);
    let mut ratios: Vec<f64> =
        (0..RESAMPLES).map(|_| resampled_p95(a, &mut rng) / resampled_p95(b, &mut rng)).collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.5), at(0.975))
}

#[test]
fn ailb_is_no_slower_than_sglang_cache_aware_on_a_short_replay() {
    let venv = peers_venv();
    let router = venv.join("bin/sglang-router");
    if !router.is_file() {
        let why = format!("{} is not installed (`cargo xtask setup` installs it; PyPI unreachable?)", router.display());
        return ailb_tests::report_skipped("ailb_is_no_slower_than_sglang_cache_aware_on_a_short_replay", &why);
    }
    let ailb = preflight();
    let compare = workspace_bin("ailb-tools", "ailb-compare");
    let out_dir = tempfile::tempdir().expect("a temp dir");
    let out = run_cmd(
        Command::new(&compare)
            .env("AILB_BIN", &ailb)
            .env("AILB_PEERS_VENV", &venv)
            .args(["--limit", REQUESTS, "--policies", "ailb,sglang-cache-aware", "--out-dir"])
            .arg(out_dir.path()),
        Duration::from_secs(420),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ailb-compare failed ({}):\n{stderr}", out.status);
    let report = std::fs::read_to_string(out_dir.path().join("replay.md")).expect("replay.md");
    let data: Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("replay-plots.json")).expect("replay-plots.json"))
            .expect("replay-plots.json is JSON");
    let policy = |key: &str| -> &Value {
        data["policies"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["policy"] == key))
            .unwrap_or_else(|| panic!("no {key} in the run:\n{report}"))
    };
    let ((a, a_sent), (s, s_sent)) = (answered(policy("ailb")), answered(policy("sglang-cache-aware")));
    let (a_failed, s_failed) = (a_sent - a.len(), s_sent - s.len());
    let (pa, ps) = (p95(&a, a.len()), p95(&s, s.len()));
    let (lo, mid, hi) = ratio_interval(&a, &s);
    eprintln!(
        "failed: ailb {a_failed} of {a_sent}, sglang-router cache_aware {s_failed} of {s_sent}\n\
         E2E P95 of the answered: ailb {pa:.0} ms, sglang-router {ps:.0} ms; ratio {:.2}, bootstrap median \
         {mid:.2}, 95 % interval {lo:.2}..{hi:.2}\n\
         E2E P95 with failures as slowest: ailb {:.0} ms, sglang-router {:.0} ms\n{report}",
        pa / ps,
        p95(&a, a_sent),
        p95(&s, s_sent),
    );
    assert!(a_failed <= s_failed, "ailb failed {a_failed} requests, sglang-router cache_aware {s_failed}:\n{report}");
    assert!(
        lo <= 1.0,
        "ailb's E2E P95 {pa:.0} ms is worse than sglang-router cache_aware's {ps:.0} ms beyond this run's noise \
         (ratio {:.2}, 95 % interval {lo:.2}..{hi:.2}):\n{report}",
        pa / ps
    );
}

#[test]
fn the_interval_tells_a_slower_policy_from_noise() {
    // 200 requests each; `slow` answers every request 40 % later than `fast`, `same` is `fast`
    // shifted by one request.
    let fast: Vec<f64> = (0..200).map(|i| 1000.0 + f64::from(i) * 10.0).collect();
    let slow: Vec<f64> = fast.iter().map(|x| x * 1.4).collect();
    let same: Vec<f64> = fast.iter().map(|x| x + 10.0).collect();
    let (lo, _, _) = ratio_interval(&slow, &fast);
    assert!(lo > 1.0, "40 % slower must be told apart: low end {lo}");
    let (lo, _, hi) = ratio_interval(&same, &fast);
    assert!(lo <= 1.0 && hi >= 1.0, "the same within noise: {lo}..{hi}");
    // Failures count as the slowest answers.
    assert_eq!(p95(&fast[..180], 200), f64::INFINITY, "10 % failed: P95 is a failure");
    assert_eq!(p95(&fast, 200), fast[189]);
}
