//! The balancing policies compared, and the config of the `ailb run` gateway for each.

use ailb_sim::GpuProfile;
use ailb_tests::nacos::RnacosServer;
use ailb_tests::{base_config, BackendCfg, CgroupGuard, TestConfig};
use anyhow::bail;

use super::args::Args;
use super::{MODEL, VIP};
use crate::sim_gpus::SimGpu;

/// A balancing policy under comparison (see the [module docs](super)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    RoundRobin,
    Random,
    LeastConn,
    Ailb,
    AilbStatic,
    AilbGateway,
    /// ailb in full with `prefix = "approximate"`: the replay tags each socket with the
    /// prompt's text prefix keys as well.
    AilbPrefix,
    /// ailb in full with `prefix = "approximate"` through its front door with
    /// `prefix_keys = true` (text keys: no tokenizer).
    AilbGatewayPrefix,
    /// ailb in full through its front door with `[gateway.admission] mode = "fleet_memory"`.
    AilbGatewayAdmission,
    AilbStaticGateway,
    Nginx,
    SglangCacheAware,
    SglangRoundRobin,
    /// SMG (the Shepherd Model Gateway, sglang-router's successor), `--policy cache_aware`; its
    /// settings for each policy are in [`super::peers`].
    SmgCacheAware,
    /// SMG, `--policy prefix_hash`.
    SmgPrefixHash,
    /// SMG, `--policy least_load`.
    SmgLeastLoad,
    /// SMG `--policy cache_aware` routing by the engines' own KV events: vLLM behind its gRPC
    /// server (SMG's servicer), where SMG tokenizes and reads each engine's KV-event stream
    /// over gRPC (real engines only: SMG takes KV events only from gRPC workers).
    SmgKvEvents,
    VllmCacheAware,
    VllmConsistentHash,
    /// ailb through its front door with the prefix-aware pick in precise mode: `ailb run`
    /// follows the engines' KV events, the front door sends token-exact keys (real engines only).
    AilbGatewayPrecise,
    /// The same in approximate mode: the kernel learns from its own picks, the front door sends
    /// text keys (no tokenizer configured).
    AilbGatewayApprox,
    /// The oracle of the shared-prefix mix, no balancer: the client sends every request of
    /// tenant `t` straight to server `t % servers` (a conversation of the trace counts as a
    /// tenant). Each tenant's prompt is cached on one server only; real engines only.
    TenantPinned,
}

