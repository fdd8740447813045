//! In-memory [`WriterMaps`] for the writer's tests: the maps as plain collections, every
//! write recorded in order, and a readable dump of their contents. Each line of the dump and
//! of the write log names the map and the entry:
//!
//! ```text
//! CONFIG: ABI=5 GEN=1 LOAD=1250 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
//! MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:1021,members:2,weight:200,gen:1,at:0/0
//! TABLE: MODEL=0 POS=0 SHARES=0:2047,1:2046 HEAD=1,0,0,1,1,0,1,0
//! MEMBERS: MODEL=0 POS=0 IDS=0,1
//! BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
//! VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
//! NAME: HASH=0x0123456789abcdef MODEL=0
//! INFLIGHT: INDEX=0 COUNT=3
//! ```
//!
//! The dump leaves out entries that read as zeros (never written, or cleared), and shows each
//! model's active table and members (arena positions `at:TABLE/MEMBERS` in its slot); the
//! write log has one `set KIND: ...` or `remove KIND: ...` line per map update (per table or
//! member extent written, `set TABLE: POS=...`), where a cleared model or backend entry reads
//! `set MODEL: IDX=1 ZERO`, `set BE: ID=2 ZERO`.
#![forbid(unsafe_code)]

use std::{cell::Cell, collections::BTreeMap, fmt::Write as _};

use ailb_common::{
    maps, Backend, BackendAddr6, GlobalConfig, ModelState, Service, ServiceKey, ServiceKey6, TableSlot, BACKEND_LIVE,
    CONFIG_AFFINITY, CONFIG_LOAD_BOUND, CONFIG_ROUND_ROBIN, DEFAULT_MEMBER_SLOTS, DEFAULT_TABLE_SLOTS,
    INFLIGHT_ENTRIES, MAX_BACKENDS, MAX_MODELS, MEMBER_CHUNK, MEM_UNKNOWN, MODEL_AVAILABLE, NO_BACKEND, TABLE_CHUNK,
};
use aya::maps::MapError;

use super::{
    map_err,
    store::{chunked, read_chunked, WriterMaps},
    values::{addr6_from_be, addr_from_be, model_name},
    DatapathError,
};

/// Table slots shown by `HEAD=` in a table line.
const TABLE_HEAD: usize = 8;

pub(crate) struct FakeMaps {
    config: GlobalConfig,
    models: BTreeMap<u32, ModelState>,
    /// The arenas by chunk index; chunks never written read as zeros.
    tables: BTreeMap<u32, [u32; TABLE_CHUNK as usize]>,
    members: BTreeMap<u32, [u32; MEMBER_CHUNK as usize]>,
    /// Chunks of the table and member arenas.
    arena_chunks: (u32, u32),
    backends: BTreeMap<u32, Backend>,
    /// Set by the tests: what the kernel's sock_ops would count.
    pub(crate) inflight: BTreeMap<u32, u64>,
    /// By (address, port) so that the dump is in a stable order.
    services: BTreeMap<(u32, u16), (ServiceKey, Service)>,
    services6: BTreeMap<([u32; 4], u16), (ServiceKey6, Service)>,
    backend_addrs6: BTreeMap<u32, BackendAddr6>,
    model_names: BTreeMap<u64, u32>,
    writes: Vec<String>,
    /// How many model entries were read (a writer reads them only when it starts).
    pub(crate) model_reads: Cell<usize>,
}

fn check_index(name: &str, index: u32, max_entries: u32) -> Result<(), DatapathError> {
    if index < max_entries {
        Ok(())
    } else {
        Err(map_err(name)(MapError::OutOfBounds { index, max_entries }))
    }
}

fn flag_names(flags: u32, names: &[(u32, &str)]) -> String {
    let set: Vec<&str> = names.iter().filter(|(bit, _)| flags & bit != 0).map(|(_, n)| *n).collect();
    if set.is_empty() {
        "-".to_string()
    } else {
        set.join(",")
    }
}

fn slot_line(s: &TableSlot) -> String {
    if *s == TableSlot::default() {
        return "-".to_string();
    }
    format!(
        "size:{},members:{},weight:{},gen:{},at:{}/{}",
        s.size, s.members, s.total_weight, s.generation, s.table_offset, s.member_offset
    )
}

fn list(values: impl Iterator<Item = String>) -> String {
    values.collect::<Vec<_>>().join(",")
}

