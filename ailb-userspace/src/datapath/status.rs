//! `ailb status`: everything read back from the pinned maps (works while the daemon is down).

use std::{collections::BTreeMap, path::Path};

use ailb_common::{
    maps, BackendStats, Stats, CONFIG_AFFINITY, CONFIG_LOAD_BOUND, CONFIG_ROUND_ROBIN, INFLIGHT_MEM_BASE,
    INFLIGHT_MODEL_BASE, MAX_BACKENDS, MAX_MODELS, MAX_TABLE_SIZE, MEMBER_CHUNK, MEM_UNKNOWN, MODEL_AVAILABLE,
    TABLE_CHUNK,
};
use serde::Serialize;

use super::{
    map_err,
    memory::{read_memory, KernelMemory},
    store::WriterMaps,
    values::{addr6_from_be, addr_from_be, backend_address, model_name},
    DatapathError, Maps,
};

#[derive(Debug, Default, Serialize)]
pub struct Status {
    pub bpffs: String,
    pub abi_version: u32,
    pub generation: u64,
    pub config: ConfigStatus,
    pub stats: Stats,
    pub models: Vec<ModelStatus>,
    /// The TC datapath for remote clients; absent when it is attached to no interface.
    pub tc: Option<super::tc::TcStatus>,
    pub kernel_memory: KernelMemory,
}

#[derive(Debug, Default, Serialize)]
pub struct ConfigStatus {
    pub load_factor: f64,
    /// A prefix holder's load bound factor.
    pub prefix_load_factor: f64,
    pub probes: u32,
    pub affinity: bool,
    pub load_bound: bool,
    pub round_robin: bool,
    pub affinity_ttl_ms: u64,
    pub affinity_wait_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct ModelStatus {
    pub id: u32,
    pub name: String,
    pub vips: Vec<String>,
    pub available: bool,
    pub table_size: u32,
    /// A hash of the active table's slots and members (backend ids, which a restart keeps):
    /// equal digests, equal picks for every conversation. `None` while unavailable.
    pub table_digest: Option<String>,
    pub inflight: u64,
    /// Kernel memory this model takes: its fixed entries (`KernelMemory::per_model_bytes`),
    /// its active table and member list in the arenas (whole chunks), and its backends
    /// (`KernelMemory::per_backend_bytes` each).
    pub kernel_bytes: u64,
    /// The prefix map's side of the model: its mode, entries and what the searches found.
    pub prefix: super::prefix::PrefixStatus,
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Serialize)]
pub struct BackendStatus {
    pub id: u32,
    pub address: String,
    pub weight: u32,
    pub cap: u32,
    pub free_mem_mb: Option<u32>,
    /// Memory when idle (the queueing fallback of the memory fit); `None`: no fallback.
    pub mem_capacity_mb: Option<u32>,
    pub live: bool,
    pub table_slots: u32,
    pub table_share: f64,
    pub inflight: u64,
    /// The memory hints of the connections in flight, summed (MB): the fit subtracts them
    /// from `mem_capacity_mb`.
    pub inflight_mem_mb: u64,
    pub picks: u64,
    pub affinity_hits: u64,
    pub established: u64,
    pub closed: u64,
    pub connect_failures: u64,
    pub rtt_us_avg: Option<f64>,
}

fn sum_stats(maps: &Maps) -> Result<Stats, DatapathError> {
    let per_cpu = maps.stats.get(&0, 0).map_err(map_err(maps::STATS))?;
    let mut s = Stats::default();
    per_cpu.iter().for_each(|v| s.merge(v));
    Ok(s)
}

fn backend_stats(maps: &Maps, id: u32) -> Result<BackendStats, DatapathError> {
    let per_cpu = maps.backend_stats.get(&id, 0).map_err(map_err(maps::BACKEND_STATS))?;
    let mut s = BackendStats::default();
    per_cpu.iter().for_each(|v| s.merge(v));
    Ok(s)
}

/// The prefix mode a model's flags name.
fn prefix_mode_name(flags: u32) -> &'static str {
    if flags & ailb_common::MODEL_PREFIX_EVENTS != 0 {
        "precise"
    } else if flags & ailb_common::MODEL_PREFIX_LEARN != 0 {
        "approximate"
    } else {
        "off"
    }
}

