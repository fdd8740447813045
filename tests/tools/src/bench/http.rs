//! Requests per second through each path to the same backends: directly, the ailb VIP, an
//! nginx L7 proxy, HAProxy in TCP mode and IPVS (where the kernel has it), all in the bench's
//! network namespace.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ailb_tests::CgroupGuard;

use super::netns::{kernel_config, output_in, wait_listening, Netns, Proc};
use super::{say, BACKENDS, HAPROXY, IPVS_VIP, PROXY, ROUNDS, VIP, WRK_CONNECTIONS, WRK_SECONDS};

/// The backends (one nginx process serving every backend address), the nginx proxy and
/// HAProxy in front of them, each stopped by pid on drop.
pub(super) struct Servers {
    _backends: Proc,
    _proxy: Proc,
    _haproxy: Proc,
}

impl Servers {
    /// Starts them with their configs in `work` and waits until each listens.
    pub(super) fn start(ns: &Netns, work: &Path) -> Servers {
        let mut servers = String::new();
        for b in BACKENDS {
            let _ = writeln!(servers, " server {{ listen {b} backlog=4096; location / {{ return 200 \"{b}\\n\"; }} }}");
        }
        let conf = nginx_conf(work, "backends", &servers);
        let _backends = start_nginx(ns, &conf, "backends");
        let upstream = format!(
            " upstream b {{ {} }}\n server {{ listen {PROXY} backlog=4096; location / {{ proxy_pass http://b; }} }}\n",
            BACKENDS.iter().map(|b| format!("server {b};")).collect::<String>()
        );
        let pconf = nginx_conf(work, "proxy", &upstream);
        let _proxy = start_nginx(ns, &pconf, "nginx proxy");
        let _haproxy = start_haproxy(ns, work);
        for b in BACKENDS.iter().chain([&PROXY, &HAPROXY]) {
            wait_listening(ns, b);
        }
        Servers { _backends, _proxy, _haproxy }
    }
}

fn nginx_conf(dir: &Path, name: &str, http: &str) -> PathBuf {
    let p = dir.join(format!("{name}.conf"));
    let text = format!(
        "worker_processes 1;\ndaemon off;\npid {dir}/{name}.pid;\nerror_log {dir}/{name}.err warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n access_log off;\n keepalive_timeout 0;\n client_body_temp_path {dir}/tmp_{name};\n\
         proxy_temp_path {dir}/ptmp_{name};\n fastcgi_temp_path {dir}/f_{name};\n uwsgi_temp_path {dir}/u_{name};\n\
         scgi_temp_path {dir}/s_{name};\n{http}}}\n",
        dir = dir.display()
    );
    std::fs::write(&p, text).expect("write nginx conf");
    p
}

