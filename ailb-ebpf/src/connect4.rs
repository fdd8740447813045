//! `cgroup/connect4`: a TCP connect to a VIP is rewritten to the backend the pick chooses,
//! or refused with `ECONNREFUSED`.

use core::ptr;

use ailb_common::{
    abi::*,
    hash::fmix64,
    pick::{
        keys_wanted, pick_with_prefix, placement_hash, ClientFamily, Outcome, PickMaps, PickRequest, PickResult,
        PrefixCtx,
    },
};
use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::generated::{bpf_get_socket_cookie, bpf_ktime_get_ns},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};

use crate::{
    maps::{
        backend_stats, inflight_read, sock_state, stats, turn_take, uncount, AILB_AFFINITY, AILB_CONFIG, AILB_MODELS,
        AILB_MODEL_NAMES, AILB_SERVICES,
    },
    pick_maps::Maps,
    prefix::{self, sock_prefix},
    refuse, AF_INET, ALLOW, ECONNREFUSED, ENOKEY, ENOMEM, IPPROTO_TCP, SOCK_STREAM,
};

#[cgroup_sock_addr(connect4)]
pub fn ailb_connect4(ctx: SockAddrContext) -> i32 {
    try_connect4(&ctx)
}

#[inline(always)]
fn try_connect4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr context for the whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(service) = vip_service(sa) else {
        return ALLOW;
    };
    let picked = match pick_connect(ctx, sa, &service, ClientFamily::Ipv4) {
        Ok(p) => p,
        Err(verdict) => return verdict,
    };
    sa.user_ip4 = picked.backend.addr;
    sa.user_port = picked.backend.port as u32;
    picked.commit();
    ALLOW
}

/// A pick made for a connect, applied ([`Picked::commit`]) once the destination is rewritten.
pub(crate) struct Picked {
    pub(crate) id: u32,
    pub(crate) backend: Backend,
    res: PickResult,
    now_ns: u64,
    model: u32,
    entry: AffinityEntry,
    sock: &'static mut SockState,
}

impl Picked {
    /// Records the pick: the affinity entry, the socket's storage (for sock_ops) and the counters.
    #[inline(always)]
    pub(crate) fn commit(self) {
        self.entry.remember(&self.res, self.now_ns);
        note_pick(self.sock, self.res.backend, self.model);
        count_pick(&self.res);
    }
}

/// The pick for a connect to `service` from a socket of `family`; `Err` holds the verdict
/// of a refused connect (counted).
#[inline(always)]
pub(crate) fn pick_connect(
    ctx: &SockAddrContext,
    sa: &bpf_sock_addr,
    service: &Service,
    family: ClientFamily,
) -> Result<Picked, i32> {
    // SAFETY: `sk` in bpf_sock_addr is a valid full socket (PTR_TO_SOCKET).
    let Some(sock) = (unsafe { sock_state(sa.__bindgen_anon_1.sk.cast(), true) }) else {
        return Err(refuse(ENOMEM));
    };
    let Some(model) = model_of(service, sock) else {
        return Err(refuse_connect(Outcome::NoBackend));
    };
    let Some(cfg) = AILB_CONFIG.get_ptr(0) else {
        return Err(refuse_connect(Outcome::NoBackend));
    };
    // SAFETY: a non-null array map value pointer; copied.
    let cfg = unsafe { ptr::read(cfg) };
    let Some(state) = AILB_MODELS.get_ptr(model) else {
        return Err(refuse_connect(Outcome::NoBackend));
    };
    // SAFETY: a non-null array map value pointer; the fields the pick reads are copied, so
    // that `active` and the slot it selects are read once.
    let state = unsafe { model_view(state) };

    // The prefix step first, while few branches have been taken: the verifier walks its
    // loops once per distinct state reaching it (the pick applies its result after affinity).
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let model_inflight = inflight_read(INFLIGHT_MODEL_BASE + model);
    let prefix = prefix_choice(sa, sock, &state, &cfg, model, model_inflight, family, now_ns);
    let (has_conversation, hash) = conversation(ctx, sock);
    let used = has_conversation && cfg.flags & CONFIG_AFFINITY != 0;
    let entry = AffinityEntry::lookup(model, AFFINITY_SPACE_CONVERSATION, hash, used);
    // A connect with keys is placed by its longest prefix held, or its first key (`placement_hash`).
    let table_hash = prefix.and_then(|p| p.placed).unwrap_or(hash);
    let req = request(&cfg, sock, model, table_hash, has_conversation, entry.value(), now_ns, model_inflight);
    let res = pick_with_prefix(&Maps, &state, &cfg, &req, family, prefix.map(|p| p.chosen));
    // Keys withheld until asked: refused, recording nothing, where the pick would have read
    // them; the client connects again with them.
    if sock.flags & (SOCK_PREFIX_ON_REQUEST | SOCK_HAS_PREFIX) == SOCK_PREFIX_ON_REQUEST
        && keys_wanted(state.flags, res.outcome)
    {
        return Err(refuse(ENOKEY));
    }
    if res.backend == NO_BACKEND || res.backend >= MAX_BACKENDS {
        return Err(refuse_connect(res.outcome));
    }
    // A holder caches the prompt up to its longest prefix held, shared by every request of that
    // prefix on it: the connection is counted in flight with the share it was asked for, not
    // the whole hint, else a holder with a few requests in flight looks full to the next.
    if let (Outcome::Prefix, Some(p)) = (res.outcome, prefix) {
        if sock.flags & SOCK_HAS_MEMORY != 0 {
            sock.required_mem_mb = p.need;
        }
    }
    let Some(backend) = Maps.backend(res.backend) else {
        return Err(refuse_connect(Outcome::NoBackend));
    };
    Ok(Picked { id: res.backend, backend, res, now_ns: req.now_ns, model, entry, sock })
}

