//! The front door's metrics, per model: requests by status, time to first byte, total
//! duration and requests in flight. Registered on a registry passed in.
//!
//! The request path reaches its series through handles resolved once ([`ModelSeries`],
//! [`GatewayMetrics::upstream_request`]): a label lookup hashes and clones the label and takes
//! the family's lock, several times per request otherwise. A series still appears in the
//! output only once it is first used, as with a lookup per request.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::{
    counter::{ConstCounter, Counter},
    family::{Family, MetricConstructor},
    gauge::{ConstGauge, Gauge},
    histogram::{exponential_buckets, Histogram},
};
use prometheus_client::registry::Registry;

use crate::tokenize::segments::SegmentStats;

pub use crate::metrics::ModelLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub model: String,
    pub status: u16,
}

/// An admission decision of a model (`gateway/fleet_memory.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabel {
    pub model: String,
    pub outcome: &'static str,
}

/// What became of a Responses API request with `previous_response_id`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowUpLabel {
    pub outcome: &'static str,
}

impl FollowUpLabel {
    /// Sent to the backend that stored its response, and answered.
    pub const PINNED: &'static str = "pinned";
    /// The front door knows no backend for its response: 404.
    pub const UNKNOWN: &'static str = "unknown";
    /// Its response's backend refused the connection: 404.
    pub const GONE: &'static str = "gone";
    /// Sent to its response's backend, which failed otherwise (502, 504).
    pub const FAILED: &'static str = "failed";
}

/// A connection opened with its prefix keys withheld until the kernel asks for them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WithheldLabel {
    pub model: String,
    pub outcome: &'static str,
}

impl WithheldLabel {
    /// The kernel's pick needed no keys (the conversation's affinity decided): none were made.
    pub const PLACED: &'static str = "placed";
    /// The kernel asked for them (`ENOKEY`): made, and the connection opened again with them.
    pub const ASKED: &'static str = "asked";
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReuseLabel {
    pub reused: bool,
}

/// Histogram buckets from 1 ms to about 33 min (doubling).
#[derive(Clone, Copy, Debug)]
pub struct Buckets;

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(0.001, 2.0, 22))
    }
}

/// Histogram buckets from 50 microseconds to about 0.8 s (doubling): making a request's prefix
/// keys takes microseconds for text and up to tens of milliseconds for a long prompt tokenized.
#[derive(Clone, Copy, Debug)]
pub struct KeyBuckets;

impl MetricConstructor<Histogram> for KeyBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
    }
}

#[derive(Clone, Debug)]
pub struct GatewayMetrics {
    pub requests: Family<StatusLabel, Counter>,
    pub ttfb_seconds: Family<ModelLabel, Histogram, Buckets>,
    pub duration_seconds: Family<ModelLabel, Histogram, Buckets>,
    /// Time to make a request's prefix keys, per model: only for a request that opens an
    /// upstream connection (one on a kept connection involves no pick, so makes no keys).
    pub prefix_keys_seconds: Family<ModelLabel, Histogram, KeyBuckets>,
    /// Connections opened with the prefix keys withheld, per model, by what the kernel did.
    pub prefix_keys_withheld: Family<WithheldLabel, Counter>,
    pub in_flight: Family<ModelLabel, Gauge>,
    pub upstream_connections: Family<ReuseLabel, Counter>,
    /// Client connections the HTTP/1 fast path handed to hyper's server.
    pub handoffs: Counter,
    /// Responses API follow-ups by outcome.
    pub follow_ups: Family<FollowUpLabel, Counter>,
    /// Response ids remembered with their backend now.
    pub responses_remembered: Gauge,
    /// `upstream_connections` with `reused = false` and `true`, resolved on first use.
    reuse: [OnceLock<Counter>; 2],
}

