//! The TC datapath's maps (layouts: `ailb_common::abi::tc`) and their accessors.

use core::{
    intrinsics::{atomic_xadd, AtomicOrdering},
    ptr,
};

use ailb_common::abi::*;

use crate::packet::Packet6;
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, TC_ACT_SHOT},
    btf_maps::{Array, HashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
};

#[btf_map]
pub(crate) static AILB_FLOWS: HashMap<FlowKey, Flow, { FLOW_ENTRIES as usize }> = HashMap::new();
/// Remote IPv6 clients' flows, as `AILB_FLOWS` (layouts: `ailb_common::abi::tc`). Not
/// preallocated: a gateway without IPv6 clients holds no memory for them (an entry is
/// allocated at the SYN that opens it); a full map refuses an insert as `AILB_FLOWS` does.
#[btf_map]
pub(crate) static AILB_FLOWS6: HashMap<FlowKey6, Flow6, { FLOW6_ENTRIES as usize }, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();
#[btf_map]
pub(crate) static AILB_TC_CONFIG: Array<TcConfig, 1> = Array::new();
#[btf_map]
static AILB_TC_CONFIG6: Array<TcConfig6, 1> = Array::new();
#[btf_map]
pub(crate) static AILB_TC_MODELS: Array<TcModel, { MAX_MODELS as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_TC_STATS: PerCpuArray<TcStats, 1> = PerCpuArray::new();
/// Per-CPU room for the copy of the model's state that a SYN's pick reads (what the pick
/// reads of it, `ModelView`): next to the rest of the open path it does not fit the 512 bytes
/// of BPF stack. Only one program run uses a CPU's slot at a time; never pinned (it holds
/// nothing between runs).
#[btf_map]
static AILB_TC_SCRATCH: PerCpuArray<ModelView, 1> = PerCpuArray::new();

/// The programs `ailb_tc_ingress` tail-calls, by [`TC_PROG_IPV6`]: filled by the daemon at a
/// fresh load, pinned (a program array's slots are emptied when no pin or file descriptor of
/// it is left).
#[btf_map]
pub(crate) static AILB_TC_PROGS: ProgramArray<{ TC_PROGS as usize }> = ProgramArray::new();

/// This CPU's slot for the IPv6 packet being handled (its parsed fields).
#[btf_map]
static AILB_TC_PKT6: PerCpuArray<Packet6, 1> = PerCpuArray::new();

/// This CPU's [`Packet6`] slot, for one `ailb_tc_ingress6` run at a time.
#[inline(always)]
pub(crate) fn pkt6_scratch() -> Option<&'static mut Packet6> {
    // SAFETY: a per-CPU slot is only touched by the program running on this CPU (migration is
    // disabled), and only by `ailb_tc_ingress6`; valid for the whole run.
    AILB_TC_PKT6.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// An IPv6 SYN's flow entries while they are built ([`open6_scratch`]).
pub(crate) struct Open6 {
    pub flow: Flow6,
    pub fk: FlowKey6,
    pub rk: FlowKey6,
}

/// Per-CPU room for an IPv6 open's entries, which do not fit the BPF stack next to the pick;
/// never pinned (it holds nothing between runs), as `AILB_TC_SCRATCH`.
#[btf_map]
static AILB_TC_SCRATCH6: PerCpuArray<Open6, 1> = PerCpuArray::new();

/// This CPU's [`Open6`] slot.
#[inline(always)]
pub(crate) fn open6_scratch() -> Option<&'static mut Open6> {
    // SAFETY: a per-CPU slot is only touched by the program running on this CPU (migration is
    // disabled), and only by one open at a time; valid for the whole run.
    AILB_TC_SCRATCH6.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The NAT port cursors, one for all CPUs per family ([`NAT_CURSOR_V4`], [`NAT_CURSOR_V6`]):
/// the offset in the port range where the next masqueraded flow's probes start. IPv6 flows
/// have their own NAT address, so their ports are another space; a cursor of their own keeps
/// a port from coming round sooner because of the other family's flows. It lives with the
/// program (never pinned): a daemon restart keeps the program, and with it the cursors; a
/// fresh load starts them at 0.
#[btf_map]
static AILB_TC_NAT_CURSOR: Array<u64, 2> = Array::new();
/// [`nat_cursor`] slot of the IPv4 flows.
pub(crate) const NAT_CURSOR_V4: u32 = 0;
/// [`nat_cursor`] slot of the IPv6 flows.
pub(crate) const NAT_CURSOR_V6: u32 = 1;

/// The shared NAT port cursor's value. A plain read: the fetching atomic add needs BPF CPU v3
/// and this object is built for the generic CPU, so two SYNs on two CPUs may read the same
/// value; their no-exist inserts then give them consecutive ports.
#[inline(always)]
pub(crate) fn nat_cursor(slot: u32) -> u64 {
    match AILB_TC_NAT_CURSOR.get_ptr(slot) {
        // SAFETY: a non-null array map value pointer, 8-byte aligned, valid for this run.
        Some(p) => unsafe { ptr::read_volatile(p) },
        None => 0,
    }
}

/// Moves the shared NAT port cursor `slot` on by `by` (an atomic add, so no CPU's step is lost).
#[inline(always)]
pub(crate) fn nat_cursor_advance(slot: u32, by: u64) {
    if let Some(p) = AILB_TC_NAT_CURSOR.get_ptr_mut(slot) {
        // SAFETY: a non-null, 8-byte aligned u64 array map value valid for this run; every
        // writer uses this atomic add. The result is unused: a BPF atomic add.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, by) };
    }
}

/// The pick's copy of `AILB_MODELS[model]` (`ModelView`), taken once so that `active` and
/// the slot it selects are read together (as connect4's copy on its stack), in the scratch slot.
#[inline(always)]
pub(crate) fn model_state(model: u32) -> Option<&'static ModelView> {
    let src = crate::maps::AILB_MODELS.get_ptr(model)?;
    let dst = AILB_TC_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: both are non-null map value pointers, valid for this run, in different maps;
    // the per-CPU slot is this run's alone (migration is disabled). `active & 1` keeps the
    // slot index in range.
    unsafe {
        let active = ptr::read_volatile(ptr::addr_of!((*src).active));
        (*dst).flags = (*src).flags;
        ptr::copy_nonoverlapping(ptr::addr_of!((*src).slots[(active & 1) as usize]), ptr::addr_of_mut!((*dst).slot), 1);
        (*dst).affinity_ttl_ns = (*src).affinity_ttl_ns;
        (*dst).prefix_ttl_ns = (*src).prefix_ttl_ns;
        Some(&*dst)
    }
}

