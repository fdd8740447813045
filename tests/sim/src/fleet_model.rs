//! A whole fleet of simulated GPUs in simulated time, without kernel, HTTP or clocks: the
//! requests of a replay go through a placement [`Placement`] to the pure GPU model [`gpu`](crate::gpu),
//! event by event. It answers in milliseconds what a real comparison (`ailb-compare`) takes
//! minutes to measure, which is what a capacity question needs: at which offered load is the
//! fleet stable under a good placement, and where does round robin already overload the small
//! GPUs (`ailb-fleet-model`).
//!
//! The ailb placements here call the kernel's own pick ([`ailb_common::pick::pick_prefixed`],
//! with the prefix step for [`Placement::AilbPrefix`]) on in-memory maps, with the weights and
//! memory the daemon would write, so the model differs from the real data plane only in what it
//! leaves out: connection latency, and the agents (the free memory written is the KV pool, as in
//! the static config; the in-flight hints make it live).

use std::collections::{BTreeMap, HashMap, HashSet};

use ailb_common::{
    hash::{conversation_hash, fmix64},
    pick::{pick_prefixed, ClientFamily, PickRequest, PrefixQuery, VecMaps},
    AffinityValue, Backend, GlobalConfig, ModelState, PrefixHolders, ABI_VERSION, BACKEND_LIVE, CONFIG_DEFAULT_FLAGS,
    MODEL_PREFIX_LEARN, NO_BACKEND, NO_CAP,
};

use crate::gpu::{Admission, Gpu, GpuProfile, ReqId, SimRequest, Started};
use crate::replay::RequestSpec;
use ailb_userspace::{
    policy::fill_time_lifetime,
    telemetry::source::{PromptRate, DEFAULT_PROMPT_RATE_WINDOW},
};

const MODEL: u32 = 1;
const MIB: u64 = 1024 * 1024;

/// How requests are placed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Placement {
    /// Each GPU in turn, untagged (no memory hint): the L4 round robin baseline.
    RoundRobin,
    /// The GPU with the fewest requests in flight, untagged.
    LeastConnections,
    /// The kernel's pick with ailb's weights (`a100_weight` : 1 per GPU type), affinity,
    /// bounded loads (`load_factor`) and the memory fit: each backend's free memory is its KV
    /// pool (as the static config writes it) less the memory hints in flight to it, which the
    /// kernel counts itself (an agent's live free memory would only be lower when something
    /// else used the GPU). `affinity_wait_s`: the balancer's `affinity_wait`, simulated seconds.
    Ailb { a100_weight: u32, load_factor: f64, affinity_wait_s: f64 },
    /// [`Placement::Ailb`] with the prefix step in approximate mode, as `ailb-compare`'s
    /// `ailb-prefix` runs it: each request carries the text keys its socket would send
    /// ([`RequestSpec::socket_prefix_keys`]), the pick tries the holders of its longest prefix
    /// learnt (their load bound `prefix_load_factor`) and places the rest by that prefix, and
    /// each pick records its keys for the backend chosen, counted for `prefix_ttl_s`, or with
    /// `ttl_fill_factor` for the daemon's lifetime by that factor ([`fill_time_lifetime`], at
    /// most `prefix_ttl_s`), sampled once a simulated second.
    AilbPrefix {
        a100_weight: u32,
        load_factor: f64,
        affinity_wait_s: f64,
        prefix_load_factor: f64,
        prefix_ttl_s: f64,
        ttl_fill_factor: Option<f64>,
    },
    /// Clairvoyant greedy bound: the GPU where this request would finish first if nothing
    /// else arrived (the model of every GPU is run forward). Not implementable by a balancer
    /// (it needs every server's exact queue and future); it shows what placement alone can do.
    EarliestFinish,
    /// SMG's `cache_aware` policy as `ailb-compare`'s `smg-cache-aware` runs it over HTTP, from
    /// its source: when the router's in-flight counts are imbalanced (max - min above
    /// `balance_abs` and max above `balance_rel` x min) the least loaded GPU; otherwise the GPU
    /// its approximate tree matched the longest run of the prompt's text to, if that run is over
    /// `cache_threshold` of the prompt, else the least loaded. Every pick inserts the prompt into
    /// the chosen GPU's tree, which is never evicted here (SMG evicts by size, far above what a
    /// run inserts). The tree is kept in [`TEXT_CHUNK_BYTES`](ailb_common::prefix::TEXT_CHUNK_BYTES)
    /// chunks rather than characters, and of the GPUs holding the longest run the one that last
    /// got it is taken (SMG's tree names one of them by its own order).
    SmgCacheAware { balance_abs: u64, balance_rel: f64, cache_threshold: f64 },
    /// The prefix-cache oracle: every request goes to the GPU that holds the longest
    /// cached run of its prompt's leading blocks, counting only blocks of its own conversation
    /// (a later turn returns to its conversation's cache wherever it still is), ties (and
    /// requests cached nowhere) to the earliest finish. The caches are the GPUs' own, so an
    /// evicted prefix is lost to the oracle too.
    CacheOracle,
}

