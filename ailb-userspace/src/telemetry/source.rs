//! The node sampler's seam: [`Telemetry`] gives one [`NodeSample`] per call, with the errors met
//! on the way (each source fails alone: a failed scrape leaves the GPU values, a failed NVML read
//! leaves the server's). [`NodeSource`] is the real one: [`super::nvml`] and
//! [`super::model_server`]. The agent and the one-box daemon both sample through it.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    instance::GpuRef,
    model_server::ModelServerSource,
    nvml::{DeviceSelector, NvmlSource},
    NodeSample, ServerSample,
};
use crate::error_chain;

/// Which part of a sample an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleSource {
    Nvml,
    Scrape,
}

impl SampleSource {
    pub fn label(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::Scrape => "scrape",
        }
    }
}

/// A sample and what went wrong taking it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub sample: NodeSample,
    pub errors: Vec<(SampleSource, String)>,
}

/// One instance's telemetry. Async only here, at the I/O edge.
pub trait Telemetry: Send {
    fn sample(&mut self) -> impl Future<Output = Sampled> + Send;
}

/// The real sources of one instance: its model server (metrics and health) and, unless the
/// config says `nvml = false`, its GPUs through NVML (opened once, shared by the instances).
pub struct NodeSource {
    pub server: ModelServerSource,
    pub nvml: Option<(Arc<NvmlSource>, Vec<DeviceSelector>)>,
    prefix: PrefixWindow,
    prompts: PromptRate,
}

/// How long the prompt-token rate is smoothed over by default: a prompt is thousands of tokens
/// at once, so the rate between two samples jumps from nothing to a cache-filling rate; over
/// half a minute it is the rate the cache turns over at, which is what the prefix lifetime is
/// set from (`policy::prefix::fill_time_lifetime`).
pub const DEFAULT_PROMPT_RATE_WINDOW: Duration = Duration::from_secs(30);

/// The prompt tokens per second a server is sent, from its cumulative counter (vLLM's
/// `vllm:prefix_cache_queries_total`: the prompt tokens looked up in its prefix cache), as an
/// exponential average over `window`: each sample's rate since the previous one weighs
/// `1 - exp(-dt / window)`.
#[derive(Debug)]
pub struct PromptRate {
    window: Duration,
    /// The counter at the previous sample, and when it was read.
    last: Option<(Instant, f64)>,
    rate: Option<f64>,
}

impl PromptRate {
    pub fn new(window: Duration) -> Self {
        Self { window, last: None, rate: None }
    }

    /// The smoothed rate once the counter read `tokens` at `now`: none until two samples, and
    /// none again while the server exports no counter. A counter that went back (a restarted
    /// server) starts a new interval and keeps the rate.
    pub fn update(&mut self, now: Instant, tokens: Option<f64>) -> Option<f64> {
        let Some(tokens) = tokens.filter(|t| t.is_finite() && *t >= 0.0) else {
            *self = Self::new(self.window);
            return None;
        };
        if let Some((t0, c0)) = self.last {
            let dt = now.saturating_duration_since(t0).as_secs_f64();
            if dt <= 0.0 {
                return self.rate;
            }
            if tokens >= c0 {
                let r = (tokens - c0) / dt;
                let alpha = 1.0 - (-dt / self.window.as_secs_f64().max(1e-3)).exp();
                self.rate = Some(self.rate.map_or(r, |p| p + alpha * (r - p)));
            }
        }
        self.last = Some((now, tokens));
        self.rate
    }
}

/// The prefix-cache hit rate over the window between two scrapes, from cumulative counters:
/// the rate a router can act on (a server's lifetime ratio barely moves after an hour).
#[derive(Debug, Default)]
struct PrefixWindow {
    /// The counters (hits, queries) at the previous scrape.
    last: Option<(f64, f64)>,
    /// The last rate: kept while no prompt was looked up since (no new evidence).
    rate: Option<f64>,
}

impl PrefixWindow {
    /// The rate for counters read now. The first scrape, and one after the counters went back
    /// (a restarted server), use the counters as they are: the rate since the server started.
    fn update(&mut self, now: Option<(f64, f64)>) -> Option<f64> {
        let Some((hits, queries)) = now.filter(|(h, q)| h.is_finite() && q.is_finite() && *h >= 0.0 && *q >= 0.0)
        else {
            self.last = None;
            self.rate = None;
            return None;
        };
        let (dh, dq) = match self.last {
            Some((h0, q0)) if hits >= h0 && queries >= q0 => (hits - h0, queries - q0),
            _ => (hits, queries),
        };
        self.last = Some((hits, queries));
        if dq > 0.0 {
            self.rate = Some((dh / dq).clamp(0.0, 1.0));
        }
        self.rate
    }
}

impl NodeSource {
    pub fn new(server: ModelServerSource, nvml: Option<(Arc<NvmlSource>, Vec<DeviceSelector>)>) -> Self {
        Self { server, nvml, prefix: PrefixWindow::default(), prompts: PromptRate::new(DEFAULT_PROMPT_RATE_WINDOW) }
    }

    /// The same, with the prompt-token rate smoothed over `window`.
    pub fn with_prompt_rate_window(mut self, window: Duration) -> Self {
        self.prompts = PromptRate::new(window);
        self
    }

    pub fn selector(g: &GpuRef) -> DeviceSelector {
        match g {
            GpuRef::Index(i) => DeviceSelector::Index(*i),
            GpuRef::Uuid(u) => DeviceSelector::Uuid(u.clone()),
        }
    }
}

impl Telemetry for NodeSource {
    async fn sample(&mut self) -> Sampled {
        let mut errors = Vec::new();
        let server = match self.server.sample().await {
            Ok(mut s) => {
                if s.prefix_cache_counters.is_some() || s.prefix_cache_hit_rate.is_none() {
                    s.prefix_cache_hit_rate = self.prefix.update(s.prefix_cache_counters);
                }
                s.prompt_tokens_per_s = self.prompts.update(Instant::now(), s.prefix_cache_counters.map(|c| c.1));
                s
            }
            Err(e) => {
                errors.push((SampleSource::Scrape, error_chain(&e)));
                // The server answered (wrongly): it is up, its load is unknown.
                ServerSample { healthy: true, ..ServerSample::default() }
            }
        };
        let mut gpus = Vec::new();
        if let Some((nvml, selectors)) = &self.nvml {
            // NVML answers in microseconds (ioctls): called inline. One failed GPU leaves the
            // memory unknown rather than counting part of the instance's GPUs.
            match selectors.iter().map(|s| nvml.sample(s)).collect::<Result<Vec<_>, _>>() {
                Ok(g) => gpus = g,
                Err(e) => errors.push((SampleSource::Nvml, error_chain(&e))),
            }
        }
        Sampled { sample: NodeSample { gpus, server }, errors }
    }
}

#[cfg(test)]
mod tests;
