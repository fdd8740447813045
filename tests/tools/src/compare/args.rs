//! The command line of `ailb-compare`.

use std::path::PathBuf;

use ailb_sim::replay::shared_prefix::SharedPrefixOpts;
use anyhow::bail;
use clap::Parser;

/// `--policies` when not given (with `--engine vllm`: [`super::real::DEFAULT_POLICIES`]).
pub const DEFAULT_POLICIES: &str = "round-robin,random,least-conn,ailb,ailb-static,nginx";

/// The model servers of a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// Simulated GPUs (`ailb-sim`), a fresh fleet per policy.
    Sim,
    /// Real vLLM for CPU servers serving the tiny model, started once ([`super::real`]).
    Vllm,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "ailb-compare",
    about = "Balancing policies compared on one simulated GPU fleet, or on real vLLM servers (root)"
)]
pub struct Args {
    /// Requests to replay (the first N of the trace, or N synthetic ones).
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Offered load relative to the trace's own rate (the replay runs at
    /// `--speed = load x time-scale`, so the trace's clock and the GPUs' clock agree at 1.0).
    /// The default, 0.4, is the highest load at which the default fleet is stable under a
    /// clairvoyant placement (`ailb-fleet-model`): a fleet provisioned for its traffic. At 0.5
    /// and above no placement keeps the queues from growing for as long as the run lasts.
    #[arg(long, default_value_t = 0.4)]
    pub load: f64,
    /// Simulated seconds per real second, for every GPU.
    #[arg(long, default_value_t = 20.0)]
    pub time_scale: f64,
    /// The synthetic mix instead of the Mooncake trace.
    #[arg(long, conflicts_with = "shared_prefix")]
    pub synthetic: bool,
    /// The shared-prefix workload instead of the Mooncake trace: `--tenants` tenants, each with
    /// a system prompt of `--system-blocks` 512-token blocks shared by its users, every request
    /// a different user's question (`--question-blocks`) and no conversation (no session
    /// header, no conversation tag), Poisson arrivals at `--rate` requests per second
    /// (`ailb_sim::replay::shared_prefix`).
    #[arg(long)]
    pub shared_prefix: bool,
    /// New synthetic conversations per (simulated) second; with `--shared-prefix`, requests per
    /// (simulated) second. `--load` scales it as it scales the trace.
    #[arg(long, default_value_t = 5.0)]
    pub rate: f64,
    /// `--shared-prefix`: 512-token blocks of each tenant's system prompt.
    #[arg(long, default_value_t = 12)]
    pub system_blocks: u32,
    /// `--shared-prefix`: 512-token blocks of each user's question (the last one 128 to 512 tokens).
    #[arg(long, default_value_t = 1)]
    pub question_blocks: u32,
    /// `--shared-prefix`: mean output tokens of a request (uniform in half to 1.5 times this).
    #[arg(long, default_value_t = 200)]
    pub output_tokens: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// With `--synthetic` or `--shared-prefix`: run the whole comparison on this many workloads,
    /// seeds `--seed` on, each in `--out-dir/seed-S/`, and summarise them in
    /// `--out-dir/seeds.md` ([`super::seeds`]).
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// Number of simulated A100-80GB GPUs.
    #[arg(long, default_value_t = 2)]
    pub a100: usize,
    /// Number of simulated RTX 3090 24GB GPUs.
    #[arg(long, default_value_t = 4)]
    pub rtx3090: usize,
    /// Comma-separated policies, run in this order: round-robin, random, least-conn, ailb,
    /// ailb-static, ailb-gateway, ailb-static-gateway (the two ailbs through `ailb gateway`),
    /// ailb-prefix, ailb-gateway-prefix (ailb in full with `prefix = "approximate"`, through the
    /// socket ABI with the prompt's prefix keys or through the front door with `prefix_keys`),
    /// nginx (nginx L7 round robin, `proxy_buffering off`; needs `nginx` on PATH), and the peer
    /// routers sglang-cache-aware, sglang-round-robin, smg-cache-aware, smg-prefix-hash,
    /// smg-least-load, vllm-cache-aware, vllm-consistent-hash.
    /// With `--engine vllm`: round-robin, random, least-conn, ailb, ailb-gateway and the peer
    /// routers (default: round-robin, ailb, ailb-gateway, smg-cache-aware, smg-prefix-hash,
    /// vllm-cache-aware).
    #[arg(long, default_value = DEFAULT_POLICIES)]
    pub policies: String,
    /// The model servers: simulated GPUs, or real vLLM for CPU servers (the options below
    /// `--servers` apply to those only).
    #[arg(long, value_enum, default_value_t = Engine::Sim)]
    pub engine: Engine,
    /// `--engine vllm`: how many vLLM servers (1 to 3; each takes about 4 GB).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// `--engine vllm`: the workloads, comma-separated, run in this order: shared-prefix
    /// (tenants' long system prompts, no session header) and trace (a slice of the Mooncake
    /// trace, scaled down).
    #[arg(long, default_value = "shared-prefix,trace")]
    pub workloads: String,
    /// `--engine vllm`: requests of the shared-prefix workload.
    #[arg(long, default_value_t = 48)]
    pub prefix_requests: usize,
    /// Tenants of the shared-prefix workload, each with its system prompt (`--shared-prefix`,
    /// and `--engine vllm`'s shared-prefix workload).
    #[arg(long, default_value_t = 8)]
    pub tenants: usize,
    /// `--engine vllm`: words of each tenant's system prompt (about 2 tokens a word).
    #[arg(long, default_value_t = 600)]
    pub system_words: usize,
    /// `--engine vllm`: words of each user's question.
    #[arg(long, default_value_t = 30)]
    pub question_words: usize,
    /// `--engine vllm`: output tokens of each shared-prefix request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// `--engine vllm`: requests of the trace workload, at most (whole conversations of two
    /// turns or more, in the order of their first turn).
    #[arg(long, default_value_t = 32)]
    pub trace_requests: usize,
    /// `--engine vllm`: the trace's prompts and outputs are divided by this (a divisor of 2048).
    #[arg(long, default_value_t = 16)]
    pub trace_scale: u32,
    /// `--engine vllm`: output tokens of a trace request, at most.
    #[arg(long, default_value_t = 32)]
    pub trace_max_tokens: u32,
    /// `--engine vllm`: the servers' `--max-model-len` (the tiny model has 16,384 positions;
    /// vLLM refuses to start unless `--kv-blocks` less one hold it, at 128 tokens a block).
    #[arg(long, default_value_t = 6144)]
    pub max_model_len: usize,
    /// `--engine vllm`: KV blocks per server (`--num-gpu-blocks-override`; 128 tokens each on
    /// CPU); 0 keeps the 1 GiB cache (2,048 blocks), which holds every prompt of a run. The
    /// default, 49 (6,272 tokens), holds about 65 % of the shared-prefix tenants' system prompts:
    /// one server cannot keep them all, two can if each keeps its share.
    #[arg(long, default_value_t = 49)]
    pub kv_blocks: u64,
    /// `--engine vllm`: requests in flight (a closed loop: each client sends its next request
    /// when its last is answered).
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Internal: the real-engine client worker, sending to this address, and exit.
    #[arg(long, hide = true)]
    pub real_worker: Option<String>,
    /// Internal: the requests the real-engine client worker sends.
    #[arg(long, hide = true)]
    pub worker_in: Option<PathBuf>,
    /// Where `replay.md`, `replay-cdf.svg`, `replay-util.svg` and `replay-plots.json` go.
    #[arg(long, default_value = "target/bench")]
    pub out_dir: PathBuf,
    /// Only redraw `replay-cdf.svg` and `replay-util.svg` in `--out-dir` from the data a run
    /// saved there (`replay-plots.json`): no root, no fleet, no replay.
    #[arg(long)]
    pub replot: bool,
    /// Also write the numbers as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Mooncake trace, gzipped or plain (default: `ailb-replay`'s, `$AILB_TRACE` or the one shipped
    /// in `tests/data/`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Simulated GPUs: a model folder (tokenizer.json, tokenizer_config.json, chat template)
    /// with which every GPU tokenizes its prompts as vLLM does and publishes KV events in
    /// vLLM's format, for every policy of the race, so that `ailb-gateway-precise` (which
    /// needs it) and the others run on the same fleet (e.g. `~/.cache/ailb/models/tiny-llama`).
    #[arg(long)]
    pub sim_tokenizer: Option<PathBuf>,
    /// `ailb-sim` binary (default: next to this one).
    #[arg(long)]
    pub sim_bin: Option<PathBuf>,
    /// Internal: run the replay against this VIP (inside the cgroup) and exit.
    #[arg(long, hide = true)]
    pub replay_worker: Option<String>,
    /// Internal: where the replay worker writes its JSON report.
    #[arg(long, hide = true)]
    pub worker_out: Option<PathBuf>,
    /// Internal: the replay worker sends no conversation or memory tag.
    #[arg(long, hide = true)]
    pub untagged: bool,
    /// Internal: the replay worker's tagged sockets also carry the prompt's text prefix keys.
    #[arg(long, hide = true)]
    pub prefix_keys: bool,
    /// Limit of the replay of one policy, real seconds.
    #[arg(long, default_value_t = 300.0)]
    pub deadline_s: f64,
    /// ailb's (and ailb-static's) load bound factor c (the daemon's default, 1.25).
    #[arg(long, default_value_t = 1.25)]
    pub ailb_load_factor: f64,
    /// The load bound factor of a prefix holder for ailb's prefix policies (default: the
    /// daemon's, the larger of 2 and `--ailb-load-factor`).
    #[arg(long)]
    pub ailb_prefix_load_factor: Option<f64>,
    /// `[balancer] seed` of every ailb policy's gateway: the layout of its weighted tables. Another
    /// seed draws afresh which backend each hash lands on, with the same pick: a control for how
    /// much of a difference between two policies is that draw rather than the pick.
    #[arg(long, default_value_t = 0)]
    pub ailb_table_seed: u64,
    /// ailb's (and ailb-static's) `affinity_wait` in simulated seconds (the daemon's default,
    /// 20 s); the gateway, which runs in real time, gets it divided by the time scale.
    #[arg(long, default_value_t = 20.0)]
    pub ailb_affinity_wait_s: f64,
    /// Diagnostic: ailb's prefix policies make and send their keys as usual (the front door of
    /// `ailb-gateway-precise` tokenizing each prompt), but their model has no `prefix` mode, so
    /// the kernel ignores the keys and the daemon follows no KV events: what making and sending
    /// the keys costs, apart from what the prefix-aware pick does.
    #[arg(long)]
    pub ailb_keys_only: bool,
    /// `prefix_ttl` of the ailb prefix policies' model in simulated seconds (the daemon's
    /// default, 60 s); the daemon, which runs in real time, gets it divided by the time scale.
    #[arg(long, default_value_t = 60.0)]
    pub ailb_prefix_ttl_s: f64,
    /// `ailb-gateway-admission`: `gateway.admission.max_wait` in simulated seconds (the
    /// gateway, in real time, gets it divided by the time scale).
    #[arg(long, default_value_t = 20.0)]
    pub admission_max_wait_s: f64,
    /// `ailb-gateway-admission`: `gateway.admission.factor`.
    #[arg(long, default_value_t = 1.0)]
    pub admission_factor: f64,
    /// The A100's GPU capability (weight) against the RTX 3090's 1, for ailb and ailb-static.
    #[arg(long, default_value_t = 3.0)]
    pub a100_capability: f64,
    /// How often each `ailb agent` of ailb in full publishes (real time; its default on real
    /// GPUs is 1 s, which is 50 ms at the default time scale of 20).
    #[arg(long, default_value = "200ms")]
    pub agent_interval: String,
    /// Also keep every request's record (the replay's JSON report) as `records-<policy>.json`
    /// in the output directory, with the gateway's log (`daemon-<policy>.log`) and, for ailb in
    /// full, the agents' logs.
    #[arg(long)]
    pub keep_records: bool,
    /// A `[policy]` setting of ailb in full, `KEY=VALUE` in TOML (repeatable), e.g.
    /// `--ailb-policy load_scale=16`.
    #[arg(long = "ailb-policy", value_name = "KEY=VALUE")]
    pub ailb_policy: Vec<String>,
}

