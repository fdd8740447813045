//! The daemon loop: discovery -> policy -> datapath, plus reloads, metrics and fail-static.
//!
//! A failed discovery read changes nothing in the kernel (the last good tables keep routing);
//! the staleness gauge grows and a warning is logged. An answer equal to the last one is not
//! planned again, so a recovered registry that returns the same fleet causes no table flap.
//! After an outage, a *changed* fleet is applied only once two consecutive reads agree
//! ([`Settle`]): a registry that has just restarted can serve a stale or partial list for a
//! moment (rnacos replaying its log, Java Nacos before its clients have re-registered).

pub mod http;
pub mod metrics;
pub mod prefix;

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::{
    config::{self, ValidConfig},
    datapath::Writer,
    discovery::{Snapshot, SnapshotSource},
    policy::{self, PlanView, PolicyState},
};
use metrics::{BackendLabel, InvalidLabel, Metrics, ModelLabel, ModelLoad, ReasonLabel};

pub struct Daemon {
    pub writer: Writer,
    pub cfg: ValidConfig,
    pub config_path: Option<PathBuf>,
    pub source: Box<dyn SnapshotSource>,
    pub metrics: Metrics,
    pub shared: Option<Arc<http::Shared>>,
    /// The TC datapath's idle-flow reclaim, run by the housekeeping (when TC is attached).
    pub tc_reclaim: Option<crate::datapath::tc::Reclaimer>,
    /// The engines' KV events of `prefix = "precise"` models, followed into a sink.
    pub prefix: prefix::PrefixFeed,
    policy: PolicyState,
    last_snapshot: Option<Snapshot>,
    last_ok: Instant,
    settle: Settle,
}

/// What to do with a successful discovery read.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The fleet is the one in the kernel: nothing to write.
    Same,
    /// A change right after an outage: held until the next read confirms it.
    Hold,
    Apply,
}

/// Discovery reads after an outage: a changed fleet must be read twice in a row before it is
/// applied.
#[derive(Debug, Default)]
struct Settle {
    outage: bool,
    candidate: Option<Snapshot>,
}

impl Settle {
    fn failed(&mut self) {
        self.outage = true;
        self.candidate = None;
    }

    fn answered(&mut self, last: Option<&Snapshot>, new: &Snapshot) -> Verdict {
        if last == Some(new) {
            *self = Settle::default();
            return Verdict::Same;
        }
        if !self.outage || self.candidate.as_ref() == Some(new) {
            *self = Settle::default();
            return Verdict::Apply;
        }
        self.candidate = Some(new.clone());
        Verdict::Hold
    }
}

impl Daemon {
    pub fn new(
        writer: Writer,
        cfg: ValidConfig,
        config_path: Option<PathBuf>,
        source: Box<dyn SnapshotSource>,
        metrics: Metrics,
        shared: Option<Arc<http::Shared>>,
    ) -> Self {
        // The capacities a previous daemon wrote: without them a backend busy at the first
        // poll after a restart would get its free memory then as its capacity, and a request
        // it holds when idle would be refused (ECONNREFUSED) instead of queued there.
        let mut policy = PolicyState::default();
        for (model, backend, capacity_mb) in writer.capacities() {
            policy.seed_capacity(&model, backend, capacity_mb);
        }
        // The table weights it wrote: the first plan holds them when the new weights moved
        // less than `min_weight_change` (the smoothing starts afresh), instead of rebuilding
        // every table and moving conversations whose pick would not have moved otherwise.
        for (model, weights) in writer.table_weights() {
            policy.seed_weights(&model, weights);
        }
        // The engines' KV events go to the kernel's prefix map; without its pins (an older
        // daemon's, or none) they are kept in memory only, and said so.
        let counters = metrics.kv_feed.clone();
        let prefix = match prefix::KernelSink::open(&writer.maps().dir, writer.id_directory()) {
            Ok(sink) => {
                prefix::PrefixFeed::with_sink(Arc::new(sink), crate::kv_events::FeedSettings::default(), counters)
            }
            Err(e) => {
                warn!(error = %crate::error_chain(&*e), "prefix map not opened: KV events are followed in memory only");
                let mut feed = prefix::PrefixFeed::default();
                feed.count_into(counters);
                feed
            }
        };
        Self {
            writer,
            cfg,
            config_path,
            source,
            metrics,
            shared,
            tc_reclaim: None,
            prefix,
            policy,
            last_snapshot: None,
            last_ok: Instant::now(),
            settle: Settle::default(),
        }
    }