impl Policy {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s.trim() {
            "round-robin" => Self::RoundRobin,
            "random" => Self::Random,
            "least-conn" => Self::LeastConn,
            "ailb" => Self::Ailb,
            "ailb-static" => Self::AilbStatic,
            "ailb-gateway" => Self::AilbGateway,
            "ailb-prefix" => Self::AilbPrefix,
            "ailb-gateway-prefix" => Self::AilbGatewayPrefix,
            "ailb-gateway-admission" => Self::AilbGatewayAdmission,
            "ailb-static-gateway" => Self::AilbStaticGateway,
            "nginx" => Self::Nginx,
            "sglang-cache-aware" => Self::SglangCacheAware,
            "sglang-round-robin" => Self::SglangRoundRobin,
            "smg-cache-aware" => Self::SmgCacheAware,
            "smg-prefix-hash" => Self::SmgPrefixHash,
            "smg-least-load" => Self::SmgLeastLoad,
            "smg-kv-events" => Self::SmgKvEvents,
            "vllm-cache-aware" => Self::VllmCacheAware,
            "vllm-consistent-hash" => Self::VllmConsistentHash,
            "ailb-gateway-precise" => Self::AilbGatewayPrecise,
            "ailb-gateway-approx" => Self::AilbGatewayApprox,
            "tenant-pinned" => Self::TenantPinned,
            other => bail!(
                "unknown policy {other:?} (round-robin, random, least-conn, ailb, ailb-static, ailb-gateway, \
                 ailb-prefix, ailb-gateway-prefix, ailb-gateway-admission, ailb-static-gateway, nginx, \
                 sglang-cache-aware, sglang-round-robin, smg-cache-aware, smg-prefix-hash, smg-least-load, \
                 vllm-cache-aware, vllm-consistent-hash, ailb-gateway-precise (simulated GPUs: with \
                 --sim-tokenizer); with --engine vllm also ailb-gateway-approx, tenant-pinned, smg-kv-events)"
            ),
        })
    }
    /// Whether the replay tags this policy's sockets with the conversation and memory need:
    /// only ailb through its socket ABI reads them; the others are as an L4 or L7 balancer that
    /// knows neither (ailb's front door reads the same facts from the plain HTTP request).
    pub fn tagged(self) -> bool {
        matches!(self, Self::Ailb | Self::AilbStatic | Self::AilbPrefix)
    }

    /// The model's `prefix` mode of an ailb prefix policy (`None`: off); the socket ABI's
    /// policy then also tags each socket with the prompt's prefix keys, the front door's sends them.
    pub fn prefix_mode(self) -> Option<&'static str> {
        match self {
            Self::AilbPrefix | Self::AilbGatewayPrefix => Some("approximate"),
            Self::AilbGatewayPrecise => Some("precise"),
            _ => None,
        }
    }

    /// Whether this is ailb in full (rnacos, agents, the AI-aware policy), prefix mode or not.
    pub fn is_full(self) -> bool {
        matches!(self, Self::Ailb | Self::AilbPrefix)
    }

    /// Whether the policy runs only in front of real engines (`--engine vllm`): the real
    /// race's own approximate row, the oracle, and SMG with the engines' KV events (it reads
    /// them only from gRPC workers; a simulated GPU is an HTTP worker). (`ailb-gateway-precise`
    /// runs on simulated GPUs too, when they tokenize: `--sim-tokenizer`.)
    pub fn real_engines_only(self) -> bool {
        matches!(self, Self::AilbGatewayApprox | Self::TenantPinned | Self::SmgKvEvents)
    }

    /// Whether the policy's servers are vLLM's gRPC servers rather than its OpenAI servers.
    pub fn grpc_workers(self) -> bool {
        self == Self::SmgKvEvents
    }

    /// The ailb behind `ailb gateway` for a front-door policy (`None` for every other).
    pub fn behind_front_door(self) -> Option<Policy> {
        match self {
            Self::AilbGateway | Self::AilbGatewayAdmission | Self::AilbGatewayPrecise | Self::AilbGatewayApprox => {
                Some(Self::Ailb)
            }
            Self::AilbGatewayPrefix => Some(Self::AilbPrefix),
            Self::AilbStaticGateway => Some(Self::AilbStatic),
            _ => None,
        }
    }

    /// Whether a userspace process (nginx, a peer router, ailb's front door) is on the request
    /// path; the others' pick is the kernel's.
    pub fn userspace_router(self) -> bool {
        self == Self::Nginx || self.behind_front_door().is_some() || super::peers::binary(self).is_some()
    }

    /// Whether this is one of ailb's rows (socket ABI or front door).
    pub fn is_ailb(self) -> bool {
        matches!(
            self,
            Self::Ailb
                | Self::AilbStatic
                | Self::AilbGateway
                | Self::AilbPrefix
                | Self::AilbGatewayPrefix
                | Self::AilbGatewayAdmission
                | Self::AilbStaticGateway
                | Self::AilbGatewayPrecise
                | Self::AilbGatewayApprox
        )
    }

    /// The policy's name on the command line and in file names.
    pub fn key(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::Random => "random",
            Self::LeastConn => "least-conn",
            Self::Ailb => "ailb",
            Self::AilbStatic => "ailb-static",
            Self::AilbGateway => "ailb-gateway",
            Self::AilbPrefix => "ailb-prefix",
            Self::AilbGatewayPrefix => "ailb-gateway-prefix",
            Self::AilbGatewayAdmission => "ailb-gateway-admission",
            Self::AilbStaticGateway => "ailb-static-gateway",
            Self::Nginx => "nginx",
            Self::SglangCacheAware => "sglang-cache-aware",
            Self::SglangRoundRobin => "sglang-round-robin",
            Self::SmgCacheAware => "smg-cache-aware",
            Self::SmgPrefixHash => "smg-prefix-hash",
            Self::SmgLeastLoad => "smg-least-load",
            Self::SmgKvEvents => "smg-kv-events",
            Self::VllmCacheAware => "vllm-cache-aware",
            Self::VllmConsistentHash => "vllm-consistent-hash",
            Self::AilbGatewayPrecise => "ailb-gateway-precise",
            Self::AilbGatewayApprox => "ailb-gateway-approx",
            Self::TenantPinned => "tenant-pinned",
        }
    }
    /// The policy's name in the report.
    pub fn title(self) -> &'static str {
        match self {
            Self::RoundRobin => "round robin L4",
            Self::Random => "random L4",
            Self::LeastConn => "least connections",
            Self::Ailb => "ailb",
            Self::AilbStatic => "ailb, static config",
            Self::AilbGateway => "ailb (front door)",
            Self::AilbPrefix => "ailb, prefix approximate",
            Self::AilbGatewayPrefix => "ailb (front door), prefix approximate",
            Self::AilbGatewayAdmission => "ailb (front door, admission on)",
            Self::AilbStaticGateway => "ailb, static config (front door)",
            Self::Nginx => "nginx L7 round robin",
            Self::SglangCacheAware => "sglang-router cache-aware",
            Self::SglangRoundRobin => "sglang-router round robin",
            Self::SmgCacheAware => "SMG cache-aware",
            Self::SmgPrefixHash => "SMG prefix hash",
            Self::SmgLeastLoad => "SMG least load",
            Self::SmgKvEvents => "SMG cache-aware, KV events (gRPC)",
            Self::VllmCacheAware => "vllm-router cache-aware",
            Self::VllmConsistentHash => "vllm-router consistent hash",
            Self::AilbGatewayPrecise => "ailb (front door, prefix precise)",
            Self::AilbGatewayApprox => "ailb (front door, prefix approximate)",
            Self::TenantPinned => "tenant pinned (oracle)",
        }
    }
}

