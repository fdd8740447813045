use super::*;
use crate::gateway::upstream::conn::{AbortOnDrop, Link};
use hyper::header::HeaderValue;
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
