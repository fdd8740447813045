//! Steps 3 and 4 of the pick: the least-loaded member that fits now, else the one where a
//! request that fits only once idle should finish first.

use super::{sat_mul, ClientFamily, PickMaps};
use crate::abi::*;

/// State of the least-loaded member scan (step 3 of the pick).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberScan {
    /// The least loaded member that fits and is under its cap so far, or [`NO_BACKEND`].
    pub best: u32,
    /// Some member is live (with weight > 0), whether or not it fits.
    pub any_live: bool,
    pub best_load: u64,
    pub best_weight: u64,
    /// Of the members under their cap that do not fit now but fit when idle, the one where
    /// the request should finish first: the smallest `later_work / later_rate`.
    ///
    /// Why that ratio: memory frees at a rate proportional to the backend's capacity `C` times
    /// its speed, for which its weight `w` stands; with `m` MB of hints in flight, a request
    /// of `r` MB starts after about `(m + r - C) / (C w)` and then runs for about `1 / w`, so
    /// it finishes after about `(m + r) / (C w)`. The connection count, which the earlier rule
    /// compared, says nothing about how much memory the queue ahead of it holds.
    pub later: u32,
    /// `m + r`, MB.
    pub later_work: u64,
    /// `C x w`; a capacity of [`MEM_UNKNOWN`] counts as `r` (the backend is assumed to fit
    /// the request, and nothing more).
    pub later_rate: u64,
    /// The client's family: members it cannot reach are skipped. Kept here rather than in
    /// the eBPF scan's context, whose size counts against the TC program's 512-byte stack
    /// (this byte fits in the struct's padding).
    pub family: ClientFamily,
}

impl Default for MemberScan {
    fn default() -> Self {
        Self::new()
    }
}

impl MemberScan {
    /// A scan for an IPv4 client.
    #[inline(always)]
    pub const fn new() -> Self {
        Self::for_family(ClientFamily::Ipv4)
    }

    #[inline(always)]
    pub const fn for_family(family: ClientFamily) -> Self {
        Self {
            best: NO_BACKEND,
            any_live: false,
            best_load: 0,
            best_weight: 1,
            later: NO_BACKEND,
            later_work: 0,
            later_rate: 1,
            family,
        }
    }

    /// Considers member `j` of the list at arena position `offset` (in-flight / weight,
    /// compared by cross-multiplication).
    #[inline(always)]
    pub fn step<M: PickMaps>(&mut self, maps: &M, offset: u32, j: u32, required_mem_mb: u32) {
        let Some(id) = maps.member(offset.wrapping_add(j)) else {
            return;
        };
        let Some(b) = maps.backend(id) else {
            return;
        };
        // A backend the client cannot reach is no member for it (not even a live one).
        if !b.is_live() || b.weight == 0 || !self.family.reaches(&b) {
            return;
        }
        self.any_live = true;
        let inflight = maps.inflight(id);
        if !b.under_cap(inflight) {
            return;
        }
        let w = b.weight as u64;
        if required_mem_mb == 0 {
            self.consider_now(id, inflight, w);
            return;
        }
        // The memory counter is read only for a hinted connect.
        let inflight_mem = maps.inflight_mem(id);
        if b.fits_now(required_mem_mb, inflight_mem) {
            self.consider_now(id, inflight, w);
        } else if b.fits_when_idle(required_mem_mb) {
            let capacity = if b.mem_capacity_mb == MEM_UNKNOWN { required_mem_mb } else { b.mem_capacity_mb };
            let work = inflight_mem.saturating_add(required_mem_mb as u64);
            let rate = sat_mul(capacity as u64, w);
            if self.later == NO_BACKEND || sat_mul(work, self.later_rate) < sat_mul(self.later_work, rate) {
                self.later = id;
                self.later_work = work;
                self.later_rate = rate;
            }
        }
    }

    #[inline(always)]
    fn consider_now(&mut self, id: u32, inflight: u64, w: u64) {
        if self.best == NO_BACKEND || sat_mul(inflight, self.best_weight) < sat_mul(self.best_load, w) {
            self.best = id;
            self.best_load = inflight;
            self.best_weight = w;
        }
    }
}
