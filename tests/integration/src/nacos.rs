//! Nacos test harness: [`RnacosServer`], a real Nacos-compatible server (rnacos) as a
//! subprocess, with helpers that register, update and deregister instances through the v1
//! HTTP API as a GPU node would; and [`FakeNacos`], a tiny HTTP server on `127.0.0.1` that
//! answers whatever a test tells it to (garbage, the v3 shape, UDP pushes). A test that uses
//! the fake says so in its name: only rnacos results say anything about a real server.
//!
//! Nothing sleeps to wait: readiness is polled with a deadline.

use std::path::Path;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tempfile::TempDir;

/// The rnacos binary: `$RNACOS_BIN`, else `~/.cargo/bin/rnacos`. Panics when missing.
pub fn rnacos_bin() -> PathBuf {
    let path = match std::env::var_os("RNACOS_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo/bin/rnacos"),
    };
    if !path.is_file() {
        panic!(
            "rnacos not found at {} (the Nacos tests run against a real rnacos server): run `cargo xtask setup` \
             or `cargo install rnacos --version 0.8.8`, or set RNACOS_BIN",
            path.display()
        );
    }
    path
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("binding 127.0.0.1:0: {e}"));
    l.local_addr().expect("local addr").port()
}

/// One instance as a GPU node registers it.
#[derive(Debug, Clone)]
pub struct NacosInstance {
    pub service: String,
    pub ip: String,
    pub port: u16,
    pub namespace: String,
    pub group: String,
    pub cluster: String,
    pub weight: f64,
    pub enabled: bool,
    pub ephemeral: bool,
    pub metadata: BTreeMap<String, String>,
}

impl NacosInstance {
    /// `ip:port` in `service`, public namespace, `DEFAULT_GROUP`, cluster `DEFAULT`, weight 1.
    pub fn new(service: &str, ip: &str, port: u16) -> Self {
        Self {
            service: service.into(),
            ip: ip.into(),
            port,
            namespace: String::new(),
            group: "DEFAULT_GROUP".into(),
            cluster: "DEFAULT".into(),
            weight: 1.0,
            enabled: true,
            ephemeral: true,
            metadata: BTreeMap::new(),
        }
    }
    pub fn meta(mut self, k: &str, v: &str) -> Self {
        self.metadata.insert(k.into(), v.into());
        self
    }

    fn form(&self) -> Vec<(&'static str, String)> {
        let meta = serde_json::to_string(&self.metadata).expect("metadata to JSON");
        vec![
            ("serviceName", self.service.clone()),
            ("ip", self.ip.clone()),
            ("port", self.port.to_string()),
            ("namespaceId", self.namespace.clone()),
            ("groupName", self.group.clone()),
            ("clusterName", self.cluster.clone()),
            ("weight", self.weight.to_string()),
            ("enabled", self.enabled.to_string()),
            ("ephemeral", self.ephemeral.to_string()),
            ("metadata", meta),
        ]
    }
}

/// rnacos on its own ports, data dir and working directory (so no `.env` is picked up);
/// killed by pid on drop.
pub struct RnacosServer {
    child: Child,
    pub http_port: u16,
    grpc_port: u16,
    env: Vec<(String, String)>,
    token: Option<String>,
    dir: TempDir,
}

impl RnacosServer {
    /// Open API auth off.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With extra environment, e.g. `RNACOS_ENABLE_OPEN_API_AUTH=true`. With auth on, the
    /// helpers log in as `RNACOS_INIT_ADMIN_USERNAME`/`PASSWORD` (default admin/admin).
    pub fn start_with(env: &[(&str, &str)]) -> Self {
        // Seen once in about 50 starts here: no login succeeded for 30s (cause not pinned down;
        // rnacos creates its admin user once at start-up, and a lost creation would look like
        // this). Such a start is killed and retried with fresh ports and data; three failed
        // starts in a row fail the test.
        let mut last_log = String::new();
        for attempt in 1..=3 {
            match Self::try_start(env) {
                Ok(s) => return s,
                Err(log) => {
                    eprintln!("rnacos start attempt {attempt} not ready within 15s; retrying. log tail:\n{log}");
                    last_log = log;
                }
            }
        }
        panic!("rnacos did not become ready in 3 starts of 15s each; last log:\n{last_log}");
    }

