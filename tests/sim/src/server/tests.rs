use super::*;
use futures_util::FutureExt;

#[tokio::test]
async fn a_deadline_already_passed_is_not_waited_for() {
    // tokio would round it up to its next millisecond tick and answer Pending here.
    assert!(wait_until(Instant::now()).now_or_never().is_some());
    assert!(wait_until(Instant::now() - Duration::from_millis(5)).now_or_never().is_some());
    let ahead = Instant::now() + Duration::from_millis(20);
    assert!(wait_until(ahead).now_or_never().is_none(), "a deadline ahead is still waited for");
    wait_until(ahead).await;
    assert!(Instant::now() >= ahead);
}
