//! The scheduler's queues, pure: requests wait per tenant within priority bands; the highest
//! non-empty band is served first; inside a band the tenants share by weight.
//!
//! **Weighted least attained service on tokens** (start-time fair queueing): each tenant of a
//! band has a virtual time, the tokens it was served divided by its weight; the next request
//! is the head of the waiting tenant with the least (ties: the older request). A tenant that
//! starts waiting again is brought up to the band's virtual time (that of the last request
//! served), so time spent idle is no credit. Chosen over deficit round robin because costs
//! here span orders of magnitude (a 20-token question and a 30,000-token document): DRR with a
//! quantum below the largest cost loops through empty rounds, and with one above it serves a
//! tenant in bursts of a quantum; virtual time is exact per request and costs a scan of the
//! band's tenants (a configured handful) per pop.
//!
//! **A lag** ([`Queues::with_lag`], `gateway.scheduler.fair_lag_tokens`, default 0): the next
//! request is the oldest head among the tenants at most that lag ahead of the least virtual
//! time, so requests go in arrival order until a tenant has run that far ahead of its share.
//! Without one, a tenant offering more than its weighted share waits behind the others' newer
//! requests in every burst, even when the fleet keeps up on average (measured at 0.9 of a
//! fleet's rate, weights 3:1 offered 2:1: the lighter tenant's TTFT P95 about twice first come,
//! first served's). Backlogged tenants still share by weight: a lead stays bounded by the lag,
//! so it shifts the shares once, by at most the lag's tokens.
//!
//! **Bounds**: at most `max_len` requests in all and `max_per_tenant` per tenant. A request that
//! finds its bound reached evicts the newest request of the lowest band below its own (its
//! tenant's own, for the tenant bound); when there is none it is refused. So the lowest band is
//! shed first, and a request is never refused for room while one of a lower band waits.

use std::collections::VecDeque;

/// Fixed-point scale of virtual time (tokens x SCALE / weight).
const SCALE: u128 = 1 << 16;

/// A waiting request.
#[derive(Debug)]
pub struct Entry<T> {
    /// Unique within the queues, in order of arrival.
    pub id: u64,
    pub cost: u64,
    pub value: T,
}

