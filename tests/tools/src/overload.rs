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
//! are in [`smg_args`] and [`SMG_PRIORITY_YAML`], and the report repeats them), offered phases
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

mod slots;

const MODEL: &str = "overload-7b";
const VIP: &str = "127.77.47.1:8000";
const TENANTS_LISTEN: &str = "127.0.47.1:18470";
const PLAIN_LISTEN: &str = "127.0.47.2:18471";
const SMG_LISTEN: &str = "127.0.47.3:18474";
const SMG_METRICS: &str = "127.0.47.3:18479";
/// SMG's trusted tenant header (`--trust-tenant-header --tenant-header-name`); its tenant keys
/// are then `header:<value>`.
const SMG_TENANT_HEADER: &str = "x-tenant";
/// SMG's priority scheduler: every class's knobs (1.13.0 requires all of them once a class is
/// listed). The reservations must fit under the fleet's capacity ({SLOTS} slots here, where
/// its defaults reserve 160): `interactive` keeps a floor of 2 slots, the others none. Queues
/// and waits as ailb's: 64 waiting per class, 10 s. Preemption off, as its docs advise until
/// every handler honours the cancel. The tenants: alpha and beta may use `interactive`, batch
/// at most `bulk`; every request asks for `interactive` (`x-smg-priority`), so batch's are
/// clamped.
const SMG_PRIORITY_YAML: &str = "\
classes:
  system: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 5, can_preempt: false}
  interactive: {reserved_floor: 2, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 5, can_preempt: false}
  default: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 30, can_preempt: false}
  bulk: {reserved_floor: 0, reserved_per_slot: 0, queue_size: 64, queue_timeout_secs: 10, starvation_threshold_secs: 120, can_preempt: false}
tenant_policies:
  \"header:alpha\": {max_class: interactive}
  \"header:beta\": {max_class: interactive}
  \"header:batch\": {max_class: bulk}
";
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

fn percentile(mut v: Vec<Duration>, p: f64) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

fn ttfts(records: &[Record], interactive: bool) -> Vec<Duration> {
    records.iter().filter(|r| (r.tenant != Tenant::Batch) == interactive).filter_map(|r| r.ttft).collect()
}

