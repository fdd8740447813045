//! Pure policy: `(Snapshot, catalog, [policy], previous state) -> per model, per backend {eligible,
//! weight, cap, reason, explanation}`. Deterministic: no clock, no randomness; equal inputs
//! and equal state give equal plans and equal next states, whatever the order of the
//! instances. The metadata contract it reads is `docs/metadata.md`.
//!
//! Per backend (`evaluate`):
//! 1. model affinity: `model_id` or `supported_models` must name the model (none: trusted from
//!    the registry service); a pinned `model_version` must match;
//! 2. resource match: free memory >= the model's `required_memory_mb`;
//! 3. health: Nacos `enabled` and `healthy`, the agent's `health_status`;
//! 4. weight `registry x gpu_capability x load x util` where
//!    `load = 1 / (1 + (current_requests + queue_weight * queue_length) / (load_scale * gpu_capability))` and
//!    `util` is `util_down_factor` / 1 / `util_up_factor` by the band of the smoothed
//!    `gpu_util` (EWMA, bands with hysteresis; `factors`).
//!
//! Per model (`weights`): the composed weights become table weights (whole ones as they are,
//! else scaled to a maximum of 1000), and when the eligible set is unchanged and every
//! share moved less than `min_weight_change`, the last table weights are emitted again, so
//! the datapath writer (which skips identical tables) rebuilds nothing.

mod cluster;
mod config;
mod evaluate;
mod explain;
mod factors;
mod prefix;
mod weights;

#[cfg(test)]
mod tests;

use crate::metadata;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::SocketAddr,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use self::evaluate::Evaluated;
pub use self::{
    config::{PolicyConfig, MAX_GPU_CAPABILITY},
    evaluate::MIN_REGISTRY_WEIGHT,
    explain::{BackendExplain, Exclusion, LoadExplain, MemoryExplain, Reason, UtilExplain},
    factors::UtilBand,
    metadata::InvalidField,
    prefix::{fill_time_lifetime, PrefixMode, DEFAULT_PREFIX_TTL, DEFAULT_PREFIX_TTL_FILL, MAX_PREFIX_TTL_FILL},
    weights::{MAX_WEIGHT, WEIGHT_SCALE},
};
use crate::discovery::{Instance, Snapshot};

/// What the policy needs to know about one model of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelSpec {
    /// The model's VIPs.
    pub vips: Vec<SocketAddr>,
    /// GPU memory (MiB) a backend must have free to be eligible; `None`: no requirement.
    pub required_memory_mb: Option<u32>,
    /// Only instances whose `model_version` equals this are eligible.
    pub model_version: Option<String>,
    /// The model's affinity TTL; `None`: the balancer's.
    pub affinity_ttl: Option<Duration>,
    /// In-flight requests one backend serves well, for backends without `max_inflight`: the
    /// capacity of the cluster preference's saturation rule and of the autoscaling gauges.
    pub backend_capacity: Option<u32>,
    /// This model's `spill_saturation` in thousandths; `None`: `[policy]`'s.
    pub spill_saturation_milli: Option<u32>,
    /// How the model's prefix map learns.
    pub prefix: PrefixMode,
    /// How long a learnt prefix entry (approximate mode) or an evicted holder (precise mode)
    /// counts at most.
    pub prefix_ttl: Option<Duration>,
    /// The lifetime as a multiple of the longest fill time of the model's caches, in
    /// thousandths, capped at `prefix_ttl` ([`fill_time_lifetime`]); 0: `prefix_ttl` itself.
    pub prefix_ttl_fill_milli: u32,
}

impl AsRef<ModelSpec> for ModelSpec {
    fn as_ref(&self) -> &ModelSpec {
        self
    }
}

