//! [`WriterMaps`]: the map accesses of the [`Writer`](super::Writer), the one seam between
//! its logic and aya. [`Maps`] implements it over the pinned maps; the tests' in-memory
//! `FakeMaps` (`fake.rs`) implements it over plain collections and records every write.
#![forbid(unsafe_code)]

use ailb_common::{
    maps, Backend, BackendAddr6, GlobalConfig, MemberChunk, ModelState, Service, ServiceKey, ServiceKey6, TableChunk,
    NO_BACKEND,
};

use std::os::fd::AsFd;

use aya::{
    maps::{Array, IterableMap, MapData},
    Pod,
};

use super::{map_err, sys, DatapathError, Maps};

/// Reads and writes of the maps the writer owns. Array entries never written read as zeros,
/// as a BPF array's do.
pub trait WriterMaps {
    fn config(&self) -> Result<GlobalConfig, DatapathError>;
    fn set_config(&mut self, value: GlobalConfig) -> Result<(), DatapathError>;
    fn model(&self, index: u32) -> Result<ModelState, DatapathError>;
    fn set_model(&mut self, index: u32, value: ModelState) -> Result<(), DatapathError>;
    /// Writes each `(index, entry)`, in order, as [`WriterMaps::set_model`] would (the kernel
    /// maps take them in one call, one entry after the other).
    fn set_models(&mut self, entries: &[(u32, ModelState)]) -> Result<(), DatapathError> {
        entries.iter().try_for_each(|&(index, st)| self.set_model(index, st))
    }
    /// Chunks of the table and of the member arena (their maps' `max_entries`).
    fn arena_chunks(&self) -> (u32, u32);
    /// `len` slots of the table arena from position `pos`.
    fn table(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError>;
    /// Writes `slots` from arena position `pos` (a chunk start); the rest of the last chunk
    /// holds [`NO_BACKEND`].
    fn set_table(&mut self, pos: u32, slots: &[u32]) -> Result<(), DatapathError>;
    /// `len` ids of the member arena from position `pos`.
    fn members(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError>;
    /// Writes `ids` from arena position `pos` (a chunk start), like [`WriterMaps::set_table`].
    fn set_members(&mut self, pos: u32, ids: &[u32]) -> Result<(), DatapathError>;
    /// Writes each `(pos, slots)` as [`WriterMaps::set_table`] would, in order (the kernel maps
    /// take them all in one call).
    fn set_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DatapathError> {
        tables.iter().try_for_each(|&(pos, slots)| self.set_table(pos, slots))
    }
    /// Writes each `(pos, ids)` as [`WriterMaps::set_members`] would, in order (one call).
    fn set_member_lists(&mut self, lists: &[(u32, &[u32])]) -> Result<(), DatapathError> {
        lists.iter().try_for_each(|&(pos, ids)| self.set_members(pos, ids))
    }
    fn backend(&self, id: u32) -> Result<Backend, DatapathError>;
    fn set_backend(&mut self, id: u32, value: Backend) -> Result<(), DatapathError>;
    /// The IPv6 address of backend `id` (`AILB_BACKEND_ADDRS6`; meaningful for an IPv6 backend).
    fn backend_addr6(&self, id: u32) -> Result<BackendAddr6, DatapathError>;
    fn set_backend_addr6(&mut self, id: u32, value: BackendAddr6) -> Result<(), DatapathError>;
    /// Writes each `(id, entry)`, in order, as [`WriterMaps::set_backend`] would (the kernel
    /// maps take them in one call).
    fn set_backends(&mut self, entries: &[(u32, Backend)]) -> Result<(), DatapathError> {
        entries.iter().try_for_each(|&(id, b)| self.set_backend(id, b))
    }
    /// Entry `index` of `AILB_INFLIGHT` (a backend id for its connection count).
    fn inflight(&self, index: u32) -> Result<u64, DatapathError>;
    /// The VIPs in `AILB_SERVICES` (a key that cannot be read is left out).
    fn service_keys(&self) -> Vec<ServiceKey>;
    /// A VIP's entry; `None` when absent or unreadable.
    fn service(&self, key: &ServiceKey) -> Option<Service>;
    fn insert_service(&mut self, key: &ServiceKey, value: &Service) -> Result<(), DatapathError>;
    fn remove_service(&mut self, key: &ServiceKey) -> Result<(), DatapathError>;
    /// The IPv6 VIPs in `AILB_SERVICES6`, likewise.
    fn service6_keys(&self) -> Vec<ServiceKey6>;
    fn service6(&self, key: &ServiceKey6) -> Option<Service>;
    fn insert_service6(&mut self, key: &ServiceKey6, value: &Service) -> Result<(), DatapathError>;
    fn remove_service6(&mut self, key: &ServiceKey6) -> Result<(), DatapathError>;
    /// The name hashes in `AILB_MODEL_NAMES` (a key that cannot be read is left out).
    fn model_name_keys(&self) -> Vec<u64>;
    fn insert_model_name(&mut self, hash: u64, model: u32) -> Result<(), DatapathError>;
    fn remove_model_name(&mut self, hash: u64) -> Result<(), DatapathError>;
    /// Removes the freed backends `gone` (model index, id) from every entry of the prefix map,
    /// so that an id given out again inherits no cached blocks; returns the entries changed.
    fn clear_prefix_holders(&mut self, gone: &[(u32, u32)]) -> Result<u64, DatapathError>;
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
    fn set_models(&mut self, entries: &[(u32, ModelState)]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<ModelState>) = entries.iter().copied().unzip();
        if batch(&self.models, &keys, &values) {
            return Ok(());
        }
        entries.iter().try_for_each(|&(index, st)| self.set_model(index, st))
    }
    fn arena_chunks(&self) -> (u32, u32) {
        (self.tables.len(), self.members.len())
    }
    fn table(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError> {
        read_chunked(pos, len, |c| Ok(self.tables.get(&c, 0).map_err(map_err(maps::TABLES))?.slots))
    }
    fn set_table(&mut self, pos: u32, slots: &[u32]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<TableChunk>) =
            chunked(pos, slots).map(|(c, chunk)| (c, TableChunk { slots: chunk })).unzip();
        if batch(&self.tables, &keys, &values) {
            return Ok(());
        }
        for (c, chunk) in keys.into_iter().zip(values) {
            self.tables.set(c, chunk, 0).map_err(map_err(maps::TABLES))?;
        }
        Ok(())
    }
    fn members(&self, pos: u32, len: u32) -> Result<Vec<u32>, DatapathError> {
        read_chunked(pos, len, |c| Ok(self.members.get(&c, 0).map_err(map_err(maps::MEMBERS))?.ids))
    }
    fn set_members(&mut self, pos: u32, ids: &[u32]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<MemberChunk>) =
            chunked(pos, ids).map(|(c, chunk)| (c, MemberChunk { ids: chunk })).unzip();
        if batch(&self.members, &keys, &values) {
            return Ok(());
        }
        for (c, chunk) in keys.into_iter().zip(values) {
            self.members.set(c, chunk, 0).map_err(map_err(maps::MEMBERS))?;
        }
        Ok(())
    }
    fn set_tables(&mut self, tables: &[(u32, &[u32])]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<TableChunk>) = tables
            .iter()
            .flat_map(|&(pos, slots)| chunked(pos, slots))
            .map(|(c, chunk)| (c, TableChunk { slots: chunk }))
            .unzip();
        if batch(&self.tables, &keys, &values) {
            return Ok(());
        }
        tables.iter().try_for_each(|&(pos, slots)| self.set_table(pos, slots))
    }
    fn set_member_lists(&mut self, lists: &[(u32, &[u32])]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<MemberChunk>) = lists
            .iter()
            .flat_map(|&(pos, ids)| chunked(pos, ids))
            .map(|(c, chunk)| (c, MemberChunk { ids: chunk }))
            .unzip();
        if batch(&self.members, &keys, &values) {
            return Ok(());
        }
        lists.iter().try_for_each(|&(pos, ids)| self.set_members(pos, ids))
    }
    fn backend(&self, id: u32) -> Result<Backend, DatapathError> {
        self.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))
    }
    fn set_backend(&mut self, id: u32, value: Backend) -> Result<(), DatapathError> {
        self.backends.set(id, value, 0).map_err(map_err(maps::BACKENDS))
    }
    fn backend_addr6(&self, id: u32) -> Result<BackendAddr6, DatapathError> {
        self.backend_addrs6.get(&id, 0).map_err(map_err(maps::BACKEND_ADDRS6))
    }
    fn set_backend_addr6(&mut self, id: u32, value: BackendAddr6) -> Result<(), DatapathError> {
        self.backend_addrs6.set(id, value, 0).map_err(map_err(maps::BACKEND_ADDRS6))
    }
    fn set_backends(&mut self, entries: &[(u32, Backend)]) -> Result<(), DatapathError> {
        let (keys, values): (Vec<u32>, Vec<Backend>) = entries.iter().copied().unzip();
        if batch(&self.backends, &keys, &values) {
            return Ok(());
        }
        entries.iter().try_for_each(|&(id, b)| self.set_backend(id, b))
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
    fn service6_keys(&self) -> Vec<ServiceKey6> {
        self.services6.keys().filter_map(Result::ok).collect()
    }
    fn service6(&self, key: &ServiceKey6) -> Option<Service> {
        self.services6.get(key, 0).ok()
    }
    fn insert_service6(&mut self, key: &ServiceKey6, value: &Service) -> Result<(), DatapathError> {
        self.services6.insert(key, value, 0).map_err(map_err(maps::SERVICES6))
    }
    fn remove_service6(&mut self, key: &ServiceKey6) -> Result<(), DatapathError> {
        self.services6.remove(key).map_err(map_err(maps::SERVICES6))
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
    fn clear_prefix_holders(&mut self, gone: &[(u32, u32)]) -> Result<u64, DatapathError> {
        super::prefix::PrefixMap::open(&self.dir)?.clear_backends(gone)
    }
}

/// Writes `values` at `keys` of an array map in one `BPF_MAP_UPDATE_BATCH`. False when the
/// kernel refused it (a kernel without batch updates, or an entry it refuses): the caller then
/// writes them one by one, which names the entry that fails.
fn batch<V: Pod>(map: &Array<MapData, V>, keys: &[u32], values: &[V]) -> bool {
    sys::map_update_batch(map.map().fd().as_fd(), keys, values).is_ok()
}

/// The chunks (index, value) that hold `entries` from arena position `pos` (a chunk start),
/// the last one padded with [`NO_BACKEND`].
pub(crate) fn chunked<const N: usize>(pos: u32, entries: &[u32]) -> impl Iterator<Item = (u32, [u32; N])> + '_ {
    let first = pos / N as u32;
    entries.chunks(N).enumerate().map(move |(k, part)| {
        let mut chunk = [NO_BACKEND; N];
        chunk[..part.len()].copy_from_slice(part);
        (first + k as u32, chunk)
    })
}

/// `len` entries from arena position `pos`, read chunk by chunk (`N` entries each) with `get`.
pub(crate) fn read_chunked<const N: usize>(
    pos: u32,
    len: u32,
    get: impl Fn(u32) -> Result<[u32; N], DatapathError>,
) -> Result<Vec<u32>, DatapathError> {
    let mut out = Vec::with_capacity(len as usize);
    let end = u64::from(pos) + u64::from(len);
    let mut at = u64::from(pos);
    while at < end {
        let values = get((at / N as u64) as u32)?;
        let lane = (at % N as u64) as usize;
        let take = ((end - at) as usize).min(N - lane);
        out.extend_from_slice(&values[lane..lane + take]);
        at += take as u64;
    }
    Ok(out)
}
