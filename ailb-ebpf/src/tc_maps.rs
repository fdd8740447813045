//! The TC datapath's maps (layouts: `ailb_common::abi::tc`) and their accessors.

use core::{
    intrinsics::{atomic_xadd, AtomicOrdering},
    ptr,
};

use ailb_common::abi::*;
use aya_ebpf::{
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::btf_map,
};

#[btf_map]
pub(crate) static AILB_FLOWS: HashMap<FlowKey, Flow, { FLOW_ENTRIES as usize }> = HashMap::new();
#[btf_map]
pub(crate) static AILB_TC_CONFIG: Array<TcConfig, 1> = Array::new();
#[btf_map]
pub(crate) static AILB_TC_MODELS: Array<TcModel, { MAX_MODELS as usize }> = Array::new();
#[btf_map]
pub(crate) static AILB_TC_STATS: PerCpuArray<TcStats, 1> = PerCpuArray::new();
/// Per-CPU room for the copy of the model's state that a SYN's pick reads: next to the rest
/// of the open path it does not fit the 512 bytes of BPF stack. Only one program run uses a
/// CPU's slot at a time; never pinned (it holds nothing between runs).
#[btf_map]
static AILB_TC_SCRATCH: PerCpuArray<ModelState, 1> = PerCpuArray::new();

/// The NAT port cursor, one for all CPUs: the offset in the port range where the next
/// masqueraded flow's probes start. It lives with the program (never pinned): a daemon
/// restart keeps the program, and with it the cursor; a fresh load starts it at 0.
#[btf_map]
static AILB_TC_NAT_CURSOR: Array<u64, 1> = Array::new();

/// The shared NAT port cursor's value. A plain read: the fetching atomic add needs BPF CPU v3
/// and this object is built for the generic CPU, so two SYNs on two CPUs may read the same
/// value; their no-exist inserts then give them consecutive ports.
#[inline(always)]
pub(crate) fn nat_cursor() -> u64 {
    match AILB_TC_NAT_CURSOR.get_ptr(0) {
        // SAFETY: a non-null array map value pointer, 8-byte aligned, valid for this run.
        Some(p) => unsafe { ptr::read_volatile(p) },
        None => 0,
    }
}

/// Moves the shared NAT port cursor on by `by` (an atomic add, so no CPU's step is lost).
#[inline(always)]
pub(crate) fn nat_cursor_advance(by: u64) {
    if let Some(p) = AILB_TC_NAT_CURSOR.get_ptr_mut(0) {
        // SAFETY: a non-null, 8-byte aligned u64 array map value valid for this run; every
        // writer uses this atomic add. The result is unused: a BPF atomic add.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, by) };
    }
}

/// A copy of `AILB_MODELS[model]`, taken once so that `active` and the slot it selects are
/// read together (as connect4's copy on its stack).
#[inline(always)]
pub(crate) fn model_state(model: u32) -> Option<&'static ModelState> {
    let src = crate::maps::AILB_MODELS.get_ptr(model)?;
    let dst = AILB_TC_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: both are non-null map value pointers of `ModelState`, valid for this run, in
    // different maps; the per-CPU slot is this run's alone (migration is disabled).
    unsafe {
        ptr::copy_nonoverlapping(src, dst, 1);
        Some(&*dst)
    }
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

/// A copy of model `model`'s remote-client settings (all zero when never written).
#[inline(always)]
pub(crate) fn tc_model(model: u32) -> TcModel {
    match AILB_TC_MODELS.get_ptr(model) {
        // SAFETY: a non-null array map value pointer; copied at once.
        Some(p) => unsafe { ptr::read(p) },
        None => TcModel::default(),
    }
}
