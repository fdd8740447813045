//! The loop against a fake Nacos transport and fake telemetry: what is written, when.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
};

use super::{
    config::{AgentConfig, ValidAgent},
    metrics::AgentMetrics,
    Agent,
};
use crate::{
    nacos::http::{Method, Request, Response, Transport, TransportError},
    telemetry::{
        source::{SampleSource, Sampled, Telemetry},
        GpuSample, NodeSample, ServerSample,
    },
};

#[derive(Clone, Default)]
struct FakeNacos {
    log: Arc<Mutex<Vec<Request>>>,
    down: Arc<AtomicBool>,
    forget: Arc<AtomicBool>,
    /// Answers the v3 client API (else 404 there, as a v1-only server).
    v3: Arc<AtomicBool>,
}

impl FakeNacos {
    fn calls(&self, method: Method, path_end: &str) -> Vec<Request> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|r| r.method == method && r.url.path().ends_with(path_end)).cloned().collect()
    }
    fn registrations(&self) -> Vec<Request> {
        self.calls(Method::Post, "/ns/instance")
    }
    fn last_metadata(&self) -> serde_json::Value {
        let r = self.registrations().pop().expect("a registration");
        let m = r.form.iter().find(|(k, _)| *k == "metadata").expect("metadata").1.clone();
        serde_json::from_str(&m).unwrap()
    }
    fn last_form(&self, key: &str) -> String {
        let r = self.registrations().pop().expect("a registration");
        r.form.iter().find(|(k, _)| *k == key).expect("field").1.clone()
    }
}