/// What the policy remembers between plans. The daemon keeps one for its lifetime; a fresh
/// one (a restart) only loses the smoothing and the last weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyState {
    /// Per model, per backend seen in the last plan (by model first, so that a plan looks a
    /// model up once and its backends by address, without a key string per backend).
    backends: BTreeMap<String, BTreeMap<SocketAddr, BackendMemory>>,
    /// Per model: the table weights last emitted for its eligible backends.
    last_weights: BTreeMap<String, BTreeMap<SocketAddr, u32>>,
    /// Per model: why the last plan spilled to other clusters (absent: it did not).
    cluster_spill: BTreeMap<String, cluster::Spill>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BackendMemory {
    /// EWMA of `gpu_util` (%).
    pub(crate) util_ewma: Option<f64>,
    pub(crate) band: UtilBand,
    /// The report (hash of the metadata map) last taken into the EWMA.
    pub(crate) last_report: Option<u64>,
    /// What was last logged: the excluding rule and the invalid keys.
    logged: Option<(Option<Exclusion>, Vec<&'static str>)>,
    /// Evaluated by the plan running now (cleared when it ends): what is not is forgotten.
    seen: bool,
    /// The most free memory (MiB) this backend has reported: what it holds when idle.
    peak_free_mb: Option<u32>,
}

impl PolicyState {
    /// The smoothed GPU utilisation of a backend, if it reported one (the plan's explanation
    /// carries it for everyone else).
    #[cfg(test)]
    pub(crate) fn smoothed_util(&self, model: &str, backend: SocketAddr) -> Option<f64> {
        self.backends.get(model).and_then(|b| b.get(&backend)).and_then(|m| m.util_ewma)
    }

    /// Takes `capacity_mb` as the most free memory `backend` of `model` has reported (a
    /// previous daemon's knowledge, read back from the kernel's maps at a restart); a
    /// larger report later still raises it.
    pub fn seed_capacity(&mut self, model: &str, backend: SocketAddr, capacity_mb: u32) {
        let mem = self.backends.entry(model.to_string()).or_default().entry(backend).or_default();
        mem.peak_free_mb = Some(mem.peak_free_mb.map_or(capacity_mb, |p| p.max(capacity_mb)));
    }

    /// Takes `weights` as the table weights last emitted for `model` (a previous daemon's,
    /// read back at a restart), for the `min_weight_change` rule of the next plan.
    pub fn seed_weights(&mut self, model: &str, weights: BTreeMap<SocketAddr, u32>) {
        if !weights.is_empty() {
            self.last_weights.insert(model.to_string(), weights);
        }
    }

    /// The table weights last emitted for a model's eligible backends.
    pub fn last_weights(&self, model: &str) -> Option<&BTreeMap<SocketAddr, u32>> {
        self.last_weights.get(model)
    }
}

/// One backend of a model's plan. `/v1/plan` also carries [`PlannedBackend::reason`], the
/// one-line summary, as the field `reason` (written from the explanation when served; a plan
/// read back recomputes it).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlannedBackend {
    pub address: SocketAddr,
    /// Table weight, 0..=65535 (0 when not eligible).
    pub weight: u32,
    /// Hard in-flight cap, 0 = none.
    pub cap: u32,
    /// `None`: unknown (fits every memory hint).
    pub free_memory_mb: Option<u32>,
    /// The most free memory the backend has reported since it appeared (what it has when
    /// idle): a request that needs more than is free now but no more than this is queued there
    /// when no backend has it free, instead of refused. `None`: never reported.
    pub memory_capacity_mb: Option<u32>,
    pub eligible: bool,
    pub explain: BackendExplain,
}

impl PlannedBackend {
    /// One line: why excluded, or the product that gave the weight. Formatted when asked
    /// (`/v1/plan`, `ailb explain`), not in every plan: a plan of 16,000 backends spent a third
    /// of its time writing these lines.
    pub fn reason(&self) -> String {
        self.explain.summary(self.weight)
    }
}

