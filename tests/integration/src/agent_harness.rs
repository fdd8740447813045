//! `ailb agent` harness shared by the `agent_*` tests and `ailb-agent-bench`: a fake
//! `libnvidia-ml.so` ([`FakeNvml`], values from a state file), a fake vLLM server
//! ([`FakeVllm`]) and `ailb agent` as a child process ([`Agent`]) against an [`RnacosServer`].

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use crate::nacos::{free_port, http_request, RnacosServer};
use crate::{ailb_bin, wait_until};

pub const SERVICE: &str = "llm-agent";
pub const IP: &str = "127.0.0.1";

/// A fake `libnvidia-ml.so` built from `tests/integration/fixtures/fake_nvml.c` (needs gcc) into a temp dir,
/// with its `state` file next to it (re-read on every NVML call).
pub struct FakeNvml {
    dir: tempfile::TempDir,
}

impl FakeNvml {
    pub fn build(state: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_nvml.c");
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.path().join("libnvidia-ml.so"))
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("gcc (needed to build the fake NVML): {e}"));
        assert!(out.status.success(), "gcc {}: {}", src.display(), String::from_utf8_lossy(&out.stderr));
        let f = Self { dir };
        f.set(state);
        f
    }

    /// The library's path, for `nvml_library`.
    pub fn lib(&self) -> String {
        self.dir.path().join("libnvidia-ml.so").display().to_string()
    }

    /// Removes the state file: the fake then answers init with DRIVER_NOT_LOADED.
    pub fn clear_state(&self) {
        std::fs::remove_file(self.dir.path().join("state")).expect("remove fake NVML state");
    }

    /// Replaces the state atomically (write a temp file, rename), so no NVML call reads half a file.
    pub fn set(&self, state: &str) {
        let tmp = self.dir.path().join("state.tmp");
        std::fs::write(&tmp, state).expect("write fake NVML state");
        std::fs::rename(&tmp, self.dir.path().join("state")).expect("rename fake NVML state");
    }
}

/// What the fake vLLM server answers.
#[derive(Clone)]
pub struct ServerState {
    pub running: f64,
    pub waiting: f64,
    pub kv: f64,
    pub healthy: bool,
    pub garbage: bool,
    /// More exposition text appended to `/metrics` (other gauges: `vllm:cache_config_info`,
    /// an exporter's GPU gauges, another server's names).
    pub extra: String,
    /// Prompt tokens per second looked up in the prefix cache since an instant: the counters
    /// `vllm:prefix_cache_queries_total` (growing at that rate) and `_hits_total` (0) are
    /// exported; `None`: neither.
    pub prompts: Option<(std::time::Instant, f64)>,
}

/// vLLM's info gauge for the fake's `extra`: `blocks` KV blocks of 16 tokens (labels as vLLM
/// writes them).
pub fn cache_config_info(blocks: u64) -> String {
    format!(
        "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",\
         enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_gpu_blocks=\"{blocks}\"}} 1.0\n"
    )
}

/// A vLLM stand-in: `/metrics` and `/health` from a shared state, one thread per connection.
pub struct FakeVllm {
    pub port: u16,
    state: Arc<Mutex<ServerState>>,
    stop: Arc<AtomicBool>,
}

impl FakeVllm {
    pub fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("fake vllm bind: {e}"));
        let port = l.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(ServerState {
            running: 2.0,
            waiting: 1.0,
            kv: 0.25,
            healthy: true,
            garbage: false,
            extra: String::new(),
            prompts: None,
        }));
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

    pub fn set(&self, f: impl FnOnce(&mut ServerState)) {
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
                 # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} {}\n{}",
                s.running, s.waiting, s.kv, s.extra
            ) + &s.prompts.map_or_else(String::new, |(since, rate)| {
                format!(
                    "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{{model_name=\"m\"}} {}\n\
                     # TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{{model_name=\"m\"}} 0\n",
                    (since.elapsed().as_secs_f64() * rate).floor()
                )
            }),
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
pub struct Agent {
    pub child: Child,
    pub metrics_port: u16,
    pub instance_port: u16,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// Spawns the agent with NVML off and waits for its `/metrics`.
    pub fn start(nacos: &RnacosServer, vllm: &FakeVllm, heartbeat: &str) -> Self {
        Self::start_with(nacos, vllm, heartbeat, "", "nvml = false")
    }

