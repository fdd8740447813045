//! The daemon's TOML config, built by tests (see the contract's "Config TOML" section).

use std::fmt::Write;

/// One `[[backends]]` entry.
#[derive(Clone, Debug)]
pub struct BackendCfg {
    pub model: String,
    pub address: String,
    pub weight: u32,
    pub free_memory_mb: Option<u32>,
    pub max_inflight: Option<u32>,
    pub healthy: Option<bool>,
    /// Raw TOML lines appended to the entry (e.g. `metrics_url`, `gpus`).
    pub extra: String,
}

impl BackendCfg {
    pub fn new(model: &str, address: &str, weight: u32) -> Self {
        Self {
            model: model.to_owned(),
            address: address.to_owned(),
            weight,
            free_memory_mb: None,
            max_inflight: None,
            healthy: None,
            extra: String::new(),
        }
    }

    pub fn free_memory_mb(mut self, mb: u32) -> Self {
        self.free_memory_mb = Some(mb);
        self
    }
}

/// A whole config file.
#[derive(Clone, Debug)]
pub struct TestConfig {
    pub bpffs: String,
    pub cgroup: String,
    pub load_factor: f64,
    /// `prefix_load_factor` (`None`: the daemon's default).
    pub prefix_load_factor: Option<f64>,
    pub probes: u32,
    pub affinity: bool,
    pub load_bound: bool,
    pub round_robin: bool,
    pub affinity_ttl: String,
    pub affinity_wait: String,
    pub seed: u64,
    /// `(model, vip)` pairs.
    pub services: Vec<(String, String)>,
    pub backends: Vec<BackendCfg>,
    /// `daemon.listen` (the HTTP endpoint), if any.
    pub listen: Option<String>,
    /// Raw TOML appended at the end (e.g. `[[models]]`, `[discovery]` and `[policy]` tables).
    pub extra: String,
    /// Raw TOML lines added to `[daemon]` (e.g. `sample_interval`, `interfaces = [...]`).
    pub daemon_extra: String,
}

impl TestConfig {
    /// The contract's defaults (c = 1.25, 4 probes, affinity and load bound on, 30 min TTL,
    /// 20 s affinity wait).
    pub fn new(bpffs: &str, cgroup: &str) -> Self {
        Self {
            bpffs: bpffs.to_owned(),
            cgroup: cgroup.to_owned(),
            load_factor: 1.25,
            prefix_load_factor: None,
            probes: 4,
            affinity: true,
            load_bound: true,
            round_robin: false,
            affinity_ttl: "30m".into(),
            affinity_wait: "20s".into(),
            seed: 0,
            services: Vec::new(),
            backends: Vec::new(),
            listen: None,
            extra: String::new(),
            daemon_extra: String::new(),
        }
    }

    pub fn service(mut self, model: &str, vip: &str) -> Self {
        self.services.push((model.to_owned(), vip.to_owned()));
        self
    }

    pub fn backend(mut self, b: BackendCfg) -> Self {
        self.backends.push(b);
        self
    }

    /// The backend with `address`, for edits before a reload.
    pub fn backend_mut(&mut self, address: &str) -> &mut BackendCfg {
        self.backends
            .iter_mut()
            .find(|b| b.address == address)
            .unwrap_or_else(|| panic!("no backend {address} in the test config"))
    }

    pub fn to_toml(&self) -> String {
        let mut s = String::new();
        let q = quote;
        let _ = writeln!(s, "[daemon]\nbpffs = {}\ncgroup = {}", q(&self.bpffs), q(&self.cgroup));
        if let Some(l) = &self.listen {
            let _ = writeln!(s, "listen = {}", q(l));
        }
        if !self.daemon_extra.is_empty() {
            let _ = writeln!(s, "{}", self.daemon_extra);
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "[balancer]\nload_factor = {:?}\nprobes = {}\naffinity = {}\nload_bound = {}\nround_robin = {}\naffinity_ttl = {}\naffinity_wait = {}\nseed = {}\n",
            self.load_factor,
            self.probes,
            self.affinity,
            self.load_bound,
            self.round_robin,
            q(&self.affinity_ttl),
            q(&self.affinity_wait),
            self.seed
        );
        if let Some(c) = self.prefix_load_factor {
            let _ = writeln!(s, "prefix_load_factor = {c:?}");
        }
        for (model, vip) in &self.services {
            let _ = writeln!(s, "[[services]]\nmodel = {}\nvip = {}\n", q(model), q(vip));
        }
        for b in &self.backends {
            let _ = writeln!(
                s,
                "[[backends]]\nmodel = {}\naddress = {}\nweight = {}",
                q(&b.model),
                q(&b.address),
                b.weight
            );
            if let Some(m) = b.free_memory_mb {
                let _ = writeln!(s, "free_memory_mb = {m}");
            }
            if let Some(m) = b.max_inflight {
                let _ = writeln!(s, "max_inflight = {m}");
            }
            if let Some(h) = b.healthy {
                let _ = writeln!(s, "healthy = {h}");
            }
            s.push_str(&b.extra);
            s.push('\n');
        }
        s.push_str(&self.extra);
        s
    }
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
