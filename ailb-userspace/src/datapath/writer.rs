//! Writes a [`Plan`] into the maps. Order matters for readers running concurrently in the
//! kernel: backend entries first (a new table may only name written backends), then each
//! changed model's table into its inactive slot, the slot's description, and only then the
//! flip of `active` (one 4-byte field in one map update: a connect sees the old table or the
//! new one, never a mix), then VIPs, and finally backends that left are retired. A retired
//! backend id is reused only once its in-flight count is 0, so counts never mix.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{Ipv4Addr, SocketAddrV4},
};

use ailb_common::{
    hash::{backend_key, conversation_hash},
    maglev::{self, MaglevBackend},
    maps, row_index, Backend, GlobalConfig, MemberRow, ModelState, Service, ServiceKey, TableRow, TableSlot,
    ABI_VERSION, BACKEND_LIVE, CONFIG_AFFINITY, CONFIG_LOAD_BOUND, CONFIG_ROUND_ROBIN, MAX_BACKENDS, MAX_MEMBERS,
    MAX_MODELS, MAX_MODEL_NAME_LEN, MAX_TABLE_SIZE, MEM_UNKNOWN, MODEL_AVAILABLE, NO_BACKEND,
};
use tracing::{debug, info};

use super::{map_err, tables, DatapathError, Maps};
use crate::{config::ValidConfig, policy::Plan};

pub fn addr_be(a: &SocketAddrV4) -> (u32, u16) {
    (u32::from_ne_bytes(a.ip().octets()), a.port().to_be())
}

pub fn addr_from_be(addr: u32, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(addr.to_ne_bytes()), u16::from_be(port))
}

pub fn model_name(state: &ModelState) -> String {
    let end = state.name.iter().position(|&b| b == 0).unwrap_or(state.name.len());
    String::from_utf8_lossy(&state.name[..end]).into_owned()
}

#[derive(Debug, Default, Clone)]
pub struct ApplyReport {
    pub generation: u64,
    pub tables_rebuilt: Vec<String>,
    pub live_backends: usize,
    pub retired_backends: usize,
}

pub struct Writer {
    maps: Maps,
    /// Model name -> index in `AILB_MODELS`.
    models: BTreeMap<String, u32>,
    /// (model index, address) -> backend id; includes retired ids still in use.
    ids: HashMap<(u32, SocketAddrV4), u32>,
    /// Last written entry per backend id.
    written: HashMap<u32, Backend>,
    /// Removed backends whose ids wait for their in-flight count to reach 0.
    retired: HashMap<(u32, SocketAddrV4), u32>,
    /// Active table and members per model index, as last written or read back.
    tables: HashMap<u32, (Vec<u32>, Vec<u32>)>,
    /// The table builder's inputs of the cached table per model: equal inputs, no rebuild.
    built: HashMap<u32, Vec<MaglevBackend>>,
    generation: u64,
}

