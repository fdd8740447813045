//! In-memory [`WriterMaps`] for the writer's tests: the maps as plain collections, every
//! write recorded in order, and a readable dump of their contents. Each line of the dump and
//! of the write log names the map and the entry:
//!
//! ```text
//! CONFIG: ABI=5 GEN=1 LOAD=1250 PROBES=4 FLAGS=affinity,load_bound TTL_MS=1800000 WAIT_MS=20000
//! MODEL: IDX=0 NAME=llama ACTIVE=1 FLAGS=available TTL_MS=0 SLOT0=- SLOT1=size:4093,members:2,weight:200,gen:1
//! TABLE: ROW=1 SHARES=0:2047,1:2046 HEAD=1,0,0,1,1,0,1,0
//! MEMBERS: ROW=1 IDS=0,1
//! BE: ID=0 ADDR=10.1.0.1:80 MODEL=0 WEIGHT=100 CAP=0 FREE_MB=unknown IDLE_MB=0 STATE=live
//! VIP: ADDR=127.77.0.1:8000 MODEL=0 FLAGS=0
//! NAME: HASH=0x0123456789abcdef MODEL=0
//! INFLIGHT: INDEX=0 COUNT=3
//! ```
//!
//! The dump leaves out entries that read as zeros (never written, or cleared); the write log
//! has one `set KIND: ...` or `remove KIND: ...` line per map update, where a cleared model
//! or backend entry reads `set MODEL: IDX=1 ZERO`, `set BE: ID=2 ZERO`.
#![forbid(unsafe_code)]

use std::{collections::BTreeMap, fmt::Write as _};

use ailb_common::{
    maps, Backend, GlobalConfig, MemberRow, ModelState, Service, ServiceKey, TableRow, TableSlot, BACKEND_LIVE,
    CONFIG_AFFINITY, CONFIG_LOAD_BOUND, CONFIG_ROUND_ROBIN, INFLIGHT_ENTRIES, MAX_BACKENDS, MAX_MEMBERS, MAX_MODELS,
    MEM_UNKNOWN, MODEL_AVAILABLE, NO_BACKEND,
};
use aya::maps::MapError;

use super::{
    map_err,
    store::WriterMaps,
    values::{addr_from_be, model_name},
    DatapathError,
};

/// Table slots shown by `HEAD=` in a table line.
const TABLE_HEAD: usize = 8;

#[derive(Default)]
pub(crate) struct FakeMaps {
    config: GlobalConfig,
    models: BTreeMap<u32, ModelState>,
    tables: BTreeMap<u32, Box<TableRow>>,
    members: BTreeMap<u32, Box<MemberRow>>,
    backends: BTreeMap<u32, Backend>,
    /// Set by the tests: what the kernel's sock_ops would count.
    pub(crate) inflight: BTreeMap<u32, u64>,
    /// By (address, port) so that the dump is in a stable order.
    services: BTreeMap<(u32, u16), (ServiceKey, Service)>,
    model_names: BTreeMap<u64, u32>,
    writes: Vec<String>,
}

fn check_index(name: &str, index: u32, max_entries: u32) -> Result<(), DatapathError> {
    if index < max_entries {
        Ok(())
    } else {
        Err(map_err(name)(MapError::OutOfBounds { index, max_entries }))
    }
}

fn zero_table() -> Box<TableRow> {
    Box::new(TableRow { slots: [0; ailb_common::MAX_TABLE_SIZE as usize] })
}

fn zero_members() -> Box<MemberRow> {
    Box::new(MemberRow { ids: [0; MAX_MEMBERS as usize] })
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
    format!("size:{},members:{},weight:{},gen:{}", s.size, s.members, s.total_weight, s.generation)
}

fn list(values: impl Iterator<Item = String>) -> String {
    values.collect::<Vec<_>>().join(",")
}

