//! The race on real engines (`ailb-compare --engine vllm`): the same policies in front of real
//! vLLM for CPU servers serving the tiny model, instead of simulated GPUs.
//!
//! The servers start once (`--servers`, 2 by default, at most 3: each takes about 4 GB and
//! they share the CPU cores; two take 100-520 s to start here) through the shared launcher
//! ([`ailb_tests::vllm`]: own process group, stopped by that group at the end and on any
//! failure, `PR_SET_PDEATHSIG`), with `VLLM_SERVER_DEV_MODE=1` so that `POST
//! /reset_prefix_cache` exists, `--max-model-len`, `--enable-prompt-tokens-details` and
//! `--num-gpu-blocks-override` (`--kv-blocks`: a KV cache small enough that where a prefix
//! lives matters; 1 GiB would hold every prompt of the run on every server).
//!
//! Before each policy every server's prefix cache is reset, and the reset is checked: a probe
//! prompt sent twice must be a hit the second time (so the check can fail), and after the
//! reset the same probe must find no cached token, by the answer's `cached_tokens` and by the
//! server's `vllm:prefix_cache_hits_total`. The probe's text shares no 128-token block with any
//! workload. Then the balancer under test starts, the client worker ([`client`], a re-exec of
//! this binary inside the child cgroup, so that ailb's kernel pick sees its sockets) sends the
//! workload ([`workload`]) in a closed loop, and the run is measured by the servers' own
//! counters (`vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`, in tokens,
//! deltas summed over the servers; `vllm:request_success_total` per server for the split) and
//! on the client side (TTFT P50/P95, failures, requests per second). The report goes to
//! `--out-dir` ([`report`]).
//!
//! Policies: `round-robin`, `random`, `least-conn` (the kernel's L4 baselines on a static
//! config), `ailb` (the kernel pick of the one-box `ailb run`, which samples each server's
//! `/metrics` itself: load, KV memory; affinity by the socket's conversation tag where the
//! workload has one), `ailb-gateway` (that daemon with its front door `ailb gateway`),
//! `ailb-gateway-approx` (the same with the prefix-aware pick, `prefix = "approximate"`: the
//! kernel learns from its own picks, the front door sends text keys), `ailb-gateway-precise`
//! (`prefix = "precise"`: the daemon follows every server's KV events, which the servers then
//! publish on ports of their own, and the front door sends token-exact keys of the servers'
//! tokenizer in blocks of their real block size), the oracle `tenant-pinned` (no balancer:
//! the client sends tenant `t`'s requests straight to server `t % servers`), and the peer
//! routers of [`super::peers`] with the settings given there (SMG's `prefix_hash` key length
//! set per workload, see [`prefix_token_count`]).
//!
//! `smg-kv-events`, SMG routing by the engines' own KV events, needs the engines behind vLLM's
//! gRPC server (SMG's `smg-grpc-servicer`): SMG reads KV events only from gRPC workers. Those
//! servers have no HTTP port, so that policy runs last, on servers of its own started once the
//! others are stopped (the same engine, model, KV blocks and length limit, publishing KV
//! events); their caches are emptied through SMG's `POST /flush_cache` and checked by the probe
//! ([`flush_through_router`]), their cache counts are the answers' `usage`, and the run fails if
//! SMG's index took in no KV-event block ([`smg_kv_events`]).

mod balancer;
pub mod client;
pub mod report;
mod servers;
pub mod workload;

use std::io::Read;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_tests::client::spawn_in_cgroup;
use ailb_tests::vllm::{Engine, Frontend, VllmServer, KV_BYTES_PER_TOKEN};
use ailb_tests::{preflight, CgroupGuard};
use anyhow::{bail, Context};

pub use self::balancer::prefix_token_count;
use self::balancer::{start_balancer, Balancer};
use self::client::Record;
use self::servers::{counters, reset_and_check, wait_idle};
pub use self::servers::{flush_through_router, wait_router_tokenizer};
use self::workload::{Kind, RealRequest, Sizes};
use super::args::Args;
use super::peers;
use super::policy::Policy;

