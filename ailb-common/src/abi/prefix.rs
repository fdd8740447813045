//! The prefix map's layouts: which backends hold a cached prompt prefix, by block key
//! ([`crate::prefix`] defines the keys), and the keys a socket carries to the pick.
//!
//! `AILB_PREFIX` is an LRU hash map `{model, block key} -> PrefixHolders`, shared by every
//! model. It learns one of two ways, per model ([`ModelState::flags`](super::ModelState)):
//! * [`MODEL_PREFIX_LEARN`] (approximate): each connect that carried keys records them for the
//!   backend it got, stamped with the [`prefix_tick`] of the connect; an entry older than the
//!   model's `prefix_ttl_ns` no longer counts (an engine's cache turns over; the daemon sets
//!   the lifetime from the model's `prefix_ttl`);
//! * [`MODEL_PREFIX_EVENTS`] (precise): the daemon writes what each backend's engine reports
//!   in its KV events, stamped [`PREFIX_SEEN_EXACT`] (never aged). When an engine evicts the
//!   block, the daemon stamps its backend with the [`prefix_tick`] of the eviction
//!   ([`PrefixHolders::evict`]): an *evicted holder*, which counts for the model's
//!   `prefix_ttl` as a weaker holder (the pick prefers an exact one), and is removed at once
//!   where the model has no lifetime. The kernel does not learn for such a model, so every
//!   daemon that reads the same events holds the same map (the ticks stamped by each daemon's
//!   own clock as it applies the event).
//!
//! Kernel memory: one entry is a 16-byte key and a 64-byte value in an LRU hash element (the
//! element header and the LRU node add about 56 bytes); `docs/prefix.md` has the measured
//! figure per block.

use super::NO_BACKEND;

/// Option: the request's prefix keys, 1..=[`crate::prefix::PREFIX_KEYS_MAX`] native-endian
/// `u64`s (`optlen` a multiple of 8), in prompt order: the keys [`crate::prefix::sent`]
/// chooses (every k-th block's and the last), none of them 0. Setting it again replaces them.
pub const AILB_PREFIX: i32 = 5;

/// Option, before `connect()`: a native-endian `u32`, 1 = the client can make the prompt's
/// prefix keys (`AILB_PREFIX`) but has not: the connect goes ahead only where the pick reads no
/// keys, that is where the conversation's affinity holds on a model whose prefix map does not
/// learn from picks ([`crate::pick::keys_wanted`]); anywhere else it fails with `ENOKEY`,
/// recording nothing, and the client connects again on a fresh socket with its keys. 0 = off.
/// Why: token-exact keys cost the tokenizing of the prompt on the request's path, milliseconds
/// for a long one, and a conversation's later turn is most often placed by its affinity, which
/// the pick takes before any key.
pub const AILB_PREFIX_ON_REQUEST: i32 = 6;

/// Backends one prefix entry names. A block held by more (a system prompt on every server)
/// keeps the first ones written; the pick then chooses among those.
pub const PREFIX_HOLDERS: usize = 8;

/// Default capacity of `AILB_PREFIX`, in entries (blocks of all models together), set at load
/// from `[limits] prefix_entries`.
pub const DEFAULT_PREFIX_ENTRIES: u32 = 262_144;
/// Largest `AILB_PREFIX` the daemon accepts.
pub const MAX_PREFIX_ENTRIES: u32 = 16 * 1024 * 1024;

/// [`PrefixHolders::seen`] of a holder the daemon wrote from its engine's KV events: exact
/// until the engine reports the block removed, never aged.
pub const PREFIX_SEEN_EXACT: u32 = u32::MAX;

/// The model's prefix entries are learnt from its picks (approximate mode).
pub const MODEL_PREFIX_LEARN: u32 = 2;
/// The model's prefix entries come from its engines' KV events (precise mode).
pub const MODEL_PREFIX_EVENTS: u32 = 4;

/// The shift of [`prefix_tick`]: ticks of 2^26 ns, 67.1 ms.
pub const PREFIX_TICK_SHIFT: u32 = 26;

/// The clock of [`PrefixHolders::seen`]: `bpf_ktime_get_ns() >> 26`, ticks of 67.1 ms. A
/// 32-bit tick wraps after 9.1 years of uptime (the comparisons wrap too, and the daemon's
/// sweep removes entries long before), and it halves the entry against a 64-bit stamp. The
/// tick is this fine because the lifetime is set from how fast the engines' caches turn over
/// (the fill-time rule in the daemon's policy), which on a small, busy fleet is seconds, and
/// the holder recorded most recently is preferred among those that can take a request.
#[inline(always)]
pub const fn prefix_tick(now_ns: u64) -> u32 {
    (now_ns >> PREFIX_TICK_SHIFT) as u32
}

