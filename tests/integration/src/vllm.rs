//! Real vLLM servers (vLLM for CPU, the tiny model) for the `vllm*` tests and the real-engine
//! race, from what `cargo xtask setup` keeps under `~/.cache/ailb/`: the venv `vllm-venv`, the
//! model `models/tiny-llama` and, for the gRPC servers SMG reads KV events from, SMG's servicer
//! in `smg-grpc-servicer`. Each server runs in its own process group (the API server starts an
//! engine process of its own), is killed by that group on drop (SIGTERM, then SIGKILL), and
//! dies with the test process if that is killed first (`PR_SET_PDEATHSIG`).
//!
//! Start-up is slow (about a minute and a half for two side by side on 2 cores): a test binary
//! starts its servers once and runs its checks against them in turn.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::get;
use crate::nacos::free_port;

/// The engine's cache folder (`cargo xtask setup` fills it).
fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/ailb")
}

/// The file in which `cargo xtask setup` wrote why it could not install the engine (only an
/// unreachable package registry): the tests then report themselves skipped with that reason.
const SKIPPED_MARKER: &str = "vllm-engine.skipped";

/// KV cache per server, GiB (`VLLM_CPU_KVCACHE_SPACE`): 1 GiB holds 262,144 tokens of the tiny
/// model, far more than a test sends, and keeps two or three servers within this machine's memory.
pub const KV_CACHE_GIB: u32 = 1;
/// The tiny model's KV cache per token: K and V x 4 layers x 4 KV heads x 64 dims x 2 bytes
/// (bfloat16) (`tests/engines/tiny_model.py`).
pub const KV_BYTES_PER_TOKEN: u64 = 2 * 4 * 4 * 64 * 2;

/// Under the cache dir: SMG's gRPC servicer for vLLM (`smg-grpc-servicer`), which `cargo xtask
/// setup` installs with `--target` rather than into the venv. Only the gRPC servers put it on
/// their `PYTHONPATH`: installed into the venv, its vLLM plugin would load in every server.
pub const GRPC_SERVICER_DIR: &str = "smg-grpc-servicer";

/// The installed engine: the venv's python and the model folder.
#[derive(Debug, Clone)]
pub struct Engine {
    pub python: PathBuf,
    pub model: PathBuf,
    cache: PathBuf,
}

/// How a server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    /// vLLM's OpenAI API server (HTTP, `/metrics`).
    OpenAi,
    /// vLLM's gRPC server (`vllm.entrypoints.grpc_server`, served by SMG's `smg-grpc-servicer`):
    /// the router tokenizes and sends token ids, and reads the engine's KV events over gRPC.
    /// It has no HTTP port, so no `/health` and no `/metrics`.
    Grpc,
}

impl Engine {
    /// The engine `cargo xtask setup` installed. `Err(reason)` only when setup recorded that it
    /// could not reach the package registry (the caller reports the test skipped); panics, saying
    /// what to run, when the engine is simply missing or incomplete.
    pub fn find() -> Result<Self, String> {
        let cache = cache_dir();
        let marker = cache.join(SKIPPED_MARKER);
        if let Ok(reason) = std::fs::read_to_string(&marker) {
            return Err(format!("no real engine: {} ({})", reason.trim(), marker.display()));
        }
        let python = cache.join("vllm-venv/bin/python");
        let model = cache.join("models/tiny-llama");
        for need in [&python, &model.join("config.json"), &model.join("tokenizer.json")] {
            if !need.exists() {
                panic!(
                    "{} is missing: run `cargo xtask setup` (it installs vLLM for CPU and makes the tiny model)",
                    need.display()
                );
            }
        }
        Ok(Self { python, model, cache })
    }

    /// SMG's gRPC servicer for vLLM, or why it is not there.
    pub fn grpc_servicer(&self) -> Result<PathBuf, String> {
        let dir = self.cache.join(GRPC_SERVICER_DIR);
        if dir.join("smg_grpc_servicer").is_dir() {
            Ok(dir)
        } else {
            Err(format!("{} is missing (`cargo xtask setup` installs SMG's gRPC servicer for vLLM)", dir.display()))
        }
    }
}

