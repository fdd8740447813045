//! `ailb_tc_ingress6`, the IPv6 half of `ailb_tc_ingress`, which tail-calls it for IPv6
//! frames (`AILB_TC_PROGS`): a TCP SYN from a remote IPv6 client to an IPv6 VIP
//! (`AILB_SERVICES6`) opens a flow in `AILB_FLOWS6` ([`conntrack6`]) with the pick among the
//! model's IPv6 backends (no NAT64), and the flow's packets are handled as IPv4 ones
//! ([`flows`]): rewritten both ways and forwarded ([`crate::nat`], [`crate::nat6`]), with the
//! same lifecycle. A program of its own rather than a subprogram: the IPv6 open path
//! (40-byte keys, 104-byte entries, the pick) does not fit in the 512 bytes of BPF stack
//! under the IPv4 program's frame, and the verifier's instruction budget is per program, so
//! the IPv4 program is verified and runs as before (one more branch, for non-IPv4 frames
//! only). While the daemon has not filled `AILB_TC_PROGS` the tail call fails and IPv6
//! frames pass untouched. The parsed packet lives in a per-CPU slot ([`pkt6_scratch`]), so
//! that this program's own frame stays small under the open path's.
//!
//! Extension headers and fragments: the hop-by-hop, routing and destination-options headers
//! and the fragment header are walked (up to [`crate::packet::MAX_EXT_HEADERS`]) to find the
//! ports; a packet that carries any of them and matches a VIP or a flow is dropped and counted
//! `malformed`, never rewritten (a routing header's final destination is not the address in
//! the fixed header, and a fragment's ports are only in the first one). Later fragments (no
//! ports), other next headers (ESP, AH, no next header, UDP, ...) and packets too short to hold
//! the ports pass untouched, as in the IPv4 path; so does every IPv6 packet in masquerade mode
//! while no IPv6 NAT address is configured. The parsing is in [`crate::packet`].

use aya_ebpf::{bindings::TC_ACT_OK, helpers::generated::bpf_ktime_get_ns, macros::classifier, programs::TcContext};

use ailb_common::abi::*;

use crate::{
    conntrack6::{self, V6},
    family::Family,
    flows::{self, lookup, on_forward, on_reply},
    packet::{parse6, Packet6, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    tc_maps::{malformed, nat_addr6, pkt6_scratch, tc_config},
};

#[classifier]
pub fn ailb_tc_ingress6(ctx: TcContext) -> i32 {
    ingress6(&ctx)
}

/// An IPv6 frame: the same dispatch as the IPv4 one (a flow's packet, a reply, a SYN to a
/// VIP), on `AILB_FLOWS6` and `AILB_SERVICES6`.
#[inline(always)]
fn ingress6(ctx: &TcContext) -> i32 {
    let Some(cfg) = tc_config() else {
        return TC_ACT_OK as i32;
    };
    if cfg.mode == TC_MODE_MASQUERADE && nat_addr6() == [0; 4] {
        return TC_ACT_OK as i32;
    }
    let Some(pkt) = pkt6_scratch() else {
        return TC_ACT_OK as i32;
    };
    if parse6(ctx, pkt).is_none() {
        return TC_ACT_OK as i32;
    }
    let pkt: &Packet6 = pkt;
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let step = flows::seen_step(cfg.idle_timeout_ns);
    if let Some(flow) = lookup::<V6>(pkt, FLOW_FORWARD) {
        if !pkt.valid {
            return malformed();
        }
        let verdict = on_forward::<V6>(ctx, pkt, flow, now, step);
        if verdict != flows::REOPEN {
            return verdict;
        }
    }
    if let Some(flow) = lookup::<V6>(pkt, FLOW_REPLY) {
        if !pkt.valid {
            return malformed();
        }
        return on_reply::<V6>(ctx, pkt, flow, now, step);
    }
    if let Some(service) = V6::vip(pkt) {
        if pkt.flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN {
            if !pkt.valid {
                return malformed();
            }
            let verdict = conntrack6::open(pkt, &service, &cfg, now);
            if verdict != conntrack6::OPENED {
                return verdict;
            }
            return match lookup::<V6>(pkt, FLOW_FORWARD) {
                Some(flow) => on_forward::<V6>(ctx, pkt, flow, now, step),
                // Removed meanwhile (an RST of the same flow on another CPU): it passes
                // untouched, as a packet of no flow.
                None => TC_ACT_OK as i32,
            };
        }
        if pkt.ext {
            return malformed();
        }
    }
    TC_ACT_OK as i32
}
