//! Reads one model's load from the pinned maps, for the front door's admission: its
//! connections in flight (`AILB_INFLIGHT[INFLIGHT_MODEL_BASE + model]`, every connection to
//! its backends from the attached cgroup, whichever entry point opened it), the members of
//! its active table with their entries, and each backend's hinted memory in flight
//! (`AILB_INFLIGHT[INFLIGHT_MEM_BASE + id]`). Read-only: it opens maps and never writes.
#![forbid(unsafe_code)]

use std::path::Path;

use ailb_common::{
    abi::{maps, MemberChunk, ModelState, MAX_MEMBERS},
    hash::conversation_hash,
    Backend, INFLIGHT_MEM_BASE, INFLIGHT_MODEL_BASE, MAX_MODELS, MEMBER_CHUNK, MODEL_AVAILABLE,
};
use aya::maps::{Array, HashMap, MapData};

use super::{map_err, open_map, DatapathError};

/// The pinned model names (by hash), models, member lists, backends and in-flight counters.
pub struct ModelLoad {
    names: HashMap<MapData, u64, u32>,
    inflight: Array<MapData, u64>,
    models: Array<MapData, ModelState>,
    members: Array<MapData, MemberChunk>,
    backends: Array<MapData, Backend>,
}

impl ModelLoad {
    /// Opens the pins under `dir` (reading them needs the privilege the pins' mode and the
    /// kernel ask: the daemon's user, or `CAP_BPF`).
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        let names = open_map(dir, maps::MODEL_NAMES)?.try_into().map_err(map_err(maps::MODEL_NAMES))?;
        let inflight = open_map(dir, maps::INFLIGHT)?.try_into().map_err(map_err(maps::INFLIGHT))?;
        let models = open_map(dir, maps::MODELS)?.try_into().map_err(map_err(maps::MODELS))?;
        let members = open_map(dir, maps::MEMBERS)?.try_into().map_err(map_err(maps::MEMBERS))?;
        let backends = open_map(dir, maps::BACKENDS)?.try_into().map_err(map_err(maps::BACKENDS))?;
        Ok(Self { names, inflight, models, members, backends })
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

    /// The members of the model's active table (id and entry); empty while the model has no
    /// live backend.
    pub fn members(&self, index: u32) -> Result<Vec<(u32, Backend)>, DatapathError> {
        let st = self.models.get(&index, 0).map_err(map_err(maps::MODELS))?;
        if st.flags & MODEL_AVAILABLE == 0 {
            return Ok(Vec::new());
        }
        let slot = *st.active_slot();
        let ids = super::store::read_chunked::<{ MEMBER_CHUNK as usize }>(
            slot.member_offset,
            slot.members.min(MAX_MEMBERS),
            |c| Ok(self.members.get(&c, 0).map_err(map_err(maps::MEMBERS))?.ids),
        )?;
        ids.into_iter().map(|id| Ok((id, self.backends.get(&id, 0).map_err(map_err(maps::BACKENDS))?))).collect()
    }

    /// Connections in flight to backend `id` (what the kernel compares with its `max_inflight`).
    pub fn backend_inflight(&self, id: u32) -> Result<u64, DatapathError> {
        self.inflight.get(&id, 0).map_err(map_err(maps::INFLIGHT))
    }

    /// The memory hints (MB) of the connections in flight to backend `id`, summed.
    pub fn inflight_mem(&self, id: u32) -> Result<u64, DatapathError> {
        self.inflight.get(&(INFLIGHT_MEM_BASE + id), 0).map_err(map_err(maps::INFLIGHT))
    }
}