/// A lifetime in ns as [`prefix_tick`] ticks, rounded up; 0 (no lifetime) stays 0.
#[inline(always)]
pub const fn prefix_ttl_ticks(ttl_ns: u64) -> u32 {
    let t = ttl_ns.div_ceil(1 << PREFIX_TICK_SHIFT);
    if t > u32::MAX as u64 {
        u32::MAX
    } else {
        t as u32
    }
}

/// `AILB_PREFIX` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    pub model: u32,
    pub _pad: u32,
    /// A block key ([`crate::prefix`]); never 0.
    pub key: u64,
}

/// `AILB_PREFIX` value: the backends that hold the block (and so its whole prefix).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixHolders {
    /// Backend ids; [`NO_BACKEND`] in an empty slot.
    pub ids: [u32; PREFIX_HOLDERS],
    /// When each was recorded ([`prefix_tick`]), or [`PREFIX_SEEN_EXACT`].
    pub seen: [u32; PREFIX_HOLDERS],
}

impl Default for PrefixHolders {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl PrefixHolders {
    pub const EMPTY: Self = Self { ids: [NO_BACKEND; PREFIX_HOLDERS], seen: [0; PREFIX_HOLDERS] };

    /// Whether holder slot `i` counts at tick `now` with lifetime `ttl` ticks (0: no lifetime).
    #[inline(always)]
    pub fn fresh(&self, i: usize, now: u32, ttl: u32) -> bool {
        let seen = self.seen[i];
        self.ids[i] != NO_BACKEND && (seen == PREFIX_SEEN_EXACT || ttl == 0 || now.wrapping_sub(seen) <= ttl)
    }

