//! The pick's maps as plain vectors ([`VecMaps`]): the kernel's maps' twin in userspace.

use super::PickMaps;
use crate::abi::*;

/// The pick's maps as plain vectors, for userspace (`ailb explain` over a copy of the pinned
/// maps, the fleet model): backend `id` at index `id`; `table` is the extent of the table
/// arena from position `table_offset`, `members` that of the member arena from
/// `member_offset`, and any other position reads as absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VecMaps {
    pub backends: Vec<Backend>,
    pub inflight: Vec<u64>,
    pub inflight_mem: Vec<u64>,
    pub table_offset: u32,
    pub table: Vec<u32>,
    pub member_offset: u32,
    pub members: Vec<u32>,
    /// `AILB_PREFIX`: `(model, key) -> holders`.
    pub prefix: std::collections::BTreeMap<(u32, u64), PrefixHolders>,
    /// `AILB_PREFIX_FILTER` as the keys that test positive; `None`: no filter.
    pub prefix_filter: Option<std::collections::BTreeSet<(u32, u64)>>,
}

impl VecMaps {
    /// The maps of one model whose members are `backends` (ids `0..n`, nothing in flight), with
    /// its weighted Maglev table in slot `active` of the returned state (`MODEL_AVAILABLE`).
    /// The slot's extents start one chunk into each arena (model `model`'s place in a kernel
    /// with one chunk per model before it), so a pick that reads from position 0 is caught.
    pub fn one_model(model: u32, active: u32, backends: Vec<Backend>) -> (VecMaps, ModelState) {
        let keyed: Vec<crate::maglev::MaglevBackend> = backends
            .iter()
            .enumerate()
            .map(|(i, b)| crate::maglev::MaglevBackend {
                id: i as u32,
                key: crate::hash::backend_key(b.addr, b.port, 0),
                weight: b.weight,
            })
            .collect();
        let size = crate::maglev::table_size_for(keyed.len());
        let table = crate::maglev::build(&keyed, size).expect("ids 0..n and their keys are distinct");
        let mut state = ModelState { active, flags: MODEL_AVAILABLE, ..Default::default() };
        let (table_offset, member_offset) = ((model + 1) * TABLE_CHUNK, (model + 1) * MEMBER_CHUNK);
        state.slots[(active & 1) as usize] = TableSlot {
            size,
            members: backends.len() as u32,
            total_weight: backends.iter().map(|b| b.weight as u64).sum(),
            generation: 1,
            table_offset,
            member_offset,
        };
        let n = backends.len();
        let maps = VecMaps {
            inflight: vec![0; n],
            inflight_mem: vec![0; n],
            table_offset,
            table,
            member_offset,
            members: (0..n as u32).collect(),
            backends,
            prefix: Default::default(),
            prefix_filter: None,
        };
        (maps, state)
    }
}

impl PickMaps for VecMaps {
    fn backend(&self, id: u32) -> Option<Backend> {
        self.backends.get(id as usize).copied()
    }
    fn inflight(&self, id: u32) -> u64 {
        self.inflight.get(id as usize).copied().unwrap_or(0)
    }
    fn inflight_mem(&self, id: u32) -> u64 {
        self.inflight_mem.get(id as usize).copied().unwrap_or(0)
    }
    fn table_entry(&self, pos: u32) -> Option<u32> {
        self.table.get(pos.checked_sub(self.table_offset)? as usize).copied()
    }
    fn member(&self, pos: u32) -> Option<u32> {
        self.members.get(pos.checked_sub(self.member_offset)? as usize).copied()
    }
    fn prefix_holders(&self, model: u32, key: u64) -> Option<&PrefixHolders> {
        self.prefix.get(&(model, key))
    }
    fn prefix_maybe_held(&self, model: u32, key: u64) -> bool {
        self.prefix_filter.as_ref().is_none_or(|f| f.contains(&(model, key)))
    }
}