impl Transport for FakeNacos {
    async fn send(&self, req: Request) -> Result<Response, TransportError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(TransportError::Other("connection refused".into()));
        }
        let beat = req.url.path().ends_with("/beat");
        let v3 = req.url.path().contains("/v3/");
        let v3_beat = v3 && req.url.query_pairs().any(|(k, v)| k == "heartBeat" && v == "true");
        self.log.lock().unwrap().push(req);
        if v3 && !self.v3.load(Ordering::SeqCst) {
            return Ok(Response { status: 404, body: b"not found".to_vec() });
        }
        if v3 {
            let code = if v3_beat && self.forget.load(Ordering::SeqCst) { 21001 } else { 0 };
            return Ok(Response { status: 200, body: format!(r#"{{"code":{code},"data":"ok"}}"#).into_bytes() });
        }
        let body = if beat && self.forget.load(Ordering::SeqCst) {
            br#"{"code":20404}"#.to_vec()
        } else if beat {
            br#"{"code":10200,"clientBeatInterval":5000}"#.to_vec()
        } else {
            b"ok".to_vec()
        };
        Ok(Response { status: 200, body })
    }
}

#[derive(Clone)]
struct FakeTelemetry(Arc<Mutex<Sampled>>);

impl Telemetry for FakeTelemetry {
    async fn sample(&mut self) -> Sampled {
        self.0.lock().unwrap().clone()
    }
}

fn sampled(free_mb: u64, util: u32, running: f64) -> Sampled {
    Sampled {
        sample: NodeSample {
            gpus: vec![GpuSample {
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_total_mb: 81559,
                memory_free_mb: free_mb,
                util_pct: util,
                ..Default::default()
            }],
            server: ServerSample {
                running: Some(running),
                waiting: Some(0.0),
                kv_cache_usage: Some(0.1),
                healthy: true,
                ..Default::default()
            },
        },
        errors: Vec::new(),
    }
}

fn cfg(heartbeat: &str, api: &str) -> ValidAgent {
    let c: AgentConfig = toml::from_str(&format!(
        r#"
heartbeat_interval = "{heartbeat}"
[nacos]
servers = ["http://127.0.0.1:8848"]
api = "{api}"
[[instances]]
service = "llama"
ip = "10.0.0.7"
port = 8000
model_id = "llama"
gpus = [0]
metrics_url = "http://127.0.0.1:8000/metrics"
health_url = "http://127.0.0.1:8000/health"
"#
    ))
    .unwrap();
    c.validate().unwrap()
}

fn agent(heartbeat: &str) -> (Agent<FakeNacos, FakeTelemetry>, FakeNacos, Arc<Mutex<Sampled>>) {
    agent_api(heartbeat, "v1")
}

fn agent_api(heartbeat: &str, api: &str) -> (Agent<FakeNacos, FakeTelemetry>, FakeNacos, Arc<Mutex<Sampled>>) {
    let nacos = FakeNacos::default();
    let tel = Arc::new(Mutex::new(sampled(40_000, 50, 2.0)));
    let a = Agent::new(cfg(heartbeat, api), nacos.clone(), vec![FakeTelemetry(tel.clone())], AgentMetrics::default());
    (a, nacos, tel)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn registers_once_then_only_when_a_value_moves() {
    rt().block_on(async {
        let (mut a, nacos, tel) = agent("60s");
        a.tick().await;
        assert_eq!(nacos.registrations().len(), 1);
        let m = nacos.last_metadata();
        assert_eq!(m["remaining_memory_mb"], "40000");
        assert_eq!(m["remaining_memory"], "39.0");
        assert_eq!(m["current_requests"], "2");
        assert_eq!(m["health_status"], "healthy");
        assert_eq!(nacos.last_form("ephemeral"), "true");
        let first_stamp = m["updated_at_ms"].clone();
        for _ in 0..20 {
            a.tick().await;
        }
        assert_eq!(nacos.registrations().len(), 1, "steady values: no write");
        // Below every threshold: still nothing.
        *tel.lock().unwrap() = sampled(40_000 - 100, 52, 2.0);
        a.tick().await;
        assert_eq!(nacos.registrations().len(), 1);
        *tel.lock().unwrap() = sampled(40_000 - 100, 52, 3.0);
        // updated_at_ms has millisecond resolution: let one pass.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        a.tick().await;
        assert_eq!(nacos.registrations().len(), 2);
        assert_eq!(nacos.last_metadata()["current_requests"], "3");
        assert_ne!(nacos.last_metadata()["updated_at_ms"], first_stamp);
        assert_eq!(a.metrics.publishes.get(), 2);
    });
}

#[test]
fn beats_when_due_and_registers_again_on_20404() {
    rt().block_on(async {
        let (mut a, nacos, _tel) = agent("100ms");
        a.tick().await;
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        a.tick().await;
        let beats = nacos.calls(Method::Put, "/instance/beat");
        assert_eq!(beats.len(), 1);
        let q: Vec<(String, String)> = beats[0].url.query_pairs().into_owned().collect();
        let beat = &q.iter().find(|(k, _)| k == "beat").unwrap().1;
        let beat: serde_json::Value = serde_json::from_str(beat).unwrap();
        assert_eq!(beat["serviceName"], "DEFAULT_GROUP@@llama");
        assert_eq!(beat["metadata"]["model_id"], "llama");
        assert_eq!(nacos.registrations().len(), 1);
        nacos.forget.store(true, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        a.tick().await;
        a.tick().await;
        assert_eq!(a.metrics.beat_not_found.get(), 1);
        assert_eq!(nacos.registrations().len(), 2, "20404 -> registered again");
    });
}

#[test]
fn a_slow_server_stays_healthy_until_its_probes_time_out_three_times_in_a_row() {
    rt().block_on(async {
        let (mut a, nacos, tel) = agent("60s");
        a.tick().await;
        let publishes = nacos.registrations().len();
        let healthy = tel.lock().unwrap().sample.server.clone();
        let slow = ServerSample { healthy: false, timed_out: true, ..Default::default() };
        tel.lock().unwrap().sample.server = slow;
        for _ in 0..2 {
            a.tick().await;
            assert_eq!(nacos.last_metadata()["health_status"], "healthy");
            assert_eq!(nacos.registrations().len(), publishes, "a timeout below the threshold publishes nothing");
        }
        tel.lock().unwrap().sample.server = healthy;
        a.tick().await;
        tel.lock().unwrap().sample.server.timed_out = true;
        tel.lock().unwrap().sample.server.healthy = false;
        for _ in 0..2 {
            a.tick().await;
        }
        assert_eq!(nacos.last_metadata()["health_status"], "healthy", "the answer between restarted the count");
        a.tick().await;
        assert_eq!(nacos.last_metadata()["health_status"], "unhealthy", "the third timeout in a row");
    });
}

#[test]
fn a_dead_server_is_published_unhealthy_at_once() {
    rt().block_on(async {
        let (mut a, nacos, tel) = agent("60s");
        a.tick().await;
        {
            let mut t = tel.lock().unwrap();
            t.sample.server = ServerSample { healthy: false, ..Default::default() };
            t.errors = vec![(SampleSource::Scrape, "connection refused".into())];
        }
        a.tick().await;
        assert_eq!(nacos.last_metadata()["health_status"], "unhealthy");
        assert!(nacos.last_metadata().get("current_requests").is_none());
        let scrape = a.metrics.errors.get_or_create(&super::metrics::SourceLabel { source: "scrape" }).get();
        assert_eq!(scrape, 1);
    });
}

#[test]
fn a_nacos_outage_is_counted_and_ends_in_a_full_registration() {
    rt().block_on(async {
        let (mut a, nacos, tel) = agent("60s");
        a.tick().await;
        nacos.down.store(true, Ordering::SeqCst);
        *tel.lock().unwrap() = sampled(40_000, 50, 7.0);
        a.tick().await;
        a.tick().await;
        let errs = a.metrics.errors.get_or_create(&super::metrics::SourceLabel { source: "nacos" }).get();
        assert_eq!(errs, 2);
        nacos.down.store(false, Ordering::SeqCst);
        a.tick().await;
        assert_eq!(nacos.registrations().len(), 2);
        assert_eq!(nacos.last_metadata()["current_requests"], "7");
    });
}

#[test]
fn drain_disables_then_waits_for_zero_then_deregisters() {
    rt().block_on(async {
        let (mut a, nacos, tel) = agent("60s");
        a.tick().await;
        a.start_drain();
        a.tick().await;
        assert_eq!(nacos.last_form("enabled"), "false");
        assert_eq!(nacos.last_metadata()["health_status"], "draining");
        assert!(!a.drained(), "2 requests still running");
        *tel.lock().unwrap() = sampled(40_000, 50, 0.0);
        a.tick().await;
        assert!(a.drained());
        a.deregister_all().await;
        let del = nacos.calls(Method::Delete, "/ns/instance");
        assert_eq!(del.len(), 1);
        let q: Vec<(String, String)> = del[0].url.query_pairs().into_owned().collect();
        assert!(q.contains(&("ip".into(), "10.0.0.7".into())) && q.contains(&("port".into(), "8000".into())));
    });
}

#[test]
fn v3_registers_and_beats_through_the_client_api() {
    rt().block_on(async {
        let (mut a, nacos, _tel) = agent_api("100ms", "v3");
        nacos.v3.store(true, Ordering::SeqCst);
        a.tick().await;
        let reg = nacos.calls(Method::Post, "/v3/client/ns/instance");
        assert_eq!(reg.len(), 1);
        assert!(reg[0].form.iter().any(|(k, v)| *k == "ephemeral" && v == "true"));
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        a.tick().await;
        let posts = nacos.calls(Method::Post, "/v3/client/ns/instance");
        assert_eq!(posts.len(), 2);
        assert!(posts[1].url.query_pairs().any(|(k, v)| k == "heartBeat" && v == "true"), "{:?}", posts[1].url);
        assert_eq!(a.metrics.beats.get(), 1);
        // A beat refused (instance unknown): registered again.
        nacos.forget.store(true, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(120)).await;
        a.tick().await;
        a.tick().await;
        assert_eq!(a.metrics.beat_not_found.get(), 1);
        assert_eq!(a.metrics.publishes.get(), 2);
    });
}

#[test]
fn auto_falls_back_to_v1_on_a_server_without_v3() {
    rt().block_on(async {
        let (mut a, nacos, _tel) = agent_api("60s", "auto");
        a.tick().await;
        assert_eq!(nacos.calls(Method::Post, "/v3/client/ns/instance").len(), 1, "v3 tried first");
        assert_eq!(nacos.registrations().iter().filter(|r| r.url.path().contains("/v1/")).count(), 1);
        a.tick().await;
        a.start_drain();
        a.tick().await;
        assert_eq!(nacos.calls(Method::Post, "/v3/client/ns/instance").len(), 1, "decided once per server");
        assert_eq!(a.metrics.publishes.get(), 2);
    });
}
