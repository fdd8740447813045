//! The soak's numbers from its records, samples and fault events: each failure classified,
//! conversations followed across the daemon's restarts, the in-flight check, the footprints'
//! growth.

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::{Event, Fault};
use super::load::{Entry, Rec};
use super::sample::Sample;

/// The time after a GPU server's death within which a request may still meet it: the agent
/// probes its server's health every publish (200 ms) and writes to Nacos with a 500 ms
/// timeout, the daemon polls Nacos every 100 ms and applies the table at once; 2 s bounds
/// their sum (800 ms) with margin for the two shared cores.
pub const DETECT_S: f64 = 2.0;
/// The window on each side of a daemon kill in which a conversation's turns are compared.
pub const TURN_WINDOW_S: f64 = 30.0;

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Class {
    /// A healthy backend could have served it.
    Avoidable,
    /// It met a server already dead: it was in flight on, or sent within [`DETECT_S`] of,
    /// the kill of a GPU server, or its answer names the killed server while it was down.
    DeadServer,
}

/// The class of a failed request `r` given the fault events.
pub fn classify(r: &Rec, events: &[Event]) -> Class {
    for e in events.iter().filter(|e| e.fault == Fault::SimKill) {
        let overlaps = r.sent_s <= e.start_s + DETECT_S && r.end_s >= e.start_s;
        let down = e.recovered_s.unwrap_or(e.end_s);
        let named = r.backend.is_some() && r.backend == e.backend && r.sent_s >= e.start_s && r.sent_s <= down;
        if overlaps || named {
            return Class::DeadServer;
        }
    }
    Class::Avoidable
}

/// Conversations with turns on both sides of a time, and how many kept their backend.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Continuity {
    pub conversations: usize,
    pub kept: usize,
}

impl Continuity {
    pub fn percent(&self) -> Option<f64> {
        (self.conversations > 0).then(|| self.kept as f64 * 100.0 / self.conversations as f64)
    }
}

/// For every conversation of `entry` whose turns answered (with a backend named) in both
/// `(cut - w, cut]` and `(cut, cut + w]`: whether the first turn after `cut` went to the
/// backend of the last turn before it.
pub fn continuity(recs: &[Rec], entry: Entry, cut: f64, w: f64) -> Continuity {
    let mut before: BTreeMap<&str, (f64, &str)> = BTreeMap::new();
    let mut after: BTreeMap<&str, (f64, &str)> = BTreeMap::new();
    for r in recs.iter().filter(|r| r.entry == entry && r.ok) {
        let Some(b) = r.backend.as_deref() else { continue };
        let c = r.conversation.as_str();
        if r.sent_s > cut - w && r.sent_s <= cut {
            let e = before.entry(c).or_insert((r.sent_s, b));
            if r.sent_s >= e.0 {
                *e = (r.sent_s, b);
            }
        } else if r.sent_s > cut && r.sent_s <= cut + w {
            let e = after.entry(c).or_insert((r.sent_s, b));
            if r.sent_s <= e.0 {
                *e = (r.sent_s, b);
            }
        }
    }
    let mut out = Continuity::default();
    for (c, (_, b)) in &before {
        if let Some((_, a)) = after.get(c) {
            out.conversations += 1;
            out.kept += usize::from(a == b);
        }
    }
    out
}

/// How the active tables moved without a fault of the daemon: the samples' table changes
/// outside `(cut - 1, cut + window]` per minute, and whether the tables the first sample after
/// `cut + window` shows were among those sampled in the `window` seconds before `cut`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableMoves {
    pub changes: usize,
    pub minutes: f64,
    pub after_seen_before: Option<bool>,
}

pub fn table_moves(samples: &[Sample], cut: f64, window: f64) -> TableMoves {
    let mut m = TableMoves::default();
    let inside = |t: f64| t > cut - 1.0 && t <= cut + window;
    let with: Vec<(f64, &str)> = samples.iter().filter_map(|s| Some((s.t_s, s.tables.as_deref()?))).collect();
    for w in with.windows(2) {
        if !inside(w[1].0) && !inside(w[0].0) && w[0].1 != w[1].1 {
            m.changes += 1;
        }
    }
    let outside = with.iter().filter(|(t, _)| !inside(*t)).count();
    m.minutes = outside as f64 * super::sample::PERIOD.as_secs_f64() / 60.0;
    let before: Vec<&str> = with.iter().filter(|(t, _)| *t > cut - window && *t <= cut).map(|(_, d)| *d).collect();
    m.after_seen_before = with.iter().find(|(t, _)| *t > cut + window).map(|(_, d)| before.contains(d));
    m
}

/// The in-flight check over the samples taken while `during` holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct InflightCheck {
    pub samples: usize,
    /// Samples whose last listing's count lies between the counter reads around it.
    pub consistent: usize,
    /// Samples where both reads equal the count: the counters agreed with the connections.
    pub equal: usize,
    /// Samples that took more than one listing.
    pub retried: usize,
    /// The most listings one sample took.
    pub max_tries: u32,
    /// Listings over all samples.
    pub tries: u64,
    /// Of the samples that never agreed, the largest distance from the count to the nearer read.
    pub max_gap: u64,
}

