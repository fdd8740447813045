//! `Config` -> `ValidConfig`: every field checked, errors name the field and the value.

use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use ailb_common::{MAX_BACKENDS, MAX_MEMBERS, MAX_MODELS, MAX_MODEL_NAME_LEN, MAX_PROBES, MAX_SERVICES};

use super::{BackendConfig, BalancerConfig, Config, DaemonConfig, ModelConfig, SourceKind, DEFAULT_PREFIX_LOAD_FACTOR};
use crate::{
    datapath::{ArenaLimits, TcOptions, WriterSettings},
    discovery::{StaticBackend, ValidSource},
    policy::{ModelSpec, MAX_WEIGHT},
    telemetry::instance::{check_local_instance, InstanceConfig, ValidInstance},
    validate::{parse_duration, ConfigError},
};

#[derive(Debug, Clone, PartialEq)]
pub struct ValidConfig {
    pub bpffs: PathBuf,
    pub cgroup: String,
    /// `[balancer]`: what the writer puts in the kernel's settings, and the table seed.
    pub balancer: WriterSettings,
    /// The model catalog by name (model indices follow this order on a fresh start).
    pub models: BTreeMap<String, ValidModel>,
    /// The static source's backends (empty with Nacos).
    pub backends: Vec<StaticBackend>,
    pub source: ValidSource,
    /// HTTP endpoint (`/metrics`, `/v1/plan`).
    pub listen: Option<std::net::SocketAddr>,
    /// How often backends with live telemetry are sampled.
    pub sample_interval: Duration,
    /// The NVML library for backends with `gpus` (`None`: the loader's default).
    pub nvml_library: Option<PathBuf>,
    pub policy: crate::policy::PolicyConfig,
    /// The TC datapath for remote clients (off when it names no interface).
    pub tc: TcOptions,
    /// `[limits]`: the kernel's arena sizes.
    pub limits: ArenaLimits,
}

/// One model of the catalog: what the policy plans it with, and where discovery finds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidModel {
    pub spec: ModelSpec,
    /// The registry services that list the model's backends (at least one: default `[name]`);
    /// discovery reads them as `DiscoverySettings::catalog`. The config key, `nacos_services`,
    /// is named after the one registry source so far.
    pub nacos_services: Vec<String>,
    /// Remote clients keep their backend by client address (the TC datapath).
    pub remote_affinity: bool,
}

impl AsRef<ModelSpec> for ValidModel {
    fn as_ref(&self) -> &ModelSpec {
        &self.spec
    }
}

/// A VIP or backend address: `a.b.c.d:port` or `[ipv6]:port`, port not 0. An IPv6 address
/// with a zone (`%eth0`), the unspecified address and a multicast one are refused: a connect
/// could not be rewritten to (or from) them meaningfully.
fn parse_addr(field: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    let a = value.parse::<SocketAddr>().map_err(|e| {
        ConfigError::invalid(field, value, format!("expected IPv4 address:port or [IPv6 address]:port ({e})"))
    })?;
    if a.port() == 0 {
        return Err(ConfigError::invalid(field, value, "port 0 is not allowed"));
    }
    if let SocketAddr::V6(v6) = a {
        if v6.scope_id() != 0 {
            return Err(ConfigError::invalid(field, value, "an IPv6 zone (scope id) is not supported"));
        }
        if v6.ip().is_unspecified() || v6.ip().is_multicast() {
            return Err(ConfigError::invalid(field, value, "not a unicast IPv6 address"));
        }
        if v6.ip().to_ipv4_mapped().is_some() {
            return Err(ConfigError::invalid(field, value, "a v4-mapped address: write the IPv4 address itself"));
        }
    }
    Ok(a)
}

fn check_model_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_MODEL_NAME_LEN {
        return Err(ConfigError::invalid(field, name, format!("model names are 1 to {MAX_MODEL_NAME_LEN} bytes")));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(ConfigError::invalid(field, name, "control characters are not allowed"));
    }
    Ok(())
}

/// Records a VIP of a model; a VIP used twice (by any model) is refused.
fn add_vip(
    vips: &mut HashSet<SocketAddr>,
    field: String,
    value: &str,
    model: &mut ModelSpec,
) -> Result<(), ConfigError> {
    let vip = parse_addr(&field, value)?;
    if !vips.insert(vip) {
        return Err(ConfigError::invalid(field, value, "this VIP is used twice"));
    }
    model.vips.push(vip);
    Ok(())
}