impl Placement {
    pub fn label(&self) -> String {
        match self {
            Placement::RoundRobin => "round robin".into(),
            Placement::LeastConnections => "least connections".into(),
            Placement::Ailb { .. } => "ailb (kernel pick)".into(),
            Placement::AilbPrefix { .. } => "ailb, prefix approximate (kernel pick)".into(),
            Placement::SmgCacheAware { .. } => "SMG cache-aware (modelled)".into(),
            Placement::EarliestFinish => "earliest finish (clairvoyant bound)".into(),
            Placement::CacheOracle => "prefix-cache oracle".into(),
        }
    }
}

/// What happened to one request (simulated seconds).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Outcome {
    pub gpu: usize,
    pub failed: bool,
    /// Arrival to first token.
    pub ttft_s: f64,
    /// Arrival to last token.
    pub e2e_s: f64,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub outcomes: Vec<Outcome>,
    /// Per GPU: busy seconds / run length (first arrival to last answer).
    pub utilisation: Vec<f64>,
    /// Prompt tokens found cached over all prompt tokens started.
    pub prefix_hit_rate: f64,
    /// Later turns of a conversation served by the GPU of its turn before.
    pub affinity_hit_rate: f64,
    pub length_s: f64,
}

impl RunResult {
    /// `p` (0..=1) percentile of the successful requests' end-to-end latency, nearest rank.
    pub fn e2e_percentile(&self, p: f64) -> f64 {
        percentile(self.outcomes.iter().filter(|o| !o.failed).map(|o| o.e2e_s).collect(), p)
    }
    pub fn ttft_percentile(&self, p: f64) -> f64 {
        percentile(self.outcomes.iter().filter(|o| !o.failed).map(|o| o.ttft_s).collect(), p)
    }
    pub fn failures(&self) -> usize {
        self.outcomes.iter().filter(|o| o.failed).count()
    }
    /// Max - min of the per-GPU utilisation, 0..=1.
    pub fn utilisation_spread(&self) -> f64 {
        let max = self.utilisation.iter().copied().fold(0.0, f64::max);
        let min = self.utilisation.iter().copied().fold(1.0, f64::min);
        (max - min).max(0.0)
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Time as integer nanoseconds, so that events order exactly.
fn ns(t: f64) -> u64 {
    (t * 1e9).round() as u64
}

/// The kernel maps of one model, in memory (its table in row 0), with the model's state and
/// the global config.
struct Kernel {
    maps: VecMaps,
    state: ModelState,
    cfg: GlobalConfig,
    /// Approximate prefix mode ([`Placement::AilbPrefix`]): the model's flags and lifetime are in
    /// `state`, the holders' factor in `cfg`.
    prefix: bool,
}

impl Kernel {
    /// The kernel of [`Placement::Ailb`] or [`Placement::AilbPrefix`] (else `None`).
    fn for_placement(profiles: &[GpuProfile], placement: Placement) -> Option<Kernel> {
        match placement {
            Placement::Ailb { a100_weight, load_factor, affinity_wait_s } => {
                Some(Kernel::new(profiles, a100_weight, load_factor, affinity_wait_s))
            }
            Placement::AilbPrefix {
                a100_weight,
                load_factor,
                affinity_wait_s,
                prefix_load_factor,
                prefix_ttl_s,
                ..
            } => {
                let mut k = Kernel::new(profiles, a100_weight, load_factor, affinity_wait_s);
                k.state.flags |= MODEL_PREFIX_LEARN;
                k.state.prefix_ttl_ns = ns(prefix_ttl_s);
                k.cfg.prefix_load_factor_milli = (prefix_load_factor * 1000.0).round() as u32;
                k.prefix = true;
                Some(k)
            }
            _ => None,
        }
    }

    fn new(profiles: &[GpuProfile], a100_weight: u32, load_factor: f64, affinity_wait_s: f64) -> Kernel {
        let backends: Vec<Backend> = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let kv_mb = (p.kv_blocks() * p.block_bytes() / MIB) as u32;
                Backend {
                    addr: u32::from(std::net::Ipv4Addr::new(127, 0, 10, i as u8 + 1)).to_be(),
                    port: 8000u16.to_be(),
                    model: MODEL,
                    weight: if p.gpu_type.starts_with("A100") { a100_weight } else { 1 },
                    cap: NO_CAP,
                    free_mem_mb: kv_mb,
                    state: BACKEND_LIVE,
                    mem_capacity_mb: kv_mb,
                    ..Default::default()
                }
            })
            .collect();
        let (maps, state) = VecMaps::one_model(MODEL, 0, backends);
        Kernel {
            maps,
            state,
            cfg: GlobalConfig {
                abi_version: ABI_VERSION,
                load_factor_milli: (load_factor * 1000.0).round() as u32,
                probes: 4,
                flags: CONFIG_DEFAULT_FLAGS,
                affinity_ttl_ns: 0,
                generation: 1,
                affinity_wait_ns: ns(affinity_wait_s),
                // The table's, unless the placement has a prefix mode.
                prefix_load_factor_milli: 0,
                _pad: 0,
            },
            prefix: false,
        }
    }
}

