//! Reading one model's table out of a daemon's pinned maps (read-only, through the userspace
//! crate's typed map handles), and comparing the tables of several daemons.
//!
//! A backend id is the daemon's own handle: ids are given out lowest-free in the order a daemon
//! saw backends come and go, and a backend that left keeps its id until its last connection on
//! *that* daemon closes. So two daemons can hold the same table under different ids. What must
//! agree is the table mapped to addresses ([`AddressView`]); the raw ids ([`RawView`]) agree only
//! while the daemons saw the same history of in-flight counts.

use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::path::Path;
use std::time::{Duration, Instant};

use ailb_common::{maps, Backend, ModelState, MAX_MODELS, MAX_TABLE_SIZE, MODEL_AVAILABLE, NO_BACKEND};
use ailb_userspace::datapath::values::{addr_from_be, model_name};
use ailb_userspace::datapath::{Maps, WriterMaps};

/// A backend entry of `AILB_BACKENDS` without its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) weight: u32,
    pub(crate) cap: u32,
    pub(crate) free_mem_mb: u32,
    pub(crate) mem_capacity_mb: u32,
    pub(crate) state: u32,
}

impl From<&Backend> for Entry {
    fn from(b: &Backend) -> Self {
        Self {
            weight: b.weight,
            cap: b.cap,
            free_mem_mb: b.free_mem_mb,
            mem_capacity_mb: b.mem_capacity_mb,
            state: b.state,
        }
    }
}

/// The active table of a model with every id replaced by its backend's address: what decides
/// where a connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AddressView {
    pub(crate) size: u32,
    pub(crate) total_weight: u64,
    /// The backends the table holds, with their entries.
    pub(crate) members: BTreeMap<SocketAddrV4, Entry>,
    /// Slot i -> the address of its backend (`None`: an empty slot).
    pub(crate) slots: Vec<Option<SocketAddrV4>>,
}

/// The same table as the daemon stores it: raw slot ids and the id of each address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawView {
    pub(crate) slots: Vec<u32>,
    pub(crate) ids: BTreeMap<SocketAddrV4, u32>,
}

/// One read of one daemon's table for a model.
#[derive(Clone, Debug)]
pub(crate) struct Dump {
    pub(crate) by_address: AddressView,
    pub(crate) raw: RawView,
    /// `AILB_BACKENDS` entries of the model that the table does not hold (retired backends still
    /// draining connections of this daemon), by address.
    pub(crate) outside_table: BTreeMap<SocketAddrV4, Entry>,
}

impl AddressView {
    /// Table slots per address.
    pub(crate) fn shares(&self) -> BTreeMap<SocketAddrV4, usize> {
        let mut m = BTreeMap::new();
        for a in self.slots.iter().flatten() {
            *m.entry(*a).or_insert(0) += 1;
        }
        m
    }

    pub(crate) fn weight(&self, addr: &SocketAddrV4) -> Option<u32> {
        self.members.get(addr).map(|e| e.weight)
    }
}

fn model_state(m: &Maps, model: &str) -> Result<(u32, ModelState), String> {
    for idx in 0..MAX_MODELS {
        let st = m.models.get(&idx, 0).map_err(|e| format!("{}[{idx}]: {e}", maps::MODELS))?;
        if model_name(&st) == model {
            return Ok((idx, st));
        }
    }
    Err(format!("model {model} is not in {}", maps::MODELS))
}

