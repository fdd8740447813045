//! `ailb agent` against a real rnacos (v1 Open API) and a fake vLLM server on loopback
//! (`/metrics` in vLLM's names, `/health`), NVML off. No eBPF: the agent only talks HTTP.
//!
//! Shown here: the metadata contract's keys appear; a changed running count reaches Nacos
//! within 1 s (publish_interval 250ms: the bound is one interval plus a scrape and a write);
//! steady metrics write nothing while beats continue; a dead health endpoint is published
//! `unhealthy` at once; bad metrics text and a Nacos outage are counted and survived; SIGTERM
//! disables, waits for in-flight to reach zero, deregisters and exits 0.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use ailb_tests::nacos::{free_port, http_request, RnacosServer};
use ailb_tests::{ailb_bin, wait_until};

const SERVICE: &str = "llm-agent";
const IP: &str = "127.0.0.1";

/// What the fake vLLM server answers.
#[derive(Clone)]
struct ServerState {
    running: f64,
    waiting: f64,
    kv: f64,
    healthy: bool,
    garbage: bool,
}

/// A vLLM stand-in: `/metrics` and `/health` from a shared state, one thread per connection.
struct FakeVllm {
    port: u16,
    state: Arc<Mutex<ServerState>>,
    stop: Arc<AtomicBool>,
}

impl FakeVllm {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("fake vllm bind: {e}"));
        let port = l.local_addr().expect("addr").port();
        let state =
            Arc::new(Mutex::new(ServerState { running: 2.0, waiting: 1.0, kv: 0.25, healthy: true, garbage: false }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve(conn, &st));
            }
        });
        Self { port, state, stop }
    }

    fn set(&self, f: impl FnOnce(&mut ServerState)) {
        f(&mut self.state.lock().expect("state"));
    }
}

