use super::*;
use crate::discovery::Instance;

fn fleet(n: u8) -> Snapshot {
    let instances = (1..=n)
        .map(|i| Instance {
            model: "m".into(),
            service: "m".into(),
            group: "DEFAULT_GROUP".into(),
            cluster: "DEFAULT".into(),
            address: std::net::SocketAddr::new([10, 0, 0, i].into(), 8000),
            weight: 1.0,
            healthy: true,
            enabled: true,
            metadata: Default::default(),
        })
        .collect();
    Snapshot { instances, services: Vec::new() }
}

#[test]
fn changes_apply_at_once_except_right_after_an_outage() {
    let (one, three) = (fleet(1), fleet(3));
    let mut s = Settle::default();
    assert_eq!(s.answered(Some(&one), &one), Verdict::Same);
    assert_eq!(s.answered(Some(&one), &three), Verdict::Apply, "no outage: a change applies at once");
    // Outage, then a stale answer, then the real fleet again: nothing is written.
    s.failed();
    assert_eq!(s.answered(Some(&one), &three), Verdict::Hold);
    assert_eq!(s.answered(Some(&one), &one), Verdict::Same);
    assert_eq!(s.answered(Some(&one), &three), Verdict::Apply, "settled: the next change applies at once");
    // Outage, then a change that the next read confirms: applied on the second read.
    s.failed();
    assert_eq!(s.answered(Some(&one), &three), Verdict::Hold);
    assert_eq!(s.answered(Some(&one), &three), Verdict::Apply);
    // A change that keeps changing after an outage waits for two equal reads in a row.
    s.failed();
    assert_eq!(s.answered(Some(&one), &three), Verdict::Hold);
    assert_eq!(s.answered(Some(&one), &fleet(2)), Verdict::Hold);
    assert_eq!(s.answered(Some(&one), &fleet(2)), Verdict::Apply);
}