/// `daemon.bpffs` and `daemon.cgroup` (`daemon.listen` is checked with the rest, later).
fn check_daemon_paths(d: &DaemonConfig) -> Result<(), ConfigError> {
    if !d.bpffs.is_absolute() || d.bpffs.as_os_str().is_empty() {
        return Err(ConfigError::invalid("daemon.bpffs", d.bpffs.display(), "must be an absolute path in bpffs"));
    }
    if d.cgroup.is_empty() || d.cgroup.split('/').any(|c| c == "..") {
        return Err(ConfigError::invalid("daemon.cgroup", &d.cgroup, "must be non-empty and must not contain `..`"));
    }
    Ok(())
}

/// A load bound factor c at `field`, checked, in thousandths.
fn factor_milli(field: &str, c: f64) -> Result<u32, ConfigError> {
    if !(c.is_finite() && c > 1.0 && c <= 10.0) {
        return Err(ConfigError::invalid(field, c, "must be in (1.0, 10.0]: c <= 1 leaves no room for the bound"));
    }
    Ok((c * 1000.0).round() as u32)
}

/// `[balancer]`, checked.
fn check_balancer(b: &BalancerConfig) -> Result<WriterSettings, ConfigError> {
    let load_factor_milli = factor_milli("balancer.load_factor", b.load_factor)?;
    let prefix_load_factor_milli = factor_milli(
        "balancer.prefix_load_factor",
        b.prefix_load_factor.unwrap_or(b.load_factor.max(DEFAULT_PREFIX_LOAD_FACTOR)),
    )?;
    if b.probes == 0 || b.probes > MAX_PROBES {
        return Err(ConfigError::invalid("balancer.probes", b.probes, format!("must be 1..={MAX_PROBES}")));
    }
    Ok(WriterSettings {
        load_factor_milli,
        prefix_load_factor_milli,
        probes: b.probes,
        affinity: b.affinity,
        load_bound: b.load_bound,
        round_robin: b.round_robin,
        affinity_ttl: parse_duration("balancer.affinity_ttl", &b.affinity_ttl)?,
        affinity_wait: parse_duration("balancer.affinity_wait", &b.affinity_wait)?,
        seed: b.seed,
    })
}

/// A model's `prefix`: "off" when absent.
fn check_prefix(field: &str, value: Option<&str>) -> Result<crate::policy::PrefixMode, ConfigError> {
    match value {
        None => Ok(crate::policy::PrefixMode::Off),
        Some(v) => crate::policy::PrefixMode::parse(v)
            .ok_or_else(|| ConfigError::invalid(field, v, "\"off\", \"approximate\" or \"precise\"")),
    }
}

/// A model's `prefix_ttl`: [`crate::policy::DEFAULT_PREFIX_TTL`] when absent, none for "0s".
fn check_prefix_ttl(field: &str, value: Option<&str>) -> Result<Option<std::time::Duration>, ConfigError> {
    let ttl = match value {
        None => crate::policy::DEFAULT_PREFIX_TTL,
        Some(v) => parse_duration(field, v)?,
    };
    Ok((!ttl.is_zero()).then_some(ttl))
}

/// A model's `prefix_ttl_fill` in thousandths: [`crate::policy::DEFAULT_PREFIX_TTL_FILL`] when
/// absent; 0 to [`crate::policy::MAX_PREFIX_TTL_FILL`].
fn check_prefix_ttl_fill(field: &str, value: Option<f64>) -> Result<u32, ConfigError> {
    let v = value.unwrap_or(crate::policy::DEFAULT_PREFIX_TTL_FILL);
    if !(v.is_finite() && (0.0..=crate::policy::MAX_PREFIX_TTL_FILL).contains(&v)) {
        let max = crate::policy::MAX_PREFIX_TTL_FILL;
        return Err(ConfigError::invalid(
            field,
            v,
            format!("a factor from 0 (the lifetime fixed at prefix_ttl) to {max}"),
        ));
    }
    Ok((v * 1000.0).round() as u32)
}

