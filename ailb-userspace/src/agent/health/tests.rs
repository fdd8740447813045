use super::*;

fn healthy(running: f64) -> ServerSample {
    ServerSample { healthy: true, running: Some(running), ..ServerSample::default() }
}

fn timed_out() -> ServerSample {
    ServerSample { healthy: false, timed_out: true, ..ServerSample::default() }
}

#[test]
fn timeouts_below_the_threshold_keep_the_last_healthy_sample() {
    let mut g = HealthGate::default();
    assert_eq!(g.filter(healthy(3.0), 3, "i"), healthy(3.0));
    assert_eq!(g.filter(timed_out(), 3, "i"), healthy(3.0));
    assert_eq!(g.filter(timed_out(), 3, "i"), healthy(3.0));
    assert_eq!(g.filter(timed_out(), 3, "i"), timed_out(), "the third timeout in a row");
    assert_eq!(g.filter(timed_out(), 3, "i"), timed_out(), "and every one after");
    assert_eq!(g.filter(healthy(1.0), 3, "i"), healthy(1.0), "one answer is healthy again");
    assert_eq!(g.filter(timed_out(), 3, "i"), healthy(1.0), "and starts the count afresh");
}

#[test]
fn a_refusal_or_an_error_answer_is_unhealthy_at_once() {
    let refused = ServerSample { healthy: false, ..ServerSample::default() };
    let mut g = HealthGate::default();
    g.filter(healthy(3.0), 3, "i");
    assert_eq!(g.filter(refused.clone(), 3, "i"), refused);
    assert_eq!(g.filter(timed_out(), 3, "i"), timed_out(), "no healthy sample since the refusal");
}

#[test]
fn a_threshold_of_one_acts_on_the_first_timeout_and_none_before_a_healthy_sample() {
    let mut g = HealthGate::default();
    assert_eq!(g.filter(timed_out(), 3, "i"), timed_out(), "never healthy yet");
    g.filter(healthy(2.0), 1, "i");
    assert_eq!(g.filter(timed_out(), 1, "i"), timed_out());
}