impl GatewayMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            ttfb_seconds: Family::new_with_constructor(Buckets),
            duration_seconds: Family::new_with_constructor(Buckets),
            prefix_keys_seconds: Family::new_with_constructor(KeyBuckets),
            prefix_keys_withheld: Family::default(),
            in_flight: Family::default(),
            upstream_connections: Family::default(),
            handoffs: Counter::default(),
            follow_ups: Family::default(),
            responses_remembered: Gauge::default(),
            reuse: Default::default(),
        };
        registry.register(
            "ailb_gateway_requests",
            "Requests answered by the front door, per model (\"\" when unknown) and status",
            m.requests.clone(),
        );
        registry.register(
            "ailb_gateway_ttfb_seconds",
            "From the request's head to the first byte of the upstream's response body",
            m.ttfb_seconds.clone(),
        );
        registry.register(
            "ailb_gateway_duration_seconds",
            "From the request's head to the response's last byte",
            m.duration_seconds.clone(),
        );
        registry.register(
            "ailb_gateway_prefix_keys_seconds",
            "Making a request's prefix keys (text: hashing the prompt's bytes; token-exact: waiting for a tokenizing \
             slot and tokenizing), for the requests that open an upstream connection and whose kernel pick reads them",
            m.prefix_keys_seconds.clone(),
        );
        registry.register(
            "ailb_gateway_prefix_keys_withheld",
            "Upstream connections a conversation's later turn opened with its token-exact prefix keys withheld \
             until the kernel asks for them: placed (the pick needed none, the conversation's affinity decided; no \
             tokenizing) or asked (the kernel refused with ENOKEY; the keys were made and the connection opened \
             again with them)",
            m.prefix_keys_withheld.clone(),
        );
        registry.register("ailb_gateway_in_flight", "Requests being proxied now", m.in_flight.clone());
        registry.register(
            "ailb_gateway_upstream_requests",
            "Requests sent upstream, on a fresh connection (reused=false, a new kernel pick) or on an idle one \
             with the same routing inputs (reused=true)",
            m.upstream_connections.clone(),
        );
        registry.register(
            "ailb_gateway_http1_handoffs",
            "Client connections the front door's HTTP/1 fast path handed to hyper's server (HTTP/2, a chunked \
             body, an upgrade, Expect, a head it does not take)",
            m.handoffs.clone(),
        );
        registry.register(
            "ailb_gateway_previous_responses",
            "Responses API requests with previous_response_id: sent to the backend that stored the response \
             (pinned), answered 404 because the front door knows no backend for it (unknown) or that backend \
             refused the connection (gone), or failed otherwise upstream (failed)",
            m.follow_ups.clone(),
        );
        registry.register(
            "ailb_gateway_responses_remembered",
            "Responses API response ids remembered with the backend that stored each (gateway.responses_max_entries \
             at most)",
            m.responses_remembered.clone(),
        );
        m
    }

    /// Counts a Responses API follow-up with `outcome` (a [`FollowUpLabel`] constant).
    pub fn follow_up(&self, outcome: &'static str) {
        self.follow_ups.get_or_create(&FollowUpLabel { outcome }).inc();
    }

    /// Counts a request sent upstream on a fresh (`reused = false`) or a kept connection.
    pub fn upstream_request(&self, reused: bool) {
        let family = &self.upstream_connections;
        self.reuse[usize::from(reused)].get_or_init(|| family.get_or_create(&ReuseLabel { reused }).clone()).inc();
    }
}

/// Per model with a tokenizer (`[gateway.tokenizers]`), its segment cache's counters, read at
/// each scrape.
pub fn register_tokenizer_caches(
    registry: &mut Registry,
    tokenizers: &std::collections::BTreeMap<String, crate::config::gateway::LoadedTokenizer>,
) {
    let caches: Vec<(String, std::sync::Arc<crate::tokenize::ChatTokenizer>)> = tokenizers
        .iter()
        .filter(|(_, t)| t.tokenizer.segment_cache().is_some())
        .map(|(m, t)| (m.clone(), t.tokenizer.clone()))
        .collect();
    if !caches.is_empty() {
        registry.register_collector(Box::new(TokenizerCaches(caches)));
    }
}

