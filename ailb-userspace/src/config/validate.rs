//! `Config` -> `ValidConfig`: every field checked, errors name the field and the value.

use std::{
    collections::{BTreeMap, HashSet},
    net::{SocketAddr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use ailb_common::{MAX_BACKENDS, MAX_MEMBERS, MAX_MODELS, MAX_MODEL_NAME_LEN, MAX_PROBES, MAX_SERVICES};

use super::{Config, ConfigError};

/// Largest accepted backend weight (keeps the kernel's load-bound arithmetic in u64).
pub const MAX_WEIGHT: u32 = 65_535;

#[derive(Debug, Clone, PartialEq)]
pub struct ValidConfig {
    pub bpffs: PathBuf,
    pub cgroup: String,
    pub load_factor_milli: u32,
    pub probes: u32,
    pub affinity: bool,
    pub load_bound: bool,
    pub round_robin: bool,
    pub affinity_ttl: Duration,
    pub affinity_wait: Duration,
    pub seed: u64,
    /// The model catalog by name (model indices follow this order on a fresh start).
    pub models: BTreeMap<String, ValidModel>,
    /// The static source's backends (empty with Nacos).
    pub backends: Vec<ValidBackend>,
    pub source: ValidSource,
    /// HTTP endpoint (`/metrics`, `/v1/plan`).
    pub listen: Option<std::net::SocketAddr>,
    pub policy: crate::policy::PolicyConfig,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidModel {
    pub vips: Vec<SocketAddrV4>,
    pub required_memory_mb: Option<u32>,
    pub model_version: Option<String>,
    pub affinity_ttl: Option<Duration>,
    /// Nacos services that serve the model (at least one: default `[name]`).
    pub nacos_services: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ValidSource {
    Static,
    Nacos(Box<crate::nacos::ValidNacos>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidBackend {
    pub model: String,
    pub address: SocketAddrV4,
    pub weight: u32,
    pub gpu_type: Option<String>,
    pub free_memory_mb: Option<u32>,
    pub max_inflight: u32,
    pub healthy: bool,
}

fn parse_v4(field: &str, value: &str) -> Result<SocketAddrV4, ConfigError> {
    match value.parse::<SocketAddr>() {
        Ok(SocketAddr::V4(a)) if a.port() != 0 => Ok(a),
        Ok(SocketAddr::V4(_)) => Err(ConfigError::invalid(field, value, "port 0 is not allowed")),
        Ok(SocketAddr::V6(_)) => Err(ConfigError::invalid(field, value, "IPv6 is not supported yet (connect4 only)")),
        Err(e) => Err(ConfigError::invalid(field, value, format!("expected IPv4 address:port ({e})"))),
    }
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

impl Config {
    pub fn validate(&self) -> Result<ValidConfig, ConfigError> {
        let d = &self.daemon;
        if !d.bpffs.is_absolute() || d.bpffs.as_os_str().is_empty() {
            return Err(ConfigError::invalid("daemon.bpffs", d.bpffs.display(), "must be an absolute path in bpffs"));
        }
        if d.cgroup.is_empty() || d.cgroup.split('/').any(|c| c == "..") {
            return Err(ConfigError::invalid(
                "daemon.cgroup",
                &d.cgroup,
                "must be non-empty and must not contain `..`",
            ));
        }
        let b = &self.balancer;
        if !(b.load_factor.is_finite() && b.load_factor > 1.0 && b.load_factor <= 10.0) {
            return Err(ConfigError::invalid(
                "balancer.load_factor",
                b.load_factor,
                "must be in (1.0, 10.0]: c <= 1 leaves no room for the bound",
            ));
        }
        if b.probes == 0 || b.probes > MAX_PROBES {
            return Err(ConfigError::invalid("balancer.probes", b.probes, format!("must be 1..={MAX_PROBES}")));
        }
        let affinity_ttl = super::parse_duration("balancer.affinity_ttl", &b.affinity_ttl)?;
        let affinity_wait = super::parse_duration("balancer.affinity_wait", &b.affinity_wait)?;

        // The catalog: [[models]], then VIPs from [[services]].
        let mut models: BTreeMap<String, ValidModel> = BTreeMap::new();
        let mut vips = HashSet::new();
        let mut add_vip = |field: String, value: &str, model: &mut ValidModel| -> Result<(), ConfigError> {
            let vip = parse_v4(&field, value)?;
            if !vips.insert(vip) {
                return Err(ConfigError::invalid(field, value, "this VIP is used twice"));
            }
            model.vips.push(vip);
            Ok(())
        };
        for (i, m) in self.models.iter().enumerate() {
            let field = |f: &str| format!("models[{i}].{f}");
            check_model_name(&field("name"), &m.name)?;
            if models.contains_key(&m.name) {
                return Err(ConfigError::invalid(field("name"), &m.name, "this model is listed twice"));
            }
            let mut vm = ValidModel {
                required_memory_mb: m.required_memory_mb,
                model_version: m.model_version.clone(),
                affinity_ttl: m
                    .affinity_ttl
                    .as_deref()
                    .map(|t| super::parse_duration(&field("affinity_ttl"), t))
                    .transpose()?,
                nacos_services: if m.nacos_services.is_empty() {
                    vec![m.name.clone()]
                } else {
                    m.nacos_services.clone()
                },
                ..Default::default()
            };
            for (j, v) in m.vips.iter().enumerate() {
                add_vip(format!("models[{i}].vips[{j}]"), v, &mut vm)?;
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
            models.insert(m.name.clone(), vm);
        }
        for (i, s) in self.services.iter().enumerate() {
            check_model_name(&format!("services[{i}].model"), &s.model)?;
            let model = models
                .entry(s.model.clone())
                .or_insert_with(|| ValidModel { nacos_services: vec![s.model.clone()], ..Default::default() });
            add_vip(format!("services[{i}].vip"), &s.vip, model)?;
        }
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
        let n_vips: usize = models.values().map(|m| m.vips.len()).sum();
        if n_vips > MAX_SERVICES as usize {
            return Err(ConfigError::invalid("models", n_vips, format!("at most {MAX_SERVICES} VIPs in all")));
        }
        for (name, m) in &models {
            if m.vips.is_empty() {
                return Err(ConfigError::invalid(
                    "models",
                    name,
                    "this model has no VIP (models[].vips or [[services]])",
                ));
            }
        }
        let vips: HashSet<SocketAddrV4> = models.values().flat_map(|m| m.vips.iter().copied()).collect();
        let source = match self.discovery.source {
            super::SourceKind::Static => {
                if self.discovery.nacos.is_some() && !self.backends.is_empty() {
                    // Both given: say which one is used rather than guess.
                    return Err(ConfigError::invalid(
                        "discovery.source",
                        "static",
                        "[discovery.nacos] is set but the source is static; set source = \"nacos\" or remove it",
                    ));
                }
                ValidSource::Static
            }
            super::SourceKind::Nacos => {
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
                ValidSource::Nacos(Box::new(n.validate()?))
            }
        };
        let listen = d
            .listen
            .as_deref()
            .map(|l| {
                l.parse::<std::net::SocketAddr>()
                    .map_err(|e| ConfigError::invalid("daemon.listen", l, format!("expected ip:port ({e})")))
            })
            .transpose()?;
        self.policy.validate()?;

        let mut backends = Vec::with_capacity(self.backends.len());
        let mut seen = HashSet::new();
        let mut per_model: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, c) in self.backends.iter().enumerate() {
            let field = |f: &str| format!("backends[{i}].{f}");
            check_model_name(&field("model"), &c.model)?;
            if !models.contains_key(&c.model) {
                return Err(ConfigError::invalid(
                    field("model"),
                    &c.model,
                    "no service (VIP) is configured for this model",
                ));
            }
            let address = parse_v4(&field("address"), &c.address)?;
            if vips.contains(&address) {
                return Err(ConfigError::invalid(field("address"), &c.address, "a backend cannot be a VIP"));
            }
            if !seen.insert((c.model.clone(), address)) {
                return Err(ConfigError::invalid(
                    field("address"),
                    &c.address,
                    "this backend is listed twice for the model",
                ));
            }
            if c.weight > MAX_WEIGHT {
                return Err(ConfigError::invalid(field("weight"), c.weight, format!("must be 0..={MAX_WEIGHT}")));
            }
            if c.free_memory_mb == Some(u32::MAX) {
                return Err(ConfigError::invalid(
                    field("free_memory_mb"),
                    u32::MAX,
                    "reserved for 'unknown': omit the field",
                ));
            }
            let n = per_model.entry(c.model.as_str()).or_default();
            *n += 1;
            if *n > MAX_MEMBERS as usize {
                return Err(ConfigError::invalid(
                    field("model"),
                    &c.model,
                    format!("at most {MAX_MEMBERS} backends per model"),
                ));
            }
            backends.push(ValidBackend {
                model: c.model.clone(),
                address,
                weight: c.weight,
                gpu_type: c.gpu_type.clone(),
                free_memory_mb: c.free_memory_mb,
                max_inflight: c.max_inflight,
                healthy: c.healthy,
            });
        }
        if backends.len() > MAX_BACKENDS as usize / 2 {
            // Half the id space stays free for backends removed while connections still use them.
            return Err(ConfigError::invalid("backends", backends.len(), format!("at most {}", MAX_BACKENDS / 2)));
        }
        Ok(ValidConfig {
            bpffs: d.bpffs.clone(),
            cgroup: d.cgroup.clone(),
            load_factor_milli: (b.load_factor * 1000.0).round() as u32,
            probes: b.probes,
            affinity: b.affinity,
            load_bound: b.load_bound,
            round_robin: b.round_robin,
            affinity_ttl,
            affinity_wait,
            seed: b.seed,
            models,
            backends,
            source,
            listen,
            policy: self.policy.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{load_valid, Config};

    fn err(text: &str) -> String {
        match Config::parse(text, "test").and_then(|c| c.validate()) {
            Ok(_) => panic!("config should be rejected:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    const OK: &str = r#"
[[services]]
model = "m"
vip = "127.77.0.1:8000"
[[backends]]
model = "m"
address = "127.0.0.11:18001"
"#;

    #[test]
    fn embedded_default_is_valid() {
        let c = load_valid(None).unwrap();
        assert_eq!(c.backends.len(), 3);
        assert_eq!(c.cgroup, "ailb-demo", "the default must not attach to the cgroup2 root");
        assert_eq!(c.load_factor_milli, 1250);
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = Config::parse(OK, "t").unwrap().validate().unwrap();
        assert_eq!(c.bpffs.to_str(), Some("/sys/fs/bpf/ailb"));
        assert_eq!(c.cgroup, "ailb");
        assert_eq!((c.probes, c.affinity, c.load_bound), (4, true, true));
        assert_eq!(c.affinity_ttl.as_secs(), 1800);
        assert_eq!(c.affinity_wait.as_secs(), 20);
        assert_eq!(c.backends[0].weight, 1);
    }

    #[test]
    fn bad_values_name_field_and_value() {
        let cases: &[(&str, &str, &str)] = &[
            ("127.0.0.11:18001\"", "127.0.0.999:1\"", "backends[0].address"),
            ("127.0.0.11:18001\"", "127.0.0.11:18001\"\nweight = 70000", "backends[0].weight"),
            ("127.0.0.11:18001\"", "[::1]:80\"", "IPv6"),
            ("127.0.0.11:18001\"", "127.0.0.11:0\"", "port 0"),
            ("127.77.0.1:8000\"", "nonsense\"", "services[0].vip"),
        ];
        for (from, to, want) in cases {
            let e = err(&OK.replace(from, to));
            assert!(e.contains(want), "error {e:?} should mention {want:?}");
        }
        let e = err(&format!("[balancer]\nload_factor = 0.5\n{OK}"));
        assert!(e.contains("balancer.load_factor") && e.contains("0.5"), "{e}");
        let e = err(&format!("[balancer]\nprobes = 0\n{OK}"));
        assert!(e.contains("balancer.probes"), "{e}");
        let e = err(&format!("[balancer]\naffinity_ttl = \"soon\"\n{OK}"));
        assert!(e.contains("balancer.affinity_ttl") && e.contains("soon"), "{e}");
        let e = err(&format!("[balancer]\naffinity_wait = \"-1s\"\n{OK}"));
        assert!(e.contains("balancer.affinity_wait") && e.contains("-1s"), "{e}");
        let e = err(&OK.replace("model = \"m\"\naddress", "model = \"other\"\naddress"));
        assert!(e.contains("backends[0].model") && e.contains("other"), "{e}");
        let e = err(&format!("{OK}{}", &OK[OK.find("[[backends]]").unwrap()..]));
        assert!(e.contains("listed twice"), "{e}");
        let e = err("[[backends]]\nmodel = \"m\"\naddress = \"127.0.0.1:1\"\n");
        assert!(e.contains("models"), "{e}");
        let e = err(&format!("bogus = 1\n{OK}"));
        assert!(e.contains("bogus"), "{e}");
        let e = err("this is not toml");
        assert!(e.contains("config test"), "{e}");
    }
}
