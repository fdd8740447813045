//! Percentiles and the replay summary: pure functions over per-request records.

use std::collections::HashMap;

use super::client::RequestRecord;

/// The `p`-th percentile (0 < p <= 100) of `samples` by the nearest-rank method: the smallest
/// sample with at least `p` % of the samples at or below it (`sorted[ceil(p/100 * n) - 1]`).
/// `None` for no samples. Sorts a copy; NaNs sort last.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Some(percentile_sorted(&sorted, p))
}

/// [`percentile`] of samples already sorted ascending (not empty).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let rank = (p.clamp(0.0, 100.0) / 100.0 * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// P50 / P95 / P99 of one latency, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(|a, b| a.total_cmp(b));
        Some(Self {
            p50: percentile_sorted(&sorted, 50.0),
            p95: percentile_sorted(&sorted, 95.0),
            p99: percentile_sorted(&sorted, 99.0),
        })
    }
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    pub requests: usize,
    pub failures: usize,
    /// Time to first token of the successful requests, ms.
    pub ttft_ms: Option<Percentiles>,
    /// End-to-end latency of the successful requests, ms.
    pub e2e_ms: Option<Percentiles>,
    /// Output tokens received per second of wall time.
    pub token_throughput: f64,
    pub output_tokens: u64,
    pub wall_s: f64,
    /// Cached prompt tokens / prompt tokens, over the requests whose server reported usage.
    pub prefix_cache_hit_rate: Option<f64>,
    /// Share of a conversation's later turns that the same backend served as its previous
    /// turn, over the turns whose server named itself.
    pub affinity_hit_rate: Option<f64>,
}

impl Summary {
    pub fn failure_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.failures as f64 / self.requests as f64
        }
    }

    /// Summarises `records` (in any order) of a replay that took `wall_s` seconds.
    pub fn from_records(records: &[RequestRecord], wall_s: f64) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok()).collect();
        let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
        let e2e: Vec<f64> = ok.iter().map(|r| r.e2e_ms).collect();
        let output_tokens: u64 = records.iter().map(|r| r.tokens as u64).sum();
        let (mut prompt, mut cached) = (0u64, 0u64);
        for r in records {
            if let Some(c) = r.cached_tokens {
                prompt += r.prompt_tokens as u64;
                cached += c as u64;
            }
        }
        // Affinity: walk each conversation's turns in the order they were sent (a request with
        // no conversation, empty, continues none).
        let mut by_conv: HashMap<&str, Vec<&RequestRecord>> = HashMap::new();
        for r in records.iter().filter(|r| !r.conversation.is_empty()) {
            by_conv.entry(r.conversation.as_str()).or_default().push(r);
        }
        let (mut turns, mut same) = (0usize, 0usize);
        for list in by_conv.values_mut() {
            list.sort_by_key(|r| r.index);
            for pair in list.windows(2) {
                if let (Some(a), Some(b)) = (&pair[0].backend, &pair[1].backend) {
                    turns += 1;
                    same += usize::from(a == b);
                }
            }
        }
        Self {
            requests: records.len(),
            failures: records.len() - ok.len(),
            ttft_ms: Percentiles::of(&ttft),
            e2e_ms: Percentiles::of(&e2e),
            token_throughput: if wall_s > 0.0 { output_tokens as f64 / wall_s } else { 0.0 },
            output_tokens,
            wall_s,
            prefix_cache_hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
            affinity_hit_rate: (turns > 0).then(|| same as f64 / turns as f64),
        }
    }
}

fn fmt_p(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("p50 {:.1} p95 {:.1} p99 {:.1} ms", p.p50, p.p95, p.p99),
        None => "n/a".to_string(),
    }
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a (server did not report)".to_string(), |r| format!("{:.1} %", r * 100.0))
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "requests          {} in {:.1} s", self.requests, self.wall_s)?;
        writeln!(f, "failures          {} ({:.2} %)", self.failures, self.failure_rate() * 100.0)?;
        writeln!(f, "TTFT              {}", fmt_p(&self.ttft_ms))?;
        writeln!(f, "end-to-end        {}", fmt_p(&self.e2e_ms))?;
        writeln!(f, "token throughput  {:.1} tokens/s ({} tokens)", self.token_throughput, self.output_tokens)?;
        writeln!(f, "prefix-cache hits {}", fmt_rate(self.prefix_cache_hit_rate))?;
        write!(f, "affinity hits     {}", fmt_rate(self.affinity_hit_rate))
    }
}