pub fn read_status(dir: &Path) -> Result<Status, DatapathError> {
    check_attached(dir)?;
    let maps = Maps::open(dir)?;
    let gc = maps.global_config()?;
    let mut vips = read_vips(&maps)?;
    let backends_by_model = read_backends(&maps)?;
    let prefix_map = super::prefix::PrefixMap::open(dir)?;
    let prefix_entries = prefix_map.entries();
    let prefix_stats: BTreeMap<u32, ailb_common::PrefixStats> = prefix_map.stats()?.into_iter().collect();
    let mut models = Vec::new();
    let mut used = (0u64, 0u64);
    let mut arena_bytes = Vec::new();
    for idx in 0..MAX_MODELS {
        let st = maps.models.get(&idx, 0).map_err(map_err(maps::MODELS))?;
        let name = model_name(&st);
        if name.is_empty() {
            continue;
        }
        let available = st.flags & MODEL_AVAILABLE != 0;
        let slot = *st.active_slot();
        let (slots, table_digest) = active_table(&maps, available, &slot)?;
        let (t, m) =
            if available { (round_up(slot.size, TABLE_CHUNK), round_up(slot.members, MEMBER_CHUNK)) } else { (0, 0) };
        used = (used.0 + t, used.1 + m);
        arena_bytes.push(4 * (t + m));
        let mut backends = Vec::new();
        for &(id, b) in backends_by_model.get(&idx).map(Vec::as_slice).unwrap_or(&[]) {
            backends.push(backend_status(&maps, id, &b, slots.get(&id).copied().unwrap_or(0), slot.size)?);
        }
        models.push(ModelStatus {
            id: idx,
            name,
            vips: vips.remove(&idx).unwrap_or_default(),
            available,
            table_size: if available { slot.size } else { 0 },
            table_digest,
            inflight: maps.inflight.get(&(INFLIGHT_MODEL_BASE + idx), 0).map_err(map_err(maps::INFLIGHT))?,
            kernel_bytes: 0,
            prefix: super::prefix::PrefixStatus {
                mode: prefix_mode_name(st.flags).to_string(),
                entries: prefix_entries.get(&idx).copied().unwrap_or(0),
                ttl_ms: st.prefix_ttl_ns / 1_000_000,
                stats: prefix_stats.get(&idx).copied().unwrap_or_default().into(),
            },
            backends,
        });
    }
    let kernel_memory = read_memory(dir, used)?;
    for (m, arena) in models.iter_mut().zip(arena_bytes) {
        m.kernel_bytes =
            kernel_memory.per_model_bytes + arena + m.backends.len() as u64 * kernel_memory.per_backend_bytes;
    }
    Ok(Status {
        bpffs: dir.display().to_string(),
        abi_version: gc.abi_version,
        generation: gc.generation,
        config: ConfigStatus {
            load_factor: gc.load_factor_milli as f64 / 1000.0,
            prefix_load_factor: gc.prefix_load_factor_milli as f64 / 1000.0,
            probes: gc.probes,
            affinity: gc.flags & CONFIG_AFFINITY != 0,
            load_bound: gc.flags & CONFIG_LOAD_BOUND != 0,
            round_robin: gc.flags & CONFIG_ROUND_ROBIN != 0,
            affinity_ttl_ms: gc.affinity_ttl_ns / 1_000_000,
            affinity_wait_ms: gc.affinity_wait_ns / 1_000_000,
        },
        stats: sum_stats(&maps)?,
        models,
        tc: if super::tc::interfaces(dir).is_empty() { None } else { Some(super::tc::read_status(dir)?) },
        kernel_memory,
    })
}

/// Readiness: the daemon pins the links last, after the first tables are written. A pin that
/// cannot be looked up for another reason (EACCES: a pin directory of another user) is that
/// error, not "not attached".
fn check_attached(dir: &Path) -> Result<(), DatapathError> {
    for p in ailb_common::programs::ALL {
        let pin = super::link_pin(dir, p);
        match std::fs::symlink_metadata(&pin) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(DatapathError::State {
                    path: dir.to_path_buf(),
                    reason: format!("program {p} is not attached (yet)"),
                })
            }
            Err(e) => return Err(super::io_err("look up link pin", &pin)(e)),
        }
    }
    Ok(())
}

