//! The daemon's (`ailb run`) Prometheus metrics, registered on a registry passed in. Names `ailb_*`, counters end in
//! `_total`, durations in `_seconds`. The kernel's counters are read from the pinned maps at
//! scrape time by [`KernelCollector`].

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, RwLock},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};

use crate::kv_events::{FeedCounters, FeedStats};
pub use crate::metrics::ModelLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub model: String,
    pub backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvalidLabel {
    pub key: String,
    pub effect: String,
}

/// Per model, from the last plan: the inputs of the autoscaling gauges that the kernel does not
/// hold.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelLoad {
    /// Sum of the live backends' capacities (`max_inflight`, else the model's
    /// `backend_capacity`); 0: none known.
    pub capacity: f64,
    /// Sum of the live backends' reported `queue_length`.
    pub queued: f64,
}

/// Shared between the daemon loop (writes after each plan) and the scrape (reads).
pub type ModelLoads = Arc<RwLock<BTreeMap<String, ModelLoad>>>;

/// The daemon's own metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub discovery_errors: Counter,
    pub discovery_dropped: Counter,
    pub discovery_stale_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub propagation_seconds: Histogram,
    pub applies: Counter,
    pub table_rebuilds: Family<ModelLabel, Counter>,
    pub backend_weight: Family<BackendLabel, Gauge>,
    pub backend_eligible: Family<BackendLabel, Gauge>,
    pub excluded: Family<ReasonLabel, Gauge>,
    pub model_available: Family<ModelLabel, Gauge>,
    pub invalid_metadata: Family<InvalidLabel, Gauge>,
    /// What [`KernelCollector`] needs for the per-model saturation gauges.
    pub loads: ModelLoads,
    /// The KV-event feed's counters (precise prefix models), read at scrape time.
    pub kv_feed: FeedCounters,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            discovery_errors: Counter::default(),
            discovery_dropped: Counter::default(),
            discovery_stale_seconds: Gauge::default(),
            // 1 ms .. ~16 s
            propagation_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 15,
            )),
            applies: Counter::default(),
            table_rebuilds: Family::default(),
            backend_weight: Family::default(),
            backend_eligible: Family::default(),
            excluded: Family::default(),
            model_available: Family::default(),
            invalid_metadata: Family::default(),
            loads: ModelLoads::default(),
            kv_feed: FeedCounters::default(),
        };
        registry.register(
            "ailb_discovery_errors",
            "Discovery reads that failed (the last good tables stay)",
            m.discovery_errors.clone(),
        );
        registry.register(
            "ailb_discovery_dropped_instances",
            "Registry instances dropped because their entry was unusable (bad ip, port, types)",
            m.discovery_dropped.clone(),
        );
        registry.register(
            "ailb_discovery_stale_seconds",
            "Seconds since the last successful discovery read",
            m.discovery_stale_seconds.clone(),
        );
        registry.register(
            "ailb_propagation_seconds",
            "From a discovery answer that changed something to the new tables written",
            m.propagation_seconds.clone(),
        );
        registry.register("ailb_applies", "Plans written to the kernel maps", m.applies.clone());
        registry.register("ailb_table_rebuilds", "Table swaps per model", m.table_rebuilds.clone());
        registry.register("ailb_backend_weight", "Table weight written per backend", m.backend_weight.clone());
        registry.register(
            "ailb_backend_eligible",
            "1 when the backend is in its model's table",
            m.backend_eligible.clone(),
        );
        registry.register(
            "ailb_backends_excluded",
            "Backends excluded by the policy in the last plan, by reason",
            m.excluded.clone(),
        );
        registry.register(
            "ailb_model_available",
            "1 when the model has an eligible backend",
            m.model_available.clone(),
        );
        registry.register(
            "ailb_invalid_metadata",
            "Invalid metadata values in the last plan, by key and what the policy did (excluded/ignored)",
            m.invalid_metadata.clone(),
        );
        registry.register_collector(Box::new(FeedCollector(m.kv_feed.clone())));
        m
    }
}

