//! Admission per model by fleet memory (`[gateway.admission] mode = "fleet_memory"`).
//!
//! A request is admitted while its model's memory in flight plus its own need fits `factor` x
//! the model's KV capacity (or the front door's own requests' fits its `reserve` of it) and a
//! member is under its `max_inflight` (the kernel would not refuse the connect); otherwise it
//! waits in a queue of the front door, first come first served, at most `max_wait`, and is
//! then answered 503 with `Retry-After` (429 at once when `max_queued` requests of the model
//! already wait). A server that queues internally (vLLM,
//! SGLang) would hold the same request in its own queue, where it delays every request behind
//! it and is refused only by a client timeout; shed here, early, it costs nothing upstream.
//!
//! - **Capacity** (read every [`REFRESH`] from the pins): the sum of the memory-when-idle
//!   (`mem_capacity_mb`, the KV pool) of the members of the model's active table. A model
//!   with a member whose capacity is unknown, or without members, is not limited (the kernel
//!   refuses a model without members itself).
//! - **In flight**: the larger of the kernel's hinted memory in flight to those members
//!   (`AILB_INFLIGHT[INFLIGHT_MEM_BASE + id]`: both entry points, counted at connect and close)
//!   and the front door's own sum of the needs of the requests it admitted and has not finished
//!   (counted at admission, so a burst admitted together sees itself before its connects).
//! - **Reserve**: the socket ABI is not gated (a kernel hook cannot wait) and, offered more than
//!   the fleet holds, keeps the memory in flight above the limit by itself; the front door's
//!   requests would then wait for room that the ABI's next connect always takes first. So a
//!   request whose need fits in `reserve` x the limit minus what the front door's own admitted
//!   requests hold is admitted whatever the kernel counts: under contention the front door keeps
//!   that share, and above it competes for the rest as before.
//! - **Slots**: the kernel refuses a connect when every member is at its hard cap
//!   (`max_inflight`, the same for both entry points); a request admitted then would be
//!   answered 503 at once. So the gate also waits until a member is under its cap (read from
//!   the pins with the memory), and the head of the queue takes the first slot that frees.
//! - **Need**: the request's memory (`inputs.rs`: a hint header, the model's
//!   `required_memory_mb`, or the KV estimate); a request without one needs 0 MB (admitted
//!   unless the model is already over). A need larger than every member's capacity is admitted
//!   at once: no wait makes it fit, and the kernel refuses it (503) or a server does.
//!
//! If the pins cannot be read, requests are admitted (and it is logged): admission sheds load,
//! it never stops the front door from serving.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};
use prometheus_client::registry::Registry;
use tokio::sync::{Mutex, Notify};
use tokio::time::Instant;

use crate::config::gateway::FleetMemoryLimits;
use crate::datapath::model_load::ModelLoad;
use crate::datapath::DatapathError;
use crate::gateway::http::ApiError;
use crate::gateway::metrics::{AdmissionLabel, ModelLabel};

/// How often the capacities are read again.
pub const REFRESH: Duration = Duration::from_secs(1);
/// How often the head of a queue reads the memory in flight again (a front-door request that
/// finishes wakes it at once; a socket-ABI connection's close shows at the next read).
pub const POLL: Duration = Duration::from_millis(5);

/// A model's KV capacity, as the kernel's tables know it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// The members' ids (where their memory in flight is counted).
    pub ids: Vec<u32>,
    /// Their hard caps on connections in flight (`max_inflight`), in the order of `ids`; 0:
    /// none.
    pub caps: Vec<u32>,
    /// Sum of the members' memory when idle, MB.
    pub total_mb: u64,
    /// The largest member's, MB.
    pub largest_mb: u64,
}

/// Where capacities and memory in flight come from: the pinned maps ([`KernelFleet`]), or a
/// fixed view in tests.
pub trait Fleet: Send + Sync {
    /// The model's capacity now; `None`: not limited.
    fn capacity(&self, model: &str) -> Result<Option<Capacity>, DatapathError>;
    /// The hinted memory in flight (MB) to the members of `cap`.
    fn inflight_mb(&self, cap: &Capacity) -> Result<u64, DatapathError>;
    /// Whether a member of `cap` is under its hard cap (or has none): a connect now would not
    /// be refused for the caps.
    fn slot_free(&self, cap: &Capacity) -> Result<bool, DatapathError>;
}

/// One model's queue and accounting.
#[derive(Default)]
struct Gate {
    capacity: RwLock<Option<Capacity>>,
    /// MB of the requests this front door admitted and has not finished.
    admitted_mb: AtomicU64,
    /// Requests waiting (the queue's length).
    waiting: AtomicU64,
    /// Held by the head of the queue; tokio's mutex hands it over first come first served.
    turn: Mutex<()>,
    /// Woken when an admitted request finishes.
    freed: Notify,
}

/// The admission's counters, per model.
#[derive(Clone, Default)]
struct Metrics {
    decisions: Family<AdmissionLabel, Counter>,
    waiting: Family<ModelLabel, Gauge>,
}

