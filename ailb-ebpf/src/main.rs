//! ailb eBPF programs.
//!
//! * `ailb_connect4` (`cgroup/connect4`, [`connect4`]): a TCP connect to a VIP in
//!   `AILB_SERVICES` is rewritten to the backend that [`ailb_common::pick::pick`] chooses
//!   (conversation affinity, bounded-load weighted Maglev, least-loaded fallback), or refused
//!   with `ECONNREFUSED` when the model has no live backend / none fits the memory hint.
//! * `ailb_connect6` (`cgroup/connect6`, [`connect6`]): the same for IPv6 sockets, to a VIP
//!   in `AILB_SERVICES6` or (a v4-mapped destination) in `AILB_SERVICES`; it reaches IPv6
//!   backends (addresses in `AILB_BACKEND_ADDRS6`) and IPv4 ones through their v4-mapped address.
//! * `ailb_setsockopt` (`cgroup/setsockopt`, [`setsockopt`]): consumes `SOL_AILB` options
//!   (conversation id, required GPU memory, model name) into the socket's `AILB_SOCK` storage.
//! * `ailb_sockops` (`sockops`, [`sockops`]): keeps the in-flight counters (`AILB_INFLIGHT`:
//!   connections per backend and model, and the memory hints per backend) exact from
//!   `TCP_CONNECT_CB` to the socket's `TCP_CLOSE`, and counts established / closed /
//!   failed connections and RTT samples.
//! * `ailb_tc_ingress` (`sched_cls`, [`tc`]): remote clients on the `[daemon] interfaces`: a
//!   SYN to a VIP runs the same pick ([`conntrack`]), the flow is kept in `AILB_FLOWS`
//!   ([`flows`]) and its packets are rewritten both ways and forwarded ([`nat`]), counted in
//!   the same in-flight counters; IPv6 VIPs and flows the same way ([`tc6`], [`conntrack6`],
//!   [`nat6`], flows in `AILB_FLOWS6`, IPv6 backends only). What differs between the families
//!   is one trait ([`family`]); the flows' lifecycle, the rewrite and the reclaim are written
//!   once over it. `ailb_tc_reclaim` ([`reclaim`]) removes idle flows of both families when
//!   the daemon runs it.
//!
//! The maps and their accessors are in [`maps`]; the pick reads them through [`pick_maps`].
//! Every array index is checked against its bound before use (the verifier needs it and a
//! corrupt map value must not turn into an out-of-range access). Helpers are
//! `#[inline(always)]`, so each program stays one BPF function in which the verifier sees each
//! bounds check and null check next to the access it guards; the one subprogram is the
//! `bpf_loop` callback of the member scan.
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd`: the bpf target has no `target_has_atomic = "64"`, so
// `AtomicU64::fetch_add` does not exist there; the intrinsic lowers to a BPF atomic add.
#![expect(internal_features, reason = "core_intrinsics: the only 64-bit atomic add on the bpf target")]
#![feature(core_intrinsics)]

mod connect4;
mod connect6;
mod conntrack;
mod conntrack6;
mod family;
mod flows;
mod maps;
mod nat;
mod nat6;
mod packet;
mod pick_maps;
mod prefix;
mod reclaim;
mod setsockopt;
mod sockops;
mod tc;
mod tc6;
mod tc_floor;
mod tc_maps;

use aya_ebpf::helpers::generated::bpf_set_retval;

// Kernel constants (uapi) not worth a dependency.
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const SOCK_STREAM: u32 = 1;
const IPPROTO_TCP: u32 = 6;
const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;
const ENOPROTOOPT: i32 = 92;
const ECONNREFUSED: i32 = 111;
const ENOKEY: i32 = 126;

/// Program verdicts for cgroup hooks.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;

/// Sets the errno the failing syscall returns (`-errno`), then the verdict is `REJECT`.
#[inline(always)]
fn refuse(errno: i32) -> i32 {
    // SAFETY: bpf_set_retval takes a plain integer; it is available to cgroup sock_addr and
    // sockopt programs (kernel >= 5.19). The return value (always 0) is not needed.
    unsafe { bpf_set_retval(-errno) };
    REJECT
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the verifier rejects the infinite loop if any
    // panic path survives optimisation.
    loop {}
}
