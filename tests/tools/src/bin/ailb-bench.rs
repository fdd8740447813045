//! `ailb-bench`: data-plane benchmarks, run as root by `cargo xtask bench`.
//!
//! Everything network happens inside a network namespace this program creates (loopback only),
//! and the ailb programs attach to a child cgroup it creates; both are removed on exit.
//!
//! 1. Requests per second of small HTTP requests, one new connection per request
//!    (`wrk -H "Connection: close"`), measured side by side in interleaved rounds:
//!    directly to one backend (no balancer), via the ailb VIP (3 backends), via an nginx
//!    round-robin proxy (L7, 3 backends), via HAProxy in TCP mode (L4 round robin) and via IPVS
//!    round robin where the kernel has it (`CONFIG_IP_VS`). The backends are one nginx process
//!    with one worker serving all three addresses, so every path has the same backend capacity.
//! 2. `connect4` run time from the kernel's BPF statistics (`kernel.bpf_stats_enabled`) with a
//!    1,000-backend model and 100,000 affinity entries.
//! 3. Table build and swap time of the 1,000-backend model on a weight change (daemon log).
//!
//! Writes `target/bench/datapath.md` and prints it.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::{base_config, preflight, BackendCfg, CgroupGuard, Daemon};

const ROUNDS: usize = 3;
const WRK_SECONDS: u32 = 5;
const WRK_CONNECTIONS: u32 = 32;
const VIP: &str = "127.77.0.1:80";
const BIG_VIP: &str = "127.77.1.1:80";
const BACKENDS: [&str; 3] = ["127.0.0.11:18001", "127.0.0.12:18002", "127.0.0.13:18003"];
const PROXY: &str = "127.0.0.20:8080";
const IPVS_VIP: &str = "127.0.0.30:80";
const HAPROXY: &str = "127.0.0.21:8080";
const AFFINITY_ENTRIES: usize = 100_000;
const MEASURE_CONNECTS: usize = 50_000;

fn say(msg: &str) {
    eprintln!("[bench {:>6.1}s] {msg}", START.with(|s| s.elapsed().as_secs_f64()));
}

thread_local! {
    static START: Instant = Instant::now();
}

/// A network namespace with `lo` up, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Self {
        let name = format!("ailb-bench-{}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]), "ip netns add");
        let ns = Self { name };
        run(Command::new("ip").args(["netns", "exec", &ns.name, "ip", "link", "set", "lo", "up"]), "lo up");
        ns
    }

    /// `ip netns exec NS program args...`.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]).args(args);
        c
    }
}

