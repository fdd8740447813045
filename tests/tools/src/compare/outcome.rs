//! What one policy's run measured, and the figures the report derives from it.

use std::collections::BTreeMap;

use ailb_sim::replay::percentile;
use serde_json::Value;

use super::policy::Policy;

/// One simulated GPU at the end of a policy's run.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuOutcome {
    /// `ip:port` of its `ailb-sim`.
    pub addr: String,
    /// Its `ailb-sim` preset.
    pub profile: &'static str,
    /// Mean of the utilisation samples taken during the run.
    pub util_mean: f64,
    /// Busy share since the server started (its `/sim/state` `busy_fraction`).
    pub busy: f64,
    /// Share of the prompt tokens it found in its prefix cache (`None`: it was asked none).
    pub prefix_hit: Option<f64>,
}

impl GpuOutcome {
    /// The address without the port, as the report's rows and legends name a GPU.
    pub fn host(&self) -> &str {
        self.addr.split(':').next().unwrap_or_default()
    }
}

/// What one policy measured.
pub struct Outcome {
    pub policy: Policy,
    pub summary: Value,
    /// E2E of the successful requests, ms, sorted.
    pub e2e_sorted: Vec<f64>,
    /// Per request index: E2E ms when it succeeded.
    pub e2e_by_index: BTreeMap<u64, f64>,
    pub gpus: Vec<GpuOutcome>,
    /// The fleet's prompt tokens found in the GPUs' prefix caches, and all they were asked, by
    /// the simulated servers' own counters (`None`: not read).
    pub prefix_tokens: Option<(f64, f64)>,
    /// The kernel's prefix-pick counters at the end of the replay (`ailb_prefix_*` of `ailb
    /// run`'s `/metrics`: lookups, found, used, overruled_load, ...); empty without them.
    pub prefix_counters: BTreeMap<String, f64>,
    /// The front door's own counters at the end of the replay (`None`: no front door).
    pub front_door: Option<super::front_door::FrontDoorStats>,
    /// Failed requests by kind ("HTTP 400", "connect refused", ...).
    pub failure_kinds: BTreeMap<String, usize>,
    /// Utilisation samples over time: (seconds since the replay started, one value per GPU).
    pub util_series: Vec<(f64, Vec<f64>)>,
    /// Real seconds from the first to the last planned arrival: the window in which the
    /// balancer places requests (after it, GPUs only drain their queues).
    pub window_s: f64,
    pub wall_s: f64,
    /// CPU seconds (user + system) the userspace router on the request path used during the
    /// replay: nginx, a peer router or ailb's front door (`None`: no such process, the pick
    /// is the kernel's).
    pub router_cpu_s: Option<f64>,
    /// CPU seconds `ailb run` used during the replay (off the request path: it writes the
    /// maps the kernel picks from), `None` without ailb.
    pub daemon_cpu_s: Option<f64>,
    /// ailb's weights over the replay (`None` without ailb, or when its endpoint was not read).
    pub weights: Option<super::weights::WeightStats>,
    /// Per conversation, the GPU (host, as [`GpuOutcome::host`]) that served its first turn (its
    /// earliest request), where that request names one.
    pub first_turns: BTreeMap<String, String>,
}

impl Outcome {
    /// The outcome of a replay whose JSON report (`ailb_sim::replay::report_json`) is `report`:
    /// the summary as it is, the requests sorted into E2E latencies and failure kinds; the GPUs,
    /// the utilisation samples and the times as measured around it.
    pub fn from_replay(
        policy: Policy,
        report: &Value,
        gpus: Vec<GpuOutcome>,
        util_series: Vec<(f64, Vec<f64>)>,
        window_s: f64,
        wall_s: f64,
    ) -> Self {
        let mut e2e_by_index = BTreeMap::new();
        let mut failure_kinds = BTreeMap::new();
        for r in report["requests"].as_array().map(Vec::as_slice).unwrap_or_default() {
            if let Some(kind) = failure_kind(r) {
                *failure_kinds.entry(kind).or_insert(0) += 1;
            }
            if r["status"].as_u64() == Some(200) && r["error"].is_null() {
                if let (Some(i), Some(e)) = (r["index"].as_u64(), r["e2e_ms"].as_f64()) {
                    e2e_by_index.insert(i, e);
                }
            }
        }
        let first_turns = first_turns(report);
        let mut e2e_sorted: Vec<f64> = e2e_by_index.values().copied().collect();
        e2e_sorted.sort_by(f64::total_cmp);
        Outcome {
            policy,
            summary: report["summary"].clone(),
            e2e_sorted,
            e2e_by_index,
            gpus,
            prefix_tokens: None,
            prefix_counters: BTreeMap::new(),
            front_door: None,
            failure_kinds,
            util_series,
            window_s,
            wall_s,
            router_cpu_s: None,
            daemon_cpu_s: None,
            weights: None,
            first_turns,
        }
    }

