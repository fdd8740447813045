//! Kernel memory of the pinned maps, as the kernel charges it (`memlock` in the map's
//! `/proc/self/fdinfo` entry), and what one model, one backend and one affinity entry cost.
#![forbid(unsafe_code)]

use std::{
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use ailb_common::{maps, MEMBER_CHUNK, TABLE_CHUNK};
use aya::maps::MapData;
use serde::Serialize;

use super::{io_err, map_err, DatapathError};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MapMemory {
    pub name: &'static str,
    pub max_entries: u32,
    pub value_size: u32,
    /// What the kernel charges for the map (its `memlock`), bytes.
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct KernelMemory {
    /// Every pinned map.
    pub maps: Vec<MapMemory>,
    pub total_bytes: u64,
    /// One model index, used or not: its `AILB_MODELS` entry, its `AILB_MODEL_NAMES` entry
    /// and its two `AILB_INFLIGHT` counters; its table and members are in the arenas
    /// (`ModelStatus::kernel_bytes` adds them).
    pub per_model_bytes: u64,
    /// One backend id, used or not: its `AILB_BACKENDS` and `AILB_BACKEND_ADDRS6` entries, its per-CPU
    /// `AILB_BACKEND_STATS` entry (on every possible CPU) and its two `AILB_INFLIGHT` counters.
    pub per_backend_bytes: u64,
    /// One `AILB_AFFINITY` entry (the LRU map holds all of them from the start).
    pub per_affinity_entry_bytes: u64,
    /// Bytes of one table slot and of one member id in the arenas.
    pub per_table_slot_bytes: u64,
    pub per_member_bytes: u64,
    /// The arenas: slots (ids) they hold and those the active tables (member lists) take.
    pub table_arena: ArenaMemory,
    pub member_arena: ArenaMemory,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ArenaMemory {
    pub capacity: u64,
    pub used: u64,
    pub used_bytes: u64,
}

/// `memlock` of the map behind `fd`, from `/proc/self/fdinfo`.
fn memlock(fd: i32) -> Result<u64, DatapathError> {
    let path = format!("/proc/self/fdinfo/{fd}");
    let text = std::fs::read_to_string(&path).map_err(io_err("read", Path::new(&path)))?;
    text.lines()
        .find_map(|l| l.strip_prefix("memlock:").and_then(|v| v.trim().parse().ok()))
        .ok_or_else(|| DatapathError::State { path: path.into(), reason: "no memlock line".into() })
}

fn map_memory(dir: &Path, name: &'static str) -> Result<MapMemory, DatapathError> {
    let md = MapData::from_pin(dir.join(name)).map_err(map_err(name))?;
    let info = md.info().map_err(map_err(name))?;
    let bytes = memlock(md.fd().as_fd().as_raw_fd())?;
    Ok(MapMemory { name, max_entries: info.max_entries(), value_size: info.value_size(), bytes })
}

/// Bytes per entry of a map.
fn per_entry(m: &MapMemory) -> u64 {
    m.bytes / u64::from(m.max_entries.max(1))
}

/// The memory of every map pinned in `dir`; `used` holds the arena slots and member ids
/// the active tables take (chunks rounded up).
pub fn read_memory(dir: &Path, used: (u64, u64)) -> Result<KernelMemory, DatapathError> {
    let all: Vec<MapMemory> = maps::ALL.iter().map(|&n| map_memory(dir, n)).collect::<Result<_, _>>()?;
    let get = |name: &str| all.iter().find(|m| m.name == name).cloned().expect("maps::ALL names every map");
    // Two u64 counters in `AILB_INFLIGHT` (connections and memory for a backend; connections
    // and the round-robin turn for a model).
    let counter = 2 * 8;
    let arena = |name: &str, chunk: u32, used: u64| {
        let m = get(name);
        let capacity = u64::from(m.max_entries) * u64::from(chunk);
        ArenaMemory { capacity, used, used_bytes: used * m.bytes / capacity.max(1) }
    };
    Ok(KernelMemory {
        total_bytes: all.iter().map(|m| m.bytes).sum(),
        per_model_bytes: per_entry(&get(maps::MODELS)) + per_entry(&get(maps::MODEL_NAMES)) + counter,
        per_backend_bytes: per_entry(&get(maps::BACKENDS))
            + per_entry(&get(maps::BACKEND_ADDRS6))
            + per_entry(&get(maps::BACKEND_STATS))
            + counter,
        per_affinity_entry_bytes: per_entry(&get(maps::AFFINITY)),
        per_table_slot_bytes: 4,
        per_member_bytes: 4,
        table_arena: arena(maps::TABLES, TABLE_CHUNK, used.0),
        member_arena: arena(maps::MEMBERS, MEMBER_CHUNK, used.1),
        maps: all,
    })
}
