//! Deterministic weighted Maglev-style tables (Eisenbud et al., NSDI'16), with less disruption.
//!
//! Backends are ordered by their stable key (then id). Each has Maglev's permutation of the
//! table, `offset = key mod M`, `skip = 1 + rehash(key) mod (M - 1)`. Unlike Maglev, where a
//! backend takes its next *free* slot each turn, here every backend inspects its permutation
//! one rank at a time (paced by weight) and takes the slot only if it is still free and the
//! backend is under its capacity (its weight share plus a small slack). This is the greedy
//! stable matching of slots and backends by rank, which keeps a removed backend's disruption
//! close to the minimum: measured for 1000 equal backends at M = 65521, removing one moves
//! 6.9/N of the slots with plain Maglev and about 1.8/N here (see `docs/ARCHITECTURE.md`).
//! Only integer arithmetic is used, so the same inputs give byte-identical tables everywhere.

use crate::abi::{MAX_MEMBERS, NO_BACKEND, TABLE_SIZES};
use crate::hash::rehash;
use std::{cmp::Reverse, collections::BinaryHeap};

/// No owner yet (while building).
const NONE: u16 = u16::MAX;
/// Weights within this ratio are filled by visiting every backend each round; wider ones by
/// a calendar of looks and claims for the last slots (measured crossover: 1..7 is faster
/// visited, 33..1000 by calendar).
const DENSE_RATIO: u64 = 8;
/// Most rounds in one turn of the calendar of looks in [`Fill::rounds`].
const MAX_TURN: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevBackend {
    /// The backend id stored in the table.
    pub id: u32,
    /// Stable identity (e.g. [`crate::hash::backend_key`]) that orders and places the backend.
    pub key: u64,
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaglevError {
    /// The table size must be a prime of at least 2 (a composite one breaks the permutations).
    SizeNotPrime(u32),
    /// Two backends share a key or an id.
    Duplicate {
        id: u32,
        key: u64,
    },
    TooManyBackends {
        count: usize,
        max: usize,
    },
}

impl core::fmt::Display for MaglevError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::SizeNotPrime(m) => write!(f, "maglev table size {m} is not a prime >= 2"),
            Self::Duplicate { id, key } => write!(f, "maglev backend id {id} / key {key:#x} appears twice"),
            Self::TooManyBackends { count, max } => write!(f, "maglev: {count} backends, at most {max} per table"),
        }
    }
}

impl std::error::Error for MaglevError {}

/// `base ^ exp mod m` (m < 2^32); with `exp = m - 2` and m prime, the inverse of `base`.
fn pow_mod(mut base: u64, mut exp: u64, m: u64) -> u64 {
    let mut acc = 1 % m;
    base %= m;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc * base % m;
        }
        base = base * base % m;
        exp >>= 1;
    }
    acc
}

fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u32;
    while (d as u64) * (d as u64) <= n as u64 {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// The smallest size in [`TABLE_SIZES`] with at least 100 slots per backend when one up to
/// 65,521 has them (up to 655 backends); for more backends, the smallest with at least 64
/// slots per backend (65,521 up to 1,023 backends, as before larger sizes existed; 1,048,583
/// for 16,384), else the largest. 64 slots keep each share within 4 slots (6 %) of exact
/// (the fill's slack is `clamp(M / N / 16, 1, 8)`), and the table's memory at 256 bytes per
/// backend.
pub fn table_size_for(backends: usize) -> u32 {
    const DENSE_LIMIT: u32 = 65521;
    for m in TABLE_SIZES.iter().copied().filter(|&m| m <= DENSE_LIMIT) {
        if m as usize >= backends.saturating_mul(100) {
            return m;
        }
    }
    for m in TABLE_SIZES {
        if m as usize >= backends.saturating_mul(64) {
            return m;
        }
    }
    TABLE_SIZES[TABLE_SIZES.len() - 1]
}

/// Checks the inputs of a table of `size` entries and returns the backends with a positive
/// weight in key order (the order the fill visits them in).
fn key_order(backends: &[MaglevBackend], size: u32) -> Result<Vec<MaglevBackend>, MaglevError> {
    if !is_prime(size) {
        return Err(MaglevError::SizeNotPrime(size));
    }
    if backends.len() > MAX_MEMBERS as usize {
        return Err(MaglevError::TooManyBackends { count: backends.len(), max: MAX_MEMBERS as usize });
    }
    let mut order: Vec<MaglevBackend> = backends.iter().copied().filter(|b| b.weight > 0).collect();
    order.sort_by_key(|b| (b.key, b.id));
    for pair in order.windows(2) {
        if pair[0].key == pair[1].key {
            return Err(MaglevError::Duplicate { id: pair[1].id, key: pair[1].key });
        }
    }
    let mut ids: Vec<u32> = order.iter().map(|b| b.id).collect();
    ids.sort_unstable();
    for pair in ids.windows(2) {
        if pair[0] == pair[1] {
            return Err(MaglevError::Duplicate { id: pair[0], key: 0 });
        }
    }
    Ok(order)
}

/// Builds a table of `size` entries. Backends with weight 0 get no slot. With no positive
/// weight the table is all [`NO_BACKEND`].
pub fn build(backends: &[MaglevBackend], size: u32) -> Result<Vec<u32>, MaglevError> {
    let order = key_order(backends, size)?;
    let m = size as u64;
    let mut table = vec![NO_BACKEND; size as usize];
    if order.is_empty() {
        return Ok(table);
    }
    let (floors, caps) = capacities(&order, m);
    let offset: Vec<u64> = order.iter().map(|b| b.key % m).collect();
    let skip: Vec<u64> = order.iter().map(|b| 1 + rehash(b.key) % (m - 1).max(1)).collect();
    let mut fill = Fill {
        m,
        owner: vec![NONE; size as usize],
        next: vec![0; order.len()],
        // The slot at rank `next[i]` of backend i's permutation, advanced by `skip`.
        pos: offset.clone(),
        skip: &skip,
        got: vec![0; order.len()],
        caps: &caps,
        filled: 0,
        active: vec![true; order.len()],
        live: order.len() as u64,
    };
    let pace = Pace::new(&order);
    fill.rounds(&pace);
    fill.claims(&pace, &offset);
    let Fill { mut owner, mut got, .. } = fill;
    // Repair: the slack lets some backends end above their exact share, so a slow (light)
    // backend can end more than `slack` below it. Each backend below its floor takes back, in
    // its own preference order, slots of backends that are above theirs. Since the floors
    // add up to at most m, this ends with every backend at or above its floor.
    for i in 0..order.len() {
        let mut rank = 0u64;
        let mut c = offset[i];
        while got[i] < floors[i] && rank < m {
            let o = owner[c as usize] as usize;
            if o != i && got[o] > floors[o] {
                owner[c as usize] = i as u16;
                got[o] -= 1;
                got[i] += 1;
            }
            rank += 1;
            c += skip[i];
            if c >= m {
                c -= m;
            }
        }
    }
    for (t, &o) in table.iter_mut().zip(&owner) {
        // Every slot has an owner (the capacities cover the table); never panic regardless.
        *t = order.get(o as usize).map_or(NO_BACKEND, |b| b.id);
    }
    Ok(table)
}

/// The backends' weights in key order and what the rounds derive from them.
struct Pace {
    weights: Vec<u64>,
    w_max: u64,
    w_min: u64,
    /// `(w_max / w, w_max % w)` per backend: `k * w_max = (k * q) * w + k * r`.
    step: Vec<(u64, u64)>,
}

impl Pace {
    fn new(order: &[MaglevBackend]) -> Self {
        let weights: Vec<u64> = order.iter().map(|b| b.weight as u64).collect();
        let w_max = weights.iter().copied().max().unwrap_or(1);
        let w_min = weights.iter().copied().min().unwrap_or(1);
        let step = weights.iter().map(|&w| (w_max / w, w_max % w)).collect();
        Self { weights, w_max, w_min, step }
    }
}

/// The state of [`build`]'s fill: which backend owns each slot, and how far each has looked.
///
/// Rank-synchronous rounds: in round r (0, 1, ..) every backend with weight w looks at its next
/// preferred slot if its credit `(r + 1) * w` crosses another multiple of `w_max` (so its k-th
/// look falls in round `ceil(k * w_max / w) - 1`, at most one look per round), the backends of
/// one round in key order, and takes the slot if it is still free. A backend that is full (or
/// has walked its whole permutation) never looks again. A backend walks its permutation at
/// most once, and the capacities add up to at least m, so this ends with every slot filled.
/// [`Fill::rounds`] plays the rounds until few slots are free, then [`Fill::claims`] settles the
/// rest; both give exactly the table that playing every round would (a test compares them with
/// that plain loop).
struct Fill<'a> {
    m: u64,
    owner: Vec<u16>,
    next: Vec<u64>,
    pos: Vec<u64>,
    skip: &'a [u64],
    got: Vec<u64>,
    caps: &'a [u64],
    filled: u64,
    active: Vec<bool>,
    live: u64,
}