/// The prefix step's result for a connect that carries keys to a model with a prefix mode
/// (`PickMaps::prefix_step`), for [`pick_with_prefix`].
#[derive(Clone, Copy)]
struct PrefixChoice {
    /// The holder chosen, or [`NO_BACKEND`].
    chosen: u32,
    /// The memory it was asked for.
    need: u32,
    /// The table's hash for the connect ([`placement_hash`]).
    placed: Option<u64>,
}

/// The prefix step for this connect ([`PrefixChoice`]); `None` without keys or prefix mode.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn prefix_choice(
    sa: &bpf_sock_addr,
    sock: &SockState,
    state: &ModelView,
    cfg: &GlobalConfig,
    model: u32,
    model_inflight: u64,
    family: ClientFamily,
    now_ns: u64,
) -> Option<PrefixChoice> {
    if sock.flags & SOCK_HAS_PREFIX == 0 || state.flags & (MODEL_PREFIX_LEARN | MODEL_PREFIX_EVENTS) == 0 {
        return None;
    }
    // SAFETY: as for `sock_state` in `pick_connect`.
    let sp = unsafe { sock_prefix(sa.__bindgen_anon_1.sk.cast(), false) }?;
    let q = prefix::query(sp, state, now_ns);
    let required_mem_mb = if sock.flags & SOCK_HAS_MEMORY != 0 { sock.required_mem_mb } else { 0 };
    let c = PrefixCtx::new(cfg, model, required_mem_mb, family, &q, model_inflight, state.slot.total_weight);
    let (chosen, need, found) = crate::pick_maps::prefix_step(&c, q.keys);
    Some(PrefixChoice { chosen, need, placed: placement_hash(q.keys, found) })
}

/// The pick's copy of a model's state: `active`, then the slot it selects.
///
/// # Safety
/// `p` must be a non-null `AILB_MODELS` value pointer, valid for this run.
#[inline(always)]
unsafe fn model_view(p: *const ModelState) -> ModelView {
    // SAFETY: per the contract; plain field reads (`active & 1` keeps the slot in range).
    unsafe {
        let active = ptr::read_volatile(ptr::addr_of!((*p).active));
        ModelView {
            flags: ptr::read(ptr::addr_of!((*p).flags)),
            _pad: 0,
            slot: ptr::read(ptr::addr_of!((*p).slots[(active & 1) as usize])),
            affinity_ttl_ns: ptr::read(ptr::addr_of!((*p).affinity_ttl_ns)),
            prefix_ttl_ns: ptr::read(ptr::addr_of!((*p).prefix_ttl_ns)),
        }
    }
}

/// The VIP entry of a TCP/IPv4 connect's destination; `None` for any other connect.
#[inline(always)]
fn vip_service(sa: &bpf_sock_addr) -> Option<Service> {
    if sa.user_family != AF_INET || sa.type_ != SOCK_STREAM || sa.protocol != IPPROTO_TCP {
        return None;
    }
    let key = ServiceKey { addr: sa.user_ip4, port: sa.user_port as u16, _pad: 0 };
    let service = AILB_SERVICES.get_ptr(key)?;
    // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
    Some(unsafe { ptr::read(service) })
}

/// The model of a connect to `service`: the VIP's own, or for a shared VIP the one the
/// socket's `AILB_MODEL` hint names. `None`: no (known) model.
#[inline(always)]
fn model_of(service: &Service, sock: &SockState) -> Option<u32> {
    let model = if service.flags & SERVICE_SHARED != 0 {
        if sock.flags & SOCK_HAS_MODEL == 0 {
            return None;
        }
        let m = AILB_MODEL_NAMES.get_ptr(sock.model_hash)?;
        // SAFETY: a non-null hash map value pointer (u32).
        unsafe { ptr::read(m) }
    } else {
        service.model
    };
    (model < MAX_MODELS).then_some(model)
}

