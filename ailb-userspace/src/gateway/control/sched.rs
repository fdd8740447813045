//! The scheduler in front of the kernel's pick (`[gateway.scheduler]` with an admission on):
//! when a model is saturated, as its admission reads it (capacity or fleet memory), requests
//! wait in per-tenant queues within priority bands ([`queue`]) instead of the admission's own
//! first-come-first-served queue, and are let through in the scheduler's order as room frees.
//!
//! - **Fast path**: nobody of the model waits and the admission has room: admitted at once, with
//!   one atomic load and the admission's own look (no lock, no allocation, nothing awaited).
//! - **Saturated**: the request takes its place in the queues (a short lock, never held across
//!   an await), evicting the newest request of a lower band when a bound is reached, or is
//!   refused with 429 and `Retry-After`. One task per saturated model (started when its first
//!   request waits, ended when none does) lets the next request through whenever the admission
//!   has room: woken when an admitted request of the model finishes, and every [`POLL`] for
//!   room freed elsewhere (the socket ABI's closes). A request waits at most
//!   `gateway.scheduler.max_wait` (and its own deadline), then gets 503 naming why there was no
//!   room.
//! - **Own count**: every admitted request holds a [`Slot`] of its model until its answer is
//!   whole, so the in-flight mode counts requests let through but not yet connected (the
//!   kernel counts them only at their connect).

pub mod queue;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::StatusCode;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::fleet_memory::Ticket;
use super::Control;
use crate::gateway::http::{ApiError, Deadline};
use crate::gateway::metrics::{outcome, TenantMetrics};
use crate::gateway::tenants::{Tenancy, TenantSlot, Who};
use queue::{Full, Place, Queues};

/// How often a saturated model's task looks for room freed outside the front door.
pub const POLL: Duration = Duration::from_millis(5);

/// What an admitted request holds until its answer is whole; dropped in field order: the
/// admission's memory first, then the model's slot (which wakes the model's waiters), then the
/// tenant's place.
#[derive(Default)]
pub struct Grant {
    pub ticket: Option<Ticket>,
    _slot: Option<Slot>,
    _tenant: Option<TenantSlot>,
}

impl Grant {
    /// A grant of the admission alone (no scheduler).
    pub fn of(ticket: Option<Ticket>) -> Self {
        Self { ticket, _slot: None, _tenant: None }
    }

    /// The same grant, holding the request's place among its tenant's requests in flight.
    pub fn with_tenant(mut self, tenant: TenantSlot) -> Self {
        self._tenant = Some(tenant);
        self
    }
}

/// A request admitted for a model: counted in the model's own count until dropped.
struct Slot(Arc<ModelQueue>);

impl Slot {
    fn new(q: &Arc<ModelQueue>) -> Self {
        q.own.fetch_add(1, Ordering::AcqRel);
        Self(q.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.own.fetch_sub(1, Ordering::AcqRel);
        if self.0.waiting.load(Ordering::Acquire) > 0 {
            self.0.wake.notify_one();
        }
    }
}

/// A request waiting for room.
struct Waiter {
    tx: oneshot::Sender<Grant>,
    need_mb: Option<u32>,
}

/// One model's queues.
struct ModelQueue {
    model: String,
    queues: Mutex<Queues<Waiter>>,
    /// Requests waiting (read without the lock by the fast path).
    waiting: AtomicUsize,
    /// Requests of the model admitted and not finished.
    own: AtomicU64,
    /// Whether the model's task runs.
    pumping: AtomicBool,
    wake: Notify,
}

/// How a request got through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// At once.
    No,
    /// After waiting this long in the queues.
    For(Duration),
}

pub struct Scheduler {
    control: Control,
    tenancy: Arc<Tenancy>,
    metrics: Arc<TenantMetrics>,
    models: BTreeMap<String, Arc<ModelQueue>>,
    retry_after: u32,
}