impl Fill<'_> {
    /// Backend `i` looks at its next slot and takes it if free. False once it never looks again.
    #[inline(always)]
    fn look(&mut self, i: usize) -> bool {
        let c = self.pos[i] as usize;
        self.next[i] += 1;
        self.pos[i] += self.skip[i];
        if self.pos[i] >= self.m {
            self.pos[i] -= self.m;
        }
        if self.owner[c] == NONE {
            self.owner[c] = i as u16;
            self.got[i] += 1;
            self.filled += 1;
        }
        if self.got[i] < self.caps[i] && self.next[i] < self.m {
            return true;
        }
        self.active[i] = false;
        self.live -= 1;
        false
    }

    /// Whether the rounds should stop and claims give out the free slots: looks mostly find
    /// taken slots at the end (a coupon collector's tail), and settling a claim costs about one
    /// rank computation per live backend, so this compares `free * live * 4` with the
    /// `m * ln(free)`-ish looks that the rounds would still take (4 measured best against 2, 8
    /// and 16, for 10, 90 weighted and 1000 backends).
    fn tail(&self) -> bool {
        let free = self.m - self.filled;
        free == 0 || free * self.live * 4 <= self.m * free.ilog2() as u64
    }

    fn rounds(&mut self, pace: &Pace) {
        let Pace { weights, w_max, w_min, step } = pace;
        let (n, w_max, w_min) = (weights.len(), *w_max, *w_min);
        if w_max <= DENSE_RATIO * w_min {
            // Narrow weights: every backend looks at least every few rounds, so visit all of
            // them each round (the cheapest loop per look), to the end: the tail's looks are
            // cheaper than claims here.
            self.filled = fill_dense(
                DenseInput { m: self.m, weights, w_max, caps: self.caps, skip: self.skip },
                &mut self.owner,
                &mut self.got,
                &mut self.next,
                &mut self.pos,
                self.filled,
            );
            return;
        }
        // Wide weights: rounds in which a backend does not look cost it nothing. A calendar (a
        // timing wheel of `turn` rounds, each a bitset over backends, so that a round's
        // backends come out in key order) holds every backend under the round of its next
        // look: one step per look plus a few words per round, not one step per backend per
        // round (90 backends with weights 33..1000 at M = 16381: 160 k looks against 1.4 M
        // backend-rounds).
        let words = n.div_ceil(64);
        let turn = (w_max.div_ceil(w_min) + 1).next_power_of_two().clamp(64, MAX_TURN) as usize;
        let mut wheel = vec![0u64; turn * words];
        // `k * w_max = whole[i] * w + part[i]` for the k-th look: its round is
        // `ceil(k * w_max / w) - 1`, advanced per look without a division.
        let mut whole: Vec<u64> = step.iter().map(|s| s.0).collect();
        let mut part: Vec<u64> = step.iter().map(|s| s.1).collect();
        let look_round = |whole: u64, part: u64| whole + (part > 0) as u64 - 1;
        let mut due_at: Vec<u64> = (0..n).map(|i| look_round(whole[i], part[i])).collect();
        for (i, &r) in due_at.iter().enumerate() {
            wheel[(r as usize & (turn - 1)) * words + i / 64] |= 1 << (i % 64);
        }
        let mut round = 0u64;
        let mut idle = 0usize;
        while !self.tail() {
            let bucket = (round as usize & (turn - 1)) * words;
            let mut looked = false;
            for wi in 0..words {
                let mut bits = wheel[bucket + wi];
                while bits != 0 {
                    let i = wi * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if due_at[i] != round {
                        continue; // a later turn (weights more than `MAX_TURN` apart)
                    }
                    looked = true;
                    wheel[bucket + wi] &= !(1 << (i % 64));
                    let again = self.look(i);
                    if self.filled == self.m {
                        return;
                    }
                    if again {
                        whole[i] += step[i].0;
                        part[i] += step[i].1;
                        if part[i] >= weights[i] {
                            part[i] -= weights[i];
                            whole[i] += 1;
                        }
                        due_at[i] = look_round(whole[i], part[i]);
                        wheel[(due_at[i] as usize & (turn - 1)) * words + i / 64] |= 1 << (i % 64);
                    }
                }
            }
            round += 1;
            idle = if looked { 0 } else { idle + 1 };
            if idle >= turn {
                // A whole turn without a look: jump to the next one.
                match (0..n).filter(|&i| self.active[i]).map(|i| due_at[i]).min() {
                    Some(r) => round = r,
                    None => return, // unreachable: the capacities cover m
                }
                idle = 0;
            }
        }
    }

    /// Gives each free slot to the backend whose look reaches it first, computed from the
    /// slot's rank in every live backend's permutation (every free slot lies ahead of where
    /// each live backend has looked: a free slot it had looked at, it would have taken).
    /// Claims are settled in (round, key order), as the rounds would; the claim of a backend
    /// that filled up meanwhile is recomputed among the others.
    fn claims(&mut self, pace: &Pace, offset: &[u64]) {
        let Pace { weights, step, .. } = pace;
        let (m, n) = (self.m, weights.len());
        if self.filled == m {
            return;
        }
        let inverse: Vec<u64> = self.skip.iter().map(|&s| pow_mod(s, m - 2, m)).collect();
        let small = m <= 1 << 16;
        let claim = |c: u64, active: &[bool]| {
            (0..n)
                .filter(|&i| active[i])
                .map(|i| {
                    let d = if c >= offset[i] { c - offset[i] } else { c + m - offset[i] };
                    // Table sizes are below 2^16, so the product fits 32 bits (and a 32-bit
                    // division is the cheap one).
                    let rank =
                        if small { (d as u32 * inverse[i] as u32 % m as u32) as u64 } else { d * inverse[i] % m };
                    // ceil(k * w_max / w) - 1 for k = rank + 1, without overflow.
                    let (k, (q, r)) = (rank + 1, step[i]);
                    (q * k + (r * k).div_ceil(weights[i]) - 1, i)
                })
                .min()
        };
        let mut claims = BinaryHeap::with_capacity((m - self.filled) as usize);
        for c in 0..m {
            if self.owner[c as usize] == NONE {
                if let Some((r, i)) = claim(c, &self.active) {
                    claims.push(Reverse((r, i, c)));
                }
            }
        }
        while let Some(Reverse((_, i, c))) = claims.pop() {
            if !self.active[i] {
                if let Some((r, j)) = claim(c, &self.active) {
                    claims.push(Reverse((r, j, c)));
                }
                continue;
            }
            self.owner[c as usize] = i as u16;
            self.got[i] += 1;
            self.filled += 1;
            if self.got[i] >= self.caps[i] {
                self.active[i] = false;
                self.live -= 1;
            }
        }
        debug_assert_eq!(self.filled, m, "the capacities cover the table");
    }
}