impl Metrics {
    fn count(&self, model: &str, outcome: &'static str) {
        self.decisions.get_or_create(&AdmissionLabel { model: model.to_string(), outcome }).inc();
    }
}

pub struct FleetMemory {
    fleet: Box<dyn Fleet>,
    limits: FleetMemoryLimits,
    gates: BTreeMap<String, Arc<Gate>>,
    metrics: Metrics,
}

/// An admitted request's share of its model's memory: given back on drop.
pub struct Ticket {
    gate: Arc<Gate>,
    mb: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.admitted_mb.fetch_sub(self.mb, Ordering::AcqRel);
        self.gate.freed.notify_one();
    }
}

/// What one look at a model says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Fits,
    /// The memory in flight leaves no room (nor does the front door's reserve).
    Full {
        inflight_mb: u64,
        limit_mb: u64,
    },
    /// There is room, but every member is at its `max_inflight`.
    NoSlot,
}

impl FleetMemory {
    /// The admission for the catalog's `models`, its counters on `registry`.
    pub fn new<'a>(
        fleet: Box<dyn Fleet>,
        limits: FleetMemoryLimits,
        models: impl IntoIterator<Item = &'a str>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let metrics = Metrics::default();
        registry.register(
            "ailb_gateway_admission",
            "Admission decisions per model: admitted (at once), queued (waited, then admitted), \
             shed_wait (503 after gateway.admission.max_wait), shed_queue_full (429)",
            metrics.decisions.clone(),
        );
        registry.register(
            "ailb_gateway_admission_waiting",
            "Requests waiting in the front door's admission queue, per model",
            metrics.waiting.clone(),
        );
        let gates = models.into_iter().map(|m| (m.to_string(), Arc::default())).collect();
        let me = Arc::new(Self { fleet, limits, gates, metrics });
        me.refresh();
        me
    }

    /// Reads the capacities every [`REFRESH`] in a task of the current runtime.
    pub fn start(self: &Arc<Self>) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.refresh();
            }
        });
    }

    /// Reads every model's capacity again (a model whose read fails keeps its last one).
    pub fn refresh(&self) {
        for (name, gate) in &self.gates {
            match self.fleet.capacity(name) {
                Ok(c) => *gate.capacity.write().unwrap_or_else(|p| p.into_inner()) = c,
                Err(e) => tracing::warn!(model = %name, error = %crate::error_chain(&e), "gateway admission"),
            }
        }
    }

    fn look(&self, gate: &Gate, need_mb: u64) -> Look {
        let cap = gate.capacity.read().unwrap_or_else(|p| p.into_inner());
        let Some(cap) = cap.as_ref() else { return Look::Fits };
        if need_mb > cap.largest_mb {
            return Look::Fits;
        }
        let kernel = match self.fleet.inflight_mb(cap) {
            Ok(mb) => mb,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "gateway admission: admitting unread");
                return Look::Fits;
            }
        };
        let own_mb = gate.admitted_mb.load(Ordering::Acquire);
        let inflight_mb = kernel.max(own_mb);
        let limit_mb = (cap.total_mb as f64 * self.limits.factor) as u64;
        let reserved_mb = (limit_mb as f64 * self.limits.reserve) as u64;
        let room = inflight_mb == 0
            || inflight_mb.saturating_add(need_mb) <= limit_mb
            || (reserved_mb > 0 && own_mb.saturating_add(need_mb) <= reserved_mb);
        if !room {
            return Look::Full { inflight_mb, limit_mb };
        }
        match self.fleet.slot_free(cap) {
            Ok(false) => Look::NoSlot,
            Ok(true) => Look::Fits,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "gateway admission: admitting unread");
                Look::Fits
            }
        }
    }

    fn ticket(gate: &Arc<Gate>, need_mb: u64) -> Ticket {
        gate.admitted_mb.fetch_add(need_mb, Ordering::AcqRel);
        Ticket { gate: gate.clone(), mb: need_mb }
    }

    /// MB of `model`'s requests this front door admitted and has not finished.
    #[cfg(test)]
    pub(crate) fn admitted_mb(&self, model: &str) -> u64 {
        self.gates.get(model).map_or(0, |g| g.admitted_mb.load(Ordering::Acquire))
    }

    /// Admits a request of `model` that needs `need_mb`, at once or after waiting its turn;
    /// 503 with `Retry-After` past `max_wait`, 429 when the queue is full.
    pub async fn admit(&self, model: &str, need_mb: Option<u32>) -> Result<Option<Ticket>, ApiError> {
        let Some(gate) = self.gates.get(model) else { return Ok(None) };
        let need = u64::from(need_mb.unwrap_or(0));
        // Nobody waiting: a request that fits goes at once; with a queue, it queues behind it.
        if gate.waiting.load(Ordering::Acquire) == 0 && self.look(gate, need) == Look::Fits {
            self.metrics.count(model, "admitted");
            return Ok(Some(Self::ticket(gate, need)));
        }
        if gate.waiting.fetch_add(1, Ordering::AcqRel) >= u64::from(self.limits.max_queued) {
            gate.waiting.fetch_sub(1, Ordering::AcqRel);
            self.metrics.count(model, "shed_queue_full");
            return Err(ApiError::admission_queue_full(model, self.limits.max_queued, self.limits.retry_after));
        }
        let series = ModelLabel { model: model.to_string() };
        self.metrics.waiting.get_or_create(&series).inc();
        let deadline = Instant::now() + self.limits.max_wait;
        let waited = tokio::time::timeout_at(deadline, self.wait_turn(gate, need)).await;
        gate.waiting.fetch_sub(1, Ordering::AcqRel);
        self.metrics.waiting.get_or_create(&series).dec();
        match waited {
            Ok(ticket) => {
                self.metrics.count(model, "queued");
                Ok(Some(ticket))
            }
            Err(_) => {
                self.metrics.count(model, "shed_wait");
                let (max_wait, retry_after) = (self.limits.max_wait, self.limits.retry_after);
                Err(match self.look(gate, need) {
                    Look::Full { inflight_mb, limit_mb } => {
                        ApiError::model_overloaded(model, inflight_mb, limit_mb, max_wait, retry_after)
                    }
                    Look::NoSlot => ApiError::model_at_caps(model, max_wait, retry_after),
                    Look::Fits => ApiError::model_overloaded(model, 0, 0, max_wait, retry_after),
                })
            }
        }
    }

    /// The `Retry-After` of a refused request, seconds.
    pub fn retry_after(&self) -> u32 {
        self.limits.retry_after
    }

    /// A ticket for a request of `model` that needs `need_mb` when the model has room now
    /// (`Some(None)`: a model this admission does not gate), else `None`: the scheduler's
    /// queues (`super::sched`) wait in place of this admission's own.
    pub fn try_admit(&self, model: &str, need_mb: Option<u32>) -> Option<Option<Ticket>> {
        let Some(gate) = self.gates.get(model) else { return Some(None) };
        let need = u64::from(need_mb.unwrap_or(0));
        (self.look(gate, need) == Look::Fits).then(|| Some(Self::ticket(gate, need)))
    }

    /// Why `model` has no room for `need_mb` now, for the answer of a request that waited.
    pub fn why_full(&self, model: &str, need_mb: Option<u32>) -> String {
        let Some(gate) = self.gates.get(model) else { return "room now".into() };
        match self.look(gate, u64::from(need_mb.unwrap_or(0))) {
            Look::Full { inflight_mb, limit_mb } => format!(
                "{inflight_mb} MB of requests in flight against a limit of {limit_mb} MB (its backends' KV capacity \
                 x gateway.admission.factor)"
            ),
            Look::NoSlot => "every backend is at its max_inflight".into(),
            Look::Fits => "room only as the wait ran out".into(),
        }
    }

    /// Waits for the head of the queue, then for room.
    async fn wait_turn(&self, gate: &Arc<Gate>, need: u64) -> Ticket {
        let _turn = gate.turn.lock().await;
        loop {
            // Registered before the look, so a request that finishes after it still wakes us.
            let freed = gate.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.look(gate, need) == Look::Fits {
                return Self::ticket(gate, need);
            }
            tokio::select! {
                _ = freed => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

/// The kernel's view: the pins under `daemon.bpffs`, read-only.
pub struct KernelFleet(pub ModelLoad);

impl Fleet for KernelFleet {
    fn capacity(&self, model: &str) -> Result<Option<Capacity>, DatapathError> {
        let Some(index) = self.0.model_index(model)? else { return Ok(None) };
        let members = self.0.members(index)?;
        let known = |mb: u32| mb != 0 && mb != ailb_common::MEM_UNKNOWN;
        if members.is_empty() || members.iter().any(|(_, b)| !known(b.mem_capacity_mb)) {
            return Ok(None);
        }
        Ok(Some(Capacity {
            ids: members.iter().map(|(id, _)| *id).collect(),
            caps: members.iter().map(|(_, b)| b.cap).collect(),
            total_mb: members.iter().map(|(_, b)| u64::from(b.mem_capacity_mb)).sum(),
            largest_mb: members.iter().map(|(_, b)| u64::from(b.mem_capacity_mb)).max().unwrap_or(0),
        }))
    }

    fn inflight_mb(&self, cap: &Capacity) -> Result<u64, DatapathError> {
        cap.ids.iter().try_fold(0u64, |sum, &id| Ok(sum.saturating_add(self.0.inflight_mem(id)?)))
    }

    fn slot_free(&self, cap: &Capacity) -> Result<bool, DatapathError> {
        for (&id, &c) in cap.ids.iter().zip(&cap.caps) {
            if c == ailb_common::NO_CAP || self.0.backend_inflight(id)? < u64::from(c) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests;