/// `balancer.affinity_wait` in real time: the simulated GPUs run `time_scale` times faster, and
/// so do their prefix caches turn over.
fn affinity_wait(args: &Args) -> String {
    format!("{}ms", (args.ailb_affinity_wait_s * 1000.0 / args.time_scale).round() as u64)
}

/// The model's `prefix` mode and `prefix_ttl` (real time: the simulated GPUs' caches turn over
/// `time_scale` times faster), as `[[models]]` lines; empty for a policy without one, and with
/// `--ailb-keys-only`.
fn prefix_toml(policy: Policy, args: &Args) -> String {
    if args.ailb_keys_only {
        return String::new();
    }
    policy.prefix_mode().map_or_else(String::new, |mode| {
        if mode == "precise" {
            // The engines' own entries never age.
            return format!("prefix = \"{mode}\"\n");
        }
        let ttl_ms = (args.ailb_prefix_ttl_s * 1000.0 / args.time_scale).round().max(1.0) as u64;
        format!("prefix = \"{mode}\"\nprefix_ttl = \"{ttl_ms}ms\"\n")
    })
}

/// The gateway of the full ailb: instances, metadata and weights from the agents through rnacos
/// (the AI-aware policy), the same capability ratio as the static config's weights.
/// (`policy` names its pins: ailb in full, or through its front door; a prefix policy's model
/// gets its prefix mode.)
pub fn nacos_config(policy: Policy, cg: &CgroupGuard, nacos: &RnacosServer, args: &Args) -> TestConfig {
    let a100 = args.a100_capability;
    let mut cfg = base_config(&format!("cmp-{}", policy.key()), cg);
    cfg.affinity = true;
    cfg.load_bound = true;
    cfg.load_factor = args.ailb_load_factor;
    cfg.prefix_load_factor = args.ailb_prefix_load_factor;
    cfg.affinity_wait = affinity_wait(args);
    cfg.seed = args.ailb_table_seed;
    cfg.extra = format!(
        "[[models]]\nname = \"{MODEL}\"\nvips = [\"{VIP}\"]\n{}\n\
         [discovery]\nsource = \"nacos\"\n[discovery.nacos]\nservers = [\"{}\"]\npoll_interval = \"100ms\"\n\n\
         [policy]\n{}\n[policy.gpu_capability]\n\"A100-80GB\" = {a100:?}\n\"RTX3090-24GB\" = 1.0\n",
        prefix_toml(policy, args),
        nacos.url(),
        args.ailb_policy.join("\n"),
    );
    cfg
}

/// Sets the balancer of a baseline policy in the kernel (round robin, random, least connections:
/// bounded loads with c close to 1 skip every backend above the mean in-flight count); `false`
/// for the other policies, whose settings are their own. The simulated and the real-engine
/// races share it.
pub fn baseline(policy: Policy, cfg: &mut TestConfig) -> bool {
    match policy {
        Policy::RoundRobin => {
            cfg.affinity = false;
            cfg.load_bound = false;
            cfg.round_robin = true;
        }
        Policy::Random => {
            cfg.affinity = false;
            cfg.load_bound = false;
        }
        Policy::LeastConn => {
            cfg.affinity = false;
            cfg.load_bound = true;
            cfg.load_factor = 1.01;
        }
        _ => return false,
    }
    true
}

/// The static config of `policy`'s gateway over `sims` (every policy but ailb in full and nginx).
pub fn config_for(policy: Policy, cg: &CgroupGuard, sims: &[SimGpu], args: &Args) -> TestConfig {
    let mut cfg = base_config(&format!("cmp-{}", policy.key()), cg).service(MODEL, VIP);
    cfg.seed = args.ailb_table_seed;
    // Nginx and the peer routers never start it (they proxy instead of ailb).
    let ailb = matches!(policy, Policy::Ailb | Policy::AilbStatic | Policy::AilbStaticGateway);
    if !baseline(policy, &mut cfg) && ailb {
        cfg.affinity = true;
        cfg.load_bound = true;
        cfg.load_factor = args.ailb_load_factor;
        cfg.affinity_wait = affinity_wait(args);
    }
    for s in sims {
        let addr = s.addr.to_string();
        let b = match policy {
            Policy::Ailb | Policy::AilbStatic | Policy::AilbStaticGateway => {
                let p = GpuProfile::preset(s.profile).expect("preset");
                let kv_mb = ((p.kv_blocks() * p.block_bytes()) >> 20) as u32;
                // Static weights are whole numbers: the capability ratio in tenths.
                let w = if s.profile.starts_with("a100") { (args.a100_capability * 10.0).round() as u32 } else { 10 };
                BackendCfg::new(MODEL, &addr, w).free_memory_mb(kv_mb)
            }
            _ => BackendCfg::new(MODEL, &addr, 1),
        };
        cfg = cfg.backend(b);
    }
    cfg
}