struct Fleet {
    gpus: Vec<Gpu>,
    /// Requests placed on each GPU and not finished (running or queued): the kernel's in-flight.
    inflight: Vec<u64>,
    /// Their memory hints, MB.
    inflight_mb: Vec<u64>,
    hint_mb: Vec<u64>,
    /// (end ns, sequence) -> (gpu, request id).
    ends: BTreeMap<(u64, u64), (usize, ReqId)>,
    seq: u64,
    owner: HashMap<(usize, ReqId), usize>,
    arrive: Vec<f64>,
    outcomes: Vec<Outcome>,
    /// Each request's conversation hash (ailb only: `None` untagged).
    conversation: Vec<Option<u64>>,
    /// The kernel's affinity map: conversation hash -> backend and last connect or close.
    affinity: HashMap<u64, AffinityValue>,
}

impl Fleet {
    fn started(&mut self, gpu: usize, s: Started, now: f64) {
        let req = self.owner[&(gpu, s.id)];
        let end = now + s.prefill_s + s.decode_s;
        self.seq += 1;
        self.ends.insert((ns(end), self.seq), (gpu, s.id));
        let o = &mut self.outcomes[req];
        o.ttft_s = now + s.prefill_s - self.arrive[req];
        o.e2e_s = end - self.arrive[req];
    }

    /// Runs every request end up to and including `until`.
    fn advance(&mut self, until: f64) {
        let limit = ns(until);
        while let Some((&(t_ns, seq), &(gpu, id))) = self.ends.first_key_value() {
            if t_ns > limit {
                break;
            }
            self.ends.remove(&(t_ns, seq));
            let now = t_ns as f64 / 1e9;
            let req = self.owner.remove(&(gpu, id)).expect("every started request has an owner");
            self.inflight[gpu] -= 1;
            self.inflight_mb[gpu] -= self.hint_mb[req];
            // The close refreshes the conversation's affinity entry, as `sock_ops` does.
            if let Some(aff) = self.conversation[req].and_then(|h| self.affinity.get_mut(&h)) {
                if aff.backend as usize == gpu {
                    aff.last_seen_ns = t_ns;
                }
            }
            for s in self.gpus[gpu].finish(id, now) {
                self.started(gpu, s, now);
            }
        }
    }

