use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::header::HeaderValue;
use prometheus_client::registry::Registry;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::*;
use crate::config::gateway::FleetMemoryLimits;
use crate::datapath::DatapathError;
use crate::gateway::control::fleet_memory::{Capacity, Fleet, FleetMemory};
use crate::gateway::metrics::GatewayMetrics;
use crate::gateway::upstream::body::{Framing, RawBody, RawConn};

/// A fleet the admission never limits: every request gets a ticket at once.
struct Unlimited;

impl Fleet for Unlimited {
    fn capacity(&self, _model: &str) -> Result<Option<Capacity>, DatapathError> {
        Ok(None)
    }
    fn inflight_mb(&self, _cap: &Capacity) -> Result<u64, DatapathError> {
        Ok(0)
    }
    fn slot_free(&self, _cap: &Capacity) -> Result<bool, DatapathError> {
        Ok(true)
    }
}

/// Limits that never make a request wait.
fn limits() -> FleetMemoryLimits {
    FleetMemoryLimits { factor: 1.0, max_wait: Duration::from_secs(1), max_queued: 4, reserve: 0.0, retry_after: 1 }
}

/// An upstream connection as the pipeline holds it while its socket (`client`, to the backend
/// `server`) is with the response body.
async fn upstream() -> (Box<Conn>, TcpStream, TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = match l.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        other => panic!("{other}"),
    };
    let client = TcpStream::connect(backend).await.unwrap();
    let (server, _) = l.accept().await.unwrap();
    let conn = Box::new(Conn {
        link: Link::Raw(None),
        backend,
        backend_value: HeaderValue::from_static("test"),
        born: Instant::now(),
        fd: None,
    });
    (conn, client, server)
}

/// A relay of a `len`-byte answer over `client` (the upstream side of `conn`), holding
/// `ticket`, going back to `reuse`'s pool at its end when given one.
fn relay_of<T>(
    conn: Box<Conn>,
    client: TcpStream,
    len: u64,
    reuse: Option<Reuse>,
    ticket: Option<T>,
    registry: &mut Registry,
) -> Relay<T> {
    let body = RawBody::new(RawConn::new(client), Framing::Length(len));
    let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
    let log = RequestLog::start(Arc::new(GatewayMetrics::new(registry)), &hyper::Method::POST, "/v1/x");
    let deadline = Deadline::after(Instant::now(), Duration::from_secs(30));
    let held = Held { _permit: permit, ticket };
    Relay::new(UpBody::Raw(body), None, conn, reuse, held, log, Duration::from_secs(30), deadline)
}

/// The client's next request may follow the last byte of this one's answer at once: by then
/// the admission must have its memory back, or that request queues behind a finished one.
#[tokio::test]
async fn the_memory_ticket_is_given_back_before_the_last_frame_reaches_the_client() {
    let mut registry = Registry::default();
    let admission = FleetMemory::new(Box::new(Unlimited), limits(), ["m"], &mut registry);
    let ticket = admission.admit("m", Some(600)).await.expect("admitted");
    assert!(ticket.is_some());
    assert_eq!(admission.admitted_mb("m"), 600);

    let (conn, client, mut server) = upstream().await;
    let mut relay = relay_of(conn, client, 10, None, ticket, &mut registry);

    server.write_all(b"hello").await.unwrap();
    let first = relay.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().unwrap(), "hello");
    assert_eq!(admission.admitted_mb("m"), 600, "held while the answer is still coming");

    server.write_all(b"world").await.unwrap();
    let last = relay.frame().await.expect("a frame").expect("data");
    assert_eq!(last.into_data().unwrap(), "world");
    assert!(relay.is_end_stream());
    assert_eq!(admission.admitted_mb("m"), 0, "given back with the last frame, the relay not yet dropped");
    drop(relay);
    assert_eq!(admission.admitted_mb("m"), 0, "and given back once");
}

