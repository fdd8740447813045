//! Writes a [`Plan`] into the maps. Order matters for readers running concurrently in the
//! kernel: backend entries first (a new table may only name written backends), then each
//! changed model's table into a free extent of the table arena (and its members into one of
//! the member arena), the description of the model's inactive slot, and only then the flip of
//! `active` (one 4-byte field in one map update: a connect sees the old table or the new one,
//! never a mix); the old extents are released, reusable after a grace (`arena.rs`). Then
//! VIPs, and finally backends that left are retired. A retired backend id is reused only once
//! its in-flight count is 0, so counts never mix.
//!
//! The writer reaches the maps through [`WriterMaps`] only; [`Writer::new`] reads back the
//! state a previous daemon left, so that a restart rewrites nothing that did not change.
#![forbid(unsafe_code)]

mod swap;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use ailb_common::{
    hash::conversation_hash, maglev::MaglevBackend, Backend, BackendAddr6, ModelState, Service, ServiceKey,
    BACKEND_IPV6, MAX_BACKENDS, MAX_MEMBERS, MAX_MODELS, MAX_TABLE_SIZE, MEMBER_CHUNK, MODEL_AVAILABLE, TABLE_CHUNK,
};
use tracing::{info, warn};

use super::{
    arena::{Arena, Extent, GRACE},
    ids::{BackendKey, Ids},
    store::WriterMaps,
    values::{self, backend_address, model_name, VipKey},
    DatapathError, Maps, WriterSettings,
};
use crate::policy::{Plan, PlannedBackend};

#[derive(Debug, Default, Clone)]
pub struct ApplyReport {
    pub generation: u64,
    pub tables_rebuilt: Vec<String>,
    pub live_backends: usize,
    /// Ids of removed backends freed by this apply (their in-flight count was 0).
    pub retired_backends: usize,
}

/// The table and member ids in a model's active slot, as last written or read back, and
/// the arena extents that hold them.
struct ActiveTable {
    table: Vec<u32>,
    members: Vec<u32>,
    table_at: Extent,
    members_at: Extent,
}

/// The config fields that size the arenas (named when one is full).
pub const TABLE_SLOTS_FIELD: &str = "limits.table_slots";
pub const MEMBER_SLOTS_FIELD: &str = "limits.member_slots";

/// A backend of the plan with the id it was given.
struct Planned<'p> {
    id: u32,
    model: u32,
    backend: &'p PlannedBackend,
}

pub struct Writer<M: WriterMaps = Maps> {
    maps: M,
    ids: Ids,
    /// Last written entry per backend id.
    written: HashMap<u32, Backend>,
    /// Last written `AILB_BACKEND_ADDRS6` entry per IPv6 backend id.
    written6: HashMap<u32, BackendAddr6>,
    /// Every model index's `ModelState` as last written or read back (the daemon is the only
    /// writer of `AILB_MODELS`, so this is what the kernel holds): a swap reads the entry here,
    /// not with a map lookup per model. [`Writer::new`] fills it from the pinned map.
    states: Vec<ModelState>,
    /// Active table and members per model index, as last written or read back.
    tables: HashMap<u32, ActiveTable>,
    /// The table builder's inputs of the cached table per model: equal inputs, no rebuild.
    built: HashMap<u32, Vec<MaglevBackend>>,
    /// Swaps whose extents are taken but not yet written (`swap.rs`: written a batch at a time).
    swaps: Vec<swap::PendingSwap>,
    table_arena: Arena,
    member_arena: Arena,
    generation: u64,
    /// The VIPs and model names as this writer last wrote them; `None` until its first apply,
    /// which reads the maps (a previous daemon's entries) and writes every one.
    services: Option<BTreeMap<VipOrder, (ServiceKey, Service)>>,
    names: Option<BTreeMap<u64, u32>>,
    /// The kernel ids of the last plan's backends, for the KV-event feed.
    directory: super::prefix::IdDirectory,
}

