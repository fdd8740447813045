//! What a daemon restart does to the conversations the kernel keeps on a backend: the pinned
//! affinity map read just before the kill and again after the restarted daemon's first apply.
//!
//! The table alone cannot answer it: the live telemetry rewrites the tables many times a minute
//! with no fault at all, so a table after the restart that differs from the one before says
//! nothing about the restart. What a restart could break is the kernel's own state: the affinity
//! entries (a daemon that recreated the map instead of reusing the pin would lose them all) and
//! the backend ids they name (a daemon that renumbered its backends would send them elsewhere).
//! An entry the traffic did not touch meanwhile (the same `last_seen_ns`) must come back with the
//! same backend id, and that id must name the same address before and after. Entries the traffic
//! touched during the restart were re-picked or refreshed by the kernel (the load bound, a
//! backend that left): counted, as context.

use std::{collections::BTreeMap, path::Path};

use ailb_common::{maps, AffinityKey, AffinityValue};
use aya::maps::{HashMap, Map, MapData};
use serde::Serialize;

/// An affinity entry's key (model, key space, conversation or client) and value (backend id,
/// last use in ns).
pub type Entries = BTreeMap<(u32, u32, u64), (u32, u64)>;

/// Reads every entry of the pinned `AILB_AFFINITY` (`None`: not pinned or not readable).
pub fn read(bpffs: &Path) -> Option<Entries> {
    let md = MapData::from_pin(bpffs.join(maps::AFFINITY)).ok()?;
    let map: HashMap<MapData, AffinityKey, AffinityValue> = Map::from_map_data(md).ok()?.try_into().ok()?;
    map.iter().map(|r| r.ok().map(|(k, v)| ((k.model, k.space, k.conversation), (v.backend, v.last_seen_ns)))).collect()
}

/// The comparison of the entries before the kill and after the restarted daemon's first apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// Entries before the kill.
    pub before: usize,
    /// Of those, not used meanwhile and still there with the same backend, whose id names the
    /// same address before and after.
    pub untouched_kept: usize,
    /// Not used meanwhile, yet another backend id, or an id that names another address now, or
    /// gone from the map: what the restart itself broke.
    pub untouched_lost: usize,
    /// Used meanwhile (`last_seen_ns` moved): the kernel refreshed or re-picked them.
    pub touched_same: usize,
    pub touched_moved: usize,
}

impl Kept {
    /// Every entry the traffic left alone came back as it was, and there were some.
    pub fn met(&self) -> bool {
        self.untouched_lost == 0 && self.untouched_kept > 0
    }
}

/// Backend id -> address, as `ailb status` lists them (ids are global, not per model).
pub type Addresses = BTreeMap<u32, String>;

/// Compares `before` and `after`; `addr_before` / `addr_after` name each backend id's address.
pub fn compare(before: &Entries, after: &Entries, addr_before: &Addresses, addr_after: &Addresses) -> Kept {
    let mut k = Kept { before: before.len(), ..Kept::default() };
    for (key, &(backend, seen)) in before {
        let now = after.get(key);
        match now {
            Some(&(b, s)) if s == seen => {
                let same_addr = addr_before.get(&backend).is_some_and(|a| addr_after.get(&b) == Some(a));
                if b == backend && same_addr {
                    k.untouched_kept += 1;
                } else {
                    k.untouched_lost += 1;
                }
            }
            Some(&(b, _)) if b == backend => k.touched_same += 1,
            Some(_) => k.touched_moved += 1,
            // An LRU map may evict an entry under pressure, but not in the seconds of a restart at
            // the soak's load (a few thousand entries of 262,144): gone counts as lost.
            None => k.untouched_lost += 1,
        }
    }
    k
}

#[cfg(test)]
mod tests;
