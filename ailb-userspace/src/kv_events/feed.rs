//! The feed: every followed engine's KV events, through its own [`BlockIndex`], into one
//! [`PrefixSink`] (the kernel's prefix map, or [`MemorySink`] in tests), keyed by model and
//! backend address.
//!
//! [`Feeds::follow`] takes the whole set of engines to follow (from discovery: a backend of a
//! model with `prefix = "precise"` that names its KV-event endpoint) and starts a task for each
//! new one, stops the task of each one gone (its keys are withdrawn from the sink:
//! [`PrefixSink::backend_cleared`]), and restarts one whose endpoints changed. A task connects
//! with backoff, follows the publisher ([`Subscriber`]: replay on a sequence gap, a resync when
//! the replay cannot fill it), skips malformed batches (logged by the index), and hands each
//! batch's key changes to the sink. Its index outlives a lost connection: after a reconnect the
//! sequence numbers tell a gap (replayed) from an engine restart (everything dropped).
//!
//! The tasks run on a runtime of their own (one worker thread), so that decoding a busy
//! engine's events never delays the daemon's loop.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::SocketAddr,
    num::NonZeroU32,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::{sync::oneshot, task::JoinHandle};

use super::{BlockIndex, Followed, Receipt, Subscriber};

/// Where one engine publishes its KV events.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventSource {
    /// The PUB socket, `tcp://host:port`.
    pub endpoint: String,
    /// The replay ROUTER socket, if the engine has one.
    pub replay: Option<String>,
    /// The engine's KV-cache block size in tokens.
    pub block_size: NonZeroU32,
}

/// The engines to follow, by model and backend address.
pub type Targets = BTreeMap<(String, SocketAddr), EventSource>;

/// The largest block size accepted (vLLM's are 1 to a few hundred tokens).
pub const MAX_BLOCK_SIZE: u32 = 65_536;

/// An endpoint to connect to: `tcp://HOST:PORT`, HOST a name or an address (IPv6 in brackets),
/// not a wildcard (`*`, `0.0.0.0`, `::`: an engine binds those, a subscriber cannot connect to
/// them), PORT 1..=65535. The reason is for a message that names the field and the value.
pub fn check_endpoint(value: &str) -> Result<(), &'static str> {
    const WANT: &str = "expected tcp://HOST:PORT";
    let rest = value.strip_prefix("tcp://").ok_or(WANT)?;
    let (host, port) = rest.rsplit_once(':').ok_or(WANT)?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err("expected a port 1..=65535 after the last ':'"),
    }
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let bare = bracketed.unwrap_or(host);
    if bare.is_empty() || bare.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return Err("expected a host name or an address before the port");
    }
    if bare.contains(':') && (bracketed.is_none() || bare.parse::<std::net::Ipv6Addr>().is_err()) {
        return Err("an IPv6 address goes in brackets: tcp://[ADDRESS]:PORT");
    }
    if bare == "*" || bare.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_unspecified()) {
        return Err("a wildcard address is where an engine binds, not one to connect to: name the engine's address");
    }
    Ok(())
}

/// A block size: 1..=[`MAX_BLOCK_SIZE`] tokens.
pub fn check_block_size(value: u64) -> Result<NonZeroU32, &'static str> {
    u32::try_from(value)
        .ok()
        .filter(|&b| (1..=MAX_BLOCK_SIZE).contains(&b))
        .and_then(NonZeroU32::new)
        .ok_or("expected a block size of 1 to 65536 tokens")
}

/// A publisher as a config names it (`kv_events`, `kv_replay`, `kv_block_size`): the endpoint
/// and the replay socket checked by [`check_endpoint`], the block size required. The error names
/// the field (one of those three), its value and the reason.
pub fn check_source(
    endpoint: &str,
    replay: Option<&str>,
    block_size: Option<u64>,
) -> Result<EventSource, (&'static str, String, &'static str)> {
    check_endpoint(endpoint).map_err(|r| ("kv_events", endpoint.to_string(), r))?;
    if let Some(r) = replay {
        check_endpoint(r).map_err(|reason| ("kv_replay", r.to_string(), reason))?;
    }
    let size = block_size.ok_or((
        "kv_block_size",
        "absent".to_string(),
        "required with kv_events: the engine's KV-cache block size in tokens (vLLM's --block-size)",
    ))?;
    let block_size = check_block_size(size).map_err(|r| ("kv_block_size", size.to_string(), r))?;
    Ok(EventSource { endpoint: endpoint.to_string(), replay: replay.map(str::to_string), block_size })
}

/// Where the feed's key changes go. Calls for one backend come from one task, in order; calls
/// for different backends may come from different threads.
pub trait PrefixSink: Send + Sync {
    /// The backend's held state of these keys changed: `(key, held)`, each key once.
    fn apply(&self, model: &str, backend: SocketAddr, changes: &[(u64, bool)]);
    /// The backend is no longer followed: every key it held is withdrawn.
    fn backend_cleared(&self, model: &str, backend: SocketAddr);
}

