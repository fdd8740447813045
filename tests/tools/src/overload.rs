//! `ailb-overload-bench` (root; `cargo xtask bench --only overload`): ailb's front door with
//! tenants and its scheduler (`[[gateway.tenants]]`, `[gateway.scheduler]`) offered about five
//! times what the fleet serves, side by side in one run with the same interactive load alone.
//!
//! The fleet: two `ailb-sim` servers declared with 1000 MB free each, the front door's
//! admission by fleet memory on (`[gateway.admission] mode = "fleet_memory"`), every request
//! needing 250 MB: eight in flight at once; each server also runs at most four at once
//! (`--max-seqs`), so the limit is the fleet's own, whatever the router. `ailb run` is attached to a child cgroup created
//! here and both front doors run inside it:
//!
//! - **tenants**: `alpha` (weight 3) and `beta` (weight 1) interactive at priority 1, `batch`
//!   capped at priority 0, by API key; the scheduler's `fair_lag_tokens` from
//!   `--fair-lag-tokens` (default 0, the product's default);
//! - **plain**: the same admission, no tenants (the admission's own first-come-first-served
//!   queue).
//!
//! Phases (each [`Args::phase_secs`]; arrivals are Poisson, seeded, the same in each router's
//! phase; each phase's users, so its conversations, are its own):
//!
//! 1. **capacity**: eight closed-loop clients straight to the servers, four each: the fleet's
//!    rate X, which every router is offered multiples of.
//! 2. **alone**: `alpha` at 0.6 X and `beta` at 0.3 X, streamed: their TTFT P95, per tenant
//!    too; then the same arrivals through the plain front door (first come, first served). The
//!    fleet is sampled throughout (`overload/slots.rs`): how busy the slots were, how long one was idle
//!    while the router held a request, how long a server queued beside another's free slot.
//! 3. **overload**: the same, plus `batch` at 3.6 X (80 % of 4.5 X offered): the
//!    interactive TTFT P95 again (goal: at most 1.5x alone), what was shed per tenant, and the
//!    scheduler's count of requests refused for room while a lower band waited (goal: 0).
//! 4. **shares**: `alpha` and `beta` at 2.5 X each, one band: their completed requests after
//!    the first third (backlogged) against weights 3:1 (goal: within 10 %).
//! 5. **fast path**: one client, one small request at a time (nothing ever waits), in
//!    interleaved rounds: directly to a server, through the plain front door, through the
//!    front door with tenants: p50 and what each front door adds (goal: the same within noise).
//!
//! The peer row: **SMG** 1.13.0 (`smg` on PyPI, in `target/smg-venv`) in front of the same two
//! servers, with its priority scheduler and its tenants from a trusted header (the settings
//! are in `overload/smg.rs`, and the report repeats them), offered phases
//! 2 (without the plain front door's part) to 4 the same way. Without SMG installed the row says
//! so and why.
//!
//! Writes `target/bench/overload.md` and prints it; progress on stderr.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ailb_tests::{base_config, ensure_bpffs, require_root, BackendCfg, CgroupGuard, Daemon, GatewayProcess, SimServer};
use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod report;
mod slots;
mod smg;

use report::{render, render_slots, render_smg};
use smg::{smg_phases, SmgRun, SMG_PRIORITY_YAML};

const MODEL: &str = "overload-7b";
const VIP: &str = "127.77.47.1:8000";
const TENANTS_LISTEN: &str = "127.0.47.1:18470";
const PLAIN_LISTEN: &str = "127.0.47.2:18471";
const SMG_LISTEN: &str = "127.0.47.3:18474";
const SMG_METRICS: &str = "127.0.47.3:18479";
/// SMG's trusted tenant header (`--trust-tenant-header --tenant-header-name`); its tenant keys
/// are then `header:<value>`.
const SMG_TENANT_HEADER: &str = "x-tenant";
const BACKENDS: [&str; 2] = ["127.0.47.11:18472", "127.0.47.12:18473"];
const FREE_MB: u32 = 1000;
const NEED_MB: u32 = 250;
/// Requests in flight at once: the fleet's memory over each request's need.
const SLOTS: usize = (2 * FREE_MB / NEED_MB) as usize;
/// Requests waiting in the scheduler at most: about six seconds of the fleet's rate, so the
/// batch tenant's excess is shed (evicted, 429) rather than left to wait out `max_wait`.
const MAX_QUEUED: u32 = 64;
/// Of one tenant: half, so that two backlogged tenants both keep requests waiting (with the
/// whole queue open to each, the one served less fills it and the other's arrivals find it full).
const PER_TENANT: u32 = MAX_QUEUED / 2;
/// Tokens generated per streamed request.
const MAX_TOKENS: u32 = 32;