impl Drop for FakeVllm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, state: &Mutex<ServerState>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut rd = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if rd.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        let mut h = String::new();
        if rd.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    let s = state.lock().expect("state").clone();
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = match path {
        "/health" if s.healthy => (200, String::new()),
        "/health" => (503, "down".to_string()),
        "/metrics" if s.garbage => (200, "vllm:num_requests_running{ 3\nthis is not prometheus\n".to_string()),
        "/metrics" => (
            200,
            format!(
                "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} {}\n\
                 # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {}\n\
                 # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} {}\n",
                s.running, s.waiting, s.kv
            ),
        ),
        _ => (404, String::new()),
    };
    let mut out = conn;
    let _ = write!(
        out,
        "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

/// `ailb agent` as a child; killed by pid on drop if still running.
struct Agent {
    child: Child,
    metrics_port: u16,
    instance_port: u16,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start(nacos: &RnacosServer, vllm: &FakeVllm, heartbeat: &str) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (metrics_port, instance_port) = (free_port(), free_port());
        let cfg = format!(
            r#"
publish_interval = "250ms"
heartbeat_interval = "{heartbeat}"
drain_timeout = "20s"
listen = "127.0.0.1:{metrics_port}"

[nacos]
servers = ["{nacos}"]
api = "v1"
timeout = "500ms"

[[instances]]
service = "{SERVICE}"
ip = "{IP}"
port = {instance_port}
model_id = "{SERVICE}"
model_version = "v7"
gpu_type = "A100-80GB"
supported_tasks = ["chat", "completion"]
metrics_url = "http://127.0.0.1:{vllm}/metrics"
health_url = "http://127.0.0.1:{vllm}/health"
server = "vllm"
nvml = false
"#,
            nacos = nacos.url(),
            vllm = vllm.port
        );
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, cfg).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let log = std::fs::File::create(dir.path().join("agent.log")).expect("log file");
        let child = Command::new(ailb_bin())
            .args(["agent", "--config"])
            .arg(&path)
            .env("AILB_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning ailb agent: {e}"));
        let a = Self { child, metrics_port, instance_port, _dir: dir };
        wait_until("the agent's /metrics", Duration::from_secs(10), || a.metrics().ok());
        a
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("agent.log")).unwrap_or_default()
    }

    /// The agent's own metrics, `name{labels}` -> value.
    fn metrics(&self) -> Result<BTreeMap<String, f64>, String> {
        let (status, body) = http_request(self.metrics_port, "GET", "/metrics", &[])?;
        if status != 200 {
            return Err(format!("http {status}"));
        }
        Ok(String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect())
    }

    fn metric(&self, name: &str) -> f64 {
        let m = self.metrics().unwrap_or_else(|e| panic!("agent /metrics: {e}; log:\n{}", self.log()));
        *m.get(name).unwrap_or_else(|| panic!("no {name} in the agent's metrics: {m:?}"))
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The instance as rnacos lists it (`healthyOnly=false`): enabled instances only.
fn listed(nacos: &RnacosServer, port: u16) -> Option<serde_json::Value> {
    let path = format!("/nacos/v1/ns/instance/list?serviceName={SERVICE}&healthyOnly=false");
    let (status, body) = http_request(nacos.http_port, "GET", &path, &[]).ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v["hosts"].as_array()?.iter().find(|h| h["ip"] == IP && h["port"] == port).cloned()
}

/// The instance by address (`GET /nacos/v1/ns/instance`), disabled ones included.
fn instance(nacos: &RnacosServer, port: u16) -> Option<serde_json::Value> {
    let path = format!("/nacos/v1/ns/instance?serviceName={SERVICE}&ip={IP}&port={port}&clusterName=DEFAULT");
    let (status, body) = http_request(nacos.http_port, "GET", &path, &[]).ok()?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

fn meta(nacos: &RnacosServer, port: u16, key: &str) -> Option<String> {
    listed(nacos, port)?["metadata"][key].as_str().map(str::to_string)
}

#[test]
fn agent_publishes_the_contract_keys_and_writes_only_what_moved() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::start(&nacos, &vllm, "1s");
    let port = agent.instance_port;

    let host = wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));
    let m = &host["metadata"];
    for (k, v) in [
        ("model_id", SERVICE),
        ("model_version", "v7"),
        ("gpu_type", "A100-80GB"),
        ("supported_tasks", "chat,completion"),
        ("current_requests", "2"),
        ("queue_length", "1"),
        ("kv_cache_usage", "0.25"),
        ("health_status", "healthy"),
    ] {
        assert_eq!(m[k], v, "metadata {k}: {m}");
    }
    assert!(m["updated_at_ms"].as_str().and_then(|s| s.parse::<u64>().ok()).is_some(), "{m}");
    assert!(m["agent_version"].is_string(), "{m}");
    assert_eq!(host["enabled"], true);

    // Propagation: a changed running count reaches rnacos within 1 s.
    let t0 = Instant::now();
    vllm.set(|s| s.running = 5.0);
    wait_until("current_requests=5 in rnacos", Duration::from_secs(1), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("5")).then_some(())
    });
    eprintln!("propagation of current_requests 2 -> 5: {} ms", t0.elapsed().as_millis());

    // Steady metrics: no write over 12 intervals (3 s), while beats (every 1 s) continue.
    let (p0, b0) = (agent.metric("ailb_agent_publishes_total"), agent.metric("ailb_agent_beats_total"));
    let stamp = meta(&nacos, port, "updated_at_ms");
    std::thread::sleep(Duration::from_secs(3));
    let (p1, b1) = (agent.metric("ailb_agent_publishes_total"), agent.metric("ailb_agent_beats_total"));
    eprintln!("steady 3 s (12 intervals): publishes {p0} -> {p1}, beats {b0} -> {b1}");
    assert_eq!(p1, p0, "steady metrics must not be written");
    assert!(b1 - b0 >= 2.0, "beats every 1 s continue: {b0} -> {b1}");
    assert_eq!(meta(&nacos, port, "updated_at_ms"), stamp, "updated_at_ms only moves on a publish");

    // The health endpoint dies: unhealthy at once.
    let t0 = Instant::now();
    vllm.set(|s| s.healthy = false);
    wait_until("health_status=unhealthy", Duration::from_secs(1), || {
        (meta(&nacos, port, "health_status").as_deref() == Some("unhealthy")).then_some(())
    });
    eprintln!("propagation of health_status unhealthy: {} ms", t0.elapsed().as_millis());
    vllm.set(|s| s.healthy = true);
    wait_until("health_status=healthy again", Duration::from_secs(2), || {
        (meta(&nacos, port, "health_status").as_deref() == Some("healthy")).then_some(())
    });

    // Bad metrics text: counted, the agent lives on, and recovers when the text is good again.
    let e0 = agent.metric("ailb_agent_errors_total{source=\"scrape\"}");
    vllm.set(|s| s.garbage = true);
    wait_until("scrape errors counted", Duration::from_secs(3), || {
        (agent.metric("ailb_agent_errors_total{source=\"scrape\"}") >= e0 + 2.0).then_some(())
    });
    assert!(agent.alive(), "the agent survives bad metrics text; log:\n{}", agent.log());
    vllm.set(|s| {
        s.garbage = false;
        s.running = 9.0;
    });
    wait_until("current_requests=9 after recovery", Duration::from_secs(2), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("9")).then_some(())
    });
    assert!(agent.log().contains("scrape"), "the scrape error is logged:\n{}", agent.log());
}

