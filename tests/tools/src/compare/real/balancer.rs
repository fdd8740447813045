//! The balancer under test of the real-engine race, one policy at a time: a peer router, no
//! balancer for the `tenant-pinned` oracle, or `ailb run` (its config per policy) with, for the
//! front-door policies, `ailb gateway` in front.

use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

use ailb_tests::status::backend;
use ailb_tests::vllm::{Engine, VllmServer, KV_BYTES_PER_TOKEN};
use ailb_tests::{base_config, BackendCfg, CgroupGuard, Daemon, TestConfig};
use anyhow::{bail, Context};

use super::workload::Kind;
use super::MODEL;
use crate::compare::args::Args;
use crate::compare::policy::{self, Policy};
use crate::compare::{front_door, peers, VIP};
use crate::sim_gpus::Proc;

/// The balancer under test, held to be stopped on drop (the router first, then `ailb run`).
pub(super) struct Balancer {
    pub(super) router: Option<Proc>,
    pub(super) daemon: Option<Daemon>,
    /// Where the client sends: one address, or (`tenant-pinned`) the servers, a tenant's
    /// requests to one of them.
    pub(super) addrs: Vec<SocketAddrV4>,
    /// A peer router's Prometheus endpoint.
    pub(super) router_metrics: Option<SocketAddrV4>,
}

/// SMG `prefix_hash`'s key length for a workload, tokens. Its docs: the key should cover what
/// requests that belong together share and no more. On the shared-prefix mix that is the
/// tenant's system prompt (about 2,400 tokens), which the key of 1,024 tokens that the
/// simulated race passes lies inside; the trace's prompts are scaled by `1 / --trace-scale`
/// here, so its 1,024 (the trace's shared first block and a conversation's first block of its
/// own) scales with them.
pub fn prefix_token_count(kind: Kind, args: &Args) -> u32 {
    match kind {
        Kind::SharedPrefix => 1024,
        Kind::Trace => (1024 / args.trace_scale).max(1),
    }
}