/// Reads model `model`'s active table and backend entries from the maps pinned under `bpffs`.
/// With `scan_all`, also every other backend entry of the model (one lookup per backend id:
/// once per phase, not in a polling loop).
pub(crate) fn dump(bpffs: &Path, model: &str, scan_all: bool) -> Result<Dump, String> {
    // The reader runs on a thread of its own with a large stack: map values are read by value
    // (copied a few times in a debug build).
    let (bpffs, model) = (bpffs.to_path_buf(), model.to_owned());
    std::thread::Builder::new()
        .stack_size(READ_STACK)
        .spawn(move || dump_on_this_thread(&bpffs, &model, scan_all))
        .map_err(|e| format!("spawning a map reader thread: {e}"))?
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Stack of the thread that reads a table row.
const READ_STACK: usize = 16 << 20;

fn dump_on_this_thread(bpffs: &Path, model: &str, scan_all: bool) -> Result<Dump, String> {
    let m = Maps::open(bpffs).map_err(|e| format!("opening the maps under {}: {e}", bpffs.display()))?;
    let (idx, st) = model_state(&m, model)?;
    let slot = *st.active_slot();
    if st.flags & MODEL_AVAILABLE == 0 || slot.size == 0 || slot.size > MAX_TABLE_SIZE {
        return Err(format!("model {model} has no usable table (flags {}, size {})", st.flags, slot.size));
    }
    let slots: Vec<u32> = m.table(slot.table_offset, slot.size).map_err(|e| format!("{}: {e}", maps::TABLES))?;
    let mut by_id: BTreeMap<u32, (SocketAddrV4, Entry)> = BTreeMap::new();
    for &id in &slots {
        if id == NO_BACKEND || by_id.contains_key(&id) {
            continue;
        }
        let b = m.backends.get(&id, 0).map_err(|e| format!("{}[{id}]: {e}", maps::BACKENDS))?;
        by_id.insert(id, (addr_from_be(b.addr, b.port), Entry::from(&b)));
    }
    let mut outside_table = BTreeMap::new();
    if scan_all {
        for id in 0..ailb_common::MAX_BACKENDS {
            let b = m.backends.get(&id, 0).map_err(|e| format!("{}[{id}]: {e}", maps::BACKENDS))?;
            if (b.addr != 0 || b.port != 0) && b.model == idx && !by_id.contains_key(&id) {
                outside_table.insert(addr_from_be(b.addr, b.port), Entry::from(&b));
            }
        }
    }
    let by_address = AddressView {
        size: slot.size,
        total_weight: slot.total_weight,
        members: by_id.values().cloned().collect(),
        slots: slots.iter().map(|id| by_id.get(id).map(|(a, _)| *a)).collect(),
    };
    let raw = RawView { ids: by_id.iter().map(|(id, (a, _))| (*a, *id)).collect(), slots };
    Ok(Dump { by_address, raw, outside_table })
}

/// [`dump`] that panics with the reason.
pub(crate) fn must_dump(bpffs: &Path, model: &str, scan_all: bool) -> Dump {
    dump(bpffs, model, scan_all).unwrap_or_else(|e| panic!("reading the table of {}: {e}", bpffs.display()))
}

/// The first slot at which two address views differ, for failure messages.
pub(crate) fn first_difference(a: &AddressView, b: &AddressView) -> String {
    if a.size != b.size || a.total_weight != b.total_weight {
        return format!("size {} vs {}, total weight {} vs {}", a.size, b.size, a.total_weight, b.total_weight);
    }
    if a.members != b.members {
        return format!("members {:?} vs {:?}", a.members, b.members);
    }
    let n = a.slots.iter().zip(&b.slots).filter(|(x, y)| x != y).count();
    match a.slots.iter().zip(&b.slots).position(|(x, y)| x != y) {
        Some(i) => {
            format!("{n} of {} slots differ, the first is slot {i}: {:?} vs {:?}", a.size, a.slots[i], b.slots[i])
        }
        None => "no difference".into(),
    }
}

/// When each daemon first showed the table all of them ended up agreeing on.
#[derive(Debug)]
pub(crate) struct Convergence {
    /// Per daemon, from the registry write to its first read showing the final table.
    pub(crate) took: Vec<Duration>,
    pub(crate) table: AddressView,
}

impl Convergence {
    /// Slowest minus fastest.
    pub(crate) fn spread(&self) -> Duration {
        let max = self.took.iter().max().copied().unwrap_or_default();
        let min = self.took.iter().min().copied().unwrap_or_default();
        max - min
    }
}

/// Polls every daemon's table from `t0` (the moment the registry had the change) until all of
/// them satisfy `changed` and are equal by address, then reports, per daemon, when its reads
/// first showed that final table. Panics after `timeout` with each daemon's last view.
pub(crate) fn converge(
    pins: &[&Path],
    model: &str,
    t0: Instant,
    timeout: Duration,
    changed: impl Fn(&AddressView) -> bool,
) -> Convergence {
    // Per daemon: every distinct view seen, with the time of the read that first showed it.
    let mut history: Vec<Vec<(Duration, AddressView)>> = vec![Vec::new(); pins.len()];
    loop {
        for (h, pin) in history.iter_mut().zip(pins) {
            // A read that races a table swap may fail; the next read is a few ms away.
            let Ok(d) = dump(pin, model, false) else { continue };
            let at = t0.elapsed();
            if h.last().is_none_or(|(_, v)| *v != d.by_address) {
                h.push((at, d.by_address));
            }
        }
        let lasts: Vec<Option<&AddressView>> = history.iter().map(|h| h.last().map(|(_, v)| v)).collect();
        if let Some(Some(first)) = lasts.first() {
            if lasts.iter().all(|v| v.is_some_and(|v| v == *first && changed(v))) {
                let took = history
                    .iter()
                    .map(|h| {
                        h.iter().find(|(_, v)| v == *first).map(|(t, _)| *t).expect("the last view is in the history")
                    })
                    .collect();
                return Convergence { took, table: (*first).clone() };
            }
        }
        if t0.elapsed() > timeout {
            let states: Vec<String> = lasts
                .iter()
                .zip(pins)
                .map(|(v, p)| format!("{}: {:?}", p.display(), v.map(|v| (changed(v), v.shares()))))
                .collect();
            panic!("the daemons did not converge on one changed table within {timeout:?}: {states:#?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