fn count(records: &[Record], tenant: Tenant, status: impl Fn(u16) -> bool) -> usize {
    records.iter().filter(|r| r.tenant == tenant && status(r.status)).count()
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

/// SMG's command line: its defaults as [`crate::compare::peers::args`] writes them for
/// `least_load` (with generic workers its pick is the fewest in-flight requests, the nearest to
/// ailb's least-loaded pick; its `cache_aware` would send these identical prompts to one server,
/// and this row compares admission, not routing), plus the priority scheduler with `yaml`
/// ([`SMG_PRIORITY_YAML`]), tenants from [`SMG_TENANT_HEADER`], and its concurrency limit at
/// the fleet's [`SLOTS`].
fn smg_args(yaml: &Path) -> anyhow::Result<Vec<String>> {
    use crate::compare::{peers, policy::Policy};
    let workers: Vec<String> = BACKENDS.iter().map(|b| format!("http://{b}")).collect();
    let mut a = peers::args(Policy::SmgLeastLoad, SMG_LISTEN.parse()?, SMG_METRICS.parse()?, &workers);
    a.extend(["--priority-scheduler-enabled".into(), "--priority-scheduler-config".into()]);
    a.push(yaml.to_str().context("a UTF-8 temp path")?.to_string());
    a.extend(["--trust-tenant-header".into(), "--tenant-header-name".into(), SMG_TENANT_HEADER.into()]);
    a.extend(["--max-concurrent-requests".into(), SLOTS.to_string()]);
    Ok(a)
}

/// The peer row's phases, or why it was not run.
enum SmgRun {
    Skipped(String),
    Ran {
        argv: Vec<String>,
        alone: Vec<Record>,
        over: Vec<Record>,
        shares: Vec<Record>,
        /// Its scheduler's metrics after the overload phase: `smg_scheduler_*` lines.
        scheduler: Vec<String>,
        /// The fleet sampled during its alone phase.
        alone_slots: Vec<slots::Sample>,
    },
}

/// Starts SMG in front of the fleet and offers it phases 2 to 4 (the rates of `x`).
async fn smg_phases(x: f64, dur: Duration, dir: &Path) -> SmgRun {
    use crate::compare::{peers, policy::Policy};
    let venv = peers::smg_venv();
    if let Some(why) = peers::missing(Policy::SmgLeastLoad, &venv) {
        return SmgRun::Skipped(format!("SMG {why}"));
    }
    let yaml = dir.join("smg-priority.yaml");
    let argv =
        match std::fs::write(&yaml, SMG_PRIORITY_YAML).map_err(anyhow::Error::from).and_then(|()| smg_args(&yaml)) {
            Ok(a) => a,
            Err(e) => return SmgRun::Skipped(format!("SMG's config: {e:#}")),
        };
    let listen = match SMG_LISTEN.parse() {
        Ok(l) => l,
        Err(e) => return SmgRun::Skipped(format!("{SMG_LISTEN}: {e}")),
    };
    let started = tokio::task::block_in_place(|| {
        peers::start_with_args(Policy::SmgLeastLoad, &venv, listen, argv.clone(), BACKENDS.len(), dir)
    });
    let _smg = match started {
        Ok(p) => p,
        Err(e) => return SmgRun::Skipped(format!("SMG did not start: {e:#}")),
    };
    eprintln!("overload: SMG alone");
    let interactive = [(Tenant::Alpha, 0.6 * x), (Tenant::Beta, 0.3 * x)];
    let (alone, alone_slots) = phase_sampled(SMG_LISTEN, &interactive, dur, Some(None)).await;
    eprintln!("overload: SMG 4.5 X offered");
    let over = phase(SMG_LISTEN, &[interactive[0], interactive[1], (Tenant::Batch, 3.6 * x)], dur).await;
    let scheduler = metrics(SMG_METRICS)
        .await
        .lines()
        .filter(|l| l.starts_with("smg_scheduler_") && !l.ends_with(" 0"))
        .map(str::to_string)
        .collect();
    eprintln!("overload: SMG shares");
    let shares = phase(SMG_LISTEN, &[(Tenant::Alpha, 2.5 * x), (Tenant::Beta, 2.5 * x)], dur).await;
    SmgRun::Ran { argv, alone, over, shares, scheduler, alone_slots }
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
    let report = rt.block_on(async {
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
        let smg = smg_phases(x, dur, work.path()).await;
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
    })?;
    drop((with_tenants, plain, daemon, sims, cg));
    let out = crate::target_dir().join("bench/overload.md");
    write(&out, &report)?;
    println!("{report}");
    eprintln!("overload report: {}", out.display());
    Ok(())
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

/// The alone phase router by router: the interactive TTFT per tenant, and where the fleet's
/// slots went (`rows`: name, records, samples).
fn render_slots(r: &mut String, rows: &[(&str, &[Record], &[slots::Sample])]) {
    let per_server = (SLOTS / BACKENDS.len()) as u64;
    let limit = u64::from(FREE_MB) * BACKENDS.len() as u64;
    let _ = writeln!(r, "\n## The alone phase (0.9 X), router by router\n");
    let _ = writeln!(
        r,
        "The same arrivals (same seeds) to each. The plain front door has the same admission without tenants: its \
         queue is first come, first served, as SMG's servers' queues are.\n"
    );
    let _ = writeln!(r, "| router | TTFT p50 ms | TTFT P95 ms | alpha P95 ms | beta P95 ms | served |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for (name, records, _) in rows {
        let of = |t: Tenant| records.iter().filter(|x| x.tenant == t).filter_map(|x| x.ttft).collect::<Vec<_>>();
        let _ = writeln!(
            r,
            "| {name} | {} | {} | {} | {} | {} |",
            ms(percentile(ttfts(records, true), 0.5)),
            ms(percentile(ttfts(records, true), 0.95)),
            ms(percentile(of(Tenant::Alpha), 0.95)),
            ms(percentile(of(Tenant::Beta), 0.95)),
            records.iter().filter(|x| x.status == 200).count(),
        );
    }
    let _ = writeln!(
        r,
        "\nWhere the fleet's slots went (each server's `/sim/state` every {} ms). Shares of the sampled time unless \
         in requests. *Held*: requests sent and at no server (waiting in the router, or on their way). *Slot idle \
         while held*: a server had a free slot while the router held a request; *queued beside room*: a server \
         queued a request while the other had a free slot. *Kernel excess*: the kernel's connections in flight \
         less the servers' running and queued requests; *kernel full*: its hinted memory left no room for a \
         request while a server had a free slot.\n",
        slots::EVERY.as_millis()
    );
    let _ = writeln!(
        r,
        "| router | samples | slots busy | held (mean) | queued at servers (mean) | slot idle while held | idle slots while held (mean) | queued beside room | kernel excess (mean) | kernel full, slot free |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|---|");
    for (name, _, samples) in rows {
        let s = slots::summarize(samples, per_server, limit, u64::from(NEED_MB));
        let opt = |v: Option<f64>, pct: bool| match v {
            Some(v) if pct => format!("{:.1} %", v * 100.0),
            Some(v) => format!("{v:.3}"),
            None => "-".into(),
        };
        let _ = writeln!(
            r,
            "| {name} | {} | {:.1} % | {:.2} | {:.2} | {:.1} % | {:.3} | {:.1} % | {} | {} |",
            s.samples,
            s.busy * 100.0,
            s.held,
            s.queued,
            s.idle_while_held * 100.0,
            s.idle_slots_while_held,
            s.queued_beside_room * 100.0,
            opt(s.kernel_excess, false),
            opt(s.kernel_full_slot_free, true),
        );
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[expect(clippy::too_many_arguments, reason = "each phase's results, rendered side by side once")]
fn render(
    x: f64,
    dur: Duration,
    lag: u64,
    alone: &[Record],
    over: &[Record],
    inversions: f64,
    shares: &[Record],
    paths: &[(&str, &str, Option<Tenant>)],
    fast: &[Vec<Duration>],
) -> String {
    let mut r = String::new();
    let (p95_alone, p95_over, ratio) = p95_ratio(alone, over);
    let _ = writeln!(r, "# Front door with tenants under overload\n");
    let _ = writeln!(
        r,
        "Two `ailb-sim` servers (1000 MB free each), admission by fleet memory, 250 MB per request: {SLOTS} in \
         flight at once; {MAX_TOKENS} tokens streamed per request. Fleet rate X = {x:.1} req/s ({SLOTS} \
         closed-loop clients straight to the servers, each running {} at once at most). Phases of {} s, \
         Poisson arrivals. The scheduler's `fair_lag_tokens`: {lag}{}.\n",
        SLOTS / BACKENDS.len(),
        dur.as_secs(),
        if lag == 0 { " (the default: by weight at every request)" } else { "" }
    );
    let _ = writeln!(r, "## Interactive TTFT under 4.5 X offered (batch 3.6 X = 80 %, priority 0)\n");
    let _ = writeln!(r, "| | offered | interactive TTFT p50 ms | interactive TTFT P95 ms | ratio to alone | goal |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    let _ = writeln!(
        r,
        "| alone (alpha 0.6 X + beta 0.3 X) | 0.9 X | {} | {} | 1.00 | |",
        ms(percentile(ttfts(alone, true), 0.5)),
        ms(p95_alone)
    );
    let _ = writeln!(
        r,
        "| with batch | 4.5 X | {} | {} | {ratio:.2} | <= 1.5: {} |",
        ms(percentile(ttfts(over, true), 0.5)),
        ms(p95_over),
        if ratio <= 1.5 { "met" } else { "NOT met" }
    );
    let _ = writeln!(r, "\n| tenant (overload phase) | sent | 200 | 429 | 503 | other |");
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for t in [Tenant::Alpha, Tenant::Beta, Tenant::Batch] {
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {} | {} |",
            t.name(),
            count(over, t, |_| true),
            count(over, t, |s| s == 200),
            count(over, t, |s| s == 429),
            count(over, t, |s| s == 503),
            count(over, t, |s| !matches!(s, 200 | 429 | 503)),
        );
    }
    let _ = writeln!(
        r,
        "\nRefused for room while a lower band waited (`ailb_gateway_scheduler_inversions_total`, overload \
         phase): **{inversions}** (goal 0: {}).\n",
        if inversions == 0.0 { "met" } else { "NOT met" }
    );
    let _ = writeln!(r, "## Shares while backlogged (alpha and beta at 2.5 X each, one band)\n");
    let from = dur / 3;
    let (a, b, share) = alpha_share(shares, dur);
    let off = (share / 0.75 - 1.0).abs();
    let _ = writeln!(r, "| tenant | weight | served (sent after {} s) | share | weight share |", from.as_secs());
    let _ = writeln!(r, "|---|---|---|---|---|");
    let _ = writeln!(r, "| alpha | 3 | {a} | {share:.3} | 0.750 |");
    let _ = writeln!(r, "| beta | 1 | {b} | {:.3} | 0.250 |", 1.0 - share);
    let _ = writeln!(
        r,
        "\nalpha's share is {:.1} % off its weight share (goal within 10 %: {}).\n",
        off * 100.0,
        if off <= 0.1 { "met" } else { "NOT met" }
    );
    let _ = writeln!(r, "## Fast path: nothing queued, one request at a time, interleaved rounds\n");
    let _ = writeln!(r, "| path | requests | p50 ms | p99 ms | added p50 over direct ms |");
    let _ = writeln!(r, "|---|---|---|---|---|");
    let direct = percentile(fast[0].clone(), 0.5);
    for ((name, _, _), lat) in paths.iter().zip(fast) {
        let p50 = percentile(lat.clone(), 0.5);
        let added = match (p50, direct) {
            (Some(p), Some(d)) => format!("{:.3}", (p.as_secs_f64() - d.as_secs_f64()) * 1e3),
            _ => "-".into(),
        };
        let us = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.3}", d.as_secs_f64() * 1e3));
        let _ =
            writeln!(r, "| {name} | {} | {} | {} | {added} |", lat.len(), us(p50), us(percentile(lat.clone(), 0.99)));
    }
    r
}

/// The interactive TTFT P95 of `alone` and `over`, and their ratio.
fn p95_ratio(alone: &[Record], over: &[Record]) -> (Option<Duration>, Option<Duration>, f64) {
    let (a, o) = (percentile(ttfts(alone, true), 0.95), percentile(ttfts(over, true), 0.95));
    let ratio = match (a, o) {
        (Some(a), Some(o)) if !a.is_zero() => o.as_secs_f64() / a.as_secs_f64(),
        _ => f64::NAN,
    };
    (a, o, ratio)
}

/// alpha's share of the requests served that were sent after the first third of `shares`.
fn alpha_share(shares: &[Record], dur: Duration) -> (usize, usize, f64) {
    let from = dur / 3;
    let done = |t| shares.iter().filter(|r| r.tenant == t && r.status == 200 && r.sent >= from).count();
    let (a, b) = (done(Tenant::Alpha), done(Tenant::Beta));
    (a, b, a as f64 / (a + b).max(1) as f64)
}

/// The peer row beside ailb's, phase by phase.
fn render_smg(r: &mut String, smg: &SmgRun, ailb: (&[Record], &[Record], &[Record]), dur: Duration) {
    let _ = writeln!(r, "\n## The peer: SMG's priority scheduler and tenants, the same phases\n");
    let SmgRun::Ran { argv, alone, over, shares, scheduler, .. } = smg else {
        if let SmgRun::Skipped(why) = smg {
            let _ = writeln!(r, "Not run: {why}.");
        }
        return;
    };
    let _ = writeln!(
        r,
        "SMG 1.13.0 in front of the same two servers: `smg {}`, with this priority scheduler config \
         (every request asks `x-smg-priority: interactive`; the tenant comes from `{SMG_TENANT_HEADER}`):\n\n```yaml\n{}```\n",
        argv.join(" "),
        SMG_PRIORITY_YAML
    );
    let (a_alone, a_over, a_ratio) = p95_ratio(ailb.0, ailb.1);
    let (s_alone, s_over, s_ratio) = p95_ratio(alone, over);
    let _ = writeln!(r, "| router | interactive TTFT P95 alone ms | with batch (4.5 X) ms | ratio | goal <= 1.5 |");
    let _ = writeln!(r, "|---|---|---|---|---|");
    let met = |x: f64| if x <= 1.5 { "met" } else { "NOT met" };
    let _ = writeln!(r, "| ailb front door | {} | {} | {a_ratio:.2} | {} |", ms(a_alone), ms(a_over), met(a_ratio));
    let _ = writeln!(r, "| SMG | {} | {} | {s_ratio:.2} | {} |", ms(s_alone), ms(s_over), met(s_ratio));
    let _ = writeln!(r, "\n| SMG, tenant (overload phase) | sent | 200 | 429 | 408 | 503 | other |");
    let _ = writeln!(r, "|---|---|---|---|---|---|---|");
    for t in [Tenant::Alpha, Tenant::Beta, Tenant::Batch] {
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {} | {} | {} |",
            t.name(),
            count(over, t, |_| true),
            count(over, t, |s| s == 200),
            count(over, t, |s| s == 429),
            count(over, t, |s| s == 408),
            count(over, t, |s| s == 503),
            count(over, t, |s| !matches!(s, 200 | 429 | 408 | 503)),
        );
    }
    let (aa, ab, a_share) = alpha_share(ailb.2, dur);
    let (sa, sb, s_share) = alpha_share(shares, dur);
    let _ = writeln!(r, "\n| router | alpha served | beta served | alpha's share (weight share 0.750) |");
    let _ = writeln!(r, "|---|---|---|---|");
    let _ = writeln!(r, "| ailb front door (weights 3:1) | {aa} | {ab} | {a_share:.3} |");
    let _ = writeln!(r, "| SMG (one class, FIFO: it has no tenant weights) | {sa} | {sb} | {s_share:.3} |");
    let _ = writeln!(
        r,
        "\nSMG's scheduler after the overload phase (its nonzero `smg_scheduler_*` series, which show it \
         admitted by class and clamped batch to `bulk`):\n\n```text\n{}\n```",
        scheduler.join("\n")
    );
}