/// An answer read whole with its head is ended at once, as a relay ends one at its last frame:
/// the connection goes back to the pool, the slot and the memory are given back, and the request
/// is counted with its time to first byte.
#[tokio::test]
async fn an_answer_read_whole_with_its_head_is_ended_without_a_relay() {
    let mut registry = Registry::default();
    let admission = FleetMemory::new(Box::new(Unlimited), limits(), ["m"], &mut registry);
    let ticket = admission.admit("m", Some(600)).await.expect("admitted");
    let metrics = Arc::new(GatewayMetrics::new(&mut registry));

    let (conn, client, _server) = upstream().await;
    let mut raw = RawConn::new(client);
    raw.buf.extend_from_slice(b"hello");
    let mut body = UpBody::Raw(RawBody::new(raw, Framing::Length(5)));
    let backend = conn.backend;
    let slots = Arc::new(Semaphore::new(1));
    let permit = slots.clone().try_acquire_owned().unwrap();
    let pool = Pool::new(Duration::from_secs(60), 8, Duration::from_secs(60));
    let key = PoolKey { model: 0, memory_mb: Some(600), conversation: 7 };
    let mut log = RequestLog::start(metrics.clone(), &hyper::Method::POST, "/v1/x");
    let series = Arc::new(crate::gateway::metrics::ModelSeries::new("m".into()));
    log.proxying(&series, Some(7));
    log.upstream(backend, 200);

    let data = body.take_whole().expect("read whole");
    assert_eq!(&data[..], b"hello");
    whole(body, &data, conn, Some(Reuse { pool: pool.clone(), key }), Held { _permit: permit, ticket }, log);

    assert_eq!(admission.admitted_mb("m"), 0, "the memory is given back");
    assert_eq!(slots.available_permits(), 1, "the slot is given back");
    let kept = pool.take(&key, Instant::now()).expect("the connection went back to the pool");
    match &kept.link {
        Link::Raw(Some(raw)) => assert!(raw.buf.is_empty(), "the body was taken from its buffer"),
        _ => panic!("the connection came back without its socket"),
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "ailb_gateway_requests_total{model=\"m\",status=\"200\"} 1",
        "ailb_gateway_in_flight{model=\"m\"} 0",
        "ailb_gateway_ttfb_seconds_count{model=\"m\"} 1",
        "ailb_gateway_duration_seconds_count{model=\"m\"} 1",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
}

/// What the pool held and the idle marks it had sent, when a [`Probe`] was dropped.
type Seen = Arc<std::sync::Mutex<Option<(usize, u64)>>>;

/// A ticket that notes, as it is dropped, what the pool held and how many idle marks it had
/// sent: where the admission's waiters, woken by that drop, would find the kernel's count.
struct Probe {
    pool: Arc<Pool>,
    seen: Seen,
}

impl Drop for Probe {
    fn drop(&mut self) {
        *self.seen.lock().unwrap() = Some((self.pool.idle_count(), self.pool.marks()));
    }
}

fn probe(pool: &Arc<Pool>) -> (Probe, Seen) {
    let seen = Arc::new(std::sync::Mutex::new(None));
    (Probe { pool: pool.clone(), seen: seen.clone() }, seen)
}

/// Giving the memory back wakes the admission's waiters, which read the kernel's count of the
/// connection: by then the connection must be back in the pool and marked idle (uncounted),
/// or a waiter finds the fleet full with a slot free and sleeps until its next poll.
#[tokio::test]
async fn the_connection_is_uncounted_before_the_memory_is_given_back() {
    let mut registry = Registry::default();
    let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
    let key = PoolKey { model: 0, memory_mb: Some(250), conversation: 9 };
    let (ticket, seen) = probe(&pool);

    let (conn, client, mut server) = upstream().await;
    let reuse = Some(Reuse { pool: pool.clone(), key });
    let mut relay = relay_of(conn, client, 5, reuse, Some(ticket), &mut registry);
    server.write_all(b"hello").await.unwrap();
    relay.frame().await.expect("a frame").expect("data");
    assert!(relay.is_end_stream());
    assert_eq!(*seen.lock().unwrap(), Some((1, 1)), "(kept, idle marks) when the memory was given back");
}

/// The same for an answer read whole with its head.
#[tokio::test]
async fn a_whole_answer_is_uncounted_before_its_memory_is_given_back() {
    let mut registry = Registry::default();
    let pool = Pool::new(Duration::from_secs(60), 8, Duration::ZERO);
    let key = PoolKey { model: 0, memory_mb: Some(250), conversation: 9 };
    let (ticket, seen) = probe(&pool);

    let (conn, client, _server) = upstream().await;
    let mut raw = RawConn::new(client);
    raw.buf.extend_from_slice(b"hello");
    let mut body = UpBody::Raw(RawBody::new(raw, Framing::Length(5)));
    let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
    let log = RequestLog::start(Arc::new(GatewayMetrics::new(&mut registry)), &hyper::Method::POST, "/v1/x");
    let data = body.take_whole().expect("read whole");
    whole(
        body,
        &data,
        conn,
        Some(Reuse { pool: pool.clone(), key }),
        Held { _permit: permit, ticket: Some(ticket) },
        log,
    );
    assert_eq!(*seen.lock().unwrap(), Some((1, 1)), "(kept, idle marks) when the memory was given back");
}