#[derive(Debug)]
struct TokenizerCaches(Vec<(String, std::sync::Arc<crate::tokenize::ChatTokenizer>)>);

impl Collector for TokenizerCaches {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        type Field = fn(&SegmentStats) -> u64;
        let counters: [(&str, &str, Field); 4] = [
            (
                "ailb_gateway_tokenizer_segments_cached",
                "Prompt segments (the text up to a special token) whose token ids came from the tokenizer's cache",
                |s| s.hits.get(),
            ),
            ("ailb_gateway_tokenizer_segments_encoded", "Prompt segments the tokenizer encoded", |s| s.misses.get()),
            (
                "ailb_gateway_tokenizer_tokens_cached",
                "Prompt token ids taken from the tokenizer's segment cache",
                |s| s.tokens_reused.get(),
            ),
            ("ailb_gateway_tokenizer_tokens_encoded", "Prompt token ids the tokenizer encoded", |s| {
                s.tokens_encoded.get()
            }),
        ];
        let stats: Vec<(&String, &SegmentStats)> =
            self.0.iter().filter_map(|(m, t)| Some((m, t.segment_cache()?.stats()))).collect();
        for (name, help, field) in counters {
            let mut fam = enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
            for (m, s) in &stats {
                ConstCounter::new(field(s)).encode(fam.encode_family(&ModelLabel { model: (*m).clone() })?)?;
            }
        }
        let mut fam = enc.encode_descriptor(
            "ailb_gateway_tokenizer_cache_bytes",
            "Bytes held by the tokenizer's segment cache (gateway.tokenizer_cache_mb at most)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (m, s) in &stats {
            ConstGauge::new(s.bytes.get()).encode(fam.encode_family(&ModelLabel { model: (*m).clone() })?)?;
        }
        Ok(())
    }
}

/// One model's series of [`GatewayMetrics`], each resolved on its first use and then reached
/// without a label lookup. Requests count by status; only 200 has a handle of its own.
#[derive(Debug)]
pub struct ModelSeries {
    model: String,
    in_flight: OnceLock<Gauge>,
    ttfb: OnceLock<Histogram>,
    duration: OnceLock<Histogram>,
    prefix_keys: OnceLock<Histogram>,
    /// `prefix_keys_withheld` asked (0) and placed (1).
    withheld: [OnceLock<Counter>; 2],
    ok: OnceLock<Counter>,
}

impl ModelSeries {
    pub fn new(model: String) -> Self {
        Self {
            model,
            in_flight: OnceLock::new(),
            ttfb: OnceLock::new(),
            duration: OnceLock::new(),
            prefix_keys: OnceLock::new(),
            withheld: Default::default(),
            ok: OnceLock::new(),
        }
    }

    /// The model's name, as its series are labelled.
    pub fn model(&self) -> &str {
        &self.model
    }

    fn label(&self) -> ModelLabel {
        ModelLabel { model: self.model.clone() }
    }

    pub fn in_flight(&self, m: &GatewayMetrics) -> &Gauge {
        self.in_flight.get_or_init(|| m.in_flight.get_or_create(&self.label()).clone())
    }

    pub fn ttfb(&self, m: &GatewayMetrics) -> &Histogram {
        self.ttfb.get_or_init(|| m.ttfb_seconds.get_or_create(&self.label()).clone())
    }

    pub fn duration(&self, m: &GatewayMetrics) -> &Histogram {
        self.duration.get_or_init(|| m.duration_seconds.get_or_create(&self.label()).clone())
    }

    pub fn prefix_keys(&self, m: &GatewayMetrics) -> &Histogram {
        self.prefix_keys.get_or_init(|| m.prefix_keys_seconds.get_or_create(&self.label()).clone())
    }

