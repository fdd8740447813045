//! One backend through the chain: model affinity -> resource match -> health -> registry
//! weight x GPU capability x load x GPU utilisation, one function per step. Every decision
//! leaves a line.

use std::{fmt::Display, sync::Arc};

use super::{
    config::PolicyConfig,
    explain::{num, BackendExplain, Exclusion, LoadExplain, MemoryExplain, Reason, UtilExplain},
    factors::{load_factor, smooth, UtilBand},
    weights::MAX_WEIGHT,
    BackendMemory, ModelSpec,
};
use crate::discovery::Instance;
use crate::metadata::{
    keys, shorten,
    signals::{self, CURRENT_REQUESTS, GPU_UTIL, QUEUE_LENGTH},
    Field, HealthStatus, InvalidField, Metadata,
};

/// Smallest registry weight ailb resolves (the table holds 3 significant digits); below it,
/// drain with 0. Largest: [`MAX_WEIGHT`], the static source's limit and above
/// Nacos' own (10000).
pub const MIN_REGISTRY_WEIGHT: f64 = 0.001;

/// The outcome for one backend before quantisation.
pub(super) struct Evaluated {
    pub(super) explain: BackendExplain,
    pub(super) free_memory_mb: Option<u32>,
    /// Set by the caller from the backend's history ([`super::PlannedBackend::memory_capacity_mb`]).
    pub(super) memory_capacity_mb: Option<u32>,
    /// The instance's cluster (Nacos `clusterName`, a static backend's `cluster`).
    pub(super) cluster: String,
    /// Its KV cache's capacity in tokens and the prompt tokens per second it is sent, when it
    /// reports both (the prefix lifetime's inputs).
    pub(super) cache_fill: Option<(f64, f64)>,
}

#[derive(Default)]
struct Notes {
    reasons: Vec<Reason>,
    invalid: Vec<InvalidField>,
    excluded_by: Option<Exclusion>,
}

impl Notes {
    fn line(&mut self, s: impl Into<String>) {
        self.reasons.push(Reason::Text(s.into()));
    }
    fn reason(&mut self, r: Reason) {
        self.reasons.push(r);
    }
    fn exclude(&mut self, e: Exclusion, detail: impl Display) {
        self.reasons.push(Reason::Text(format!("{}: {detail}", e.as_str())));
        self.excluded_by.get_or_insert(e);
    }
    /// An invalid value; `excluded_by` set: it excludes the backend, else it is ignored.
    fn invalid(&mut self, key: &'static str, raw: &str, reason: &str, excluded_by: Option<Exclusion>) {
        let effect = if excluded_by.is_some() { "excluded" } else { "ignored" };
        self.invalid.push(InvalidField { key, value: raw.to_string(), reason: reason.to_string(), effect });
        match excluded_by {
            Some(e) => self.exclude(e, format!("{key}={raw:?} {reason}")),
            None => self.line(format!("{key}={raw:?} ignored: {reason}")),
        }
    }
}

/// `model`: the model's name, shared by its backends' explanations.
pub(super) fn evaluate(
    inst: &Instance,
    model: &Arc<str>,
    spec: &ModelSpec,
    protection_threshold: bool,
    cfg: &PolicyConfig,
    mem: &mut BackendMemory,
) -> Evaluated {
    let md = inst.metadata.contract();
    let mut n = Notes::default();
    // The steps in the order of the chain; each leaves its lines in `n`.
    model_affinity(&mut n, md, inst, model, spec);
    let fits = resource_match(&mut n, md, inst, spec);
    health(&mut n, md, inst, protection_threshold);
    let w = inst.weight;
    registry_weight(&mut n, w);
    let gpu_capability = gpu_capability(&mut n, md, cfg);
    let load = load(&mut n, md, gpu_capability, cfg);
    let util = utilisation(&mut n, md, inst, cfg, mem);
    let cap = cap(&mut n, md);
    informational(&mut n, md);

    let composed = if n.excluded_by.is_none() { w * gpu_capability * load.factor * util.factor } else { 0.0 };
    Evaluated {
        explain: BackendExplain {
            service: shorten(&inst.service),
            gpu_type: md.gpu_type.valid().cloned(),
            registry_weight: w.is_finite().then_some(w),
            protection_threshold,
            gpu_capability,
            load,
            util,
            memory: MemoryExplain {
                free_mb: md.free_memory_mb.valid().copied(),
                key: md.free_memory_key,
                required_mb: spec.required_memory_mb,
                fits,
            },
            composed,
            candidate_weight: 0,
            held: false,
            cap,
            invalid: n.invalid,
            reasons: n.reasons,
            excluded_by: n.excluded_by,
        },
        free_memory_mb: md.free_memory_mb.valid().copied(),
        memory_capacity_mb: None,
        cluster: inst.cluster.clone(),
        cache_fill: md
            .signal(&signals::KV_CACHE_CAPACITY_TOKENS)
            .valid()
            .copied()
            .zip(md.signal(&signals::PROMPT_TOKENS_PER_S).valid().copied()),
    }
}