    /// Plans `snapshot` and writes it. `answered` is when the source's answer arrived.
    pub fn apply(&mut self, snapshot: &Snapshot, answered: Instant) -> anyhow::Result<()> {
        let plan = policy::plan(snapshot, &self.cfg.models, &self.cfg.policy, &mut self.policy);
        let report = self.writer.apply(&plan, &self.cfg.balancer)?;
        crate::datapath::tc::write(self.writer.maps(), &self.cfg.tc, self.cfg.remote_models())?;
        self.metrics.applies.inc();
        self.metrics.propagation_seconds.observe(answered.elapsed().as_secs_f64());
        for m in &report.tables_rebuilt {
            self.metrics.table_rebuilds.get_or_create(&ModelLabel { model: m.clone() }).inc();
        }
        self.metrics.backend_weight.clear();
        self.metrics.backend_eligible.clear();
        self.metrics.excluded.clear();
        self.metrics.model_available.clear();
        self.metrics.invalid_metadata.clear();
        for (model, mp) in &plan {
            let available = mp.available;
            self.metrics.model_available.get_or_create(&ModelLabel { model: model.clone() }).set(available as i64);
            if !available {
                warn!(model = %model, "no eligible backend: connections to its VIPs are refused (ECONNREFUSED)");
            }
            for b in &mp.backends {
                let l = BackendLabel { model: model.clone(), backend: b.address.to_string() };
                self.metrics.backend_weight.get_or_create(&l).set(b.weight as i64);
                self.metrics.backend_eligible.get_or_create(&l).set(b.eligible as i64);
                if let Some(ex) = &b.explain.excluded_by {
                    self.metrics.excluded.get_or_create(&ReasonLabel { reason: ex.as_str().to_string() }).inc();
                }
                for f in &b.explain.invalid {
                    self.metrics
                        .invalid_metadata
                        .get_or_create(&InvalidLabel { key: f.key.to_string(), effect: f.effect.to_string() })
                        .inc();
                }
            }
        }
        self.record_loads(&plan);
        self.prefix.update(snapshot, &self.cfg.models);
        if let Some(shared) = &self.shared {
            if let Ok(mut v) = shared.plan.write() {
                *v = Some(PlanView { generation: report.generation, models: plan });
            }
        }
        info!(
            generation = report.generation,
            live_backends = report.live_backends,
            tables_rebuilt = ?report.tables_rebuilt,
            retired = report.retired_backends,
            "tables applied"
        );
        Ok(())
    }

    /// The inputs of the per-model saturation gauges: capacity and queues of the live backends.
    fn record_loads(&self, plan: &policy::Plan) {
        let loads = plan
            .iter()
            .map(|(model, mp)| {
                let spec = self.cfg.models.get(model).map(|m| &m.spec);
                let mut l = ModelLoad::default();
                for b in mp.backends.iter().filter(|b| b.eligible && b.weight > 0) {
                    let cap = if b.cap > 0 { Some(b.cap) } else { spec.and_then(|s| s.backend_capacity) };
                    l.capacity += cap.map_or(0.0, f64::from);
                    l.queued += b.explain.load.queue_length.unwrap_or(0.0);
                }
                (model.clone(), l)
            })
            .collect();
        if let Ok(mut w) = self.metrics.loads.write() {
            *w = loads;
        }
    }

    /// The first plan at start-up (before the programs attach). `None`: the source could not be
    /// read. Then a restarted daemon leaves the pinned tables exactly as they are (fail-static),
    /// and a fresh one writes the catalog with no backends, so that connects to the VIPs are
    /// refused (ECONNREFUSED) instead of going to the VIP address itself.
    pub fn start(&mut self, first: Option<Snapshot>, fresh: bool) -> anyhow::Result<()> {
        if first.is_none() && !fresh {
            return Ok(());
        }
        let answered = Instant::now();
        let snapshot = first.clone().unwrap_or_default();
        self.apply(&snapshot, answered)?;
        if first.is_some() {
            self.last_snapshot = first;
            self.last_ok = answered;
        }
        Ok(())
    }