/// `models[i]`, with its VIPs recorded in `vips`.
fn check_model(i: usize, m: &ModelConfig, vips: &mut HashSet<SocketAddr>) -> Result<ValidModel, ConfigError> {
    let field = |f: &str| format!("models[{i}].{f}");
    let mut vm = ValidModel {
        spec: ModelSpec {
            required_memory_mb: m.required_memory_mb,
            model_version: m.model_version.clone(),
            affinity_ttl: m.affinity_ttl.as_deref().map(|t| parse_duration(&field("affinity_ttl"), t)).transpose()?,
            backend_capacity: check_capacity(&field("backend_capacity"), m.backend_capacity)?,
            spill_saturation_milli: check_spill(&field("spill_saturation"), m.spill_saturation)?,
            prefix: check_prefix(&field("prefix"), m.prefix.as_deref())?,
            prefix_ttl: check_prefix_ttl(&field("prefix_ttl"), m.prefix_ttl.as_deref())?,
            prefix_ttl_fill_milli: check_prefix_ttl_fill(&field("prefix_ttl_fill"), m.prefix_ttl_fill)?,
            ..Default::default()
        },
        nacos_services: if m.nacos_services.is_empty() { vec![m.name.clone()] } else { m.nacos_services.clone() },
        remote_affinity: super::tc::remote_affinity(field("remote_affinity"), m.remote_affinity.as_deref())?,
    };
    for (j, v) in m.vips.iter().enumerate() {
        add_vip(vips, format!("models[{i}].vips[{j}]"), v, &mut vm.spec)?;
    }
    for (j, svc) in vm.nacos_services.iter().enumerate() {
        if svc.is_empty() || svc.len() > 512 || svc.chars().any(|c| c.is_control() || c == '@') {
            return Err(ConfigError::invalid(
                format!("models[{i}].nacos_services[{j}]"),
                svc,
                "not a valid Nacos service name",
            ));
        }
    }
    Ok(vm)
}

fn check_capacity(field: &str, c: Option<u32>) -> Result<Option<u32>, ConfigError> {
    match c {
        Some(c) if c == 0 || c > 1_000_000 => Err(ConfigError::invalid(field, c, "must be 1..=1000000 requests")),
        c => Ok(c),
    }
}

fn check_spill(field: &str, s: Option<f64>) -> Result<Option<u32>, ConfigError> {
    match s {
        Some(s) if !(s.is_finite() && s > 0.0 && s <= 10.0) => {
            Err(ConfigError::invalid(field, s, "must be in (0, 10] (load over capacity)"))
        }
        s => Ok(s.map(|s| (s * 1000.0).round().max(1.0) as u32)),
    }
}

/// `daemon.cluster` or `backends[i].cluster`: a Nacos cluster name.
fn check_cluster(field: &str, c: &Option<String>) -> Result<(), ConfigError> {
    match c {
        Some(c) if c.trim().is_empty() || c.len() > 256 || c.chars().any(|ch| ch.is_control() || ch == ',') => {
            Err(ConfigError::invalid(field, c, "a cluster name: 1 to 256 bytes, no control characters, no ','"))
        }
        _ => Ok(()),
    }
}

/// The catalog's size limits, and a VIP for every model.
fn check_catalog_size(models: &BTreeMap<String, ValidModel>) -> Result<(), ConfigError> {
    if models.is_empty() {
        return Err(ConfigError::invalid(
            "models",
            "[]",
            "at least one model with a VIP is needed ([[models]] or [[services]])",
        ));
    }
    if models.len() > MAX_MODELS as usize {
        return Err(ConfigError::invalid("models", models.len(), format!("at most {MAX_MODELS} models")));
    }
    let n_vips: usize = models.values().map(|m| m.spec.vips.len()).sum();
    if n_vips > MAX_SERVICES as usize {
        return Err(ConfigError::invalid("models", n_vips, format!("at most {MAX_SERVICES} VIPs in all")));
    }
    for (name, m) in models {
        if m.spec.vips.is_empty() {
            return Err(ConfigError::invalid("models", name, "this model has no VIP (models[].vips or [[services]])"));
        }
    }
    Ok(())
}

/// `backends[i]`; `seen` holds the (model, address) pairs before it.
fn check_backend(
    i: usize,
    c: &BackendConfig,
    models: &BTreeMap<String, ValidModel>,
    vips: &HashSet<SocketAddr>,
    seen: &mut HashSet<(String, SocketAddr)>,
) -> Result<StaticBackend, ConfigError> {
    let field = |f: &str| format!("backends[{i}].{f}");
    check_model_name(&field("model"), &c.model)?;
    if !models.contains_key(&c.model) {
        return Err(ConfigError::invalid(field("model"), &c.model, "no service (VIP) is configured for this model"));
    }
    let address = parse_addr(&field("address"), &c.address)?;
    if vips.contains(&address) {
        return Err(ConfigError::invalid(field("address"), &c.address, "a backend cannot be a VIP"));
    }
    if !seen.insert((c.model.clone(), address)) {
        return Err(ConfigError::invalid(field("address"), &c.address, "this backend is listed twice for the model"));
    }
    if c.weight > MAX_WEIGHT {
        return Err(ConfigError::invalid(field("weight"), c.weight, format!("must be 0..={MAX_WEIGHT}")));
    }
    if c.free_memory_mb == Some(u32::MAX) {
        return Err(ConfigError::invalid(field("free_memory_mb"), u32::MAX, "reserved for 'unknown': omit the field"));
    }
    Ok(StaticBackend {
        model: c.model.clone(),
        address,
        weight: c.weight,
        gpu_type: c.gpu_type.clone(),
        free_memory_mb: c.free_memory_mb,
        max_inflight: c.max_inflight,
        healthy: c.healthy,
        cluster: {
            check_cluster(&field("cluster"), &c.cluster)?;
            c.cluster.clone().unwrap_or_default()
        },
        telemetry: local_telemetry(i, c, address)?,
        kv_events: kv_events(i, c)?,
    })
}

