//! The client ABI and the layout of every BPF map value. All structs are `#[repr(C)]`
//! with explicit padding so that the kernel, userspace and `bpftool` agree byte for byte.
//! The TC datapath's layouts (flows, NAT, remote clients) are in [`tc`].

pub mod maps;
mod prefix;
pub mod programs;
mod tc;
pub use prefix::*;
pub use tc::*;

/// `setsockopt` level that the `cgroup/setsockopt` program consumes ("AIL").
pub const SOL_AILB: i32 = 0x41494c;
/// Option: the conversation id, 1..=[`MAX_CONVERSATION_LEN`] raw bytes.
pub const AILB_CONVERSATION: i32 = 1;
/// Option: a native-endian `u32`, the GPU memory in MB this request needs.
pub const AILB_REQUIRED_MEMORY_MB: i32 = 2;
/// Option: the model name, 1..=[`MAX_MODEL_NAME_LEN`] bytes, for a shared VIP.
pub const AILB_MODEL: i32 = 3;
/// Option, after `connect()`: a native-endian `u32`, 1 = the connection is idle (kept open for
/// a later request with the same tags: it stops counting as in flight at its backend, and the
/// conversation's affinity counts its age from now, as at a close), 0 = busy again (counted
/// again). Ignored on a socket ailb did not pick.
pub const AILB_IDLE: i32 = 4;

pub const MAX_CONVERSATION_LEN: usize = 128;
pub const MAX_MODEL_NAME_LEN: usize = 64;

/// Bumped whenever a map layout changes; a daemon refuses pins of another version.
pub const ABI_VERSION: u32 = 13;

pub const MAX_MODELS: u32 = 1024;
/// Backend ids: twice [`MAX_MEMBERS`], so that a model of 16,384 backends can be replaced by
/// another 16,384 while the old ids wait for their connections to end.
pub const MAX_BACKENDS: u32 = 32768;
/// Backends one model can have (the member list the least-loaded fallback scans).
pub const MAX_MEMBERS: u32 = 16384;
/// Largest Maglev table; every table is a prime from [`TABLE_SIZES`].
pub const MAX_TABLE_SIZE: u32 = 1_048_583;
/// The Maglev table sizes. The first five hold 100 slots per backend up to 655 backends (the
/// smallest, 1,021 and 2,039 slots, one and two arena chunks, serve models of up to 10 and 20
/// backends: most models of a large catalog, which then cost half or a quarter of a 4,093-slot
/// table in kernel memory, table build time and bytes written per swap); the larger ones are the
/// first primes above 64 x 2048, 64 x 4096, ..., so that a table of up to [`MAX_MEMBERS`]
/// backends still has at least 64 slots per backend ([`crate::maglev::table_size_for`]).
pub const TABLE_SIZES: [u32; 9] = [1021, 2039, 4093, 16381, 65521, 131_101, 262_147, 524_309, MAX_TABLE_SIZE];
/// Upper bound on the number of table slots probed per pick.
pub const MAX_PROBES: u32 = 8;
/// VIPs in all (each model of a full catalog has its own).
pub const MAX_SERVICES: u32 = 4096;
pub const MAX_AFFINITY: u32 = 262_144;