impl Serialize for PlannedBackend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// The fields in their order on the wire, `reason` before `explain`.
        #[derive(Serialize)]
        struct Wire<'a> {
            address: &'a SocketAddr,
            weight: u32,
            cap: u32,
            free_memory_mb: Option<u32>,
            memory_capacity_mb: Option<u32>,
            eligible: bool,
            reason: String,
            explain: &'a BackendExplain,
        }
        Wire {
            address: &self.address,
            weight: self.weight,
            cap: self.cap,
            free_memory_mb: self.free_memory_mb,
            memory_capacity_mb: self.memory_capacity_mb,
            eligible: self.eligible,
            reason: self.reason(),
            explain: &self.explain,
        }
        .serialize(s)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelPlan {
    pub vips: Vec<SocketAddr>,
    /// Sorted by address, so that equal inputs give equal plans whatever their order.
    pub backends: Vec<PlannedBackend>,
    /// Shown as humantime writes it (`"10m"`); `null`: the balancer's TTL.
    #[serde(with = "human_duration")]
    pub affinity_ttl: Option<Duration>,
    /// At least one eligible backend. When false the kernel refuses connects to the model's
    /// VIPs with ECONNREFUSED.
    pub available: bool,
    /// New weights differed from the last table by less than `min_weight_change`, so the last
    /// table weights were emitted again.
    pub weights_held: bool,
    /// How the model's prefix map learns.
    #[serde(default)]
    pub prefix: PrefixMode,
    /// How long a learnt prefix entry (approximate mode) or an evicted holder (precise mode)
    /// counts: the model's `prefix_ttl`, or less where its caches fill faster
    /// ([`fill_time_lifetime`]); `null`: a learnt entry until the map evicts it, an evicted
    /// holder not at all.
    #[serde(default, with = "human_duration")]
    pub prefix_ttl: Option<Duration>,
}

/// An optional duration as humantime writes and reads it (`"10m"`, `"1h 30m"`).
mod human_duration {
    use std::time::Duration;

    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| humantime::format_duration(d).to_string()).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| humantime::parse_duration(&t).map_err(|e| D::Error::custom(format!("duration {t:?}: {e}"))))
            .transpose()
    }
}

/// Model name -> plan.
pub type Plan = BTreeMap<String, ModelPlan>;

/// The JSON contract of the daemon's `/v1/plan`, which `ailb explain` reads: the last plan and
/// the generation of the tables written from it. The daemon serves `null` until its first plan.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PlanView {
    pub generation: u64,
    pub models: Plan,
}

/// Orders IPv4 addresses (by address, then port) before IPv6 ones (likewise).
fn addr_key(a: &SocketAddr) -> (u8, u128, u16) {
    match a {
        SocketAddr::V4(v4) => (4, u128::from(u32::from(*v4.ip())), a.port()),
        SocketAddr::V6(v6) => (6, u128::from(*v6.ip()), a.port()),
    }
}

/// A total order on instances, so that the one kept among duplicates of an address does not
/// depend on the order of the registry's answer.
fn instance_order(a: &Instance, b: &Instance) -> std::cmp::Ordering {
    (&a.service, &a.group, &a.cluster, !a.enabled, !a.healthy)
        .cmp(&(&b.service, &b.group, &b.cluster, !b.enabled, !b.healthy))
        .then_with(|| a.weight.total_cmp(&b.weight))
        .then_with(|| a.metadata.cmp(&b.metadata))
}

