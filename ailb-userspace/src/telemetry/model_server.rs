//! Load and health of a model server (vLLM, SGLang, or any server with Prometheus gauges).
//!
//! One `sample()` fetches the metrics and the health endpoint concurrently:
//! - health endpoint answers 2xx: healthy; any other status, refused, timed out: not healthy;
//! - metrics unreachable (refused, timed out before an answer): the sample says `healthy = false`
//!   with no load values, so the agent can publish the instance as unhealthy at once;
//! - metrics answer that is not 2xx, over [`MAX_BODY`], or not exposition text: an error, because
//!   a server that answers is up and the problem is the configuration or the server's metrics.
//!
//! Without a health URL, health is "the metrics endpoint answered 2xx".

use std::time::Duration;

/// The URL type of [`ModelServerSource::new`] (reqwest's), re-exported for callers.
pub use reqwest::Url;
use reqwest::{Client, Response};

use super::{exposition, ServerSample, TelemetryError};

/// The largest metrics body read. vLLM's `/metrics` is tens of KiB (a few hundred histogram
/// buckets per model); 8 MiB leaves room for many models and LoRA adapters and still bounds the
/// agent's memory against a misconfigured URL (a file download).
pub const MAX_BODY: usize = 8 * 1024 * 1024;

/// Which metric names carry the load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerKind {
    /// `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
    /// (before vLLM 0.10: `vllm:gpu_cache_usage_perc`).
    Vllm,
    /// `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.
    Sglang,
    /// Any server: the gauges' names.
    Custom { running: String, waiting: String, kv_cache_usage: Option<String> },
}

impl ServerKind {
    /// (running, waiting, kv-cache usage in order of preference).
    fn names(&self) -> (&str, &str, Vec<&str>) {
        match self {
            ServerKind::Vllm => (
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                vec!["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            ),
            ServerKind::Sglang => ("sglang:num_running_reqs", "sglang:num_queue_reqs", vec!["sglang:token_usage"]),
            ServerKind::Custom { running, waiting, kv_cache_usage } => {
                (running, waiting, kv_cache_usage.iter().map(String::as_str).collect())
            }
        }
    }
}

/// Scrapes one model server.
#[derive(Debug, Clone)]
pub struct ModelServerSource {
    client: Client,
    metrics_url: Url,
    health_url: Option<Url>,
    kind: ServerKind,
}

impl ModelServerSource {
    /// `timeout` bounds each request, connect to last byte.
    pub fn new(
        metrics_url: Url,
        health_url: Option<Url>,
        kind: ServerKind,
        timeout: Duration,
    ) -> Result<Self, TelemetryError> {
        let client =
            Client::builder().timeout(timeout).connect_timeout(timeout).build().map_err(TelemetryError::Client)?;
        Ok(ModelServerSource { client, metrics_url, health_url, kind })
    }

    pub fn metrics_url(&self) -> &Url {
        &self.metrics_url
    }

    pub fn health_url(&self) -> Option<&Url> {
        self.health_url.as_ref()
    }

    pub fn kind(&self) -> &ServerKind {
        &self.kind
    }

    /// Metrics and health now.
    pub async fn sample(&self) -> Result<ServerSample, TelemetryError> {
        let health = async {
            match &self.health_url {
                Some(url) => Some(self.healthy(url).await),
                None => None,
            }
        };
        let (metrics, health) = tokio::join!(self.scrape(), health);
        let Some(samples) = metrics? else {
            return Ok(ServerSample { healthy: false, ..ServerSample::default() });
        };
        let (running, waiting, kv) = self.kind.names();
        Ok(ServerSample {
            running: sum(&samples, running),
            waiting: sum(&samples, waiting),
            kv_cache_usage: kv.into_iter().find_map(|name| mean(&samples, name)),
            healthy: health.unwrap_or(true),
        })
    }

    async fn healthy(&self, url: &Url) -> bool {
        match self.client.get(url.clone()).send().await {
            Ok(r) => r.status().is_success(),
            Err(e) => {
                tracing::debug!(url = %url, error = %e, "health check failed");
                false
            }
        }
    }

    /// `Ok(None)`: the server did not answer.
    async fn scrape(&self) -> Result<Option<Vec<exposition::Sample>>, TelemetryError> {
        let url = &self.metrics_url;
        let resp = match self.client.get(url.clone()).send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() || e.is_timeout() => {
                tracing::debug!(url = %url, error = %e, "metrics endpoint unreachable");
                return Ok(None);
            }
            Err(source) => return Err(TelemetryError::MetricsRequest { url: url.clone(), source }),
        };
        if !resp.status().is_success() {
            return Err(TelemetryError::MetricsStatus { url: url.clone(), status: resp.status() });
        }
        let body = read_bounded(resp, url).await?;
        let text = String::from_utf8_lossy(&body);
        exposition::parse(&text).map(Some).map_err(|e| TelemetryError::MetricsParse {
            url: url.clone(),
            line: e.line,
            reason: e.reason,
        })
    }
}

async fn read_bounded(mut resp: Response, url: &Url) -> Result<Vec<u8>, TelemetryError> {
    let too_large = || TelemetryError::MetricsTooLarge { url: url.clone(), limit: MAX_BODY };
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|source| TelemetryError::MetricsRequest { url: url.clone(), source })?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Sum over every label set (one per model name, LoRA adapter or engine): requests add up.
fn sum(samples: &[exposition::Sample], name: &str) -> Option<f64> {
    let mut it = samples.iter().filter(|s| s.name == name).map(|s| s.value).peekable();
    it.peek()?;
    Some(it.sum())
}

/// Mean over label sets: each engine's KV cache usage is a fraction of its own cache, and the
/// engines of one server (data-parallel ranks) have caches of one size, so the mean is the
/// fraction of the server's whole cache in use. A sum could exceed 1.
fn mean(samples: &[exposition::Sample], name: &str) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter(|s| s.name == name).map(|s| s.value).collect();
    if values.is_empty() {
        return None;
    }
    Some(values.iter().sum::<f64>() / values.len() as f64)
}
