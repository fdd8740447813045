//! The agent's own metrics, registered on a registry passed in.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::telemetry::source::SampleSource;

/// Which source an error came from (a metric label: fixed names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    Nvml,
    Scrape,
    Nacos,
}

impl ErrorSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::Scrape => "scrape",
            Self::Nacos => "nacos",
        }
    }
}

impl From<SampleSource> for ErrorSource {
    fn from(s: SampleSource) -> Self {
        match s {
            SampleSource::Nvml => Self::Nvml,
            SampleSource::Scrape => Self::Scrape,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct AgentMetrics {
    /// Registrations written (first, on a moved value, after an error or a 20404).
    pub publishes: Counter,
    pub beats: Counter,
    /// Beats answered "no such instance" (20404), each followed by a registration.
    pub beat_not_found: Counter,
    pub errors: Family<SourceLabel, Counter>,
    /// Seconds since the oldest of the instances' last successful publish.
    pub last_publish_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub draining: Gauge,
}

impl AgentMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register("ailb_agent_publishes", "Nacos registrations with metadata written", m.publishes.clone());
        registry.register("ailb_agent_beats", "Nacos heartbeats sent successfully", m.beats.clone());
        registry.register(
            "ailb_agent_beat_not_found",
            "heartbeats answered 20404 (instance unknown), then registered again",
            m.beat_not_found.clone(),
        );
        registry.register("ailb_agent_errors", "errors by source (nvml, scrape, nacos)", m.errors.clone());
        registry.register(
            "ailb_agent_last_publish_age_seconds",
            "seconds since the least recent instance's last successful publish",
            m.last_publish_age_seconds.clone(),
        );
        registry.register("ailb_agent_draining", "1 while draining after SIGTERM", m.draining.clone());
        for s in [ErrorSource::Nvml, ErrorSource::Scrape, ErrorSource::Nacos] {
            drop(m.errors.get_or_create(&SourceLabel { source: s.label() }));
        }
        m
    }

    pub fn error(&self, s: ErrorSource) {
        self.errors.get_or_create(&SourceLabel { source: s.label() }).inc();
    }
}
