//! `AILB_PREFIX_FILTER` from userspace: the Bloom filter over the prefix map's keys that the
//! kernel's search probes before the map ([`ailb_common::FilterLine`] has the layout and the
//! reason). The daemon maps it into its memory and works on it with atomic operations, as the
//! kernel does: it sets the bits of each block an engine reports stored, in both generations,
//! and rebuilds the generation the search does not read from the map's keys, then makes it
//! the one read ([`PrefixFilter::rebuild`]).

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ailb_common::{maps, FilterLine, FilterProbe, FILTER_KEY_BITS, FILTER_LINE_WORDS};
use aya::maps::MapData;

use super::{io_err, map_err, sys::SharedWords, DatapathError};

const LINE_BYTES: usize = FILTER_LINE_WORDS * 8;

/// The pinned `AILB_PREFIX_FILTER`, mapped.
pub struct PrefixFilter {
    words: SharedWords,
}

impl std::fmt::Debug for PrefixFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (lines, current) = self.header();
        f.debug_struct("PrefixFilter").field("lines", &lines).field("current", &current).finish()
    }
}

impl PrefixFilter {
    /// Maps the filter pinned in `dir`.
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        let path = dir.join(maps::PREFIX_FILTER);
        let md = MapData::from_pin(&path).map_err(map_err(maps::PREFIX_FILTER))?;
        let info = md.info().map_err(map_err(maps::PREFIX_FILTER))?;
        if info.value_size() as usize != LINE_BYTES || info.max_entries() == 0 {
            return Err(DatapathError::State {
                path,
                reason: format!(
                    "{} has {} entries of {} bytes; this ailb uses entries of {LINE_BYTES}",
                    maps::PREFIX_FILTER,
                    info.max_entries(),
                    info.value_size()
                ),
            });
        }
        let bytes = info.max_entries() as usize * LINE_BYTES;
        let words = SharedWords::map(md.fd().as_fd(), bytes).map_err(io_err("map the prefix filter", &path))?;
        Ok(Self { words })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        self.words.word(i)
    }

    /// Whether generations of `lines` lines fit in the mapping.
    fn fits(&self, lines: u64) -> bool {
        (1 + 2 * lines).saturating_mul(FILTER_LINE_WORDS as u64) <= self.words.len() as u64
    }

    /// Lines per generation (0: off, or a header that does not fit the map) and the
    /// generation the search reads.
    pub fn header(&self) -> (u32, u32) {
        let lines = self.word(0).load(Ordering::Acquire);
        let current = self.word(1).load(Ordering::Acquire) as u32 & 1;
        if lines == 0 || !self.fits(lines) {
            return (0, current);
        }
        (lines as u32, current)
    }

    /// The words of generation `generation` of `lines` lines.
    fn generation(lines: u32, generation: u32) -> std::ops::Range<usize> {
        let first = 1 + generation as usize * lines as usize;
        first * FILTER_LINE_WORDS..(first + lines as usize) * FILTER_LINE_WORDS
    }

    /// Turns the filter on with `lines` lines per generation, on a fresh map (both
    /// generations empty, as is the prefix map); a filter already on keeps its header.
    pub fn init(&self, lines: u32) -> Result<(), DatapathError> {
        if !self.fits(lines.into()) {
            return Err(DatapathError::State {
                path: maps::PREFIX_FILTER.into(),
                reason: format!("{lines} lines per generation do not fit in {} words", self.words.len()),
            });
        }
        let header = FilterLine::header(lines, 0);
        if self.word(0).load(Ordering::Acquire) == 0 {
            self.word(1).store(header.words[1], Ordering::Release);
            self.word(0).store(header.words[0], Ordering::Release);
        }
        Ok(())
    }

    fn line_word(&self, entry: u32, word: u8) -> &AtomicU64 {
        self.word(entry as usize * FILTER_LINE_WORDS + (word as usize & (FILTER_LINE_WORDS - 1)))
    }

    fn set(&self, p: &FilterProbe, lines: u32, generation: u32) {
        let entry = p.entry(lines, generation);
        for j in 0..FILTER_KEY_BITS {
            let w = self.line_word(entry, p.word[j]);
            if w.load(Ordering::Relaxed) & p.mask[j] == 0 {
                w.fetch_or(p.mask[j], Ordering::Relaxed);
            }
        }
    }

    /// Sets block `key` of `model`'s bits in both generations (before the block's entry is
    /// written, so that a search that finds it in the filter finds it in the map).
    pub fn add(&self, model: u32, key: u64) {
        let (lines, _) = self.header();
        if lines == 0 {
            return;
        }
        let p = FilterProbe::new(model, key, lines);
        self.set(&p, lines, 0);
        self.set(&p, lines, 1);
    }

    /// Rebuilds the generation not read from `keys` (every `(model, key)` the prefix map
    /// holds), then makes it the one read; returns the keys added. The generation is cleared
    /// before the keys are read, and every writer sets a new key's bits in both generations,
    /// so a key stored meanwhile is not lost, but for one race: a key whose bits were set just
    /// before its line was cleared and whose entry was written just after the scan passed it
    /// (a window of one learning callback) tests negative until the next rebuild, and a search
    /// then finds a shorter prefix. One rebuild at a time (the daemon's).
    pub fn rebuild(&self, keys: impl IntoIterator<Item = (u32, u64)>) -> usize {
        let (lines, current) = self.header();
        if lines == 0 {
            return 0;
        }
        let next = 1 - current;
        for i in Self::generation(lines, next) {
            self.word(i).store(0, Ordering::Relaxed);
        }
        let mut n = 0;
        for (model, key) in keys {
            self.set(&FilterProbe::new(model, key, lines), lines, next);
            n += 1;
        }
        self.word(1).store(next as u64, Ordering::Release);
        n
    }

    /// The share of the read generation's bits that are set: with 3 bits per key, about the
    /// cube of it is the share of absent keys that test positive.
    pub fn fill(&self) -> f64 {
        let (lines, current) = self.header();
        if lines == 0 {
            return 0.0;
        }
        let set: u64 = Self::generation(lines, current)
            .map(|i| u64::from(self.word(i).load(Ordering::Relaxed).count_ones()))
            .sum();
        set as f64 / (lines as f64 * (FILTER_LINE_WORDS * 64) as f64)
    }
}