/// Step 1, model affinity: `model_id` / `supported_models` must name the model (none: trusted from
/// the registry service); a pinned `model_version` must match.
fn model_affinity(n: &mut Notes, md: &Metadata, inst: &Instance, shared: &Arc<str>, spec: &ModelSpec) {
    let model: &str = shared;
    let mut claims: Vec<&str> = Vec::new();
    let mut claim_invalid = false;
    match &md.model_id {
        Field::Valid(id) => claims.push(id),
        Field::Invalid { raw, reason } => {
            n.invalid(keys::MODEL_ID, raw, reason, Some(Exclusion::ModelId));
            claim_invalid = true;
        }
        Field::Absent => {}
    }
    match &md.supported_models {
        Field::Valid(list) => claims.extend(list.iter().map(String::as_str)),
        Field::Invalid { raw, reason } => {
            n.invalid(keys::SUPPORTED_MODELS, raw, reason, Some(Exclusion::ModelId));
            claim_invalid = true;
        }
        Field::Absent => {}
    }
    if !claim_invalid {
        if claims.is_empty() {
            n.line(format!("model: no model_id; trusted from registry service {:?}", shorten(&inst.service)));
        } else if claims.contains(&model) {
            n.reason(Reason::Serves(shared.clone()));
        } else {
            let shown: Vec<String> = claims.iter().take(8).map(|c| shorten(c)).collect();
            n.exclude(Exclusion::ModelId, format!("model_id/supported_models {shown:?} do not include {model:?}"));
        }
    }
    if let Some(want) = &spec.model_version {
        match &md.model_version {
            Field::Valid(v) if v == want => n.line(format!("model_version: {v:?} as pinned")),
            Field::Valid(v) => n.exclude(Exclusion::ModelVersion, format!("model_version={v:?} is not {want:?}")),
            Field::Absent => {
                n.exclude(Exclusion::ModelVersion, format!("model_version absent; the catalog pins {want:?}"))
            }
            Field::Invalid { raw, reason } => {
                n.invalid(keys::MODEL_VERSION, raw, reason, Some(Exclusion::ModelVersion))
            }
        }
    } else if let Field::Invalid { raw, reason } = &md.model_version {
        n.invalid(keys::MODEL_VERSION, raw, reason, None);
    }
}

/// Step 2, resource match: free memory against the model's `required_memory_mb`. Returns whether
/// it fits (`None`: not checked).
fn resource_match(n: &mut Notes, md: &Metadata, inst: &Instance, spec: &ModelSpec) -> Option<bool> {
    let key = md.free_memory_key;
    let raw_mem = inst.metadata.get(key).map_or(String::new(), |r| shorten(r));
    let mut fits = None;
    match (spec.required_memory_mb, &md.free_memory_mb) {
        (Some(req), Field::Valid(free)) => {
            fits = Some(*free >= req);
            if *free >= req {
                n.line(format!("memory: {free} MB free ({key}={raw_mem:?}) >= {req} MB required"));
            } else {
                n.exclude(Exclusion::Memory, format!("{free} MB free ({key}={raw_mem:?}) < {req} MB required"));
            }
        }
        (Some(req), Field::Invalid { raw, reason }) => {
            n.invalid(key, raw, &format!("{reason}; cannot prove that {req} MB fit"), Some(Exclusion::MemoryInvalid))
        }
        (Some(req), Field::Absent) => {
            n.line(format!("memory: free memory not reported; {req} MB not checked (unknown fits, as in the kernel)"))
        }
        (None, Field::Valid(free)) => n.line(format!("memory: {free} MB free, no requirement")),
        (None, Field::Invalid { raw, reason }) => n.invalid(key, raw, &format!("{reason}; free memory unknown"), None),
        (None, Field::Absent) => {}
    }
    fits
}