fn config_line(c: &GlobalConfig) -> String {
    let flags = [(CONFIG_AFFINITY, "affinity"), (CONFIG_LOAD_BOUND, "load_bound"), (CONFIG_ROUND_ROBIN, "round_robin")];
    format!(
        "CONFIG: ABI={} GEN={} LOAD={} PREFIX_LOAD={} PROBES={} FLAGS={} TTL_MS={} WAIT_MS={}",
        c.abi_version,
        c.generation,
        c.load_factor_milli,
        c.prefix_load_factor_milli,
        c.probes,
        flag_names(c.flags, &flags),
        c.affinity_ttl_ns / 1_000_000,
        c.affinity_wait_ns / 1_000_000
    )
}

fn model_line(index: u32, m: &ModelState) -> String {
    if *m == ModelState::default() {
        return format!("MODEL: IDX={index} ZERO");
    }
    format!(
        "MODEL: IDX={index} NAME={} ACTIVE={} FLAGS={} TTL_MS={} SLOT0={} SLOT1={}",
        model_name(m),
        m.active,
        flag_names(m.flags, &[(MODEL_AVAILABLE, "available")]),
        m.affinity_ttl_ns / 1_000_000,
        slot_line(&m.slots[0]),
        slot_line(&m.slots[1])
    )
}

/// Slots per backend id (in id order), and the first [`TABLE_HEAD`] slots; `at` names the
/// model (dump) or the arena position (write log).
fn table_line(at: &str, t: &[u32]) -> String {
    let mut shares: BTreeMap<u32, usize> = BTreeMap::new();
    for &id in t.iter().filter(|&&id| id != NO_BACKEND) {
        *shares.entry(id).or_default() += 1;
    }
    let head = t.iter().take(TABLE_HEAD).map(|&id| if id == NO_BACKEND { "-".into() } else { id.to_string() });
    format!("TABLE: {at} SHARES={} HEAD={}", list(shares.iter().map(|(id, n)| format!("{id}:{n}"))), list(head))
}

fn members_line(at: &str, ids: &[u32]) -> String {
    format!("MEMBERS: {at} IDS={}", list(ids.iter().map(u32::to_string)))
}

fn backend_line(id: u32, b: &Backend) -> String {
    if *b == Backend::default() {
        return format!("BE: ID={id} ZERO");
    }
    let free = if b.free_mem_mb == MEM_UNKNOWN { "unknown".to_string() } else { b.free_mem_mb.to_string() };
    let state = if b.state & BACKEND_LIVE != 0 { "live" } else { "off" };
    // An IPv6 backend's address is in its `BE6:` line.
    let addr =
        if b.is_ipv6() { format!("IPV6:{}", u16::from_be(b.port)) } else { addr_from_be(b.addr, b.port).to_string() };
    format!(
        "BE: ID={id} ADDR={addr} MODEL={} WEIGHT={} CAP={} FREE_MB={free} IDLE_MB={} STATE={state}",
        b.model, b.weight, b.cap, b.mem_capacity_mb
    )
}

fn service_line(k: &ServiceKey, v: &Service) -> String {
    format!("VIP: ADDR={} MODEL={} FLAGS={}", addr_from_be(k.addr, k.port), v.model, v.flags)
}

fn service6_line(k: &ServiceKey6, v: &Service) -> String {
    format!("VIP6: ADDR={} MODEL={} FLAGS={}", addr6_from_be(&k.addr, k.port), v.model, v.flags)
}

fn addr6_line(id: u32, a: &BackendAddr6) -> String {
    format!("BE6: ID={id} ADDR={}", addr6_from_be(&a.addr, 0).ip())
}

fn name_line(hash: u64, model: u32) -> String {
    format!("NAME: HASH={hash:#018x} MODEL={model}")
}

impl Default for FakeMaps {
    fn default() -> Self {
        Self::with_arenas(DEFAULT_TABLE_SLOTS / TABLE_CHUNK, DEFAULT_MEMBER_SLOTS / MEMBER_CHUNK)
    }
}

impl FakeMaps {
    /// Empty maps whose arenas have these many chunks.
    pub(crate) fn with_arenas(table_chunks: u32, member_chunks: u32) -> Self {
        Self {
            config: GlobalConfig::default(),
            models: BTreeMap::new(),
            tables: BTreeMap::new(),
            members: BTreeMap::new(),
            arena_chunks: (table_chunks, member_chunks),
            backends: BTreeMap::new(),
            inflight: BTreeMap::new(),
            services: BTreeMap::new(),
            services6: BTreeMap::new(),
            backend_addrs6: BTreeMap::new(),
            model_names: BTreeMap::new(),
            writes: Vec::new(),
            model_reads: Cell::new(0),
        }
    }

