//! Each model's Maglev table. The tables whose builder inputs changed are built on all cores
//! and swapped in one model at a time as they come (the writes overlap the next builds): the
//! table and members written into free arena extents first, then the inactive slot's
//! description, then the flip of `active`, then the old extents released.

use std::time::Instant;

use ailb_common::{
    maglev::{self, MaglevBackend},
    ModelState, TableSlot, MODEL_AVAILABLE,
};
use tracing::{debug, info};

use super::{ActiveTable, ApplyReport, Writer};
use crate::{
    datapath::{
        arena::Extent,
        store::WriterMaps,
        tables::{self, Built},
        values::{is_member, maglev_member, model_ttl_ns, name_bytes},
        DatapathError,
    },
    policy::Plan,
};

/// What a model's entry and table are made of.
struct TableInput<'p> {
    name: &'p str,
    model: u32,
    /// The live backends, by id.
    members: Vec<MaglevBackend>,
    ttl_ns: u64,
}

/// A table ready to be swapped in, with its slot's description.
struct NewTable<'t> {
    slot: TableSlot,
    table: &'t [u32],
    ids: &'t [u32],
}

impl<M: WriterMaps> Writer<M> {
    pub(super) fn write_tables(
        &mut self,
        plan: &Plan,
        seed: u64,
        generation: u64,
        report: &mut ApplyReport,
    ) -> Result<(), DatapathError> {
        let inputs = self.table_inputs(plan, seed);
        let stale = self.stale(&inputs);
        let jobs: Vec<(&[MaglevBackend], u32)> = stale
            .iter()
            .map(|&k| (inputs[k].members.as_slice(), maglev::table_size_for(inputs[k].members.len())))
            .collect();
        // Models in plan order; a stale one's table comes from the builders, which go on with
        // the next tables while this thread writes.
        let started = Instant::now();
        let mut k = 0;
        tables::build_streamed(&jobs, |j, built| {
            while k < stale[j] {
                self.write_model(&inputs[k], None, generation, report)?;
                k += 1;
            }
            self.write_model(&inputs[k], Some(built), generation, report)?;
            k += 1;
            Ok(())
        })?;
        for input in &inputs[k..] {
            self.write_model(input, None, generation, report)?;
        }
        if !jobs.is_empty() {
            debug!(tables = jobs.len(), build_and_swap_us = started.elapsed().as_micros() as u64, "tables built");
        }
        Ok(())
    }

