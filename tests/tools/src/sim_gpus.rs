//! A simulated GPU fleet as processes: `ailb-sim` servers that drive a fake NVML library each,
//! and the `ailb agent`s that read them and register the instances in Nacos. Shared by the demo
//! (`ailb-demo`) and the policy comparison (`ailb-compare`, "ailb in full").

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use ailb_sim::GpuProfile;
use ailb_tests::agent_harness::FakeNvml;
use ailb_tests::nacos::free_port;

/// A child process stopped by its pid on drop (SIGTERM, then SIGKILL after 10 s).
pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Proc {
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        // 10 s: SMG keeps its listener open for 5 s after SIGTERM before it exits.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not stop on SIGTERM: SIGKILL", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on a loopback server (HTTP/1.1, `Connection: close`, 500 ms timeouts, at most
/// 1 MiB): the status and the body (dechunked), or `None`.
pub fn http_get(addr: SocketAddrV4, path: &str) -> Option<(u16, String)> {
    let t = Duration::from_millis(500);
    let mut s = TcpStream::connect_timeout(&addr.into(), t).ok()?;
    s.set_read_timeout(Some(t)).ok()?;
    s.set_write_timeout(Some(t)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Some((status, if chunked { dechunk(body) } else { body.to_string() }))
}

/// The body of a 200 answer to `GET path`.
pub fn get_ok(addr: SocketAddrV4, path: &str) -> Option<String> {
    http_get(addr, path).and_then(|(status, body)| (status == 200).then_some(body))
}

/// Decodes a complete HTTP/1.1 chunked body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    for _ in 0..10_000 {
        let Some((size, rest)) = s.split_once("\r\n") else { break };
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Spawns `ailb-sim` on `addr` keeping `nvml`'s state file up to date, and waits for its
/// `/health` (30 s at most).
fn spawn_sim(addr: SocketAddrV4, profile: &'static str, nvml: &FakeNvml, o: &SimOpts) -> anyhow::Result<Proc> {
    let state = Path::new(&nvml.lib()).with_file_name("state");
    let (out, err) = match &o.log {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            (Stdio::from(f.try_clone()?), Stdio::from(f))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let child = Command::new(o.sim_bin)
        .args(["--listen", &addr.to_string(), "--profile", profile, "--model", o.model])
        .args(["--time-scale", &o.time_scale.to_string()])
        .args(["--sample-interval-ms", &o.sample_interval_ms.to_string()])
        .arg("--nvml-state")
        .arg(&state)
        .args(tokenizer_args(addr, o.tokenizer))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("spawning {}", o.sim_bin.display()))?;
    let mut sim = Proc { name: format!("ailb-sim {addr}"), child };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = sim.exited() {
            bail!("ailb-sim on {addr} exited ({st}) before answering /health");
        }
        if get_ok(addr, "/health").is_some() {
            return Ok(sim);
        }
        if Instant::now() >= deadline {
            bail!("ailb-sim on {addr} did not answer /health within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ailb-sim`'s options of a tokenizing server ([`SimOpts::tokenizer`]); none without one.
fn tokenizer_args(addr: SocketAddrV4, tokenizer: Option<&Path>) -> Vec<std::ffi::OsString> {
    let Some(dir) = tokenizer else {
        return Vec::new();
    };
    let (events, replay) = kv_events_endpoints(addr);
    let mut a: Vec<std::ffi::OsString> = vec!["--tokenizer".into(), dir.into()];
    for s in ["--kv-events-endpoint", &events, "--kv-events-replay-endpoint", &replay, "--kv-block-size"] {
        a.push(s.into());
    }
    a.push(SIM_KV_BLOCK_SIZE.to_string().into());
    a
}

/// A binary next to the running one (`ailb-sim`'s and these tools' binaries are built into one
/// profile directory: `cargo xtask run` and `cargo xtask bench` build them together).
pub fn sibling_bin(name: &str) -> PathBuf {
    std::env::current_exe().map(|p| p.with_file_name(name)).unwrap_or_else(|_| PathBuf::from(name))
}

/// One simulated GPU: an `ailb-sim` server keeping the state of its fake NVML library.
pub struct SimGpu {
    pub addr: SocketAddrV4,
    pub profile: &'static str,
    pub sim: Proc,
    pub nvml: FakeNvml,
    /// The server's KV-event publisher and replay endpoints, when it tokenizes
    /// ([`SimOpts::tokenizer`]).
    pub kv_events: Option<(String, String)>,
    /// Simulated seconds per second of wall time: its agent smooths the prompt-token rate over
    /// the agent's default window in simulated time.
    pub time_scale: f64,
}

/// The agent's `prompt_rate_window` for a server `time_scale` times faster than real time, in
/// ms: the default window in simulated time, at least the config's minimum (100 ms).
fn prompt_rate_window_ms(time_scale: f64) -> u64 {
    let default_ms = ailb_userspace::telemetry::source::DEFAULT_PROMPT_RATE_WINDOW.as_millis() as f64;
    (default_ms / time_scale.max(1e-3)).round().max(100.0) as u64
}

/// Options of [`SimGpu::start`].
pub struct SimOpts<'a> {
    pub sim_bin: &'a Path,
    pub model: &'a str,
    pub time_scale: f64,
    pub sample_interval_ms: u64,
    /// The server's log (stdout and stderr); `None`: discarded.
    pub log: Option<PathBuf>,
    /// A model folder: the server tokenizes every prompt with its tokenizer and chat template
    /// as vLLM does, and publishes KV events in vLLM's format on [`kv_events_endpoints`] in
    /// blocks of [`SIM_KV_BLOCK_SIZE`] tokens, for a gateway in precise prefix mode.
    pub tokenizer: Option<&'a Path>,
}

/// The KV block size, in tokens, of a tokenizing server's events: the simulator's own block,
/// which is also the block a front door in front of it is configured with (its
/// `[gateway.kv_block_tokens]`, the block of its token-exact keys as of its memory estimate).
pub const SIM_KV_BLOCK_SIZE: u32 = ailb_sim::gpu::BLOCK_TOKENS as u32;

/// The KV-event publisher and replay endpoints of a tokenizing server on `addr`: its own IP,
/// ports 1,000 and 2,000 above its HTTP port.
pub fn kv_events_endpoints(addr: SocketAddrV4) -> (String, String) {
    let ep = |off: u16| format!("tcp://{}:{}", addr.ip(), addr.port().wrapping_add(off));
    (ep(1000), ep(2000))
}

impl SimGpu {
    /// Builds the fake NVML library (gcc), starts the server with `--nvml-state` pointing at the
    /// library's state file, and waits for its `/health`.
    pub fn start(addr: SocketAddrV4, profile: &'static str, o: &SimOpts) -> anyhow::Result<Self> {
        let preset = GpuProfile::preset(profile).with_context(|| format!("GPU preset {profile}"))?;
        let nvml = FakeNvml::build(&format!(
            "count 1\n0 name {}\n0 uuid GPU-sim-{addr}\n0 total_mb {}\n0 used_mb 0\n0 util 0\n",
            preset.gpu_type, preset.gpu_memory_mb
        ));
        let sim = spawn_sim(addr, profile, &nvml, o)?;
        Ok(SimGpu {
            addr,
            profile,
            sim,
            nvml,
            kv_events: o.tokenizer.map(|_| kv_events_endpoints(addr)),
            time_scale: o.time_scale,
        })
    }

    /// Starts the server again (after it was killed) on the same address and the same fake
    /// NVML state file, and waits for its `/health`.
    pub fn restart(&mut self, o: &SimOpts) -> anyhow::Result<()> {
        if self.sim.exited().is_none() {
            bail!("ailb-sim on {} is still running", self.addr);
        }
        self.sim = spawn_sim(self.addr, self.profile, &self.nvml, o)?;
        Ok(())
    }

    /// The fake NVML state file the server keeps up to date.
    pub fn nvml_state(&self) -> PathBuf {
        Path::new(&self.nvml.lib()).with_file_name("state")
    }

    /// The GPU type its NVML reports (the preset's).
    pub fn gpu_type(&self) -> String {
        GpuProfile::preset(self.profile).map(|p| p.gpu_type).unwrap_or_default()
    }

    /// Starts `ailb agent` for this GPU: NVML through the fake library, vLLM metrics from the
    /// server, registration as `model` in the Nacos at `nacos_url`, publishing every `publish`.
    /// Its config and log go to `dir`.
    pub fn start_agent(&self, model: &str, nacos_url: &str, publish: &str, dir: &Path) -> anyhow::Result<Proc> {
        let (config, log) = self.write_agent_config(model, nacos_url, publish, dir)?;
        spawn_agent(self.addr, &config, &log, &[])
    }

    /// Writes the config of [`SimGpu::start_agent`] into `dir`; returns its path and the path
    /// of the agent's log next to it.
    pub fn write_agent_config(
        &self,
        model: &str,
        nacos_url: &str,
        publish: &str,
        dir: &Path,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let addr = self.addr;
        let cfg = format!(
            r#"publish_interval = "{publish}"
heartbeat_interval = "5s"
drain_timeout = "5s"
prompt_rate_window = "{window_ms}ms"
listen = "127.0.0.1:{metrics_port}"
nvml_library = "{lib}"

[nacos]
servers = ["{nacos_url}"]
api = "v1"
timeout = "500ms"

[[instances]]
service = "{model}"
ip = "{ip}"
port = {port}
model_id = "{model}"
gpu_type = "{gpu_type}"
supported_tasks = ["chat"]
gpus = [0]
metrics_url = "http://{addr}/metrics"
health_url = "http://{addr}/health"
server = "vllm"
nvml = true
{kv}"#,
            window_ms = prompt_rate_window_ms(self.time_scale),
            metrics_port = free_port(),
            lib = self.nvml.lib(),
            ip = addr.ip(),
            port = addr.port(),
            gpu_type = self.gpu_type(),
            kv = self.kv_events.as_ref().map_or_else(String::new, |(events, replay)| format!(
                "kv_events = \"{events}\"\nkv_replay = \"{replay}\"\nkv_block_size = {SIM_KV_BLOCK_SIZE}\n"
            )),
        );
        let path = dir.join(format!("{}.toml", self.agent_stem()));
        std::fs::write(&path, cfg).with_context(|| format!("writing {}", path.display()))?;
        Ok((path, self.agent_log(dir)))
    }

    /// The log of this GPU's agent started with `dir` ([`SimGpu::start_agent`]).
    pub fn agent_log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.log", self.agent_stem()))
    }

    fn agent_stem(&self) -> String {
        format!("agent-{}-{}", self.addr.ip(), self.addr.port())
    }
}

/// Starts `ailb agent --config CONFIG` for the GPU at `addr`, appending to `log`, with the
/// extra environment `env` (e.g. `FAKE_NVML_STATE`, the fake library's state file).
pub fn spawn_agent(addr: SocketAddrV4, config: &Path, log: &Path, env: &[(String, String)]) -> anyhow::Result<Proc> {
    let log = std::fs::File::options().create(true).append(true).open(log)?;
    let child = Command::new(ailb_tests::ailb_bin())
        .args(["agent", "--config"])
        .arg(config)
        .env("AILB_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting ailb agent")?;
    Ok(Proc { name: format!("ailb agent {addr}"), child })
}