#[test]
fn agent_sigterm_disables_drains_in_flight_then_deregisters() {
    let nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    vllm.set(|s| {
        s.running = 3.0;
        s.waiting = 0.0;
    });
    let mut agent = Agent::start(&nacos, &vllm, "1s");
    let port = agent.instance_port;
    wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));

    agent.sigterm();
    // rnacos leaves disabled instances out of the list; the instance itself says enabled=false.
    let t0 = Instant::now();
    wait_until("the instance disabled", Duration::from_secs(2), || {
        let i = instance(&nacos, port)?;
        (i["enabled"] == false && listed(&nacos, port).is_none()).then_some(i)
    });
    eprintln!("disabled {} ms after SIGTERM", t0.elapsed().as_millis());
    // In flight: the agent waits (several intervals) with the instance still registered.
    std::thread::sleep(Duration::from_secs(1));
    assert!(agent.alive(), "requests in flight: the agent waits; log:\n{}", agent.log());
    assert!(instance(&nacos, port).is_some(), "still registered while draining");
    assert_eq!(instance(&nacos, port).expect("instance")["metadata"]["health_status"], "draining");

    vllm.set(|s| s.running = 0.0);
    let status = wait_until("the agent to exit", Duration::from_secs(5), || agent.child.try_wait().expect("try_wait"));
    assert!(status.success(), "agent exit {status}; log:\n{}", agent.log());
    assert!(instance(&nacos, port).is_none(), "deregistered after the drain");
}

#[test]
fn agent_survives_a_nacos_outage_and_registers_again() {
    let mut nacos = RnacosServer::start();
    let vllm = FakeVllm::start();
    let mut agent = Agent::start(&nacos, &vllm, "500ms");
    let port = agent.instance_port;
    wait_until("the instance in rnacos", Duration::from_secs(5), || listed(&nacos, port));

    nacos.stop();
    vllm.set(|s| s.running = 4.0);
    wait_until("nacos errors counted", Duration::from_secs(5), || {
        (agent.metric("ailb_agent_errors_total{source=\"nacos\"}") >= 2.0).then_some(())
    });
    assert!(agent.alive(), "the agent survives the outage; log:\n{}", agent.log());

    // rnacos keeps no ephemeral instance over a restart: the agent registers again, in full.
    nacos.restart();
    let t0 = Instant::now();
    wait_until("the instance back with its metadata", Duration::from_secs(5), || {
        (meta(&nacos, port, "current_requests").as_deref() == Some("4")).then_some(())
    });
    eprintln!("registered again {} ms after rnacos was back", t0.elapsed().as_millis());
    assert_eq!(meta(&nacos, port, "model_id").as_deref(), Some(SERVICE));
    assert!(agent.alive());
}
