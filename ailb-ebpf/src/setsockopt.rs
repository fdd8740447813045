//! `cgroup/setsockopt`: consumes the `SOL_AILB` options (conversation id, required GPU
//! memory, model name) into the socket's `AILB_SOCK` storage, and the idle/busy mark of a
//! connection kept for reuse (`AILB_IDLE`), which takes it out of the in-flight counts and
//! puts it back.

use core::ptr;

use ailb_common::{abi::*, hash::ConversationHasher, prefix::PREFIX_KEYS_MAX};
use aya_ebpf::{macros::cgroup_sockopt, programs::SockoptContext};

use crate::{
    maps::{recount, refresh_affinity, sock_state, stats, uncount},
    prefix::{read_keys, sock_prefix},
    refuse, ALLOW, EINVAL, ENOMEM, ENOPROTOOPT,
};

#[cgroup_sockopt(setsockopt)]
pub fn ailb_setsockopt(ctx: SockoptContext) -> i32 {
    try_setsockopt(&ctx)
}

/// A parsed `SOL_AILB` option: the hashes of the byte strings, the memory as given.
enum Opt {
    Conversation(u64),
    Memory(u32),
    Model(u64),
    Idle(bool),
    PrefixOnRequest(bool),
}

#[inline(always)]
fn try_setsockopt(ctx: &SockoptContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sockopt context for the whole run.
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_AILB {
        return ALLOW;
    }
    // SAFETY: reading the context's pointer fields (the union members are what the
    // verifier knows as optval / optval_end).
    let (start, end) =
        unsafe { (so.__bindgen_anon_2.optval as *const u8, so.__bindgen_anon_3.optval_end as *const u8) };
    if so.optname == AILB_PREFIX {
        return set_prefix(so, start, end);
    }
    let opt = match parse_opt(so.optname, so.optlen, start, end) {
        Ok(opt) => opt,
        Err(errno) => return bad_sockopt(errno),
    };
    // SAFETY: `sk` in bpf_sockopt is a valid full socket.
    let Some(sock) = (unsafe { sock_state(so.__bindgen_anon_1.sk.cast(), true) }) else {
        return refuse(ENOMEM);
    };
    store_opt(sock, opt);
    // Consumed: the kernel does not process the option itself.
    so.optlen = -1;
    if let Some(s) = stats() {
        s.sockopts += 1;
    }
    ALLOW
}

/// Option `optname` of `optlen` bytes in the kernel's buffer `start..end`; `Err(errno)` for
/// a bad length or an unknown name.
#[inline(always)]
fn parse_opt(optname: i32, optlen: i32, start: *const u8, end: *const u8) -> Result<Opt, i32> {
    match optname {
        AILB_CONVERSATION => {
            if optlen < 1 || optlen > MAX_CONVERSATION_LEN as i32 {
                return Err(EINVAL);
            }
            hash_optval(start, end, optlen as u32, MAX_CONVERSATION_LEN as u32).map(Opt::Conversation).ok_or(EINVAL)
        }
        AILB_REQUIRED_MEMORY_MB => {
            if optlen != 4 || start.wrapping_add(4) > end {
                return Err(EINVAL);
            }
            // SAFETY: `start + 4 <= end`: four bytes of the option buffer, read unaligned.
            Ok(Opt::Memory(unsafe { ptr::read_unaligned(start.cast::<u32>()) }))
        }
        AILB_MODEL => {
            if optlen < 1 || optlen > MAX_MODEL_NAME_LEN as i32 {
                return Err(EINVAL);
            }
            hash_optval(start, end, optlen as u32, MAX_MODEL_NAME_LEN as u32).map(Opt::Model).ok_or(EINVAL)
        }
        AILB_IDLE | AILB_PREFIX_ON_REQUEST => {
            if optlen != 4 || start.wrapping_add(4) > end {
                return Err(EINVAL);
            }
            // SAFETY: `start + 4 <= end`: four bytes of the option buffer, read unaligned.
            let on = match unsafe { ptr::read_unaligned(start.cast::<u32>()) } {
                0 => false,
                1 => true,
                _ => return Err(EINVAL),
            };
            Ok(if optname == AILB_IDLE { Opt::Idle(on) } else { Opt::PrefixOnRequest(on) })
        }
        _ => Err(ENOPROTOOPT),
    }
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

/// `AILB_PREFIX`: the keys go to the socket's `AILB_SOCK_PREFIX` entry (kept apart from
/// `AILB_SOCK`, so sockets without keys do not carry their 136 bytes).
#[inline(always)]
fn set_prefix(so: &mut aya_ebpf::bindings::bpf_sockopt, start: *const u8, end: *const u8) -> i32 {
    let mut keys = [0u64; PREFIX_KEYS_MAX];
    let Some(count) = read_keys(start, end, so.optlen, &mut keys) else {
        return bad_sockopt(EINVAL);
    };
    // SAFETY: `sk` in bpf_sockopt is a valid full socket.
    let sk = unsafe { so.__bindgen_anon_1.sk.cast() };
    // SAFETY: as above.
    let (Some(sock), Some(sp)) = (unsafe { sock_state(sk, true) }, unsafe { sock_prefix(sk, true) }) else {
        return refuse(ENOMEM);
    };
    sp.keys = keys;
    sp.count = count;
    sock.flags |= SOCK_HAS_PREFIX;
    so.optlen = -1;
    if let Some(s) = stats() {
        s.sockopts += 1;
    }
    ALLOW
}

#[inline(always)]
fn store_opt(sock: &mut SockState, opt: Opt) {
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
        Opt::Idle(idle) => mark_idle(sock, idle),
        Opt::PrefixOnRequest(true) => sock.flags |= SOCK_PREFIX_ON_REQUEST,
        Opt::PrefixOnRequest(false) => sock.flags &= !SOCK_PREFIX_ON_REQUEST,
    }
}

/// Idle: a counted, picked connection stops counting in flight (its request is over) and its
/// conversation's affinity ages from now; busy: an idle one counts again. Marks that change
/// nothing (a socket ailb did not pick, already closing, or already in that state) are no-ops,
/// so the counters stay exact whatever a client sends.
#[inline(always)]
fn mark_idle(sock: &mut SockState, idle: bool) {
    if sock.flags & SOCK_PICKED == 0 {
        return;
    }
    if idle {
        if sock.flags & SOCK_COUNTED == 0 {
            return;
        }
        uncount(sock);
        sock.flags |= SOCK_IDLE;
        if sock.flags & SOCK_HAS_CONVERSATION != 0 {
            refresh_affinity(sock.model, sock.conversation, sock.backend);
        }
    } else if sock.flags & SOCK_IDLE != 0 {
        sock.flags &= !SOCK_IDLE;
        recount(sock);
    }
}

#[inline(always)]
fn bad_sockopt(errno: i32) -> i32 {
    if let Some(s) = stats() {
        s.bad_sockopts += 1;
    }
    refuse(errno)
}