    /// Seconds from `now` until `req` would finish on `gpu` if nothing else arrived.
    fn finish_if_placed(&self, gpu: usize, req: &SimRequest, now: f64) -> f64 {
        let mut g = self.gpus[gpu].clone();
        let mut ends: BTreeMap<(u64, u64), ReqId> =
            self.ends.iter().filter(|(_, (gg, _))| *gg == gpu).map(|(k, (_, id))| (*k, *id)).collect();
        let me = match g.admit(req.clone(), now) {
            Admission::Start(s) => return s.prefill_s + s.decode_s,
            Admission::Queued(id) => id,
            Admission::Reject(_) => return f64::INFINITY,
        };
        let mut seq = u64::MAX / 2;
        while let Some(((t_ns, _), id)) = ends.pop_first() {
            let t = t_ns as f64 / 1e9;
            for s in g.finish(id, t) {
                if s.id == me {
                    return t + s.prefill_s + s.decode_s - now;
                }
                seq += 1;
                ends.insert((ns(t + s.prefill_s + s.decode_s), seq), s.id);
            }
        }
        f64::INFINITY
    }
}

/// Replays `specs` (sorted by `at_ms`) at `load` x their rate on a fleet of `profiles`.
pub fn run(specs: &[RequestSpec], profiles: &[GpuProfile], load: f64, placement: Placement) -> RunResult {
    assert!(load > 0.0 && !profiles.is_empty(), "load > 0 and at least one GPU");
    let mut fleet = Fleet::new(profiles, specs);
    let mut kernel = Kernel::for_placement(profiles, placement);
    let shared = shared_blocks(specs);
    let mut turns = Turns::default();
    let mut smg_tree = SmgTree::default();
    let mut fill = match placement {
        Placement::AilbPrefix { ttl_fill_factor: Some(factor), prefix_ttl_s, .. } => {
            Some(FillClock::new(profiles, prefix_ttl_s, factor))
        }
        _ => None,
    };
    for (i, spec) in specs.iter().enumerate() {
        let now = spec.at_ms as f64 / 1000.0 / load;
        fleet.advance(now);
        if let (Some(f), Some(k)) = (fill.as_mut(), kernel.as_mut()) {
            if let Some(ttl_s) = f.sample(&fleet.gpus, now) {
                k.state.prefix_ttl_ns = ns(ttl_s);
            }
        }
        fleet.arrive[i] = now;
        let req = SimRequest {
            prompt_tokens: spec.prompt_tokens as u64,
            max_tokens: spec.max_tokens as u64,
            hash_ids: crate::text::cache_keys(&spec.hash_ids, spec.prompt_tokens as u64),
            token_ids: Vec::new(),
        };
        let gpu = match placement {
            Placement::RoundRobin => i % profiles.len(),
            Placement::LeastConnections => fleet.least_connections(),
            Placement::EarliestFinish => fleet.earliest_finish(&req, now),
            Placement::CacheOracle => fleet.cache_oracle(&req, now, &shared),
            Placement::SmgCacheAware { balance_abs, balance_rel, cache_threshold } => {
                let least = fleet.least_connections();
                let (min, max) = (fleet.inflight[least], fleet.inflight.iter().copied().max().unwrap_or(0));
                let imbalanced = max.saturating_sub(min) > balance_abs && max as f64 > balance_rel * min as f64;
                smg_tree.pick(spec, i as u64, least, (!imbalanced).then_some(cache_threshold))
            }
            Placement::Ailb { .. } | Placement::AilbPrefix { .. } => {
                let Some(gpu) = fleet.kernel_pick(kernel.as_mut().expect("built for ailb"), i, spec, now) else {
                    fleet.outcomes[i] = Outcome { gpu: usize::MAX, failed: true, ..Default::default() };
                    continue;
                };
                gpu
            }
        };
        turns.served(&spec.conversation, gpu);
        fleet.outcomes[i].gpu = gpu;
        fleet.admit(i, gpu, req, now);
    }
    fleet.advance(f64::INFINITY);
    fleet.result(&turns)
}