    fn table_inputs<'p>(&self, plan: &'p Plan, seed: u64) -> Vec<TableInput<'p>> {
        plan.iter()
            .map(|(name, mp)| {
                let model = self.model_index(name);
                let mut members: Vec<MaglevBackend> = mp
                    .backends
                    .iter()
                    .filter(|b| is_member(b))
                    .map(|b| {
                        let id = self.ids.backend(&(model, b.address)).expect("allocate_ids gives every backend an id");
                        maglev_member(id, b, seed)
                    })
                    .collect();
                members.sort_by_key(|m| m.id);
                TableInput { name, model, members, ttl_ns: model_ttl_ns(mp.affinity_ttl) }
            })
            .collect()
    }

    /// The inputs (by index) whose table must be built: members, and inputs other than the
    /// cached table's.
    fn stale(&self, inputs: &[TableInput<'_>]) -> Vec<usize> {
        (0..inputs.len())
            .filter(|&k| {
                let input = &inputs[k];
                !input.members.is_empty() && self.built.get(&input.model).is_none_or(|b| *b != input.members)
            })
            .collect()
    }

    /// One model's entry and table: unavailable without members; else the TTL updated in
    /// place, and the table swapped in unless the kernel already has it.
    fn write_model(
        &mut self,
        input: &TableInput<'_>,
        prebuilt: Option<Built>,
        generation: u64,
        report: &mut ApplyReport,
    ) -> Result<(), DatapathError> {
        let TableInput { name, model, ref members, ttl_ns } = *input;
        let mut st = self.model_state(model);
        if members.is_empty() {
            return self.mark_unavailable(input, st);
        }
        let available = st.flags & MODEL_AVAILABLE != 0;
        if st.affinity_ttl_ns != ttl_ns && available {
            // A TTL change alone needs no table swap: one update of the model entry.
            st.affinity_ttl_ns = ttl_ns;
            self.set_model(model, st)?;
        }
        // Same builder inputs as the table in the kernel: nothing to build or write.
        if available && self.tables.contains_key(&model) && self.built.get(&model).is_some_and(|b| b == members) {
            debug!(model = name, "table inputs unchanged");
            return Ok(());
        }
        let size = maglev::table_size_for(members.len());
        let Built { table, took } = prebuilt.unwrap_or_else(|| tables::build_all(&[(members, size)]).remove(0));
        let table = table.map_err(|source| DatapathError::Table { model: name.to_string(), source })?;
        let started = Instant::now();
        let ids: Vec<u32> = members.iter().map(|m| m.id).collect();
        let total_weight: u64 = members.iter().map(|m| m.weight as u64).sum();
        let unchanged = self.tables.get(&model).is_some_and(|t| t.table == table && t.members == ids)
            && available
            && st.active_slot().total_weight == total_weight;
        self.built.insert(model, members.to_vec());
        if unchanged {
            debug!(model = name, "table unchanged");
            return Ok(());
        }
        let slot = TableSlot { size, members: ids.len() as u32, total_weight, generation, ..Default::default() };
        let (table_at, members_at) = self.swap_table(input, st, NewTable { slot, table: &table, ids: &ids })?;
        let (build_us, swap_us) = (took.as_micros() as u64, started.elapsed().as_micros() as u64);
        info!(model = name, backends = ids.len(), table_size = size, generation, build_us, swap_us, "table swapped");
        report.tables_rebuilt.push(name.to_string());
        if let Some(old) = self.tables.insert(model, ActiveTable { table, members: ids, table_at, members_at }) {
            self.release(old);
        }
        Ok(())
    }

    /// A model without a live backend: connects to its VIPs are refused. Its last table's
    /// extents are released once the entry says so; the cache forgets it, so that the next
    /// members are swapped in.
    fn mark_unavailable(&mut self, input: &TableInput<'_>, mut st: ModelState) -> Result<(), DatapathError> {
        let name = name_bytes(input.name);
        if st.flags & MODEL_AVAILABLE != 0 || st.name != name || st.affinity_ttl_ns != input.ttl_ns {
            st.flags = 0;
            st.name = name;
            st.affinity_ttl_ns = input.ttl_ns;
            self.set_model(input.model, st)?;
            info!(model = input.name, "no live backend: connections to its VIPs are refused");
        }
        if let Some(old) = self.tables.remove(&input.model) {
            self.release(old);
        }
        self.built.remove(&input.model);
        Ok(())
    }

    /// Writes the table and members into free extents, describes them in the inactive slot
    /// (readers still use the active one), then flips `active` to it. Returns the extents.
    fn swap_table(
        &mut self,
        input: &TableInput<'_>,
        mut st: ModelState,
        mut new: NewTable<'_>,
    ) -> Result<(Extent, Extent), DatapathError> {
        let table_at = self.table_arena.alloc(new.table.len() as u32)?;
        let members_at = match self.member_arena.alloc(new.ids.len() as u32) {
            Ok(e) => e,
            Err(e) => {
                self.table_arena.cancel(table_at);
                return Err(e);
            }
        };
        // Nothing names these extents until the slot's description below is written.
        self.maps.set_table(table_at.pos, new.table)?;
        self.maps.set_members(members_at.pos, new.ids)?;
        new.slot.table_offset = table_at.pos;
        new.slot.member_offset = members_at.pos;
        let inactive = (st.active & 1) ^ 1;
        st.slots[inactive as usize] = new.slot;
        st.name = name_bytes(input.name);
        st.affinity_ttl_ns = input.ttl_ns;
        // The inactive slot described first (readers still use the active one), then the
        // flip of `active` alone: a connect reads the entry once, so it uses the old table or
        // the new one, never a mix. Both go in one call; the kernel writes them in order.
        let mut flipped = st;
        flipped.active = inactive;
        flipped.flags = MODEL_AVAILABLE;
        self.set_models(&[(input.model, st), (input.model, flipped)])?;
        Ok((table_at, members_at))
    }
}