/// Step 3, health: the registry's `enabled` and `healthy`, the agent's `health_status`.
fn health(n: &mut Notes, md: &Metadata, inst: &Instance, protection_threshold: bool) {
    if !inst.enabled {
        n.exclude(Exclusion::RegistryDisabled, "nacos enabled=false");
    }
    if !inst.healthy {
        n.exclude(Exclusion::RegistryUnhealthy, "nacos healthy=false");
    }
    if protection_threshold {
        n.line(format!(
            "nacos: service {:?} reached its protection threshold: it returns every instance and may report \
             unhealthy ones as healthy; only health_status can tell",
            shorten(&inst.service)
        ));
    }
    match &md.health_status {
        Field::Valid(HealthStatus::Healthy) => n.reason(Reason::Fixed("health_status: healthy")),
        Field::Valid(HealthStatus::Draining) => n.exclude(Exclusion::HealthStatus, "health_status=\"draining\""),
        Field::Valid(HealthStatus::NotHealthy) => {
            let raw = inst.metadata.get(keys::HEALTH_STATUS).map_or(String::new(), |r| shorten(r.trim()));
            n.exclude(Exclusion::HealthStatus, format!("health_status={raw:?} is not healthy"))
        }
        Field::Invalid { raw, reason } => n.invalid(keys::HEALTH_STATUS, raw, reason, Some(Exclusion::HealthStatus)),
        Field::Absent => {}
    }
}

/// Step 4, registry weight: 0 or below drains; NaN or outside the table's range excludes.
fn registry_weight(n: &mut Notes, w: f64) {
    if w.is_nan() {
        n.exclude(Exclusion::RegistryWeight, "nacos weight is NaN");
    } else if w <= 0.0 {
        n.exclude(Exclusion::Drained, format!("nacos weight {} (drained)", num(w)));
    } else if !(MIN_REGISTRY_WEIGHT..=f64::from(MAX_WEIGHT)).contains(&w) {
        n.exclude(Exclusion::RegistryWeight, format!("nacos weight {w} is outside [0.001, 65535]"));
    }
}

/// Step 5, GPU capability from `[policy.gpu_capability]`; unknown or invalid `gpu_type`: 1.
fn gpu_capability(n: &mut Notes, md: &Metadata, cfg: &PolicyConfig) -> f64 {
    match &md.gpu_type {
        Field::Valid(g) => cfg.capability(g).unwrap_or_else(|| {
            if !cfg.gpu_capability.is_empty() {
                n.line(format!("gpu_type {:?} is not in [policy.gpu_capability]: capability 1", shorten(g)));
            }
            1.0
        }),
        Field::Invalid { raw, reason } => {
            n.invalid(keys::GPU_TYPE, raw, reason, None);
            1.0
        }
        Field::Absent => 1.0,
    }
}

/// Step 6, load: running and queued requests against the GPU's capability.
fn load(n: &mut Notes, md: &Metadata, gpu_capability: f64, cfg: &PolicyConfig) -> LoadExplain {
    let mut count = |key: &'static str, f: &Field<f64>| match f {
        Field::Valid(v) => Some(*v),
        Field::Invalid { raw, reason } => {
            n.invalid(key, raw, &format!("{reason}; counted as 0"), None);
            None
        }
        Field::Absent => None,
    };
    let current_requests = count(CURRENT_REQUESTS.key, md.signal(&CURRENT_REQUESTS));
    let queue_length = count(QUEUE_LENGTH.key, md.signal(&QUEUE_LENGTH));
    LoadExplain {
        current_requests,
        queue_length,
        factor: if cfg.load_factor {
            load_factor(current_requests.unwrap_or(0.0), queue_length.unwrap_or(0.0), gpu_capability, cfg)
        } else {
            1.0
        },
    }
}

