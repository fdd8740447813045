//! Waiting for readiness by polling with a deadline, never by sleeping a fixed time: shared by
//! this crate's tests, the integration harness and the tools.

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