/// Table slots per `AILB_TABLES` entry ([`TableChunk`], 4 KiB). The tables live in one arena
/// of chunks whose number the daemon sets at load (`[limits] table_slots`); a table's extent
/// starts on a chunk, so a table of M slots takes `ceil(M / TABLE_CHUNK)` chunks (the table
/// sizes are primes just below or above multiples of 1,024: at most 1 % is padding), and the
/// writer writes a 4,093-slot table in 4 map updates.
pub const TABLE_CHUNK: u32 = 1024;
/// Member ids per `AILB_MEMBERS` entry ([`MemberChunk`]); the member lists share one arena
/// the same way (`[limits] member_slots`).
pub const MEMBER_CHUNK: u32 = 16;
/// Default size of the table arena, in slots: 1,024 models of up to 40 backends (4,093 slots,
/// 4 chunks each) and room to swap in the largest table ([`MAX_TABLE_SIZE`]) beside them.
pub const DEFAULT_TABLE_SLOTS: u32 = 6 * 1024 * 1024;
/// Default size of the member arena, in ids: 1,024 models of up to 16 backends, a swap of
/// [`MAX_MEMBERS`] beside them, and room for larger models.
pub const DEFAULT_MEMBER_SLOTS: u32 = 64 * 1024;
/// Largest table arena the daemon accepts (1 GiB of tables).
pub const MAX_TABLE_SLOTS: u32 = 256 * 1024 * 1024;
/// Largest member arena the daemon accepts (64 MiB of ids).
pub const MAX_MEMBER_SLOTS: u32 = 16 * 1024 * 1024;

/// A table or member slot that holds no backend.
pub const NO_BACKEND: u32 = u32::MAX;
/// `Backend::free_mem_mb` when the free memory is not known: it fits every hint.
pub const MEM_UNKNOWN: u32 = u32::MAX;
/// `Backend::cap` when there is no hard cap on in-flight connections.
pub const NO_CAP: u32 = 0;

/// Index of the first per-model counter in `AILB_INFLIGHT` (backends use `0..MAX_BACKENDS`).
pub const INFLIGHT_MODEL_BASE: u32 = MAX_BACKENDS;
/// Index of the first per-model round-robin turn counter in `AILB_INFLIGHT` (used with
/// [`CONFIG_ROUND_ROBIN`]; one atomic add per connect).
pub const INFLIGHT_TURN_BASE: u32 = MAX_BACKENDS + MAX_MODELS;
/// Index of the first per-backend memory counter in `AILB_INFLIGHT`: the sum of the memory
/// hints (MB) of the connections in flight to the backend, kept exact by `sock_ops` like the
/// connection counts. The pick subtracts it from the backend's idle capacity
/// ([`Backend::free_now_mb`]), so a burst of hinted connects sees each other at once instead
/// of the free memory the daemon last wrote.
pub const INFLIGHT_MEM_BASE: u32 = MAX_BACKENDS + 2 * MAX_MODELS;
pub const INFLIGHT_ENTRIES: u32 = 2 * MAX_BACKENDS + 2 * MAX_MODELS;

/// `AILB_SERVICES` key: a VIP. Address and port in network byte order, as in `bpf_sock_addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    pub addr: u32,
    pub port: u16,
    pub _pad: u16,
}

/// `AILB_SERVICES6` key: an IPv6 VIP. The address is the 16 bytes in network order read as
/// four `u32` words, as in `bpf_sock_addr::user_ip6`; the port in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey6 {
    pub addr: [u32; 4],
    pub port: u16,
    pub _pad: u16,
}

/// `AILB_BACKEND_ADDRS6` value: a backend's IPv6 address, as in [`ServiceKey6::addr`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BackendAddr6 {
    pub addr: [u32; 4],
}

/// `user_ip6` word 2 of a v4-mapped address (`::ffff:a.b.c.d`): the bytes `00 00 ff ff`.
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The IPv4 address (network order) of a v4-mapped IPv6 address, `None` for any other.
#[inline(always)]
pub fn v4_mapped(addr: &[u32; 4]) -> Option<u32> {
    (addr[0] == 0 && addr[1] == 0 && addr[2] == V4_MAPPED_WORD).then_some(addr[3])
}

/// The v4-mapped IPv6 address (`::ffff:a.b.c.d`) of an IPv4 address in network order.
#[inline(always)]
pub const fn v4_to_mapped(addr: u32) -> [u32; 4] {
    [0, 0, V4_MAPPED_WORD, addr]
}

/// The VIP's model comes from the socket's `AILB_MODEL` hint instead of `Service::model`.
pub const SERVICE_SHARED: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Service {
    pub model: u32,
    pub flags: u32,
}

