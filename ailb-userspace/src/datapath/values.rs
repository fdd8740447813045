//! The map values computed from the plan and the settings (pure: no map access), and their
//! inverses for the readers (`status`, `explain`).
#![forbid(unsafe_code)]

use std::{
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    time::Duration,
};

use ailb_common::{
    hash::{backend_key, backend_key6},
    maglev::MaglevBackend,
    Backend, BackendAddr6, GlobalConfig, ModelState, ServiceKey, ServiceKey6, ABI_VERSION, BACKEND_IPV6, BACKEND_LIVE,
    CONFIG_AFFINITY, CONFIG_LOAD_BOUND, CONFIG_ROUND_ROBIN, MAX_MODEL_NAME_LEN, MEM_UNKNOWN,
};

use super::WriterSettings;
use crate::policy::PlannedBackend;

/// An address as the kernel holds it: IPv4 address and port in network byte order.
pub fn addr_be(a: &SocketAddrV4) -> (u32, u16) {
    (u32::from_ne_bytes(a.ip().octets()), a.port().to_be())
}

/// The inverse of [`addr_be`].
pub fn addr_from_be(addr: u32, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(addr.to_ne_bytes()), u16::from_be(port))
}

/// An IPv6 address as the kernel holds it (`bpf_sock_addr::user_ip6`: the 16 bytes in
/// network order as four words) and the port in network byte order.
pub fn addr6_be(a: &SocketAddrV6) -> ([u32; 4], u16) {
    let o = a.ip().octets();
    let words = std::array::from_fn(|i| u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]));
    (words, a.port().to_be())
}

/// The inverse of [`addr6_be`].
pub fn addr6_from_be(addr: &[u32; 4], port: u16) -> SocketAddrV6 {
    let mut o = [0u8; 16];
    for (i, w) in addr.iter().enumerate() {
        o[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
    }
    SocketAddrV6::new(Ipv6Addr::from(o), u16::from_be(port), 0, 0)
}

/// A backend entry's address: its IPv4 one, or (`BACKEND_IPV6`) the one in `AILB_BACKEND_ADDRS6`.
pub fn backend_address(b: &Backend, addr6: &BackendAddr6) -> SocketAddr {
    if b.is_ipv6() {
        SocketAddr::V6(addr6_from_be(&addr6.addr, b.port))
    } else {
        SocketAddr::V4(addr_from_be(b.addr, b.port))
    }
}

/// A VIP's key: in `AILB_SERVICES` (IPv4) or in `AILB_SERVICES6`.
pub(crate) enum VipKey {
    V4(ServiceKey),
    V6(ServiceKey6),
}

pub(crate) fn vip_key(vip: &SocketAddr) -> VipKey {
    match vip {
        SocketAddr::V4(a) => {
            let (addr, port) = addr_be(a);
            VipKey::V4(ServiceKey { addr, port, _pad: 0 })
        }
        SocketAddr::V6(a) => {
            let (addr, port) = addr6_be(a);
            VipKey::V6(ServiceKey6 { addr, port, _pad: 0 })
        }
    }
}

/// The model name of an `AILB_MODELS` entry (empty for an unused entry).
pub fn model_name(state: &ModelState) -> String {
    let end = state.name.iter().position(|&b| b == 0).unwrap_or(state.name.len());
    String::from_utf8_lossy(&state.name[..end]).into_owned()
}

/// `name`, NUL-padded, as `ModelState::name` holds it. The config admits names of at most
/// [`MAX_MODEL_NAME_LEN`] bytes.
pub(crate) fn name_bytes(name: &str) -> [u8; MAX_MODEL_NAME_LEN] {
    let mut bytes = [0u8; MAX_MODEL_NAME_LEN];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    bytes
}

/// Whether a planned backend is a member of its model's table.
pub(crate) fn is_member(b: &PlannedBackend) -> bool {
    b.eligible && b.weight > 0
}

/// The `AILB_BACKENDS` entry of a planned backend of model `model` (an IPv6 backend's
/// address goes to `AILB_BACKEND_ADDRS6`: [`backend_addr6`]).
pub(crate) fn backend_entry(model: u32, b: &PlannedBackend) -> Backend {
    let (addr, port, family) = match &b.address {
        SocketAddr::V4(a) => {
            let (addr, port) = addr_be(a);
            (addr, port, 0)
        }
        SocketAddr::V6(a) => (0, a.port().to_be(), BACKEND_IPV6),
    };
    Backend {
        addr,
        port,
        model,
        weight: b.weight,
        cap: b.cap,
        free_mem_mb: b.free_memory_mb.unwrap_or(MEM_UNKNOWN),
        mem_capacity_mb: b.memory_capacity_mb.unwrap_or(0),
        state: family | if is_member(b) { BACKEND_LIVE } else { 0 },
        ..Default::default()
    }
}

/// The `AILB_BACKEND_ADDRS6` entry of an IPv6 backend; `None` for an IPv4 one.
pub(crate) fn backend_addr6(b: &PlannedBackend) -> Option<BackendAddr6> {
    match &b.address {
        SocketAddr::V4(_) => None,
        SocketAddr::V6(a) => Some(BackendAddr6 { addr: addr6_be(a).0 }),
    }
}

/// The Maglev table builder's input for backend `id`: its key hashes its kernel address.
pub(crate) fn maglev_member(id: u32, b: &PlannedBackend, seed: u64) -> MaglevBackend {
    let key = match &b.address {
        SocketAddr::V4(a) => {
            let (addr, port) = addr_be(a);
            backend_key(addr, port, seed)
        }
        SocketAddr::V6(a) => {
            let (addr, port) = addr6_be(a);
            backend_key6(&addr, port, seed)
        }
    };
    MaglevBackend { id, key, weight: b.weight }
}

/// A model's affinity TTL in `ModelState::affinity_ttl_ns`: 0 for none (the global one
/// applies), else at least 1 ns so that a set TTL never reads as unset.
pub(crate) fn model_ttl_ns(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64)
}

/// The `AILB_CONFIG` entry of `cfg` at `generation`.
pub(crate) fn global_config(cfg: &WriterSettings, generation: u64) -> GlobalConfig {
    GlobalConfig {
        abi_version: ABI_VERSION,
        load_factor_milli: cfg.load_factor_milli,
        probes: cfg.probes,
        flags: (if cfg.affinity { CONFIG_AFFINITY } else { 0 })
            | (if cfg.load_bound { CONFIG_LOAD_BOUND } else { 0 })
            | (if cfg.round_robin { CONFIG_ROUND_ROBIN } else { 0 }),
        affinity_ttl_ns: cfg.affinity_ttl.as_nanos().min(u64::MAX as u128) as u64,
        generation,
        affinity_wait_ns: cfg.affinity_wait.as_nanos().min(u64::MAX as u128) as u64,
        prefix_load_factor_milli: cfg.prefix_load_factor_milli,
        _pad: 0,
    }
}

#[cfg(test)]
mod tests;