/// Every model's VIPs, both families, by model index.
fn read_vips(maps: &Maps) -> Result<BTreeMap<u32, Vec<String>>, DatapathError> {
    let mut vips: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for item in maps.services.iter() {
        let (k, v) = item.map_err(map_err(maps::SERVICES))?;
        vips.entry(v.model).or_default().push(addr_from_be(k.addr, k.port).to_string());
    }
    for item in maps.services6.iter() {
        let (k, v) = item.map_err(map_err(maps::SERVICES6))?;
        vips.entry(v.model).or_default().push(addr6_from_be(&k.addr, k.port).to_string());
    }
    Ok(vips)
}

/// Every backend entry in use, by model index.
fn read_backends(maps: &Maps) -> Result<BTreeMap<u32, Vec<(u32, ailb_common::Backend)>>, DatapathError> {
    let mut by_model: BTreeMap<u32, Vec<(u32, ailb_common::Backend)>> = BTreeMap::new();
    for id in 0..MAX_BACKENDS {
        let b = maps.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))?;
        if b.addr != 0 || b.port != 0 {
            by_model.entry(b.model).or_default().push((id, b));
        }
    }
    Ok(by_model)
}

/// The active table's slots per backend id, and a digest of the table and its members (equal on
/// every gateway that built the same table). An unavailable model's last table is kept but not
/// used: no backend has a share.
fn active_table(
    maps: &Maps,
    available: bool,
    slot: &ailb_common::abi::TableSlot,
) -> Result<(BTreeMap<u32, u32>, Option<String>), DatapathError> {
    let mut slots: BTreeMap<u32, u32> = BTreeMap::new();
    if !(available && slot.size > 0 && slot.size <= MAX_TABLE_SIZE) {
        return Ok((slots, None));
    }
    let table = maps.table(slot.table_offset, slot.size)?;
    for &id in &table {
        *slots.entry(id).or_default() += 1;
    }
    let members = maps.members(slot.member_offset, slot.members.min(ailb_common::abi::MAX_MEMBERS))?;
    let bytes: Vec<u8> = table.iter().chain(&members).flat_map(|id| id.to_le_bytes()).collect();
    Ok((slots, Some(format!("{:016x}", ailb_common::hash::conversation_hash(&bytes)))))
}

/// One backend's entry, counters and share of a table of `table_size` slots (`n` of them its).
fn backend_status(
    maps: &Maps,
    id: u32,
    b: &ailb_common::Backend,
    n: u32,
    table_size: u32,
) -> Result<BackendStatus, DatapathError> {
    let bs = backend_stats(maps, id)?;
    let addr6 = if b.is_ipv6() { maps.backend_addr6(id)? } else { Default::default() };
    Ok(BackendStatus {
        id,
        address: backend_address(b, &addr6).to_string(),
        weight: b.weight,
        cap: b.cap,
        free_mem_mb: (b.free_mem_mb != MEM_UNKNOWN).then_some(b.free_mem_mb),
        mem_capacity_mb: (b.mem_capacity_mb != 0).then_some(b.mem_capacity_mb),
        live: b.is_live(),
        table_slots: n,
        table_share: if table_size > 0 { n as f64 / table_size as f64 } else { 0.0 },
        inflight: maps.inflight.get(&id, 0).map_err(map_err(maps::INFLIGHT))?,
        inflight_mem_mb: maps.inflight.get(&(INFLIGHT_MEM_BASE + id), 0).map_err(map_err(maps::INFLIGHT))?,
        picks: bs.picks,
        affinity_hits: bs.affinity_hits,
        established: bs.established,
        closed: bs.closed,
        connect_failures: bs.connect_failures,
        rtt_us_avg: (bs.rtt_samples > 0).then(|| bs.rtt_us_sum as f64 / bs.rtt_samples as f64),
    })
}

/// `n` rounded up to whole chunks of `chunk`.
fn round_up(n: u32, chunk: u32) -> u64 {
    u64::from(n.div_ceil(chunk)) * u64::from(chunk)
}