/// The backend is a member of its model's active table (healthy, weight > 0).
pub const BACKEND_LIVE: u32 = 1;
/// The backend's address is IPv6, in `AILB_BACKEND_ADDRS6` at the same id (`Backend::addr`
/// is then 0). Only `cgroup/connect6` picks such a backend; an IPv4 client skips it.
pub const BACKEND_IPV6: u32 = 2;

/// `AILB_BACKENDS` value, indexed by a backend id that stays stable across reloads and restarts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    /// IPv4 address, network byte order; 0 for an IPv6 backend ([`BACKEND_IPV6`]).
    pub addr: u32,
    /// Port, network byte order.
    pub port: u16,
    pub _pad: u16,
    pub model: u32,
    pub weight: u32,
    /// Hard cap on in-flight connections, [`NO_CAP`] for none.
    pub cap: u32,
    /// Free GPU memory in MB, [`MEM_UNKNOWN`] if not known.
    pub free_mem_mb: u32,
    pub state: u32,
    /// Memory the backend has for requests when idle (e.g. its KV-cache pool), MB: a request
    /// whose hint exceeds `free_mem_mb` but not this can wait in the backend's queue, so when
    /// no backend fits a hint now, the pick queues it on one that will fit (where it should
    /// finish first) rather than refusing it. [`MEM_UNKNOWN`]: unknown, assumed to fit; 0: no such fallback.
    pub mem_capacity_mb: u32,
}

impl Backend {
    pub fn is_live(&self) -> bool {
        self.state & BACKEND_LIVE != 0
    }
    /// Whether the backend's address is IPv6 (in `AILB_BACKEND_ADDRS6`).
    pub fn is_ipv6(&self) -> bool {
        self.state & BACKEND_IPV6 != 0
    }
    /// Whether the backend can take a request that needs `required_mem_mb` (0: no hint).
    pub fn fits(&self, required_mem_mb: u32) -> bool {
        required_mem_mb == 0 || self.free_mem_mb == MEM_UNKNOWN || self.free_mem_mb >= required_mem_mb
    }
    /// Memory free for one more request while connections hinting `inflight_mem_mb` in all
    /// are in flight to this backend: the free memory last written, and at most the idle
    /// capacity less those hints (when the capacity is known). The hints count queued
    /// requests too, which a GPU's free memory does not show, and they change at connect
    /// and close, not at the daemon's next write.
    pub fn free_now_mb(&self, inflight_mem_mb: u64) -> u32 {
        if self.mem_capacity_mb == 0 || self.mem_capacity_mb == MEM_UNKNOWN {
            return self.free_mem_mb;
        }
        let left = (self.mem_capacity_mb as u64).saturating_sub(inflight_mem_mb);
        if left < self.free_mem_mb as u64 {
            left as u32
        } else {
            self.free_mem_mb
        }
    }
    /// [`Backend::fits`] against [`Backend::free_now_mb`].
    pub fn fits_now(&self, required_mem_mb: u32, inflight_mem_mb: u64) -> bool {
        if required_mem_mb == 0 {
            return true;
        }
        let free = self.free_now_mb(inflight_mem_mb);
        free == MEM_UNKNOWN || free >= required_mem_mb
    }
    /// Whether a request that needs `required_mem_mb` fits once the backend is idle.
    pub fn fits_when_idle(&self, required_mem_mb: u32) -> bool {
        self.fits(required_mem_mb)
            || (self.mem_capacity_mb != 0
                && (self.mem_capacity_mb == MEM_UNKNOWN || self.mem_capacity_mb >= required_mem_mb))
    }
    pub fn under_cap(&self, inflight: u64) -> bool {
        self.cap == NO_CAP || inflight < self.cap as u64
    }
}

