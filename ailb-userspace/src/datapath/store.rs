//! [`WriterMaps`]: the map accesses of the [`Writer`](super::Writer), the one seam between
//! its logic and aya. [`Maps`] implements it over the pinned maps; the tests' in-memory
//! `FakeMaps` (`fake.rs`) implements it over plain collections and records every write.
#![forbid(unsafe_code)]

use ailb_common::{maps, Backend, GlobalConfig, MemberRow, ModelState, Service, ServiceKey, TableRow};

use super::{map_err, DatapathError, Maps};

/// Reads and writes of the maps the writer owns. Array entries never written read as zeros,
/// as a BPF array's do.
pub trait WriterMaps {
    fn config(&self) -> Result<GlobalConfig, DatapathError>;
    fn set_config(&mut self, value: GlobalConfig) -> Result<(), DatapathError>;
    fn model(&self, index: u32) -> Result<ModelState, DatapathError>;
    fn set_model(&mut self, index: u32, value: ModelState) -> Result<(), DatapathError>;
    /// The first `len` entries of table row `row` (at most the row's length).
    fn table(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError>;
    fn set_table(&mut self, row: u32, value: &TableRow) -> Result<(), DatapathError>;
    /// The first `len` entries of member row `row` (at most the row's length).
    fn members(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError>;
    fn set_members(&mut self, row: u32, value: &MemberRow) -> Result<(), DatapathError>;
    fn backend(&self, id: u32) -> Result<Backend, DatapathError>;
    fn set_backend(&mut self, id: u32, value: Backend) -> Result<(), DatapathError>;
    /// Entry `index` of `AILB_INFLIGHT` (a backend id for its connection count).
    fn inflight(&self, index: u32) -> Result<u64, DatapathError>;
    /// The VIPs in `AILB_SERVICES` (a key that cannot be read is left out).
    fn service_keys(&self) -> Vec<ServiceKey>;
    /// A VIP's entry; `None` when absent or unreadable.
    fn service(&self, key: &ServiceKey) -> Option<Service>;
    fn insert_service(&mut self, key: &ServiceKey, value: &Service) -> Result<(), DatapathError>;
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DatapathError>;
    /// The name hashes in `AILB_MODEL_NAMES` (a key that cannot be read is left out).
    fn model_name_keys(&self) -> Vec<u64>;
    fn insert_model_name(&mut self, hash: u64, model: u32) -> Result<(), DatapathError>;
    fn remove_model_name(&mut self, hash: u64) -> Result<(), DatapathError>;
}

impl WriterMaps for Maps {
    fn config(&self) -> Result<GlobalConfig, DatapathError> {
        self.global_config()
    }
    fn set_config(&mut self, value: GlobalConfig) -> Result<(), DatapathError> {
        self.config.set(0, value, 0).map_err(map_err(maps::CONFIG))
    }
    fn model(&self, index: u32) -> Result<ModelState, DatapathError> {
        self.models.get(&index, 0).map_err(map_err(maps::MODELS))
    }
    fn set_model(&mut self, index: u32, value: ModelState) -> Result<(), DatapathError> {
        self.models.set(index, value, 0).map_err(map_err(maps::MODELS))
    }
    fn table(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError> {
        let value = self.tables.get(&row, 0).map_err(map_err(maps::TABLES))?;
        Ok(value.slots[..len.min(value.slots.len())].to_vec())
    }
    fn set_table(&mut self, row: u32, value: &TableRow) -> Result<(), DatapathError> {
        self.tables.set(row, value, 0).map_err(map_err(maps::TABLES))
    }
    fn members(&self, row: u32, len: usize) -> Result<Vec<u32>, DatapathError> {
        let value = self.members.get(&row, 0).map_err(map_err(maps::MEMBERS))?;
        Ok(value.ids[..len.min(value.ids.len())].to_vec())
    }
    fn set_members(&mut self, row: u32, value: &MemberRow) -> Result<(), DatapathError> {
        self.members.set(row, value, 0).map_err(map_err(maps::MEMBERS))
    }
    fn backend(&self, id: u32) -> Result<Backend, DatapathError> {
        self.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))
    }
    fn set_backend(&mut self, id: u32, value: Backend) -> Result<(), DatapathError> {
        self.backends.set(id, value, 0).map_err(map_err(maps::BACKENDS))
    }
    fn inflight(&self, index: u32) -> Result<u64, DatapathError> {
        self.inflight.get(&index, 0).map_err(map_err(maps::INFLIGHT))
    }
    fn service_keys(&self) -> Vec<ServiceKey> {
        self.services.keys().filter_map(Result::ok).collect()
    }
    fn service(&self, key: &ServiceKey) -> Option<Service> {
        self.services.get(key, 0).ok()
    }
    fn insert_service(&mut self, key: &ServiceKey, value: &Service) -> Result<(), DatapathError> {
        self.services.insert(key, value, 0).map_err(map_err(maps::SERVICES))
    }
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DatapathError> {
        self.services.remove(key).map_err(map_err(maps::SERVICES))
    }
    fn model_name_keys(&self) -> Vec<u64> {
        self.model_names.keys().filter_map(Result::ok).collect()
    }
    fn insert_model_name(&mut self, hash: u64, model: u32) -> Result<(), DatapathError> {
        self.model_names.insert(hash, model, 0).map_err(map_err(maps::MODEL_NAMES))
    }
    fn remove_model_name(&mut self, hash: u64) -> Result<(), DatapathError> {
        self.model_names.remove(&hash).map_err(map_err(maps::MODEL_NAMES))
    }
}