/// The name the servers serve the tiny model under.
pub const MODEL: &str = "tiny-llama";
/// vLLM's KV block on CPU, tokens (its default there; the run reads the servers' own from
/// `vllm:cache_config_info` once they are up).
const CPU_BLOCK_TOKENS: u64 = 128;
/// The policies raced when `--policies` is left at its default.
pub const DEFAULT_POLICIES: &str =
    "round-robin,ailb,ailb-gateway,ailb-gateway-approx,ailb-gateway-precise,tenant-pinned,\
                                     smg-cache-aware,smg-prefix-hash,vllm-cache-aware,smg-kv-events";

/// One policy on one workload, measured.
pub struct Row {
    pub workload: Kind,
    pub policy: Policy,
    /// Every request's record, in index order.
    pub records: Vec<Record>,
    pub wall_s: f64,
    /// Prompt tokens the servers looked up in their prefix caches, and found there (deltas of
    /// their counters over the run, summed over the servers).
    pub queried_tokens: f64,
    pub hit_tokens: f64,
    /// Requests each server finished during the run.
    pub per_server: Vec<u64>,
    /// CPU seconds of the userspace router on the request path during the run (none for the
    /// kernel's picks).
    pub router_cpu_s: Option<f64>,
    /// How often `ailb run` took a server out of its table during the run (its log's "backend
    /// excluded" lines: a failed or late `/health` or `/metrics` answer), `None` without ailb.
    pub exclusions: Option<usize>,
    /// The model's `prefix` object of `ailb status` at the end of the run (its mode, entries
    /// and counters), for the policies with the prefix-aware pick on.
    pub prefix: Option<serde_json::Value>,
    /// SMG with the engines' KV events: the event batches and blocks its index took in during
    /// the run (`smg_kv_event_batches_total`, `smg_kv_event_blocks_total`).
    pub router_kv_events: Option<(f64, f64)>,
}

/// What every row shares: the servers and the workloads.
pub struct Setup {
    pub servers: usize,
    pub block_size: Option<u64>,
    pub kv_blocks: Option<u64>,
    /// Seconds from spawn to ready, per server.
    pub ready_s: Vec<f64>,
    pub rss_mib: Vec<u64>,
    /// Seconds from spawn to ready of the gRPC servers, where a policy needed them.
    pub grpc_ready_s: Option<f64>,
    /// Per workload, what it is.
    pub workloads: Vec<(Kind, String, usize)>,
    /// Policies that could not run, and why.
    pub not_run: Vec<(Policy, String)>,
}

/// One workload's request list, written once for the client worker to read.
struct WorkloadFile {
    kind: Kind,
    /// What it is, for the report.
    what: String,
    requests: usize,
    path: PathBuf,
}

