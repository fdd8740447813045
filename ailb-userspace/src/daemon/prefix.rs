//! The precise prefix feed's wiring: which engines the daemon follows (the instances of models
//! with `prefix = "precise"` whose metadata names a KV-event endpoint), kept in step with every
//! applied snapshot, into the sink. The sink is in memory ([`MemorySink`]) until the kernel's
//! prefix map takes the feed; [`PrefixFeed::with_sink`] takes another.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use tracing::{error, warn};

use crate::{
    config::{PrefixMode, ValidModel},
    discovery::Snapshot,
    kv_events::{EventSource, FeedSettings, FeedStats, Feeds, MemorySink, PrefixSink, Targets},
    metadata::Field,
};

/// Instances not followed, with the reason.
pub type Refused = BTreeMap<(String, SocketAddr), String>;

/// The engines to follow in `snapshot`, and the instances refused with the reason (their KV-event
/// metadata is invalid).
pub fn targets(snapshot: &Snapshot, models: &BTreeMap<String, ValidModel>) -> (Targets, Refused) {
    let mut follow = BTreeMap::new();
    let mut refused = BTreeMap::new();
    for i in &snapshot.instances {
        if models.get(&i.model).map(|m| m.prefix) != Some(PrefixMode::Precise) {
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
            refused: BTreeMap::new(),
        }
    }
}

impl PrefixFeed {
    /// A feed into `sink` (the kernel's prefix map).
    pub fn with_sink(sink: Arc<dyn PrefixSink>, settings: FeedSettings) -> Self {
        PrefixFeed { sink, memory: None, settings, feeds: None, refused: BTreeMap::new() }
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
            match Feeds::new(self.sink.clone(), self.settings) {
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
        self.feeds.as_ref().map(|f| f.stats(model)).unwrap_or_default()
    }

    /// The models with counters.
    pub fn models(&self) -> Vec<String> {
        self.feeds.as_ref().map(Feeds::models).unwrap_or_default()
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
