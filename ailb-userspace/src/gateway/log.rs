//! One request's metrics and access-log line (`tracing`, target `ailb::gateway::access`):
//! model, status, backend, conversation hash, time to first byte and duration.

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{GatewayMetrics, ModelLabel, StatusLabel};

/// Opened when a request's head arrives; [`RequestLog::finish`] (once) counts and logs it.
pub struct RequestLog {
    metrics: Arc<GatewayMetrics>,
    method: String,
    path: String,
    started: Instant,
    model: String,
    status: u16,
    backend: Option<SocketAddrV4>,
    conversation: Option<u64>,
    ttfb: Option<Duration>,
    in_flight: bool,
}

impl RequestLog {
    pub fn start(metrics: Arc<GatewayMetrics>, method: &str, path: &str) -> Self {
        Self {
            metrics,
            method: method.to_string(),
            path: path.to_string(),
            started: Instant::now(),
            model: String::new(),
            status: 0,
            backend: None,
            conversation: None,
            ttfb: None,
            in_flight: false,
        }
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// The request is being proxied for `model` now (counted in flight until finished).
    pub fn proxying(&mut self, model: &str, conversation: Option<u64>) {
        self.model = model.to_string();
        self.conversation = conversation;
        self.metrics.in_flight.get_or_create(&ModelLabel { model: self.model.clone() }).inc();
        self.in_flight = true;
    }

    pub fn model(&mut self, model: &str) {
        self.model = model.to_string();
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
            let label = ModelLabel { model: self.model.clone() };
            self.metrics.ttfb_seconds.get_or_create(&label).observe(after.as_secs_f64());
        }
    }

    pub fn finish(self, outcome: &'static str) {
        let duration = self.started.elapsed();
        let label = ModelLabel { model: self.model.clone() };
        if self.in_flight {
            self.metrics.in_flight.get_or_create(&label).dec();
        }
        self.metrics.duration_seconds.get_or_create(&label).observe(duration.as_secs_f64());
        self.metrics.requests.get_or_create(&StatusLabel { model: self.model.clone(), status: self.status }).inc();
        tracing::info!(
            target: "ailb::gateway::access",
            method = %self.method,
            path = %self.path,
            model = %self.model,
            status = self.status,
            backend = %self.backend.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
            conversation = %self.conversation.map(|h| format!("{h:#018x}")).unwrap_or_else(|| "-".into()),
            ttfb_ms = self.ttfb.map(ms),
            duration_ms = ms(duration),
            outcome,
        );
    }
}

/// Milliseconds to the microsecond (a log line needs no more digits than that).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_are_logged_to_the_microsecond() {
        assert_eq!(super::ms(std::time::Duration::from_nanos(1_234_567_891)), 1234.568);
        assert_eq!(super::ms(std::time::Duration::from_nanos(499)), 0.0);
    }
}