/// Whether the socket carries a conversation id, and the hash the pick uses: the id's, else
/// the socket cookie's (a connection of its own).
#[inline(always)]
fn conversation(ctx: &SockAddrContext, sock: &SockState) -> (bool, u64) {
    if sock.flags & SOCK_HAS_CONVERSATION != 0 {
        return (true, sock.conversation);
    }
    // SAFETY: the helper only reads the context's socket.
    (false, fmix64(unsafe { bpf_get_socket_cookie(ctx.sock_addr.cast()) }))
}

/// The pick's inputs besides the maps. With round robin (a baseline), this connect takes the
/// model's turn (one atomic add) unless an affinity entry may decide instead.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn request(
    cfg: &GlobalConfig,
    sock: &SockState,
    model: u32,
    hash: u64,
    has_conversation: bool,
    affinity: Option<AffinityValue>,
    now_ns: u64,
    model_inflight: u64,
) -> PickRequest {
    let required_mem_mb = if sock.flags & SOCK_HAS_MEMORY != 0 { sock.required_mem_mb } else { 0 };
    let turn = if cfg.flags & CONFIG_ROUND_ROBIN != 0 && affinity.is_none() { turn_take(model) } else { 0 };
    PickRequest {
        model,
        hash,
        has_conversation,
        required_mem_mb,
        affinity,
        now_ns,
        model_inflight,
        turn,
        affinity_bounded: false,
    }
}

/// The conversation's (or, for the TC datapath, the remote client's) `AILB_AFFINITY` entry,
/// looked up once per connect (only when affinity applies: the socket has a conversation id,
/// or the model keeps remote clients on their backend, and the config enables affinity).
pub(crate) struct AffinityEntry {
    key: AffinityKey,
    used: bool,
    /// The value in the map, valid for this run (RCU).
    ptr: Option<*mut AffinityValue>,
}

impl AffinityEntry {
    #[inline(always)]
    pub(crate) fn lookup(model: u32, space: u32, hash: u64, used: bool) -> Self {
        let key = AffinityKey { model, space, conversation: hash };
        let ptr = if used { AILB_AFFINITY.get_ptr_mut(key) } else { None };
        Self { key, used, ptr }
    }

    /// A copy of the entry's value.
    #[inline(always)]
    pub(crate) fn value(&self) -> Option<AffinityValue> {
        // SAFETY: a non-null LRU hash value pointer, valid for this run (RCU); copied at once.
        self.ptr.map(|p| unsafe { ptr::read(p) })
    }

    /// Records the pick: a hit refreshes the timestamp in place (no map update, no LRU
    /// allocation); any other pick of a conversation (re)writes the entry.
    #[inline(always)]
    pub(crate) fn remember(&self, res: &PickResult, now_ns: u64) {
        match (res.outcome, self.ptr) {
            // SAFETY: the value pointer from the lookup, valid for this run; a racing writer
            // can only make the timestamp another recent value.
            (Outcome::AffinityHit, Some(p)) => unsafe { (*p).last_seen_ns = now_ns },
            _ if self.used => {
                let value = AffinityValue { backend: res.backend, _pad: 0, last_seen_ns: now_ns };
                // An LRU map evicts instead of failing when full; a failure only loses affinity.
                let _ = AILB_AFFINITY.insert(self.key, value, 0);
            }
            _ => {}
        }
    }
}

/// Records the pick in the socket's storage, for sock_ops to count it.
#[inline(always)]
fn note_pick(sock: &mut SockState, backend: u32, model: u32) {
    // A socket is only connected once from SS_UNCONNECTED, so it is normally not counted
    // here; if it is, move it off the old backend's counters so they stay exact.
    uncount(sock);
    sock.backend = backend;
    sock.model = model;
    sock.flags |= SOCK_PICKED;
}

/// Counts a pick in the global and the backend's counters.
#[inline(always)]
pub(crate) fn count_pick(res: &PickResult) {
    if let Some(s) = stats() {
        s.picks += 1;
        match res.outcome {
            Outcome::AffinityHit => s.affinity_hits += 1,
            Outcome::Prefix => s.prefix_picks += 1,
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
}

/// Counts a refused connect and fails it with `ECONNREFUSED`.
#[inline(always)]
pub(crate) fn refuse_connect(outcome: Outcome) -> i32 {
    if let Some(s) = stats() {
        if outcome == Outcome::NoFit {
            s.no_fit += 1;
        } else {
            s.no_backend += 1;
        }
    }
    refuse(ECONNREFUSED)
}