#[derive(Debug, clap::Parser)]
#[command(name = "ailb-overload-bench", about = "ailb's front door with tenants under 5x overload")]
pub struct Args {
    /// Seconds per phase.
    #[arg(long, default_value_t = 15)]
    pub phase_secs: u64,
    /// Rounds of the fast-path comparison (each path 2 s per round).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// The tenants' front door's `gateway.scheduler.fair_lag_tokens` (0, the default: by weight
    /// at every request).
    #[arg(long, default_value_t = 0)]
    pub fair_lag_tokens: u64,
}

/// A tenant of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tenant {
    Alpha,
    Beta,
    Batch,
}

impl Tenant {
    fn key(self) -> &'static str {
        match self {
            Tenant::Alpha => "key-alpha",
            Tenant::Beta => "key-beta",
            Tenant::Batch => "key-batch",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Tenant::Alpha => "alpha",
            Tenant::Beta => "beta",
            Tenant::Batch => "batch",
        }
    }
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
struct Record {
    tenant: Tenant,
    /// Since the phase began.
    sent: Duration,
    status: u16,
    ttft: Option<Duration>,
}

fn sha256(key: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("printf %s '{key}' | sha256sum")])
        .output()
        .context("sha256sum")?;
    let hex = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string();
    if hex.len() != 64 {
        bail!("sha256sum printed {:?}", String::from_utf8_lossy(&out.stdout));
    }
    Ok(hex)
}

/// The front door's config; with tenants when `tenants` is given: its scheduler's
/// `fair_lag_tokens`.
fn gateway_toml(listen: &str, tenants: Option<u64>) -> anyhow::Result<String> {
    let mut t = format!(
        "[gateway]\nlisten = [\"{listen}\"]\nmax_concurrent = 4096\n\
         [gateway.admission]\nmode = \"fleet_memory\"\nmax_wait = \"10s\"\nmax_queued = 4096\nreserve = 0.0\n"
    );
    if let Some(lag) = tenants {
        write!(
            t,
            "[gateway.scheduler]\nmax_queued = {MAX_QUEUED}\nmax_queued_per_tenant = {PER_TENANT}\nmax_wait = \"10s\"\n\
             fair_lag_tokens = {lag}\n\
             [[gateway.tenants]]\nname = \"alpha\"\napi_key_sha256 = [\"{}\"]\nweight = 3\n\
             [[gateway.tenants]]\nname = \"beta\"\napi_key_sha256 = [\"{}\"]\nweight = 1\n\
             [[gateway.tenants]]\nname = \"batch\"\napi_key_sha256 = [\"{}\"]\nmax_priority = 0\n",
            sha256(Tenant::Alpha.key())?,
            sha256(Tenant::Beta.key())?,
            sha256(Tenant::Batch.key())?
        )?;
    }
    Ok(t)
}