fn start_nginx(ns: &Netns, conf: &Path, what: &str) -> Proc {
    let child = ns
        .command("nginx", &["-c", conf.to_str().expect("utf-8 path")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting nginx ({what}): {e}"));
    Proc(child)
}

/// HAProxy in TCP mode, round robin over the backends, its config in `work`.
fn start_haproxy(ns: &Netns, work: &Path) -> Proc {
    let hconf = work.join("haproxy.cfg");
    let servers: String = BACKENDS.iter().enumerate().map(|(i, b)| format!("  server s{i} {b}\n")).collect();
    std::fs::write(
        &hconf,
        format!(
            "global\n  maxconn 8000\n  nbthread 1\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  \
             timeout server 30s\nfrontend f\n  bind {HAPROXY}\n  default_backend b\nbackend b\n  balance roundrobin\n{servers}"
        ),
    )
    .expect("write haproxy.cfg");
    Proc(
        ns.command("haproxy", &["-db", "-f", hconf.to_str().expect("utf-8 path")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting haproxy: {e}")),
    )
}

/// IPVS round robin (inside the namespace; removed with it), where the kernel has IPVS.
pub(super) struct Ipvs {
    /// `CONFIG_IP_VS` of this kernel (`None`: not set or unknown).
    in_kernel: Option<String>,
    /// Whether ipvsadm configured the virtual service and its real servers.
    ok: bool,
}

impl Ipvs {
    pub(super) fn setup(ns: &Netns) -> Ipvs {
        let in_kernel = kernel_config("CONFIG_IP_VS");
        let ok = in_kernel.as_deref().is_some_and(|v| v == "y" || v == "m") && {
            let mut ok = Command::new("ip")
                .args(["netns", "exec", &ns.name, "ipvsadm", "-A", "-t", IPVS_VIP, "-s", "rr"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            for b in BACKENDS {
                ok &= Command::new("ip")
                    .args(["netns", "exec", &ns.name, "ipvsadm", "-a", "-t", IPVS_VIP, "-r", b, "-m"])
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
            }
            ok
        };
        Ipvs { in_kernel, ok }
    }
}

/// One path measured: its name in the report, its URL, whether wrk runs in the bench's cgroup
/// (to reach the ailb VIP), its rate in every round and wrk's errors.
struct Variant {
    name: &'static str,
    url: String,
    in_cgroup: bool,
    rounds: Vec<f64>,
    /// wrk's socket errors and non-2xx answers, of the last round that had any.
    errors: String,
}

/// Section 1: measures every path in `ROUNDS` interleaved rounds (after a probe of the VIP)
/// and writes the table.
pub(super) fn requests_per_second(ns: &Netns, cg: &CgroupGuard, ipvs: &Ipvs, report: &mut String) {
    let vip_url = format!("http://{VIP}/");
    let mut variants = vec![
        Variant::new("direct to one backend (no balancer)", format!("http://{}/", BACKENDS[0]), false),
        Variant::new("ailb VIP (3 backends, cgroup connect4)", vip_url.clone(), true),
        Variant::new("nginx round-robin proxy, L7 (3 backends)", format!("http://{PROXY}/"), false),
        Variant::new("HAProxy round robin, TCP mode (3 backends)", format!("http://{HAPROXY}/"), false),
    ];
    if ipvs.ok {
        variants.push(Variant::new("IPVS round robin, NAT (3 backends)", format!("http://{IPVS_VIP}/"), false));
    }
    // The VIP must work before measuring it.
    let (probe, _) = wrk(ns, &vip_url, Some(cg));
    assert!(probe > 0.0, "no request through the ailb VIP succeeded");
    for round in 0..ROUNDS {
        for v in variants.iter_mut() {
            say(&format!("round {}/{ROUNDS}: {}", round + 1, v.name));
            let (rps, err) = wrk(ns, &v.url, if v.in_cgroup { Some(cg) } else { None });
            v.rounds.push(rps);
            if !err.is_empty() {
                v.errors = err;
            }
        }
    }
    rps_table(report, &variants, ipvs);
}

impl Variant {
    fn new(name: &'static str, url: String, in_cgroup: bool) -> Variant {
        Variant { name, url, in_cgroup, rounds: Vec::new(), errors: String::new() }
    }
}

fn rps_table(report: &mut String, variants: &[Variant], ipvs: &Ipvs) {
    let direct = median(&mut variants[0].rounds.clone());
    let _ = writeln!(
        report,
        "## Requests per second, new connection per request\n\n`wrk -t1 -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s -H 'Connection: close'`, \
         {ROUNDS} interleaved rounds, median; backends: one nginx worker serving 3 loopback addresses; \
         all in a private network namespace.\n\n| path | req/s (median) | rounds | ratio to direct | errors |\n|---|---:|---|---:|---|"
    );
    for v in variants {
        let m = median(&mut v.rounds.clone());
        let rounds = v.rounds.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ");
        let _ = writeln!(report, "| {} | {m:.0} | {rounds} | {:.3}x | {} |", v.name, m / direct, v.errors);
    }
    if !ipvs.ok {
        let why = match ipvs.in_kernel.as_deref() {
            Some("y" | "m") => "ipvsadm could not configure it in the namespace".to_string(),
            Some(v) => format!("this kernel is built without it (CONFIG_IP_VS={v})"),
            None => "this kernel is built without it (CONFIG_IP_VS is not set)".to_string(),
        };
        let _ = writeln!(
            report,
            "\nIPVS: not measured: {why}. HAProxy in TCP mode is the L4 round-robin baseline instead."
        );
    }
}

/// Runs wrk once; returns (requests per second, error summary).
fn wrk(ns: &Netns, url: &str, cgroup: Option<&CgroupGuard>) -> (f64, String) {
    let d = format!("{WRK_SECONDS}s");
    let c = WRK_CONNECTIONS.to_string();
    let out = output_in(ns.command("wrk", &["-t1", "-c", &c, "-d", &d, "-H", "Connection: close", url]), cgroup);
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:").map(|v| v.trim().parse::<f64>().unwrap_or(0.0)))
        .unwrap_or_else(|| {
            panic!("wrk printed no Requests/sec for {url}:\n{text}{}", String::from_utf8_lossy(&out.stderr))
        });
    let errors = text
        .lines()
        .filter(|l| l.contains("Socket errors") || l.contains("Non-2xx"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ");
    (rps, errors)
}

pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