/// One of the two table slots of a model.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableSlot {
    /// Maglev table size M (a prime), 0 when the slot holds no table.
    pub size: u32,
    /// Number of valid entries in the slot's member list.
    pub members: u32,
    /// Sum of the member weights.
    pub total_weight: u64,
    pub generation: u64,
    /// Arena position of the table's first slot in `AILB_TABLES` (slot `i` of the table is
    /// arena position `table_offset + i`; see [`TABLE_CHUNK`]).
    pub table_offset: u32,
    /// Arena position of the first member id in `AILB_MEMBERS` (see [`MEMBER_CHUNK`]).
    pub member_offset: u32,
}

/// The model has at least one live backend; without it, connects to its VIP are refused.
pub const MODEL_AVAILABLE: u32 = 1;

/// `AILB_MODELS` value. Userspace writes a new table and member list into free extents of
/// the `AILB_TABLES` and `AILB_MEMBERS` arenas, describes them in the inactive slot of this
/// struct, then flips `active` (and frees the old extents once no connect can read them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelState {
    pub active: u32,
    pub flags: u32,
    pub slots: [TableSlot; 2],
    /// The model name, NUL-padded (for `ailb status` and `bpftool`; the kernel ignores it).
    pub name: [u8; MAX_MODEL_NAME_LEN],
    /// This model's affinity TTL; 0: `GlobalConfig::affinity_ttl_ns` applies.
    pub affinity_ttl_ns: u64,
    /// How long a learnt prefix entry counts ([`MODEL_PREFIX_LEARN`]); 0: until evicted.
    pub prefix_ttl_ns: u64,
}

impl Default for ModelState {
    fn default() -> Self {
        Self {
            active: 0,
            flags: 0,
            slots: [TableSlot::default(); 2],
            name: [0; MAX_MODEL_NAME_LEN],
            affinity_ttl_ns: 0,
            prefix_ttl_ns: 0,
        }
    }
}

impl ModelState {
    pub fn active_slot(&self) -> &TableSlot {
        // `active & 1` keeps the index in range for the verifier and for corrupt input.
        &self.slots[(self.active & 1) as usize]
    }

    /// What the pick reads of the model: its flags, active slot and lifetimes.
    #[inline(always)]
    pub fn view(&self) -> ModelView {
        ModelView {
            flags: self.flags,
            _pad: 0,
            slot: *self.active_slot(),
            affinity_ttl_ns: self.affinity_ttl_ns,
            prefix_ttl_ns: self.prefix_ttl_ns,
        }
    }
}

/// The part of a [`ModelState`] the pick reads, copied once per connect (the active slot is
/// read once, so a table swap during the pick cannot mix two tables). The connect programs
/// copy this rather than the whole state: its 64-byte name would not fit their stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelView {
    pub flags: u32,
    pub _pad: u32,
    pub slot: TableSlot,
    pub affinity_ttl_ns: u64,
    pub prefix_ttl_ns: u64,
}

impl ModelView {
    /// How long a prefix holder that is not exact (learnt in approximate mode, evicted in
    /// precise mode) counts, in [`prefix_tick`] ticks: the model's `prefix_ttl_ns` when it has a
    /// prefix mode; 0 (no lifetime) otherwise.
    #[inline(always)]
    pub fn prefix_ttl_ticks(&self) -> u32 {
        if self.flags & (MODEL_PREFIX_LEARN | MODEL_PREFIX_EVENTS) != 0 {
            prefix_ttl_ticks(self.prefix_ttl_ns)
        } else {
            0
        }
    }
}

/// The chunk of an arena that holds arena position `pos`, and the position inside it.
#[inline(always)]
pub const fn chunk_of(pos: u32, chunk: u32) -> (u32, u32) {
    (pos / chunk, pos % chunk)
}

/// `AILB_TABLES` value: [`TABLE_CHUNK`] consecutive slots of the table arena.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableChunk {
    pub slots: [u32; TABLE_CHUNK as usize],
}