/// A sink in memory: the keys each backend holds. The daemon's until the kernel's prefix map
/// takes the feed, and the tests'.
#[derive(Debug, Default)]
pub struct MemorySink {
    held: Mutex<HashMap<(String, SocketAddr), HashSet<u64>>>,
    changes: AtomicU64,
}

impl MemorySink {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, SocketAddr), HashSet<u64>>> {
        // Every update completes under the lock.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The keys `backend` of `model` holds.
    pub fn keys(&self, model: &str, backend: SocketAddr) -> HashSet<u64> {
        self.lock().get(&(model.to_string(), backend)).cloned().unwrap_or_default()
    }

    /// The backends of `model` holding `key`.
    pub fn holders(&self, model: &str, key: u64) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self
            .lock()
            .iter()
            .filter(|((m, _), keys)| m == model && keys.contains(&key))
            .map(|((_, b), _)| *b)
            .collect();
        v.sort_unstable();
        v
    }

    /// Key changes applied since start.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }
}

impl PrefixSink for MemorySink {
    fn apply(&self, model: &str, backend: SocketAddr, changes: &[(u64, bool)]) {
        let mut held = self.lock();
        let keys = held.entry((model.to_string(), backend)).or_default();
        for &(key, on) in changes {
            if on {
                keys.insert(key);
            } else {
                keys.remove(&key);
            }
        }
        self.changes.fetch_add(changes.len() as u64, Ordering::Relaxed);
    }

    fn backend_cleared(&self, model: &str, backend: SocketAddr) {
        self.lock().remove(&(model.to_string(), backend));
    }
}

/// One model's feed counters (all its followed backends together).
#[derive(Debug, Default)]
struct Counters {
    keys_held: AtomicI64,
    batches: AtomicU64,
    blocks_stored: AtomicU64,
    blocks_removed: AtomicU64,
    gaps: AtomicU64,
    resyncs: AtomicU64,
    malformed: AtomicU64,
    connect_failures: AtomicU64,
}

/// Every model's feed counters, shared by the feed's tasks and whoever reads them (the
/// daemon's `/metrics`); a clone is a handle on the same counters.
#[derive(Clone, Debug, Default)]
pub struct FeedCounters(Arc<Mutex<HashMap<String, Arc<Counters>>>>);

impl FeedCounters {
    fn model(&self, model: &str) -> Arc<Counters> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        c.entry(model.to_string()).or_default().clone()
    }

    /// `model`'s counters (zero before any engine of it was followed).
    pub fn stats(&self, model: &str) -> FeedStats {
        let c = self.model(model);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FeedStats {
            keys_held: c.keys_held.load(Ordering::Relaxed).max(0) as u64,
            batches: get(&c.batches),
            blocks_stored: get(&c.blocks_stored),
            blocks_removed: get(&c.blocks_removed),
            gaps: get(&c.gaps),
            resyncs: get(&c.resyncs),
            malformed: get(&c.malformed),
            connect_failures: get(&c.connect_failures),
        }
    }

    /// The models with counters, sorted.
    pub fn models(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        v.sort();
        v
    }
}

/// One model's feed, as counted since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Prefix keys its backends hold now (each backend's distinct keys, summed).
    pub keys_held: u64,
    /// Batches applied (live or replayed).
    pub batches: u64,
    /// Blocks stored and removed by those batches.
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    /// Sequence gaps seen (each filled by a replay or, failing that, a resync).
    pub gaps: u64,
    /// Gaps the replay could not fill: the backend's keys dropped and relearnt.
    pub resyncs: u64,
    /// Malformed batches skipped.
    pub malformed: u64,
    /// Failed connects and lost connections.
    pub connect_failures: u64,
}