/// The engines' KV-event feed, per model (precise prefix mode): what came in, what was lost.
#[derive(Debug)]
struct FeedCollector(FeedCounters);

impl Collector for FeedCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let models: Vec<(String, FeedStats)> =
            self.0.models().into_iter().map(|m| (m.clone(), self.0.stats(&m))).collect();
        model_gauges(
            &mut enc,
            "ailb_kv_events_keys_held",
            "Prefix keys the model's followed engines hold now, by their events (each engine's keys, summed)",
            models.iter().map(|(m, s)| (m.clone(), s.keys_held as f64)),
        )?;
        type Field = fn(&FeedStats) -> u64;
        let counters: [(&str, &str, Field); 7] = [
            ("ailb_kv_events_batches", "Event batches applied, live or replayed", |s| s.batches),
            ("ailb_kv_events_blocks_stored", "Blocks the engines reported stored", |s| s.blocks_stored),
            ("ailb_kv_events_blocks_removed", "Blocks the engines reported evicted", |s| s.blocks_removed),
            ("ailb_kv_events_gaps", "Sequence gaps seen (each filled by a replay or a resync)", |s| s.gaps),
            ("ailb_kv_events_resyncs", "Gaps the replay could not fill: the engine's keys dropped and relearnt", |s| {
                s.resyncs
            }),
            ("ailb_kv_events_malformed", "Malformed batches logged and skipped", |s| s.malformed),
            ("ailb_kv_events_connect_failures", "Failed connects to an engine's publisher and lost connections", |s| {
                s.connect_failures
            }),
        ];
        for (name, help, field) in counters {
            let mut fam = enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
            for (m, s) in &models {
                ConstCounter::new(field(s)).encode(fam.encode_family(&ModelLabel { model: m.clone() })?)?;
            }
        }
        Ok(())
    }
}

/// Reads the pinned maps on every scrape: the kernel counters, per-backend in-flight counts and
/// the per-model saturation gauges (with `loads`, the last plan's capacities and queues).
#[derive(Debug)]
pub struct KernelCollector {
    pub bpffs: PathBuf,
    pub loads: ModelLoads,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    let m = enc.encode_descriptor(name, help, None, c.metric_type())?;
    c.encode(m)
}

impl Collector for KernelCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(st) = crate::datapath::read_status(&self.bpffs) else {
            return Ok(()); // no pins (yet): nothing to report
        };
        let loads = self.loads.read().map(|l| l.clone()).unwrap_or_default();
        encode_status(&st, &loads, enc)
    }
}

/// What [`KernelCollector`] serves for a status already read from the pinned maps. Lets a
/// check without a kernel (the deployment files' test) encode every kernel metric the daemon's
/// `/metrics` serves.
#[derive(Debug)]
pub struct StatusCollector(pub crate::datapath::status::Status, pub BTreeMap<String, ModelLoad>);

impl Collector for StatusCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_status(&self.0, &self.1, enc)
    }
}

/// Free memory (MiB) a backend has for new requests now, as the kernel's pick counts it:
/// `min(free, capacity - hinted in flight)`; `None`: unknown.
fn free_now_mb(b: &crate::datapath::status::BackendStatus) -> Option<u64> {
    let free = u64::from(b.free_mem_mb?);
    Some(b.mem_capacity_mb.map_or(free, |c| free.min(u64::from(c).saturating_sub(b.inflight_mem_mb))))
}

/// A per-model gauge family: `(model, value)` pairs.
fn model_gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (String, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut fam = enc.encode_descriptor(name, help, None, ConstGauge::new(0.0f64).metric_type())?;
    for (model, v) in values {
        ConstGauge::new(v).encode(fam.encode_family(&ModelLabel { model })?)?;
    }
    Ok(())
}

