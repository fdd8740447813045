//! Reads one model's connections in flight (`AILB_INFLIGHT[INFLIGHT_MODEL_BASE + model]`,
//! every connection to its backends from the attached cgroup, whichever entry point opened
//! it) from the pinned maps, for the front door's admission. Read-only: it opens two maps
//! and never writes.
#![forbid(unsafe_code)]

use std::path::Path;

use ailb_common::{abi::maps, hash::conversation_hash, INFLIGHT_MODEL_BASE, MAX_MODELS};
use aya::maps::{Array, HashMap, MapData};

use super::{map_err, open_map, DatapathError};

/// The pinned model names (by hash) and in-flight counters.
pub struct ModelLoad {
    names: HashMap<MapData, u64, u32>,
    inflight: Array<MapData, u64>,
}

impl ModelLoad {
    /// Opens the pins under `dir` (reading them needs the privilege the pins' mode and the
    /// kernel ask: the daemon's user, or `CAP_BPF`).
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        let names = open_map(dir, maps::MODEL_NAMES)?.try_into().map_err(map_err(maps::MODEL_NAMES))?;
        let inflight = open_map(dir, maps::INFLIGHT)?.try_into().map_err(map_err(maps::INFLIGHT))?;
        Ok(Self { names, inflight })
    }

    /// The kernel's index of the model `name`; `None` while the daemon has not written it.
    pub fn model_index(&self, name: &str) -> Result<Option<u32>, DatapathError> {
        match self.names.get(&conversation_hash(name.as_bytes()), 0) {
            Ok(i) if i < MAX_MODELS => Ok(Some(i)),
            Ok(_) | Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(maps::MODEL_NAMES)(e)),
        }
    }

    /// Connections in flight to the model at `index`.
    pub fn inflight(&self, index: u32) -> Result<u64, DatapathError> {
        self.inflight.get(&(INFLIGHT_MODEL_BASE + index), 0).map_err(map_err(maps::INFLIGHT))
    }
}