    pub fn util_mean(&self) -> f64 {
        self.gpus.iter().map(|g| g.util_mean).sum::<f64>() / self.gpus.len().max(1) as f64
    }
    /// Max - min over the GPUs of their mean utilisation during the whole run.
    pub fn util_spread(&self) -> f64 {
        spread(self.gpus.iter().map(|g| g.util_mean))
    }
    /// Mean utilisation per GPU over the samples taken while requests were still arriving.
    pub fn window_means(&self) -> Vec<f64> {
        let rows: Vec<&Vec<f64>> = self.util_series.iter().filter(|(t, _)| *t <= self.window_s).map(|r| &r.1).collect();
        (0..self.gpus.len())
            .map(|g| {
                let v: Vec<f64> = rows.iter().filter_map(|r| r.get(g).copied().filter(|u| u.is_finite())).collect();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            })
            .collect()
    }
    pub fn window_mean(&self) -> f64 {
        let m = self.window_means();
        m.iter().sum::<f64>() / m.len().max(1) as f64
    }
    /// The utilisation spread: max - min of the per-GPU means while requests arrive.
    pub fn window_spread(&self) -> f64 {
        spread(self.window_means().into_iter())
    }
    /// The share of the prompt tokens the GPUs found in their prefix caches (their own count).
    pub fn cached_share(&self) -> Option<f64> {
        self.prefix_tokens.and_then(|(h, q)| (q > 0.0).then(|| h / q))
    }
    pub fn failures(&self) -> u64 {
        self.summary["failures"].as_u64().unwrap_or(0)
    }
    pub fn requests(&self) -> u64 {
        self.summary["requests"].as_u64().unwrap_or(0)
    }
    /// Percentile `p` ("p50", "p95", "p99") of the summary's `what` ("ttft_ms", "e2e_ms").
    pub fn pct(&self, what: &str, p: &str) -> Option<f64> {
        self.summary[what][p].as_f64()
    }
}

/// P95 E2E over the requests every policy served (the same request set for all).
pub fn common_p95(outs: &[Outcome], o: &Outcome) -> Option<f64> {
    let common: Vec<f64> = o
        .e2e_by_index
        .iter()
        .filter(|(i, _)| outs.iter().all(|x| x.e2e_by_index.contains_key(i)))
        .map(|(_, e)| *e)
        .collect();
    percentile(&common, 95.0)
}

/// Why a request failed, in a few words; `None` when it succeeded.
fn failure_kind(r: &Value) -> Option<String> {
    if r["status"].as_u64() == Some(200) && r["error"].is_null() {
        return None;
    }
    let err = r["error"].as_str().unwrap_or_default();
    Some(if err.starts_with("connect") && err.contains("refused") {
        "connect refused (no backend fits)".to_string()
    } else if err.starts_with("connect") {
        "connect failed".to_string()
    } else if let Some(st) = r["status"].as_u64().filter(|&s| s != 200) {
        format!("HTTP {st}")
    } else if err.contains("timed out") || err.contains("deadline") {
        "timed out".to_string()
    } else {
        "stream error".to_string()
    })
}

fn spread(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.iter().copied().fold(f64::MIN, f64::max) - v.iter().copied().fold(f64::MAX, f64::min)
}

/// Per conversation of `report`'s requests (those with one), the host of the backend that
/// served its first turn (its earliest request, by planned arrival then index), where that
/// request names one.
fn first_turns(report: &Value) -> BTreeMap<String, String> {
    let mut first: BTreeMap<&str, ((u64, u64), Option<&str>)> = BTreeMap::new();
    for r in report["requests"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let Some(conv) = r["conversation"].as_str().filter(|c| !c.is_empty()) else { continue };
        let at = (r["at_ms"].as_u64().unwrap_or(u64::MAX), r["index"].as_u64().unwrap_or(u64::MAX));
        let host = r["backend"].as_str().map(|b| b.split(':').next().unwrap_or_default());
        let e = first.entry(conv).or_insert((at, host));
        if at < e.0 {
            *e = (at, host);
        }
    }
    first.into_iter().filter_map(|(c, (_, h))| Some((c.to_owned(), h?.to_owned()))).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_conversations_first_turn_is_its_earliest_request_and_counts_only_if_placed() {
        let report = json!({"requests": [
            {"index": 3, "at_ms": 900, "conversation": "a", "backend": "127.0.10.2:18101"},
            {"index": 1, "at_ms": 100, "conversation": "a", "backend": "127.0.10.1:18101"},
            {"index": 2, "at_ms": 100, "conversation": "b", "backend": null},
            {"index": 4, "at_ms": 500, "conversation": "b", "backend": "127.0.10.3:18101"},
            {"index": 5, "at_ms": 50, "conversation": "", "backend": "127.0.10.4:18101"},
            {"index": 0, "at_ms": 100, "conversation": "c", "backend": "127.0.10.5:18101"},
            {"index": 6, "at_ms": 100, "conversation": "c", "backend": "127.0.10.6:18101"},
        ]});
        let first = first_turns(&report);
        // "b"'s first turn named no backend (it failed before one was chosen): no GPU to compare;
        // the empty conversation is none; "c"'s two turns at the same time go by index.
        assert_eq!(
            first,
            BTreeMap::from([("a".to_string(), "127.0.10.1".to_string()), ("c".to_string(), "127.0.10.5".to_string())])
        );
    }
}