fn config_line(c: &GlobalConfig) -> String {
    let flags = [(CONFIG_AFFINITY, "affinity"), (CONFIG_LOAD_BOUND, "load_bound"), (CONFIG_ROUND_ROBIN, "round_robin")];
    format!(
        "CONFIG: ABI={} GEN={} LOAD={} PROBES={} FLAGS={} TTL_MS={} WAIT_MS={}",
        c.abi_version,
        c.generation,
        c.load_factor_milli,
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

/// Slots per backend id (in id order), and the first [`TABLE_HEAD`] slots.
fn table_line(row: u32, t: &TableRow) -> String {
    let mut shares: BTreeMap<u32, usize> = BTreeMap::new();
    for &id in t.slots.iter().filter(|&&id| id != NO_BACKEND) {
        *shares.entry(id).or_default() += 1;
    }
    let head = t.slots.iter().take(TABLE_HEAD).map(|&id| if id == NO_BACKEND { "-".into() } else { id.to_string() });
    format!("TABLE: ROW={row} SHARES={} HEAD={}", list(shares.iter().map(|(id, n)| format!("{id}:{n}"))), list(head))
}

fn members_line(row: u32, m: &MemberRow) -> String {
    let ids = m.ids.iter().take_while(|&&id| id != NO_BACKEND).map(u32::to_string);
    format!("MEMBERS: ROW={row} IDS={}", list(ids))
}

fn backend_line(id: u32, b: &Backend) -> String {
    if *b == Backend::default() {
        return format!("BE: ID={id} ZERO");
    }
    let free = if b.free_mem_mb == MEM_UNKNOWN { "unknown".to_string() } else { b.free_mem_mb.to_string() };
    let state = if b.state & BACKEND_LIVE != 0 { "live" } else { "off" };
    format!(
        "BE: ID={id} ADDR={} MODEL={} WEIGHT={} CAP={} FREE_MB={free} IDLE_MB={} STATE={state}",
        addr_from_be(b.addr, b.port),
        b.model,
        b.weight,
        b.cap,
        b.mem_capacity_mb
    )
}

fn service_line(k: &ServiceKey, v: &Service) -> String {
    format!("VIP: ADDR={} MODEL={} FLAGS={}", addr_from_be(k.addr, k.port), v.model, v.flags)
}

fn name_line(hash: u64, model: u32) -> String {
    format!("NAME: HASH={hash:#018x} MODEL={model}")
}

impl FakeMaps {
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
        for (&i, m) in self.models.iter().filter(|(_, m)| **m != ModelState::default()) {
            line(model_line(i, m));
        }
        for (&row, t) in self.tables.iter().filter(|(_, t)| t.slots.iter().any(|&s| s != 0)) {
            line(table_line(row, t));
        }
        for (&row, m) in self.members.iter().filter(|(_, m)| m.ids.iter().any(|&s| s != 0)) {
            line(members_line(row, m));
        }
        for (&id, b) in self.backends.iter().filter(|(_, b)| **b != Backend::default()) {
            line(backend_line(id, b));
        }
        for (k, v) in self.services.values() {
            line(service_line(k, v));
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
        Ok(self.models.get(&index).copied().unwrap_or_default())
    }
    fn set_model(&mut self, index: u32, value: ModelState) -> Result<(), DatapathError> {
        check_index(maps::MODELS, index, MAX_MODELS)?;
        self.log("set", model_line(index, &value));
        self.models.insert(index, value);
        Ok(())
    }
    fn table(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError> {
        check_index(maps::TABLES, row, MAX_MODELS * 2)?;
        let slots = self.tables.get(&row).map_or(&[0; 0][..], |t| &t.slots[..]);
        Ok((0..len.min(ailb_common::MAX_TABLE_SIZE as usize)).map(|i| slots.get(i).copied().unwrap_or(0)).collect())
    }
    fn set_table(&mut self, row: u32, value: &TableRow) -> Result<(), DatapathError> {
        check_index(maps::TABLES, row, MAX_MODELS * 2)?;
        self.log("set", table_line(row, value));
        self.tables.entry(row).or_insert_with(zero_table).slots = value.slots;
        Ok(())
    }
    fn members(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError> {
        check_index(maps::MEMBERS, row, MAX_MODELS * 2)?;
        let ids = self.members.get(&row).map_or(&[0; 0][..], |m| &m.ids[..]);
        Ok((0..len.min(MAX_MEMBERS as usize)).map(|i| ids.get(i).copied().unwrap_or(0)).collect())
    }
    fn set_members(&mut self, row: u32, value: &MemberRow) -> Result<(), DatapathError> {
        check_index(maps::MEMBERS, row, MAX_MODELS * 2)?;
        self.log("set", members_line(row, value));
        self.members.entry(row).or_insert_with(zero_members).ids = value.ids;
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
}
