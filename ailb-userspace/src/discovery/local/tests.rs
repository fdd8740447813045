use std::sync::{Arc, Mutex};

use axum::{extract::State, routing::get, Router};

use super::*;
use crate::config::Config;

/// A vLLM-like `/metrics` whose running count the test sets; `None`: answers 500.
async fn fake_vllm(running: Arc<Mutex<Option<f64>>>) -> std::net::SocketAddr {
    async fn metrics(State(r): State<Arc<Mutex<Option<f64>>>>) -> (axum::http::StatusCode, String) {
        match *r.lock().unwrap() {
            Some(n) => (
                axum::http::StatusCode::OK,
                format!("vllm:num_requests_running {n}\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"),
            ),
            None => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, String::new()),
        }
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = Router::new().route("/metrics", get(metrics)).with_state(running);
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn backends(metrics: &str) -> Vec<StaticBackend> {
    let text = format!(
            "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n\
             [[backends]]\nmodel = \"m\"\naddress = \"127.0.0.11:18001\"\nmax_inflight = 8\nmetrics_url = \"{metrics}\"\n\
             [[backends]]\nmodel = \"m\"\naddress = \"127.0.0.12:18002\"\nfree_memory_mb = 24000\n"
        );
    Config::parse(&text, "t").unwrap().validate().unwrap().backends
}

#[tokio::test]
async fn samples_become_metadata_renewed_only_past_a_threshold() {
    let running = Arc::new(Mutex::new(Some(2.0)));
    let addr = fake_vllm(running.clone()).await;
    let b = backends(&format!("http://{addr}/metrics"));
    let mut local = LocalTelemetry::new(&b, None, Duration::from_millis(500), None).unwrap().unwrap();
    assert!(local.nvml().is_none(), "no backend names gpus: NVML is not opened");
    let first = local.sample().await;
    assert_eq!(first.keys().copied().collect::<Vec<_>>(), vec![0], "only the backend with metrics_url");
    let m = &first[&0];
    assert_eq!(m.get(keys::CURRENT_REQUESTS).map(String::as_str), Some("2"));
    assert_eq!(m.get(keys::QUEUE_LENGTH).map(String::as_str), Some("1"));
    assert_eq!(m.get(keys::HEALTH_STATUS).map(String::as_str), Some("healthy"));
    assert_eq!(m.get(keys::MAX_INFLIGHT).map(String::as_str), Some("8"), "the declared cap is kept");
    assert_eq!(m.get(keys::MODEL_ID).map(String::as_str), Some("m"));
    assert_eq!(m.contract().max_inflight.valid(), Some(&8));
    // Below the agent's 1-request threshold: the very same metadata (and so no new plan).
    *running.lock().unwrap() = Some(2.5);
    assert_eq!(local.sample().await[&0], *m);
    *running.lock().unwrap() = Some(4.0);
    let moved = local.sample().await;
    assert_eq!(moved[&0].get(keys::CURRENT_REQUESTS).map(String::as_str), Some("4"));
    // A scrape that fails: the server answered, so it is up with its load unknown; the
    // daemon goes on.
    *running.lock().unwrap() = None;
    let failed = local.sample().await;
    assert_eq!(failed[&0].get(keys::CURRENT_REQUESTS), None, "{failed:?}");
    // The snapshot: the sampled backend carries the samples, the declared one its values.
    let snap = super::super::from_static_sampled(&b, &moved);
    assert_eq!(snap.instances[0].metadata, moved[&0]);
    assert_eq!(snap.instances[1].metadata.contract().free_memory_mb.valid(), Some(&24000));
}

#[tokio::test]
async fn a_server_that_does_not_answer_is_unhealthy() {
    // A port nothing listens on (bound, then closed).
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let b = backends(&format!("http://{addr}/metrics"));
    let mut local = LocalTelemetry::new(&b, None, Duration::from_millis(100), None).unwrap().unwrap();
    let m = local.sample().await;
    assert_eq!(m[&0].get(keys::HEALTH_STATUS).map(String::as_str), Some("unhealthy"), "{m:?}");
}

#[test]
fn gpus_without_an_nvml_library_fail_at_start_naming_the_backend() {
    let mut b = backends("http://127.0.0.1:1/metrics");
    let text = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n[[backends]]\nmodel = \"m\"\n\
                    address = \"127.0.0.11:18001\"\nmetrics_url = \"http://127.0.0.1:1/metrics\"\ngpus = [0]\n";
    b[0] = Config::parse(text, "t").unwrap().validate().unwrap().backends.remove(0);
    let e = LocalTelemetry::new(&b, Some(Path::new("/nonexistent/libnvidia-ml.so.1")), Duration::from_secs(1), None)
        .err()
        .expect("no NVML library");
    let chain = crate::error_chain(&e);
    assert!(chain.contains("backend m 127.0.0.11:18001 names gpus") && chain.contains("no NVML library"), "{chain}");
    assert!(LocalTelemetry::new(&b[1..], None, Duration::from_secs(1), None).unwrap().is_none());
}