/// Where an entry waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub tenant: usize,
    pub band: u8,
    pub id: u64,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_len` wait, none of them in a lower band.
    Queue,
    /// `max_per_tenant` of its tenant wait, none of them in a lower band.
    Tenant,
}

#[derive(Debug)]
struct Flow<T> {
    items: VecDeque<Entry<T>>,
    /// Virtual time of the tenant: where its next request starts.
    vtime: u128,
}

#[derive(Debug)]
struct Band<T> {
    flows: Vec<Flow<T>>,
    /// The start of the last request served.
    clock: u128,
    len: usize,
}

/// The queues of one model.
#[derive(Debug)]
pub struct Queues<T> {
    bands: Vec<Band<T>>,
    weights: Vec<u32>,
    /// How far ahead of the least virtual time a tenant is still served in arrival order.
    lag: u128,
    per_tenant: Vec<usize>,
    len: usize,
    max_len: usize,
    max_per_tenant: usize,
    next_id: u64,
}

impl<T> Queues<T> {
    /// `levels` bands for tenants of `weights` (each at least 1).
    pub fn new(levels: u8, weights: Vec<u32>, max_len: usize, max_per_tenant: usize) -> Self {
        let bands = (0..levels)
            .map(|_| Band {
                flows: weights.iter().map(|_| Flow { items: VecDeque::new(), vtime: 0 }).collect(),
                clock: 0,
                len: 0,
            })
            .collect();
        Self { bands, per_tenant: vec![0; weights.len()], weights, lag: 0, max_len, max_per_tenant, len: 0, next_id: 0 }
    }

    /// The same queues serving in arrival order among the tenants at most `tokens` (served per
    /// unit of weight) ahead of the least served waiting one.
    pub fn with_lag(mut self, tokens: u64) -> Self {
        self.lag = u128::from(tokens) * SCALE;
        self
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Requests waiting in bands below `band`.
    pub fn waiting_below(&self, band: u8) -> usize {
        self.bands[..usize::from(band)].iter().map(|b| b.len).sum()
    }

    /// Queues a request of `tenant` in `band`; its place and the request it evicted, if any,
    /// or why it was refused (with the value back).
    #[expect(clippy::type_complexity, reason = "the place, the evicted entry, or the refusal and the value back")]
    pub fn push(
        &mut self,
        tenant: usize,
        band: u8,
        cost: u64,
        value: T,
    ) -> Result<(Place, Option<(Place, Entry<T>)>), (Full, T)> {
        let mut evicted = None;
        if self.per_tenant[tenant] >= self.max_per_tenant {
            match self.evict(band, Some(tenant)) {
                Some(e) => evicted = Some(e),
                None => return Err((Full::Tenant, value)),
            }
        } else if self.len >= self.max_len {
            match self.evict(band, None) {
                Some(e) => evicted = Some(e),
                None => return Err((Full::Queue, value)),
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let b = &mut self.bands[usize::from(band)];
        let flow = &mut b.flows[tenant];
        if flow.items.is_empty() {
            flow.vtime = flow.vtime.max(b.clock);
        }
        flow.items.push_back(Entry { id, cost, value });
        b.len += 1;
        self.len += 1;
        self.per_tenant[tenant] += 1;
        Ok((Place { tenant, band, id }, evicted))
    }

    /// Takes out the newest request of the lowest band below `band` (of `tenant` only, when
    /// given).
    fn evict(&mut self, band: u8, tenant: Option<usize>) -> Option<(Place, Entry<T>)> {
        for low in 0..band {
            let b = &self.bands[usize::from(low)];
            let newest = b
                .flows
                .iter()
                .enumerate()
                .filter(|(t, _)| tenant.is_none_or(|only| only == *t))
                .filter_map(|(t, f)| f.items.back().map(|e| (e.id, t)))
                .max();
            if let Some((id, t)) = newest {
                let entry = self.bands[usize::from(low)].flows[t].items.pop_back().expect("a tail was found");
                self.taken(t, low);
                return Some((Place { tenant: t, band: low, id }, entry));
            }
        }
        None
    }

    fn taken(&mut self, tenant: usize, band: u8) {
        self.bands[usize::from(band)].len -= 1;
        self.len -= 1;
        self.per_tenant[tenant] -= 1;
    }

    /// The tenant whose head is next in the highest non-empty band.
    fn next(&self) -> Option<(u8, usize)> {
        let (band, b) = self.bands.iter().enumerate().rev().find(|(_, b)| b.len > 0)?;
        let heads = || b.flows.iter().enumerate().filter_map(|(t, f)| f.items.front().map(|e| (f.vtime, e.id, t)));
        let least = heads().map(|(v, _, _)| v).min()?;
        // Of the tenants within the lag of the least (without one: those at the least), the
        // oldest head.
        let tenant = heads().filter(|&(v, _, _)| v <= least + self.lag).min_by_key(|&(_, id, _)| id)?.2;
        Some((band as u8, tenant))
    }

    /// The next request to serve, without taking it.
    pub fn peek(&self) -> Option<(Place, &Entry<T>)> {
        let (band, tenant) = self.next()?;
        let e = self.bands[usize::from(band)].flows[tenant].items.front()?;
        Some((Place { tenant, band, id: e.id }, e))
    }

    /// Takes the next request to serve, and charges its tenant its cost.
    pub fn pop(&mut self) -> Option<(Place, Entry<T>)> {
        let (band, tenant) = self.next()?;
        let weight = u128::from(self.weights[tenant].max(1));
        let b = &mut self.bands[usize::from(band)];
        let flow = &mut b.flows[tenant];
        let e = flow.items.pop_front()?;
        b.clock = flow.vtime;
        flow.vtime += u128::from(e.cost.max(1)) * SCALE / weight;
        self.taken(tenant, band);
        Some((Place { tenant, band, id: e.id }, e))
    }

    /// Takes out the request at `place` (one that gave up waiting), if it still waits.
    pub fn remove(&mut self, place: Place) -> Option<Entry<T>> {
        let items = &mut self.bands[usize::from(place.band)].flows[place.tenant].items;
        let i = items.iter().position(|e| e.id == place.id)?;
        let e = items.remove(i)?;
        self.taken(place.tenant, place.band);
        Some(e)
    }
}

#[cfg(test)]
mod tests;