/// The gRPC health check (`grpc.health.v1`, which the servicer serves) of the server on the
/// port given, from the venv's python: exit 0 when it answers SERVING.
const GRPC_HEALTH_PROBE: &str = "import sys, grpc\n\
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g\n\
ch = grpc.insecure_channel('127.0.0.1:' + sys.argv[1])\n\
r = g.HealthStub(ch).Check(h.HealthCheckRequest(service=''), timeout=2)\n\
sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)";

/// The loopback ports of a server's KV-event sockets: its PUB socket (`endpoint`) and its
/// replay ROUTER socket (`replay_endpoint`). The engine is given `tcp://*:port`: a wildcard
/// makes vLLM bind both (a plain address makes it connect the PUB socket instead), and a
/// subscriber connects to `tcp://127.0.0.1:port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventPorts {
    pub publisher: u16,
    pub replay: u16,
}

impl KvEventPorts {
    /// Two free loopback ports.
    pub fn free() -> Self {
        Self { publisher: free_port(), replay: free_port() }
    }

    /// vLLM's `--kv-events-config` for these ports (ZMQ publisher, empty topic).
    pub fn config_arg(&self) -> String {
        format!(
            r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{}", "replay_endpoint": "tcp://*:{}", "topic": ""}}"#,
            self.publisher, self.replay
        )
    }

    /// Where a subscriber connects: `tcp://127.0.0.1:publisher`.
    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.publisher)
    }

    /// The replay socket, `tcp://127.0.0.1:replay`.
    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay)
    }
}

/// A running vLLM server on `127.0.0.1:port` (`vllm.entrypoints.openai.api_server`, or behind
/// [`Frontend::Grpc`] `vllm.entrypoints.grpc_server`), its output in a file.
pub struct VllmServer {
    child: Child,
    port: u16,
    name: String,
    log: tempfile::NamedTempFile,
    started: Instant,
    kv_events: Option<KvEventPorts>,
    frontend: Frontend,
    /// The `PYTHONPATH` of a gRPC server (the servicer), for its health probe.
    python_path: Option<PathBuf>,
    python: PathBuf,
}

impl VllmServer {
    /// Spawns a server of `engine`'s model under the name `served` on a free loopback port,
    /// with `extra` arguments (`--max-model-len` 8192 unless they set it); returns at once ([`Self::wait_ready`] waits for `/health`).
    pub fn spawn(engine: &Engine, served: &str, extra: &[&str]) -> Self {
        Self::spawn_with(engine, served, extra, None)
    }

    /// [`Self::spawn`], publishing its KV-cache events on `kv_events` when given.
    pub fn spawn_with(engine: &Engine, served: &str, extra: &[&str], kv_events: Option<KvEventPorts>) -> Self {
        Self::spawn_as(engine, Frontend::OpenAi, served, extra, kv_events)
    }

