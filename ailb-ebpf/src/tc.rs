//! `sched_cls` on the ingress of the `[daemon] interfaces` (`ailb_tc_ingress`): a TCP SYN
//! from a remote client to a VIP runs the pick ([`conntrack::open`]), the flow's packets are
//! handled by [`flows`]: rewritten both ways ([`crate::nat`]) and forwarded to the FIB's next
//! hop. IPv6 frames go to `ailb_tc_ingress6` ([`crate::tc6`], a tail call), the same for IPv6
//! VIPs and flows. Everything that is not TCP to a VIP or of a known flow passes untouched, as
//! does what cannot be parsed (the stack drops it); a packet that matches a VIP or a flow but
//! is malformed (bad header lengths, bad IPv4 checksum, a fragment) is dropped, never
//! rewritten.

use aya_ebpf::{bindings::TC_ACT_OK, helpers::generated::bpf_ktime_get_ns, macros::classifier, programs::TcContext};

use ailb_common::abi::*;

use crate::{
    conntrack::{self, V4},
    family::Family,
    flows::{self, lookup, on_forward, on_reply},
    packet::{self, parse, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    tc_maps::{malformed, tc_config, AILB_TC_PROGS},
};

#[classifier]
pub fn ailb_tc_ingress(ctx: TcContext) -> i32 {
    if packet::is_ipv6(&ctx) {
        return to_ingress6(&ctx);
    }
    try_ingress(&ctx)
}

#[inline(always)]
fn try_ingress(ctx: &TcContext) -> i32 {
    let Some(pkt) = parse(ctx) else {
        return TC_ACT_OK as i32;
    };
    let Some(cfg) = tc_config() else {
        return TC_ACT_OK as i32;
    };
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let step = flows::seen_step(cfg.idle_timeout_ns);
    // Masquerading, a packet to the NAT address is a reply (a VIP on the NAT address at a port
    // of the NAT range would be the only forward key it could also match, and the forward
    // entry is looked up after it): one lookup instead of a miss on the forward key first.
    let reply_first = cfg.mode == TC_MODE_MASQUERADE && pkt.daddr == cfg.nat_addr;
    if reply_first {
        if let Some(flow) = lookup::<V4>(&pkt, FLOW_REPLY) {
            if !pkt.valid {
                return malformed();
            }
            return on_reply::<V4>(ctx, &pkt, flow, now, step);
        }
    }
    if let Some(flow) = lookup::<V4>(&pkt, FLOW_FORWARD) {
        if !pkt.valid {
            return malformed();
        }
        let verdict = on_forward::<V4>(ctx, &pkt, flow, now, step);
        if verdict != flows::REOPEN {
            return verdict;
        }
    }
    if !reply_first {
        if let Some(flow) = lookup::<V4>(&pkt, FLOW_REPLY) {
            if !pkt.valid {
                return malformed();
            }
            return on_reply::<V4>(ctx, &pkt, flow, now, step);
        }
    }
    if let Some(service) = V4::vip(&pkt) {
        if pkt.flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN {
            if !pkt.valid {
                return malformed();
            }
            return conntrack::open(ctx, &pkt, &service, &cfg, now);
        }
        if pkt.fragment {
            return malformed();
        }
    }
    TC_ACT_OK as i32
}

/// An IPv6 frame goes to `ailb_tc_ingress6` (a tail call through `AILB_TC_PROGS`); while
/// the slot is empty the tail call fails and returns here, and the frame passes. A
/// subprogram of its own, called before the IPv4 parser: anywhere else, or inlined, the
/// call took 8 more bytes of the ingress program's frame, which with the IPv4 open path's
/// frame is at the 512-byte limit (160 + 320 + the member scan's 32).
#[inline(never)]
fn to_ingress6(ctx: &TcContext) -> i32 {
    // SAFETY: the context is this program's; the slot holds a sched_cls program or nothing.
    unsafe { AILB_TC_PROGS.tail_call(ctx, TC_PROG_IPV6) };
    // A successful tail call never comes back here: the called program's verdict is this
    // function's return value, which the ingress program returns. The compiler does not know
    // that, and would fold this function's result to the constant below in the caller
    // (every IPv6 verdict then read as `TC_ACT_OK`, drops included); `black_box` keeps the
    // returned value opaque.
    core::hint::black_box(TC_ACT_OK as i32)
}