/// Plans every model of `models` (the catalog, by name) over `snapshot`, with the `[policy]`
/// constants `cfg`; `state` carries the smoothing and the last table weights to the next plan.
pub fn plan<M: AsRef<ModelSpec>>(
    snapshot: &Snapshot,
    models: &BTreeMap<String, M>,
    cfg: &PolicyConfig,
    state: &mut PolicyState,
) -> Plan {
    // Instances per model, grouped once (not one pass over the snapshot per model).
    let mut of_model: HashMap<&str, Vec<&Instance>> = HashMap::new();
    for inst in &snapshot.instances {
        of_model.entry(inst.model.as_str()).or_default().push(inst);
    }
    // The (model, service) pairs whose service reached its protection threshold, once (not a
    // scan of every service per backend).
    let protected: HashSet<(&str, &str)> = snapshot
        .services
        .iter()
        .filter(|s| s.reach_protection_threshold)
        .map(|s| (s.model.as_str(), s.service.as_str()))
        .collect();
    let mut plan = Plan::new();
    for (name, spec) in models {
        let spec = spec.as_ref();
        let instances = of_model.get(name.as_str()).map_or(&[][..], Vec::as_slice);
        let mut evaluated = evaluate_backends(&protected, name, spec, instances, cfg, state);
        let mut spill = state.cluster_spill.remove(name);
        cluster::prefer_own(name, spec, cfg, &mut evaluated, &mut spill);
        if let Some(s) = spill {
            state.cluster_spill.insert(name.clone(), s);
        }
        let weights = table_weights(name, &evaluated, cfg, state);
        let prefix_ttl = spec.prefix_ttl.map(|cap| {
            let caches =
                evaluated.iter().filter(|(_, e)| e.explain.excluded_by.is_none()).filter_map(|(_, e)| e.cache_fill);
            fill_time_lifetime(caches, f64::from(spec.prefix_ttl_fill_milli) / 1000.0, cap)
        });
        let mut vips = spec.vips.clone();
        vips.sort_by_key(addr_key);
        plan.insert(
            name.clone(),
            ModelPlan {
                vips,
                available: !weights.emitted.is_empty(),
                weights_held: weights.held,
                backends: planned_backends(evaluated, &weights),
                affinity_ttl: spec.affinity_ttl,
                prefix: spec.prefix,
                prefix_ttl,
            },
        );
    }
    // Forget what is gone, so the state stays as large as the fleet.
    for backends in state.backends.values_mut() {
        backends.retain(|_, m| std::mem::take(&mut m.seen));
    }
    state.backends.retain(|_, b| !b.is_empty());
    state.last_weights.retain(|m, _| models.contains_key(m));
    state.cluster_spill.retain(|m, _| models.contains_key(m));
    plan
}

/// Evaluates each backend (address) of one model, in address order; duplicates (several
/// services or clusters listing one address) resolved by `instance_order`. Every backend
/// evaluated is marked `seen` in `state`. `protected`: the (model, service) pairs whose service
/// reached its protection threshold.
fn evaluate_backends(
    protected: &HashSet<(&str, &str)>,
    name: &str,
    spec: &ModelSpec,
    instances: &[&Instance],
    cfg: &PolicyConfig,
    state: &mut PolicyState,
) -> Vec<(SocketAddr, Evaluated)> {
    // One sort by address, duplicates of an address in `instance_order` (stable: equal
    // instances keep the registry's order), then each run of one address: no map and no
    // list per backend.
    let mut sorted: Vec<&Instance> = instances.to_vec();
    sorted.sort_by(|a, b| addr_key(&a.address).cmp(&addr_key(&b.address)).then_with(|| instance_order(a, b)));
    let mut evaluated = Vec::with_capacity(sorted.len());
    if sorted.is_empty() {
        return evaluated;
    }
    if !state.backends.contains_key(name) {
        state.backends.insert(name.to_string(), BTreeMap::new());
    }
    let memory = state.backends.get_mut(name).expect("inserted above");
    // The model's name, shared by its backends' `model: serves ..` lines.
    let shared: std::sync::Arc<str> = name.into();
    for dups in sorted.chunk_by(|a, b| addr_key(&a.address) == addr_key(&b.address)) {
        let inst = dups[0];
        let protection = protected.contains(&(name, inst.service.as_str()));
        let mem = memory.entry(inst.address).or_default();
        let mut ev = evaluate::evaluate(inst, &shared, spec, protection, cfg, mem);
        if let Some(f) = ev.free_memory_mb {
            mem.peak_free_mb = Some(mem.peak_free_mb.map_or(f, |p| p.max(f)));
        }
        ev.memory_capacity_mb = mem.peak_free_mb;
        if dups.len() > 1 {
            ev.explain.reasons.push(Reason::Text(format!(
                "listed {} times; using service {:?} group {:?} cluster {:?}",
                dups.len(),
                metadata::shorten(&inst.service),
                metadata::shorten(&inst.group),
                metadata::shorten(&inst.cluster)
            )));
        }
        log_change(name, inst.address, &ev.explain, mem);
        mem.seen = true;
        evaluated.push((inst.address, ev));
    }
    evaluated
}