    /// Writes a config (`top` before the tables, `instance` at the end of the instance, which may
    /// open `[instances.metrics]`; `server` is not set, vLLM by default) and
    /// spawns the agent without waiting.
    pub fn spawn(nacos: &RnacosServer, vllm: &FakeVllm, heartbeat: &str, top: &str, instance: &str) -> Self {
        Self::spawn_full(nacos, vllm, heartbeat, top, "api = \"v1\"", instance)
    }

    /// [`Self::spawn`] with `nacos_extra` lines in `[nacos]` (the API choice, credentials).
    pub fn spawn_full(
        nacos: &RnacosServer,
        vllm: &FakeVllm,
        heartbeat: &str,
        top: &str,
        nacos_extra: &str,
        instance: &str,
    ) -> Self {
        Self::spawn_publishing(nacos, vllm, Some("250ms"), heartbeat, top, nacos_extra, instance)
    }

    /// [`Self::spawn_full`] with the publish interval given (`None`: the agent's default, 1 s).
    pub fn spawn_publishing(
        nacos: &RnacosServer,
        vllm: &FakeVllm,
        publish_interval: Option<&str>,
        heartbeat: &str,
        top: &str,
        nacos_extra: &str,
        instance: &str,
    ) -> Self {
        let publish = publish_interval.map(|p| format!("publish_interval = \"{p}\"")).unwrap_or_default();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (metrics_port, instance_port) = (free_port(), free_port());
        let cfg = format!(
            r#"
{top}
{publish}
heartbeat_interval = "{heartbeat}"
drain_timeout = "20s"
listen = "127.0.0.1:{metrics_port}"

[nacos]
servers = ["{nacos}"]
{nacos_extra}
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
{instance}
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
        Self { child, metrics_port, instance_port, _dir: dir }
    }

    /// [`Self::spawn`], then waits for the agent's `/metrics`.
    pub fn start_with(nacos: &RnacosServer, vllm: &FakeVllm, heartbeat: &str, top: &str, instance: &str) -> Self {
        Self::spawn(nacos, vllm, heartbeat, top, instance).ready()
    }

    /// Waits for the agent's `/metrics` (panics if it exits first).
    pub fn ready(mut self) -> Self {
        let a = &mut self;
        wait_until("the agent's /metrics", Duration::from_secs(10), || {
            if !a.alive() {
                panic!("the agent exited at start-up; log:\n{}", a.log());
            }
            a.metrics().ok()
        });
        self
    }

    /// Waits for the agent to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_until("the agent to exit", timeout, || self.child.try_wait().expect("try_wait"))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("agent.log")).unwrap_or_default()
    }

    /// The agent's own metrics, `name{labels}` -> value.
    pub fn metrics(&self) -> Result<BTreeMap<String, f64>, String> {
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

    pub fn metric(&self, name: &str) -> f64 {
        let m = self.metrics().unwrap_or_else(|e| panic!("agent /metrics: {e}; log:\n{}", self.log()));
        *m.get(name).unwrap_or_else(|| panic!("no {name} in the agent's metrics: {m:?}"))
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn sigterm(&self) {
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
pub fn listed(nacos: &RnacosServer, port: u16) -> Option<serde_json::Value> {
    let path = format!("/nacos/v1/ns/instance/list?serviceName={SERVICE}&healthyOnly=false");
    let (status, body) = http_request(nacos.http_port, "GET", &path, &[]).ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v["hosts"].as_array()?.iter().find(|h| h["ip"] == IP && h["port"] == port).cloned()
}

/// The instance by address (`GET /nacos/v1/ns/instance`), disabled ones included.
pub fn instance(nacos: &RnacosServer, port: u16) -> Option<serde_json::Value> {
    let path = format!("/nacos/v1/ns/instance?serviceName={SERVICE}&ip={IP}&port={port}&clusterName=DEFAULT");
    let (status, body) = http_request(nacos.http_port, "GET", &path, &[]).ok()?;
    if status != 200 {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

pub fn meta(nacos: &RnacosServer, port: u16, key: &str) -> Option<String> {
    listed(nacos, port)?["metadata"][key].as_str().map(str::to_string)
}