/// `backends[i]`'s KV-event publisher: `kv_events` with `kv_block_size`, `kv_replay` optional.
fn kv_events(i: usize, c: &BackendConfig) -> Result<Option<crate::kv_events::EventSource>, ConfigError> {
    let field = |f: &str| format!("backends[{i}].{f}");
    let Some(endpoint) = &c.kv_events else {
        for (name, set) in [("kv_replay", c.kv_replay.is_some()), ("kv_block_size", c.kv_block_size.is_some())] {
            if set {
                return Err(ConfigError::invalid(field(name), "set", "only with kv_events (the engine's publisher)"));
            }
        }
        return Ok(None);
    };
    crate::kv_events::feed::check_source(endpoint, c.kv_replay.as_deref(), c.kv_block_size.map(u64::from))
        .map(Some)
        .map_err(|(name, value, reason)| ConfigError::invalid(field(name), value, reason))
}

/// `backends[i]`'s live telemetry (`metrics_url` and the keys that go with it), checked as the
/// agent checks an `[[instances]]` entry; `None` without `metrics_url`.
fn local_telemetry(
    i: usize,
    c: &BackendConfig,
    address: SocketAddr,
) -> Result<Option<Box<ValidInstance>>, ConfigError> {
    let field = |f: &str| format!("backends[{i}].{f}");
    let Some(url) = &c.metrics_url else {
        let stray = [
            ("health_url", c.health_url.is_some()),
            ("gpus", !c.gpus.is_empty()),
            ("server", c.server.is_some()),
            ("kv_bytes_per_token", c.kv_bytes_per_token.is_some()),
            ("metrics", c.metrics.is_some()),
        ];
        if let Some((k, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                field(k),
                "set",
                "live telemetry needs metrics_url (the backend's model server metrics)",
            ));
        }
        return Ok(None);
    };
    if let Some(m) = c.free_memory_mb {
        return Err(ConfigError::invalid(
            field("free_memory_mb"),
            m,
            "a backend with metrics_url reports its free memory in samples; remove the declared value",
        ));
    }
    // The agent's sampler (and its Nacos registration) knows IPv4 instances only.
    let SocketAddr::V4(v4) = address else {
        return Err(ConfigError::invalid(
            field("address"),
            address,
            "a backend sampled on this node (metrics_url) must have an IPv4 address",
        ));
    };
    let inst = InstanceConfig {
        service: c.model.clone(),
        ip: *v4.ip(),
        port: address.port(),
        cluster: "DEFAULT".to_string(),
        weight: 1.0,
        model_id: c.model.clone(),
        model_version: None,
        gpu_type: c.gpu_type.clone(),
        max_inflight: (c.max_inflight > 0).then_some(c.max_inflight),
        supported_tasks: Vec::new(),
        gpus: c.gpus.clone(),
        metrics_url: url.clone(),
        health_url: c.health_url.clone(),
        server: c.server.unwrap_or_default(),
        nvml: !c.gpus.is_empty(),
        kv_bytes_per_token: c.kv_bytes_per_token,
        metrics: c.metrics.clone(),
        // The backend's publisher is declared with the backend (`kv_events`), not sampled.
        kv_events: None,
        kv_replay: None,
        kv_block_size: None,
    };
    check_local_instance(&format!("backends[{i}]"), &inst).map(|v| Some(Box::new(v)))
}