/// How the feed's tasks wait and retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedSettings {
    /// Each answer of a replay socket.
    pub replay_timeout: Duration,
    /// The first wait after a failed connect or a lost connection, doubled up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for FeedSettings {
    fn default() -> Self {
        FeedSettings {
            replay_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// A followed backend's task.
struct Task {
    source: EventSource,
    stop: oneshot::Sender<()>,
    handle: JoinHandle<()>,
}

/// The followed engines (see the module doc).
pub struct Feeds {
    sink: Arc<dyn PrefixSink>,
    settings: FeedSettings,
    runtime: Option<tokio::runtime::Runtime>,
    tasks: BTreeMap<(String, SocketAddr), Task>,
    counters: FeedCounters,
}

impl Feeds {
    /// No engine followed yet; starts the feed's runtime thread.
    pub fn new(sink: Arc<dyn PrefixSink>, settings: FeedSettings) -> std::io::Result<Self> {
        Self::with_counters(sink, settings, FeedCounters::default())
    }

    /// [`Feeds::new`], counting into `counters`.
    pub fn with_counters(
        sink: Arc<dyn PrefixSink>,
        settings: FeedSettings,
        counters: FeedCounters,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ailb-kv-feed")
            .enable_all()
            .build()?;
        Ok(Feeds { sink, settings, runtime: Some(runtime), tasks: BTreeMap::new(), counters })
    }

    /// Follows exactly `targets`: starts the new, stops the gone, restarts the changed.
    pub fn follow(&mut self, targets: &Targets) {
        let gone: Vec<(String, SocketAddr)> =
            self.tasks.iter().filter(|(k, t)| targets.get(*k) != Some(&t.source)).map(|(k, _)| k.clone()).collect();
        let mut previous = HashMap::new();
        for key in gone {
            if let Some(task) = self.tasks.remove(&key) {
                tracing::info!(model = %key.0, backend = %key.1, endpoint = %task.source.endpoint, "kv events: no longer followed");
                // The task withdraws the backend's keys and exits; a task for the same backend
                // (its endpoints changed) starts after it.
                let _ = task.stop.send(());
                previous.insert(key, task.handle);
            }
        }
        for (key, source) in targets {
            if self.tasks.contains_key(key) {
                continue;
            }
            tracing::info!(model = %key.0, backend = %key.1, endpoint = %source.endpoint, replay = ?source.replay, block_size = source.block_size, "kv events: following");
            let (stop, stopped) = oneshot::channel();
            let follower = Follower {
                model: key.0.clone(),
                backend: key.1,
                source: source.clone(),
                sink: self.sink.clone(),
                counters: self.counters.model(&key.0),
                settings: self.settings,
            };
            let after = previous.remove(key);
            let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
            let handle = runtime.spawn(async move {
                if let Some(after) = after {
                    let _ = after.await;
                }
                follower.run(stopped).await
            });
            self.tasks.insert(key.clone(), Task { source: source.clone(), stop, handle });
        }
    }

    /// The backends followed now.
    pub fn followed(&self) -> impl Iterator<Item = (&(String, SocketAddr), &EventSource)> {
        self.tasks.iter().map(|(k, t)| (k, &t.source))
    }

    /// `model`'s counters.
    pub fn stats(&self, model: &str) -> FeedStats {
        self.counters.stats(model)
    }

    /// The models with counters.
    pub fn models(&self) -> Vec<String> {
        self.counters.models()
    }
}

impl Drop for Feeds {
    fn drop(&mut self) {
        // Dropping a runtime waits for its tasks, which an async caller must not do.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One backend's task.
struct Follower {
    model: String,
    backend: SocketAddr,
    source: EventSource,
    sink: Arc<dyn PrefixSink>,
    counters: Arc<Counters>,
    settings: FeedSettings,
}

impl Follower {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let mut index = BlockIndex::new(self.source.block_size);
        let mut held = 0usize;
        let mut backoff = self.settings.backoff_min;
        'connect: loop {
            let connect =
                Subscriber::connect(&self.source.endpoint, self.source.replay.as_deref(), self.settings.replay_timeout);
            let connected = tokio::select! {
                _ = &mut stop => break 'connect,
                c = connect => c,
            };
            match connected {
                Ok(mut sub) => loop {
                    let next = tokio::select! {
                        _ = &mut stop => break 'connect,
                        n = sub.next(&mut index) => n,
                    };
                    match next {
                        Ok(followed) => {
                            backoff = self.settings.backoff_min;
                            self.count(&followed);
                            let changes = index.take_changes();
                            // The count first: whoever sees the sink's new state (through its
                            // lock) then sees the count that goes with it.
                            let now = index.len();
                            self.counters.keys_held.fetch_add(now as i64 - held as i64, Ordering::Relaxed);
                            held = now;
                            if !changes.is_empty() {
                                self.sink.apply(&self.model, self.backend, &changes);
                            }
                        }
                        Err(e) => {
                            self.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(model = %self.model, backend = %self.backend, error = %crate::error_chain(&e), "kv events: connection lost; reconnecting");
                            break;
                        }
                    }
                },
                Err(e) => {
                    self.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(model = %self.model, backend = %self.backend, error = %crate::error_chain(&e), retry_in = ?backoff, "kv events: cannot connect");
                }
            }
            tokio::select! {
                _ = &mut stop => break 'connect,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.settings.backoff_max);
        }
        self.sink.backend_cleared(&self.model, self.backend);
        self.counters.keys_held.fetch_sub(held as i64, Ordering::Relaxed);
    }

    fn count(&self, f: &Followed) {
        let c = &self.counters;
        if f.replayed > 0 || f.resynced {
            c.gaps.fetch_add(1, Ordering::Relaxed);
        }
        if f.resynced {
            c.resyncs.fetch_add(1, Ordering::Relaxed);
        }
        c.batches.fetch_add(f.replayed, Ordering::Relaxed);
        match &f.receipt {
            Receipt::Applied(s) | Receipt::Restarted(s) => {
                c.batches.fetch_add(1, Ordering::Relaxed);
                c.blocks_stored.fetch_add(s.stored, Ordering::Relaxed);
                c.blocks_removed.fetch_add(s.removed, Ordering::Relaxed);
            }
            Receipt::Skipped { .. } => {
                c.malformed.fetch_add(1, Ordering::Relaxed);
            }
            Receipt::Duplicate { .. } | Receipt::Gap { .. } => {}
        }
    }
}
