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
use std::net::SocketAddrV4;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper::header::HeaderValue;

use super::h1::upbody::RawConn;
use super::proxy::AbortOnDrop;

/// What a reusable connection must match: the routing inputs the socket was tagged with.
///
/// The conversation is its key's hash, as the kernel stores it: the kernel's pick reads the
/// hash, never the key's bytes, so two keys with one hash get the same pick, and one entry of
/// the pool may serve both. A key of fixed size is hashed and compared without touching the
/// key's strings on every request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct PoolKey {
    /// The model's index in the front door's catalog ([`super::server::ModelRoute::index`]).
    pub model: u32,
    pub memory_mb: Option<u32>,
    /// [`super::route::Conversation::hash`].
    pub conversation: u64,
}

/// How an upstream connection is driven.
pub enum Link {
    /// By hyper's client: a sender, and the connection's own task.
    Hyper { sender: SendRequest<Full<Bytes>>, driver: AbortOnDrop },
    /// By the front door itself (`gateway.http1_fast_path`); `None` while a response body
    /// holds the socket, or after one that did not end cleanly.
    Raw(Option<RawConn>),
}

/// One open HTTP/1.1 connection to a backend. It is kept boxed from its opening to its end: each
/// request moves it out of the pool, through the route's async functions and back, and a box
/// moves as one pointer.
pub struct Conn {
    pub link: Link,
    pub backend: SocketAddrV4,
    /// `backend` as the value of the response's `x-ailb-backend` header, formatted once.
    pub backend_value: HeaderValue,
    /// When it connected (when the kernel made its pick).
    pub born: Instant,
    /// A duplicate of the socket, to mark it idle and busy, and to shut it down at once.
    pub fd: Option<OwnedFd>,
}

impl Conn {
    /// Whether it can carry another request (its backend has not closed it).
    pub fn is_open(&self) -> bool {
        match &self.link {
            Link::Hyper { sender, .. } => !sender.is_closed(),
            Link::Raw(raw) => raw.as_ref().is_some_and(RawConn::is_open),
        }
    }

    /// Ends the connection now: a `shutdown` on the socket sends the FIN in this call, so the
    /// kernel stops counting it in flight before anything else happens (dropping the
    /// connection's task would close it only when the runtime gets to it).
    pub fn done(self) {
        if let Some(fd) = &self.fd {
            let _ = socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Both);
        }
    }

    /// Tells the kernel this connection waits idle (`true`) or carries a request (`false`).
    fn mark_idle(&self, idle: bool) {
        let Some(fd) = &self.fd else { return };
        if let Err(e) = ailb_common::client::mark_idle(fd, idle) {
            tracing::debug!(backend = %self.backend, error = %crate::error_chain(&e), "marking an upstream connection idle");
        }
    }
}