/// `ailb-compare --engine vllm`: the workloads written, the servers started, every policy on
/// every workload, the report.
pub fn main(args: &Args) -> anyhow::Result<()> {
    check_args(args)?;
    let kinds = args.workloads.split(',').map(Kind::parse).collect::<anyhow::Result<Vec<_>>>()?;
    let policies = real_policies(args)?;
    let (policies, mut not_run) = installed(policies);
    let engine = Engine::find().map_err(|why| anyhow::anyhow!("--engine vllm: {why}"))?;
    // SMG's KV-event row needs the engines behind vLLM's gRPC server: they run after the
    // others, on gRPC servers of their own.
    let (grpc, policies): (Vec<Policy>, Vec<Policy>) = policies.into_iter().partition(|p| p.grpc_workers());
    let grpc = match (grpc.is_empty(), engine.grpc_servicer()) {
        (false, Err(why)) => {
            for p in grpc {
                eprintln!("ailb-compare: {}: {why}: skipping it", p.title());
                not_run.push((p, why.clone()));
            }
            Vec::new()
        }
        _ => grpc,
    };
    let ailb = preflight();
    let trace = args.trace.clone().unwrap_or_else(ailb_sim::replay::default_trace_path);
    let dir = tempfile::tempdir().context("temp dir")?;
    let workloads = write_workloads(&kinds, &sizes(args), &trace, dir.path())?;
    let mut setup = Setup {
        servers: args.servers,
        block_size: None,
        kv_blocks: None,
        ready_s: Vec::new(),
        rss_mib: Vec::new(),
        grpc_ready_s: None,
        workloads: workloads.iter().map(|w| (w.kind, w.what.clone(), w.requests)).collect(),
        not_run,
    };
    let mut rows = Vec::new();
    if !policies.is_empty() {
        // Only precise mode follows the servers' KV events; they publish them only then.
        let kv_events = policies.contains(&Policy::AilbGatewayPrecise);
        let (servers, t0) = servers::start(args, &engine, Frontend::OpenAi, kv_events);
        setup.block_size = servers[0].cache_config("block_size");
        setup.kv_blocks = servers[0].cache_config("num_gpu_blocks");
        setup.ready_s = vec![t0.elapsed().as_secs_f64(); servers.len()];
        setup.rss_mib = servers.iter().map(VllmServer::rss_mib).collect();
        let block = setup.block_size.context("the servers' vllm:cache_config_info has no block_size")?;
        rows = race(args, &ailb, &policies, &workloads, &servers, block)?;
    }
    // A failure of the gRPC policies keeps the other rows: the report is written, then the
    // error returned.
    let mut failed = None;
    if !grpc.is_empty() {
        let (servers, t0) = servers::start(args, &engine, Frontend::Grpc, true);
        setup.grpc_ready_s = Some(t0.elapsed().as_secs_f64());
        match race(args, &ailb, &grpc, &workloads, &servers, CPU_BLOCK_TOKENS) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                for p in &grpc {
                    setup.not_run.push((*p, format!("failed: {e:#}")));
                }
                failed = Some(e);
            }
        }
    }
    let md = report::write(args, &setup, &rows)?;
    println!("{md}");
    match failed {
        Some(e) => Err(e.context("the policies on vLLM's gRPC servers failed (the report has the other rows)")),
        None => Ok(()),
    }
}

/// The numbers of the command line that the real engines bound.
fn check_args(args: &Args) -> anyhow::Result<()> {
    if !(1..=3).contains(&args.servers) {
        bail!("--servers {}: 1 to 3 real vLLM servers (each takes about 4 GB and shares the CPU cores)", args.servers);
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1, not 0");
    }
    if args.kv_blocks > 0 && args.max_model_len as u64 > (args.kv_blocks - 1) * CPU_BLOCK_TOKENS {
        bail!(
            "--max-model-len {} needs --kv-blocks {} at least: vLLM refuses to start unless one request of that \
             length fits in all blocks but one, at {CPU_BLOCK_TOKENS} tokens a block",
            args.max_model_len,
            (args.max_model_len as u64).div_ceil(CPU_BLOCK_TOKENS) + 1
        );
    }
    if args.deadline_s <= 0.0 || !args.deadline_s.is_finite() {
        bail!("--deadline-s must be a positive number of seconds, not {}", args.deadline_s);
    }
    Ok(())
}

/// Builds each workload's request list and writes it under `dir`.
fn write_workloads(kinds: &[Kind], sizes: &Sizes, trace: &Path, dir: &Path) -> anyhow::Result<Vec<WorkloadFile>> {
    let mut workloads = Vec::new();
    for k in kinds {
        let (reqs, what) = workload::build(*k, sizes, MODEL, trace)?;
        let path = dir.join(format!("{}.json", k.key()));
        std::fs::write(&path, serde_json::to_vec(&reqs)?).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("ailb-compare: workload {}: {what}", k.key());
        workloads.push(WorkloadFile { kind: *k, what, requests: reqs.len(), path });
    }
    Ok(workloads)
}