impl Writer {
    /// Takes over the maps, reading back the state a previous daemon left (names, ids, tables).
    pub fn new(maps: Maps) -> Result<Self, DatapathError> {
        let mut w = Self {
            generation: maps.global_config()?.generation,
            maps,
            models: BTreeMap::new(),
            ids: HashMap::new(),
            written: HashMap::new(),
            retired: HashMap::new(),
            tables: HashMap::new(),
            built: HashMap::new(),
        };
        for idx in 0..MAX_MODELS {
            let st = w.maps.models.get(&idx, 0).map_err(map_err(maps::MODELS))?;
            let name = model_name(&st);
            if name.is_empty() {
                continue;
            }
            let slot = st.active_slot();
            if slot.size > 0 && slot.size <= MAX_TABLE_SIZE {
                let row = w.maps.tables.get(&row_index(idx, st.active), 0).map_err(map_err(maps::TABLES))?;
                let mem = w.maps.members.get(&row_index(idx, st.active), 0).map_err(map_err(maps::MEMBERS))?;
                let members = mem.ids[..(slot.members.min(MAX_MEMBERS)) as usize].to_vec();
                w.tables.insert(idx, (row.slots[..slot.size as usize].to_vec(), members));
            }
            w.models.insert(name, idx);
        }
        for id in 0..MAX_BACKENDS {
            let b = w.maps.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))?;
            if b.addr != 0 || b.port != 0 {
                w.ids.insert((b.model, addr_from_be(b.addr, b.port)), id);
                w.written.insert(id, b);
            }
        }
        if !w.models.is_empty() {
            info!(
                models = w.models.len(),
                backends = w.ids.len(),
                generation = w.generation,
                "recovered state from pinned maps"
            );
        }
        Ok(w)
    }

    pub fn maps(&self) -> &Maps {
        &self.maps
    }

    /// Frees the ids of removed backends whose in-flight count has reached 0; returns how many.
    pub fn reap(&mut self) -> Result<usize, DatapathError> {
        let mut freed = 0;
        let retired: Vec<_> = self.retired.iter().map(|(k, &id)| (*k, id)).collect();
        for (key, id) in retired {
            let inflight = self.maps.inflight.get(&id, 0).map_err(map_err(maps::INFLIGHT))?;
            if inflight == 0 {
                self.write_backend(id, Backend::default())?;
                self.ids.remove(&key);
                self.written.remove(&id);
                self.retired.remove(&key);
                freed += 1;
            }
        }
        Ok(freed)
    }

    fn free_index(used: impl Iterator<Item = u32>, max: u32, what: &'static str) -> Result<u32, DatapathError> {
        let used: HashSet<u32> = used.collect();
        (0..max).find(|i| !used.contains(i)).ok_or(DatapathError::Full { what, max })
    }

    fn write_backend(&mut self, id: u32, b: Backend) -> Result<(), DatapathError> {
        if self.written.get(&id) != Some(&b) {
            self.maps.backends.set(id, b, 0).map_err(map_err(maps::BACKENDS))?;
            self.written.insert(id, b);
        }
        Ok(())
    }

    pub fn apply(&mut self, plan: &Plan, cfg: &ValidConfig) -> Result<ApplyReport, DatapathError> {
        let generation = self.generation + 1;
        let mut report = ApplyReport { generation, ..Default::default() };

        // Model indices: stable for known names, lowest free index for new ones.
        for name in plan.keys() {
            if !self.models.contains_key(name) {
                let idx = Self::free_index(self.models.values().copied(), MAX_MODELS, "models")?;
                self.models.insert(name.clone(), idx);
            }
        }

        // Backend ids and entries.
        let mut desired: BTreeMap<(u32, u32, u16), (u32, SocketAddrV4, &crate::policy::PlannedBackend)> =
            BTreeMap::new();
        for (name, mp) in plan {
            let midx = self.models[name];
            for b in &mp.backends {
                desired.insert((midx, u32::from(*b.address.ip()), b.address.port()), (midx, b.address, b));
            }
        }
        for &(midx, addr, b) in desired.values() {
            let id = match self.ids.get(&(midx, addr)) {
                Some(&id) => id,
                None => {
                    let id = Self::free_index(self.ids.values().copied(), MAX_BACKENDS, "backends")?;
                    self.ids.insert((midx, addr), id);
                    id
                }
            };
            let (a, p) = addr_be(&addr);
            let entry = Backend {
                addr: a,
                port: p,
                model: midx,
                weight: b.weight,
                cap: b.cap,
                free_mem_mb: b.free_memory_mb.unwrap_or(MEM_UNKNOWN),
                mem_capacity_mb: b.memory_capacity_mb.unwrap_or(0),
                state: if b.eligible && b.weight > 0 { BACKEND_LIVE } else { 0 },
                ..Default::default()
            };
            self.write_backend(id, entry)?;
            if entry.state & BACKEND_LIVE != 0 {
                report.live_backends += 1;
            }
        }

        // Tables: the ones whose builder inputs changed are built together (on all cores), then
        // each model's table is swapped atomically, one model at a time.
        let mut inputs = Vec::with_capacity(plan.len());
        for (name, mp) in plan {
            let midx = self.models[name];
            let mut members: Vec<MaglevBackend> = mp
                .backends
                .iter()
                .filter(|b| b.eligible && b.weight > 0)
                .map(|b| {
                    let (a, p) = addr_be(&b.address);
                    MaglevBackend {
                        id: self.ids[&(midx, b.address)],
                        key: backend_key(a, p, cfg.seed),
                        weight: b.weight,
                    }
                })
                .collect();
            members.sort_by_key(|m| m.id);
            let ttl_ns = mp.affinity_ttl.map_or(0, |t| t.as_nanos().clamp(1, u64::MAX as u128) as u64);
            inputs.push((name, midx, members, ttl_ns));
        }
        let stale: Vec<usize> = (0..inputs.len())
            .filter(|&k| {
                let (_, midx, members, _) = &inputs[k];
                !members.is_empty() && self.built.get(midx).is_none_or(|b| b != members)
            })
            .collect();
        let jobs: Vec<(&[MaglevBackend], u32)> =
            stale.iter().map(|&k| (inputs[k].2.as_slice(), maglev::table_size_for(inputs[k].2.len()))).collect();
        let started = std::time::Instant::now();
        let mut prebuilt: HashMap<usize, tables::Built> = stale.iter().copied().zip(tables::build_all(&jobs)).collect();
        if !jobs.is_empty() {
            debug!(tables = jobs.len(), build_us = started.elapsed().as_micros() as u64, "tables built");
        }
        for (k, (name, _, members, ttl_ns)) in inputs.iter().enumerate() {
            self.write_model(name, members, prebuilt.remove(&k), *ttl_ns, generation, &mut report)?;
        }

        // VIPs and model names.
        let mut want_services = HashMap::new();
        let mut want_names = HashMap::new();
        for (name, mp) in plan {
            let midx = self.models[name];
            want_names.insert(conversation_hash(name.as_bytes()), midx);
            for vip in &mp.vips {
                let (a, p) = addr_be(vip);
                want_services.insert(ServiceKey { addr: a, port: p, _pad: 0 }, Service { model: midx, flags: 0 });
            }
        }
        let old: Vec<ServiceKey> = self.maps.services.keys().filter_map(Result::ok).collect();
        for k in old.iter().filter(|k| !want_services.contains_key(k)) {
            self.maps.services.remove(k).map_err(map_err(maps::SERVICES))?;
        }
        for (k, v) in &want_services {
            if self.maps.services.get(k, 0).ok().as_ref() != Some(v) {
                self.maps.services.insert(k, v, 0).map_err(map_err(maps::SERVICES))?;
            }
        }
        let old: Vec<u64> = self.maps.model_names.keys().filter_map(Result::ok).collect();
        for k in old.iter().filter(|k| !want_names.contains_key(k)) {
            self.maps.model_names.remove(k).map_err(map_err(maps::MODEL_NAMES))?;
        }
        for (k, v) in &want_names {
            self.maps.model_names.insert(k, v, 0).map_err(map_err(maps::MODEL_NAMES))?;
        }

        // Models that left: unavailable, then forgotten.
        let gone: Vec<(String, u32)> =
            self.models.iter().filter(|(n, _)| !plan.contains_key(*n)).map(|(n, &i)| (n.clone(), i)).collect();
        for (name, idx) in gone {
            self.maps.models.set(idx, ModelState::default(), 0).map_err(map_err(maps::MODELS))?;
            self.tables.remove(&idx);
            self.built.remove(&idx);
            self.models.remove(&name);
            info!(model = %name, "model removed");
        }

        // Backends that left: not live at once; their id is freed when nothing is in flight.
        let desired_keys: HashSet<(u32, SocketAddrV4)> = desired.values().map(|&(m, a, _)| (m, a)).collect();
        self.retired = self.ids.iter().filter(|(k, _)| !desired_keys.contains(k)).map(|(k, &id)| (*k, id)).collect();
        let retired: Vec<u32> = self.retired.values().copied().collect();
        for id in retired {
            let mut entry = self.written.get(&id).copied().unwrap_or_default();
            entry.state = 0;
            entry.weight = 0;
            self.write_backend(id, entry)?;
        }
        report.retired_backends = self.reap()?;

        // Knobs and the generation last: a reader that sees the new generation sees all of the above.
        let gc = GlobalConfig {
            abi_version: ABI_VERSION,
            load_factor_milli: cfg.load_factor_milli,
            probes: cfg.probes,
            flags: (if cfg.affinity { CONFIG_AFFINITY } else { 0 })
                | (if cfg.load_bound { CONFIG_LOAD_BOUND } else { 0 })
                | (if cfg.round_robin { CONFIG_ROUND_ROBIN } else { 0 }),
            affinity_ttl_ns: cfg.affinity_ttl.as_nanos().min(u64::MAX as u128) as u64,
            generation,
            affinity_wait_ns: cfg.affinity_wait.as_nanos().min(u64::MAX as u128) as u64,
        };
        self.maps.config.set(0, gc, 0).map_err(map_err(maps::CONFIG))?;
        self.generation = generation;
        Ok(report)
    }

    fn write_model(
        &mut self,
        name: &str,
        members: &[MaglevBackend],
        prebuilt: Option<tables::Built>,
        affinity_ttl_ns: u64,
        generation: u64,
        report: &mut ApplyReport,
    ) -> Result<(), DatapathError> {
        let midx = self.models[name];
        let mut st = self.maps.models.get(&midx, 0).map_err(map_err(maps::MODELS))?;
        let mut name_bytes = [0u8; MAX_MODEL_NAME_LEN];
        name_bytes[..name.len()].copy_from_slice(name.as_bytes());
        let ids: Vec<u32> = members.iter().map(|m| m.id).collect();
        let total_weight: u64 = members.iter().map(|m| m.weight as u64).sum();
        if members.is_empty() {
            if st.flags & MODEL_AVAILABLE != 0 || st.name != name_bytes || st.affinity_ttl_ns != affinity_ttl_ns {
                st.flags = 0;
                st.name = name_bytes;
                st.affinity_ttl_ns = affinity_ttl_ns;
                self.maps.models.set(midx, st, 0).map_err(map_err(maps::MODELS))?;
                info!(model = name, "no live backend: connections to its VIPs are refused");
            }
            self.tables.remove(&midx);
            self.built.remove(&midx);
            return Ok(());
        }
        if st.affinity_ttl_ns != affinity_ttl_ns && st.flags & MODEL_AVAILABLE != 0 {
            // Only the TTL changed: one update of the model entry, no table swap.
            st.affinity_ttl_ns = affinity_ttl_ns;
            self.maps.models.set(midx, st, 0).map_err(map_err(maps::MODELS))?;
        }
        // Same builder inputs as the table in the kernel: nothing to build or write.
        if st.flags & MODEL_AVAILABLE != 0
            && self.tables.contains_key(&midx)
            && self.built.get(&midx).is_some_and(|b| b.as_slice() == members)
        {
            debug!(model = name, "table inputs unchanged");
            return Ok(());
        }
        let size = maglev::table_size_for(members.len());
        let tables::Built { table, took: built } =
            prebuilt.unwrap_or_else(|| tables::build_all(&[(members, size)]).remove(0));
        let table = table.map_err(|source| DatapathError::Table { model: name.to_string(), source })?;
        let started = std::time::Instant::now();
        let unchanged = self.tables.get(&midx).is_some_and(|(t, m)| *t == table && *m == ids)
            && st.flags & MODEL_AVAILABLE != 0
            && st.active_slot().total_weight == total_weight;
        self.built.insert(midx, members.to_vec());
        if unchanged {
            debug!(model = name, "table unchanged");
            return Ok(());
        }
        let inactive = (st.active & 1) ^ 1;
        let row_idx = row_index(midx, inactive);
        let mut row: Box<TableRow> = Box::new(TableRow { slots: [NO_BACKEND; MAX_TABLE_SIZE as usize] });
        row.slots[..table.len()].copy_from_slice(&table);
        self.maps.tables.set(row_idx, row.as_ref(), 0).map_err(map_err(maps::TABLES))?;
        let mut mrow: Box<MemberRow> = Box::new(MemberRow { ids: [NO_BACKEND; MAX_MEMBERS as usize] });
        mrow.ids[..ids.len()].copy_from_slice(&ids);
        self.maps.members.set(row_idx, mrow.as_ref(), 0).map_err(map_err(maps::MEMBERS))?;
        // Describe the inactive slot (readers still use the active one), then flip.
        st.slots[inactive as usize] = TableSlot { size, members: ids.len() as u32, total_weight, generation };
        st.name = name_bytes;
        st.affinity_ttl_ns = affinity_ttl_ns;
        self.maps.models.set(midx, st, 0).map_err(map_err(maps::MODELS))?;
        st.active = inactive;
        st.flags = MODEL_AVAILABLE;
        self.maps.models.set(midx, st, 0).map_err(map_err(maps::MODELS))?;
        let build_us = built.as_micros() as u64;
        let swap_us = started.elapsed().as_micros() as u64;
        info!(model = name, backends = ids.len(), table_size = size, generation, build_us, swap_us, "table swapped");
        report.tables_rebuilt.push(name.to_string());
        self.tables.insert(midx, (table, ids));
        Ok(())
    }
}
