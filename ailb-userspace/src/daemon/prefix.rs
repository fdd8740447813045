//! The precise prefix feed's wiring: which engines the daemon follows (the instances of models
//! with `prefix = "precise"` whose metadata names a KV-event endpoint), kept in step with every
//! applied snapshot, into the sink: the kernel's prefix map ([`KernelSink`]) when the daemon
//! has one, else memory ([`MemorySink`], the tests').

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use tracing::{error, warn};

use crate::{
    config::ValidModel,
    discovery::Snapshot,
    kv_events::{EventSource, FeedCounters, FeedSettings, FeedStats, Feeds, MemorySink, PrefixSink, Targets},
    metadata::Field,
    policy::PrefixMode,
};

/// The kernel's prefix map as the feed's sink: each backend's held keys written as its
/// holders, by the kernel ids the writer gave the last plan's backends.
pub struct KernelSink {
    map: std::sync::Mutex<crate::datapath::prefix::PrefixMap>,
    ids: crate::datapath::prefix::IdDirectory,
}

impl KernelSink {
    /// The sink over the maps pinned in `dir`.
    pub fn open(dir: &std::path::Path, ids: crate::datapath::prefix::IdDirectory) -> anyhow::Result<Self> {
        Ok(Self { map: std::sync::Mutex::new(crate::datapath::prefix::PrefixMap::open(dir)?), ids })
    }

    fn with_map<T>(&self, f: impl FnOnce(&mut crate::datapath::prefix::PrefixMap) -> T) -> T {
        // Each write completes under the lock.
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }
}

impl PrefixSink for KernelSink {
    fn apply(&self, model: &str, backend: SocketAddr, changes: &[(u64, bool)]) {
        // The feed follows the instances of a snapshot after the writer applied its plan, so
        // a followed backend has its ids; one retired since is cleared by its feed's end.
        let Some(ids) = self.ids.lookup(model, backend) else {
            warn!(model, backend = %backend, "kv events: backend has no kernel id (not in the plan); changes dropped");
            return;
        };
        let now = crate::datapath::monotonic_ns();
        if let Err(e) = self.with_map(|map| map.apply(ids, now, changes)) {
            error!(model, backend = %backend, error = %crate::error_chain(&e), "kv events: writing the prefix map");
        }
    }

    fn backend_cleared(&self, model: &str, backend: SocketAddr) {
        let Some(ids) = self.ids.lookup(model, backend) else {
            return;
        };
        if let Err(e) = self.with_map(|map| map.clear_backend(ids.model, ids.id)) {
            error!(model, backend = %backend, error = %crate::error_chain(&e), "kv events: clearing the prefix map");
        }
    }
}

/// Instances not followed, with the reason.
pub type Refused = BTreeMap<(String, SocketAddr), String>;

/// The engines to follow in `snapshot`, and the instances refused with the reason (their KV-event
/// metadata is invalid).
pub fn targets(snapshot: &Snapshot, models: &BTreeMap<String, ValidModel>) -> (Targets, Refused) {
    let mut follow = BTreeMap::new();
    let mut refused = BTreeMap::new();
    for i in &snapshot.instances {
        if models.get(&i.model).map(|m| m.spec.prefix) != Some(PrefixMode::Precise) {
            continue;
        }
        let key = (i.model.clone(), i.address);
        match &i.metadata.contract().kv_events {
            Field::Valid(source) => {
                follow.entry(key).or_insert_with(|| source.clone());
            }
            Field::Invalid { raw, reason } => {
                refused.insert(key, format!("{raw:?}: {reason}"));
            }
            Field::Absent => {}
        }
    }
    (follow, refused)
}

/// The feed the daemon runs.
pub struct PrefixFeed {
    sink: Arc<dyn PrefixSink>,
    memory: Option<Arc<MemorySink>>,
    settings: FeedSettings,
    /// Started with the first engine to follow.
    feeds: Option<Feeds>,
    /// Its counters, shared with `/metrics`.
    counters: FeedCounters,
    /// The instances refused at the last update, so that each is logged once.
    refused: BTreeMap<(String, SocketAddr), String>,
}

impl Default for PrefixFeed {
    fn default() -> Self {
        let memory = Arc::new(MemorySink::default());
        PrefixFeed {
            sink: memory.clone(),
            memory: Some(memory),
            settings: FeedSettings::default(),
            feeds: None,
            counters: FeedCounters::default(),
            refused: BTreeMap::new(),
        }
    }
}

impl PrefixFeed {
    /// A feed into `sink` (the kernel's prefix map), counting into `counters`.
    pub fn with_sink(sink: Arc<dyn PrefixSink>, settings: FeedSettings, counters: FeedCounters) -> Self {
        PrefixFeed { sink, memory: None, settings, feeds: None, counters, refused: BTreeMap::new() }
    }

    /// Counts into `counters` (those `/metrics` reads) from now on; call before the first
    /// engine is followed.
    pub fn count_into(&mut self, counters: FeedCounters) {
        self.counters = counters;
    }

    /// Follows the engines of `snapshot`; an instance with invalid KV-event metadata is not
    /// followed and its reason logged (once, until it changes).
    pub fn update(&mut self, snapshot: &Snapshot, models: &BTreeMap<String, ValidModel>) {
        let (follow, refused) = targets(snapshot, models);
        for ((model, backend), reason) in &refused {
            if self.refused.get(&(model.clone(), *backend)) != Some(reason) {
                warn!(model = %model, backend = %backend, reason = %reason, "kv events: invalid metadata; this backend's cache is not followed");
            }
        }
        self.refused = refused;
        if self.feeds.is_none() {
            if follow.is_empty() {
                return;
            }
            match Feeds::with_counters(self.sink.clone(), self.settings, self.counters.clone()) {
                Ok(f) => self.feeds = Some(f),
                Err(e) => {
                    error!(error = %e, "kv events: cannot start the feed's runtime; no engine is followed");
                    return;
                }
            }
        }
        if let Some(feeds) = &mut self.feeds {
            feeds.follow(&follow);
        }
    }

    /// `model`'s feed counters (zero before any engine of it was followed).
    pub fn stats(&self, model: &str) -> FeedStats {
        self.counters.stats(model)
    }

    /// The models with counters.
    pub fn models(&self) -> Vec<String> {
        self.counters.models()
    }

    /// The engines followed now.
    pub fn followed(&self) -> Vec<((String, SocketAddr), EventSource)> {
        self.feeds.as_ref().map(|f| f.followed().map(|(k, s)| (k.clone(), s.clone())).collect()).unwrap_or_default()
    }

    /// The in-memory sink, when the feed goes there.
    pub fn memory(&self) -> Option<&Arc<MemorySink>> {
        self.memory.as_ref()
    }
}
