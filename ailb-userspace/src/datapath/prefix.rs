//! The kernel's prefix map from userspace: what the precise mode writes (each engine's KV
//! events, as block keys held or evicted per backend), the per-model counters, and the
//! directory that names a backend's kernel id from its model and address.
//!
//! Writes are read-modify-write of one entry: the daemon is the only writer of a precise
//! model's entries (the kernel learns only for approximate models), so no update is lost.

use std::collections::HashMap as StdHashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};

use ailb_common::{
    maps, prefix_tick, ModelState, PrefixHolders, PrefixKey, PrefixStats, MAX_MODELS, PREFIX_SEEN_EXACT,
};
use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray};
use serde::Serialize;

use super::{map_err, prefix_filter::PrefixFilter, DatapathError};

/// Which kernel ids a model's backends have now: `(model name, address) -> BackendIds`. The
/// writer replaces it after each plan it writes; the KV-event feed reads it.
#[derive(Debug, Clone, Default)]
pub struct IdDirectory {
    inner: Arc<RwLock<Directory>>,
}

/// A backend's kernel ids, and how long its model counts a holder its engine evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendIds {
    /// The model's index.
    pub model: u32,
    /// The backend's id.
    pub id: u32,
    /// The model's `prefix_ttl` in [`ailb_common::prefix_ttl_ticks`]: an evicted block's holder
    /// counts that long ([`PrefixHolders::evict`]); 0 (no lifetime): it is removed at once.
    pub evicted_ttl_ticks: u32,
}

/// `(model name, address) -> BackendIds`.
pub type Directory = StdHashMap<(String, SocketAddr), BackendIds>;

impl IdDirectory {
    /// The kernel ids of `model`'s backend at `addr`, if it has one now.
    pub fn lookup(&self, model: &str, addr: SocketAddr) -> Option<BackendIds> {
        self.inner.read().ok()?.get(&(model.to_string(), addr)).copied()
    }

    /// Replaces the whole directory.
    pub fn replace(&self, ids: Directory) {
        if let Ok(mut g) = self.inner.write() {
            *g = ids;
        }
    }