/// `AILB_MEMBERS` value: [`MEMBER_CHUNK`] consecutive ids of the member arena.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberChunk {
    pub ids: [u32; MEMBER_CHUNK as usize],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub model: u32,
    /// Which kind of key `conversation` is: [`AFFINITY_SPACE_CONVERSATION`] (a conversation
    /// hash) or [`AFFINITY_SPACE_CLIENT`] (a remote client's address), so the two never meet.
    pub space: u32,
    pub conversation: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityValue {
    pub backend: u32,
    pub _pad: u32,
    pub last_seen_ns: u64,
}

pub const SOCK_HAS_CONVERSATION: u32 = 1;
pub const SOCK_HAS_MEMORY: u32 = 2;
pub const SOCK_HAS_MODEL: u32 = 4;
/// connect4 picked `backend` for this socket.
pub const SOCK_PICKED: u32 = 8;
/// sock_ops counted this socket in `AILB_INFLIGHT`; cleared when it is uncounted.
pub const SOCK_COUNTED: u32 = 16;
/// The client marked this picked, open socket idle (`AILB_IDLE` = 1): not counted in flight
/// until it is marked busy again; its close is still counted (once).
pub const SOCK_IDLE: u32 = 32;
/// The socket carries prefix keys (`AILB_SOCK_PREFIX`).
pub const SOCK_HAS_PREFIX: u32 = 64;
/// The client withheld its prefix keys until asked (`AILB_PREFIX_ON_REQUEST`).
pub const SOCK_PREFIX_ON_REQUEST: u32 = 128;

/// `AILB_SOCK` (sk_storage) value: the client's hints and the pick.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    pub conversation: u64,
    pub model_hash: u64,
    /// The memory hint set by the client (`AILB_MEMORY`), in MB; once the pick takes a holder
    /// of the request's longest cached prefix, the uncached share it asked that holder for,
    /// which is what the connection then counts in flight there.
    pub required_mem_mb: u32,
    pub flags: u32,
    pub backend: u32,
    pub model: u32,
    /// The memory hint added to the backend's memory counter when the socket was counted
    /// (subtracted as is when it is uncounted, even if the hint changed since).
    pub counted_mem_mb: u32,
    pub _pad: u32,
}

/// Conversation affinity is used (off: plain weighted pick, e.g. for baselines).
pub const CONFIG_AFFINITY: u32 = 1;
/// The bounded-load check is used (off: first table slot always).
pub const CONFIG_LOAD_BOUND: u32 = 2;
/// Connections without a usable affinity entry take the model's members in turn (plain round
/// robin: weights, loads and memory hints ignored; a baseline for comparisons).
pub const CONFIG_ROUND_ROBIN: u32 = 4;
pub const CONFIG_DEFAULT_FLAGS: u32 = CONFIG_AFFINITY | CONFIG_LOAD_BOUND;

/// `AILB_CONFIG` value (one entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalConfig {
    pub abi_version: u32,
    /// The load bound factor c, times 1000 (1250 = 1.25).
    pub load_factor_milli: u32,
    /// Table slots probed per pick, 1..=[`MAX_PROBES`].
    pub probes: u32,
    pub flags: u32,
    /// Affinity entries older than this are ignored; 0: no expiry. An entry's age counts from
    /// its conversation's last connect or close.
    pub affinity_ttl_ns: u64,
    pub generation: u64,
    /// An affinity entry whose backend lacks the hinted memory now (but holds it when idle) is
    /// still honoured, the request waiting there for its cached prefix, if the conversation's
    /// last connect or close is at most this old; older, its prefix is likely evicted and the
    /// request is placed afresh. 0: never wait.
    pub affinity_wait_ns: u64,
    /// The load bound factor of a holder of the longest cached prefix (the prefix step), times
    /// 1000; 0: `load_factor_milli`. The daemon's default is 2000 (or the table's, if larger).
    pub prefix_load_factor_milli: u32,
    pub _pad: u32,
}