/// The autoscaling signal per model: the kernel's in-flight count against the live backends'
/// capacity, the reported queues, and the memory free for new requests.
fn encode_models(
    st: &crate::datapath::status::Status,
    loads: &BTreeMap<String, ModelLoad>,
    enc: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let load = |m: &str| loads.get(m).copied().unwrap_or_default();
    let models = || st.models.iter();
    model_gauges(
        enc,
        "ailb_model_inflight",
        "In-flight connections per model on this gateway (kernel)",
        models().map(|m| (m.name.clone(), m.inflight as f64)),
    )?;
    model_gauges(
        enc,
        "ailb_model_capacity",
        "Sum of the live backends' capacity (max_inflight, else the model's backend_capacity); 0: unknown",
        models().map(|m| (m.name.clone(), load(&m.name).capacity)),
    )?;
    model_gauges(
        enc,
        "ailb_model_saturation",
        "In-flight connections over capacity per model (1 = every slot taken; absent while no capacity is known)",
        models()
            .filter(|m| load(&m.name).capacity > 0.0)
            .map(|m| (m.name.clone(), m.inflight as f64 / load(&m.name).capacity)),
    )?;
    model_gauges(
        enc,
        "ailb_model_queued_requests",
        "Sum of the queue_length the model's live backends report",
        models().map(|m| (m.name.clone(), load(&m.name).queued)),
    )?;
    encode_prefix(st, enc)?;
    model_gauges(
        enc,
        "ailb_model_memory_headroom_mb",
        "GPU memory (MiB) free for new requests over the model's live backends with known memory (kernel: free minus hints in flight)",
        models().map(|m| {
            let mb: u64 = m.backends.iter().filter(|b| b.live).filter_map(free_now_mb).sum();
            (m.name.clone(), mb as f64)
        }),
    )
}

/// The kernel's prefix map per model: entries, and what the prefix searches found (counters
/// since the maps were created; `ailb status` shows the same).
fn encode_prefix(st: &crate::datapath::status::Status, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let with_mode = || st.models.iter().filter(|m| m.prefix.mode != "off" || m.prefix.stats.lookups > 0);
    model_gauges(
        enc,
        "ailb_prefix_entries",
        "Blocks of the model in the kernel's prefix map (a scan of the map)",
        with_mode().map(|m| (m.name.clone(), m.prefix.entries as f64)),
    )?;
    type Field = fn(&crate::datapath::prefix::PrefixStatsView) -> u64;
    let counters: [(&str, &str, Field); 9] = [
        ("ailb_prefix_lookups", "Connects that carried prefix keys to a model with a prefix mode", |s| s.lookups),
        ("ailb_prefix_found", "Of those, the ones whose first key some backend holds", |s| s.found),
        ("ailb_prefix_used", "A holder of the longest cached prefix could take the request", |s| s.used),
        ("ailb_prefix_overruled_load", "Every holder of the longest prefix was at its load bound or cap", |s| {
            s.overruled_load
        }),
        (
            "ailb_prefix_overruled_memory",
            "Holders under their bound could not hold the request's memory even idle",
            |s| s.overruled_memory,
        ),
        (
            "ailb_prefix_keys_found",
            "Keys found held, summed (over keys_sent: the share of the prompt found cached)",
            |s| s.keys_found,
        ),
        (
            "ailb_prefix_keys_exact",
            "Of keys_found, those whose longest prefix an engine reports held now (precise mode; the rest were found through evicted holders)",
            |s| s.keys_exact,
        ),
        ("ailb_prefix_keys_sent", "Keys the connects carried, summed", |s| s.keys_sent),
        (
            "ailb_prefix_map_lookups",
            "Lookups in the prefix map by the searches (over lookups: the cost the filter leaves)",
            |s| s.map_lookups,
        ),
    ];
    for (name, help, field) in counters {
        let mut fam = enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
        for m in with_mode() {
            ConstCounter::new(field(&m.prefix.stats))
                .encode(fam.encode_family(&ModelLabel { model: m.name.clone() })?)?;
        }
    }
    Ok(())
}

/// A counter family by `reason`.
fn reason_counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut fam = enc.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
    for (reason, v) in values {
        ConstCounter::new(*v).encode(fam.encode_family(&ReasonLabel { reason: reason.to_string() })?)?;
    }
    Ok(())
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v as i64);
    let m = enc.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