impl Config {
    pub fn validate(&self) -> Result<ValidConfig, ConfigError> {
        let d = &self.daemon;
        check_daemon_paths(d)?;
        let balancer = check_balancer(&self.balancer)?;
        let models = self.catalog()?;
        let source = self.source()?;
        let listen = d
            .listen
            .as_deref()
            .map(|l| {
                l.parse::<SocketAddr>()
                    .map_err(|e| ConfigError::invalid("daemon.listen", l, format!("expected ip:port ({e})")))
            })
            .transpose()?;
        self.policy.validate()?;
        check_cluster("daemon.cluster", &d.cluster)?;
        let policy = crate::policy::PolicyConfig { own_cluster: d.cluster.clone(), ..self.policy.clone() };
        let backends = self.static_backends(&models)?;
        let sample_interval = parse_duration("daemon.sample_interval", &d.sample_interval)?;
        if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&sample_interval) {
            return Err(ConfigError::invalid("daemon.sample_interval", &d.sample_interval, "must be 50ms to 60s"));
        }
        let tc = super::tc::validate(&d.interfaces, &d.tc)?;
        let mut per_model: BTreeMap<&str, usize> = BTreeMap::new();
        for b in &backends {
            *per_model.entry(b.model.as_str()).or_default() += 1;
        }
        let members: Vec<usize> =
            models.keys().map(|name| per_model.get(name.as_str()).copied().unwrap_or(0)).collect();
        let limits = self.limits.validate(&members)?;
        Ok(ValidConfig {
            bpffs: d.bpffs.clone(),
            cgroup: d.cgroup.clone(),
            balancer,
            models,
            backends,
            source,
            listen,
            sample_interval,
            nvml_library: d.nvml_library.clone(),
            policy,
            tc,
            limits,
        })
    }

    /// The catalog: `[[models]]`, then VIPs from `[[services]]`.
    fn catalog(&self) -> Result<BTreeMap<String, ValidModel>, ConfigError> {
        let mut models: BTreeMap<String, ValidModel> = BTreeMap::new();
        let mut vips = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            check_model_name(&format!("models[{i}].name"), &m.name)?;
            if models.contains_key(&m.name) {
                return Err(ConfigError::invalid(format!("models[{i}].name"), &m.name, "this model is listed twice"));
            }
            let vm = check_model(i, m, &mut vips)?;
            models.insert(m.name.clone(), vm);
        }
        for (i, s) in self.services.iter().enumerate() {
            check_model_name(&format!("services[{i}].model"), &s.model)?;
            let model = models
                .entry(s.model.clone())
                .or_insert_with(|| ValidModel { nacos_services: vec![s.model.clone()], ..Default::default() });
            add_vip(&mut vips, format!("services[{i}].vip"), &s.vip, &mut model.spec)?;
        }
        check_catalog_size(&models)?;
        Ok(models)
    }

    /// `[discovery]`: the static `[[backends]]` or `[discovery.nacos]`, never both.
    fn source(&self) -> Result<ValidSource, ConfigError> {
        match self.discovery.source {
            SourceKind::Static => {
                if self.discovery.nacos.is_some() && !self.backends.is_empty() {
                    // Both given: say which one is used rather than guess.
                    return Err(ConfigError::invalid(
                        "discovery.source",
                        "static",
                        "[discovery.nacos] is set but the source is static; set source = \"nacos\" or remove it",
                    ));
                }
                Ok(ValidSource::Static)
            }
            SourceKind::Nacos => {
                if !self.backends.is_empty() {
                    return Err(ConfigError::invalid(
                        "backends",
                        self.backends.len(),
                        "static [[backends]] are not used with discovery.source = \"nacos\"; remove them",
                    ));
                }
                let Some(n) = &self.discovery.nacos else {
                    return Err(ConfigError::invalid(
                        "discovery.nacos",
                        "absent",
                        "source = \"nacos\" needs a [discovery.nacos] table",
                    ));
                };
                Ok(ValidSource::Nacos(Box::new(n.validate()?)))
            }
        }
    }

    /// The static source's `[[backends]]`, within the per-model and total limits.
    fn static_backends(&self, models: &BTreeMap<String, ValidModel>) -> Result<Vec<StaticBackend>, ConfigError> {
        let vips: HashSet<SocketAddr> = models.values().flat_map(|m| m.spec.vips.iter().copied()).collect();
        let mut backends = Vec::with_capacity(self.backends.len());
        let mut seen = HashSet::new();
        let mut per_model: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, c) in self.backends.iter().enumerate() {
            let backend = check_backend(i, c, models, &vips, &mut seen)?;
            let n = per_model.entry(c.model.as_str()).or_default();
            *n += 1;
            if *n > MAX_MEMBERS as usize {
                return Err(ConfigError::invalid(
                    format!("backends[{i}].model"),
                    &c.model,
                    format!("at most {MAX_MEMBERS} backends per model"),
                ));
            }
            backends.push(backend);
        }
        if backends.len() > MAX_BACKENDS as usize / 2 {
            // Half the id space stays free for backends removed while connections still use them.
            return Err(ConfigError::invalid("backends", backends.len(), format!("at most {}", MAX_BACKENDS / 2)));
        }
        Ok(backends)
    }
}

#[cfg(test)]
mod tests;
