use std::time::{Duration, Instant};

use super::*;

/// A wait ends at its own limit or at the request's deadline, whichever comes first, and says
/// which, so the error names the timeout that ran out.
#[tokio::test]
async fn a_wait_ends_by_the_request_deadline_when_that_comes_first() {
    let started = Instant::now();
    let deadline = Deadline::after(started, Duration::from_secs(10));
    let now = tokio::time::Instant::from_std(started);
    assert_eq!(deadline.within(now, Duration::from_secs(3)), (now + Duration::from_secs(3), false));
    assert_eq!(deadline.within(now + Duration::from_secs(8), Duration::from_secs(3)), (deadline.at, true));

    let soon = Deadline::after(Instant::now(), Duration::from_millis(20));
    let err = soon.bound(std::future::pending::<Result<(), ApiError>>()).await.unwrap_err();
    assert_eq!(err.status, hyper::StatusCode::GATEWAY_TIMEOUT);
    assert!(err.message.contains("gateway.total_timeout"), "{}", err.message);
    assert_eq!(soon.bound(async { Ok::<_, ApiError>(7) }).await.unwrap(), 7);
}
