//! `[limits]`: the sizes of the kernel's table and member arenas (`AILB_TABLES`,
//! `AILB_MEMBERS`), fixed when the maps are created. Each model's table takes what its member
//! count needs (`maglev::table_size_for`), so the arenas are sized for the fleet, not per
//! model; validation checks that the catalog fits.

use serde::Deserialize;

use ailb_common::{
    maglev::table_size_for, DEFAULT_MEMBER_SLOTS, DEFAULT_PREFIX_ENTRIES, DEFAULT_TABLE_SLOTS, MAX_MEMBER_SLOTS,
    MAX_PREFIX_ENTRIES, MAX_TABLE_SLOTS, MEMBER_CHUNK, TABLE_CHUNK,
};

use crate::{datapath::ArenaLimits, validate::ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Table slots in the kernel's table arena (4 bytes each), a multiple of 1,024. Default
    /// 6,291,456 (24 MiB): 1,024 models of up to 40 backends and room to swap in a table of
    /// 16,384 backends. A new size takes effect after `ailb teardown`.
    #[serde(default = "default_table_slots")]
    pub table_slots: u32,
    /// Backend ids in the kernel's member arena (4 bytes each), a multiple of 16. Default
    /// 65,536 (256 KiB).
    #[serde(default = "default_member_slots")]
    pub member_slots: u32,
    /// Entries of the kernel's prefix map (prompt blocks of all models together; the least
    /// recently used is evicted when full), 1,024 to 16,777,216. Default 262,144 (about 36 MiB
    /// of kernel memory: `docs/prefix.md`).
    #[serde(default = "default_prefix_entries")]
    pub prefix_entries: u32,
}

fn default_table_slots() -> u32 {
    DEFAULT_TABLE_SLOTS
}
fn default_member_slots() -> u32 {
    DEFAULT_MEMBER_SLOTS
}
fn default_prefix_entries() -> u32 {
    DEFAULT_PREFIX_ENTRIES
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            table_slots: DEFAULT_TABLE_SLOTS,
            member_slots: DEFAULT_MEMBER_SLOTS,
            prefix_entries: DEFAULT_PREFIX_ENTRIES,
        }
    }
}

/// One arena's field: a multiple of `chunk`, at most `max`, and at least `need(members)`
/// summed over the models plus the largest once more (a swap writes the new table beside the
/// old one).
fn check_arena(
    field: &str,
    value: u32,
    chunk: u32,
    max: u32,
    members: &[usize],
    need: impl Fn(usize) -> u64,
) -> Result<(), ConfigError> {
    if value == 0 || !value.is_multiple_of(chunk) || value > max {
        return Err(ConfigError::invalid(field, value, format!("a multiple of {chunk} from {chunk} to {max}")));
    }
    let round = |n: u64| n.div_ceil(u64::from(chunk)) * u64::from(chunk);
    let each: Vec<u64> = members.iter().map(|&n| round(need(n))).collect();
    let live: u64 = each.iter().sum();
    let largest = each.iter().copied().max().unwrap_or(0);
    if live + largest > u64::from(value) {
        return Err(ConfigError::invalid(
            field,
            value,
            format!(
                "too small for the catalog: its {} models need {live} and a swap of the largest {largest} more \
                 (at least {})",
                members.len(),
                live + largest
            ),
        ));
    }
    Ok(())
}

impl LimitsConfig {
    /// Checks the fields and that the catalog fits: `members` holds each model's member count
    /// as far as the config knows it (its static backends; at least 1).
    pub fn validate(&self, members: &[usize]) -> Result<ArenaLimits, ConfigError> {
        let members: Vec<usize> = members.iter().map(|&n| n.max(1)).collect();
        check_arena("limits.table_slots", self.table_slots, TABLE_CHUNK, MAX_TABLE_SLOTS, &members, |n| {
            u64::from(table_size_for(n))
        })?;
        check_arena("limits.member_slots", self.member_slots, MEMBER_CHUNK, MAX_MEMBER_SLOTS, &members, |n| n as u64)?;
        if !(1024..=MAX_PREFIX_ENTRIES).contains(&self.prefix_entries) {
            return Err(ConfigError::invalid(
                "limits.prefix_entries",
                self.prefix_entries,
                format!("from 1024 to {MAX_PREFIX_ENTRIES}"),
            ));
        }
        Ok(ArenaLimits {
            table_slots: self.table_slots,
            member_slots: self.member_slots,
            prefix_entries: self.prefix_entries,
        })
    }
}

#[cfg(test)]
mod tests;