/// The fill-time rule's sampler: once a simulated second, each GPU's prompt-token counter read
/// into the agent's smoothed rate ([`PromptRate`], over its default window), and the daemon's
/// lifetime from the rates and the GPUs' KV capacities ([`fill_time_lifetime`]).
struct FillClock {
    cap: std::time::Duration,
    factor: f64,
    /// Simulated time 0 as an `Instant` (the agent's rate reads instants).
    epoch: std::time::Instant,
    last_s: f64,
    rate: Vec<PromptRate>,
    capacity: Vec<f64>,
}

impl FillClock {
    fn new(profiles: &[GpuProfile], cap_s: f64, factor: f64) -> Self {
        let epoch = std::time::Instant::now();
        let mut rate: Vec<PromptRate> = profiles.iter().map(|_| PromptRate::new(DEFAULT_PROMPT_RATE_WINDOW)).collect();
        for r in &mut rate {
            r.update(epoch, Some(0.0));
        }
        FillClock {
            cap: std::time::Duration::from_secs_f64(cap_s),
            factor,
            epoch,
            last_s: 0.0,
            rate,
            capacity: profiles.iter().map(|p| (p.kv_blocks() * crate::gpu::BLOCK_TOKENS) as f64).collect(),
        }
    }

    /// The lifetime at `now`, once a second has passed since the last sample.
    fn sample(&mut self, gpus: &[Gpu], now: f64) -> Option<f64> {
        if now - self.last_s < 1.0 {
            return None;
        }
        self.last_s = now;
        let at = self.epoch + std::time::Duration::from_secs_f64(now);
        let rates: Vec<f64> = gpus
            .iter()
            .zip(&mut self.rate)
            .map(|(gpu, r)| r.update(at, Some(gpu.counters().prefix_query_tokens as f64)).unwrap_or(0.0))
            .collect();
        let caches = self.capacity.iter().copied().zip(rates);
        Some(fill_time_lifetime(caches, self.factor, self.cap).as_secs_f64())
    }
}

/// [`Placement::SmgCacheAware`]'s approximate tree: each chained text key of a prompt inserted
/// -> the GPUs it was inserted for, each with the pick that last inserted it.
#[derive(Default)]
struct SmgTree {
    holders: HashMap<u64, Vec<(usize, u64)>>,
}

impl SmgTree {
    /// The GPU for pick `seq` of `spec`: with `cache_threshold` (the fleet is balanced), the
    /// GPU matched to the longest leading run of the prompt's keys when that run is over the
    /// threshold, else `least`; then the prompt is inserted for the GPU chosen.
    fn pick(&mut self, spec: &RequestSpec, seq: u64, least: usize, cache_threshold: Option<f64>) -> usize {
        let keys = ailb_common::prefix::text_keys(spec.prompt().as_bytes());
        let matched = keys.iter().take_while(|k| self.holders.contains_key(k)).count();
        let gpu = match (cache_threshold, matched.checked_sub(1)) {
            (Some(t), Some(last)) if matched as f64 / keys.len() as f64 > t => {
                self.holders[&keys[last]].iter().max_by_key(|(_, at)| *at).map_or(least, |(g, _)| *g)
            }
            _ => least,
        };
        for k in keys {
            let v = self.holders.entry(k).or_default();
            match v.iter_mut().find(|(g, _)| *g == gpu) {
                Some(e) => e.1 = seq,
                None => v.push((gpu, seq)),
            }
        }
        gpu
    }
}