impl Args {
    /// Rejects option values no run can use.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.load > 0.0 && self.time_scale > 0.0 && self.deadline_s > 0.0) {
            bail!("--load, --time-scale and --deadline-s must be positive");
        }
        if !(self.ailb_affinity_wait_s >= 0.0 && self.ailb_affinity_wait_s.is_finite()) {
            bail!("--ailb-affinity-wait-s must be a finite number of seconds >= 0, not {}", self.ailb_affinity_wait_s);
        }
        if !(self.admission_max_wait_s >= 0.0 && self.admission_max_wait_s.is_finite()) {
            bail!("--admission-max-wait-s must be a finite number of seconds >= 0, not {}", self.admission_max_wait_s);
        }
        if !(self.admission_factor > 0.0 && self.admission_factor.is_finite()) {
            bail!("--admission-factor must be a finite number above 0, not {}", self.admission_factor);
        }
        if !(self.ailb_prefix_ttl_s > 0.0 && self.ailb_prefix_ttl_s.is_finite()) {
            bail!("--ailb-prefix-ttl-s must be a finite number of seconds above 0, not {}", self.ailb_prefix_ttl_s);
        }
        if self.shared_prefix {
            self.shared_prefix_opts().validate().map_err(|e| anyhow::anyhow!("--shared-prefix: {e}"))?;
        }
        if self.seeds == 0 || (self.seeds > 1 && !self.synthetic && !self.shared_prefix) {
            bail!(
                "--seeds must be at least 1, and above 1 only with --synthetic or --shared-prefix (the trace has one \
                 order), not {}",
                self.seeds
            );
        }
        if self.a100 + self.rtx3090 == 0 || self.a100 + self.rtx3090 > 250 {
            bail!("the fleet needs 1..=250 GPUs");
        }
        Ok(())
    }

    /// The shared-prefix workload's options (`--limit` requests).
    pub fn shared_prefix_opts(&self) -> SharedPrefixOpts {
        SharedPrefixOpts {
            requests: self.limit,
            tenants: self.tenants,
            system_blocks: self.system_blocks,
            question_blocks: self.question_blocks,
            requests_per_s: self.rate,
            output_tokens: self.output_tokens,
            seed: self.seed,
        }
    }

    /// The replay speed: the offered load on the GPUs' clock.
    pub fn speed(&self) -> f64 {
        self.load * self.time_scale
    }
}
