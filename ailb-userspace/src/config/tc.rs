//! `[daemon] interfaces` and `[daemon.tc]`: the TC datapath for remote clients, and each
//! model's `remote_affinity`. Checked here for form (names, addresses, ranges); whether an
//! interface exists is checked when the daemon attaches to it, in its network namespace.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::Deserialize;

use crate::{
    datapath::{RemoteModel, TcAttach, TcMode, TcOptions},
    validate::{parse_duration, ConfigError},
};

/// `[daemon.tc]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcSettings {
    /// "masquerade" (default: destination to the backend, source to `nat_address` and a port
    /// of `nat_ports`, so backends need no change) or "routed" (destination only, for a
    /// gateway that is the backends' route back to the clients).
    #[serde(default = "default_mode")]
    pub mode: String,
    /// The gateway's IPv4 address the masqueraded flows come from (backends answer it);
    /// required with `mode = "masquerade"` when `interfaces` is set.
    #[serde(default)]
    pub nat_address: Option<String>,
    /// The gateway's IPv6 address the masqueraded IPv6 flows come from (with the same
    /// `nat_ports`). Without it, in masquerade mode, IPv6 clients are not balanced by the TC
    /// datapath (their packets pass untouched); routed mode needs none.
    #[serde(default)]
    pub nat_address6: Option<String>,
    /// "MIN-MAX", the NAT ports (inclusive). Keep it apart from the gateway's own ephemeral
    /// ports (`net.ipv4.ip_local_port_range`). Default "20000-29999".
    #[serde(default = "default_ports")]
    pub nat_ports: String,
    /// A flow with no packet for this long is removed with its counts. Default "5m"; "0s":
    /// never (flows end only at FIN or RST).
    #[serde(default = "default_idle")]
    pub idle_timeout: String,
    /// How the program is attached to each interface: "tcx" (a tcx link, Linux 6.6+),
    /// "clsact" (a netlink filter on the interface's clsact qdisc, any kernel with BPF
    /// direct action), or "auto" (default: tcx, and clsact where the kernel has no tcx).
    #[serde(default = "default_attach")]
    pub attach: String,
}

fn default_mode() -> String {
    "masquerade".into()
}
fn default_ports() -> String {
    "20000-29999".into()
}
fn default_idle() -> String {
    "5m".into()
}
fn default_attach() -> String {
    "auto".into()
}

impl Default for TcSettings {
    fn default() -> Self {
        Self {
            mode: default_mode(),
            nat_address: None,
            nat_address6: None,
            nat_ports: default_ports(),
            idle_timeout: default_idle(),
            attach: default_attach(),
        }
    }
}

/// Linux interface names: 1 to 15 bytes, no '/', no whitespace, not "." or "..".
fn check_interface(field: String, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 15 {
        return Err(ConfigError::invalid(field, name, "interface names are 1 to 15 bytes"));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::invalid(field, name, "not a valid interface name"));
    }
    Ok(())
}

fn parse_ports(value: &str) -> Result<(u16, u16), ConfigError> {
    let field = "daemon.tc.nat_ports";
    let (lo, hi) = value.split_once('-').ok_or_else(|| ConfigError::invalid(field, value, "expected MIN-MAX"))?;
    let port = |s: &str| {
        s.trim().parse::<u16>().map_err(|e| ConfigError::invalid(field, value, format!("{s:?} is not a port ({e})")))
    };
    let (lo, hi) = (port(lo)?, port(hi)?);
    if lo == 0 || lo > hi {
        return Err(ConfigError::invalid(field, value, "need 1 <= MIN <= MAX"));
    }
    Ok((lo, hi))
}

/// `[daemon] interfaces` with `[daemon.tc]`: the TC datapath's options.
pub(crate) fn validate(interfaces: &[String], s: &TcSettings) -> Result<TcOptions, ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for (i, name) in interfaces.iter().enumerate() {
        check_interface(format!("daemon.interfaces[{i}]"), name)?;
        if !seen.insert(name) {
            return Err(ConfigError::invalid(format!("daemon.interfaces[{i}]"), name, "listed twice"));
        }
    }
    let mode = match s.mode.as_str() {
        "masquerade" => TcMode::Masquerade,
        "routed" => TcMode::Routed,
        other => return Err(ConfigError::invalid("daemon.tc.mode", other, "expected \"masquerade\" or \"routed\"")),
    };
    let nat_address = s
        .nat_address
        .as_deref()
        .map(|a| {
            let ip = a.parse::<Ipv4Addr>().map_err(|e| {
                ConfigError::invalid("daemon.tc.nat_address", a, format!("expected an IPv4 address ({e})"))
            })?;
            if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
                return Err(ConfigError::invalid(
                    "daemon.tc.nat_address",
                    a,
                    "must be a unicast address of the gateway",
                ));
            }
            Ok(ip)
        })
        .transpose()?;
    if mode == TcMode::Masquerade && nat_address.is_none() && !interfaces.is_empty() {
        return Err(ConfigError::invalid(
            "daemon.tc.nat_address",
            "(absent)",
            "masquerade mode needs the gateway address the backends answer",
        ));
    }
    let nat_address6 = s.nat_address6.as_deref().map(parse_nat6).transpose()?;
    let attach = match s.attach.as_str() {
        "auto" => TcAttach::Auto,
        "tcx" => TcAttach::Tcx,
        "clsact" => TcAttach::Clsact,
        other => {
            return Err(ConfigError::invalid("daemon.tc.attach", other, "expected \"auto\", \"tcx\" or \"clsact\""))
        }
    };
    let nat_ports = parse_ports(&s.nat_ports)?;
    let idle_timeout = parse_duration("daemon.tc.idle_timeout", &s.idle_timeout)?;
    Ok(TcOptions { interfaces: interfaces.to_vec(), mode, nat_address, nat_address6, nat_ports, idle_timeout, attach })
}

/// `daemon.tc.nat_address6`: a unicast IPv6 address (not v4-mapped: IPv4 flows have
/// `nat_address`).
fn parse_nat6(a: &str) -> Result<Ipv6Addr, ConfigError> {
    let field = "daemon.tc.nat_address6";
    let ip =
        a.parse::<Ipv6Addr>().map_err(|e| ConfigError::invalid(field, a, format!("expected an IPv6 address ({e})")))?;
    if ip.is_unspecified() || ip.is_multicast() || ip.to_ipv4_mapped().is_some() {
        return Err(ConfigError::invalid(field, a, "must be a unicast IPv6 address of the gateway (not v4-mapped)"));
    }
    Ok(ip)
}

/// `models[i].remote_affinity`: whether remote clients keep their backend by address.
pub(crate) fn remote_affinity(field: String, value: Option<&str>) -> Result<bool, ConfigError> {
    match value {
        None | Some("none") => Ok(false),
        Some("client_address") => Ok(true),
        Some(other) => Err(ConfigError::invalid(field, other, "expected \"none\" or \"client_address\"")),
    }
}

impl super::ValidConfig {
    /// Each catalog model's settings for remote clients, as the TC datapath writes them.
    pub fn remote_models(&self) -> impl Iterator<Item = (&str, RemoteModel)> {
        self.models.iter().map(|(name, m)| {
            let remote =
                RemoteModel { required_memory_mb: m.spec.required_memory_mb, client_affinity: m.remote_affinity };
            (name.as_str(), remote)
        })
    }
}

#[cfg(test)]
mod tests;