    /// [`Self::spawn_with`] behind `frontend`. A gRPC server needs the servicer
    /// ([`Engine::grpc_servicer`]; panics, saying what to run, without it) and takes only engine
    /// arguments (not the OpenAI server's).
    pub fn spawn_as(
        engine: &Engine,
        frontend: Frontend,
        served: &str,
        extra: &[&str],
        kv_events: Option<KvEventPorts>,
    ) -> Self {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("vLLM log file: {e}"));
        let out = log.reopen().unwrap_or_else(|e| panic!("vLLM log file: {e}"));
        let err = log.reopen().unwrap_or_else(|e| panic!("vLLM log file: {e}"));
        let work = engine.cache.join("vllm-work");
        let mut cmd = Command::new(&engine.python);
        let python_path = match frontend {
            Frontend::OpenAi => {
                cmd.args(["-m", "vllm.entrypoints.openai.api_server"]);
                None
            }
            Frontend::Grpc => {
                let dir = engine.grpc_servicer().unwrap_or_else(|why| panic!("a vLLM gRPC server: {why}"));
                cmd.args(["-m", "vllm.entrypoints.grpc_server"]).env("PYTHONPATH", &dir);
                Some(dir)
            }
        };
        cmd.arg("--model")
            .arg(&engine.model)
            .args(["--served-model-name", served, "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--enable-prefix-caching", "--dtype", "bfloat16"])
            .args(extra)
            .env("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB.to_string())
            .env("VLLM_CPU_OMP_THREADS_BIND", "auto")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("VLLM_CACHE_ROOT", work.join("vllm"))
            .env("HF_HOME", work.join("hf"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        if !extra.contains(&"--max-model-len") {
            cmd.args(["--max-model-len", "8192"]);
        }
        if let Some(kv) = &kv_events {
            cmd.arg("--kv-events-config").arg(kv.config_arg());
        }
        let child = cmd.spawn().unwrap_or_else(|e| panic!("starting vLLM ({}): {e}", engine.python.display()));
        Self {
            child,
            port,
            name: served.to_string(),
            log,
            started: Instant::now(),
            kv_events,
            frontend,
            python_path,
            python: engine.python.clone(),
        }
    }

    /// How it is reached.
    pub fn frontend(&self) -> Frontend {
        self.frontend
    }

    /// Whether it is ready: `/health` answers 200, or for a gRPC server the gRPC health check
    /// answers SERVING.
    fn ready(&self) -> bool {
        match self.frontend {
            Frontend::OpenAi => get(&self.addr(), "/health").is_ok_and(|(status, _)| status == 200),
            Frontend::Grpc => {
                let mut probe = Command::new(&self.python);
                probe.args(["-c", GRPC_HEALTH_PROBE, &self.port.to_string()]);
                if let Some(p) = &self.python_path {
                    probe.env("PYTHONPATH", p);
                }
                probe.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
                probe.status().is_ok_and(|s| s.success())
            }
        }
    }

    /// Waits until it is ready (`/health` answers 200; a gRPC server: its gRPC health check
    /// answers SERVING), at most `timeout`; panics with the log's tail when the server exits
    /// first or the time runs out. Returns the time from spawn to ready.
    pub fn wait_ready(&mut self, timeout: Duration) -> Duration {
        let deadline = self.started + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("vLLM on port {} exited with {status} before it was ready:\n{}", self.port, self.log_tail(60));
            }
            if self.ready() {
                return self.started.elapsed();
            }
            if Instant::now() > deadline {
                panic!("vLLM on port {} not ready within {timeout:?}:\n{}", self.port, self.log_tail(60));
            }
            // A gRPC probe starts a python (about 0.3 s of CPU): a slower poll there.
            let poll = if self.frontend == Frontend::Grpc { 1000 } else { 250 };
            std::thread::sleep(Duration::from_millis(poll));
        }
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its KV-event sockets, when it publishes them.
    pub fn kv_events(&self) -> Option<KvEventPorts> {
        self.kv_events
    }

    /// The name it serves the model under.
    pub fn served(&self) -> &str {
        &self.name
    }

    /// Its exit status once the API server has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The API server's pid (its process group's id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last `lines` lines it printed.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Its `/metrics` text now (panics when it does not answer 200).
    pub fn metrics(&self) -> String {
        match get(&self.addr(), "/metrics") {
            Ok((200, body)) => body,
            other => panic!("GET /metrics from vLLM on {}: {other:?}", self.addr()),
        }
    }

    /// The sum of every sample of `name` (all label sets) in its `/metrics` now, or `None` when
    /// it has no such sample.
    pub fn metric(&self, name: &str) -> Option<f64> {
        metric_sum(&self.metrics(), name)
    }

    /// [`Self::metric`] that panics, naming the metric and the server, when it is absent.
    pub fn must(&self, name: &str) -> f64 {
        let text = self.metrics();
        metric_sum(&text, name).unwrap_or_else(|| panic!("no {name} in the /metrics of vLLM on {}", self.addr()))
    }

    /// A label of its `vllm:cache_config_info` (`block_size`, `num_gpu_blocks`) as a number.
    pub fn cache_config(&self, label: &str) -> Option<u64> {
        let text = self.metrics();
        let info = text.lines().find(|l| l.starts_with("vllm:cache_config_info{"))?;
        let at = info.find(&format!(",{label}=\"")).or_else(|| info.find(&format!("{{{label}=\"")))? + label.len() + 3;
        info[at..].split('"').next()?.parse().ok()
    }

    /// The resident memory of its process group, MiB (the API server and its engine process).
    pub fn rss_mib(&self) -> u64 {
        let pgid = self.child.id() as i32;
        let mut kib = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            // SAFETY: getpgid has no memory arguments; it fails harmlessly for a gone pid.
            if unsafe { libc::getpgid(pid) } != pgid {
                continue;
            }
            let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
            kib += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        kib / 1024
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        let pgid = self.child.id() as i32;
        // SAFETY: kill(2) on the process group we created for our own child (its pid).
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // The engine process may outlive the API server: the whole group goes.
        // SAFETY: as above; ESRCH when the group is already gone is harmless.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Starts one server per name side by side and waits for all of them (`timeout` each from its
/// spawn); prints the start-up time and resident memory of each.
pub fn start_servers(engine: &Engine, names: &[&str], extra: &[&str], timeout: Duration) -> Vec<VllmServer> {
    start_servers_with(engine, names, extra, false, timeout)
}

/// [`start_servers`]; with `kv_events`, each server publishes its KV-cache events on free
/// ports of its own ([`VllmServer::kv_events`]).
pub fn start_servers_with(
    engine: &Engine,
    names: &[&str],
    extra: &[&str],
    kv_events: bool,
    timeout: Duration,
) -> Vec<VllmServer> {
    start_servers_as(engine, Frontend::OpenAi, names, extra, kv_events, timeout)
}

/// [`start_servers_with`] behind `frontend`.
pub fn start_servers_as(
    engine: &Engine,
    frontend: Frontend,
    names: &[&str],
    extra: &[&str],
    kv_events: bool,
    timeout: Duration,
) -> Vec<VllmServer> {
    let mut servers: Vec<VllmServer> = names
        .iter()
        .map(|n| VllmServer::spawn_as(engine, frontend, n, extra, kv_events.then(KvEventPorts::free)))
        .collect();
    for s in &mut servers {
        let took = s.wait_ready(timeout);
        eprintln!("vLLM {} on {} ready in {:.1}s", s.served(), s.addr(), took.as_secs_f64());
    }
    for s in &servers {
        eprintln!("vLLM {} on {}: {} MiB resident (API server and engine)", s.served(), s.addr(), s.rss_mib());
    }
    servers
}

/// The config of an `ailb agent` that registers `s` in Nacos as an instance of `service`: its
/// load and KV cache from its `/metrics`, no NVML (free memory = free KV cache x
/// [`KV_BYTES_PER_TOKEN`]), publishing every `publish`.
pub fn agent_config(s: &VllmServer, service: &str, nacos_url: &str, metrics_port: u16, publish: &str) -> String {
    format!(
        r#"publish_interval = "{publish}"
heartbeat_interval = "1s"
drain_timeout = "5s"
listen = "127.0.0.1:{metrics_port}"

[nacos]
servers = ["{nacos_url}"]
api = "v1"
timeout = "500ms"

[[instances]]
service = "{service}"
ip = "127.0.0.1"
port = {port}
model_id = "{service}"
gpu_type = "CPU"
supported_tasks = ["chat", "completion"]
metrics_url = "http://{addr}/metrics"
health_url = "http://{addr}/health"
server = "vllm"
nvml = false
kv_bytes_per_token = {KV_BYTES_PER_TOKEN}
"#,
        port = s.port(),
        addr = s.addr()
    )
}

/// The sum of every sample of `name` (any labels) in a Prometheus text; `None` when none.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let value = if rest.starts_with('{') { rest.split_once('}').map(|x| x.1) } else { Some(rest) };
        let Some(value) = value.filter(|v| v.starts_with(' ')) else { continue };
        if let Some(v) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Deterministic English-like filler of about `words` words, different for each `seed`
/// (a word list cycled with a small LCG): long prompts whose tokens do not repeat in short
/// cycles, so that cached blocks are the shared prefix and nothing else.
pub fn filler(seed: u64, words: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "cluster",
        "routes",
        "every",
        "request",
        "to",
        "a",
        "server",
        "whose",
        "cache",
        "holds",
        "its",
        "prefix",
        "while",
        "load",
        "stays",
        "bounded",
        "and",
        "memory",
        "fits",
        "model",
        "weights",
        "tokens",
        "blocks",
        "kernel",
        "picks",
        "backend",
        "gateway",
        "agent",
        "publishes",
        "metrics",
        "queue",
        "waiting",
        "running",
        "latency",
        "throughput",
        "conversation",
        "turn",
        "system",
        "prompt",
        "tenant",
        "user",
    ];
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(words * 7);
    for i in 0..words {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if i > 0 {
            out.push(if i % 17 == 0 { '.' } else { ' ' });
            if i % 17 == 0 {
                out.push(' ');
            }
        }
        out.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
    }
    out
}

#[cfg(test)]
mod tests;
