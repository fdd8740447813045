use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex as StdMutex;

use super::*;

/// A fleet whose capacity and kernel count the test sets.
#[derive(Clone, Default)]
struct Fixed {
    capacity: Arc<StdMutex<Option<Capacity>>>,
    kernel_mb: Arc<AtomicU64>,
    /// Whether every member is at its `max_inflight` (the kernel would refuse a connect).
    at_caps: Arc<AtomicBool>,
}

impl Fleet for Fixed {
    fn capacity(&self, _model: &str) -> Result<Option<Capacity>, DatapathError> {
        Ok(self.capacity.lock().unwrap().clone())
    }
    fn inflight_mb(&self, _cap: &Capacity) -> Result<u64, DatapathError> {
        Ok(self.kernel_mb.load(Ordering::Acquire))
    }
    fn slot_free(&self, _cap: &Capacity) -> Result<bool, DatapathError> {
        Ok(!self.at_caps.load(Ordering::Acquire))
    }
}

fn cap(members: &[u64]) -> Option<Capacity> {
    Some(Capacity {
        ids: (0..members.len() as u32).collect(),
        caps: vec![0; members.len()],
        total_mb: members.iter().sum(),
        largest_mb: members.iter().copied().max().unwrap_or(0),
    })
}

fn limits(max_wait_ms: u64, max_queued: u32) -> FleetMemoryLimits {
    FleetMemoryLimits {
        factor: 1.0,
        max_wait: Duration::from_millis(max_wait_ms),
        max_queued,
        reserve: 0.0,
        retry_after: 2,
    }
}

fn gate(fleet: &Fixed, limits: FleetMemoryLimits) -> (Arc<FleetMemory>, Registry) {
    let mut registry = Registry::default();
    let f = FleetMemory::new(Box::new(fleet.clone()), limits, ["m"], &mut registry);
    (f, registry)
}

fn count(f: &FleetMemory, outcome: &'static str) -> u64 {
    f.metrics.decisions.get_or_create(&AdmissionLabel { model: "m".into(), outcome }).get()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn under_capacity_every_request_is_admitted_at_once() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[600, 400]);
    let (f, _r) = gate(&fleet, limits(50, 8));
    rt().block_on(async {
        let a = f.admit("m", Some(500)).await.unwrap().expect("a ticket");
        let b = f.admit("m", Some(500)).await.unwrap().expect("a ticket: 1000 MB fit the 1000 MB");
        assert_eq!(f.gates["m"].admitted_mb.load(Ordering::Acquire), 1000);
        drop((a, b));
        assert_eq!(f.gates["m"].admitted_mb.load(Ordering::Acquire), 0, "given back on drop");
        // Another model of the catalog without a capacity, and one not in it: not limited.
        assert!(f.admit("other", Some(1 << 20)).await.unwrap().is_none());
    });
    assert_eq!(count(&f, "admitted"), 2);
    assert_eq!(count(&f, "queued") + count(&f, "shed_wait") + count(&f, "shed_queue_full"), 0);
}

#[test]
fn past_capacity_a_request_waits_and_is_admitted_when_one_finishes() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[1000]);
    let (f, _r) = gate(&fleet, limits(5_000, 8));
    rt().block_on(async {
        let held = f.admit("m", Some(800)).await.unwrap().unwrap();
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.admit("m", Some(300)).await.map(|t| t.is_some()) });
        // Poll (with a deadline) until it is in the queue, then free the room.
        let until = Instant::now() + Duration::from_secs(5);
        while f.gates["m"].waiting.load(Ordering::Acquire) == 0 {
            assert!(Instant::now() < until, "the second request never queued");
            tokio::task::yield_now().await;
        }
        let freed_at = Instant::now();
        drop(held);
        assert_eq!(waiter.await.unwrap(), Ok(true));
        assert!(freed_at.elapsed() < Duration::from_secs(1), "woken by the finish, not by max_wait");
    });
    assert_eq!((count(&f, "admitted"), count(&f, "queued"), count(&f, "shed_wait")), (1, 1, 0));
}

#[test]
fn past_max_wait_the_answer_is_503_with_retry_after_and_the_numbers() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[600, 400]);
    // The socket ABI's connections hold 900 MB (the kernel's count); the front door none.
    fleet.kernel_mb.store(900, Ordering::Release);
    let (f, _r) = gate(&fleet, limits(80, 8));
    let started = std::time::Instant::now();
    let e = rt().block_on(f.admit("m", Some(200))).err().expect("shed");
    assert!(started.elapsed() >= Duration::from_millis(80), "it waited max_wait first");
    assert_eq!(e.status.as_u16(), 503);
    assert_eq!(e.retry_after, Some(2));
    assert_eq!(e.code, Some("model_overloaded"));
    for want in ["`m`", "900 MB", "1000 MB", "gateway.admission.max_wait"] {
        assert!(e.message.contains(want), "{want} in {}", e.message);
    }
    assert_eq!(f.gates["m"].waiting.load(Ordering::Acquire), 0, "it left the queue");
    assert_eq!(count(&f, "shed_wait"), 1);
    // A need larger than every member: no wait makes it fit, the kernel or a server says no.
    assert!(rt().block_on(f.admit("m", Some(700))).unwrap().is_some());
}

#[test]
fn the_factor_scales_the_limit_and_an_idle_model_admits_any_size() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[1000]);
    let mut l = limits(0, 8);
    l.factor = 1.5;
    let (f, _r) = gate(&fleet, l);
    rt().block_on(async {
        let a = f.admit("m", Some(900)).await.unwrap();
        let b = f.admit("m", Some(600)).await.unwrap();
        assert!(f.admit("m", Some(1)).await.is_err(), "1500 MB in flight: the limit");
        drop((a, b));
    });
    l = limits(0, 8);
    l.factor = 0.5;
    let (f, _r) = gate(&fleet, l);
    assert!(rt().block_on(f.admit("m", Some(900))).is_ok(), "nothing in flight: admitted above 0.5 x");
}