impl Scheduler {
    /// The scheduler of the catalog's `models` in front of `control`.
    pub fn new<'a>(
        control: Control,
        tenancy: Arc<Tenancy>,
        metrics: Arc<TenantMetrics>,
        models: impl IntoIterator<Item = &'a str>,
    ) -> Arc<Self> {
        let cfg = tenancy.config();
        let weights: Vec<u32> = cfg.tenants.iter().map(|t| t.weight).collect();
        let models = models
            .into_iter()
            .map(|m| {
                let q = ModelQueue {
                    model: m.to_string(),
                    queues: Mutex::new(
                        Queues::new(
                            cfg.levels,
                            weights.clone(),
                            cfg.max_queued as usize,
                            cfg.max_queued_per_tenant as usize,
                        )
                        .with_lag(cfg.fair_lag_tokens),
                    ),
                    waiting: AtomicUsize::new(0),
                    own: AtomicU64::new(0),
                    pumping: AtomicBool::new(false),
                    wake: Notify::new(),
                };
                (m.to_string(), Arc::new(q))
            })
            .collect();
        let retry_after = control.retry_after();
        Arc::new(Self { control, tenancy, metrics, models, retry_after })
    }

    /// The `Retry-After` of a request shed here.
    pub fn retry_after(&self) -> u32 {
        self.retry_after
    }

    /// Admits a request of `model` that needs `need_mb`, from `who`: at once when nobody waits
    /// and the model has room, else in the scheduler's order as room frees.
    pub async fn admit(
        self: &Arc<Self>,
        model: &str,
        need_mb: Option<u32>,
        who: Who,
        deadline: Deadline,
    ) -> Result<(Grant, Waited), ApiError> {
        let Some(q) = self.models.get(model) else {
            return Ok((Grant::of(self.control.try_admit(model, need_mb, 0).flatten()), Waited::No));
        };
        let series = self.metrics.of(who.tenant, who.priority);
        if q.waiting.load(Ordering::Acquire) == 0 {
            if let Some(ticket) = self.control.try_admit(model, need_mb, q.own.load(Ordering::Acquire)) {
                series.outcomes[outcome::ADMITTED].inc();
                series.tokens.inc_by(who.cost);
                return Ok((Grant { ticket, _slot: Some(Slot::new(q)), _tenant: None }, Waited::No));
            }
        }
        let (tx, rx) = oneshot::channel();
        let place = match self.enqueue(q, who, Waiter { tx, need_mb }) {
            Ok(place) => place,
            Err(full) => {
                series.outcomes[outcome::SHED_QUEUE_FULL].inc();
                return Err(self.queue_full(model, who, full));
            }
        };
        series.waiting.inc();
        self.start_pump(q);
        let since = Instant::now();
        let mut waiting = Waiting { q, place, series: &series.waiting, done: false };
        let (until, _) = deadline.within(since, self.tenancy.config().max_wait);
        let mut rx = rx;
        let got = match tokio::time::timeout_at(until, &mut rx).await {
            Ok(Ok(grant)) => Some(grant),
            // Its sender dropped unsent: evicted by a request of a higher band.
            Ok(Err(_)) => None,
            // The wait ran out: out of the queue now, unless it was let through (or evicted)
            // meanwhile.
            Err(_) if waiting.leave() => {
                waiting.done = true;
                let waited = since.elapsed();
                series.wait_seconds.observe(waited.as_secs_f64());
                series.outcomes[outcome::SHED_WAIT].inc();
                if q.queues.lock().unwrap_or_else(|p| p.into_inner()).waiting_below(who.priority) > 0 {
                    self.metrics.inversions.inc();
                }
                let why = self.control.why_full(model, need_mb, q.own.load(Ordering::Acquire));
                return Err(self.waited_out(model, who, waited, &why));
            }
            Err(_) => rx.try_recv().ok(),
        };
        waiting.done = true;
        let waited = since.elapsed();
        series.wait_seconds.observe(waited.as_secs_f64());
        match got {
            Some(grant) => {
                series.outcomes[outcome::QUEUED].inc();
                series.tokens.inc_by(who.cost);
                Ok((grant, Waited::For(waited)))
            }
            None => {
                series.outcomes[outcome::SHED_EVICTED].inc();
                Err(self.evicted(model, who, waited))
            }
        }
    }

    /// Puts a request in its tenant's queue in its band: its place, or why the queues are full
    /// (counted as an inversion when a lower band had requests waiting). A request of a lower
    /// band that this one evicts is told by its sender's drop.
    fn enqueue(&self, q: &ModelQueue, who: Who, waiter: Waiter) -> Result<Place, Full> {
        let mut queues = q.queues.lock().unwrap_or_else(|p| p.into_inner());
        let lower = queues.waiting_below(who.priority);
        match queues.push(who.tenant, who.priority, who.cost, waiter) {
            Ok((place, evicted)) => {
                q.waiting.fetch_add(1, Ordering::AcqRel);
                if let Some((p, _)) = evicted {
                    q.waiting.fetch_sub(1, Ordering::AcqRel);
                    self.metrics.of(p.tenant, p.band).waiting.dec();
                }
                Ok(place)
            }
            Err((full, _)) => {
                if lower > 0 && full == Full::Queue {
                    self.metrics.inversions.inc();
                }
                Err(full)
            }
        }
    }

    /// Starts the model's task unless it runs.
    fn start_pump(self: &Arc<Self>, q: &Arc<ModelQueue>) {
        if q.pumping.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        let q = q.clone();
        tokio::spawn(async move {
            loop {
                me.pump(&q);
                if q.waiting.load(Ordering::Acquire) == 0 {
                    q.pumping.store(false, Ordering::Release);
                    // A request that queued after the look and saw the task running.
                    if q.waiting.load(Ordering::Acquire) == 0 || q.pumping.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
                tokio::select! {
                    _ = q.wake.notified() => {}
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        });
    }

    /// Lets waiting requests through, in the queues' order, while the admission has room.
    fn pump(&self, q: &Arc<ModelQueue>) {
        let mut queues = q.queues.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((_, head)) = queues.peek() {
            let need = head.value.need_mb;
            let Some(ticket) = self.control.try_admit(&q.model, need, q.own.load(Ordering::Acquire)) else {
                break;
            };
            let (place, entry) = queues.pop().expect("peeked");
            q.waiting.fetch_sub(1, Ordering::AcqRel);
            self.metrics.of(place.tenant, place.band).waiting.dec();
            let grant = Grant { ticket, _slot: Some(Slot::new(q)), _tenant: None };
            // A request that gave up meanwhile gives its grant (and the room) straight back.
            drop(entry.value.tx.send(grant));
        }
    }

    fn queue_full(&self, model: &str, who: Who, full: Full) -> ApiError {
        let cfg = self.tenancy.config();
        let tenant = &self.tenancy.tenant(who.tenant).name;
        let (code, message) = match full {
            Full::Queue => (
                "scheduler_queue_full",
                format!(
                    "the model `{model}` is saturated and {} requests wait for it already, none at a priority \
                     below {} (gateway.scheduler.max_queued)",
                    cfg.max_queued, who.priority
                ),
            ),
            Full::Tenant => (
                "tenant_queue_full",
                format!(
                    "the model `{model}` is saturated and {} requests of tenant `{tenant}` wait for it already \
                     (gateway.scheduler.max_queued_per_tenant)",
                    cfg.max_queued_per_tenant
                ),
            ),
        };
        self.shed(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", code, message)
    }

    fn evicted(&self, model: &str, who: Who, waited: Duration) -> ApiError {
        self.shed(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "shed_for_priority",
            format!(
                "the model `{model}` is saturated: this request (tenant `{}`, priority {}) waited {waited:?} and \
                 gave its place to a request of a higher priority",
                self.tenancy.tenant(who.tenant).name,
                who.priority
            ),
        )
    }

    fn waited_out(&self, model: &str, who: Who, waited: Duration, why: &str) -> ApiError {
        self.shed(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_overloaded",
            format!(
                "the model `{model}` is saturated ({why}): this request (tenant `{}`, priority {}) waited \
                 {waited:?} without room (gateway.scheduler.max_wait {:?}, or the request's deadline)",
                self.tenancy.tenant(who.tenant).name,
                who.priority,
                self.tenancy.config().max_wait
            ),
        )
    }

    fn shed(&self, status: StatusCode, kind: &'static str, code: &'static str, message: String) -> ApiError {
        let mut e = ApiError::new(status, kind, code, message);
        e.retry_after = Some(self.retry_after);
        e
    }
}

/// A request's place in the queues while it waits: taken out if the request goes away (its
/// client left, its wait ran out) before it was let through.
struct Waiting<'a> {
    q: &'a Arc<ModelQueue>,
    place: Place,
    series: &'a prometheus_client::metrics::gauge::Gauge,
    done: bool,
}

impl Waiting<'_> {
    /// Takes the place out of the queues; `true` when it was still there.
    fn leave(&mut self) -> bool {
        let removed = self.q.queues.lock().unwrap_or_else(|p| p.into_inner()).remove(self.place).is_some();
        if removed {
            self.q.waiting.fetch_sub(1, Ordering::AcqRel);
            self.series.dec();
        }
        removed
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.leave();
        }
    }
}

#[cfg(test)]
mod tests;