    /// One discovery read; plans and writes only when the answer differs from the last one.
    async fn refresh(&mut self) {
        let result = self.source.discover().await;
        let dropped = self.source.dropped_total();
        let seen = self.metrics.discovery_dropped.get();
        if dropped > seen {
            self.metrics.discovery_dropped.inc_by(dropped - seen);
        }
        match result {
            Ok(snapshot) => {
                let answered = Instant::now();
                self.last_ok = answered;
                self.metrics.discovery_stale_seconds.set(0.0);
                match self.settle.answered(self.last_snapshot.as_ref(), &snapshot) {
                    Verdict::Same => return,
                    Verdict::Hold => {
                        info!("discovery is back with a changed fleet; applying it once the next read agrees");
                        return;
                    }
                    Verdict::Apply => {}
                }
                match self.apply(&snapshot, answered) {
                    Ok(()) => self.last_snapshot = Some(snapshot),
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "applying the new snapshot failed; retrying on the next read")
                    }
                }
            }
            Err(e) => {
                self.settle.failed();
                self.metrics.discovery_errors.inc();
                let stale = self.last_ok.elapsed().as_secs_f64();
                self.metrics.discovery_stale_seconds.set(stale);
                warn!(error = %crate::error_chain(&e), stale_seconds = stale, "discovery failed; the last good tables stay in the kernel");
            }
        }
    }

    fn reload(&mut self) {
        let new = match config::load_valid(self.config_path.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                error!(error = %e, "reload: invalid config, keeping the previous one");
                return;
            }
        };
        if new.bpffs != self.cfg.bpffs || new.cgroup != self.cfg.cgroup || new.listen != self.cfg.listen {
            error!("reload: daemon.bpffs, daemon.cgroup and daemon.listen cannot change while running; keeping the old config");
            return;
        }
        if let Err(e) = self.source.reconfigure(&new.discovery()) {
            error!(error = %crate::error_chain(&e), "reload: discovery settings rejected; keeping the previous config");
            return;
        }
        self.cfg = new;
        // The config is an input of the plan: plan again even if the fleet did not change.
        self.last_snapshot = None;
        info!("config reloaded");
    }

    pub async fn run(mut self) -> anyhow::Result<()> {
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        // Frees the ids of removed backends once drained, and keeps the staleness gauge current.
        let mut housekeeping = tokio::time::interval(Duration::from_secs(1));
        // The static source is read at start and on reload only.
        const NEVER: Duration = Duration::from_secs(86_400);
        let mut next_read = tokio::time::Instant::now() + self.source.poll_interval().unwrap_or(NEVER);
        // The prefix filter's rebuilds, on a blocking thread (a scan of the prefix map).
        let filter = crate::datapath::prefix_filter::PrefixFilter::open(&self.writer.maps().dir).ok();
        let mut since_rebuild = 0u64;
        let mut rebuild: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let poll = self.source.poll_interval();
            tokio::select! {
                _ = tokio::time::sleep_until(next_read) => {
                    self.refresh().await;
                    next_read = tokio::time::Instant::now() + poll.unwrap_or(NEVER);
                }
                _ = self.source.changed() => {
                    self.refresh().await;
                    next_read = tokio::time::Instant::now() + poll.unwrap_or(NEVER);
                }
                _ = hup.recv() => {
                    self.reload();
                    next_read = tokio::time::Instant::now();
                }
                _ = housekeeping.tick() => {
                    if let Err(e) = self.writer.reap() {
                        error!(error = %e, "freeing drained backend ids failed");
                    }
                    match self.tc_reclaim.as_ref().map(|r| r.run()) {
                        Some(Ok(n)) if n > 0 => info!(flows = n, "reclaimed idle remote flows"),
                        Some(Err(e)) => error!(error = %e, "reclaiming idle remote flows failed"),
                        _ => {}
                    }
                    if poll.is_some() {
                        self.metrics.discovery_stale_seconds.set(self.last_ok.elapsed().as_secs_f64());
                    }
                    since_rebuild += 1;
                    // The fill is a scan of the generation read: only when it can decide.
                    let fill = match &filter {
                        Some(f) if since_rebuild >= FILTER_REBUILD_MIN_TICKS => f.fill(),
                        _ => 0.0,
                    };
                    let due = since_rebuild >= FILTER_REBUILD_TICKS || fill > FILTER_REBUILD_FILL;
                    if filter.is_some() && due && rebuild.as_ref().is_none_or(|r| r.is_finished()) {
                        since_rebuild = 0;
                        let dir = self.writer.maps().dir.clone();
                        rebuild = Some(tokio::task::spawn_blocking(move || sweep_prefix_map(&dir, fill)));
                    }
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        info!("exiting; programs and maps stay pinned and keep routing (fail-static). `ailb teardown` removes them");
        Ok(())
    }
}

/// Housekeeping ticks (seconds) between rebuilds of the prefix filter. Until a rebuild, a block
/// evicted or removed from the prefix map keeps testing positive in the filter, and a search
/// that meets it looks it up in the map.
const FILTER_REBUILD_TICKS: u64 = 30;
/// The share of the filter's bits set beyond which it is rebuilt sooner: where connects learn
/// new keys fast, the map evicts as fast, and the evicted keys' bits fill the filter. A map
/// full of keys sets 22 % of the bits (absent keys then test positive 1.1 % of the time); at
/// 30 %, 2.7 %.
const FILTER_REBUILD_FILL: f64 = 0.30;
/// But not more often than this (a rebuild scans the map and sweeps it: 631 ms for 262,000
/// entries on the CI machine, `ailb-bench --bpf-only`).
const FILTER_REBUILD_MIN_TICKS: u64 = 5;

/// Sweeps the prefix map pinned in `dir` of the entries that no longer count and rebuilds its
/// filter from the keys left (its bits were `fill` set): [`PrefixMap::sweep`].
///
/// [`PrefixMap::sweep`]: crate::datapath::prefix::PrefixMap::sweep
fn sweep_prefix_map(dir: &std::path::Path, fill: f64) {
    let mut map = match crate::datapath::prefix::PrefixMap::open(dir) {
        Ok(map) => map,
        Err(e) => {
            error!(error = %crate::error_chain(&e), "prefix filter: opening the prefix map to rebuild it");
            return;
        }
    };
    let started = Instant::now();
    match map.sweep(crate::datapath::monotonic_ns()) {
        Ok(swept) => tracing::debug!(
            keys = swept.kept,
            removed = swept.removed,
            fill_before = fill,
            fill = map.filter().fill(),
            took_ms = started.elapsed().as_millis() as u64,
            "prefix map swept and filter rebuilt"
        ),
        Err(e) => error!(error = %crate::error_chain(&e), "prefix map: sweeping it and rebuilding its filter"),
    }
}

#[cfg(test)]
mod tests;