struct DenseInput<'a> {
    m: u64,
    weights: &'a [u64],
    w_max: u64,
    caps: &'a [u64],
    skip: &'a [u64],
}

/// Most entries in the dense fill's schedule of one period of rounds ([`schedule`]); a longer
/// period is filled by visiting every backend each round instead.
const MAX_SCHEDULE: u64 = 1 << 16;

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The backends that look, in order, over one period of the rounds: backend `i` looks in
/// round `r` when its credit `(r + 1) * w` crosses another multiple of `w_max`, which repeats
/// every `w_max / g` rounds (`g` the weights' greatest common divisor), `w / g` looks a period.
/// `None` when a period has more than [`MAX_SCHEDULE`] looks.
fn schedule(weights: &[u64], w_max: u64) -> Option<Vec<u32>> {
    let g = weights.iter().fold(w_max, |g, &w| gcd(g, w)).max(1);
    let len: u64 = weights.iter().map(|w| w / g).sum();
    if len > MAX_SCHEDULE {
        return None;
    }
    let mut out = Vec::with_capacity(len as usize);
    let mut credit = vec![0u64; weights.len()];
    for _ in 0..w_max / g {
        for (i, (c, &w)) in credit.iter_mut().zip(weights).enumerate() {
            *c += w;
            if *c >= w_max {
                *c -= w_max;
                out.push(i as u32);
            }
        }
    }
    Some(out)
}

/// One backend's state in the scheduled dense fill, packed (the loop's working set).
#[derive(Clone, Copy)]
struct Lane {
    /// The slot at its next rank.
    pos: u32,
    skip: u32,
    /// Slots it may still take (capacity minus slots taken).
    left: u32,
}

