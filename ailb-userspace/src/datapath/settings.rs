//! What the datapath takes from the configuration, in types of its own: `config` validates the
//! file into them, so the datapath depends on no config type and reads no field it does not
//! use.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ailb_common::{DEFAULT_MEMBER_SLOTS, DEFAULT_TABLE_SLOTS};

/// `[balancer]` as the writer uses it: the pick's settings it writes to `AILB_CONFIG`, and the
/// seed of the table layout.
#[derive(Debug, Clone, PartialEq)]
pub struct WriterSettings {
    /// The load bound factor c, in thousandths.
    pub load_factor_milli: u32,
    /// A prefix holder's load bound factor, in thousandths.
    pub prefix_load_factor_milli: u32,
    /// Table slots probed per connection.
    pub probes: u32,
    pub affinity: bool,
    pub load_bound: bool,
    pub round_robin: bool,
    pub affinity_ttl: Duration,
    pub affinity_wait: Duration,
    /// Seed of the table layout; gateways that share it build identical tables.
    pub seed: u64,
}

/// The sizes of the kernel's table and member arenas (`[limits]`), fixed when the maps are
/// created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaLimits {
    pub table_slots: u32,
    pub member_slots: u32,
    /// Entries of the prefix map (`AILB_PREFIX`, LRU).
    pub prefix_entries: u32,
}

impl Default for ArenaLimits {
    fn default() -> Self {
        Self {
            table_slots: DEFAULT_TABLE_SLOTS,
            member_slots: DEFAULT_MEMBER_SLOTS,
            prefix_entries: ailb_common::DEFAULT_PREFIX_ENTRIES,
        }
    }
}

/// How remote flows are rewritten (`[daemon.tc] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcMode {
    Masquerade,
    Routed,
}

/// How the TC program is attached to each interface (`[daemon.tc] attach`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcAttach {
    Auto,
    Tcx,
    Clsact,
}

/// The TC datapath for remote clients (`[daemon] interfaces` and `[daemon.tc]`, validated).
/// `interfaces` empty: off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcOptions {
    pub interfaces: Vec<String>,
    pub mode: TcMode,
    pub nat_address: Option<Ipv4Addr>,
    pub nat_address6: Option<Ipv6Addr>,
    pub nat_ports: (u16, u16),
    pub idle_timeout: Duration,
    pub attach: TcAttach,
}

/// A model's settings for remote clients (`AILB_TC_MODELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteModel {
    /// The memory hint a remote connection carries (a remote client sets no socket option).
    pub required_memory_mb: Option<u32>,
    /// A client address keeps its backend (`remote_affinity = "client_address"`).
    pub client_affinity: bool,
}