    fn spawn(dir: &Path, http_port: u16, grpc_port: u16, env: &[(String, String)]) -> Child {
        let bin = rnacos_bin();
        let (data, cwd) = (dir.join("data"), dir.join("cwd"));
        std::fs::create_dir_all(&cwd).unwrap_or_else(|e| panic!("mkdir {}: {e}", cwd.display()));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("rnacos.log"))
            .unwrap_or_else(|e| panic!("log file: {e}"));
        let mut cmd = Command::new(&bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("RNACOS_") {
                cmd.env_remove(k);
            }
        }
        cmd.current_dir(&cwd)
            .env("RNACOS_DATA_DIR", &data)
            .env("RNACOS_HTTP_PORT", http_port.to_string())
            .env("RNACOS_GRPC_PORT", grpc_port.to_string())
            .env("RNACOS_HTTP_CONSOLE_PORT", "0")
            .env("RNACOS_SDK_HOST", "127.0.0.1")
            .env("RNACOS_HTTP_WORKERS", "2")
            .env("RNACOS_ENABLE_METRICS", "false")
            // Readiness is polled by logging in, and failed logins before the admin user exists
            // count against rnacos' per-user login limit (100 a minute): lift it.
            .env("RNACOS_API_LOGIN_ONE_MINUTE_LIMIT", "1000000")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        cmd.spawn().unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()))
    }

    /// Polls until a login answers with a token (it goes through raft, so naming writes work
    /// too), or returns the log tail after `timeout`.
    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let env = &self.env;
        let auth = env.iter().any(|(k, v)| k == "RNACOS_ENABLE_OPEN_API_AUTH" && v == "true");
        let user = env.iter().find(|(k, _)| k == "RNACOS_INIT_ADMIN_USERNAME").map_or("admin", |(_, v)| v).to_string();
        let pass = env.iter().find(|(k, _)| k == "RNACOS_INIT_ADMIN_PASSWORD").map_or("admin", |(_, v)| v).to_string();
        let deadline = Instant::now() + timeout;
        let token = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("rnacos exited at start-up ({status}); log:\n{}", self.log_tail());
            }
            if let Some(t) = self.login(&user, &pass) {
                break t;
            }
            if Instant::now() >= deadline {
                return Err(self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        self.token = auth.then_some(token);
        Ok(())
    }

    fn try_start(env: &[(&str, &str)]) -> Result<Self, String> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (http_port, grpc_port) = (free_port(), free_port());
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let child = Self::spawn(dir.path(), http_port, grpc_port, &env);
        // From here on, dropping `s` kills the child.
        let mut s = Self { child, http_port, grpc_port, env, token: None, dir };
        s.wait_ready(Duration::from_secs(15))?;
        Ok(s)
    }

    /// Kills the server (by pid) and reaps it: a registry outage.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same ports with the same data directory (persistent
    /// instances survive) and waits until it is ready.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Self::spawn(self.dir.path(), self.http_port, self.grpc_port, &self.env);
        if let Err(log) = self.wait_ready(Duration::from_secs(30)) {
            panic!("rnacos did not come back on port {} within 30s; log:\n{log}", self.http_port);
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The last 4 KiB of the server's log.
    pub fn log_tail(&self) -> String {
        let b = std::fs::read(self.dir.path().join("rnacos.log")).unwrap_or_default();
        String::from_utf8_lossy(&b[b.len().saturating_sub(4096)..]).into_owned()
    }

    /// `POST /nacos/v1/auth/login`: the token, or `None` when refused or not reachable.
    pub fn login(&self, user: &str, pass: &str) -> Option<String> {
        let form = [("username", user.to_string()), ("password", pass.to_string())];
        let (status, body) = http_request(self.http_port, "POST", "/nacos/v1/auth/login", &form).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        (status == 200).then(|| v["accessToken"].as_str().map(str::to_string)).flatten()
    }

    fn call(&self, method: &str, path: &str, mut form: Vec<(&'static str, String)>) -> (u16, Vec<u8>) {
        if let Some(t) = &self.token {
            form.push(("accessToken", t.clone()));
        }
        http_request(self.http_port, method, path, &form)
            .unwrap_or_else(|e| panic!("{method} {path} to rnacos: {e}; log:\n{}", self.log_tail()))
    }

    fn instance_call(&self, method: &str, inst: &NacosInstance) {
        let (status, body) = self.call(method, "/nacos/v1/ns/instance", inst.form());
        if status != 200 || body != b"ok" {
            panic!("{method} /nacos/v1/ns/instance {inst:?}: http {status}: {}", String::from_utf8_lossy(&body));
        }
    }

    /// `POST /nacos/v1/ns/instance` (metadata as a JSON string, values strings: rnacos needs that).
    pub fn register(&self, inst: &NacosInstance) {
        self.instance_call("POST", inst);
    }

    /// `PUT /nacos/v1/ns/instance`.
    pub fn update(&self, inst: &NacosInstance) {
        self.instance_call("PUT", inst);
    }

    /// `DELETE /nacos/v1/ns/instance`.
    pub fn deregister(&self, inst: &NacosInstance) {
        self.instance_call("DELETE", inst);
    }
}

impl Drop for RnacosServer {
    fn drop(&mut self) {
        // Child::kill signals this child's pid (SIGKILL); nothing else is touched.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `application/x-www-form-urlencoded` encoding.
pub fn form_encode(form: &[(&str, String)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    form.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// A minimal blocking HTTP/1.1 request to 127.0.0.1 (form body, `Connection: close`).
pub fn http_request(port: u16, method: &str, path: &str, form: &[(&str, String)]) -> Result<(u16, Vec<u8>), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let body = form_encode(form);
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no header end")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("no status")?;
    let mut body = raw[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body).ok_or("bad chunked body")?;
    }
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).ok()?.split(';').next()?.trim(), 16).ok()?;
        b = &b[nl + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct FakeRequest {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// What the fake answers. `content_length: false` sends the body delimited by closing the
/// connection (so that a client cannot refuse it from the header alone).
pub struct FakeResponse {
    pub status: u16,
    pub body: Vec<u8>,
    pub content_length: bool,
}

impl FakeResponse {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self { status, body: body.into(), content_length: true }
    }
    pub fn json(v: serde_json::Value) -> Self {
        Self::new(200, v.to_string())
    }
}

type FakeHandler = dyn Fn(&FakeRequest) -> FakeResponse + Send + Sync;

/// A fake Nacos: an HTTP/1.1 server on 127.0.0.1 that answers with a handler and records
/// every request. Not a Nacos implementation; a test double for shapes rnacos does not send.
pub struct FakeNacos {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<FakeRequest>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeNacos {
    pub fn start(handler: impl Fn(&FakeRequest) -> FakeResponse + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("fake nacos bind: {e}"));
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<FakeHandler> = Arc::new(handler);
        let (reqs, stop2) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (h, r) = (handler.clone(), reqs.clone());
                std::thread::spawn(move || serve(conn, &*h, &r));
            }
        });
        Self { port, requests, stop, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<FakeRequest> {
        self.requests.lock().expect("requests lock").clone()
    }
}

impl Drop for FakeNacos {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(conn: TcpStream, handler: &FakeHandler, log: &Mutex<Vec<FakeRequest>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut rd = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if rd.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if rd.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len = headers.get("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0).min(1 << 20);
    let mut body = vec![0; len];
    if rd.read_exact(&mut body).is_err() {
        return;
    }
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let query = q
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (url_decode(k), url_decode(v))
        })
        .collect();
    let req = FakeRequest { method, path: path.to_string(), query, headers, body };
    log.lock().expect("requests lock").push(req.clone());
    let resp = handler(&req);
    let mut out = conn;
    let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\nContent-Type: application/json\r\n", resp.status);
    if resp.content_length {
        head.push_str(&format!("Content-Length: {}\r\n", resp.body.len()));
    }
    head.push_str("\r\n");
    // The client may hang up early (an answer it refuses): write errors are expected.
    let _ = out.write_all(head.as_bytes()).and_then(|()| out.write_all(&resp.body));
}