/// A VIP key as a total order (address, port, padding).
type VipOrder = (u32, u16, u16);

impl<M: WriterMaps> Writer<M> {
    /// Takes over the maps, reading back the state a previous daemon left (names, ids, tables).
    pub fn new(maps: M) -> Result<Self, DatapathError> {
        let (table_chunks, member_chunks) = maps.arena_chunks();
        let mut w = Self {
            generation: maps.config()?.generation,
            table_arena: Arena::new(TABLE_SLOTS_FIELD, TABLE_CHUNK, table_chunks),
            member_arena: Arena::new(MEMBER_SLOTS_FIELD, MEMBER_CHUNK, member_chunks),
            maps,
            ids: Ids::default(),
            written: HashMap::new(),
            written6: HashMap::new(),
            states: Vec::with_capacity(MAX_MODELS as usize),
            tables: HashMap::new(),
            built: HashMap::new(),
            swaps: Vec::new(),
            services: None,
            names: None,
            directory: Default::default(),
        };
        w.recover_models()?;
        w.recover_backends()?;
        if w.ids.model_count() > 0 {
            info!(
                models = w.ids.model_count(),
                backends = w.ids.backend_count(),
                generation = w.generation,
                "recovered state from pinned maps"
            );
        }
        Ok(w)
    }

    /// Model indices by name, and each available model's active table and members (their
    /// extents taken in the arenas; the inactive slots' extents are free).
    fn recover_models(&mut self) -> Result<(), DatapathError> {
        for idx in 0..MAX_MODELS {
            let st = self.maps.model(idx)?;
            self.states.push(st);
            let name = model_name(&st);
            if name.is_empty() {
                continue;
            }
            let slot = *st.active_slot();
            if st.flags & MODEL_AVAILABLE != 0
                && slot.size > 0
                && slot.size <= MAX_TABLE_SIZE
                && slot.members <= MAX_MEMBERS
            {
                let table_at = Extent { pos: slot.table_offset, len: slot.size };
                let members_at = Extent { pos: slot.member_offset, len: slot.members };
                if self.table_arena.reserve(table_at) {
                    if self.member_arena.reserve(members_at) {
                        let table = self.maps.table(table_at.pos, table_at.len)?;
                        let members = self.maps.members(members_at.pos, members_at.len)?;
                        self.tables.insert(idx, ActiveTable { table, members, table_at, members_at });
                    } else {
                        self.table_arena.release(table_at);
                    }
                }
                if !self.tables.contains_key(&idx) {
                    warn!(model = %name, "its pinned table lies outside the arena or over another: it is rebuilt");
                }
            }
            self.ids.recover_model(name, idx);
        }
        Ok(())
    }

    /// Model `index`'s entry as the kernel holds it (last written or read back).
    fn model_state(&self, index: u32) -> ModelState {
        self.states.get(index as usize).copied().unwrap_or_default()
    }

    /// Writes model `index`'s entry, and keeps it as what the kernel holds.
    fn set_model(&mut self, index: u32, st: ModelState) -> Result<(), DatapathError> {
        self.maps.set_model(index, st)?;
        if let Some(kept) = self.states.get_mut(index as usize) {
            *kept = st;
        }
        Ok(())
    }

    /// Writes model entries in order (one call to the kernel), keeping the last of each index.
    fn set_models(&mut self, entries: &[(u32, ModelState)]) -> Result<(), DatapathError> {
        self.maps.set_models(entries)?;
        for &(index, st) in entries {
            if let Some(kept) = self.states.get_mut(index as usize) {
                *kept = st;
            }
        }
        Ok(())
    }

    /// Releases the extents of a table no longer active (reusable after the grace).
    fn release(&mut self, old: ActiveTable) {
        self.table_arena.release(old.table_at);
        self.member_arena.release(old.members_at);
    }

    /// How much of each arena is in use: (used, capacity) in table slots and in member ids.
    pub fn arena_use(&self) -> ((u64, u64), (u64, u64)) {
        let used = |a: &Arena| (a.capacity_entries() - a.free_entries(), a.capacity_entries());
        (used(&self.table_arena), used(&self.member_arena))
    }