/// The TC datapath's flow table and counters (remote clients); nothing while it is off.
fn encode_tc(tc: &crate::datapath::tc::TcStatus, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let s = &tc.stats;
    gauge(enc, "ailb_tc_flows", "Remote flows open in the TC datapath (forward entries, both families)", tc.flows)?;
    gauge(enc, "ailb_tc_flows_ipv6", "Of ailb_tc_flows, the IPv6 ones", tc.flows_ipv6)?;
    gauge(enc, "ailb_tc_flows_counted", "Remote flows counted in flight (no FIN, RST or idle end yet)", tc.counted)?;
    gauge(enc, "ailb_tc_nat_ports_in_use", "Reply entries: in masquerade mode, the NAT ports in use", tc.nat_ports)?;
    counter(enc, "ailb_tc_flows_opened", "Remote flows opened (SYNs to a VIP that got a backend)", s.flows_opened)?;
    reason_counters(
        enc,
        "ailb_tc_flows_ended",
        "Remote flows ended (uncounted), by what ended them: fin, rst, idle (the reclaim)",
        &[("fin", s.ended_fin()), ("rst", s.ended_rst), ("idle", s.ended_idle)],
    )?;
    reason_counters(
        enc,
        "ailb_tc_dropped",
        "Packets the TC datapath dropped, by reason: flows_full and nat_exhausted (SYNs), refused (the pick \
         found no backend or fit), malformed (bad headers or checksum, a fragment)",
        &[
            ("flows_full", s.flows_full),
            ("nat_exhausted", s.nat_exhausted),
            ("refused", s.refused),
            ("malformed", s.malformed),
        ],
    )?;
    counter(enc, "ailb_tc_redirected", "Packets rewritten and redirected to the FIB's next hop", s.redirected)?;
    counter(enc, "ailb_tc_to_stack", "Packets rewritten and handed to this host's stack", s.to_stack)
}

fn encode_status(
    st: &crate::datapath::status::Status,
    loads: &BTreeMap<String, ModelLoad>,
    mut enc: DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    encode_models(st, loads, &mut enc)?;
    if let Some(tc) = &st.tc {
        encode_tc(tc, &mut enc)?;
    }
    let s = &st.stats;
    for (name, help, v) in [
        ("ailb_kernel_picks", "Connects to a VIP that got a backend", s.picks),
        ("ailb_kernel_affinity_hits", "Picks that reused the conversation's backend", s.affinity_hits),
        ("ailb_kernel_affinity_breaks", "Affinity entries that could not be honoured", s.affinity_breaks),
        ("ailb_kernel_spills", "Picks that skipped an over-bound first slot", s.spills),
        ("ailb_kernel_fallbacks", "Picks that fell back to the member scan (the least loaded member that fits now, or where a request that fits nowhere now should finish first)", s.fallbacks),
        ("ailb_kernel_refused_no_backend", "Connects refused: no live backend", s.no_backend),
        ("ailb_kernel_refused_no_fit", "Connects refused: no backend fits the memory hint", s.no_fit),
        ("ailb_kernel_established", "Balanced connections established", s.established),
        ("ailb_kernel_closed", "Balanced connections closed", s.closed),
        ("ailb_kernel_connect_failures", "Balanced connects that failed", s.connect_failures),
        ("ailb_kernel_sockopts", "Accepted SOL_AILB options", s.sockopts),
        ("ailb_kernel_bad_sockopts", "Rejected SOL_AILB options", s.bad_sockopts),
    ] {
        counter(&mut enc, name, help, v)?;
    }
    let g = ConstGauge::new(0i64);
    let mut fam = enc.encode_descriptor(
        "ailb_backend_inflight",
        "In-flight connections per backend (kernel)",
        None,
        g.metric_type(),
    )?;
    for m in &st.models {
        for b in &m.backends {
            let labels = BackendLabel { model: m.name.clone(), backend: b.address.clone() };
            ConstGauge::new(b.inflight as i64).encode(fam.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