    /// The write log since the last call, one line per map update.
    pub(crate) fn take_writes(&mut self) -> String {
        std::mem::take(&mut self.writes).iter().map(|w| format!("{w}\n")).collect()
    }

    /// Every entry that does not read as zeros, one line each (see the module docs).
    pub(crate) fn dump(&self) -> String {
        let mut out = String::new();
        let mut line = |l: String| writeln!(out, "{l}").expect("writing to a String");
        if self.config != GlobalConfig::default() {
            line(config_line(&self.config));
        }
        let models: Vec<(u32, ModelState)> =
            self.models.iter().filter(|(_, m)| **m != ModelState::default()).map(|(&i, m)| (i, *m)).collect();
        for (i, m) in &models {
            line(model_line(*i, m));
        }
        for (i, m) in models.iter().filter(|(_, m)| m.active_slot().size > 0) {
            let s = m.active_slot();
            let table = self.table(s.table_offset, s.size).expect("the fake's arena reads never fail");
            line(table_line(&format!("MODEL={i} POS={}", s.table_offset), &table));
        }
        for (i, m) in models.iter().filter(|(_, m)| m.active_slot().size > 0) {
            let s = m.active_slot();
            let ids = self.members(s.member_offset, s.members).expect("the fake's arena reads never fail");
            line(members_line(&format!("MODEL={i} POS={}", s.member_offset), &ids));
        }
        for (&id, b) in self.backends.iter().filter(|(_, b)| **b != Backend::default()) {
            line(backend_line(id, b));
        }
        for (&id, a) in self.backend_addrs6.iter().filter(|(_, a)| **a != BackendAddr6::default()) {
            line(addr6_line(id, a));
        }
        for (k, v) in self.services.values() {
            line(service_line(k, v));
        }
        for (k, v) in self.services6.values() {
            line(service6_line(k, v));
        }
        for (&hash, &model) in &self.model_names {
            line(name_line(hash, model));
        }
        for (&index, &count) in self.inflight.iter().filter(|(_, &c)| c != 0) {
            line(format!("INFLIGHT: INDEX={index} COUNT={count}"));
        }
        out
    }

    fn log(&mut self, verb: &str, line: String) {
        self.writes.push(format!("{verb} {line}"));
    }
}

