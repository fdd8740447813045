//! Prometheus metrics, registered on a registry passed in. Names `ailb_*`, counters end in
//! `_total`, durations in `_seconds`. The kernel's counters are read from the pinned maps at
//! scrape time by [`KernelCollector`].

use std::path::PathBuf;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

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
        m
    }
}

/// Reads the pinned maps on every scrape: the kernel counters and per-backend in-flight counts.
#[derive(Debug)]
pub struct KernelCollector {
    pub bpffs: PathBuf,
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
        encode_status(&st, enc)
    }
}

/// What [`KernelCollector`] serves for a status already read from the pinned maps. Lets a
/// check without a kernel (the deployment files' test) encode every kernel metric the daemon's
/// `/metrics` serves.
#[derive(Debug)]
pub struct StatusCollector(pub crate::datapath::status::Status);

impl Collector for StatusCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_status(&self.0, enc)
    }
}

fn encode_status(st: &crate::datapath::status::Status, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
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