/// [`Fill::rounds`] for narrow weights, on its own (so that it keeps its loop state in
/// registers): returns the new `filled`, `m`. Plays the rounds from a [`schedule`] of one
/// period when it is short (no visit of a backend that does not look this round), else visits
/// every backend each round; the same looks in the same order either way.
///
/// The scheduled fill does not count a backend's ranks: a backend that has looked at all `m`
/// ranks of its permutation has seen every slot and taken each one it found free, so the
/// table is full by then. For the same reason it does not keep `next` and `pos` up to date:
/// the table is full when it returns (the capacities cover it), and nothing reads them then.
#[inline(never)]
fn fill_dense(
    input: DenseInput,
    owner: &mut [u16],
    got: &mut [u64],
    next: &mut [u64],
    pos: &mut [u64],
    filled: u64,
) -> u64 {
    let Some(mut order) = schedule(input.weights, input.w_max) else {
        return fill_dense_visiting(input, owner, got, next, pos, filled);
    };
    let DenseInput { m, caps, skip, .. } = input;
    let mut lanes: Vec<Lane> = (0..caps.len())
        .map(|i| Lane { pos: pos[i] as u32, skip: skip[i] as u32, left: caps[i].saturating_sub(got[i]) as u32 })
        .collect();
    let m32 = m as u32;
    let owner = &mut owner[..m as usize];
    // Slots taken are counted once a period, from what the backends may still take (one
    // counter less in the loop, which is short of registers).
    let left_at_start: u64 = lanes.iter().map(|b| u64::from(b.left)).sum();
    let filled_now = |lanes: &[Lane]| filled + left_at_start - lanes.iter().map(|b| u64::from(b.left)).sum::<u64>();
    while filled_now(&lanes) < m && !order.is_empty() {
        let mut idle = 0;
        for &i in &order {
            let Some(b) = lanes.get_mut(i as usize) else { continue };
            if b.left == 0 {
                idle += 1;
                continue;
            }
            let c = b.pos as usize;
            let p = b.pos + b.skip;
            b.pos = if p >= m32 { p - m32 } else { p };
            // Without a branch, as in `fill_dense_visiting`.
            let Some(slot) = owner.get_mut(c) else { continue };
            let free = *slot == NONE;
            *slot = if free { i as u16 } else { *slot };
            b.left -= free as u32;
        }
        // Backends that never look again leave the schedule once they are half of it (a
        // full backend is skipped either way).
        if idle * 2 > order.len() {
            order.retain(|&i| lanes[i as usize].left > 0);
        }
    }
    for (i, b) in lanes.iter().enumerate() {
        got[i] = caps[i] - u64::from(b.left);
    }
    filled_now(&lanes)
}

/// The dense fill visiting every backend each round (for weights whose period of rounds is
/// too long to schedule).
fn fill_dense_visiting(
    input: DenseInput,
    owner: &mut [u16],
    got: &mut [u64],
    next: &mut [u64],
    pos: &mut [u64],
    mut filled: u64,
) -> u64 {
    let DenseInput { m, weights, w_max, caps, skip } = input;
    let n = weights.len();
    let (got, next, pos, caps, skip) = (&mut got[..n], &mut next[..n], &mut pos[..n], &caps[..n], &skip[..n]);
    let mut credit = vec![0u64; n];
    while filled < m {
        for i in 0..n {
            credit[i] += weights[i];
            if credit[i] < w_max {
                continue;
            }
            credit[i] -= w_max;
            if got[i] >= caps[i] || next[i] >= m {
                continue;
            }
            let c = pos[i] as usize;
            next[i] += 1;
            pos[i] += skip[i];
            if pos[i] >= m {
                pos[i] -= m;
            }
            // Without a branch: while the table fills, whether the slot is free is a coin
            // toss that the branch predictor loses (measured: the scale bench's 1,000 tables
            // of 16 backends build in about 2/3 of the time this way; same bytes).
            let o = owner[c];
            let free = o == NONE;
            owner[c] = if free { i as u16 } else { o };
            got[i] += free as u64;
            filled += free as u64;
        }
    }
    filled
}

/// Slot capacity of each backend: its exact share `ceil(m * w / W)` plus a slack of about
/// 1/16 of a fair share, 1 to 8 slots. Without slack, a
/// removal frees slots that the backends preferring them cannot take (they are full), which
/// starts chains of moves; the slack absorbs most of them (1000 equal backends at
/// M = 65521: 4.5/N of the slots move without slack, under 2/N with it), while no backend
/// can exceed its exact share by more than 8 slots (0.2 percentage points at M = 4093);
/// the repair pass in [`build`] keeps every backend at most `slack` slots below it.
/// Returns `(floors, capacities)`: every backend ends with a slot count within `slack` of
/// its exact share `m * w / W` (floors `floor(..) - slack`, capacities `ceil(..) + slack`).
fn capacities(order: &[MaglevBackend], m: u64) -> (Vec<u64>, Vec<u64>) {
    let total: u64 = order.iter().map(|b| b.weight as u64).sum();
    let n = order.len() as u64;
    let slack = (m / n / 16).clamp(1, 8);
    let floors = order.iter().map(|b| (m * b.weight as u64 / total).saturating_sub(slack)).collect();
    let caps = order.iter().map(|b| (m * b.weight as u64).div_ceil(total) + slack).collect();
    (floors, caps)
}

#[cfg(test)]
mod tests;