    /// Backend ids by (model, address), and their entries as written.
    fn recover_backends(&mut self) -> Result<(), DatapathError> {
        for id in 0..MAX_BACKENDS {
            let b = self.maps.backend(id)?;
            if b.addr != 0 || b.port != 0 {
                let addr6 = if b.is_ipv6() { self.maps.backend_addr6(id)? } else { BackendAddr6::default() };
                self.ids.recover_backend((b.model, backend_address(&b, &addr6)), id);
                self.written.insert(id, b);
                if b.is_ipv6() {
                    self.written6.insert(id, addr6);
                }
            }
        }
        Ok(())
    }

    /// The address of a written backend entry.
    fn address(&self, id: u32, b: &Backend) -> SocketAddr {
        backend_address(b, &self.written6.get(&id).copied().unwrap_or_default())
    }

    /// The memory capacity (`mem_capacity_mb`, the most free memory it reported) of each
    /// backend entry as last written or read back, by model name and address; entries
    /// without one are left out. A restarted daemon's policy starts from these, so that it
    /// does not take a busy backend's free memory at its first poll for its capacity.
    pub fn capacities(&self) -> Vec<(String, SocketAddr, u32)> {
        self.written
            .iter()
            .filter(|(_, b)| b.mem_capacity_mb > 0)
            .filter_map(|(&id, b)| {
                let model = self.ids.model_name(b.model)?;
                Some((model.to_string(), self.address(id, b), b.mem_capacity_mb))
            })
            .collect()
    }

    /// The table weights of each model's live backends as last written or read back, by
    /// model name and address (the members of its table). A restarted daemon's policy takes
    /// them as the last weights it emitted, so that its first plan holds them when the new
    /// ones moved less than `min_weight_change`, as the old daemon's would have.
    pub fn table_weights(&self) -> BTreeMap<String, BTreeMap<SocketAddr, u32>> {
        let mut out: BTreeMap<String, BTreeMap<SocketAddr, u32>> = BTreeMap::new();
        for (&id, b) in self.written.iter().filter(|(_, b)| b.is_live() && b.weight > 0) {
            if let Some(model) = self.ids.model_name(b.model) {
                out.entry(model.to_string()).or_default().insert(self.address(id, b), b.weight);
            }
        }
        out
    }

    pub fn maps(&self) -> &M {
        &self.maps
    }

    #[cfg(test)]
    fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    #[cfg(test)]
    fn into_maps(self) -> M {
        self.maps
    }

    pub fn apply(&mut self, plan: &Plan, cfg: &WriterSettings) -> Result<ApplyReport, DatapathError> {
        let generation = self.generation + 1;
        let mut report = ApplyReport { generation, ..Default::default() };
        self.table_arena.reclaim(GRACE);
        self.member_arena.reclaim(GRACE);
        let planned = self.allocate_ids(plan)?;
        self.publish_directory(plan);
        report.live_backends = self.write_backends(&planned)?;
        self.write_tables(plan, cfg.seed, generation, &mut report)?;
        self.write_services(plan)?;
        self.write_model_names(plan)?;
        self.remove_gone_models(plan)?;
        let keys: BTreeSet<BackendKey> = planned.iter().map(|p| (p.model, p.backend.address)).collect();
        report.retired_backends = self.retire_backends(&keys)?;
        // Knobs and the generation last: a reader that sees the new generation sees all of the above.
        self.maps.set_config(values::global_config(cfg, generation))?;
        self.generation = generation;
        Ok(report)
    }

    /// The kernel ids of the backends of the last plan applied, kept current: the feed of the
    /// engines' KV events names backends by model and address, the prefix map by id.
    pub fn id_directory(&self) -> super::prefix::IdDirectory {
        self.directory.clone()
    }