pub fn inflight_check<'a>(samples: impl Iterator<Item = &'a Sample>) -> InflightCheck {
    let mut c = InflightCheck::default();
    for s in samples {
        let (Some(a), Some(b)) = (s.inflight_before, s.inflight_after) else { continue };
        c.samples += 1;
        c.consistent += usize::from(s.consistent() == Some(true));
        c.equal += usize::from(s.equal() == Some(true));
        c.retried += usize::from(s.tries > 1);
        c.max_tries = c.max_tries.max(s.tries);
        c.tries += u64::from(s.tries);
        let gap = if s.equal() == Some(true) { 0 } else { s.open.abs_diff(a).max(s.open.abs_diff(b)) };
        c.max_gap = c.max_gap.max(gap);
    }
    c
}

/// One process's footprint after warm-up.
#[derive(Debug, Clone, Serialize)]
pub struct Growth {
    pub role: String,
    pub samples: usize,
    pub rss_start_kb: u64,
    pub rss_end_kb: u64,
    pub rss_max_kb: u64,
    pub fds_start: u64,
    pub fds_end: u64,
    pub fds_max: u64,
    /// The fewest open fds in the first and the last tenth: what the process holds with the
    /// fewest connections of the moment, which a leak raises.
    pub fds_floor_start: u64,
    pub fds_floor_end: u64,
}

impl Growth {
    /// The end's change from the start, percent.
    pub fn rss_pct(&self) -> f64 {
        pct(self.rss_start_kb, self.rss_end_kb)
    }
    pub fn fds_pct(&self) -> f64 {
        pct(self.fds_start, self.fds_end)
    }
    /// The change of the fds' floor, percent.
    pub fn fds_floor_pct(&self) -> f64 {
        pct(self.fds_floor_start, self.fds_floor_end)
    }
    /// Whether neither the RSS (medians of the first and last tenth) nor the fds' floor (the
    /// fewest of the first and last tenth) grew by more than `limit` percent. The open fds
    /// follow the connections of the moment (each request in flight holds one or two), so
    /// their median and peak say how busy the samples were; what the process holds besides is
    /// the floor, and a leak of memory, fds or sockets makes the end higher than the start. A
    /// fall (back towards the idle baseline after a busy start) is shown, not counted as a
    /// failure: it is no growth.
    pub fn flat(&self, limit: f64) -> bool {
        self.rss_pct() <= limit && self.fds_floor_pct() <= limit
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if a == 0 {
        0.0
    } else {
        (b as f64 - a as f64) * 100.0 / a as f64
    }
}

/// Per role, its footprint from `warm_s` on, over the longest run of samples in which it
/// kept its pid (a process restarted by a fault starts afresh): the median of the first and
/// last tenth of those samples, and the peak.
pub fn growth(samples: &[Sample], warm_s: f64) -> Vec<Growth> {
    // role -> runs of (rss, fds), a new run whenever the role's sample goes missing
    let mut runs: BTreeMap<String, Vec<Vec<(u64, u64)>>> = BTreeMap::new();
    let roles: Vec<String> = {
        let mut r: Vec<String> = samples.iter().flat_map(|s| s.procs.iter().map(|p| p.role.clone())).collect();
        r.sort();
        r.dedup();
        r
    };
    for s in samples.iter().filter(|s| s.t_s >= warm_s) {
        for role in &roles {
            let v = runs.entry(role.clone()).or_default();
            match s.procs.iter().find(|p| &p.role == role) {
                Some(p) => match v.last_mut() {
                    Some(run) if !run.is_empty() => run.push((p.rss_kb, p.fds)),
                    _ => v.push(vec![(p.rss_kb, p.fds)]),
                },
                None => v.push(Vec::new()),
            }
        }
    }
    runs.into_iter()
        .filter_map(|(role, v)| {
            let run = v.into_iter().max_by_key(Vec::len).filter(|r| !r.is_empty())?;
            let tenth = (run.len() / 10).max(1);
            let med = |xs: &[(u64, u64)], f: fn(&(u64, u64)) -> u64| {
                let mut v: Vec<u64> = xs.iter().map(f).collect();
                v.sort_unstable();
                v[v.len() / 2]
            };
            let (head, tail) = (&run[..tenth], &run[run.len() - tenth..]);
            Some(Growth {
                role,
                samples: run.len(),
                rss_start_kb: med(head, |p| p.0),
                rss_end_kb: med(tail, |p| p.0),
                rss_max_kb: run.iter().map(|p| p.0).max().unwrap_or(0),
                fds_start: med(head, |p| p.1),
                fds_end: med(tail, |p| p.1),
                fds_max: run.iter().map(|p| p.1).max().unwrap_or(0),
                fds_floor_start: head.iter().map(|p| p.1).min().unwrap_or(0),
                fds_floor_end: tail.iter().map(|p| p.1).min().unwrap_or(0),
            })
        })
        .collect()
}

/// A percentile of `v` (nearest rank), `None` when empty.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    ailb_sim::replay::percentile(v, p)
}

#[cfg(test)]
mod tests;
