//! `GET /metrics`: the simulated GPU's state under vLLM's metric names, labels and text format
//! (checked against vLLM 0.32.0 by the `vllm_telemetry` integration test): every sample labelled
//! with `engine="0"` and `model_name`, counters named `..._total` in their `HELP` and `TYPE` lines
//! too, `vllm:request_success_total` by `finished_reason` (a request whose client went away counts
//! in none, as in vLLM 0.32.0), and the `vllm:cache_config_info` info
//! gauge whose `num_gpu_blocks` and `block_size` give the KV cache's capacity.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::App;
use crate::gpu::{Counters, BLOCK_TOKENS};

/// What one scrape reports.
pub(super) struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub kv_blocks_total: u64,
    pub counters: Counters,
    /// Running requests whose client went away (vLLM counts them in no `finished_reason`).
    pub aborted: u64,
}

/// A label value as the exposition format quotes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The exposition text of `s` for the served `model`.
pub(super) fn exposition(model: &str, s: &Snapshot) -> String {
    let c = &s.counters;
    let labels = format!("engine=\"0\",model_name=\"{}\"", escape(model));
    let mut out = String::new();
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    };
    let gauges = [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", s.running.to_string()),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting.to_string()),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", format!("{}", s.kv_usage)),
    ];
    for (name, help, value) in gauges {
        head(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    let counters = [
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            c.prefix_query_tokens,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            c.prefix_hit_tokens,
        ),
        ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", c.prompt_tokens_total),
        ("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local + external).", c.prefix_hit_tokens),
        ("vllm:generation_tokens_total", "Number of generation tokens processed.", c.generation_tokens_total),
    ];
    for (name, help, value) in counters {
        head(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    // The GPU model ends a sequence whether its last token was sent or its client left; vLLM
    // 0.32.0 counts only the first (a client's abort, running or queued, is counted nowhere:
    // `abort` counts what the engine itself aborts, which the simulator never does).
    let name = "vllm:request_success_total";
    head(&mut out, name, "counter", "Count of successfully processed requests.");
    let length = c.finished_total.saturating_sub(s.aborted);
    for (reason, value) in [("length", length), ("abort", 0)] {
        let _ = writeln!(
            out,
            "{name}{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"{}\"}} {value}",
            escape(model)
        );
    }
    let name = "vllm:cache_config_info";
    head(&mut out, name, "gauge", "Information of the LLMEngine CacheConfig");
    let _ = writeln!(
        out,
        "{name}{{block_size=\"{BLOCK_TOKENS}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",\
         num_gpu_blocks=\"{}\"}} 1.0",
        s.kv_blocks_total
    );
    out
}

pub(super) async fn metrics(State(app): State<Arc<App>>) -> Response {
    let snapshot = {
        let inner = app.lock();
        Snapshot {
            running: inner.gpu.running(),
            waiting: inner.gpu.waiting(),
            kv_usage: inner.gpu.kv_usage(),
            kv_blocks_total: inner.gpu.kv_blocks_total(),
            counters: inner.gpu.counters(),
            aborted: inner.aborted,
        }
    };
    let mut resp = exposition(&app.cfg.model, &snapshot).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_carry_vllms_labels_and_the_cache_config_gives_the_capacity() {
        let counters =
            Counters { finished_total: 5, cancelled_total: 1, prefix_hit_tokens: 512, ..Counters::default() };
        let s = Snapshot { running: 2, waiting: 1, kv_usage: 0.25, kv_blocks_total: 300, counters, aborted: 2 };
        let text = exposition("m\"x", &s);
        for line in [
            "# TYPE vllm:prefix_cache_hits_total counter",
            "vllm:num_requests_running{engine=\"0\",model_name=\"m\\\"x\"} 2",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\\\"x\"} 0.25",
            "vllm:prompt_tokens_cached_total{engine=\"0\",model_name=\"m\\\"x\"} 512",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"m\\\"x\"} 3",
            "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"m\\\"x\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        let info = text.lines().find(|l| l.starts_with("vllm:cache_config_info{")).expect("the info gauge");
        assert!(info.contains(&format!("block_size=\"{BLOCK_TOKENS}\"")) && info.contains("num_gpu_blocks=\"300\""));
        assert!(info.ends_with(" 1.0"), "{info}");
    }
}