/// Chat request `n` of `tenant` (`None`: no key), closing its connection after the answer.
/// Each `n` is a user of its own (its question differs, so the front door derives a
/// conversation of its own and no affinity ties the requests to one server).
fn request(tenant: Option<Tenant>, n: u64, max_tokens: u32, stream: bool) -> String {
    let who = tenant.map_or("anyone", Tenant::name);
    let body = format!(
        r#"{{"model":"{MODEL}","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"overload {who} {n}"}}]}}"#
    );
    // ailb's front door finds the tenant by its API key; SMG by its trusted header, and each
    // ignores the other's.
    let auth = tenant
        .map(|t| {
            format!(
                "Authorization: Bearer {}\r\n{SMG_TENANT_HEADER}: {}\r\nx-smg-priority: interactive\r\n",
                t.key(),
                t.name()
            )
        })
        .unwrap_or_default();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nConnection: close\r\n\
         X-Required-Memory-MB: {NEED_MB}\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends `req` to `addr`: the status, the time to the first streamed token (or to the head
/// when not streamed) and the whole time.
async fn exchange(addr: &str, req: &str, stream: bool) -> (u16, Option<Duration>, Duration) {
    let started = Instant::now();
    let work = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::with_capacity(4096);
        let mut buf = [0u8; 4096];
        let mut status = None;
        let mut ttft = None;
        loop {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if status.is_none() && raw.len() >= 12 {
                status = std::str::from_utf8(&raw[9..12]).ok()?.parse::<u16>().ok();
                if !stream {
                    ttft = Some(started.elapsed());
                }
            }
            if ttft.is_none() && memchr_str(&raw, b"chat.completion.chunk") {
                ttft = Some(started.elapsed());
            }
        }
        Some((status.unwrap_or(0), ttft))
    };
    match tokio::time::timeout(Duration::from_secs(60), work).await {
        Ok(Some((status, ttft))) => (status, ttft.filter(|_| status == 200), started.elapsed()),
        _ => (0, None, started.elapsed()),
    }
}

fn memchr_str(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A seeded exponential sampler (xorshift64*), for Poisson arrivals.
struct Arrivals(u64);

impl Arrivals {
    fn next_gap(&mut self, rate: f64) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - u).ln() / rate)
    }
}

/// Phases run so far: each phase's requests are users of their own ([`offer`]).
static PHASES: AtomicU64 = AtomicU64::new(0);