/// Which GPU served each conversation's last turn, and how many later turns went to the same.
#[derive(Default)]
struct Turns<'a> {
    last_gpu: HashMap<&'a str, usize>,
    /// Turns of a conversation after its first.
    after_first: u64,
    /// Those served by the GPU of the turn before.
    same_gpu: u64,
}

impl<'a> Turns<'a> {
    fn served(&mut self, conversation: &'a str, gpu: usize) {
        if conversation.is_empty() {
            return;
        }
        if let Some(prev) = self.last_gpu.insert(conversation, gpu) {
            self.after_first += 1;
            self.same_gpu += u64::from(prev == gpu);
        }
    }
}

impl Fleet {
    fn new(profiles: &[GpuProfile], specs: &[RequestSpec]) -> Fleet {
        let n = specs.len();
        Fleet {
            gpus: profiles.iter().cloned().map(Gpu::new).collect(),
            inflight: vec![0; profiles.len()],
            inflight_mb: vec![0; profiles.len()],
            hint_mb: specs.iter().map(|s| s.memory_mb as u64).collect(),
            ends: BTreeMap::new(),
            seq: 0,
            owner: HashMap::new(),
            arrive: vec![0.0; n],
            outcomes: vec![Outcome::default(); n],
            conversation: vec![None; n],
            affinity: HashMap::new(),
        }
    }

    /// The GPU with the fewest requests in flight (the lowest index of those).
    fn least_connections(&self) -> usize {
        (0..self.gpus.len()).min_by_key(|&g| (self.inflight[g], g)).unwrap_or(0)
    }

    /// The GPU where `req` would finish first if nothing else arrived (the lowest index of those).
    fn earliest_finish(&self, req: &SimRequest, now: f64) -> usize {
        (0..self.gpus.len())
            .map(|g| (self.finish_if_placed(g, req, now), g))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map_or(0, |(_, g)| g)
    }