#[test]
fn a_full_queue_answers_429_at_once_and_waiters_go_first_come_first_served() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[1000]);
    let (f, _r) = gate(&fleet, limits(5_000, 2));
    rt().block_on(async {
        let held = f.admit("m", Some(1000)).await.unwrap().unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..2 {
            let (f2, order) = (f.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let t = f2.admit("m", Some(600)).await.unwrap().unwrap();
                order.lock().unwrap().push(i);
                // Hold it a moment so that the next one must wait for it.
                tokio::task::yield_now().await;
                drop(t);
            }));
            let until = Instant::now() + Duration::from_secs(5);
            while f.gates["m"].waiting.load(Ordering::Acquire) < i + 1 {
                assert!(Instant::now() < until, "waiter {i} never queued");
                tokio::task::yield_now().await;
            }
        }
        let started = std::time::Instant::now();
        let e = f.admit("m", Some(1)).await.err().expect("the queue is full");
        assert!(started.elapsed() < Duration::from_secs(1), "at once");
        assert_eq!((e.status.as_u16(), e.code, e.retry_after), (429, Some("admission_queue_full"), Some(2)));
        assert!(e.message.contains("gateway.admission.max_queued"), "{}", e.message);
        drop(held);
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1], "in the order they came");
    });
    assert_eq!((count(&f, "queued"), count(&f, "shed_queue_full")), (2, 1));
}

#[test]
fn the_larger_of_the_kernels_count_and_the_front_doors_own_is_in_flight() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[1000]);
    let (f, _r) = gate(&fleet, limits(0, 8));
    rt().block_on(async {
        // Admitted but not yet connected: the kernel does not count it yet.
        let _a = f.admit("m", Some(700)).await.unwrap();
        assert!(f.admit("m", Some(400)).await.is_err(), "the front door's own 700 MB count");
        fleet.kernel_mb.store(100, Ordering::Release);
        assert!(f.admit("m", Some(300)).await.is_ok(), "700 (own) + 300 fit");
        fleet.kernel_mb.store(1001, Ordering::Release);
        assert!(f.admit("m", Some(0)).await.is_err(), "the kernel's 1001 MB are over, even for no need");
    });
    // The capacity changes at the next refresh.
    *fleet.capacity.lock().unwrap() = None;
    f.refresh();
    assert!(rt().block_on(f.admit("m", Some(5000))).is_ok(), "no capacity known: not limited");
}

#[test]
fn the_front_door_keeps_its_reserve_while_the_socket_abi_holds_the_memory() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[600, 400]);
    // The socket ABI's connections hold 1500 MB of the 1000 MB (the kernel's count), and go on
    // holding it: without a reserve the front door would wait out max_wait for every request.
    fleet.kernel_mb.store(1500, Ordering::Release);
    let mut l = limits(0, 8);
    l.reserve = 0.5;
    let (f, _r) = gate(&fleet, l);
    rt().block_on(async {
        let a = f.admit("m", Some(300)).await.expect("300 MB of the 500 MB reserve").unwrap();
        let b = f.admit("m", Some(200)).await.expect("500 MB: the reserve's end").unwrap();
        let e = f.admit("m", Some(1)).await.err().expect("past the reserve: the ABI's memory counts again");
        assert_eq!((e.status.as_u16(), e.code), (503, Some("model_overloaded")));
        assert!(e.message.contains("1500 MB") && e.message.contains("1000 MB"), "{}", e.message);
        drop(a);
        assert!(f.admit("m", Some(300)).await.is_ok(), "a finished request gives its share back");
        drop(b);
    });
    assert_eq!((count(&f, "admitted"), count(&f, "shed_wait")), (3, 1));
    // Without a reserve (`reserve = 0`) the same request waits and is shed.
    let (f, _r) = gate(&fleet, limits(0, 8));
    assert!(rt().block_on(f.admit("m", Some(300))).is_err(), "no reserve: the ABI's 1500 MB leave no room");
}

#[test]
fn with_every_member_at_its_cap_a_request_waits_for_a_slot() {
    let fleet = Fixed::default();
    *fleet.capacity.lock().unwrap() = cap(&[1000]);
    fleet.at_caps.store(true, Ordering::Release);
    let (f, _r) = gate(&fleet, limits(5_000, 8));
    rt().block_on(async {
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.admit("m", Some(100)).await.map(|t| t.is_some()) });
        let until = Instant::now() + Duration::from_secs(5);
        while f.gates["m"].waiting.load(Ordering::Acquire) == 0 {
            assert!(Instant::now() < until, "the request never waited: the memory fits, the slots do not");
            tokio::task::yield_now().await;
        }
        let freed_at = Instant::now();
        fleet.at_caps.store(false, Ordering::Release);
        assert_eq!(waiter.await.unwrap(), Ok(true));
        assert!(freed_at.elapsed() < Duration::from_secs(1), "taken at the next look, not after max_wait");
    });
    assert_eq!((count(&f, "admitted"), count(&f, "queued")), (0, 1));
    // Still at the caps after max_wait: 503 naming the caps.
    fleet.at_caps.store(true, Ordering::Release);
    let (f, _r) = gate(&fleet, limits(30, 8));
    let e = rt().block_on(f.admit("m", Some(100))).err().expect("shed");
    assert_eq!((e.status.as_u16(), e.code, e.retry_after), (503, Some("model_overloaded"), Some(2)));
    assert!(e.message.contains("max_inflight") && e.message.contains("`m`"), "{}", e.message);
}