/// Runs `cmd` to completion, inside `cgroup` when given (moved in between fork and exec).
fn output_in(mut cmd: Command, cgroup: Option<&CgroupGuard>) -> std::process::Output {
    let Some(cg) = cgroup else {
        return cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = spawn_in_cgroup(&mut cmd, cg.path());
    child.wait_with_output().unwrap_or_else(|e| panic!("waiting for {cmd:?}: {e}"))
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A child process killed (by its pid) on drop.
struct Proc(Child);

impl Drop for Proc {
    /// SIGTERM first, so that a master process (nginx) stops its own workers; SIGKILL only if
    /// it is still there after 5 s. Both by the child's pid.
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of our own child, not reaped yet.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what}: {cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls until a TCP connect to `addr` succeeds from inside the namespace (deadline 10 s).
fn wait_listening(ns: &Netns, addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (host, port) = addr.split_once(':').expect("addr");
    while Instant::now() < deadline {
        let ok = Command::new("ip")
            .args(["netns", "exec", &ns.name, "bash", "-c", &format!("exec 3<>/dev/tcp/{host}/{port}")])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {addr} in {} after 10 s", ns.name);
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// (run_cnt, run_time_ns) of the loaded `ailb_connect4` program(s) attached by this bench.
fn connect4_stats(prog_id: u64) -> (u64, u64) {
    let out =
        run(Command::new("bpftool").args(["prog", "show", "id", &prog_id.to_string(), "--json"]), "bpftool prog show");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bpftool json");
    (v["run_cnt"].as_u64().unwrap_or(0), v["run_time_ns"].as_u64().unwrap_or(0))
}

/// The ids of the (connect4, setsockopt, sock_ops) programs attached to `cg`.
fn program_ids(cg: &CgroupGuard) -> [u64; 3] {
    let out = run(
        Command::new("bpftool").args(["cgroup", "show", cg.path().to_str().expect("utf-8"), "--json"]),
        "bpftool cgroup show",
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("bpftool json");
    ["cgroup_inet4_connect", "cgroup_setsockopt", "cgroup_sock_ops"].map(|t| {
        v.as_array()
            .and_then(|a| a.iter().find(|p| p["attach_type"] == t))
            .and_then(|p| p["id"].as_u64())
            .unwrap_or_else(|| panic!("no {t} program attached to {}: {out}", cg.path().display()))
    })
}

/// Restores `kernel.bpf_stats_enabled` on drop.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> Self {
        let old = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_else(|_| "0".into());
        std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").expect("enable kernel.bpf_stats_enabled");
        Self(old.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// Child mode: `ailb-bench --connect-loop VIP COUNT CONVERSATIONS PREFIX` makes COUNT connects
/// (conversation `PREFIX-<i % CONVERSATIONS>`, none when CONVERSATIONS is 0) and closes each.
fn connect_loop(args: &[String]) {
    let vip: std::net::SocketAddrV4 = args[0].parse().expect("vip");
    let count: usize = args[1].parse().expect("count");
    let convs: usize = args[2].parse().expect("conversations");
    let prefix = &args[3];
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: vip.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(vip.ip().octets()) },
        sin_zero: [0; 8],
    };
    let (mut ok, mut refused, mut other) = (0u64, 0u64, 0u64);
    for i in 0..count {
        // SAFETY: plain socket calls on a fd we own and close; buffers outlive the calls.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            if convs > 0 {
                let id = format!("{prefix}-{}", i % convs);
                libc::setsockopt(fd, 0x41494c, 1, id.as_ptr().cast(), id.len() as u32);
            }
            let r = libc::connect(fd, (&sa as *const libc::sockaddr_in).cast(), std::mem::size_of_val(&sa) as u32);
            if r == 0 {
                ok += 1;
            } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ECONNREFUSED) {
                refused += 1;
            } else {
                other += 1;
            }
            libc::close(fd);
        }
    }
    println!("{ok} {refused} {other}");
}

fn spawn_loop(ns: &Netns, cg: &CgroupGuard, vip: &str, count: usize, convs: usize, prefix: &str) {
    let me = std::env::current_exe().expect("current exe");
    let c = count.to_string();
    let v = convs.to_string();
    let args = ["--connect-loop", vip, &c, &v, prefix];
    let out = output_in(ns.command(me.to_str().expect("utf-8"), &args), Some(cg));
    assert!(out.status.success(), "connect loop failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--connect-loop") {
        connect_loop(&args[2..]);
        return;
    }
    START.with(|_| ());
    let bin = preflight();
    for tool in ["wrk", "nginx", "haproxy", "ipvsadm", "bpftool", "ip"] {
        if Command::new("which").arg(tool).stdout(Stdio::null()).status().map(|s| !s.success()).unwrap_or(true) {
            panic!("{tool} is not installed: run `cargo xtask setup`");
        }
    }
    if args.get(1).map(String::as_str) == Some("--propagation-only") {
        let mut report = String::new();
        propagation(&bin, &mut report);
        println!("{report}");
        return;
    }
    let work = tempfile::Builder::new().prefix("ailb-bench-").tempdir().expect("tempdir");
    let ns = Netns::new();
    let cg = CgroupGuard::new("bench");
    let mut report = String::new();
    let _ = writeln!(report, "# ailb data-plane benchmarks\n");
    let _ = writeln!(
        report,
        "Machine: {} cores, kernel {}. Reproduce: `cargo xtask bench` (as root).\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        run(Command::new("uname").arg("-r"), "uname").trim()
    );

    // Backends and the nginx proxy.
    let mut servers = String::new();
    for b in BACKENDS {
        let _ = writeln!(servers, " server {{ listen {b} backlog=4096; location / {{ return 200 \"{b}\\n\"; }} }}");
    }
    let conf = nginx_conf(work.path(), "backends", &servers);
    let _backends = start_nginx(&ns, &conf, "backends");
    let upstream = format!(
        " upstream b {{ {} }}\n server {{ listen {PROXY} backlog=4096; location / {{ proxy_pass http://b; }} }}\n",
        BACKENDS.iter().map(|b| format!("server {b};")).collect::<String>()
    );
    let pconf = nginx_conf(work.path(), "proxy", &upstream);
    let _proxy = start_nginx(&ns, &pconf, "nginx proxy");
    let hconf = work.path().join("haproxy.cfg");
    let servers: String = BACKENDS.iter().enumerate().map(|(i, b)| format!("  server s{i} {b}\n")).collect();
    std::fs::write(
        &hconf,
        format!(
            "global\n  maxconn 8000\n  nbthread 1\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 30s\n  \
             timeout server 30s\nfrontend f\n  bind {HAPROXY}\n  default_backend b\nbackend b\n  balance roundrobin\n{servers}"
        ),
    )
    .expect("write haproxy.cfg");
    let _haproxy = Proc(
        ns.command("haproxy", &["-db", "-f", hconf.to_str().expect("utf-8 path")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting haproxy: {e}")),
    );
    for b in BACKENDS.iter().chain([&PROXY, &HAPROXY]) {
        wait_listening(&ns, b);
    }
    say("backends, nginx proxy and haproxy ready");

    // IPVS round robin (inside the namespace; removed with it), where the kernel has IPVS.
    let ipvs_in_kernel = kernel_config("CONFIG_IP_VS");
    let ipvs_ok = ipvs_in_kernel.as_deref().is_some_and(|v| v == "y" || v == "m") && {
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

    // The ailb daemon: 3-backend model on VIP, 1000-backend model on BIG_VIP.
    let mut cfg = base_config("bench", &cg).service("bench", VIP).service("bench-1000", BIG_VIP);
    for b in BACKENDS {
        cfg = cfg.backend(BackendCfg::new("bench", b, 1));
    }
    for i in 0..1000u32 {
        cfg = cfg.backend(BackendCfg::new("bench-1000", &format!("127.1.{}.{}:9000", i / 250, i % 250 + 1), 1 + i % 3));
    }
    let mut daemon = Daemon::start(&bin, &cfg);
    say("ailb daemon ready");

    // 1. Requests per second, interleaved rounds.
    let vip_url = format!("http://{VIP}/");
    let variants: Vec<(&str, String, bool)> = {
        let mut v = vec![
            ("direct to one backend (no balancer)", format!("http://{}/", BACKENDS[0]), false),
            ("ailb VIP (3 backends, cgroup connect4)", vip_url.clone(), true),
            ("nginx round-robin proxy, L7 (3 backends)", format!("http://{PROXY}/"), false),
            ("HAProxy round robin, TCP mode (3 backends)", format!("http://{HAPROXY}/"), false),
        ];
        if ipvs_ok {
            v.push(("IPVS round robin, NAT (3 backends)", format!("http://{IPVS_VIP}/"), false));
        }
        v
    };
    // The VIP must work before measuring it.
    let (probe, _) = wrk(&ns, &vip_url, Some(&cg));
    assert!(probe > 0.0, "no request through the ailb VIP succeeded");
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut errors: Vec<String> = vec![String::new(); variants.len()];
    for round in 0..ROUNDS {
        for (i, (name, url, in_cg)) in variants.iter().enumerate() {
            say(&format!("round {}/{ROUNDS}: {name}", round + 1));
            let (rps, err) = wrk(&ns, url, if *in_cg { Some(&cg) } else { None });
            results[i].push(rps);
            if !err.is_empty() {
                errors[i] = err;
            }
        }
    }
    let direct = median(&mut results[0].clone());
    let _ = writeln!(
        report,
        "## Requests per second, new connection per request\n\n`wrk -t1 -c{WRK_CONNECTIONS} -d{WRK_SECONDS}s -H 'Connection: close'`, \
         {ROUNDS} interleaved rounds, median; backends: one nginx worker serving 3 loopback addresses; \
         all in a private network namespace.\n\n| path | req/s (median) | rounds | ratio to direct | errors |\n|---|---:|---|---:|---|"
    );
    for (i, (name, _, _)) in variants.iter().enumerate() {
        let m = median(&mut results[i].clone());
        let rounds = results[i].iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ");
        let _ = writeln!(report, "| {name} | {m:.0} | {rounds} | {:.3}x | {} |", m / direct, errors[i]);
    }
    if !ipvs_ok {
        let why = match ipvs_in_kernel.as_deref() {
            Some("y" | "m") => "ipvsadm could not configure it in the namespace".to_string(),
            Some(v) => format!("this kernel is built without it (CONFIG_IP_VS={v})"),
            None => "this kernel is built without it (CONFIG_IP_VS is not set)".to_string(),
        };
        let _ = writeln!(
            report,
            "\nIPVS: not measured: {why}. HAProxy in TCP mode is the L4 round-robin baseline instead."
        );
    }

    // 2. connect4 run time with 1000 backends and 100,000 affinity entries.
    let progs = program_ids(&cg);
    let stats = BpfStats::enable();
    say(&format!("creating {AFFINITY_ENTRIES} affinity entries on the 1000-backend model"));
    spawn_loop(&ns, &cg, BIG_VIP, AFFINITY_ENTRIES, AFFINITY_ENTRIES, "c");
    let st = daemon.status();
    let mut rows = Vec::new();
    for (label, vip, convs, prefix) in [
        ("1000 backends, conversation with an affinity entry (hit)", BIG_VIP, AFFINITY_ENTRIES, "c"),
        ("1000 backends, new conversation (miss, entry written)", BIG_VIP, MEASURE_CONNECTS, "new"),
        ("1000 backends, no conversation (socket cookie)", BIG_VIP, 0, "-"),
        ("3 backends, no conversation", VIP, 0, "-"),
    ] {
        let before = progs.map(connect4_stats);
        spawn_loop(&ns, &cg, vip, MEASURE_CONNECTS, convs, prefix);
        let after = progs.map(connect4_stats);
        let runs = after[0].0 - before[0].0;
        let avg = if runs > 0 { (after[0].1 - before[0].1) as f64 / runs as f64 } else { f64::NAN };
        // All three programs' time for this phase, per connect.
        let total: u64 = (0..3).map(|i| after[i].1 - before[i].1).sum();
        let per_conn = total as f64 / MEASURE_CONNECTS as f64;
        say(&format!("{label}: {avg:.0} ns per connect4 run ({runs} runs), {per_conn:.0} ns of BPF per connection"));
        rows.push((label, runs, avg, per_conn));
    }
    drop(stats);
    let _ = writeln!(
        report,
        "\n## connect4 run time (kernel BPF statistics)\n\n`kernel.bpf_stats_enabled=1`, average of `run_time_ns / run_cnt` \
         over {MEASURE_CONNECTS} connects per row, {AFFINITY_ENTRIES} affinity entries present (affinity hits before: {}).\n\n\
         The last column adds the setsockopt and sock_ops programs' time (tagging, in-flight \
         counting, close) per connection.\n\n| case | connect4 runs | connect4 ns per run | all ailb programs, ns per connection |\n|---|---:|---:|---:|",
        st["stats"]["affinity_hits"]
    );
    for (label, runs, avg, per_conn) in rows {
        let _ = writeln!(report, "| {label} | {runs} | {avg:.0} | {per_conn:.0} |");
    }

    // 3. Table build and swap on a weight change of the 1000-backend model.
    let mut swaps = Vec::new();
    for i in 0..5u32 {
        let addr = format!("127.1.0.{}:9000", i + 1);
        cfg.backend_mut(&addr).weight = 7;
        daemon.reload(&cfg);
        let log = daemon.log();
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("table swapped") && l.contains("bench-1000"))
            .unwrap_or_else(|| panic!("no table swap logged:\n{log}"))
            .to_string();
        let field = |k: &str| -> f64 {
            let clean = strip_ansi(&line);
            clean
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")).and_then(|v| v.parse().ok()))
                .unwrap_or(f64::NAN)
        };
        swaps.push((field("build_us"), field("swap_us")));
    }
    let mut b: Vec<f64> = swaps.iter().map(|s| s.0).collect();
    let mut s: Vec<f64> = swaps.iter().map(|s| s.1).collect();
    let _ = writeln!(
        report,
        "\n## Table rebuild on a weight change, 1000 backends (M = 65521)\n\n5 reloads (SIGHUP), median from the daemon log: \
         build {:.2} ms, swap (write the inactive table and member rows, describe, flip) {:.2} ms.",
        median(&mut b) / 1000.0,
        median(&mut s) / 1000.0
    );
    drop(daemon);

    // 4. Metadata propagation from Nacos to the pinned map.
    propagation(&bin, &mut report);

    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    let path = out.join("datapath.md");
    File::create(&path).and_then(|mut f| f.write_all(report.as_bytes())).expect("write report");
    println!("{report}");
    say(&format!("report written to {}", path.display()));
}

const PROP_CHANGES: usize = 200;
const PROP_POLL: &str = "100ms";

/// The `state` field of backend `id` in the pinned `AILB_BACKENDS` (BTF-formatted bpftool lookup).
fn backend_state(bpffs: &Path, id: u32) -> u64 {
    let key: Vec<String> = id.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let map = bpffs.join("AILB_BACKENDS");
    let mut cmd = Command::new("bpftool");
    cmd.args(["-j", "map", "lookup", "pinned", map.to_str().expect("utf-8"), "key"]).args(&key);
    let v: serde_json::Value = serde_json::from_str(&run(&mut cmd, "bpftool map lookup")).expect("bpftool json");
    v["formatted"]["value"]["state"].as_u64().unwrap_or_else(|| panic!("no formatted state in {v}"))
}

/// From rnacos answering an instance update (the register call returned) to the backend's new
/// state being visible in the pinned map: `PROP_CHANGES` changes that alternately exclude and
/// readmit a backend (free memory below / above the model's requirement).
fn propagation(bin: &Path, report: &mut String) {
    use ailb_tests::nacos::{NacosInstance, RnacosServer};
    let nacos = RnacosServer::start();
    let cg = CgroupGuard::new("bench-nacos");
    let addrs = ["127.0.9.11:18901", "127.0.9.12:18902", "127.0.9.13:18903"];
    let inst = |addr: &str, mem: &str, n: usize| {
        let (ip, port) = addr.split_once(':').expect("ip:port");
        let mut i = NacosInstance::new("prop", ip, port.parse().expect("port"))
            .meta("model_id", "prop")
            .meta("remaining_memory", mem)
            .meta("updated_at_ms", &n.to_string());
        i.ephemeral = false;
        i
    };
    for a in addrs {
        nacos.register(&inst(a, "40", 0));
    }
    let mut cfg = base_config("bench-nacos", &cg);
    cfg.extra = format!(
        "[[models]]\nname = \"prop\"\nvips = [\"127.77.9.1:80\"]\nrequired_memory_mb = 8000\n\n[discovery]\n\
         source = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"{PROP_POLL}\"\n",
        nacos.url()
    );
    let daemon = Daemon::start(bin, &cfg);
    let st = daemon.status();
    let id = ailb_tests::status::backend(&st, addrs[0])
        .and_then(|b| b["id"].as_u64())
        .unwrap_or_else(|| panic!("{} not in status: {st}", addrs[0])) as u32;
    let bpffs = daemon.bpffs().to_path_buf();
    let mut samples = Vec::with_capacity(PROP_CHANGES);
    say(&format!("propagation: {PROP_CHANGES} metadata changes through rnacos (poll {PROP_POLL})"));
    for n in 1..=PROP_CHANGES {
        // Space the changes by a pseudo-random 0..100 ms: otherwise each change is made right
        // after the poll that showed the previous one, phase-locked to the poll timer, and every
        // sample would read one full interval.
        std::thread::sleep(Duration::from_millis((n as u64 * 37) % 100));
        let excluded = n % 2 == 1;
        nacos.register(&inst(addrs[0], if excluded { "4" } else { "40" }, n));
        let t0 = Instant::now();
        let want = if excluded { 0 } else { 1 };
        loop {
            if backend_state(&bpffs, id) & 1 == want {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "change {n} not visible in the pinned map after 5 s");
        }
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1];
    let _ = writeln!(
        report,
        "\n## Metadata propagation, Nacos -> pinned map\n\nrnacos 0.8.8 (v1 Open API), poll interval {PROP_POLL}, \
         {PROP_CHANGES} changes of one instance's `remaining_memory` that alternately exclude and readmit it \
         (8 GB required), spaced by a pseudo-random 0-100 ms so that they do not phase-lock with the poll \
         timer; from the register call returning to `AILB_BACKENDS` showing the new state \
         (polled with `bpftool map lookup`, a few ms per look).\n\n| p50 | p90 | p99 | max |\n|---:|---:|---:|---:|\n\
         | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        samples[samples.len() - 1]
    );
    say(&format!("propagation p50 {:.0} ms, p99 {:.0} ms", pct(0.5), pct(0.99)));
}

/// A kernel config value from /proc/config.gz (`None`: not set or unknown).
fn kernel_config(key: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut in_esc = false;
    for c in s.chars() {
        match (in_esc, c) {
            (false, '\u{1b}') => in_esc = true,
            (true, 'm') => in_esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}
