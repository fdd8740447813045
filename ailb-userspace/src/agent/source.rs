//! The agent's telemetry seam: [`Telemetry`] gives one [`NodeSample`] per call, with the
//! errors met on the way (each source fails alone: a failed scrape leaves the GPU values, a
//! failed NVML read leaves the server's). [`ServerSource`] reads a model server's health
//! endpoint and Prometheus text (vLLM or SGLang names) over the gateway's HTTP seam.

use std::future::Future;

use reqwest::Url;

use super::{config::ServerKind, publish::NodeSample};
use crate::{
    discovery::nacos::http::{Method, Request, Transport},
    telemetry::ServerSample,
};

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

/// A sample and what went wrong taking it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub sample: NodeSample,
    pub errors: Vec<(ErrorSource, String)>,
}

/// One instance's telemetry. Async only here, at the I/O edge.
pub trait Telemetry: Send {
    fn sample(&mut self) -> impl Future<Output = Sampled> + Send;
}

/// A model server's `/health` and `/metrics`.
pub struct ServerSource<T: Transport> {
    pub transport: T,
    pub metrics_url: Url,
    pub health_url: Url,
    pub kind: ServerKind,
}

impl<T: Transport> ServerSource<T> {
    async fn get(&self, url: &Url) -> Result<Vec<u8>, String> {
        let req = Request { method: Method::Get, url: url.clone(), headers: Vec::new(), form: Vec::new() };
        let resp = self.transport.send(req).await.map_err(|e| crate::discovery::nacos::error_chain(&e))?;
        if (200..300).contains(&resp.status) {
            Ok(resp.body)
        } else {
            Err(format!("http {}", resp.status))
        }
    }

    /// Health and metrics; `errors` gets the scrape's failure (a health failure is not an
    /// error of the agent: it is what `health_status` reports).
    pub async fn server_sample(&self, errors: &mut Vec<(ErrorSource, String)>) -> ServerSample {
        let healthy = self.get(&self.health_url).await.is_ok();
        let mut s = ServerSample { healthy, ..Default::default() };
        match self.get(&self.metrics_url).await.and_then(|b| parse_metrics(&b, self.kind)) {
            Ok(m) => {
                s.running = m.running;
                s.waiting = m.waiting;
                s.kv_cache_usage = m.kv_cache_usage;
            }
            Err(e) => errors.push((ErrorSource::Scrape, format!("{}: {e}", self.metrics_url))),
        }
        s
    }
}

impl<T: Transport> Telemetry for ServerSource<T> {
    async fn sample(&mut self) -> Sampled {
        let mut errors = Vec::new();
        let server = self.server_sample(&mut errors).await;
        Sampled { sample: NodeSample { gpus: Vec::new(), server }, errors }
    }
}

/// The metric names of each server: running, waiting, KV-cache usage (first found wins).
fn names(kind: ServerKind) -> (&'static str, &'static str, &'static [&'static str]) {
    match kind {
        ServerKind::Vllm => (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        ),
        ServerKind::Sglang => ("sglang:num_running_reqs", "sglang:num_queue_reqs", &["sglang:token_usage"]),
    }
}

/// Reads the three values from Prometheus text: counts are summed over label sets (one per
/// served model name), KV usage is the largest. Any unreadable sample line fails the whole
/// scrape: values from a text that is partly garbage are not trusted.
pub fn parse_metrics(body: &[u8], kind: ServerKind) -> Result<ServerSample, String> {
    let text = std::str::from_utf8(body).map_err(|_| "metrics text is not UTF-8".to_string())?;
    let (run_name, wait_name, kv_names) = names(kind);
    let mut s = ServerSample::default();
    let mut kv: Vec<Option<f64>> = vec![None; kv_names.len()];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ', '\t']) {
            Some(p) if line.as_bytes()[p] == b'{' => {
                let close = line.rfind('}').ok_or_else(|| format!("line {}: unclosed labels", n + 1))?;
                (&line[..p], &line[close + 1..])
            }
            Some(p) => (&line[..p], &line[p..]),
            None => return Err(format!("line {}: no value", n + 1)),
        };
        let value = rest.split_whitespace().next().ok_or_else(|| format!("line {}: no value", n + 1))?;
        let v: f64 = match value {
            "NaN" | "+Inf" | "-Inf" => f64::NAN,
            _ => value.parse().map_err(|_| format!("line {}: value {value:?} is not a number", n + 1))?,
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            return Err(format!("line {}: bad metric name", n + 1));
        }
        let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + v);
        if name == run_name {
            add(&mut s.running);
        } else if name == wait_name {
            add(&mut s.waiting);
        } else if let Some(k) = kv_names.iter().position(|k| *k == name) {
            kv[k] = Some(kv[k].map_or(v, |o: f64| o.max(v)));
        }
    }
    s.kv_cache_usage = kv.into_iter().flatten().next();
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_text() {
        let t = b"# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"a b\"} 3.0\nvllm:num_requests_running{model_name=\"c\"} 2\n\
vllm:num_requests_waiting{model_name=\"a b\"} 1\nvllm:kv_cache_usage_perc{model_name=\"a b\"} 0.5\n\
vllm:gpu_cache_usage_perc 0.9\nother_total 7 1700000000\n";
        let s = parse_metrics(t, ServerKind::Vllm).unwrap();
        assert_eq!((s.running, s.waiting, s.kv_cache_usage), (Some(5.0), Some(1.0), Some(0.5)));
    }

    #[test]
    fn sglang_text() {
        let t = b"sglang:num_running_reqs{x=\"1\"} 4\nsglang:num_queue_reqs 2\nsglang:token_usage 0.1\n";
        let s = parse_metrics(t, ServerKind::Sglang).unwrap();
        assert_eq!((s.running, s.waiting, s.kv_cache_usage), (Some(4.0), Some(2.0), Some(0.1)));
    }

    #[test]
    fn garbage_fails_the_scrape() {
        for t in [&b"vllm:num_requests_running{ 3\n"[..], b"vllm:num_requests_running abc\n", b"junk\n", b"\xff\n"] {
            assert!(parse_metrics(t, ServerKind::Vllm).is_err(), "{:?}", String::from_utf8_lossy(t));
        }
        assert_eq!(parse_metrics(b"", ServerKind::Vllm).unwrap(), ServerSample::default());
    }
}