    fn publish_directory(&self, plan: &Plan) {
        let mut ids = std::collections::HashMap::new();
        for (name, mp) in plan {
            let model = self.model_index(name);
            let evicted_ttl_ticks = ailb_common::prefix_ttl_ticks(super::values::model_ttl_ns(mp.prefix_ttl));
            for b in &mp.backends {
                if let Some(id) = self.ids.backend(&(model, b.address)) {
                    ids.insert((name.clone(), b.address), super::prefix::BackendIds { model, id, evicted_ttl_ticks });
                }
            }
        }
        self.directory.replace(ids);
    }

    /// The index of a model of the plan being applied ([`Self::allocate_ids`] gave it one).
    fn model_index(&self, name: &str) -> u32 {
        self.ids.model(name).expect("allocate_ids gives every planned model an index")
    }

    /// Model indices (known names keep theirs, new ones take the lowest free), then backend
    /// ids likewise, in (model, address) order; a backend listed twice in a model counts once.
    fn allocate_ids<'p>(&mut self, plan: &'p Plan) -> Result<Vec<Planned<'p>>, DatapathError> {
        for name in plan.keys() {
            self.ids.assign_model(name)?;
        }
        let mut by_key: BTreeMap<BackendKey, &PlannedBackend> = BTreeMap::new();
        for (name, mp) in plan {
            let model = self.model_index(name);
            for b in &mp.backends {
                by_key.insert((model, b.address), b);
            }
        }
        by_key
            .into_iter()
            .map(|(key, backend)| Ok(Planned { id: self.ids.assign_backend(key)?, model: key.0, backend }))
            .collect()
    }

    /// Writes each planned backend's entry; returns how many are live.
    /// The entries that changed go to the map together (one batch update in the kernel).
    fn write_backends(&mut self, planned: &[Planned<'_>]) -> Result<usize, DatapathError> {
        let mut live = 0;
        let mut changed = Vec::new();
        for p in planned {
            // An IPv6 backend's address before its entry, which tells connect6 to read it.
            if let Some(addr6) = values::backend_addr6(p.backend) {
                if self.written6.get(&p.id) != Some(&addr6) {
                    self.maps.set_backend_addr6(p.id, addr6)?;
                    self.written6.insert(p.id, addr6);
                }
            }
            let entry = values::backend_entry(p.model, p.backend);
            if self.written.get(&p.id) != Some(&entry) {
                changed.push((p.id, entry));
            }
            live += usize::from(entry.is_live());
        }
        self.maps.set_backends(&changed)?;
        self.written.extend(changed);
        Ok(live)
    }

    /// Writes a backend entry unless it is the one last written.
    fn write_backend(&mut self, id: u32, b: Backend) -> Result<(), DatapathError> {
        if self.written.get(&id) != Some(&b) {
            self.maps.set_backend(id, b)?;
            self.written.insert(id, b);
        }
        Ok(())
    }

    /// The plan's VIPs (of either family), each to its model: VIPs that left are removed,
    /// changed ones written. After the first apply only the differences from what it wrote
    /// reach the IPv4 map; the IPv6 map (rarely more than a few VIPs) is read back each time.
    fn write_services(&mut self, plan: &Plan) -> Result<(), DatapathError> {
        let order = |k: &ServiceKey| (k.addr, k.port, k._pad);
        let (mut want4, mut want6): (BTreeMap<VipOrder, (ServiceKey, Service)>, _) = (BTreeMap::new(), BTreeMap::new());
        for (name, mp) in plan {
            let service = Service { model: self.model_index(name), flags: 0 };
            for vip in &mp.vips {
                match values::vip_key(vip) {
                    VipKey::V4(k) => {
                        want4.insert(order(&k), (k, service));
                    }
                    VipKey::V6(k) => {
                        want6.insert((k.addr, k.port, k._pad), (k, service));
                    }
                }
            }
        }
        let have = match self.services.take() {
            Some(have) => have,
            None => {
                let keys = self.maps.service_keys();
                keys.iter().filter_map(|k| Some((order(k), (*k, self.maps.service(k)?)))).collect()
            }
        };
        for (key, _) in have.iter().filter(|(o, _)| !want4.contains_key(o)).map(|(_, kv)| kv) {
            self.maps.remove_service(key)?;
        }
        for (o, (key, value)) in &want4 {
            if have.get(o).map(|(_, v)| v) != Some(value) {
                self.maps.insert_service(key, value)?;
            }
        }
        self.services = Some(want4);
        for key in self.maps.service6_keys().iter().filter(|k| !want6.contains_key(&(k.addr, k.port, k._pad))) {
            self.maps.remove_service6(key)?;
        }
        for (key, value) in want6.values() {
            if self.maps.service6(key).as_ref() != Some(value) {
                self.maps.insert_service6(key, value)?;
            }
        }
        Ok(())
    }

    /// Model name hash -> index (for the `AILB_MODEL` hint of a shared VIP). The first apply
    /// removes the names a previous daemon left that are not planned and writes every planned
    /// one; later ones write only the differences.
    fn write_model_names(&mut self, plan: &Plan) -> Result<(), DatapathError> {
        let want: BTreeMap<u64, u32> =
            plan.keys().map(|name| (conversation_hash(name.as_bytes()), self.model_index(name))).collect();
        let have = match self.names.take() {
            Some(have) => have,
            // Their values are not read back: every planned name is written once.
            None => self.maps.model_name_keys().into_iter().map(|k| (k, u32::MAX)).collect(),
        };
        for &hash in have.keys().filter(|k| !want.contains_key(k)) {
            self.maps.remove_model_name(hash)?;
        }
        for (&hash, &model) in &want {
            if have.get(&hash) != Some(&model) {
                self.maps.insert_model_name(hash, model)?;
            }
        }
        self.names = Some(want);
        Ok(())
    }

    /// Models that left the plan: their entry cleared (unavailable, nameless), then forgotten.
    fn remove_gone_models(&mut self, plan: &Plan) -> Result<(), DatapathError> {
        for (name, idx) in self.ids.models_except(|n| plan.contains_key(n)) {
            self.set_model(idx, ModelState::default())?;
            if let Some(old) = self.tables.remove(&idx) {
                self.release(old);
            }
            self.built.remove(&idx);
            self.ids.forget_model(&name);
            info!(model = %name, "model removed");
        }
        Ok(())
    }

    /// Backends that left the plan: not live at once; their id is freed when nothing is in
    /// flight. Returns how many ids were freed now.
    fn retire_backends(&mut self, planned: &BTreeSet<BackendKey>) -> Result<usize, DatapathError> {
        for id in self.ids.retire_unplanned(planned) {
            let mut entry = self.written.get(&id).copied().unwrap_or_default();
            // Not live; its family stays, so that its address still reads back after a restart.
            entry.state &= BACKEND_IPV6;
            entry.weight = 0;
            self.write_backend(id, entry)?;
        }
        self.reap()
    }

    /// Frees the ids of removed backends whose in-flight count has reached 0; returns how many.
    /// A freed id leaves the prefix map too (a learnt or reported block must not follow the id
    /// to the next backend that gets it); a failure there is logged, the ids are freed anyway.
    pub fn reap(&mut self) -> Result<usize, DatapathError> {
        let mut freed = Vec::new();
        for (key, id) in self.ids.retired() {
            if self.maps.inflight(id)? == 0 {
                self.write_backend(id, Backend::default())?;
                self.ids.free(&key);
                self.written.remove(&id);
                self.written6.remove(&id);
                freed.push((key.0, id));
            }
        }
        // The daemon reaps on every tick: the prefix map is opened and scanned only when an
        // id was freed.
        if freed.is_empty() {
            return Ok(0);
        }
        if let Err(e) = self.maps.clear_prefix_holders(&freed) {
            warn!(error = %crate::error_chain(&e), freed = ?freed, "freed backends not cleared from the prefix map");
        }
        Ok(freed.len())
    }
}
