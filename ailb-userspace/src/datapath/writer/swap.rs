//! Each model's Maglev table. The tables whose builder inputs changed are built on all cores
//! and handed to this thread in plan order as they come (the writes overlap the next builds).
//! Swaps are written [`SWAP_BATCH`] models at a time: the batch's tables into free arena
//! extents (one call), then its member lists (one call), then each model's entry twice, the
//! inactive slot's description and then the flip of `active` (one call; the kernel writes a
//! batch's entries in order). Every model's entry is written after its own table and members,
//! so a connect sees its old table or its new one, complete; a model's old extents are
//! released only once its entry no longer names them.

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
    /// The model's prefix mode as `ModelState::flags` bits, and its learnt-entry lifetime.
    prefix_flags: u32,
    prefix_ttl_ns: u64,
}

/// A table ready to be swapped in, with its slot's description.
struct NewTable {
    slot: TableSlot,
    table: Vec<u32>,
    ids: Vec<u32>,
}

/// Models whose swaps are written together (three `bpf(2)` calls for the batch instead of
/// three per model). A larger batch saves few calls more and delays the last models' flips
/// behind the builds; a swap waits at most for the batch's other tables to be built.
pub(super) const SWAP_BATCH: usize = 32;

/// A swap whose extents are taken and whose entry is ready, not yet written.
pub(super) struct PendingSwap {
    model: u32,
    /// The entry with the inactive slot described, then with `active` flipped to it.
    entries: [ModelState; 2],
    new: ActiveTable,
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
        let streamed = tables::build_streamed(&jobs, |j, built| {
            while k < stale[j] {
                self.write_model(&inputs[k], None, generation, report)?;
                k += 1;
            }
            self.write_model(&inputs[k], Some(built), generation, report)?;
            k += 1;
            Ok(())
        });
        let written = streamed
            .and_then(|()| inputs[k..].iter().try_for_each(|input| self.write_model(input, None, generation, report)))
            .and_then(|()| self.flush_swaps());
        if let Err(e) = written {
            self.drop_swaps();
            return Err(e);
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
                TableInput {
                    name,
                    model,
                    members,
                    ttl_ns: model_ttl_ns(mp.affinity_ttl),
                    prefix_flags: mp.prefix.kernel_flags(),
                    prefix_ttl_ns: model_ttl_ns(mp.prefix_ttl),
                }
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
        let TableInput { name, model, ref members, ttl_ns, prefix_flags, prefix_ttl_ns } = *input;
        let mut st = self.model_state(model);
        if members.is_empty() {
            return self.mark_unavailable(input, st);
        }
        let available = st.flags & MODEL_AVAILABLE != 0;
        let flags = MODEL_AVAILABLE | prefix_flags;
        if (st.affinity_ttl_ns != ttl_ns || st.flags != flags || st.prefix_ttl_ns != prefix_ttl_ns) && available {
            // A TTL or prefix mode change alone needs no table swap: one update of the model entry.
            st.affinity_ttl_ns = ttl_ns;
            st.flags = flags;
            st.prefix_ttl_ns = prefix_ttl_ns;
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
        let (backends, build_us) = (ids.len(), took.as_micros() as u64);
        self.queue_swap(input, st, NewTable { slot, table, ids })?;
        // The swap is written with its batch (`swap_us` includes that write when this model
        // completed the batch).
        let swap_us = started.elapsed().as_micros() as u64;
        info!(model = name, backends, table_size = size, generation, build_us, swap_us, "table swapped");
        report.tables_rebuilt.push(name.to_string());
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

    /// Takes free extents for the table and members and queues the swap: the inactive slot
    /// described (readers still use the active one), then `active` flipped to it. Writes the
    /// queue when it holds [`SWAP_BATCH`] swaps.
    fn queue_swap(
        &mut self,
        input: &TableInput<'_>,
        mut st: ModelState,
        mut new: NewTable,
    ) -> Result<(), DatapathError> {
        let (table_at, members_at) = self.alloc_extents(new.table.len() as u32, new.ids.len() as u32)?;
        new.slot.table_offset = table_at.pos;
        new.slot.member_offset = members_at.pos;
        let inactive = (st.active & 1) ^ 1;
        st.slots[inactive as usize] = new.slot;
        st.name = name_bytes(input.name);
        st.affinity_ttl_ns = input.ttl_ns;
        st.prefix_ttl_ns = input.prefix_ttl_ns;
        let mut flipped = st;
        flipped.active = inactive;
        flipped.flags = MODEL_AVAILABLE | input.prefix_flags;
        let new = ActiveTable { table: new.table, members: new.ids, table_at, members_at };
        self.swaps.push(PendingSwap { model: input.model, entries: [st, flipped], new });
        if self.swaps.len() >= SWAP_BATCH {
            self.flush_swaps()?;
        }
        Ok(())
    }

    /// Free extents for a table and its members. When an arena is full, the queued swaps are
    /// written first, which releases the extents they replace (reusable after the grace), and
    /// the allocation is tried again.
    fn alloc_extents(&mut self, table_len: u32, member_len: u32) -> Result<(Extent, Extent), DatapathError> {
        match self.try_alloc_extents(table_len, member_len) {
            Err(DatapathError::ArenaFull { .. }) if !self.swaps.is_empty() => {
                self.flush_swaps()?;
                self.try_alloc_extents(table_len, member_len)
            }
            other => other,
        }
    }

    fn try_alloc_extents(&mut self, table_len: u32, member_len: u32) -> Result<(Extent, Extent), DatapathError> {
        let table_at = self.table_arena.alloc(table_len)?;
        match self.member_arena.alloc(member_len) {
            Ok(members_at) => Ok((table_at, members_at)),
            Err(e) => {
                self.table_arena.cancel(table_at);
                Err(e)
            }
        }
    }

    /// Writes the queued swaps: every table, then every member list (nothing names these
    /// extents yet), then the entries in queue order, each model's description before its flip.
    /// Then the replaced extents are released. On an error the queued models' cache entries are
    /// dropped, so that the next apply builds and writes them again.
    pub(super) fn flush_swaps(&mut self) -> Result<(), DatapathError> {
        if self.swaps.is_empty() {
            return Ok(());
        }
        let swaps = std::mem::take(&mut self.swaps);
        if let Err(e) = self.write_swaps(&swaps) {
            for s in &swaps {
                self.built.remove(&s.model);
            }
            return Err(e);
        }
        for s in swaps {
            if let Some(old) = self.tables.insert(s.model, s.new) {
                self.release(old);
            }
        }
        Ok(())
    }

    /// Forgets the queued swaps after an error: their extents were never named in an entry
    /// (free at once), and their models are built and written again by the next apply.
    fn drop_swaps(&mut self) {
        for s in std::mem::take(&mut self.swaps) {
            self.table_arena.cancel(s.new.table_at);
            self.member_arena.cancel(s.new.members_at);
            self.built.remove(&s.model);
        }
    }

    fn write_swaps(&mut self, swaps: &[PendingSwap]) -> Result<(), DatapathError> {
        let tables: Vec<(u32, &[u32])> = swaps.iter().map(|s| (s.new.table_at.pos, s.new.table.as_slice())).collect();
        self.maps.set_tables(&tables)?;
        let members: Vec<(u32, &[u32])> =
            swaps.iter().map(|s| (s.new.members_at.pos, s.new.members.as_slice())).collect();
        self.maps.set_member_lists(&members)?;
        let entries: Vec<(u32, ModelState)> =
            swaps.iter().flat_map(|s| [(s.model, s.entries[0]), (s.model, s.entries[1])]).collect();
        self.set_models(&entries)
    }
}
