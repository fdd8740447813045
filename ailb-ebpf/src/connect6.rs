//! `cgroup/connect6`: a TCP connect of an IPv6 socket to a VIP is rewritten to the backend
//! the pick chooses among those an IPv6 socket reaches (IPv6 backends, and IPv4 ones through
//! their v4-mapped address `::ffff:a.b.c.d`), or refused with `ECONNREFUSED`.
//!
//! The VIP is an IPv6 one (`AILB_SERVICES6`), or an IPv4 one written v4-mapped: a dual-stack
//! socket connecting to `::ffff:a.b.c.d` runs this hook and not `cgroup/connect4`, so without
//! the second lookup such a client would bypass the balancer. A backend reached v4-mapped
//! needs a dual-stack socket; on an `IPV6_V6ONLY` socket that connect fails (`ENETUNREACH`).

use core::ptr;

use ailb_common::{
    abi::*,
    pick::{ClientFamily, Outcome},
};
use aya_ebpf::{bindings::bpf_sock_addr, macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{
    connect4::{pick_connect, refuse_connect},
    maps::{backend_addr6, AILB_SERVICES, AILB_SERVICES6},
    AF_INET6, ALLOW, IPPROTO_TCP, SOCK_STREAM,
};

#[cgroup_sock_addr(connect6)]
pub fn ailb_connect6(ctx: SockAddrContext) -> i32 {
    try_connect6(&ctx)
}

#[inline(always)]
fn try_connect6(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel passes a valid bpf_sock_addr context for the whole run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(service) = vip_service6(sa) else {
        return ALLOW;
    };
    let picked = match pick_connect(ctx, sa, &service, ClientFamily::Ipv6) {
        Ok(p) => p,
        Err(verdict) => return verdict,
    };
    let addr = if picked.backend.is_ipv6() {
        match backend_addr6(picked.id) {
            Some(a) => a,
            None => return refuse_connect(Outcome::NoBackend),
        }
    } else {
        v4_to_mapped(picked.backend.addr)
    };
    write_ip6(sa, &addr);
    sa.user_port = picked.backend.port as u32;
    picked.commit();
    ALLOW
}

/// The VIP entry of a TCP/IPv6 connect's destination (an IPv6 VIP, or an IPv4 one
/// v4-mapped); `None` for any other connect.
#[inline(always)]
fn vip_service6(sa: &bpf_sock_addr) -> Option<Service> {
    if sa.user_family != AF_INET6 || sa.type_ != SOCK_STREAM || sa.protocol != IPPROTO_TCP {
        return None;
    }
    let addr = read_ip6(sa);
    let port = sa.user_port as u16;
    let service = match v4_mapped(&addr) {
        Some(v4) => AILB_SERVICES.get_ptr(ServiceKey { addr: v4, port, _pad: 0 })?,
        None => AILB_SERVICES6.get_ptr(ServiceKey6 { addr, port, _pad: 0 })?,
    };
    // SAFETY: a non-null hash map value pointer; copied at once (an update may replace it).
    Some(unsafe { ptr::read(service) })
}

/// `user_ip6`, read one 32-bit word at a time (the context allows no wider access).
#[inline(always)]
fn read_ip6(sa: &bpf_sock_addr) -> [u32; 4] {
    let mut addr = [0u32; 4];
    for (i, w) in addr.iter_mut().enumerate() {
        // SAFETY: `i < 4`, an aligned u32 of the context; a volatile read keeps it one load.
        *w = unsafe { ptr::read_volatile(ptr::addr_of!(sa.user_ip6[i])) };
    }
    addr
}

/// Writes `user_ip6` one 32-bit word at a time (the verifier refuses wider stores to it).
#[inline(always)]
fn write_ip6(sa: &mut bpf_sock_addr, addr: &[u32; 4]) {
    for (i, w) in addr.iter().enumerate() {
        // SAFETY: `i < 4`, an aligned u32 of the writable context; one 32-bit store each.
        unsafe { ptr::write_volatile(ptr::addr_of_mut!(sa.user_ip6[i]), *w) };
    }
}