/// Every policy on every workload, in that order, the servers' prefix caches reset (and the
/// reset checked) before each (gRPC servers: through the router, once it runs); the client
/// worker runs in one child cgroup.
fn race(
    args: &Args,
    ailb: &Path,
    policies: &[Policy],
    workloads: &[WorkloadFile],
    servers: &[VllmServer],
    block: u64,
) -> anyhow::Result<Vec<Row>> {
    let cg = CgroupGuard::new("real-race");
    let mut rows = Vec::new();
    let mut port = 18_400u16;
    for w in workloads {
        for p in policies {
            crate::stop::check("the race")?;
            port += 1;
            eprintln!("ailb-compare: {} / {}: resetting the prefix caches", w.kind.key(), p.title());
            for s in servers.iter().filter(|s| s.frontend() == Frontend::OpenAi) {
                reset_and_check(s)?;
            }
            let row = run_policy(args, ailb, &cg, *p, w.kind, port, servers, block, &w.path, w.requests)?;
            let ok: Vec<&Record> = row.records.iter().filter(|r| r.ok()).collect();
            eprintln!(
                "ailb-compare: {} / {}: {} ok, {} failed in {:.1} s; {:.1} % of prompt tokens from the cache; \
                 TTFT p50 {} ms; per server {:?}",
                w.kind.key(),
                p.title(),
                ok.len(),
                row.records.len() - ok.len(),
                row.wall_s,
                row.hit_share() * 100.0,
                report::fmt_ms(row.ttft(50.0)),
                row.per_server
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `--policies`, or [`DEFAULT_POLICIES`] when left at the simulator's default; only those that
/// run in front of real servers.
fn real_policies(args: &Args) -> anyhow::Result<Vec<Policy>> {
    let list = if args.policies == super::args::DEFAULT_POLICIES { DEFAULT_POLICIES } else { &args.policies };
    let policies = list.split(',').map(Policy::parse).collect::<anyhow::Result<Vec<_>>>()?;
    for p in &policies {
        let fits = matches!(
            p,
            Policy::RoundRobin
                | Policy::Random
                | Policy::LeastConn
                | Policy::Ailb
                | Policy::AilbGateway
                | Policy::AilbGatewayApprox
                | Policy::AilbGatewayPrecise
                | Policy::TenantPinned
        ) || peers::binary(*p).is_some();
        if !fits {
            bail!(
                "--policies: {} does not run with --engine vllm (round-robin, random, least-conn, ailb, ailb-gateway, \
                 ailb-gateway-approx, ailb-gateway-precise, tenant-pinned and the peer routers do)",
                p.key()
            );
        }
    }
    Ok(policies)
}

/// The policies whose router is installed, and the others with the reason.
fn installed(policies: Vec<Policy>) -> (Vec<Policy>, Vec<(Policy, String)>) {
    let mut not_run = Vec::new();
    let run = policies
        .into_iter()
        .filter(|p| match peers::missing(*p, &peers::venv_of(*p)) {
            Some(why) => {
                eprintln!("ailb-compare: {}: {why}: skipping it", p.title());
                not_run.push((*p, why));
                false
            }
            None => true,
        })
        .collect();
    (run, not_run)
}

fn sizes(args: &Args) -> Sizes {
    Sizes {
        requests: args.prefix_requests,
        tenants: args.tenants,
        system_words: args.system_words,
        question_words: args.question_words,
        max_tokens: args.max_tokens,
        trace_requests: args.trace_requests,
        trace_scale: args.trace_scale,
        trace_max_tokens: args.trace_max_tokens,
        max_model_len: args.max_model_len,
        kv_bytes_per_token: KV_BYTES_PER_TOKEN,
        seed: args.seed,
    }
}

impl Row {
    /// Share of the prompt tokens looked up that the servers found in their caches.
    pub fn hit_share(&self) -> f64 {
        if self.queried_tokens > 0.0 {
            self.hit_tokens / self.queried_tokens
        } else {
            0.0
        }
    }

    pub fn ok(&self) -> usize {
        self.records.iter().filter(|r| r.ok()).count()
    }

    pub fn failures(&self) -> usize {
        self.records.len() - self.ok()
    }

    /// A percentile of the successful requests' time to first token, ms.
    pub fn ttft(&self, p: f64) -> Option<f64> {
        let v: Vec<f64> = self.records.iter().filter(|r| r.ok()).filter_map(|r| r.ttft_ms).collect();
        ailb_sim::replay::percentile(&v, p)
    }

    pub fn e2e(&self, p: f64) -> Option<f64> {
        let v: Vec<f64> = self.records.iter().filter(|r| r.ok()).map(|r| r.e2e_ms).collect();
        ailb_sim::replay::percentile(&v, p)
    }

    /// Successful requests per second of the run.
    pub fn rate(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.ok() as f64 / self.wall_s
        } else {
            0.0
        }
    }

    /// The cached share of the prompt tokens by the answers' own usage chunks (a cross-check
    /// of the counters; `None` when an answer lacked it, or none was served).
    pub fn usage_cached_share(&self) -> Option<f64> {
        let (prompt, cached) = usage_tokens(&self.records).ok()?;
        (prompt > 0.0).then(|| cached / prompt)
    }
}

#[expect(clippy::too_many_arguments, reason = "the parts of one run")]
fn run_policy(
    args: &Args,
    ailb: &Path,
    cg: &CgroupGuard,
    policy: Policy,
    kind: Kind,
    port: u16,
    servers: &[VllmServer],
    block: u64,
    requests: &Path,
    n: usize,
) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir().context("temp dir")?;
    let balancer = start_balancer(args, ailb, cg, policy, kind, port, servers, block, dir.path())?;
    // gRPC servers publish no /metrics: their prefix caches are emptied through the router,
    // and their cache counts are the answers' own (`usage`).
    let grpc = servers.iter().any(|s| s.frontend() == Frontend::Grpc);
    let metered: &[VllmServer] = if grpc { &[] } else { servers };
    if grpc {
        flush_through_router(balancer.addrs[0], servers.len())?;
    }
    let before = metered.iter().map(counters).collect::<anyhow::Result<Vec<_>>>()?;
    let out = dir.path().join("records.json");
    let to: Vec<String> = balancer.addrs.iter().map(SocketAddrV4::to_string).collect();
    let mut cmd = worker_command(args, policy, &to, requests, &out)?;
    eprintln!(
        "ailb-compare: {} / {}: sending {n} requests, {} at a time, to {}",
        kind.key(),
        policy.title(),
        args.concurrency,
        to.join(",")
    );
    let cpu0 = balancer.router.as_ref().and_then(|r| super::cpu::process_cpu_s(r.child.id()));
    let child = spawn_in_cgroup(&mut cmd, cg.path());
    let (status, stderr) = watch(child, metered, &before, n, kind, policy, args.deadline_s)?;
    let cpu1 = balancer.router.as_ref().and_then(|r| super::cpu::process_cpu_s(r.child.id()));
    if !status {
        bail!("the client worker failed: {stderr}");
    }
    wait_idle(metered, Duration::from_secs(60))?;
    let after = metered.iter().map(counters).collect::<anyhow::Result<Vec<_>>>()?;
    if args.keep_records {
        keep_logs(args, kind, policy, &balancer, dir.path(), &out)?;
    }
    let exclusions =
        balancer.daemon.as_ref().map(|d| d.log().lines().filter(|l| l.contains("backend excluded")).count());
    let prefix = balancer
        .daemon
        .as_ref()
        .filter(|_| matches!(policy, Policy::AilbGatewayPrecise | Policy::AilbGatewayApprox))
        .and_then(|d| {
            let status = d.status();
            status["models"].as_array()?.iter().find(|m| m["name"] == MODEL).map(|m| m["prefix"].clone())
        });
    let router_kv_events = match (policy, balancer.router_metrics) {
        (Policy::SmgKvEvents, Some(m)) => Some(smg_kv_events(m)?),
        _ => None,
    };
    drop(balancer);
    let text = std::fs::read_to_string(&out).context("reading the client worker's records")?;
    let (records, wall_s): (Vec<Record>, f64) = serde_json::from_str(&text).context("parsing the records")?;
    let (queried_tokens, hit_tokens) = if grpc {
        usage_tokens(&records)?
    } else {
        (
            before.iter().zip(&after).map(|(b, a)| a.0 - b.0).sum(),
            before.iter().zip(&after).map(|(b, a)| a.1 - b.1).sum(),
        )
    };
    Ok(Row {
        workload: kind,
        policy,
        records,
        wall_s,
        queried_tokens,
        hit_tokens,
        per_server: before.iter().zip(&after).map(|(b, a)| (a.2 - b.2).round() as u64).collect(),
        router_cpu_s: super::cpu::used(cpu0, cpu1),
        exclusions,
        prefix,
        router_kv_events,
    })
}

/// The KV-event batches and blocks SMG's index took in (its `/metrics` on `metrics`); an error
/// when it took in none: SMG then routed by its approximate tree, and the row would not be what
/// it says.
pub fn smg_kv_events(metrics: SocketAddrV4) -> anyhow::Result<(f64, f64)> {
    let text = match ailb_tests::http::get(&metrics.to_string(), "/metrics") {
        Ok((200, body)) => body,
        other => bail!("GET /metrics from SMG on {metrics}: {other:?}"),
    };
    let batches = ailb_tests::vllm::metric_sum(&text, "smg_kv_event_batches_total").unwrap_or(0.0);
    let blocks = ailb_tests::vllm::metric_sum(&text, "smg_kv_event_blocks_total").unwrap_or(0.0);
    if blocks <= 0.0 {
        bail!("SMG took in no KV-event block during the run (smg_kv_event_blocks_total {blocks}): it did not route by the engines' events");
    }
    Ok((batches, blocks))
}

/// The prompt tokens and the cached ones of the successful answers, by their `usage`: the count
/// of servers without `/metrics` (an answer without it is an error here, not a zero).
fn usage_tokens(records: &[Record]) -> anyhow::Result<(f64, f64)> {
    let (mut prompt, mut cached) = (0u64, 0u64);
    for r in records.iter().filter(|r| r.ok()) {
        prompt += r.prompt_tokens.with_context(|| format!("request {} was answered without prompt_tokens", r.index))?;
        cached += r.cached_tokens.with_context(|| format!("request {} was answered without cached_tokens", r.index))?;
    }
    Ok((prompt as f64, cached as f64))
}

/// The client worker's command line: this binary with `--real-worker`, sending `requests` to
/// `to` and writing its records to `out`.
fn worker_command(args: &Args, policy: Policy, to: &[String], requests: &Path, out: &Path) -> anyhow::Result<Command> {
    let me = std::env::current_exe().context("finding this binary")?;
    let mut cmd = Command::new(me);
    cmd.args(["--engine", "vllm", "--real-worker", &to.join(",")])
        .arg("--worker-in")
        .arg(requests)
        .arg("--worker-out")
        .arg(out)
        .args(["--concurrency", &args.concurrency.to_string(), "--deadline-s", &args.deadline_s.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if policy != Policy::Ailb {
        // Only ailb's kernel pick reads the socket's tags; every other client is plain.
        cmd.arg("--untagged");
    }
    Ok(cmd)
}

/// Waits for the client worker, printing progress every 10 s (requests the servers finished,
/// running and waiting per server); kills it by pid past its deadline and a minute. Returns
/// whether it succeeded, and its stderr.
fn watch(
    mut child: Child,
    servers: &[VllmServer],
    before: &[(f64, f64, f64, f64)],
    n: usize,
    kind: Kind,
    policy: Policy,
    deadline_s: f64,
) -> anyhow::Result<(bool, String)> {
    let mut stderr = child.stderr.take().context("piped stderr")?;
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let hard = start + Duration::from_secs_f64(deadline_s + 60.0);
    let mut next = start + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the client worker")? {
            break st;
        }
        if Instant::now() >= hard {
            let _ = child.kill(); // SIGKILL to this child's pid only
            let _ = child.wait();
            bail!("the client worker did not finish within {:.0} s", deadline_s + 60.0);
        }
        if crate::stop::requested() {
            let _ = child.kill(); // SIGKILL to this child's pid only
            let _ = child.wait();
            crate::stop::check("the client worker's run")?;
        }
        if Instant::now() >= next {
            next += Duration::from_secs(10);
            let now: Vec<(f64, f64, f64, f64)> = servers.iter().filter_map(|s| counters(s).ok()).collect();
            if now.len() == servers.len() {
                let done: f64 = now.iter().zip(before).map(|(a, b)| a.2 - b.2).sum();
                let busy: Vec<String> = now.iter().map(|c| format!("{:.0}", c.3)).collect();
                eprintln!(
                    "ailb-compare: {} / {}: {:.0} s, {done:.0}/{n} answered, running+waiting per server [{}]",
                    kind.key(),
                    policy.title(),
                    start.elapsed().as_secs_f64(),
                    busy.join(" ")
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok((status.success(), err.join().unwrap_or_default()))
}

/// `--keep-records`: the records, the daemon's and the router's logs under the output
/// directory, named by workload and policy.
fn keep_logs(args: &Args, kind: Kind, policy: Policy, b: &Balancer, dir: &Path, records: &Path) -> anyhow::Result<()> {
    let keep = args.out_dir.join("real-engine-logs");
    std::fs::create_dir_all(&keep).with_context(|| format!("creating {}", keep.display()))?;
    let name = |what: &str| keep.join(format!("{}-{}-{what}", kind.key(), policy.key()));
    let _ = std::fs::copy(records, name("records.json"));
    if let Some(d) = &b.daemon {
        std::fs::write(name("daemon.log"), d.log()).context("writing the daemon's log")?;
    }
    for entry in std::fs::read_dir(dir).context("listing the run's directory")?.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(".log") {
            let _ = std::fs::copy(entry.path(), name(&file));
        }
    }
    Ok(())
}

/// The client worker (`--real-worker ADDR`, inside the cgroup): sends the requests of
/// `--worker-in` and writes `(records, wall seconds)` to `--worker-out`.
pub fn worker(args: &Args, addr: &str) -> anyhow::Result<()> {
    let input: PathBuf = args.worker_in.clone().context("--real-worker needs --worker-in")?;
    let out = args.worker_out.clone().context("--real-worker needs --worker-out")?;
    let addrs: Vec<SocketAddrV4> = addr
        .split(',')
        .map(|a| a.parse().with_context(|| format!("--real-worker {addr}: {a:?} is not an IPv4 address and port")))
        .collect::<anyhow::Result<_>>()?;
    let text = std::fs::read(&input).with_context(|| format!("reading {}", input.display()))?;
    let mut requests: Vec<RealRequest> = serde_json::from_slice(&text).context("parsing the requests")?;
    if args.untagged {
        for r in &mut requests {
            r.tag_conversation = None;
            r.memory_mb = 0;
        }
    }
    let (records, wall_s) = client::run(&addrs, &requests, args.concurrency, Duration::from_secs_f64(args.deadline_s));
    std::fs::write(&out, serde_json::to_vec(&(records, wall_s))?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