impl WriterMaps for FakeMaps {
    fn config(&self) -> Result<GlobalConfig, DatapathError> {
        Ok(self.config)
    }
    fn set_config(&mut self, value: GlobalConfig) -> Result<(), DatapathError> {
        self.log("set", config_line(&value));
        self.config = value;
        Ok(())
    }
    fn model(&self, index: u32) -> Result<ModelState, DatapathError> {
        check_index(maps::MODELS, index, MAX_MODELS)?;
        self.model_reads.set(self.model_reads.get() + 1);
        Ok(self.models.get(&index).copied().unwrap_or_default())
    }
    fn set_model(&mut self, index: u32, value: ModelState) -> Result<(), DatapathError> {
        check_index(maps::MODELS, index, MAX_MODELS)?;
        self.log("set", model_line(index, &value));
        self.models.insert(index, value);
        Ok(())
    }
    fn arena_chunks(&self) -> (u32, u32) {
        self.arena_chunks
    }
    fn table(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError> {
        read_chunked(pos, len, |c| {
            check_index(maps::TABLES, c, self.arena_chunks.0)?;
            Ok(self.tables.get(&c).copied().unwrap_or([0; TABLE_CHUNK as usize]))
        })
    }
    fn set_table(&mut self, pos: u32, slots: &[u32]) -> Result<(), DatapathError> {
        let chunks: Vec<_> = chunked::<{ TABLE_CHUNK as usize }>(pos, slots).collect();
        for &(c, _) in &chunks {
            check_index(maps::TABLES, c, self.arena_chunks.0)?;
        }
        self.log("set", table_line(&format!("POS={pos}"), slots));
        self.tables.extend(chunks);
        Ok(())
    }
    fn members(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError> {
        read_chunked(pos, len, |c| {
            check_index(maps::MEMBERS, c, self.arena_chunks.1)?;
            Ok(self.members.get(&c).copied().unwrap_or([0; MEMBER_CHUNK as usize]))
        })
    }
    fn set_members(&mut self, pos: u32, ids: &[u32]) -> Result<(), DatapathError> {
        let chunks: Vec<_> = chunked::<{ MEMBER_CHUNK as usize }>(pos, ids).collect();
        for &(c, _) in &chunks {
            check_index(maps::MEMBERS, c, self.arena_chunks.1)?;
        }
        self.log("set", members_line(&format!("POS={pos}"), ids));
        self.members.extend(chunks);
        Ok(())
    }
    fn backend(&self, id: u32) -> Result<Backend, DatapathError> {
        check_index(maps::BACKENDS, id, MAX_BACKENDS)?;
        Ok(self.backends.get(&id).copied().unwrap_or_default())
    }
    fn set_backend(&mut self, id: u32, value: Backend) -> Result<(), DatapathError> {
        check_index(maps::BACKENDS, id, MAX_BACKENDS)?;
        self.log("set", backend_line(id, &value));
        self.backends.insert(id, value);
        Ok(())
    }
    fn backend_addr6(&self, id: u32) -> Result<BackendAddr6, DatapathError> {
        check_index(maps::BACKEND_ADDRS6, id, MAX_BACKENDS)?;
        Ok(self.backend_addrs6.get(&id).copied().unwrap_or_default())
    }
    fn set_backend_addr6(&mut self, id: u32, value: BackendAddr6) -> Result<(), DatapathError> {
        check_index(maps::BACKEND_ADDRS6, id, MAX_BACKENDS)?;
        self.log("set", addr6_line(id, &value));
        self.backend_addrs6.insert(id, value);
        Ok(())
    }
    fn inflight(&self, index: u32) -> Result<u64, DatapathError> {
        check_index(maps::INFLIGHT, index, INFLIGHT_ENTRIES)?;
        Ok(self.inflight.get(&index).copied().unwrap_or(0))
    }
    fn service_keys(&self) -> Vec<ServiceKey> {
        self.services.values().map(|(k, _)| *k).collect()
    }
    fn service(&self, key: &ServiceKey) -> Option<Service> {
        self.services.get(&(key.addr, key.port)).map(|(_, v)| *v)
    }
    fn insert_service(&mut self, key: &ServiceKey, value: &Service) -> Result<(), DatapathError> {
        self.log("set", service_line(key, value));
        self.services.insert((key.addr, key.port), (*key, *value));
        Ok(())
    }
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DatapathError> {
        let (k, v) = self
            .services
            .remove(&(key.addr, key.port))
            .ok_or_else(|| map_err(maps::SERVICES)(MapError::KeyNotFound))?;
        self.log("remove", service_line(&k, &v));
        Ok(())
    }
    fn service6_keys(&self) -> Vec<ServiceKey6> {
        self.services6.values().map(|(k, _)| *k).collect()
    }
    fn service6(&self, key: &ServiceKey6) -> Option<Service> {
        self.services6.get(&(key.addr, key.port)).map(|(_, v)| *v)
    }
    fn insert_service6(&mut self, key: &ServiceKey6, value: &Service) -> Result<(), DatapathError> {
        self.log("set", service6_line(key, value));
        self.services6.insert((key.addr, key.port), (*key, *value));
        Ok(())
    }
    fn remove_service6(&mut self, key: &ServiceKey6) -> Result<(), DatapathError> {
        let (k, v) = self
            .services6
            .remove(&(key.addr, key.port))
            .ok_or_else(|| map_err(maps::SERVICES6)(MapError::KeyNotFound))?;
        self.log("remove", service6_line(&k, &v));
        Ok(())
    }
    fn model_name_keys(&self) -> Vec<u64> {
        self.model_names.keys().copied().collect()
    }
    fn insert_model_name(&mut self, hash: u64, model: u32) -> Result<(), DatapathError> {
        self.log("set", name_line(hash, model));
        self.model_names.insert(hash, model);
        Ok(())
    }
    fn remove_model_name(&mut self, hash: u64) -> Result<(), DatapathError> {
        let model = self.model_names.remove(&hash).ok_or_else(|| map_err(maps::MODEL_NAMES)(MapError::KeyNotFound))?;
        self.log("remove", name_line(hash, model));
        Ok(())
    }
    fn clear_prefix_holders(&mut self, gone: &[(u32, u32)]) -> Result<u64, DatapathError> {
        for (model, id) in gone {
            self.log("clear", format!("PREFIX: MODEL={model} ID={id}"));
        }
        Ok(0)
    }
}