    /// Counts a connection opened with its prefix keys withheld: `placed` by the kernel without
    /// them, or asked for them.
    pub fn prefix_keys_withheld(&self, m: &GatewayMetrics, placed: bool) {
        let outcome = if placed { WithheldLabel::PLACED } else { WithheldLabel::ASKED };
        let label = || WithheldLabel { model: self.model.clone(), outcome };
        self.withheld[usize::from(placed)].get_or_init(|| m.prefix_keys_withheld.get_or_create(&label()).clone()).inc();
    }

    /// Counts one request answered with `status`.
    pub fn answered(&self, m: &GatewayMetrics, status: u16) {
        let label = || StatusLabel { model: self.model.clone(), status };
        if status == 200 {
            self.ok.get_or_init(|| m.requests.get_or_create(&label()).clone()).inc();
        } else {
            m.requests.get_or_create(&label()).inc();
        }
    }
}

/// A tenant's request at a priority (`[[gateway.tenants]]`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
    pub priority: u8,
}

/// What became of a tenant's request at a priority.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantOutcomeLabel {
    pub tenant: String,
    pub priority: u8,
    pub outcome: &'static str,
}

/// The outcomes of [`TenantOutcomeLabel`], in the order of [`TenantSeries::outcomes`].
pub const TENANT_OUTCOMES: [&str; 7] =
    ["admitted", "queued", "shed_queue_full", "shed_evicted", "shed_wait", "rate_limited", "concurrency_limited"];

/// Indices into [`TENANT_OUTCOMES`].
pub mod outcome {
    /// Admitted at once (nothing waited, or the model had room).
    pub const ADMITTED: usize = 0;
    /// Waited in the scheduler's queue, then admitted.
    pub const QUEUED: usize = 1;
    /// Refused at once: the queue (or its tenant's share of it) was full of requests of its
    /// band or higher.
    pub const SHED_QUEUE_FULL: usize = 2;
    /// Waited, then evicted by a request of a higher band.
    pub const SHED_EVICTED: usize = 3;
    /// Waited `gateway.scheduler.max_wait` without room.
    pub const SHED_WAIT: usize = 4;
    /// Over its tenant's token rate.
    pub const RATE_LIMITED: usize = 5;
    /// Over its tenant's concurrency share.
    pub const CONCURRENCY_LIMITED: usize = 6;
}

/// One tenant's series at one priority, resolved at start-up (no label lookup per request).
#[derive(Debug)]
pub struct TenantSeries {
    pub outcomes: [Counter; TENANT_OUTCOMES.len()],
    pub waiting: Gauge,
    pub wait_seconds: Histogram,
    pub tokens: Counter,
}

/// The per-tenant, per-priority metrics.
#[derive(Debug)]
pub struct TenantMetrics {
    /// `[tenant][priority]`.
    series: Vec<Vec<TenantSeries>>,
    /// Requests refused for room (queue full, or the wait) while one of a lower band waited.
    pub inversions: Counter,
}

