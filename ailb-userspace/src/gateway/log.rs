//! One request's metrics and access-log line (`tracing`, target `ailb::gateway::access`):
//! model, status, backend, conversation hash, time to first byte and duration; with tenants
//! configured, the tenant, the priority and the time waited in the scheduler's queue.

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Method;

use super::metrics::{GatewayMetrics, ModelLabel, ModelSeries, StatusLabel};

/// The access log's target.
const ACCESS: &str = "ailb::gateway::access";

/// Opened when a request's head arrives; [`RequestLog::finish`] (once) counts and logs it.
pub struct RequestLog {
    metrics: Arc<GatewayMetrics>,
    /// The method and path for the access line, kept only while that line is enabled.
    line: Option<(Method, String)>,
    started: Instant,
    /// The catalog model's series, once the request is known to be for one.
    series: Option<Arc<ModelSeries>>,
    /// The model's name otherwise ("" when unknown yet), which labels its series.
    model: String,
    status: u16,
    backend: Option<SocketAddrV4>,
    conversation: Option<u64>,
    ttfb: Option<Duration>,
    in_flight: bool,
    /// The tenant and priority (tenants configured).
    tenant: Option<(Arc<str>, u8)>,
    /// Time waited in the scheduler's queue.
    queued: Option<Duration>,
}

impl RequestLog {
    pub fn start(metrics: Arc<GatewayMetrics>, method: &Method, path: &str) -> Self {
        let line = tracing::enabled!(target: ACCESS, tracing::Level::INFO).then(|| (method.clone(), path.to_string()));
        Self {
            metrics,
            line,
            started: Instant::now(),
            series: None,
            model: String::new(),
            status: 0,
            backend: None,
            conversation: None,
            ttfb: None,
            in_flight: false,
            tenant: None,
            queued: None,
        }
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// The request is being proxied for the catalog's model of `series` now (counted in
    /// flight until finished).
    pub fn proxying(&mut self, series: &Arc<ModelSeries>, conversation: Option<u64>) {
        series.in_flight(&self.metrics).inc();
        self.series = Some(series.clone());
        self.conversation = conversation;
        self.in_flight = true;
    }

    /// The request names `model`, which the catalog does not have.
    pub fn model(&mut self, model: &str) {
        self.model = model.to_string();
    }

    /// The request's tenant and priority.
    pub fn tenant(&mut self, tenant: Arc<str>, priority: u8) {
        self.tenant = Some((tenant, priority));
    }

    /// The request waited `d` in the scheduler's queue before it was admitted.
    pub fn waited(&mut self, d: Duration) {
        self.queued = Some(d);
    }

    pub fn upstream(&mut self, backend: SocketAddrV4, status: u16) {
        self.backend = Some(backend);
        self.status = status;
    }

    pub fn status(&mut self, status: u16) {
        self.status = status;
    }

    /// The first body byte arrived `after` the request's head (only the first call counts).
    pub fn first_byte(&mut self, after: Duration) {
        if self.ttfb.is_none() {
            self.ttfb = Some(after);
            let secs = after.as_secs_f64();
            match &self.series {
                Some(s) => s.ttfb(&self.metrics).observe(secs),
                None => self.metrics.ttfb_seconds.get_or_create(&self.label()).observe(secs),
            }
        }
    }

    fn label(&self) -> ModelLabel {
        ModelLabel { model: self.model.clone() }
    }

    pub fn finish(self, outcome: &'static str) {
        let duration = self.started.elapsed();
        let m = &*self.metrics;
        match &self.series {
            Some(s) => {
                if self.in_flight {
                    s.in_flight(m).dec();
                }
                s.duration(m).observe(duration.as_secs_f64());
                s.answered(m, self.status);
            }
            None => {
                m.duration_seconds.get_or_create(&self.label()).observe(duration.as_secs_f64());
                m.requests.get_or_create(&StatusLabel { model: self.model.clone(), status: self.status }).inc();
            }
        }
        let Some((method, path)) = &self.line else { return };
        tracing::info!(
            target: ACCESS,
            %method,
            %path,
            model = %self.series.as_ref().map_or(self.model.as_str(), |s| s.model()),
            status = self.status,
            backend = %self.backend.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
            conversation = %self.conversation.map(|h| format!("{h:#018x}")).unwrap_or_else(|| "-".into()),
            ttfb_ms = self.ttfb.map(ms),
            duration_ms = ms(duration),
            outcome,
            tenant = self.tenant.as_ref().map(|t| &*t.0),
            priority = self.tenant.as_ref().map(|t| t.1),
            queued_ms = self.queued.map(ms),
        );
    }
}

/// Milliseconds to the microsecond (a log line needs no more digits than that).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests;
