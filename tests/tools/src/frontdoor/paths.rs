//! The paths measured, each in front of the same one simulated server: none (direct), the
//! front door (one per `upstream_reuse` and `http1_fast_path` variant), nginx as an L7 proxy with upstream
//! keep-alive, `sglang-router` and `vllm-router`, and a relay that does no HTTP work (HAProxy in
//! TCP mode), the floor under them all. Each is started here, ready before it is
//! measured, and stopped by pid on drop ([`Proc`]).

use std::io::{Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::CgroupGuard;
use anyhow::{bail, Context};

use super::report::Role;
use super::{wrk, GATEWAY_BASE_PORT, GATEWAY_IP, MODEL, NGINX, RELAY, SGLANG, SIM, VIP, VLLM};
use crate::compare::{front_door, peers, policy::Policy};
use crate::sim_gpus::Proc;

/// The simulated server's time scale: a one-token completion of a short prompt is about
/// 26 ms of simulated GPU time (prefill at 8,000 tokens/s, one decode step at 40/s on the
/// a100-80gb preset), 26 ns of real time at this scale: the server answers at once, so every
/// path measures the HTTP work alone.
pub const SIM_TIME_SCALE: f64 = 1_000_000.0;

/// One path: its name in the report, its URL, the process on the request path (none for
/// direct), or why it is not measured.
pub struct Target {
    pub name: String,
    pub role: Role,
    /// Its settings, for the report.
    pub settings: String,
    pub url: String,
    pub proc: Option<Proc>,
    pub missing: Option<String>,
}

impl Target {
    /// The router's pid (`None`: direct, or not running).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }
}

fn url(addr: impl std::fmt::Display) -> String {
    format!("http://{addr}/v1/chat/completions")
}

/// The simulated server (`ailb-sim`), ready once it answers `/health` (30 s at most).
pub fn start_sim(sim_bin: &Path, dir: &Path) -> anyhow::Result<Proc> {
    let log = std::fs::File::create(dir.join("sim.log")).context("sim log")?;
    let child = Command::new(sim_bin)
        .args(["--listen", SIM, "--profile", "a100-80gb", "--model", MODEL])
        .args(["--time-scale", &SIM_TIME_SCALE.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("spawning {}", sim_bin.display()))?;
    let mut proc = Proc { name: format!("ailb-sim {SIM}"), child };
    let addr: SocketAddrV4 = SIM.parse().expect("SIM is an address");
    let deadline = Instant::now() + Duration::from_secs(30);
    while crate::sim_gpus::get_ok(addr, "/health").is_none() {
        if let Some(st) = proc.exited() {
            bail!("ailb-sim exited ({st}): {}", std::fs::read_to_string(dir.join("sim.log")).unwrap_or_default());
        }
        if Instant::now() >= deadline {
            bail!("ailb-sim on {SIM} did not answer /health within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(proc)
}

/// The direct path: wrk to the server itself.
pub fn direct() -> Target {
    Target {
        name: "direct to the server (no router)".into(),
        role: Role::Direct,
        settings: String::new(),
        url: url(SIM),
        proc: None,
        missing: None,
    }
}

/// One front-door setting measured: `[gateway] upstream_reuse`, `http1_fast_path` and, when
/// given, `upstream_idle_mark_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub reuse: &'static str,
    pub fast: bool,
    pub idle_mark_after: Option<&'static str>,
}

/// The `[gateway]` section of the front door for variant `v`, listening on `listen`; every
/// other key keeps its default. Warnings-only logging comes from `AILB_LOG`.
pub fn gateway_toml(listen: SocketAddrV4, v: &Variant) -> String {
    let Variant { reuse, fast, idle_mark_after } = v;
    let mut t =
        format!("\n[gateway]\nlisten = [\"{listen}\"]\nupstream_reuse = \"{reuse}\"\nhttp1_fast_path = {fast}\n");
    if let Some(d) = idle_mark_after {
        t.push_str(&format!("upstream_idle_mark_after = \"{d}\"\n"));
    }
    t
}

/// `ailb gateway` inside `cg`, reading the daemon's catalog (`catalog`, the daemon's config
/// text) plus its own `[gateway]` section, one per variant (index `i` gives its port).
pub fn gateway(ailb: &Path, catalog: &str, cg: &CgroupGuard, v: &Variant, i: usize, dir: &Path) -> Target {
    let Variant { reuse, fast, idle_mark_after } = *v;
    let listen = SocketAddrV4::new(GATEWAY_IP.parse().expect("GATEWAY_IP"), GATEWAY_BASE_PORT + i as u16);
    let hyper = if fast { "" } else { ", http1_fast_path = false (hyper)" };
    let mark = idle_mark_after.map(|d| format!(", upstream_idle_mark_after = \"{d}\"")).unwrap_or_default();
    let name = format!("ailb gateway, upstream_reuse = \"{reuse}\"{mark}{hyper}");
    let settings = format!(
        "daemon attached to the child cgroup, the gateway inside it; the server is the model's only backend \
         (static config, VIP {VIP}); `AILB_LOG=warn`; `[gateway] upstream_reuse = \"{reuse}\"`, \
         `http1_fast_path = {fast}`{}, other keys default",
        idle_mark_after.map(|d| format!(", `upstream_idle_mark_after = \"{d}\"`")).unwrap_or_default()
    );
    let sub = dir.join(format!("gateway-{i}-{reuse}-{}", if fast { "fast" } else { "hyper" }));
    let started = start_gateway(ailb, catalog, Some(cg), v, listen, &sub);
    finish(name, Role::Ailb, settings, url(listen), started)
}

/// `ailb gateway` (in `cg`, if any) on `catalog` plus the `[gateway]` section of `v`, its
/// config and log in `sub`.
fn start_gateway(
    ailb: &Path,
    catalog: &str,
    cg: Option<&CgroupGuard>,
    v: &Variant,
    listen: SocketAddrV4,
    sub: &Path,
) -> anyhow::Result<Proc> {
    std::fs::create_dir_all(sub)?;
    let cfg = sub.join("ailb.toml");
    std::fs::write(&cfg, format!("{catalog}{}", gateway_toml(listen, v)))?;
    front_door::start(ailb, &cfg, cg, listen, sub)
}

/// The default front door (`conversation`, fast path) run OUTSIDE the cgroup, its model's VIP
/// the server's own address and no pins to read: no kernel pick, no in-flight counts, no idle
/// marks. Not a deployment; beside the same front door inside the cgroup it shows what the
/// kernel's part costs per request. Its catalog's backend entry is never used.
pub fn gateway_outside(ailb: &Path, i: usize, dir: &Path) -> Target {
    let listen = SocketAddrV4::new(GATEWAY_IP.parse().expect("GATEWAY_IP"), GATEWAY_BASE_PORT + i as u16);
    let v = Variant { reuse: "conversation", fast: true, idle_mark_after: None };
    let name = "ailb gateway, the default, outside the cgroup (no kernel pick)".to_string();
    let settings = format!(
        "no daemon, the gateway outside the cgroup, the model's VIP the server's own address ({SIM}), no pins; \
         `AILB_LOG=warn`; `[gateway] upstream_reuse = \"conversation\"`, `http1_fast_path = true`, other keys default"
    );
    let sub = dir.join("gateway-outside");
    let catalog = format!(
        "[daemon]\nbpffs = \"{}\"\ncgroup = \"ailb-frontdoor-none\"\n[[services]]\nmodel = \"{MODEL}\"\n\
         vip = \"{SIM}\"\n[[backends]]\nmodel = \"{MODEL}\"\naddress = \"127.0.0.12:18001\"\nweight = 1\n",
        sub.join("no-pins").display()
    );
    let started = start_gateway(ailb, &catalog, None, &v, listen, &sub);
    finish(name, Role::Reference, settings, url(listen), started)
}

/// nginx as an L7 proxy with the upstream keep-alive its docs recommend (`keepalive` in the
/// upstream block, HTTP/1.1 and an empty `Connection` header upstream); `worker_processes
/// auto` as in a distribution's default config; no access log (the routers log no request
/// line either).
pub fn nginx(dir: &Path) -> Target {
    let settings = "`worker_processes auto`, `upstream { server SIM; keepalive 32; }`, `proxy_http_version 1.1`, \
                    `proxy_set_header Connection \"\"`, `access_log off`, other settings default";
    let started = (|| {
        let conf = dir.join("nginx.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "worker_processes auto;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/nginx.err warn;\n\
                 events {{ worker_connections 4096; }}\n\
                 http {{\n access_log off;\n client_body_temp_path {d}/ngx_body;\n proxy_temp_path {d}/ngx_proxy;\n\
                 fastcgi_temp_path {d}/ngx_f;\n uwsgi_temp_path {d}/ngx_u;\n scgi_temp_path {d}/ngx_s;\n\
                 upstream sim {{ server {SIM}; keepalive 32; }}\n\
                 server {{ listen {NGINX}; location / {{ proxy_pass http://sim; proxy_http_version 1.1; \
                 proxy_set_header Connection \"\"; }} }}\n}}\n"
            ),
        )?;
        spawn_answering(Command::new("nginx").arg("-c").arg(&conf), NGINX)
    })();
    finish("nginx L7 proxy, upstream keep-alive".into(), Role::Peer, settings.into(), url(NGINX), started)
}

/// HAProxy in TCP mode (`nbthread` one per core, as its default): a relay that does no HTTP
/// work, each client connection spliced to one of its own to the server. Not a peer: it shows
/// what the two extra loopback hops of any userspace proxy cost here, the floor under every
/// proxy's added latency.
pub fn relay(dir: &Path) -> Target {
    let settings = "`mode tcp`, one `server SIM`, `timeout connect 5s`, `timeout client 60s`, `timeout server 60s`, \
                    other settings default (one thread per core)";
    let started = (|| {
        let conf = dir.join("haproxy.cfg");
        std::fs::write(
            &conf,
            format!(
                "global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  \
                 timeout server 60s\nfrontend f\n  bind {RELAY}\n  default_backend b\nbackend b\n  server sim {SIM}\n"
            ),
        )?;
        spawn_answering(Command::new("haproxy").args(["-db", "-f"]).arg(&conf), RELAY)
    })();
    finish("HAProxy TCP relay (no HTTP work: the floor)".into(), Role::Floor, settings.into(), url(RELAY), started)
}

/// `sglang-router` or `vllm-router` from the peers' venv with its defaults (policy
/// `cache_aware` in both), `--log-level warn(ing)` (their default logs a line per request).
pub fn peer(policy: Policy, venv: &Path, dir: &Path) -> Target {
    let (name, addr) = match policy {
        Policy::SglangCacheAware => ("sglang-router (defaults)", SGLANG),
        _ => ("vllm-router (defaults)", VLLM),
    };
    let listen: SocketAddrV4 = addr.parse().expect("peer address");
    let metrics = SocketAddrV4::new(*listen.ip(), 29_000);
    let settings = format!(
        "`{}`",
        peers::args(policy, listen, metrics, &[format!("http://{SIM}")])
            .join(" ")
            .replace(&format!("http://{SIM}"), "SIM")
    );
    if let Some(why) = peers::missing(policy, venv) {
        return Target {
            name: name.into(),
            role: Role::Peer,
            settings,
            url: url(listen),
            proc: None,
            missing: Some(why),
        };
    }
    let started = peers::start(policy, venv, listen, metrics, &[SIM.parse().expect("SIM")], dir);
    finish(name.into(), Role::Peer, settings, url(listen), started)
}

fn finish(name: String, role: Role, settings: String, url: String, started: anyhow::Result<Proc>) -> Target {
    match started {
        Ok(p) => Target { name, role, settings, url, proc: Some(p), missing: None },
        Err(e) => Target { name, role, settings, url, proc: None, missing: Some(format!("did not start: {e:#}")) },
    }
}

/// Starts `cmd` (its output discarded) and waits until it answers the bench's request on `addr`.
fn spawn_answering(cmd: &mut Command, addr: &str) -> anyhow::Result<Proc> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {name} (`cargo xtask setup` installs it)"))?;
    let mut proc = Proc { name, child };
    wait_answering(&mut proc, addr.parse().with_context(|| format!("the address {addr}"))?)?;
    Ok(proc)
}

/// Polls until `addr` answers the bench's request with 200 (20 s at most).
fn wait_answering(proc: &mut Proc, addr: SocketAddrV4) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = proc.exited() {
            bail!("{} exited ({st})", proc.name);
        }
        if post_status(addr).is_ok_and(|(s, _)| s == 200) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{} did not answer 200 on {addr} within 20 s", proc.name);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// POSTs the bench's request once (`Connection: close`): the status and the response head.
pub fn post_status(addr: SocketAddrV4) -> anyhow::Result<(u16, String)> {
    let t = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr.into(), t).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(t))?;
    let body = wrk::body();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         X-Session-ID: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        wrk::SESSION,
        body.len()
    )?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_string();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
    Ok((status, head))
}

#[cfg(test)]
mod tests;