/// Counts a dropped malformed packet.
#[inline(always)]
pub(crate) fn malformed() -> i32 {
    if let Some(s) = tc_stats() {
        s.malformed += 1;
    }
    TC_ACT_SHOT as i32
}

/// The current CPU's TC counters.
#[inline(always)]
pub(crate) fn tc_stats() -> Option<&'static mut TcStats> {
    // SAFETY: a per-CPU array slot is only touched by the program running on this CPU
    // (BPF programs run with migration disabled); the pointer is valid for the whole run.
    AILB_TC_STATS.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// A copy of the TC settings; `None` until the daemon writes them (mode off).
#[inline(always)]
pub(crate) fn tc_config() -> Option<TcConfig> {
    let p = AILB_TC_CONFIG.get_ptr(0)?;
    // SAFETY: a non-null array map value pointer; copied at once.
    let cfg = unsafe { ptr::read(p) };
    (cfg.mode != TC_MODE_OFF).then_some(cfg)
}

/// The IPv6 NAT address (all zero: none).
#[inline(always)]
pub(crate) fn nat_addr6() -> [u32; 4] {
    match AILB_TC_CONFIG6.get_ptr(0) {
        // SAFETY: a non-null array map value pointer; copied at once.
        Some(p) => unsafe { ptr::read(p) }.nat_addr6,
        None => [0; 4],
    }
}

/// A copy of model `model`'s remote-client settings (all zero when never written).
#[inline(always)]
pub(crate) fn tc_model(model: u32) -> TcModel {
    match AILB_TC_MODELS.get_ptr(model) {
        // SAFETY: a non-null array map value pointer; copied at once.
        Some(p) => unsafe { ptr::read(p) },
        None => TcModel::default(),
    }
}
