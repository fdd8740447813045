//! When a request must be answered by ([`Deadline`]).

use std::future::Future;
use std::time::{Duration, Instant};

use super::ApiError;

/// When a request must be answered by: `gateway.total_timeout` after its head arrived.
///
/// Each wait of the request is bounded by it (reading a body, the admission, a connect, the
/// response head: [`Deadline::bound`], and the upstream side's `send`) rather than the whole request by one timer
/// around it: a wait that has a timer of its own anyway (the response head's idle timeout)
/// then needs no second one, and a request answered from a kept connection puts one timer in
/// the runtime's wheel, not two.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    pub at: tokio::time::Instant,
    /// `gateway.total_timeout`, for the error.
    pub total: Duration,
}

impl Deadline {
    /// The deadline of a request whose head arrived `started`.
    pub fn after(started: Instant, total: Duration) -> Self {
        Self { at: tokio::time::Instant::from_std(started) + total, total }
    }

    /// When the request's head arrived.
    pub fn started(&self) -> Instant {
        (self.at - self.total).into_std()
    }

    /// 504: the request ran past it.
    pub fn error(&self) -> ApiError {
        ApiError::timeout(format!("the request ran past {:?} (gateway.total_timeout)", self.total))
    }

    /// Runs `work` until the deadline at most.
    pub async fn bound<T>(self, work: impl Future<Output = Result<T, ApiError>>) -> Result<T, ApiError> {
        tokio::time::timeout_at(self.at, work).await.unwrap_or_else(|_| Err(self.error()))
    }

    /// The end of a wait of at most `wait` from `now`: the earlier of `now + wait` and the
    /// deadline, and whether it is the deadline.
    pub fn within(&self, now: tokio::time::Instant, wait: Duration) -> (tokio::time::Instant, bool) {
        let own = now + wait;
        if self.at < own {
            (self.at, true)
        } else {
            (own, false)
        }
    }
}

#[cfg(test)]
mod tests;