impl TenantMetrics {
    /// The series of `tenants` (names, in id order) at `levels` priorities, on `registry`.
    pub fn new(tenants: &[&str], levels: u8, registry: &mut Registry) -> Self {
        let requests = Family::<TenantOutcomeLabel, Counter>::default();
        let waiting = Family::<TenantLabel, Gauge>::default();
        let wait = Family::<TenantLabel, Histogram, Buckets>::new_with_constructor(Buckets);
        let tokens = Family::<TenantLabel, Counter>::default();
        let inversions = Counter::default();
        let series = tenants
            .iter()
            .map(|&name| {
                (0..levels)
                    .map(|priority| {
                        let label = TenantLabel { tenant: name.to_string(), priority };
                        TenantSeries {
                            outcomes: TENANT_OUTCOMES.map(|outcome| {
                                let l = TenantOutcomeLabel { tenant: name.to_string(), priority, outcome };
                                requests.get_or_create(&l).clone()
                            }),
                            waiting: waiting.get_or_create(&label).clone(),
                            wait_seconds: wait.get_or_create(&label).clone(),
                            tokens: tokens.get_or_create(&label).clone(),
                        }
                    })
                    .collect()
            })
            .collect();
        registry.register(
            "ailb_gateway_tenant_requests",
            "Requests per tenant and priority by outcome: admitted (at once), queued (waited, then admitted), \
             shed_queue_full (429), shed_evicted (429: a higher band took its place), shed_wait (503 after \
             gateway.scheduler.max_wait), rate_limited (429: the tenant's token rate), concurrency_limited (429)",
            requests,
        );
        registry.register(
            "ailb_gateway_tenant_waiting",
            "Requests waiting in the scheduler's queues now, per tenant and priority",
            waiting,
        );
        registry.register(
            "ailb_gateway_tenant_wait_seconds",
            "Time in the scheduler's queue of the requests that waited, per tenant and priority",
            wait,
        );
        registry.register(
            "ailb_gateway_tenant_tokens",
            "Tokens admitted (prompt estimate + max_tokens), per tenant and priority",
            tokens,
        );
        registry.register(
            "ailb_gateway_scheduler_inversions",
            "Requests refused for room (queue full, or the wait) while a request of a lower priority waited \
             (the scheduler keeps it at 0; a wait can run out at any band while the fleet stays full)",
            inversions.clone(),
        );
        Self { series, inversions }
    }

    pub fn of(&self, tenant: usize, priority: u8) -> &TenantSeries {
        &self.series[tenant][usize::from(priority)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each model's segment cache is on `/metrics`, read at the scrape.
    #[test]
    fn tokenizer_caches_are_counted_per_model() {
        let tokenizer = std::sync::Arc::new(crate::tokenize::tests::fixture());
        let loaded = crate::config::gateway::LoadedTokenizer { path: "fixture".into(), tokenizer: tokenizer.clone() };
        let mut registry = Registry::default();
        register_tokenizer_caches(&mut registry, &[("m".to_string(), loaded)].into_iter().collect());
        let chat = serde_json::json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]);
        let scrape = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
            text
        };
        let value = |text: &str, name: &str| -> f64 {
            let prefix = format!("{name}{{model=\"m\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {prefix} in:\n{text}"))
        };
        tokenizer.chat_token_ids(&chat, true).expect("encodes");
        let first = scrape();
        tokenizer.chat_token_ids(&chat, true).expect("encodes again");
        let second = scrape();
        let segments = |t: &str| {
            value(t, "ailb_gateway_tokenizer_segments_cached_total")
                + value(t, "ailb_gateway_tokenizer_segments_encoded_total")
        };
        let encoded = |t: &str| value(t, "ailb_gateway_tokenizer_tokens_encoded_total");
        assert!(encoded(&first) > 0.0, "{first}");
        // The second chat: every segment from the cache, no token encoded.
        assert_eq!(encoded(&second), encoded(&first), "{second}");
        assert_eq!(
            value(&second, "ailb_gateway_tokenizer_segments_cached_total")
                - value(&first, "ailb_gateway_tokenizer_segments_cached_total"),
            segments(&first),
            "{second}"
        );
        assert!(value(&second, "ailb_gateway_tokenizer_tokens_cached_total") >= encoded(&first), "{second}");
        assert!(value(&second, "ailb_gateway_tokenizer_cache_bytes") > 0.0);
        assert_eq!(second.matches("# TYPE ailb_gateway_tokenizer_segments_cached counter").count(), 1, "{second}");

        // No cache, no series.
        let plain = std::sync::Arc::new(crate::tokenize::tests::fixture().with_segment_cache(None));
        let loaded = crate::config::gateway::LoadedTokenizer { path: "fixture".into(), tokenizer: plain };
        let mut registry = Registry::default();
        register_tokenizer_caches(&mut registry, &[("m".to_string(), loaded)].into_iter().collect());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(!text.contains("tokenizer"), "{text}");
    }
}
