//! Pinned map names (also their ELF symbol names).

pub const SERVICES: &str = "AILB_SERVICES";
pub const BACKENDS: &str = "AILB_BACKENDS";
pub const MODELS: &str = "AILB_MODELS";
pub const TABLES: &str = "AILB_TABLES";
pub const MEMBERS: &str = "AILB_MEMBERS";
pub const MODEL_NAMES: &str = "AILB_MODEL_NAMES";
pub const AFFINITY: &str = "AILB_AFFINITY";
pub const SOCK: &str = "AILB_SOCK";
pub const INFLIGHT: &str = "AILB_INFLIGHT";
pub const STATS: &str = "AILB_STATS";
pub const BACKEND_STATS: &str = "AILB_BACKEND_STATS";
pub const CONFIG: &str = "AILB_CONFIG";
pub const FLOWS: &str = "AILB_FLOWS";
pub const TC_CONFIG: &str = "AILB_TC_CONFIG";
pub const TC_MODELS: &str = "AILB_TC_MODELS";
pub const TC_STATS: &str = "AILB_TC_STATS";
/// Remote IPv6 clients' flows ([`super::FlowKey6`] -> [`super::Flow6`]).
pub const FLOWS6: &str = "AILB_FLOWS6";
/// The programs `ailb_tc_ingress` tail-calls (slot [`super::TC_PROG_IPV6`]).
pub const TC_PROGS: &str = "AILB_TC_PROGS";
/// The IPv6 flows' settings ([`super::TcConfig6`], one entry).
pub const TC_CONFIG6: &str = "AILB_TC_CONFIG6";
/// IPv6 VIPs ([`super::ServiceKey6`] -> [`super::Service`]).
pub const SERVICES6: &str = "AILB_SERVICES6";
/// The IPv6 address of each backend id whose `Backend::state` has
/// [`super::BACKEND_IPV6`] ([`super::BackendAddr6`]).
pub const BACKEND_ADDRS6: &str = "AILB_BACKEND_ADDRS6";
/// Which backends hold a cached prefix block ([`super::PrefixKey`] ->
/// [`super::PrefixHolders`], LRU).
pub const PREFIX: &str = "AILB_PREFIX";
/// The prefix keys a socket carries (sk_storage, [`super::SockPrefix`]).
pub const SOCK_PREFIX: &str = "AILB_SOCK_PREFIX";
/// The prefix search's counters per model (per-CPU, [`super::PrefixStats`]).
pub const PREFIX_STATS: &str = "AILB_PREFIX_STATS";
/// A Bloom filter over `AILB_PREFIX`'s keys ([`super::FilterLine`], mmapable array).
pub const PREFIX_FILTER: &str = "AILB_PREFIX_FILTER";
/// Every map the daemon pins, in the order teardown removes them.
pub const ALL: [&str; 25] = [
    SERVICES,
    SERVICES6,
    BACKENDS,
    BACKEND_ADDRS6,
    MODELS,
    TABLES,
    MEMBERS,
    MODEL_NAMES,
    AFFINITY,
    SOCK,
    INFLIGHT,
    STATS,
    BACKEND_STATS,
    CONFIG,
    FLOWS,
    FLOWS6,
    TC_PROGS,
    TC_CONFIG,
    TC_CONFIG6,
    TC_MODELS,
    TC_STATS,
    PREFIX,
    SOCK_PREFIX,
    PREFIX_STATS,
    PREFIX_FILTER,
];
