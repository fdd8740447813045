//! Idle upstream connections kept per routing inputs (`gateway.upstream_reuse =
//! "conversation"`).
//!
//! The kernel picks a backend per connection, from the routing inputs the socket is tagged
//! with. A connection may therefore carry a second request only when that request has the
//! SAME inputs (model, memory need, conversation key): the pool is keyed by all three, and a
//! request without a conversation key never reuses a connection (its pick is a fresh
//! weighted draw each time, and reusing would repeat the first draw).
//!
//! Staleness is bounded: a connection is handed out again only while younger than
//! `upstream_max_age` (counted from its connect, where its pick was made), so a pick is never
//! older than that, whatever the tables did since; older ones are closed when their response
//! ends, and a sweeper closes idle ones as they pass the age. At most `upstream_max_idle`
//! connections wait idle at once.
//!
//! The kernel counts open connections as in flight at their backend (its load bound and memory
//! fit read those counts), so a kept connection is marked idle (`AILB_IDLE`) while it waits:
//! it stops counting, and its conversation's affinity ages from then, as at a close; it is
//! marked busy again right before it carries the next request.
//!
//! The idle mark waits `upstream_idle_mark_after` (default 10 ms) from the end of the answer:
//! a connection taken again within it was never marked, so it needs no busy mark either. Each
//! mark is a `setsockopt` that runs the kernel's setsockopt program; a conversation sending
//! small requests back to back (embeddings, a benchmark) would otherwise pay two such system
//! calls per request. The price: a kept connection counts in flight at its backend for up to
//! that long after its answer, which the load bound sees as one request more there. The
//! sweeper marks the connections whose wait has passed; it ticks every
//! `upstream_idle_mark_after`. Zero marks at once, as the answer ends.

use std::collections::HashMap;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::conn::Conn;

/// What a reusable connection must match: the routing inputs the socket was tagged with.
///
/// The conversation is its key's hash, as the kernel stores it: the kernel's pick reads the
/// hash, never the key's bytes, so two keys with one hash get the same pick, and one entry of
/// the pool may serve both. A key of fixed size is hashed and compared without touching the
/// key's strings on every request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct PoolKey {
    /// The model's index in the front door's catalog ([`crate::gateway::pipeline::CatalogModel::index`]).
    pub model: u32,
    pub memory_mb: Option<u32>,
    /// [`crate::gateway::inputs::Conversation::hash`].
    pub conversation: u64,
}

/// The idle connections, by routing inputs.
pub struct Pool {
    max_age: Duration,
    max_idle: usize,
    /// How long a kept connection waits before it is marked idle.
    mark_after: Duration,
    idle: Mutex<Idle>,
    /// Idle and busy marks sent (counted for the tests).
    #[cfg(test)]
    marks: AtomicU64,
}

#[derive(Default)]
struct Idle {
    /// Hashed with `FxHash`, not SipHash: the key is three integers, and the map never holds
    /// more than `upstream_max_idle` connections, so even keys made to collide cost a bounded scan.
    by_key: HashMap<PoolKey, Vec<Kept>, rustc_hash::FxBuildHasher>,
    count: usize,
    /// Kept connections not yet marked idle.
    unmarked: usize,
}

/// A connection waiting in the pool.
struct Kept {
    conn: Box<Conn>,
    /// When its answer ended.
    since: Instant,
    /// Whether the kernel was told it is idle.
    marked: bool,
}

impl Pool {
    pub fn new(max_age: Duration, max_idle: usize, mark_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_age,
            max_idle,
            mark_after,
            idle: Mutex::new(Idle::default()),
            #[cfg(test)]
            marks: AtomicU64::new(0),
        })
    }

    fn mark(&self, c: &Conn, idle: bool) {
        #[cfg(test)]
        self.marks.fetch_add(1, Ordering::Relaxed);
        c.mark_idle(idle);
    }

    /// Idle and busy marks sent so far.
    #[cfg(test)]
    pub fn marks(&self) -> u64 {
        self.marks.load(Ordering::Relaxed)
    }

    fn fresh(&self, c: &Conn, now: Instant) -> bool {
        now.saturating_duration_since(c.born) < self.max_age && c.is_open()
    }

    /// An idle connection for `key` that is young enough at `now` and still open (the newest
    /// first). `now` is the request's start: a clock read saved, and a few microseconds do not
    /// change a connection's age in any way that matters.
    pub fn take(&self, key: &PoolKey, now: Instant) -> Option<Box<Conn>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let idle = &mut *idle;
        let list = idle.by_key.get_mut(key)?;
        let mut found = None;
        while let Some(k) = list.pop() {
            idle.count -= 1;
            idle.unmarked -= usize::from(!k.marked);
            if self.fresh(&k.conn, now) {
                found = Some(k);
                break;
            }
        }
        // An emptied list stays in the map for the conversation's next answer (taking it out
        // and putting it back with a new allocation each time cost more than the rest of the
        // pool's work); the sweep takes out the lists that stay empty.
        let k = found?;
        // One never marked idle still counts as busy: nothing to undo.
        if k.marked {
            self.mark(&k.conn, false);
        }
        Some(k.conn)
    }

    /// Keeps `conn` for the next request with `key`; ends it instead when it is too old or
    /// the pool is full.
    pub fn put(&self, key: PoolKey, conn: Box<Conn>) {
        self.put_at(key, conn, Instant::now());
    }

    /// [`Pool::put`] of a connection whose answer ended `now`.
    pub fn put_at(&self, key: PoolKey, conn: Box<Conn>, now: Instant) {
        if !self.fresh(&conn, now) {
            return conn.done();
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.count >= self.max_idle {
            drop(idle);
            return conn.done();
        }
        let marked = self.mark_after.is_zero();
        if marked {
            self.mark(&conn, true);
        } else {
            idle.unmarked += 1;
        }
        idle.count += 1;
        idle.by_key.entry(key).or_default().push(Kept { conn, since: now, marked });
    }

    /// Closes every idle connection past its age (or closed by its backend), and marks idle
    /// those that have waited `upstream_idle_mark_after`.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let idle = &mut *idle;
        let (mut count, mut unmarked) = (0, 0);
        idle.by_key.retain(|_, list| {
            list.retain_mut(|k| {
                if !self.fresh(&k.conn, now) {
                    return false;
                }
                if !k.marked && now.saturating_duration_since(k.since) >= self.mark_after {
                    self.mark(&k.conn, true);
                    k.marked = true;
                }
                unmarked += usize::from(!k.marked);
                true
            });
            count += list.len();
            !list.is_empty()
        });
        idle.count = count;
        idle.unmarked = unmarked;
    }

    /// Kept connections not yet marked idle (they still count in flight at their backend).
    #[cfg(test)]
    pub fn unmarked_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).unmarked
    }

    /// Connections waiting idle now.
    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).count
    }

    /// Sweeps `pool` every half `max_age`, or every `upstream_idle_mark_after` when that is
    /// shorter (and not zero), until it is dropped.
    pub fn spawn_sweeper(pool: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(pool);
        let mut every = (pool.max_age / 2).max(Duration::from_millis(10));
        if !pool.mark_after.is_zero() {
            every = every.min(pool.mark_after.max(Duration::from_millis(1)));
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { return };
                pool.sweep();
            }
        });
    }
}

#[cfg(test)]
mod tests;