/// One model's table weights: the candidate from this plan, and what is emitted.
struct TableWeights {
    /// Quantised composed weights of the eligible backends.
    candidate: BTreeMap<SocketAddr, u32>,
    /// The candidate, or the last table when the change is below `min_weight_change`.
    emitted: BTreeMap<SocketAddr, u32>,
    /// A change was suppressed (an unchanged candidate is simply emitted again).
    held: bool,
}

/// Table weights for the eligible backends, then the minimum-change rule; remembers what is
/// emitted in `state`.
fn table_weights(
    name: &str,
    evaluated: &[(SocketAddr, Evaluated)],
    cfg: &PolicyConfig,
    state: &mut PolicyState,
) -> TableWeights {
    let eligible: Vec<&(SocketAddr, Evaluated)> =
        evaluated.iter().filter(|(_, ev)| ev.explain.excluded_by.is_none()).collect();
    let composed: Vec<f64> = eligible.iter().map(|(_, ev)| ev.explain.composed).collect();
    let candidate: BTreeMap<SocketAddr, u32> =
        eligible.iter().map(|(a, _)| *a).zip(weights::quantise(&composed)).collect();
    let held = state
        .last_weights
        .get(name)
        .is_some_and(|last| *last != candidate && weights::within_min_change(last, &candidate, cfg.min_weight_change));
    let emitted = if held { state.last_weights[name].clone() } else { candidate.clone() };
    if emitted.is_empty() {
        state.last_weights.remove(name);
    } else {
        state.last_weights.insert(name.to_string(), emitted.clone());
    }
    TableWeights { candidate, emitted, held }
}

/// The evaluated backends with their table weights.
fn planned_backends(evaluated: Vec<(SocketAddr, Evaluated)>, w: &TableWeights) -> Vec<PlannedBackend> {
    evaluated
        .into_iter()
        .map(|(address, ev)| {
            let mut explain = ev.explain;
            let weight = w.emitted.get(&address).copied().unwrap_or(0);
            explain.candidate_weight = w.candidate.get(&address).copied().unwrap_or(0);
            explain.held = w.held && weight > 0;
            PlannedBackend {
                address,
                weight,
                cap: explain.cap,
                free_memory_mb: ev.free_memory_mb,
                memory_capacity_mb: ev.memory_capacity_mb,
                eligible: explain.excluded_by.is_none(),
                explain,
            }
        })
        .collect()
}

/// Logs a backend's exclusion or invalid metadata when it changes (not on every plan).
fn log_change(model: &str, backend: SocketAddr, e: &BackendExplain, mem: &mut BackendMemory) {
    let now = (e.excluded_by, e.invalid.iter().map(|f| f.key).collect::<Vec<_>>());
    if mem.logged.as_ref() == Some(&now) {
        return;
    }
    for f in &e.invalid {
        warn!(model, %backend, key = f.key, value = %f.value, reason = %f.reason, effect = f.effect, "invalid metadata");
    }
    match e.excluded_by {
        Some(rule) => {
            let detail = e.reasons.iter().map(Reason::text).find(|r| r.starts_with(rule.as_str())).unwrap_or_default();
            warn!(model, %backend, rule = rule.as_str(), detail = &*detail, "backend excluded");
        }
        None if mem.logged.as_ref().is_some_and(|(ex, _)| ex.is_some()) => {
            info!(model, %backend, "backend eligible again");
        }
        None => {}
    }
    mem.logged = Some(now);
}