    /// [`Placement::CacheOracle`]: the GPU that can take `req` and holds the longest cached run
    /// of its own conversation's leading blocks; ties to the earliest finish, then the lowest index.
    fn cache_oracle(&self, req: &SimRequest, now: f64, shared: &HashSet<u64>) -> usize {
        // Leading cached blocks of the prompt that belong to its conversation (shared
        // blocks such as a common system prompt are cached everywhere and say nothing).
        let blocks = req.prompt_tokens.div_ceil(crate::gpu::BLOCK_TOKENS) as usize;
        let own = |g: usize| {
            req.hash_ids
                .iter()
                .take(blocks)
                .take_while(|h| self.gpus[g].is_cached(**h))
                .filter(|h| !shared.contains(*h))
                .count()
        };
        (0..self.gpus.len())
            .map(|g| (own(g), self.finish_if_placed(g, req, now), g))
            .filter(|(_, finish, _)| finish.is_finite())
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)).then(b.2.cmp(&a.2)))
            .map_or(0, |(_, _, g)| g)
    }

    /// [`Placement::Ailb`]: the kernel's pick for request `i` over the fleet's in-flight counts
    /// and memory, writing the conversation's affinity entry as the kernel does; `None` when no
    /// backend fits (the connect is refused).
    fn kernel_pick(&mut self, kernel: &mut Kernel, i: usize, spec: &RequestSpec, now: f64) -> Option<usize> {
        for g in 0..self.gpus.len() {
            kernel.maps.inflight[g] = self.inflight[g];
            kernel.maps.inflight_mem[g] = self.inflight_mb[g];
        }
        let hash = if spec.conversation.is_empty() {
            fmix64(i as u64 + 1)
        } else {
            conversation_hash(spec.conversation.as_bytes())
        };
        let pick_req = PickRequest {
            model: MODEL,
            hash,
            has_conversation: !spec.conversation.is_empty(),
            required_mem_mb: spec.memory_mb,
            affinity: self.affinity.get(&hash).copied(),
            now_ns: ns(now),
            model_inflight: self.inflight.iter().sum(),
            turn: 0,
            affinity_bounded: false,
        };
        let keys = if kernel.prefix { prefix_keys(spec) } else { Vec::new() };
        let view = kernel.state.view();
        let query = PrefixQuery::for_connect(&keys, &view, ns(now));
        let r = pick_prefixed(&kernel.maps, &view, &kernel.cfg, &pick_req, ClientFamily::Ipv4, Some(&query)).0;
        if r.backend == NO_BACKEND {
            return None;
        }
        // Approximate mode: the keys now name the backend chosen (sock_ops, at the SYN).
        for &k in query.keys {
            let holders = kernel.maps.prefix.entry((MODEL, k)).or_insert(PrefixHolders::EMPTY);
            holders.record(r.backend, query.now_tick, query.now_tick, query.ttl_ticks);
        }
        if pick_req.has_conversation {
            self.conversation[i] = Some(hash);
            self.affinity
                .insert(hash, AffinityValue { backend: r.backend, last_seen_ns: ns(now), ..Default::default() });
        }
        Some(r.backend as usize)
    }

    /// Request `i` (`req`) arrives at `gpu`: it starts, queues (both count in flight) or is
    /// rejected (failed).
    fn admit(&mut self, i: usize, gpu: usize, req: SimRequest, now: f64) {
        match self.gpus[gpu].admit(req, now) {
            Admission::Start(s) => {
                self.inflight[gpu] += 1;
                self.inflight_mb[gpu] += self.hint_mb[i];
                self.owner.insert((gpu, s.id), i);
                self.started(gpu, s, now);
            }
            Admission::Queued(id) => {
                self.inflight[gpu] += 1;
                self.inflight_mb[gpu] += self.hint_mb[i];
                self.owner.insert((gpu, id), i);
            }
            Admission::Reject(_) => self.outcomes[i].failed = true,
        }
    }

    /// The run's figures, once every request has ended.
    fn result(self, turns: &Turns) -> RunResult {
        let first = self.arrive.first().copied().unwrap_or(0.0);
        let last = self.outcomes.iter().zip(&self.arrive).map(|(o, a)| a + o.e2e_s).fold(first, f64::max);
        let length_s = (last - first).max(f64::MIN_POSITIVE);
        let (mut hit, mut query) = (0u64, 0u64);
        for g in &self.gpus {
            hit += g.counters().prefix_hit_tokens;
            query += g.counters().prefix_query_tokens;
        }
        RunResult {
            utilisation: self.gpus.iter().map(|g| (g.busy_seconds(last) / length_s).min(1.0)).collect(),
            prefix_hit_rate: if query > 0 { hit as f64 / query as f64 } else { 0.0 },
            affinity_hit_rate: if turns.after_first > 0 {
                turns.same_gpu as f64 / turns.after_first as f64
            } else {
                0.0
            },
            outcomes: self.outcomes,
            length_s,
        }
    }
}

/// The keys a tagged socket of `spec` carries: the text keys of its prompt, as sent.
fn prefix_keys(spec: &RequestSpec) -> Vec<u64> {
    let all = ailb_common::prefix::text_keys(spec.prompt().as_bytes());
    ailb_common::prefix::sent(&all).map(|(_, k)| k).collect()
}

/// Blocks in the prompts of more than one conversation (a common system prompt).
fn shared_blocks(specs: &[RequestSpec]) -> HashSet<u64> {
    let mut first: HashMap<u64, &str> = HashMap::new();
    let mut shared = HashSet::new();
    for s in specs {
        for h in crate::text::cache_keys(&s.hash_ids, s.prompt_tokens as u64) {
            if *first.entry(h).or_insert(&s.conversation) != s.conversation {
                shared.insert(h);
            }
        }
    }
    shared
}

/// The benchmark fleet: `a100` A100-80GB then `rtx3090` RTX 3090 presets.
pub fn fleet_profiles(a100: usize, rtx3090: usize) -> Vec<GpuProfile> {
    let mut v = vec![GpuProfile::preset("a100-80gb").expect("preset"); a100];
    v.extend(vec![GpuProfile::preset("rtx3090-24gb").expect("preset"); rtx3090]);
    v
}

#[cfg(test)]
mod tests;
