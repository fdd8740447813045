//! Waiting for readiness by polling with a deadline, never by sleeping a fixed time: shared by
//! this crate's tests, the integration harness and the tools.

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_until_or(what, timeout, f, String::new)
}

/// [`wait_until`], whose panic also says what `details` tells at the timeout (the state that
/// was waited on, to see how far it got).
pub fn wait_until_or<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
    details: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            let details = details();
            let sep = if details.is_empty() { "" } else { ": " };
            panic!("timed out after {timeout:?} waiting for {what}{sep}{details}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests;