/// Offers `tenant`'s streamed requests to `addr` at `rate` per second for `dur`, open loop.
/// The arrivals follow `seed` (the same in every router's phase); the users (the question,
/// so the conversation the front door derives) are `phase`'s own: a phase that asked the
/// questions of one 15 s before would find the kernel's affinity for them still active
/// (`affinity_wait`, 20 s) and queue at their last server though the other had room.
#[expect(clippy::too_many_arguments, reason = "one load of one phase, its shared counters")]
async fn offer(
    addr: &'static str,
    tenant: Tenant,
    rate: f64,
    dur: Duration,
    seed: u64,
    phase: u64,
    records: Arc<Mutex<Vec<Record>>>,
    outstanding: Arc<AtomicU64>,
) {
    let start = Instant::now();
    let mut arrivals = Arrivals(seed | 1);
    let mut next = Duration::ZERO;
    let mut tasks = Vec::new();
    let mut n = phase << 40 | seed;
    loop {
        next += arrivals.next_gap(rate);
        if next >= dur {
            break;
        }
        tokio::time::sleep_until((start + next).into()).await;
        n += 1;
        let (req, records, outstanding) =
            (request(Some(tenant), n, MAX_TOKENS, true), records.clone(), outstanding.clone());
        let sent = start.elapsed();
        outstanding.fetch_add(1, Ordering::Relaxed);
        tasks.push(tokio::spawn(async move {
            let (status, ttft, _) = exchange(addr, &req, true).await;
            outstanding.fetch_sub(1, Ordering::Relaxed);
            records.lock().unwrap_or_else(|p| p.into_inner()).push(Record { tenant, sent, status, ttft });
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Runs the open-loop `loads` together; every request's record.
async fn phase(addr: &'static str, loads: &[(Tenant, f64)], dur: Duration) -> Vec<Record> {
    phase_sampled(addr, loads, dur, None).await.0
}

/// [`phase`], with the fleet sampled throughout ([`slots`]) when `sample` is given (the
/// kernel's counters with it when readable).
async fn phase_sampled(
    addr: &'static str,
    loads: &[(Tenant, f64)],
    dur: Duration,
    sample: Option<Option<Arc<slots::KernelView>>>,
) -> (Vec<Record>, Vec<slots::Sample>) {
    let records = Arc::new(Mutex::new(Vec::new()));
    let outstanding = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample.map(|kernel| tokio::spawn(slots::run(&BACKENDS, kernel, outstanding.clone(), stop.clone())));
    let phase_no = PHASES.fetch_add(1, Ordering::Relaxed) + 1;
    let tasks: Vec<_> = loads
        .iter()
        .enumerate()
        .map(|(i, &(t, rate))| {
            let seed = 0x9e37_79b9 + i as u64;
            tokio::spawn(offer(addr, t, rate, dur, seed, phase_no, records.clone(), outstanding.clone()))
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    stop.store(true, Ordering::Relaxed);
    let samples = match sampler {
        Some(s) => s.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let out = records.lock().unwrap_or_else(|p| p.into_inner()).clone();
    (out, samples)
}

/// The fleet's own rate: [`SLOTS`] closed-loop clients for `dur`, spread evenly over the
/// servers directly (no router: every router is then offered multiples of the same rate).
async fn capacity(dur: Duration) -> f64 {
    let end = Instant::now() + dur;
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..SLOTS)
        .map(|i| {
            let (done, addr) = (done.clone(), BACKENDS[i % BACKENDS.len()]);
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < end {
                    n += 1;
                    if exchange(addr, &request(None, (i as u64) << 32 | n, MAX_TOKENS, true), true).await.0 == 200 {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    done.load(std::sync::atomic::Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// A counter's value in a metrics page.
fn metric(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

async fn metrics(addr: &str) -> String {
    let req = "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    let Ok(mut s) = TcpStream::connect(addr).await else { return String::new() };
    if s.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    String::from_utf8_lossy(&raw).into_owned()
}

/// Small requests one at a time to each path in turn, `rounds` rounds of 2 s each: every
/// request's latency per path.
async fn fast_path(paths: &[(&'static str, &'static str, Option<Tenant>)], rounds: u32) -> Vec<Vec<Duration>> {
    let mut out = vec![Vec::new(); paths.len()];
    for round in 0..rounds as usize {
        for k in 0..paths.len() {
            let i = (round + k) % paths.len();
            let (_, addr, tenant) = paths[i];
            let end = Instant::now() + Duration::from_secs(2);
            let mut n = 0;
            while Instant::now() < end {
                n += 1;
                let req = request(tenant, (round as u64) << 32 | n, 1, false);
                let (status, _, total) = exchange(addr, &req, false).await;
                if status == 200 {
                    out[i].push(total);
                }
            }
        }
    }
    out
}

pub fn main(args: Args) -> anyhow::Result<()> {
    require_root();
    ensure_bpffs();
    let bin = match std::env::var_os("AILB_BIN").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => crate::target_dir().join("release/ailb"),
    };
    if !bin.is_file() {
        bail!("{} is absent: build it with `cargo xtask build --release`, or name it with AILB_BIN", bin.display());
    }
    let dur = Duration::from_secs(args.phase_secs.max(3));
    let work = tempfile::Builder::new().prefix("ailb-overload-").tempdir().context("a temp dir")?;
    let cg = CgroupGuard::new("overload");
    // Each server runs at most its share of the slots at once (more wait in its own queue, as
    // in vLLM): the fleet's capacity is physical, so a router that does not read the memory
    // hints (the peer) meets the same limit.
    let per_server = (SLOTS / BACKENDS.len()).to_string();
    let sims: Vec<SimServer> = BACKENDS
        .iter()
        .map(|b| SimServer::start(b, MODEL, &["--time-scale", "1", "--max-seqs", &per_server]))
        .collect();
    let mut cfg = base_config("overload", &cg).service(MODEL, VIP);
    for addr in BACKENDS {
        cfg = cfg.backend(BackendCfg::new(MODEL, addr, 1).free_memory_mb(FREE_MB));
    }
    cfg.listen = Some(format!("127.0.0.1:{}", ailb_tests::nacos::free_port()));
    let tenants_toml = gateway_toml(TENANTS_LISTEN, Some(args.fair_lag_tokens))?;
    cfg.extra = tenants_toml.clone();
    let daemon = Daemon::start(&bin, &cfg);
    let text = std::fs::read_to_string(daemon.config_path()).context("the daemon's config")?;
    let plain_path = daemon.config_path().with_file_name("plain.toml");
    std::fs::write(&plain_path, text.replace(&tenants_toml, &gateway_toml(PLAIN_LISTEN, None)?))
        .context("the plain front door's config")?;
    let with_tenants = GatewayProcess::start(&bin, daemon.config_path(), &cg, TENANTS_LISTEN.parse::<SocketAddr>()?);
    let plain = GatewayProcess::start(&bin, &plain_path, &cg, PLAIN_LISTEN.parse::<SocketAddr>()?);
    with_tenants.wait_for_log("admission per model by fleet memory on");
    plain.wait_for_log("admission per model by fleet memory on");

    let kernel = kernel_view(&bin, daemon.bpffs());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let report = rt.block_on(phases(&args, dur, work.path(), kernel))?;
    drop((with_tenants, plain, daemon, sims, cg));
    let out = crate::target_dir().join("bench/overload.md");
    write(&out, &report)?;
    println!("{report}");
    eprintln!("overload report: {}", out.display());
    Ok(())
}

/// The phases, in order, against the two front doors and then the peer: the report.
async fn phases(
    args: &Args,
    dur: Duration,
    work: &Path,
    kernel: Option<Arc<slots::KernelView>>,
) -> anyhow::Result<String> {
    eprintln!("overload: capacity ({} s, {SLOTS} closed-loop clients)", dur.as_secs());
    let x = capacity(dur).await;
    if x <= 0.0 {
        bail!("no request was answered while measuring the fleet's rate");
    }
    eprintln!("overload: X = {x:.1} req/s; alone");
    let interactive = [(Tenant::Alpha, 0.6 * x), (Tenant::Beta, 0.3 * x)];
    let (alone, alone_slots) = phase_sampled(TENANTS_LISTEN, &interactive, dur, Some(kernel.clone())).await;
    eprintln!("overload: alone, the plain front door");
    let plain_alone = phase_sampled(PLAIN_LISTEN, &interactive, dur, Some(kernel)).await;
    eprintln!("overload: 4.5 X offered");
    let before = metrics(TENANTS_LISTEN).await;
    let over = phase(TENANTS_LISTEN, &[interactive[0], interactive[1], (Tenant::Batch, 3.6 * x)], dur).await;
    let after = metrics(TENANTS_LISTEN).await;
    let inversions = metric(&after, "ailb_gateway_scheduler_inversions_total ")
        - metric(&before, "ailb_gateway_scheduler_inversions_total ");
    eprintln!("overload: shares");
    let shares = phase(TENANTS_LISTEN, &[(Tenant::Alpha, 2.5 * x), (Tenant::Beta, 2.5 * x)], dur).await;
    eprintln!("overload: fast path");
    let paths = [
        ("direct to a server", BACKENDS[0], None),
        ("front door, no tenants", PLAIN_LISTEN, None),
        ("front door, tenants + scheduler", TENANTS_LISTEN, Some(Tenant::Alpha)),
    ];
    let fast = fast_path(&paths, args.rounds).await;
    let smg = smg_phases(x, dur, work).await;
    let mut report = render(x, dur, args.fair_lag_tokens, &alone, &over, inversions, &shares, &paths, &fast);
    render_smg(&mut report, &smg, (&alone, &over, &shares), dur);
    let mut rows = vec![
        ("ailb front door, tenants 3:1", &alone[..], &alone_slots[..]),
        ("ailb front door, no tenants (FIFO)", &plain_alone.0[..], &plain_alone.1[..]),
    ];
    if let SmgRun::Ran { alone, alone_slots, .. } = &smg {
        rows.push(("SMG", &alone[..], &alone_slots[..]));
    }
    render_slots(&mut report, &rows);
    Ok(report)
}

/// The kernel's counters of [`BACKENDS`], by the ids `ailb status` lists for them (`None`,
/// said on stderr, when they cannot be read: the slots table then goes without them).
fn kernel_view(bin: &Path, bpffs: &Path) -> Option<Arc<slots::KernelView>> {
    let status = match ailb_tests::status::ailb_status(bin, bpffs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("overload: no kernel counters in the slots table: ailb status: {e}");
            return None;
        }
    };
    let listed: Vec<(String, u32)> = status["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["backends"].as_array().into_iter().flatten())
        .filter_map(|b| Some((b["address"].as_str()?.to_string(), u32::try_from(b["id"].as_u64()?).ok()?)))
        .collect();
    let ids: Option<Vec<u32>> =
        BACKENDS.iter().map(|b| listed.iter().find(|(a, _)| a.contains(b)).map(|&(_, id)| id)).collect();
    let view = ids.and_then(|ids| slots::KernelView::open(bpffs, ids));
    if view.is_none() {
        eprintln!("overload: no kernel counters in the slots table: backends listed {listed:?}");
    }
    view.map(Arc::new)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
