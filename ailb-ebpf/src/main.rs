//! ailb eBPF programs.
//!
//! * `ailb_connect4` (`cgroup/connect4`): a TCP connect to a VIP in `AILB_SERVICES` is
//!   rewritten to the backend that [`ailb_common::pick::pick`] chooses (conversation
//!   affinity, bounded-load weighted Maglev, least-loaded fallback), or refused with
//!   `ECONNREFUSED` when the model has no live backend / none fits the memory hint.
//! * `ailb_setsockopt` (`cgroup/setsockopt`): consumes `SOL_AILB` options (conversation id,
//!   required GPU memory, model name) into the socket's `AILB_SOCK` storage.
//! * `ailb_sockops` (`sockops`): keeps the in-flight counters (`AILB_INFLIGHT`: connections per
//!   backend and model, and the memory hints per backend) exact from
//!   `TCP_CONNECT_CB` to the socket's `TCP_CLOSE`, and counts established / closed /
//!   failed connections and RTT samples.
//!
//! Every array index is checked against its bound before use (the verifier needs it and a
//! corrupt map value must not turn into an out-of-range access).
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd`: the bpf target has no `target_has_atomic = "64"`, so
// `AtomicU64::fetch_add` does not exist there; the intrinsic lowers to a BPF atomic add.
#![expect(internal_features, reason = "core_intrinsics: the only 64-bit atomic add on the bpf target")]
#![feature(core_intrinsics)]

use core::{
    ffi::c_void,
    intrinsics::{atomic_xadd, AtomicOrdering},
    ptr::{self, addr_of},
};

use ailb_common::{
    abi::*,
    hash::{fmix64, ConversationHasher},
    pick::{pick, MemberScan, Outcome, PickMaps, PickRequest},
};
use aya_ebpf::{
    bindings::{
        bpf_sock_ops, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB,
        BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE, BPF_TCP_CLOSE_WAIT, BPF_TCP_FIN_WAIT1,
        BPF_TCP_LAST_ACK, BPF_TCP_SYN_SENT,
    },
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, SkStorage},
    helpers::generated::{
        bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_loop, bpf_set_retval, bpf_sk_storage_get,
        bpf_sock_ops_cb_flags_set,
    },
    macros::{btf_map, cgroup_sock_addr, cgroup_sockopt, sock_ops},
    programs::{SockAddrContext, SockOpsContext, SockoptContext},
};

// ---------------------------------------------------------------------------------------
// Maps (names and types: ailb_common::abi::maps and the ABI notes).
// ---------------------------------------------------------------------------------------

const MODEL_ROWS: usize = (MAX_MODELS * 2) as usize;

#[btf_map]
static AILB_SERVICES: HashMap<ServiceKey, Service, { MAX_SERVICES as usize }> = HashMap::new();
#[btf_map]
static AILB_BACKENDS: Array<Backend, { MAX_BACKENDS as usize }> = Array::new();
#[btf_map]
static AILB_MODELS: Array<ModelState, { MAX_MODELS as usize }> = Array::new();
#[btf_map]
static AILB_TABLES: Array<TableRow, MODEL_ROWS> = Array::new();
#[btf_map]
static AILB_MEMBERS: Array<MemberRow, MODEL_ROWS> = Array::new();
#[btf_map]
static AILB_MODEL_NAMES: HashMap<u64, u32, { MAX_MODELS as usize }> = HashMap::new();
#[btf_map]
static AILB_AFFINITY: LruHashMap<AffinityKey, AffinityValue, { MAX_AFFINITY as usize }> = LruHashMap::new();
#[btf_map]
static AILB_SOCK: SkStorage<SockState> = SkStorage::new();
#[btf_map]
static AILB_INFLIGHT: Array<u64, { INFLIGHT_ENTRIES as usize }> = Array::new();
#[btf_map]
static AILB_STATS: PerCpuArray<Stats, 1> = PerCpuArray::new();
#[btf_map]
static AILB_BACKEND_STATS: PerCpuArray<BackendStats, { MAX_BACKENDS as usize }> = PerCpuArray::new();
#[btf_map]
static AILB_CONFIG: Array<GlobalConfig, 1> = Array::new();

// Kernel constants (uapi) not worth a dependency.
const AF_INET: u32 = 2;
const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;
const ENOPROTOOPT: i32 = 92;
const ECONNREFUSED: i32 = 111;

/// Program verdicts for cgroup hooks.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;

// ---------------------------------------------------------------------------------------
// Small helpers.
// ---------------------------------------------------------------------------------------

/// The current CPU's global counters.
#[inline(always)]
fn stats() -> Option<&'static mut Stats> {
    // SAFETY: a per-CPU array slot is only touched by the program running on this CPU
    // (BPF programs run with migration disabled); the pointer is valid for the whole run.
    AILB_STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The current CPU's counters for `backend`.
#[inline(always)]
fn backend_stats(backend: u32) -> Option<&'static mut BackendStats> {
    if backend >= MAX_BACKENDS {
        return None;
    }
    // SAFETY: as in `stats`: a per-CPU slot, valid for the program run.
    AILB_BACKEND_STATS.get_ptr_mut(backend).map(|p| unsafe { &mut *p })
}

/// Atomically adds `delta` (two's complement) to `AILB_INFLIGHT[index]`.
#[inline(always)]
fn inflight_add(index: u32, delta: u64) {
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
fn turn_take(model: u32) -> u64 {
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

/// This socket's `AILB_SOCK` entry, created (zeroed) when absent; `None` when the kernel
/// cannot allocate it.
///
/// # Safety
/// `sk` must be the program context's full socket (PTR_TO_SOCKET).
#[inline(always)]
unsafe fn sock_state_create(sk: *mut c_void) -> Option<&'static mut SockState> {
    // SAFETY: the map pointer is the address of the BTF map definition, which the loader
    // relocates to the map; `sk` is valid per this function's contract.
    let p = unsafe {
        bpf_sk_storage_get(addr_of!(AILB_SOCK) as *mut c_void, sk, ptr::null_mut(), BPF_SK_STORAGE_GET_F_CREATE.into())
    }
    .cast::<SockState>();
    // SAFETY: a non-null sk_storage value of this socket, valid for the program run; only this
    // socket's hooks touch it and they run under the socket lock.
    (!p.is_null()).then(|| unsafe { &mut *p })
}

/// Removes a counted socket from the backend and model in-flight counters.
#[inline(always)]
fn uncount(sock: &mut SockState) {
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

/// Sets the errno the failing syscall returns (`-errno`), then the verdict is `REJECT`.
#[inline(always)]
fn refuse(errno: i32) -> i32 {
    // SAFETY: bpf_set_retval takes a plain integer; it is available to cgroup sock_addr and
    // sockopt programs (kernel >= 5.19). The return value (always 0) is not needed.
    unsafe { bpf_set_retval(-errno) };
    REJECT
}

// ---------------------------------------------------------------------------------------
// The pick's map access.
// ---------------------------------------------------------------------------------------

struct Maps;

impl PickMaps for Maps {
    #[inline(always)]
    fn backend(&self, id: u32) -> Option<Backend> {
        if id >= MAX_BACKENDS {
            return None;
        }
        // SAFETY: a non-null array map value pointer of the right type; a plain copy (a
        // concurrent userspace update may tear it, which the pick tolerates).
        AILB_BACKENDS.get_ptr(id).map(|p| unsafe { ptr::read(p) })
    }

    #[inline(always)]
    fn inflight(&self, id: u32) -> u64 {
        if id >= MAX_BACKENDS {
            return 0;
        }
        match AILB_INFLIGHT.get_ptr(id) {
            // SAFETY: an aligned u64 in an array map value; a 64-bit load is atomic on BPF.
            Some(p) => unsafe { ptr::read_volatile(p) },
            None => 0,
        }
    }

    #[inline(always)]
    fn inflight_mem(&self, id: u32) -> u64 {
        if id >= MAX_BACKENDS {
            return 0;
        }
        match AILB_INFLIGHT.get_ptr(INFLIGHT_MEM_BASE + id) {
            // SAFETY: as in `inflight`.
            Some(p) => unsafe { ptr::read_volatile(p) },
            None => 0,
        }
    }

    #[inline(always)]
    fn table_entry(&self, row: u32, index: u32) -> Option<u32> {
        if row >= MAX_MODELS * 2 || index >= MAX_TABLE_SIZE {
            return None;
        }
        let p = AILB_TABLES.get_ptr(row)?;
        // SAFETY: `p` is a valid TableRow in the map and `index < MAX_TABLE_SIZE` (its length),
        // so the element pointer is in bounds.
        Some(unsafe { ptr::read(addr_of!((*p).slots).cast::<u32>().add(index as usize)) })
    }

    #[inline(always)]
    fn member(&self, row: u32, index: u32) -> Option<u32> {
        if row >= MAX_MODELS * 2 || index >= MAX_MEMBERS {
            return None;
        }
        let p = AILB_MEMBERS.get_ptr(row)?;
        // SAFETY: `p` is a valid MemberRow in the map and `index < MAX_MEMBERS` (its length).
        Some(unsafe { ptr::read(addr_of!((*p).ids).cast::<u32>().add(index as usize)) })
    }

    /// The least-loaded scan through `bpf_loop`: the callback is verified once, where a
    /// 1024-iteration inline loop exceeds the verifier's 1M-instruction budget.
    #[inline(always)]
    fn scan_members(&self, row: u32, members: u32, required_mem_mb: u32) -> MemberScan {
        let mut ctx = ScanCtx { scan: MemberScan::new(), row, required_mem_mb };
        let n = if members > MAX_MEMBERS { MAX_MEMBERS } else { members };
        // SAFETY: `scan_member` has the callback signature bpf_loop expects and only uses
        // its context as the `ScanCtx` passed here, which outlives the call.
        unsafe {
            bpf_loop(n, scan_member as *mut c_void, ptr::from_mut(&mut ctx).cast(), 0);
        }
        ctx.scan
    }
}

/// `bpf_loop` context of [`Maps::scan_members`].
struct ScanCtx {
    scan: MemberScan,
    row: u32,
    required_mem_mb: u32,
}

/// `bpf_loop` callback: member `index` of the scan. Returns 0 to continue, 1 to stop.
#[inline(never)]
extern "C" fn scan_member(index: u64, ctx: *mut c_void) -> i64 {
    if index >= MAX_MEMBERS as u64 {
        return 1;
    }
    // SAFETY: bpf_loop passes back the `ScanCtx` pointer given in `scan_members` (on the
    // caller's stack, alive for the whole loop).
    let ctx = unsafe { &mut *ctx.cast::<ScanCtx>() };
    ctx.scan.step(&Maps, ctx.row, index as u32, ctx.required_mem_mb);
    0
}

// ---------------------------------------------------------------------------------------
// cgroup/connect4
// ---------------------------------------------------------------------------------------

#[cgroup_sock_addr(connect4)]
pub fn ailb_connect4(ctx: SockAddrContext) -> i32 {
    try_connect4(&ctx)
}

#[inline(always)]
fn try_connect4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr context for the whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    if sa.user_family != AF_INET || sa.type_ != SOCK_STREAM || sa.protocol != IPPROTO_TCP {
        return ALLOW;
    }
    let key = ServiceKey { addr: sa.user_ip4, port: sa.user_port as u16, _pad: 0 };
    let Some(service) = AILB_SERVICES.get_ptr(key) else {
        return ALLOW;
    };
    // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
    let service = unsafe { ptr::read(service) };

    // SAFETY: `sk` in bpf_sock_addr is a valid full socket (PTR_TO_SOCKET).
    let Some(sock) = (unsafe { sock_state_create(sa.__bindgen_anon_1.sk.cast()) }) else {
        return refuse(ENOMEM);
    };

    let model = if service.flags & SERVICE_SHARED != 0 {
        if sock.flags & SOCK_HAS_MODEL == 0 {
            return refuse_connect(Outcome::NoBackend);
        }
        match AILB_MODEL_NAMES.get_ptr(sock.model_hash) {
            // SAFETY: a non-null hash map value pointer (u32).
            Some(m) => unsafe { ptr::read(m) },
            None => return refuse_connect(Outcome::NoBackend),
        }
    } else {
        service.model
    };
    if model >= MAX_MODELS {
        return refuse_connect(Outcome::NoBackend);
    }

    let Some(cfg) = AILB_CONFIG.get_ptr(0) else {
        return refuse_connect(Outcome::NoBackend);
    };
    // SAFETY: a non-null array map value pointer; copied.
    let cfg = unsafe { ptr::read(cfg) };
    let Some(state) = AILB_MODELS.get_ptr(model) else {
        return refuse_connect(Outcome::NoBackend);
    };
    // SAFETY: a non-null array map value pointer; copied so that `active` and the slot it
    // selects are read once.
    let state = unsafe { ptr::read(state) };

    let has_conversation = sock.flags & SOCK_HAS_CONVERSATION != 0;
    let hash = if has_conversation {
        sock.conversation
    } else {
        // SAFETY: the helper only reads the context's socket.
        fmix64(unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) })
    };
    let use_affinity = has_conversation && cfg.flags & CONFIG_AFFINITY != 0;
    let aff_key = AffinityKey { model, _pad: 0, conversation: hash };
    let affinity_ptr = if use_affinity { AILB_AFFINITY.get_ptr_mut(aff_key) } else { None };
    // SAFETY: a non-null LRU hash value pointer, valid for this run (RCU); copied at once.
    let affinity = affinity_ptr.map(|p| unsafe { ptr::read(p) });
    let required_mem_mb = if sock.flags & SOCK_HAS_MEMORY != 0 { sock.required_mem_mb } else { 0 };
    // SAFETY: no arguments.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let model_inflight = match AILB_INFLIGHT.get_ptr(INFLIGHT_MODEL_BASE + model) {
        // SAFETY: an aligned u64 in an array map value.
        Some(p) => unsafe { ptr::read_volatile(p) },
        None => 0,
    };
    // Round robin (a baseline): this connect's turn, one atomic fetch-and-add on the model's
    // counter, only when the mode is on and no affinity entry may decide instead.
    let turn = if cfg.flags & CONFIG_ROUND_ROBIN != 0 && affinity.is_none() { turn_take(model) } else { 0 };
    let req = PickRequest { model, hash, has_conversation, required_mem_mb, affinity, now_ns, model_inflight, turn };
    let res = pick(&Maps, &state, &cfg, &req);
    if res.backend == NO_BACKEND || res.backend >= MAX_BACKENDS {
        return refuse_connect(res.outcome);
    }
    let Some(backend) = Maps.backend(res.backend) else {
        return refuse_connect(Outcome::NoBackend);
    };

    sa.user_ip4 = backend.addr;
    sa.user_port = backend.port as u32;

    match (res.outcome, affinity_ptr) {
        // A hit only refreshes the timestamp in place: no map update, no LRU allocation.
        // SAFETY: the value pointer from the lookup above, valid for this run; a racing
        // writer can only make the timestamp another recent value.
        (Outcome::AffinityHit, Some(p)) => unsafe { (*p).last_seen_ns = now_ns },
        _ if use_affinity => {
            let value = AffinityValue { backend: res.backend, _pad: 0, last_seen_ns: now_ns };
            // An LRU map evicts instead of failing when full; a failure only loses affinity.
            let _ = AILB_AFFINITY.insert(aff_key, value, 0);
        }
        _ => {}
    }

    // A socket is only connected once from SS_UNCONNECTED, so it is normally not counted
    // here; if it is, move it off the old backend's counters so they stay exact.
    uncount(sock);
    sock.backend = res.backend;
    sock.model = model;
    sock.flags |= SOCK_PICKED;

    if let Some(s) = stats() {
        s.picks += 1;
        match res.outcome {
            Outcome::AffinityHit => s.affinity_hits += 1,
            Outcome::Spill => s.spills += 1,
            Outcome::Fallback => s.fallbacks += 1,
            _ => {}
        }
        if res.affinity_break {
            s.affinity_breaks += 1;
        }
    }
    if let Some(b) = backend_stats(res.backend) {
        b.picks += 1;
        if res.outcome == Outcome::AffinityHit {
            b.affinity_hits += 1;
        }
    }
    ALLOW
}

/// Counts a refused connect and fails it with `ECONNREFUSED`.
#[inline(always)]
fn refuse_connect(outcome: Outcome) -> i32 {
    if let Some(s) = stats() {
        if outcome == Outcome::NoFit {
            s.no_fit += 1;
        } else {
            s.no_backend += 1;
        }
    }
    refuse(ECONNREFUSED)
}

// ---------------------------------------------------------------------------------------
// cgroup/setsockopt
// ---------------------------------------------------------------------------------------

#[cgroup_sockopt(setsockopt)]
pub fn ailb_setsockopt(ctx: SockoptContext) -> i32 {
    try_setsockopt(&ctx)
}

/// Hashes `len` bytes at `start`, checking every byte against `end` (the kernel's copy of
/// the option holds at most one page, whatever `optlen` says). `None` when the bytes are
/// not all there.
#[inline(always)]
fn hash_optval(start: *const u8, end: *const u8, len: u32, max: u32) -> Option<u64> {
    let mut h = ConversationHasher::new();
    let mut p = start;
    let mut i = 0u32;
    while i < max {
        if i >= len {
            break;
        }
        // wrapping_add: a plain (not inbounds) pointer add, so LLVM keeps the `p + 1 > end`
        // comparison on the packet pointer that the verifier needs.
        let next = p.wrapping_add(1);
        if next > end {
            return None;
        }
        // SAFETY: `p < next <= end`, so `p` is inside the kernel's optval buffer.
        h.write_u8(unsafe { *p });
        p = next;
        i += 1;
    }
    Some(h.finish(len as u64))
}

#[inline(always)]
fn try_setsockopt(ctx: &SockoptContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sockopt context for the whole run.
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_AILB {
        return ALLOW;
    }
    let optlen = so.optlen;
    // SAFETY: reading the context's pointer fields (the union members are what the
    // verifier knows as optval / optval_end).
    let (start, end) =
        unsafe { (so.__bindgen_anon_2.optval as *const u8, so.__bindgen_anon_3.optval_end as *const u8) };

    enum Opt {
        Conversation(u64),
        Memory(u32),
        Model(u64),
    }
    let opt = match so.optname {
        AILB_CONVERSATION => {
            if optlen < 1 || optlen > MAX_CONVERSATION_LEN as i32 {
                return bad_sockopt(EINVAL);
            }
            match hash_optval(start, end, optlen as u32, MAX_CONVERSATION_LEN as u32) {
                Some(h) => Opt::Conversation(h),
                None => return bad_sockopt(EINVAL),
            }
        }
        AILB_REQUIRED_MEMORY_MB => {
            if optlen != 4 {
                return bad_sockopt(EINVAL);
            }
            if start.wrapping_add(4) > end {
                return bad_sockopt(EINVAL);
            }
            // SAFETY: `start + 4 <= end`: four bytes of the option buffer, read unaligned.
            Opt::Memory(unsafe { ptr::read_unaligned(start.cast::<u32>()) })
        }
        AILB_MODEL => {
            if optlen < 1 || optlen > MAX_MODEL_NAME_LEN as i32 {
                return bad_sockopt(EINVAL);
            }
            match hash_optval(start, end, optlen as u32, MAX_MODEL_NAME_LEN as u32) {
                Some(h) => Opt::Model(h),
                None => return bad_sockopt(EINVAL),
            }
        }
        _ => return bad_sockopt(ENOPROTOOPT),
    };

    // SAFETY: `sk` in bpf_sockopt is a valid full socket.
    let Some(sock) = (unsafe { sock_state_create(so.__bindgen_anon_1.sk.cast()) }) else {
        return refuse(ENOMEM);
    };
    match opt {
        Opt::Conversation(h) => {
            sock.conversation = h;
            sock.flags |= SOCK_HAS_CONVERSATION;
        }
        Opt::Memory(mb) => {
            sock.required_mem_mb = mb;
            sock.flags |= SOCK_HAS_MEMORY;
        }
        Opt::Model(h) => {
            sock.model_hash = h;
            sock.flags |= SOCK_HAS_MODEL;
        }
    }
    // Consumed: the kernel does not process the option itself.
    so.optlen = -1;
    if let Some(s) = stats() {
        s.sockopts += 1;
    }
    ALLOW
}

#[inline(always)]
fn bad_sockopt(errno: i32) -> i32 {
    if let Some(s) = stats() {
        s.bad_sockopts += 1;
    }
    refuse(errno)
}

// ---------------------------------------------------------------------------------------
// sock_ops
// ---------------------------------------------------------------------------------------

#[sock_ops]
pub fn ailb_sockops(ctx: SockOpsContext) -> u32 {
    try_sockops(&ctx);
    1
}

#[inline(always)]
fn try_sockops(ctx: &SockOpsContext) {
    let ops: *mut bpf_sock_ops = ctx.ops;
    let op = ctx.op();
    if op != BPF_SOCK_OPS_TCP_CONNECT_CB && op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_STATE_CB {
        return;
    }
    // SAFETY: reading the context's `sk` field (NULL for request / timewait sockets).
    let sk = unsafe { (*ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return;
    }
    // SAFETY: `sk` is a non-null full socket; lookup only (no create flag).
    let sock = unsafe { bpf_sk_storage_get(addr_of!(AILB_SOCK) as *mut c_void, sk.cast(), ptr::null_mut(), 0) }
        .cast::<SockState>();
    if sock.is_null() {
        return;
    }
    // SAFETY: non-null sk_storage value of this socket; sock_ops runs under the socket lock.
    let sock = unsafe { &mut *sock };
    if sock.flags & SOCK_PICKED == 0 {
        return;
    }
    let backend = sock.backend;
    let model = sock.model;
    if backend >= MAX_BACKENDS || model >= MAX_MODELS {
        return;
    }

    if op == BPF_SOCK_OPS_TCP_CONNECT_CB {
        if sock.flags & SOCK_COUNTED == 0 {
            inflight_add(backend, 1);
            inflight_add(INFLIGHT_MODEL_BASE + model, 1);
            let mem = if sock.flags & SOCK_HAS_MEMORY != 0 { sock.required_mem_mb } else { 0 };
            if mem != 0 {
                inflight_add(INFLIGHT_MEM_BASE + backend, mem as u64);
            }
            sock.counted_mem_mb = mem;
            sock.flags |= SOCK_COUNTED;
            // SAFETY: `ops` is this program's context; the helper only sets the socket's
            // callback flags (here: call us on every TCP state change).
            unsafe { bpf_sock_ops_cb_flags_set(ops, (ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32) };
        }
    } else if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        // The kernel keeps srtt in 1/8 us.
        // SAFETY: reading a field of this program's context.
        let srtt_us = unsafe { (*ops).srtt_us } >> 3;
        if let Some(s) = stats() {
            s.established += 1;
        }
        if let Some(b) = backend_stats(backend) {
            b.established += 1;
            if srtt_us > 0 {
                b.rtt_us_sum += srtt_us as u64;
                b.rtt_samples += 1;
            }
        }
    } else {
        // BPF_SOCK_OPS_STATE_CB: args[0] = old state, args[1] = new state. A connection stops
        // counting as in flight as soon as either side starts closing (FIN_WAIT1 or LAST_ACK:
        // we closed; CLOSE_WAIT: the backend finished and closed), not when the last ACK of
        // the teardown is processed, which a loaded machine can delay past the next connect.
        let new_state = ctx.arg(1);
        let closing = new_state == BPF_TCP_CLOSE
            || new_state == BPF_TCP_CLOSE_WAIT
            || new_state == BPF_TCP_FIN_WAIT1
            || new_state == BPF_TCP_LAST_ACK;
        if !closing || sock.flags & SOCK_COUNTED == 0 {
            return;
        }
        let failed = new_state == BPF_TCP_CLOSE && ctx.arg(0) == BPF_TCP_SYN_SENT;
        uncount(sock);
        if let Some(s) = stats() {
            if failed {
                s.connect_failures += 1;
            } else {
                s.closed += 1;
            }
        }
        if let Some(b) = backend_stats(backend) {
            if failed {
                b.connect_failures += 1;
            } else {
                b.closed += 1;
            }
        }
        // The conversation's affinity entry counts its age from this close too: its prefix
        // was cached on the backend when the answer ended, not when the request began
        // (`GlobalConfig::affinity_wait_ns`, the TTL).
        if !failed && sock.flags & SOCK_HAS_CONVERSATION != 0 {
            let key = AffinityKey { model, _pad: 0, conversation: sock.conversation };
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
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the verifier rejects the infinite loop if any
    // panic path survives optimisation.
    loop {}
}
