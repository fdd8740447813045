//! `sockops`: keeps the in-flight counters (`AILB_INFLIGHT`) exact from `TCP_CONNECT_CB` to
//! the moment either side starts closing, and counts established / closed / failed
//! connections and RTT samples.

use ailb_common::abi::*;
use aya_ebpf::{
    bindings::{
        bpf_sock_ops, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_TCP_CLOSE, BPF_TCP_CLOSE_WAIT, BPF_TCP_FIN_WAIT1, BPF_TCP_LAST_ACK,
        BPF_TCP_SYN_SENT,
    },
    helpers::generated::bpf_sock_ops_cb_flags_set,
    macros::sock_ops,
    programs::SockOpsContext,
};

use crate::maps::{backend_stats, recount, refresh_affinity, sock_state, stats, uncount};

#[sock_ops]
pub fn ailb_sockops(ctx: SockOpsContext) -> u32 {
    try_sockops(&ctx);
    1
}

#[inline(always)]
fn try_sockops(ctx: &SockOpsContext) {
    let op = ctx.op();
    if op != BPF_SOCK_OPS_TCP_CONNECT_CB && op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_STATE_CB {
        return;
    }
    let Some(sock) = picked_sock(ctx.ops) else {
        return;
    };
    let backend = sock.backend;
    let model = sock.model;
    if backend >= MAX_BACKENDS || model >= MAX_MODELS {
        return;
    }
    if op == BPF_SOCK_OPS_TCP_CONNECT_CB {
        if sock.flags & SOCK_HAS_PREFIX != 0 {
            learn_prefix(ctx.ops, backend, model);
        }
        on_connect(ctx, sock);
    } else if op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB {
        on_established(ctx.ops, backend);
    } else {
        on_state_change(ctx, sock, backend, model);
    }
}

/// Approximate mode: the connect's prefix keys now name its backend, which caches the prompt.
/// Learnt here, at the SYN, rather than in connect4: the connect program's stack and the
/// verifier's budget for it are taken by the pick.
#[inline(always)]
fn learn_prefix(ops: *mut bpf_sock_ops, backend: u32, model: u32) {
    let Some(state) = crate::maps::AILB_MODELS.get_ptr(model) else {
        return;
    };
    // SAFETY: a non-null array map value pointer, valid for this run; two plain reads.
    let (flags, ttl_ns) = unsafe { ((*state).flags, (*state).prefix_ttl_ns) };
    if flags & MODEL_PREFIX_LEARN == 0 {
        return;
    }
    // SAFETY: reading the context's `sk` field.
    let sk = unsafe { (*ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return;
    }
    // SAFETY: `sk` is a non-null full socket; lookup only.
    if let Some(sp) = unsafe { crate::prefix::sock_prefix(sk.cast(), false) } {
        // SAFETY: no arguments.
        let now = unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() };
        crate::prefix::learn(sp, model, backend, ttl_ns, now);
    }
}

/// The storage of the context's socket, if connect4 picked a backend for it.
#[inline(always)]
fn picked_sock(ops: *mut bpf_sock_ops) -> Option<&'static mut SockState> {
    // SAFETY: reading the context's `sk` field (NULL for request / timewait sockets).
    let sk = unsafe { (*ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: `sk` is a non-null full socket; lookup only (no create flag).
    let sock = unsafe { sock_state(sk.cast(), false) }?;
    (sock.flags & SOCK_PICKED != 0).then_some(sock)
}

/// `TCP_CONNECT_CB`: counts the socket in flight to its backend and model (once), and asks
/// for the state changes that end the count.
#[inline(always)]
fn on_connect(ctx: &SockOpsContext, sock: &mut SockState) {
    if sock.flags & (SOCK_COUNTED | SOCK_IDLE) != 0 {
        return;
    }
    recount(sock);
    // SAFETY: `ops` is this program's context; the helper only sets the socket's callback
    // flags (here: call us on every TCP state change).
    unsafe { bpf_sock_ops_cb_flags_set(ctx.ops, (ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32) };
}

/// `ACTIVE_ESTABLISHED_CB`: counts the connection and its first RTT sample.
#[inline(always)]
fn on_established(ops: *mut bpf_sock_ops, backend: u32) {
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
}

/// `STATE_CB` (args[0] = old state, args[1] = new state). A connection stops counting as in
/// flight as soon as either side starts closing (FIN_WAIT1 or LAST_ACK: we closed;
/// CLOSE_WAIT: the backend finished and closed), not when the last ACK of the teardown is
/// processed, which a loaded machine can delay past the next connect.
#[inline(always)]
fn on_state_change(ctx: &SockOpsContext, sock: &mut SockState, backend: u32, model: u32) {
    let new_state = ctx.arg(1);
    let closing = new_state == BPF_TCP_CLOSE
        || new_state == BPF_TCP_CLOSE_WAIT
        || new_state == BPF_TCP_FIN_WAIT1
        || new_state == BPF_TCP_LAST_ACK;
    // An idle connection (marked by its client) is not counted in flight, but its close is.
    if !closing || sock.flags & (SOCK_COUNTED | SOCK_IDLE) == 0 {
        return;
    }
    let failed = new_state == BPF_TCP_CLOSE && ctx.arg(0) == BPF_TCP_SYN_SENT;
    // An idle connection's answer ended when it was marked idle, which refreshed the affinity.
    let was_idle = sock.flags & SOCK_IDLE != 0;
    sock.flags &= !SOCK_IDLE;
    uncount(sock);
    count_close(backend, failed);
    if !failed && !was_idle && sock.flags & SOCK_HAS_CONVERSATION != 0 {
        refresh_affinity(model, sock.conversation, backend);
    }
}

/// Counts a closed connection, or a connect that failed (closed from SYN_SENT).
#[inline(always)]
fn count_close(backend: u32, failed: bool) {
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
}