    /// Whether some slot names a holder that counts at tick `now` ([`Self::fresh`]).
    #[inline(always)]
    pub fn any_fresh(&self, now: u32, ttl: u32) -> bool {
        let mut i = 0;
        while i < PREFIX_HOLDERS {
            if self.fresh(i, now, ttl) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The slots worth reading: one past the last that names a backend. Slots fill from the
    /// first, so this is the number of holders unless a removed one left a gap.
    #[inline(always)]
    pub fn slots(&self) -> usize {
        let mut n = PREFIX_HOLDERS;
        while n > 0 && self.ids[n - 1] == NO_BACKEND {
            n -= 1;
        }
        n
    }

    /// Records `id` at tick `seen`: its own slot refreshed, else the first empty or expired
    /// slot, else (all taken by fresh holders) the slot `(id + seen) % PREFIX_HOLDERS`
    /// unless that one is exact (an exact holder is replaced only by another exact one, and
    /// never displaced when every slot is exact). Returns whether anything changed.
    ///
    /// Three plain passes, each carrying nothing but its index: the kernel runs this per key a
    /// connect learns, and a pass that tracked the oldest slot gave the verifier a state per
    /// combination of indices.
    pub fn record(&mut self, id: u32, seen: u32, now: u32, ttl: u32) -> bool {
        let mut i = 0;
        while i < PREFIX_HOLDERS {
            if self.ids[i] == id {
                let old = self.seen[i];
                if old == seen || (old == PREFIX_SEEN_EXACT && seen != PREFIX_SEEN_EXACT) {
                    return false;
                }
                self.seen[i] = seen;
                return true;
            }
            i += 1;
        }
        let mut i = 0;
        while i < PREFIX_HOLDERS {
            if !self.fresh(i, now, ttl) {
                self.ids[i] = id;
                self.seen[i] = seen;
                return true;
            }
            i += 1;
        }
        let slot = (id.wrapping_add(seen) as usize) % PREFIX_HOLDERS;
        if self.seen[slot] == PREFIX_SEEN_EXACT && seen != PREFIX_SEEN_EXACT {
            return false;
        }
        if self.seen[slot] == PREFIX_SEEN_EXACT {
            // Every holder named exact by the engines: the block is held by more backends
            // than an entry names; the first ones written stay.
            return false;
        }
        self.ids[slot] = id;
        self.seen[slot] = seen;
        true
    }

    /// Whether slot `i` names a holder whose engine reports the block held
    /// ([`PREFIX_SEEN_EXACT`]).
    #[inline(always)]
    pub fn exact(&self, i: usize) -> bool {
        self.ids[i] != NO_BACKEND && self.seen[i] == PREFIX_SEEN_EXACT
    }

    /// Marks `id`, an exact holder, evicted at tick `tick` ([`prefix_tick`]): from then on it
    /// counts as a holder only for the model's lifetime, as a learnt one does. Returns whether
    /// `id` was an exact holder.
    ///
    /// Why keep it at all: a small pool evicts a tenant's prompt while the tenant's next
    /// requests are still on their way. Removed at once, the tenant's next request went
    /// wherever what was left of its prompt was, and the tenants mixed on every backend, each
    /// evicting the others'; kept, the tenant goes back to the backend whose running requests
    /// share its prompt, as approximate mode's learnt entries keep it.
    pub fn evict(&mut self, id: u32, tick: u32) -> bool {
        // A tick never reads as exact (it would take 9.1 years of uptime).
        let tick = if tick == PREFIX_SEEN_EXACT { PREFIX_SEEN_EXACT - 1 } else { tick };
        let mut found = false;
        let mut i = 0;
        while i < PREFIX_HOLDERS {
            if self.ids[i] == id && self.seen[i] == PREFIX_SEEN_EXACT {
                self.seen[i] = tick;
                found = true;
            }
            i += 1;
        }
        found
    }

    /// Removes `id`; returns whether it was there.
    pub fn remove(&mut self, id: u32) -> bool {
        let mut found = false;
        let mut i = 0;
        while i < PREFIX_HOLDERS {
            if self.ids[i] == id {
                self.ids[i] = NO_BACKEND;
                self.seen[i] = 0;
                found = true;
            }
            i += 1;
        }
        found
    }

    /// Whether no slot names a backend.
    pub fn is_empty(&self) -> bool {
        self.ids.iter().all(|&id| id == NO_BACKEND)
    }
}

/// `AILB_SOCK_PREFIX` (sk_storage) value: the keys of the socket's [`AILB_PREFIX`] option.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockPrefix {
    /// Keys in `keys[..count]`, `count <= PREFIX_KEYS_MAX`.
    pub count: u32,
    pub _pad: u32,
    pub keys: [u64; crate::prefix::PREFIX_KEYS_MAX],
}

/// `AILB_PREFIX_STATS` value (per-CPU, indexed by model): what the prefix search did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct PrefixStats {
    /// Picks of connects that carried keys, for a model with a prefix mode.
    pub lookups: u64,
    /// Of those, the ones where some live backend held at least the first key sent.
    pub found: u64,
    /// Keys sent, summed over the lookups.
    pub keys_sent: u64,
    /// Keys found held (the longest held prefix, in keys sent), summed over the lookups.
    pub keys_found: u64,
    /// Of `keys_found`, those of the lookups whose longest prefix an engine reports held now
    /// (an exact holder, precise mode); the rest were found through learnt or evicted holders.
    pub keys_exact: u64,
    /// A holder of the longest prefix was taken.
    pub used: u64,
    /// Every holder was at its load bound or cap: the pick went on without the prefix.
    pub overruled_load: u64,
    /// Every holder under its bound could not hold the request's memory, even idle.
    pub overruled_memory: u64,
    /// Keys recorded for the chosen backend (approximate mode).
    pub learned: u64,
    /// Lookups in the prefix map by the searches: with the filter ([`FilterLine`]), one per
    /// search that found some key may be held, plus one per key that tested positive
    /// without being held.
    pub map_lookups: u64,
}

impl PrefixStats {
    /// Adds another CPU's counters.
    pub fn merge(&mut self, o: &Self) {
        self.lookups += o.lookups;
        self.found += o.found;
        self.keys_sent += o.keys_sent;
        self.keys_found += o.keys_found;
        self.keys_exact += o.keys_exact;
        self.used += o.used;
        self.overruled_load += o.overruled_load;
        self.overruled_memory += o.overruled_memory;
        self.learned += o.learned;
        self.map_lookups += o.map_lookups;
    }
}

/// Words in one [`FilterLine`]: 512 bits, one cache line.
pub const FILTER_LINE_WORDS: usize = 8;
/// Bits a key sets in its line of `AILB_PREFIX_FILTER`.
pub const FILTER_KEY_BITS: usize = 3;
/// Filter bits per prefix-map entry: with 3 bits per key in 512-bit lines, about 1.1 % of keys
/// never stored test positive while the map is full (keys spread over lines as Poisson
/// draws), and fewer while it fills.
pub const FILTER_BITS_PER_ENTRY: u64 = 12;

/// One entry of `AILB_PREFIX_FILTER`, a blocked Bloom filter over the keys of `AILB_PREFIX`.
///
/// Why: a lookup in a big `AILB_PREFIX` is likely a cache and TLB miss (about 300 ns on the CI
/// machine), and the search probes up to 8 keys per connect. The filter takes 1.5 bytes per map
/// entry and generation (3 in all), a key's bits all in one line, so the search probes it
/// instead, then looks up only the key where the held run seems to end; only a key that tests
/// positive without being held costs more lookups.
///
/// Entry 0 is the header ([`FilterLine::header`]): the lines per generation (0: no filter,
/// every key may be held) and the generation the search reads. Line `i` of generation `g`
/// is entry `1 + g * lines + i`. Every writer sets a key's bits in both generations (the
/// kernel when a connect learns a key, the daemon when an engine reports a block stored),
/// so the filter never misses a key the map holds. Bits are not cleared where the search
/// reads: the daemon rebuilds the other generation from the map's keys and then makes it
/// the current one, so that keys the map evicted or removed stop testing positive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterLine {
    pub words: [u64; FILTER_LINE_WORDS],
}