/// The idle connections, by routing inputs.
pub struct Pool {
    max_age: Duration,
    max_idle: usize,
    /// How long a kept connection waits before it is marked idle.
    mark_after: Duration,
    idle: Mutex<Idle>,
    /// Idle and busy marks sent.
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
        Arc::new(Self { max_age, max_idle, mark_after, idle: Mutex::new(Idle::default()), marks: AtomicU64::new(0) })
    }

    fn mark(&self, c: &Conn, idle: bool) {
        self.marks.fetch_add(1, Ordering::Relaxed);
        c.mark_idle(idle);
    }

    /// Idle and busy marks sent so far.
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
    pub fn unmarked_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).unmarked
    }

    /// Connections waiting idle now.
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
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    /// A connection to a listener that never answers (the test only pools it).
    async fn conn(born: Instant) -> (Box<Conn>, tokio::net::TcpListener) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, c) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.unwrap();
        let driver = AbortOnDrop(tokio::spawn(async move {
            let _ = c.await;
        }));
        let backend = match addr {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let backend_value = HeaderValue::from_static("test");
        (Box::new(Conn { link: Link::Hyper { sender, driver }, backend, backend_value, born, fd: None }), l)
    }

    fn key(c: &str) -> PoolKey {
        PoolKey { model: 0, memory_mb: Some(8192), conversation: ailb_common::hash::conversation_hash(c.as_bytes()) }
    }

    #[tokio::test]
    async fn a_list_emptied_by_a_take_is_kept_until_the_sweep() {
        let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
        let lists = |pool: &Pool| pool.idle.lock().unwrap().by_key.len();
        let (c, _l) = conn(Instant::now()).await;
        pool.put(key("a"), c);
        let c = pool.take(&key("a"), Instant::now()).unwrap();
        assert_eq!((lists(&pool), pool.idle_count()), (1, 0), "kept for the next answer");
        pool.put(key("a"), c);
        assert_eq!((lists(&pool), pool.idle_count()), (1, 1));
        let _c = pool.take(&key("a"), Instant::now()).unwrap();
        pool.sweep();
        assert_eq!((lists(&pool), pool.idle_count()), (0, 0), "an empty list is swept out");
    }

    #[tokio::test]
    async fn only_the_same_inputs_get_a_connection_back() {
        let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
        let (c, _l) = conn(Instant::now()).await;
        pool.put(key("a"), c);
        assert!(pool.take(&key("b"), Instant::now()).is_none(), "another conversation");
        let other_memory = PoolKey { memory_mb: None, ..key("a") };
        assert!(pool.take(&other_memory, Instant::now()).is_none(), "another memory need");
        let other_model = PoolKey { model: 1, ..key("a") };
        assert!(pool.take(&other_model, Instant::now()).is_none(), "another model");
        assert!(pool.take(&key("a"), Instant::now()).is_some());
        assert!(pool.take(&key("a"), Instant::now()).is_none(), "handed out once");
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn old_connections_are_never_handed_out_and_are_swept() {
        let pool = Pool::new(Duration::from_millis(200), 8, Duration::ZERO);
        let (old, _l1) = conn(Instant::now() - Duration::from_millis(300)).await;
        pool.put(key("a"), old);
        assert_eq!(pool.idle_count(), 0, "too old to keep");
        let (young, _l2) = conn(Instant::now() - Duration::from_millis(150)).await;
        pool.put(key("a"), young);
        assert_eq!(pool.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(pool.take(&key("a"), Instant::now()).is_none(), "aged past max_age while idle");
        let (young, _l3) = conn(Instant::now()).await;
        pool.put(key("b"), young);
        pool.sweep();
        assert_eq!(pool.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(210)).await;
        pool.sweep();
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn the_pool_is_bounded() {
        let pool = Pool::new(Duration::from_secs(60), 2, Duration::ZERO);
        let mut listeners = Vec::new();
        for i in 0..3 {
            let (c, l) = conn(Instant::now()).await;
            listeners.push(l);
            pool.put(key(&i.to_string()), c);
        }
        assert_eq!(pool.idle_count(), 2);
        assert!(pool.take(&key("2"), Instant::now()).is_none(), "the third was closed, not kept");
    }

    #[tokio::test]
    async fn a_connection_its_backend_closed_is_not_handed_out() {
        let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
        let (c, l) = conn(Instant::now()).await;
        let (server_side, _) = l.accept().await.unwrap();
        pool.put(key("a"), c);
        drop(server_side);
        drop(l);
        // The connection task sees the close and the sender reports it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let closed = {
                let idle = pool.idle.lock().unwrap();
                idle.by_key.get(&key("a")).is_none_or(|l| l.iter().all(|k| !k.conn.is_open()))
            };
            if closed {
                break;
            }
            assert!(Instant::now() < deadline, "the close was never seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(pool.take(&key("a"), Instant::now()).is_none());
    }

    #[tokio::test]
    async fn with_no_wait_every_reuse_costs_an_idle_and_a_busy_mark() {
        let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
        let (c, _l) = conn(Instant::now()).await;
        pool.put(key("a"), c);
        assert_eq!((pool.marks(), pool.unmarked_count()), (1, 0), "marked idle as the answer ends");
        let c = pool.take(&key("a"), Instant::now()).unwrap();
        assert_eq!(pool.marks(), 2, "marked busy before the next request");
        pool.put(key("a"), c);
        assert_eq!(pool.marks(), 3);
    }

    #[tokio::test]
    async fn a_connection_taken_again_within_the_wait_is_never_marked() {
        let pool = Pool::new(Duration::from_secs(60), 8, Duration::from_secs(30));
        let (c, _l) = conn(Instant::now()).await;
        pool.put(key("a"), c);
        assert_eq!((pool.marks(), pool.unmarked_count()), (0, 1), "still counted busy while it waits");
        pool.sweep();
        assert_eq!(pool.marks(), 0, "the wait has not passed");
        for _ in 0..100 {
            let c = pool.take(&key("a"), Instant::now()).unwrap();
            pool.put(key("a"), c);
        }
        assert_eq!(pool.marks(), 0, "back-to-back requests cost no mark");
        let _c = pool.take(&key("a"), Instant::now()).unwrap();
        assert_eq!((pool.marks(), pool.unmarked_count(), pool.idle_count()), (0, 0, 0));
    }

    #[tokio::test]
    async fn the_sweeper_marks_a_connection_idle_once_its_wait_has_passed() {
        let wait = Duration::from_millis(20);
        let pool = Pool::new(Duration::from_secs(60), 8, wait);
        let (a, _la) = conn(Instant::now()).await;
        let (b, _lb) = conn(Instant::now()).await;
        pool.put(key("a"), a);
        let put_b = Instant::now();
        pool.put(key("b"), b);
        Pool::spawn_sweeper(&pool);
        let deadline = Instant::now() + Duration::from_secs(5);
        while pool.unmarked_count() > 0 {
            assert!(Instant::now() < deadline, "never marked idle");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(put_b.elapsed() >= wait, "marked before its wait had passed");
        assert_eq!(pool.marks(), 2, "each marked idle once");
        pool.sweep();
        assert_eq!(pool.marks(), 2, "a marked connection is not marked again");
        let _a = pool.take(&key("a"), Instant::now()).unwrap();
        assert_eq!(pool.marks(), 3, "a connection marked idle is marked busy when taken");
        assert_eq!(pool.idle_count(), 1);
    }
}
