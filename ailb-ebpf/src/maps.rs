//! The maps (names and types: `ailb_common::abi::maps` and the ABI notes) and their
//! accessors shared by the programs.

use core::{
    ffi::c_void,
    intrinsics::{atomic_or, atomic_xadd, AtomicOrdering},
    ptr::{self, addr_of, addr_of_mut},
};

use ailb_common::{
    abi::*,
    pick::{Choose, PrefixCtx, Search},
    prefix::PREFIX_KEYS_MAX,
};
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_SK_STORAGE_GET_F_CREATE},
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, SkStorage},
    helpers::generated::{bpf_ktime_get_ns, bpf_sk_storage_get},
    macros::btf_map,
};

/// Chunks of the table and member arenas in the object; the daemon sets the real numbers at
/// load from `[limits]` (`EbpfLoader::set_max_entries`).
const TABLE_CHUNKS: usize = (DEFAULT_TABLE_SLOTS / TABLE_CHUNK) as usize;
const MEMBER_CHUNKS: usize = (DEFAULT_MEMBER_SLOTS / MEMBER_CHUNK) as usize;

#[btf_map]
pub(crate) static AILB_SERVICES: HashMap<ServiceKey, Service, { MAX_SERVICES as usize }> = HashMap::new();
#[btf_map]
pub(crate) static AILB_SERVICES6: HashMap<ServiceKey6, Service, { MAX_SERVICES as usize }> = HashMap::new();
#[btf_map]
pub(crate) static AILB_BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_BACKEND_ADDRS6: Array<BackendAddr6, { MAX_BACKENDS as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_MODELS: Array<ModelState, { MAX_MODELS as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_TABLES: Array<TableChunk, TABLE_CHUNKS> = Array::new();
#[btf_map]
pub(crate) static AILB_MEMBERS: Array<MemberChunk, MEMBER_CHUNKS> = Array::new();
#[btf_map]
pub(crate) static AILB_MODEL_NAMES: HashMap<u64, u32, { MAX_MODELS as usize }> = HashMap::new();
#[btf_map]
pub(crate) static AILB_AFFINITY: LruHashMap<AffinityKey, AffinityValue, { MAX_AFFINITY as usize }> = LruHashMap::new();
#[btf_map]
pub(crate) static AILB_SOCK: SkStorage<SockState> = SkStorage::new();
#[btf_map]
pub(crate) static AILB_INFLIGHT: Array<u64, { INFLIGHT_ENTRIES as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_STATS: PerCpuArray<Stats, 1> = PerCpuArray::new();
#[btf_map]
pub(crate) static AILB_BACKEND_STATS: PerCpuArray<BackendStats, { MAX_BACKENDS as usize }> = PerCpuArray::new();
#[btf_map]
pub(crate) static AILB_CONFIG: Array<GlobalConfig, 1> = Array::new();
/// The daemon sets the real capacity at load from `[limits] prefix_entries`.
#[btf_map]
pub(crate) static AILB_PREFIX: LruHashMap<PrefixKey, PrefixHolders, { DEFAULT_PREFIX_ENTRIES as usize }> =
    LruHashMap::new();
#[btf_map]
pub(crate) static AILB_SOCK_PREFIX: SkStorage<SockPrefix> = SkStorage::new();
/// Mmapable, so that the daemon sets and clears bits with atomic operations of its own rather
/// than a read and a write that could lose the kernel's bits set between them.
#[btf_map]
pub(crate) static AILB_PREFIX_FILTER: Array<
    FilterLine,
    { DEFAULT_FILTER_ENTRIES as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();
/// A CPU's prefix keys and prefix step state ([`PrefixScratch`]).
#[btf_map]
pub(crate) static AILB_PREFIX_SCRATCH: PerCpuArray<PrefixScratch, 1> = PerCpuArray::new();
#[btf_map]
pub(crate) static AILB_PREFIX_STATS: PerCpuArray<PrefixStats, { MAX_MODELS as usize }> = PerCpuArray::new();

/// This CPU's prefix scratch slot (`AILB_PREFIX_SCRATCH`): the keys of the connect being
/// picked or learnt, and the prefix step's loop state.
///
/// The step's loops keep their state here rather than on the stack: a value read from a map
/// is unknown to the verifier, so each `bpf_loop` callback is verified for one state instead
/// of once per combination of search bounds and choices, which took the connect program past
/// the verifier's million-instruction budget. The price: a connect preempted on this CPU by
/// another that uses the slot could finish its step with the other's state. That can only
/// make it choose another request's holder, which the pick then checks (a live member of its
/// own model), or learn another request's keys (an approximate entry, aged out like others).
pub(crate) struct PrefixScratch {
    pub(crate) keys: [u64; PREFIX_KEYS_MAX],
    pub(crate) count: u32,
    pub(crate) c: PrefixCtx,
    pub(crate) search: Search,
    /// The entry of the last key the search found held (in the end, the longest prefix's),
    /// copied for the choice's callbacks, and its slots worth reading
    /// ([`PrefixHolders::slots`]).
    pub(crate) holders: PrefixHolders,
    pub(crate) slots: u32,
    pub(crate) choose: Choose,
    /// Lookups in the map by this search (`PrefixStats::map_lookups`).
    pub(crate) map_lookups: u32,
}

/// The current CPU's global counters.
#[inline(always)]
pub(crate) fn stats() -> Option<&'static mut Stats> {
    // SAFETY: a per-CPU array slot is only touched by the program running on this CPU
    // (BPF programs run with migration disabled); the pointer is valid for the whole run.
    AILB_STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The current CPU's counters for `backend`.
#[inline(always)]
pub(crate) fn backend_stats(backend: u32) -> Option<&'static mut BackendStats> {
    if backend >= MAX_BACKENDS {
        return None;
    }
    // SAFETY: as in `stats`: a per-CPU slot, valid for the program run.
    AILB_BACKEND_STATS.get_ptr_mut(backend).map(|p| unsafe { &mut *p })
}

/// The IPv6 address of backend `id` (meaningful when its state has `BACKEND_IPV6`).
#[inline(always)]
pub(crate) fn backend_addr6(id: u32) -> Option<[u32; 4]> {
    if id >= MAX_BACKENDS {
        return None;
    }
    // SAFETY: a non-null array map value pointer of the right type; copied at once.
    AILB_BACKEND_ADDRS6.get_ptr(id).map(|p| unsafe { ptr::read(p) }.addr)
}

/// `AILB_INFLIGHT[index]`, 0 when out of range.
#[inline(always)]
pub(crate) fn inflight_read(index: u32) -> u64 {
    match AILB_INFLIGHT.get_ptr(index) {
        // SAFETY: an aligned u64 in an array map value; a 64-bit load is atomic on BPF.
        Some(p) => unsafe { ptr::read_volatile(p) },
        None => 0,
    }
}

/// Atomically adds `delta` (two's complement) to `AILB_INFLIGHT[index]`.
#[inline(always)]
pub(crate) fn inflight_add(index: u32, delta: u64) {
    if index >= INFLIGHT_ENTRIES {
        return;
    }
    if let Some(p) = AILB_INFLIGHT.get_ptr_mut(index) {
        // SAFETY: `p` points to an 8-byte aligned u64 inside the array map value that lives
        // as long as the map; every writer (this program on other CPUs, userspace) uses
        // atomic accesses. The result is unused, so this compiles to a BPF atomic add.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta) };
    }
}

/// The model's round-robin turn counter, then incremented (`AILB_INFLIGHT`).
#[inline(always)]
pub(crate) fn turn_take(model: u32) -> u64 {
    let index = INFLIGHT_TURN_BASE + model;
    if index >= INFLIGHT_ENTRIES {
        return 0;
    }
    match AILB_INFLIGHT.get_ptr_mut(index) {
        // SAFETY: as in `inflight_add`. A read, then an atomic add: the fetching form of the
        // add needs BPF CPU v3 and this object is built for the generic CPU, so two connects
        // racing on two CPUs may share a turn (a baseline can live with that; sequential
        // connects take the members strictly in turn).
        Some(p) => unsafe {
            let turn = ptr::read_volatile(p);
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1);
            turn
        },
        None => 0,
    }
}

/// This socket's `AILB_SOCK` entry; with `create`, created (zeroed) when absent. `None` when
/// absent (without `create`) or when the kernel cannot allocate it.
///
/// # Safety
/// `sk` must be a full socket of the program's context (PTR_TO_SOCKET), not NULL.
#[inline(always)]
pub(crate) unsafe fn sock_state(sk: *mut c_void, create: bool) -> Option<&'static mut SockState> {
    let flags = if create { BPF_SK_STORAGE_GET_F_CREATE.into() } else { 0 };
    // SAFETY: the map pointer is the address of the BTF map definition, which the loader
    // relocates to the map; `sk` is valid per this function's contract.
    let p = unsafe { bpf_sk_storage_get(addr_of!(AILB_SOCK) as *mut c_void, sk, ptr::null_mut(), flags) }
        .cast::<SockState>();
    // SAFETY: a non-null sk_storage value of this socket, valid for the program run; only this
    // socket's hooks touch it and they run under the socket lock.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// Counts `sock` in flight at its backend and model (with its memory hint), once.
#[inline(always)]
pub(crate) fn recount(sock: &mut SockState) {
    if sock.flags & SOCK_COUNTED != 0 || sock.backend >= MAX_BACKENDS || sock.model >= MAX_MODELS {
        return;
    }
    inflight_add(sock.backend, 1);
    inflight_add(INFLIGHT_MODEL_BASE + sock.model, 1);
    let mem = if sock.flags & SOCK_HAS_MEMORY != 0 { sock.required_mem_mb } else { 0 };
    if mem != 0 {
        inflight_add(INFLIGHT_MEM_BASE + sock.backend, mem as u64);
    }
    sock.counted_mem_mb = mem;
    sock.flags |= SOCK_COUNTED;
}

/// The conversation's affinity entry counts its age from now (a close, or the connection
/// marked idle): its prefix was cached on the backend when the answer ended, not when the
/// request began (`GlobalConfig::affinity_wait_ns`, the TTL).
#[inline(always)]
pub(crate) fn refresh_affinity(model: u32, conversation: u64, backend: u32) {
    let key = AffinityKey { model, space: AFFINITY_SPACE_CONVERSATION, conversation };
    if let Some(p) = AILB_AFFINITY.get_ptr_mut(key) {
        // SAFETY: a non-null LRU hash value pointer, valid for this run (RCU); a racing
        // writer can only make the entry another recent value.
        unsafe {
            if (*p).backend == backend {
                (*p).last_seen_ns = bpf_ktime_get_ns();
            }
        }
    }
}

/// Removes a counted socket from the backend and model in-flight counters.
#[inline(always)]
pub(crate) fn uncount(sock: &mut SockState) {
    if sock.flags & SOCK_COUNTED == 0 {
        return;
    }
    sock.flags &= !SOCK_COUNTED;
    if sock.backend < MAX_BACKENDS && sock.model < MAX_MODELS {
        inflight_add(sock.backend, u64::MAX);
        inflight_add(INFLIGHT_MODEL_BASE + sock.model, u64::MAX);
        if sock.counted_mem_mb != 0 {
            inflight_add(INFLIGHT_MEM_BASE + sock.backend, (sock.counted_mem_mb as u64).wrapping_neg());
        }
    }
    sock.counted_mem_mb = 0;
}

/// The filter's header: lines per generation and the generation read; `None` when the
/// filter is off (no lines).
#[inline(always)]
fn filter_header() -> Option<(u32, u32)> {
    let h = AILB_PREFIX_FILTER.get_ptr(0)?;
    // SAFETY: a non-null array map value pointer; aligned u64 loads are atomic on BPF.
    let (lines, current) =
        unsafe { (ptr::read_volatile(addr_of!((*h).words[0])), ptr::read_volatile(addr_of!((*h).words[1]))) };
    if lines == 0 || lines > u32::MAX as u64 / 2 {
        return None;
    }
    Some((lines as u32, current as u32 & 1))
}

/// Whether block `key` of `model` may be in `AILB_PREFIX` (`AILB_PREFIX_FILTER`); true when
/// the filter is off.
#[inline(always)]
pub(crate) fn prefix_maybe_held(model: u32, key: u64) -> bool {
    let Some((lines, current)) = filter_header() else {
        return true;
    };
    let p = FilterProbe::new(model, key, lines);
    match AILB_PREFIX_FILTER.get_ptr(p.entry(lines, current)) {
        // SAFETY: a non-null array map value pointer; bits only ever get set while the search
        // reads a generation, so a torn read can only miss a bit set meanwhile.
        Some(l) => unsafe { &*l }.holds(&p),
        None => true,
    }
}

/// Sets block `key` of `model`'s bits in both generations of `AILB_PREFIX_FILTER`.
#[inline(always)]
pub(crate) fn prefix_filter_add(model: u32, key: u64) {
    let Some((lines, _)) = filter_header() else {
        return;
    };
    let p = FilterProbe::new(model, key, lines);
    let mut g = 0;
    while g < 2 {
        if let Some(l) = AILB_PREFIX_FILTER.get_ptr_mut(p.entry(lines, g)) {
            let mut j = 0;
            while j < FILTER_KEY_BITS {
                // SAFETY: an aligned u64 of an array map value; every writer (this program on
                // other CPUs, the daemon through its mapping) sets bits atomically. Read
                // first: a line whose bits are set already is not written (not dirtied in
                // other CPUs' caches).
                unsafe {
                    let w = addr_of_mut!((*l).words).cast::<u64>().add(p.word[j] as usize & (FILTER_LINE_WORDS - 1));
                    if ptr::read_volatile(w) & p.mask[j] == 0 {
                        atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(w, p.mask[j]);
                    }
                }
                j += 1;
            }
        }
        g += 1;
    }
}
