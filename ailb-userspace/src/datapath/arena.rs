//! Extents of the table and member arenas (`AILB_TABLES`, `AILB_MEMBERS`): which chunks hold
//! a model's live table or member list, and which are free. A swap takes a free extent for the
//! new table, writes it, flips the model to it, and releases the old extent; a released extent
//! is reused only after [`GRACE`], so that a connect that read the model entry just before the
//! flip finishes reading the old table before anything overwrites it.
#![forbid(unsafe_code)]

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::DatapathError;

/// How long a released extent waits before reuse. A connect reads its model entry once and
/// then at most `probes + MAX_MEMBERS` arena entries, within one BPF program run (tens of
/// microseconds; a 16,384-member scan well under a millisecond); 10 ms is a wide margin.
pub(crate) const GRACE: Duration = Duration::from_millis(10);

/// An extent of an arena, in entries (table slots or member ids), starting on a chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Extent {
    pub pos: u32,
    pub len: u32,
}

/// The free chunks of one arena.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The config field that sizes this arena (named in errors).
    field: &'static str,
    /// Entries per chunk.
    chunk: u32,
    /// Chunks in the arena (the map's `max_entries`).
    chunks: u32,
    /// Free runs: first chunk -> number of chunks; adjacent runs are merged.
    free: BTreeMap<u32, u32>,
    /// Released extents (first chunk, chunks) and when, not yet reusable.
    released: Vec<(Instant, u32, u32)>,
}

impl Arena {
    pub(crate) fn new(field: &'static str, chunk: u32, chunks: u32) -> Self {
        let mut free = BTreeMap::new();
        if chunks > 0 {
            free.insert(0, chunks);
        }
        Self { field, chunk, chunks, free, released: Vec::new() }
    }

    /// Chunks an extent of `len` entries takes.
    pub(crate) fn chunks_for(&self, len: u32) -> u32 {
        len.div_ceil(self.chunk)
    }

    pub(crate) fn capacity_entries(&self) -> u64 {
        u64::from(self.chunks) * u64::from(self.chunk)
    }

    /// Entries in free chunks (released ones not counted).
    pub(crate) fn free_entries(&self) -> u64 {
        self.free.values().map(|&n| u64::from(n) * u64::from(self.chunk)).sum()
    }

    /// Takes over an extent found in the maps (a restart). False when it is out of range or
    /// overlaps one taken already (corrupt state: the caller rebuilds that table elsewhere).
    pub(crate) fn reserve(&mut self, e: Extent) -> bool {
        let (first, n) = (e.pos / self.chunk, self.chunks_for(e.len));
        if !e.pos.is_multiple_of(self.chunk) || n == 0 {
            return false;
        }
        let Some((&start, &run)) = self.free.range(..=first).next_back() else {
            return false;
        };
        let Some(end) = first.checked_add(n) else {
            return false;
        };
        if end > start + run {
            return false;
        }
        self.free.remove(&start);
        if first > start {
            self.free.insert(start, first - start);
        }
        if start + run > end {
            self.free.insert(end, start + run - end);
        }
        true
    }

    /// A free extent of `len` entries (first fit), or `None` when no free run is long enough.
    fn take(&mut self, len: u32) -> Option<Extent> {
        let n = self.chunks_for(len);
        let (&start, &run) = self.free.iter().find(|(_, &run)| run >= n)?;
        self.free.remove(&start);
        if run > n {
            self.free.insert(start + n, run - n);
        }
        Some(Extent { pos: start * self.chunk, len })
    }

    /// A free extent of `len` entries. When none is free but extents were released, waits out
    /// the rest of their grace and tries again; an error names the config field when the
    /// arena is full even then.
    pub(crate) fn alloc(&mut self, len: u32) -> Result<Extent, DatapathError> {
        if let Some(e) = self.take(len) {
            return Ok(e);
        }
        if let Some(youngest) = self.released.iter().map(|r| r.0).max() {
            // The wait is the grace period of extents this apply released, not a readiness poll.
            std::thread::sleep(GRACE.saturating_sub(youngest.elapsed()));
            self.reclaim(Duration::ZERO);
            if let Some(e) = self.take(len) {
                return Ok(e);
            }
        }
        Err(DatapathError::ArenaFull {
            field: self.field,
            capacity: self.capacity_entries(),
            need: u64::from(self.chunks_for(len)) * u64::from(self.chunk),
            free: self.free_entries(),
        })
    }

    /// Gives back an extent taken but never named in a model entry: free at once.
    pub(crate) fn cancel(&mut self, e: Extent) {
        let n = self.chunks_for(e.len);
        if n > 0 {
            self.put(e.pos / self.chunk, n);
        }
    }

    /// Releases an extent: reusable after [`GRACE`].
    pub(crate) fn release(&mut self, e: Extent) {
        let n = self.chunks_for(e.len);
        if n > 0 {
            self.released.push((Instant::now(), e.pos / self.chunk, n));
        }
    }

    /// Makes the extents released at least `age` ago free again.
    pub(crate) fn reclaim(&mut self, age: Duration) {
        let (old, young): (Vec<_>, Vec<_>) = self.released.drain(..).partition(|r| r.0.elapsed() >= age);
        self.released = young;
        for (_, first, n) in old {
            self.put(first, n);
        }
    }

    /// Frees a run of chunks, merged with its free neighbours.
    fn put(&mut self, mut first: u32, mut n: u32) {
        if let Some((&start, &run)) = self.free.range(..first).next_back() {
            if start + run == first {
                self.free.remove(&start);
                first = start;
                n += run;
            }
        }
        if let Some(&run) = self.free.get(&(first + n)) {
            self.free.remove(&(first + n));
            n += run;
        }
        self.free.insert(first, n);
    }
}

#[cfg(test)]
mod tests;
