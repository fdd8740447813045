//! The failure threshold of an instance's health, as Kubernetes' probes have one: a server
//! whose probe timed out is published unhealthy only after `health_failure_threshold` such
//! samples in a row, and until then its last healthy sample stands (so nothing moves and
//! nothing is published). A loaded machine makes probes late without the server being down:
//! on the soak's two shared cores, 200 ms probes timed out for up to seven samples in a row on
//! servers that went on answering requests, and the backends that left the table took the
//! only GPUs large enough for the longest requests with them. A server that refused the
//! connection, answered its health endpoint with an error, or whose metrics answered is
//! judged at once: it said so itself.

use tracing::{info, warn};

use crate::telemetry::ServerSample;

/// Samples of one instance, filtered by the threshold.
#[derive(Debug, Default)]
pub struct HealthGate {
    /// Timed-out samples in a row.
    timeouts: u32,
    /// The last sample that was healthy.
    last_healthy: Option<ServerSample>,
}

impl HealthGate {
    /// What the agent goes on with: `s` itself, or while `s` timed out fewer than `threshold`
    /// times in a row after a healthy sample, that healthy sample. `instance` names it in logs.
    pub fn filter(&mut self, s: ServerSample, threshold: u32, instance: &str) -> ServerSample {
        if s.healthy {
            if self.timeouts > 0 {
                info!(instance, timeouts = self.timeouts, "agent: health probe answered again");
            }
            self.timeouts = 0;
            self.last_healthy = Some(s.clone());
            return s;
        }
        if !s.timed_out {
            self.timeouts = 0;
            self.last_healthy = None;
            return s;
        }
        self.timeouts = self.timeouts.saturating_add(1);
        match &self.last_healthy {
            Some(last) if self.timeouts < threshold => {
                info!(instance, timeouts = self.timeouts, threshold, "agent: health probe timed out; still healthy");
                last.clone()
            }
            _ => {
                if self.timeouts == threshold {
                    warn!(instance, timeouts = self.timeouts, "agent: health probe timed out too often: unhealthy");
                }
                self.last_healthy = None;
                s
            }
        }
    }
}

#[cfg(test)]
mod tests;