impl GlobalConfig {
    /// The balancer's defaults as written into the map: load factor 1.25 (a prefix holder's
    /// 2), 4 probes, affinity and the load bound on, no affinity TTL and no wait, generation 1.
    pub const fn defaults() -> Self {
        Self {
            abi_version: ABI_VERSION,
            load_factor_milli: 1250,
            probes: 4,
            flags: CONFIG_DEFAULT_FLAGS,
            affinity_ttl_ns: 0,
            generation: 1,
            affinity_wait_ns: 0,
            prefix_load_factor_milli: 2000,
            _pad: 0,
        }
    }
}

/// `AILB_STATS` value (per-CPU, one entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct Stats {
    /// Connects to a VIP that got a backend.
    pub picks: u64,
    pub affinity_hits: u64,
    /// An affinity entry existed but its backend could no longer take the connection.
    pub affinity_breaks: u64,
    /// The first probed slot was over its load bound and a later one was taken.
    pub spills: u64,
    /// No probed slot qualified; the member scan chose (least loaded that fits now, or the
    /// shortest memory queue for a hint that fits nowhere now).
    pub fallbacks: u64,
    /// Connects refused: the model has no live backend.
    pub no_backend: u64,
    /// Connects refused: no backend fits the memory hint.
    pub no_fit: u64,
    pub established: u64,
    pub closed: u64,
    pub connect_failures: u64,
    /// Accepted `SOL_AILB` options.
    pub sockopts: u64,
    /// Rejected `SOL_AILB` options (bad length or unknown name).
    pub bad_sockopts: u64,
    /// A holder of the request's longest cached prefix was taken (per model:
    /// `AILB_PREFIX_STATS`).
    pub prefix_picks: u64,
}

/// `AILB_BACKEND_STATS` value (per-CPU, indexed by backend id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct BackendStats {
    pub picks: u64,
    pub affinity_hits: u64,
    pub established: u64,
    pub closed: u64,
    pub connect_failures: u64,
    /// Sum of smoothed RTT samples (microseconds) taken when connections were established.
    pub rtt_us_sum: u64,
    pub rtt_samples: u64,
}

impl Stats {
    /// Adds another CPU's counters (userspace sums the per-CPU values).
    pub fn merge(&mut self, o: &Self) {
        self.picks += o.picks;
        self.affinity_hits += o.affinity_hits;
        self.affinity_breaks += o.affinity_breaks;
        self.spills += o.spills;
        self.fallbacks += o.fallbacks;
        self.no_backend += o.no_backend;
        self.no_fit += o.no_fit;
        self.established += o.established;
        self.closed += o.closed;
        self.connect_failures += o.connect_failures;
        self.sockopts += o.sockopts;
        self.bad_sockopts += o.bad_sockopts;
        self.prefix_picks += o.prefix_picks;
    }
}

impl BackendStats {
    /// Adds another CPU's counters.
    pub fn merge(&mut self, o: &Self) {
        self.picks += o.picks;
        self.affinity_hits += o.affinity_hits;
        self.established += o.established;
        self.closed += o.closed;
        self.connect_failures += o.connect_failures;
        self.rtt_us_sum += o.rtt_us_sum;
        self.rtt_samples += o.rtt_samples;
    }
}

#[cfg(feature = "user")]
mod pod {
    #![allow(unsafe_code)]
    use super::*;
    macro_rules! pod {
        ($($t:ty),*) => {$(
            // SAFETY: #[repr(C)], Copy, every field an integer, no implicit padding.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    pod!(
        ServiceKey,
        ServiceKey6,
        BackendAddr6,
        Service,
        Backend,
        TableSlot,
        ModelState,
        TableChunk,
        MemberChunk,
        AffinityKey,
        AffinityValue,
        SockState,
        GlobalConfig,
        Stats,
        BackendStats,
        FlowKey,
        Flow,
        FlowKey6,
        Flow6,
        TcConfig,
        TcConfig6,
        TcModel,
        TcStats,
        PrefixKey,
        PrefixHolders,
        SockPrefix,
        PrefixStats,
        FilterLine
    );
}

#[cfg(test)]
mod tests;