impl FilterLine {
    /// The header: `lines` per generation, generation `current` (0 or 1) read.
    pub const fn header(lines: u32, current: u32) -> Self {
        let mut words = [0; FILTER_LINE_WORDS];
        words[0] = lines as u64;
        words[1] = (current & 1) as u64;
        Self { words }
    }

    /// Whether every bit of `p` is set.
    #[inline(always)]
    pub fn holds(&self, p: &FilterProbe) -> bool {
        let mut j = 0;
        while j < FILTER_KEY_BITS {
            if self.words[p.word[j] as usize & (FILTER_LINE_WORDS - 1)] & p.mask[j] == 0 {
                return false;
            }
            j += 1;
        }
        true
    }

    /// Sets every bit of `p`.
    pub fn add(&mut self, p: &FilterProbe) {
        for j in 0..FILTER_KEY_BITS {
            self.words[p.word[j] as usize & (FILTER_LINE_WORDS - 1)] |= p.mask[j];
        }
    }
}

/// Where key `key` of `model` is in `AILB_PREFIX_FILTER`: the line within a generation, and
/// the word and mask of each of its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterProbe {
    pub line: u32,
    pub word: [u8; FILTER_KEY_BITS],
    pub mask: [u64; FILTER_KEY_BITS],
}

impl FilterProbe {
    /// The probe of `key` of `model` in generations of `lines` lines (`lines > 0`). Block keys
    /// are hashes already; the model is mixed in and the result scrambled once more, so that
    /// the line (the high half) and the bits (the low 27 bits) are independent.
    #[inline(always)]
    pub const fn new(model: u32, key: u64, lines: u32) -> Self {
        let mut h = key ^ (model as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        let line = (((h >> 32) * lines as u64) >> 32) as u32;
        let mut word = [0u8; FILTER_KEY_BITS];
        let mut mask = [0u64; FILTER_KEY_BITS];
        let mut j = 0;
        while j < FILTER_KEY_BITS {
            let bit = (h >> (9 * j)) & 511;
            word[j] = (bit >> 6) as u8;
            mask[j] = 1 << (bit & 63);
            j += 1;
        }
        Self { line, word, mask }
    }

    /// Its entry in generation `generation` of a filter of `lines` lines per generation.
    #[inline(always)]
    pub const fn entry(&self, lines: u32, generation: u32) -> u32 {
        1 + (generation & 1) * lines + self.line
    }
}

/// Lines per generation of the filter for a prefix map of `prefix_entries` entries.
pub const fn filter_lines(prefix_entries: u32) -> u32 {
    (prefix_entries as u64 * FILTER_BITS_PER_ENTRY).div_ceil(FILTER_LINE_WORDS as u64 * 64) as u32
}

/// Entries of `AILB_PREFIX_FILTER` for `lines` lines per generation: the header and two
/// generations.
pub const fn filter_entries(lines: u32) -> u32 {
    1 + 2 * lines
}

/// Default `AILB_PREFIX_FILTER` size (the daemon sets it at load from `[limits]
/// prefix_entries`).
pub const DEFAULT_FILTER_ENTRIES: u32 = filter_entries(filter_lines(DEFAULT_PREFIX_ENTRIES));