#[expect(clippy::too_many_arguments, reason = "the parts of one run")]
pub(super) fn start_balancer(
    args: &Args,
    ailb: &Path,
    cg: &CgroupGuard,
    policy: Policy,
    kind: Kind,
    port: u16,
    servers: &[VllmServer],
    block: u64,
    dir: &Path,
) -> anyhow::Result<Balancer> {
    let addrs: Vec<SocketAddrV4> =
        servers.iter().map(|s| s.addr().parse()).collect::<Result<_, _>>().context("server addresses")?;
    if peers::binary(policy).is_some() {
        let listen = SocketAddrV4::new([127, 0, 10, 250].into(), port);
        let metrics = SocketAddrV4::new([127, 0, 10, 249].into(), port + peers::METRICS_PORT_OFFSET);
        let scheme = if policy.grpc_workers() { "grpc" } else { "http" };
        let mut a =
            peers::args(policy, listen, metrics, &addrs.iter().map(|a| format!("{scheme}://{a}")).collect::<Vec<_>>());
        if let Some(at) = a.iter().position(|x| x == "--prefix-token-count") {
            a[at + 1] = prefix_token_count(kind, args).to_string();
        }
        if policy.grpc_workers() {
            // Over gRPC the router tokenizes and renders the chat template: the servers' own
            // model folder.
            let model = Engine::find().map_err(|why| anyhow::anyhow!("--engine vllm: {why}"))?.model;
            a.push("--model-path".into());
            a.push(model.display().to_string());
        }
        let router = peers::start_with_args(policy, &peers::venv_of(policy), listen, a, addrs.len(), dir)?;
        return Ok(Balancer { router: Some(router), daemon: None, addrs: vec![listen], router_metrics: Some(metrics) });
    }
    if policy == Policy::TenantPinned {
        return Ok(Balancer { router: None, daemon: None, addrs, router_metrics: None });
    }
    let mut cfg = config(policy, cg, servers, block, args.ailb_load_factor)?;
    cfg.seed = args.ailb_table_seed;
    cfg.prefix_load_factor = args.ailb_prefix_load_factor;
    let front =
        (policy.behind_front_door() == Some(Policy::Ailb)).then(|| SocketAddrV4::new([127, 0, 10, 248].into(), port));
    if let Some(listen) = front {
        // The servers' own model folder: its tokenizer and chat template are theirs.
        let tokenizer = Engine::find().map_err(|why| anyhow::anyhow!("--engine vllm: {why}"))?.model;
        cfg.extra.push_str(&format!(
            "\n[gateway]\nlisten = [\"{listen}\"]\n{keys}[gateway.kv_bytes_per_token]\n\"{MODEL}\" = {KV_BYTES_PER_TOKEN}\n\
             [gateway.kv_block_tokens]\n\"{MODEL}\" = {block}\n",
            keys = gateway_keys(policy, &tokenizer)
        ));
    }
    let daemon = Daemon::start(ailb, &cfg);
    if policy == Policy::Ailb || policy.behind_front_door() == Some(Policy::Ailb) {
        // The one-box daemon samples every server itself before it weighs them.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !servers.iter().all(|s| {
            backend(&daemon.status(), &s.addr()).is_some_and(|b| b["live"] == true && b["free_mem_mb"].is_u64())
        }) {
            if Instant::now() >= deadline {
                bail!("ailb run did not sample every vLLM server within 15 s:\n{}", daemon.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut b = Balancer { router: None, daemon: None, addrs: vec![VIP.parse().context("VIP")?], router_metrics: None };
    if let Some(listen) = front {
        b.router = Some(front_door::start(ailb, daemon.config_path(), Some(cg), listen, dir)?);
        b.addrs = vec![listen];
    }
    b.daemon = Some(daemon);
    Ok(b)
}

/// The `[gateway]` lines of the prefix keys: text keys for approximate mode (no tokenizer),
/// token-exact keys of the model's own tokenizer for precise mode; none for the others.
fn gateway_keys(policy: Policy, tokenizer: &Path) -> String {
    match policy {
        Policy::AilbGatewayApprox => "prefix_keys = true\n".to_string(),
        Policy::AilbGatewayPrecise => {
            format!("prefix_keys = true\n[gateway.tokenizers]\n\"{MODEL}\" = \"{}\"\n", tokenizer.display())
        }
        _ => String::new(),
    }
}

/// `ailb run`'s config for a kernel policy over the real servers: the L4 baselines on a
/// static table as in the simulated race; ailb with the daemon's defaults (affinity, load
/// bound 1.25, 20 s affinity wait, each server's `/metrics` and `/health` sampled every 500 ms:
/// load, free KV memory from its KV cache and the tiny model's bytes per token); the prefix
/// policies add the model's `prefix` mode, and precise mode each server's KV-event sockets
/// with its real block size.
fn config(
    policy: Policy,
    cg: &CgroupGuard,
    servers: &[VllmServer],
    block: u64,
    load_factor: f64,
) -> anyhow::Result<TestConfig> {
    let mut cfg = base_config(&format!("real-{}", policy.key()), cg).service(MODEL, VIP);
    // ailb: the daemon's defaults, its sampling too (every 500 ms, each request bounded by that
    // interval); the load bound's factor is `--ailb-load-factor` (default 1.25, the daemon's).
    if !policy::baseline(policy, &mut cfg) {
        cfg.load_factor = load_factor;
    }
    let sampled = policy == Policy::Ailb || policy.behind_front_door() == Some(Policy::Ailb);
    for s in servers {
        let mut b = BackendCfg::new(MODEL, &s.addr(), 1);
        if sampled {
            b.extra = format!(
                "metrics_url = \"http://{a}/metrics\"\nhealth_url = \"http://{a}/health\"\nkv_bytes_per_token = {KV_BYTES_PER_TOKEN}\n",
                a = s.addr()
            );
        }
        if policy == Policy::AilbGatewayPrecise {
            let kv = s.kv_events().with_context(|| format!("vLLM on {} publishes no KV events", s.addr()))?;
            b.extra.push_str(&format!(
                "kv_events = \"{}\"\nkv_replay = \"{}\"\nkv_block_size = {block}\n",
                kv.endpoint(),
                kv.replay_endpoint()
            ));
        }
        cfg = cfg.backend(b);
    }
    let mode = match policy {
        Policy::AilbGatewayPrecise => Some("precise"),
        Policy::AilbGatewayApprox => Some("approximate"),
        _ => None,
    };
    if let Some(mode) = mode {
        cfg.extra.push_str(&format!("[[models]]\nname = \"{MODEL}\"\nprefix = \"{mode}\"\n"));
    }
    Ok(cfg)
}
