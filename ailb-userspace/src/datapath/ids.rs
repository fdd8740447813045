//! Model indices (`AILB_MODELS`) and backend ids (`AILB_BACKENDS`, the in-flight and stats
//! counters). A model keeps its index, and a backend (model index, address) its id, across
//! reloads and restarts; a new one takes the lowest free. A backend that left the plan is
//! retired: its id stays taken until its in-flight count is 0, so that the counts of the
//! connections still open to it never mix with those of a backend that would take its id.
#![forbid(unsafe_code)]

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use ailb_common::{MAX_BACKENDS, MAX_MODELS};

use super::DatapathError;

/// A backend's identity: its model's index and its address.
pub(crate) type BackendKey = (u32, SocketAddr);

#[derive(Debug, Default)]
pub(crate) struct Ids {
    /// Model name -> index.
    models: BTreeMap<String, u32>,
    /// Backend -> id; includes the retired ones.
    backends: BTreeMap<BackendKey, u32>,
    /// Backends that left the plan, whose ids wait for their in-flight count to reach 0.
    retired: BTreeMap<BackendKey, u32>,
    model_pool: Pool,
    backend_pool: Pool,
}

/// Taken indices, and the lowest one that may be free: new ones take the lowest free in
/// amortised O(log n), so that assigning thousands of new ids in one apply stays fast.
#[derive(Debug, Default)]
struct Pool {
    taken: BTreeSet<u32>,
    /// Every index below this is taken.
    cursor: u32,
}

impl Pool {
    fn insert(&mut self, index: u32) {
        self.taken.insert(index);
    }

    fn remove(&mut self, index: u32) {
        self.taken.remove(&index);
        self.cursor = self.cursor.min(index);
    }

    /// The lowest index in `0..max` not taken, now taken.
    fn take(&mut self, max: u32, what: &'static str) -> Result<u32, DatapathError> {
        while self.taken.contains(&self.cursor) {
            self.cursor += 1;
        }
        if self.cursor >= max {
            return Err(DatapathError::Full { what, max });
        }
        self.taken.insert(self.cursor);
        Ok(self.cursor)
    }
}

impl Ids {
    /// Takes over a model index found in the maps.
    pub(crate) fn recover_model(&mut self, name: String, index: u32) {
        self.model_pool.insert(index);
        self.models.insert(name, index);
    }

    /// Takes over a backend id found in the maps.
    pub(crate) fn recover_backend(&mut self, key: BackendKey, id: u32) {
        self.backend_pool.insert(id);
        self.backends.insert(key, id);
    }

    pub(crate) fn model_count(&self) -> usize {
        self.models.len()
    }

    pub(crate) fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// The name of the model at `index`, if known.
    pub(crate) fn model_name(&self, index: u32) -> Option<&str> {
        self.models.iter().find(|(_, &i)| i == index).map(|(n, _)| n.as_str())
    }

    /// The index of a known model.
    pub(crate) fn model(&self, name: &str) -> Option<u32> {
        self.models.get(name).copied()
    }

    /// The model's index: its own if known, else the lowest free one.
    pub(crate) fn assign_model(&mut self, name: &str) -> Result<u32, DatapathError> {
        if let Some(index) = self.model(name) {
            return Ok(index);
        }
        let index = self.model_pool.take(MAX_MODELS, "models")?;
        self.models.insert(name.to_string(), index);
        Ok(index)
    }

    /// The known models that `keep` rejects, by name.
    pub(crate) fn models_except(&self, keep: impl Fn(&str) -> bool) -> Vec<(String, u32)> {
        self.models.iter().filter(|(n, _)| !keep(n)).map(|(n, &i)| (n.clone(), i)).collect()
    }

    /// Frees a model's index at once (its backends are retired as the plan no longer has them).
    pub(crate) fn forget_model(&mut self, name: &str) {
        if let Some(index) = self.models.remove(name) {
            self.model_pool.remove(index);
        }
    }

    /// The id of a known backend (retired ones included).
    pub(crate) fn backend(&self, key: &BackendKey) -> Option<u32> {
        self.backends.get(key).copied()
    }

    /// The backend's id: its own if known (even while retired), else the lowest free one.
    pub(crate) fn assign_backend(&mut self, key: BackendKey) -> Result<u32, DatapathError> {
        if let Some(id) = self.backend(&key) {
            return Ok(id);
        }
        let id = self.backend_pool.take(MAX_BACKENDS, "backends")?;
        self.backends.insert(key, id);
        Ok(id)
    }

    /// Retires every backend that `planned` does not hold (and only those: one that came back
    /// keeps its id and is live again); returns the retired ids.
    pub(crate) fn retire_unplanned(&mut self, planned: &BTreeSet<BackendKey>) -> Vec<u32> {
        self.retired = self.backends.iter().filter(|(k, _)| !planned.contains(k)).map(|(k, &id)| (*k, id)).collect();
        self.retired.values().copied().collect()
    }

    /// The retired backends and their ids.
    pub(crate) fn retired(&self) -> Vec<(BackendKey, u32)> {
        self.retired.iter().map(|(k, &id)| (*k, id)).collect()
    }

    /// Frees a retired backend's id.
    pub(crate) fn free(&mut self, key: &BackendKey) {
        if let Some(id) = self.backends.remove(key) {
            self.backend_pool.remove(id);
        }
        self.retired.remove(key);
    }
}

#[cfg(test)]
mod tests;
