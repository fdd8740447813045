//! The front door's metrics, per model: requests by status, time to first byte, total
//! duration and requests in flight. Registered on a registry passed in.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{
    counter::Counter,
    family::{Family, MetricConstructor},
    gauge::Gauge,
    histogram::{exponential_buckets, Histogram},
};
use prometheus_client::registry::Registry;

pub use crate::metrics::ModelLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub model: String,
    pub status: u16,
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

#[derive(Clone, Debug)]
pub struct GatewayMetrics {
    pub requests: Family<StatusLabel, Counter>,
    pub ttfb_seconds: Family<ModelLabel, Histogram, Buckets>,
    pub duration_seconds: Family<ModelLabel, Histogram, Buckets>,
    pub in_flight: Family<ModelLabel, Gauge>,
    pub upstream_connections: Family<ReuseLabel, Counter>,
}

impl GatewayMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            ttfb_seconds: Family::new_with_constructor(Buckets),
            duration_seconds: Family::new_with_constructor(Buckets),
            in_flight: Family::default(),
            upstream_connections: Family::default(),
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
        registry.register("ailb_gateway_in_flight", "Requests being proxied now", m.in_flight.clone());
        registry.register(
            "ailb_gateway_upstream_requests",
            "Requests sent upstream, on a fresh connection (reused=false, a new kernel pick) or on an idle one \
             with the same routing inputs (reused=true)",
            m.upstream_connections.clone(),
        );
        m
    }
}