    pub fn len(&self) -> usize {
        self.inner.read().map(|g| g.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What one [`PrefixMap::apply`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixApplied {
    /// Blocks recorded for the backend.
    pub stored: u64,
    /// Blocks the backend no longer holds (evicted holders, or removed where the model keeps
    /// none).
    pub removed: u64,
    /// Blocks already held by `PREFIX_HOLDERS` other backends (exact): not recorded.
    pub full: u64,
}

/// The pinned `AILB_PREFIX`, `AILB_PREFIX_STATS` and `AILB_PREFIX_FILTER`, and `AILB_MODELS`
/// for each model's prefix lifetime.
pub struct PrefixMap {
    map: HashMap<MapData, PrefixKey, PrefixHolders>,
    stats: PerCpuArray<MapData, PrefixStats>,
    filter: PrefixFilter,
    models: Array<MapData, ModelState>,
}

/// What one [`PrefixMap::sweep`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Entries left in the map, each in the rebuilt filter.
    pub kept: usize,
    /// Entries removed: none of their holders counted any longer.
    pub removed: usize,
}

fn open_map(dir: &Path, name: &str) -> Result<aya::maps::Map, DatapathError> {
    let md = MapData::from_pin(dir.join(name)).map_err(map_err(name))?;
    aya::maps::Map::from_map_data(md).map_err(map_err(name))
}

impl PrefixMap {
    /// Opens the maps pinned in `dir`.
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        Ok(Self {
            map: open_map(dir, maps::PREFIX)?.try_into().map_err(map_err(maps::PREFIX))?,
            stats: open_map(dir, maps::PREFIX_STATS)?.try_into().map_err(map_err(maps::PREFIX_STATS))?,
            filter: PrefixFilter::open(dir)?,
            models: open_map(dir, maps::MODELS)?.try_into().map_err(map_err(maps::MODELS))?,
        })
    }

    /// Removes the entries none of whose holders counts at `now_ns` (`CLOCK_MONOTONIC`): learnt,
    /// or evicted by their engine, longer ago than their model's `prefix_ttl`, or naming no
    /// backend ([`PrefixHolders::any_fresh`]), and rebuilds the filter from the keys left, in
    /// one scan of the map. The search already counts such an entry as not held; left in
    /// place, it takes a slot of the map until the LRU evicts it (a search that reads it keeps
    /// it recent), counts in the model's `entries`, and keeps its key positive in the filter,
    /// which costs a search a map lookup. A model without a lifetime (`prefix_ttl = "0s"`,
    /// or no prefix mode) keeps its entries.
    ///
    /// Each entry is read again just before its removal and kept if it counts again. Between
    /// that read and the removal the kernel may record a holder in it (a connect learning its
    /// keys): that record is lost, and the next connect of that prompt records it again.
    pub fn sweep(&mut self, now_ns: u64) -> Result<Swept, DatapathError> {
        let mut ttl = [0u32; MAX_MODELS as usize];
        for (model, t) in ttl.iter_mut().enumerate() {
            let st = self.models.get(&(model as u32), 0).map_err(map_err(maps::MODELS))?;
            *t = st.view().prefix_ttl_ticks();
        }
        let now = prefix_tick(now_ns);
        let counts = |k: &PrefixKey, h: &PrefixHolders| {
            // With no lifetime (0), any holder named counts.
            h.any_fresh(now, ttl.get(k.model as usize).copied().unwrap_or(0))
        };
        let mut stale = Vec::new();
        let kept = self.filter.rebuild(self.map.iter().filter_map(Result::ok).filter_map(|(k, h)| {
            if counts(&k, &h) {
                Some((k.model, k.key))
            } else {
                stale.push(k);
                None
            }
        }));
        let mut removed = 0;
        for k in stale {
            let Some(h) = self.get(&k)? else {
                continue;
            };
            if counts(&k, &h) {
                // Recorded again since the scan: its bits are in both generations already.
                continue;
            }
            match self.map.remove(&k) {
                Ok(()) => removed += 1,
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err(maps::PREFIX)(e)),
            }
        }
        Ok(Swept { kept, removed })
    }

    /// The filter.
    pub fn filter(&self) -> &PrefixFilter {
        &self.filter
    }

    fn get(&self, key: &PrefixKey) -> Result<Option<PrefixHolders>, DatapathError> {
        match self.map.get(key, 0) {
            Ok(h) => Ok(Some(h)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(maps::PREFIX)(e)),
        }
    }

    /// Records what backend `b` holds now (at `now_ns`, `CLOCK_MONOTONIC`): each `(key, held)`
    /// marks the block held (exact, never aged) or evicted ([`PrefixHolders::evict`]: stamped
    /// `now_ns`, counted for the model's lifetime; removed where it has none). A block held
    /// takes an empty slot or that of an evicted holder past its lifetime before displacing a
    /// holder that still counts.
    pub fn apply(
        &mut self,
        b: BackendIds,
        now_ns: u64,
        changes: &[(u64, bool)],
    ) -> Result<PrefixApplied, DatapathError> {
        let BackendIds { model, id, evicted_ttl_ticks: ttl } = b;
        let now = prefix_tick(now_ns);
        let mut done = PrefixApplied::default();
        for &(key, held) in changes {
            let k = PrefixKey { model, _pad: 0, key };
            let current = self.get(&k)?;
            if held {
                self.filter.add(model, key);
                let mut h = current.unwrap_or(PrefixHolders::EMPTY);
                if h.record(id, PREFIX_SEEN_EXACT, now, ttl) {
                    self.map.insert(k, h, 0).map_err(map_err(maps::PREFIX))?;
                    done.stored += 1;
                } else if !h.ids.contains(&id) {
                    done.full += 1;
                }
            } else if let Some(mut h) = current {
                if ttl != 0 {
                    if h.evict(id, now) {
                        self.map.insert(k, h, 0).map_err(map_err(maps::PREFIX))?;
                        done.removed += 1;
                    }
                } else if h.remove(id) {
                    done.removed += 1;
                    if h.is_empty() {
                        match self.map.remove(&k) {
                            Ok(()) | Err(MapError::KeyNotFound) => {}
                            Err(e) => return Err(map_err(maps::PREFIX)(e)),
                        }
                    } else {
                        self.map.insert(k, h, 0).map_err(map_err(maps::PREFIX))?;
                    }
                }
            }
        }
        Ok(done)
    }

    /// Removes backend `id` from every entry of `model` (its engine cleared its cache, or the
    /// backend left); returns the entries it was removed from. A scan of the map.
    pub fn clear_backend(&mut self, model: u32, id: u32) -> Result<u64, DatapathError> {
        self.clear_backends(&[(model, id)])
    }

    /// [`PrefixMap::clear_backend`] for every `(model, id)` of `gone`, in one scan.
    pub fn clear_backends(&mut self, gone: &[(u32, u32)]) -> Result<u64, DatapathError> {
        if gone.is_empty() {
            return Ok(0);
        }
        let keys: Vec<PrefixKey> =
            self.map.keys().filter_map(Result::ok).filter(|k| gone.iter().any(|(m, _)| *m == k.model)).collect();
        let mut n = 0;
        for k in keys {
            if let Some(mut h) = self.get(&k)? {
                let mut removed = false;
                for (_, id) in gone.iter().filter(|(m, _)| *m == k.model) {
                    removed |= h.remove(*id);
                }
                if removed {
                    n += 1;
                    if h.is_empty() {
                        let _ = self.map.remove(&k);
                    } else {
                        self.map.insert(k, h, 0).map_err(map_err(maps::PREFIX))?;
                    }
                }
            }
        }
        Ok(n)
    }

    /// The per-model counters, summed over CPUs, for the models that have any.
    pub fn stats(&self) -> Result<Vec<(u32, PrefixStats)>, DatapathError> {
        let mut out = Vec::new();
        for model in 0..MAX_MODELS {
            let per_cpu = self.stats.get(&model, 0).map_err(map_err(maps::PREFIX_STATS))?;
            let mut s = PrefixStats::default();
            per_cpu.iter().for_each(|c| s.merge(c));
            if s != PrefixStats::default() {
                out.push((model, s));
            }
        }
        Ok(out)
    }

    /// Entries per model index (a scan of the map).
    pub fn entries(&self) -> StdHashMap<u32, u64> {
        let mut out = StdHashMap::new();
        for k in self.map.keys().filter_map(Result::ok) {
            *out.entry(k.model).or_insert(0) += 1;
        }
        out
    }

    /// The entry of `key` of `model`, if any.
    pub fn holders(&self, model: u32, key: u64) -> Result<Option<PrefixHolders>, DatapathError> {
        self.get(&PrefixKey { model, _pad: 0, key })
    }
}

/// One model's prefix counters, as `ailb status` and `/metrics` show them.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PrefixStatus {
    pub mode: String,
    /// Entries (blocks) in the kernel map.
    pub entries: u64,
    /// How long a learnt entry or an evicted holder counts now, ms (the model's `prefix_ttl`,
    /// or less where its caches fill faster); 0: no lifetime.
    pub ttl_ms: u64,
    #[serde(flatten)]
    pub stats: PrefixStatsView,
}

/// [`PrefixStats`] with the rates a reader wants.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct PrefixStatsView {
    pub lookups: u64,
    pub found: u64,
    pub used: u64,
    pub overruled_load: u64,
    pub overruled_memory: u64,
    pub keys_sent: u64,
    pub keys_found: u64,
    /// Of `keys_found`, those whose longest prefix an engine reports held (precise mode).
    pub keys_exact: u64,
    pub learned: u64,
    /// Lookups in the map by the searches (the filter spares the others).
    pub map_lookups: u64,
}

impl From<PrefixStats> for PrefixStatsView {
    fn from(s: PrefixStats) -> Self {
        Self {
            lookups: s.lookups,
            found: s.found,
            used: s.used,
            overruled_load: s.overruled_load,
            overruled_memory: s.overruled_memory,
            keys_sent: s.keys_sent,
            keys_found: s.keys_found,
            keys_exact: s.keys_exact,
            learned: s.learned,
            map_lookups: s.map_lookups,
        }
    }
}