/// Step 7, GPU utilisation: a new report of `inst` (see [`report_id`], hashed only when it
/// carries a utilisation) moves the EWMA; the same report seen again (identical metadata,
/// `updated_at_ms` included) is not a new sample, so re-planning unchanged inputs changes nothing.
fn utilisation(
    n: &mut Notes,
    md: &Metadata,
    inst: &Instance,
    cfg: &PolicyConfig,
    mem: &mut BackendMemory,
) -> UtilExplain {
    let sample = match md.signal(&GPU_UTIL) {
        Field::Valid(u) => Some(*u),
        Field::Invalid { raw, reason } => {
            n.invalid(GPU_UTIL.key, raw, &format!("{reason}; utilisation factor 1"), None);
            None
        }
        Field::Absent => None,
    };
    match sample {
        Some(u) => {
            let report = report_id(inst);
            if mem.last_report != Some(report) {
                let s = smooth(mem.util_ewma, u, cfg.util_smoothing);
                mem.band = match mem.util_ewma {
                    Some(_) => mem.band.next(s, cfg),
                    None => UtilBand::initial(s, cfg),
                };
                mem.util_ewma = Some(s);
                mem.last_report = Some(report);
            }
            UtilExplain { sample: Some(u), smoothed: mem.util_ewma, band: mem.band, factor: mem.band.factor(cfg) }
        }
        None => UtilExplain { sample: None, smoothed: None, band: UtilBand::Neutral, factor: 1.0 },
    }
}

/// Step 8, the in-flight cap (`max_inflight`; invalid: no cap).
fn cap(n: &mut Notes, md: &Metadata) -> u32 {
    match &md.max_inflight {
        Field::Valid(c) => *c,
        Field::Invalid { raw, reason } => {
            n.invalid(keys::MAX_INFLIGHT, raw, &format!("{reason}; no cap"), None);
            0
        }
        Field::Absent => 0,
    }
}

/// What is only shown: one `info:` line, and the invalid values of these keys (ignored).
fn informational(n: &mut Notes, md: &Metadata) {
    let mut agent = Vec::new();
    if let Field::Valid(v) = &md.agent_version {
        agent.push(format!("agent {:?}", shorten(v)));
    }
    if let Some(t) = md.updated_at_ms.valid() {
        agent.push(format!("updated_at_ms {t}"));
    }
    let shown = || signals::ALL.into_iter().filter(|s| s.role.shown());
    for s in shown() {
        if let Field::Valid(v) = md.signal(s) {
            agent.push(format!("{} {}", s.key, num(*v)));
        }
    }
    if let Field::Valid(t) = &md.gpu_memory_total_mb {
        agent.push(format!("gpu_memory_total_mb {t}"));
    }
    if let Field::Valid(t) = &md.supported_tasks {
        let shown: Vec<String> = t.iter().take(8).map(|s| shorten(s)).collect();
        agent.push(format!("supported_tasks {}", shown.join(",")));
    }
    if !agent.is_empty() {
        n.line(format!("info: {}", agent.join(", ")));
    }
    let informational: Vec<(&'static str, Option<(&String, &String)>)> =
        [(keys::AGENT_VERSION, invalid_of(&md.agent_version)), (keys::UPDATED_AT_MS, invalid_of(&md.updated_at_ms))]
            .into_iter()
            .chain(shown().map(|s| (s.key, invalid_of(md.signal(s)))))
            .chain([
                (keys::GPU_MEMORY_TOTAL_MB, invalid_of(&md.gpu_memory_total_mb)),
                (keys::SUPPORTED_TASKS, invalid_of(&md.supported_tasks)),
            ])
            .collect();
    for (key, bad) in informational {
        if let Some((raw, reason)) = bad {
            n.invalid(key, raw, reason, None);
        }
    }
}

/// Identifies one report of an instance: a hash of its whole metadata map (std's SipHash
/// with fixed keys: deterministic). A collision only skips one sample.
fn report_id(inst: &Instance) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    inst.metadata.hash(&mut h);
    h.finish()
}

fn invalid_of<T>(f: &Field<T>) -> Option<(&String, &String)> {
    match f {
        Field::Invalid { raw, reason } => Some((raw, reason)),
        _ => None,
    }
}
