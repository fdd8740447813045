use super::*;

/// A sample at `t_s` with nothing read.
fn blank(t_s: f64) -> Sample {
    Sample {
        t_s,
        inflight_before: None,
        inflight_after: None,
        open: 0,
        open_tc: None,
        tries: 1,
        live: None,
        tables: None,
        inflight_by_backend: Default::default(),
        procs: Vec::new(),
    }
}

fn rec(conv: &str, sent_s: f64, backend: &str) -> Rec {
    Rec {
        entry: Entry::Abi,
        conversation: conv.into(),
        sent_s,
        end_s: sent_s + 1.0,
        ok: true,
        status: Some(200),
        error: None,
        backend: Some(backend.into()),
        e2e_ms: 1000.0,
        late_ms: 0.0,
        retry_after: None,
    }
}

#[test]
fn continuity_compares_the_last_turn_before_with_the_first_after() {
    let recs = [
        rec("a", 1.0, "x"),
        rec("a", 4.0, "y"),
        rec("a", 6.0, "y"),
        rec("a", 7.0, "z"),
        rec("b", 4.5, "x"),
        rec("b", 5.5, "z"),
        rec("c", 9.0, "x"),
    ];
    let c = continuity(&recs, Entry::Abi, 5.0, 3.0);
    assert_eq!((c.conversations, c.kept), (2, 1));
}

#[test]
fn the_fds_criterion_is_their_floor_and_the_rss_median() {
    let sample = |t_s: f64, rss_kb: u64, fds: u64| Sample {
        procs: vec![super::super::sample::ProcSample { role: "gateway".into(), rss_kb, fds }],
        ..blank(t_s)
    };
    // Busy at the start (49 fds, floor 20), back near idle at the end (43, floor 20).
    let busy: Vec<Sample> = (0..100)
        .map(|i| {
            sample(
                i as f64,
                1000,
                if i % 5 == 0 {
                    20
                } else if i < 50 {
                    49
                } else {
                    43
                },
            )
        })
        .collect();
    let g = &growth(&busy, 0.0)[0];
    assert_eq!((g.fds_start, g.fds_end, g.fds_floor_start, g.fds_floor_end), (49, 43, 20, 20));
    assert!(g.fds_pct() < -10.0 && g.flat(10.0), "a fall back towards idle is no growth: {g:?}");
    // Busier at the start than anywhere later: the floor falls too, and that is no growth.
    let falls: Vec<Sample> = (0..100).map(|i| sample(i as f64, 1000, if i < 10 { 34 } else { 16 })).collect();
    let g = &growth(&falls, 0.0)[0];
    assert!(g.fds_floor_pct() < -10.0 && g.flat(10.0), "{g:?}");
    // A leak raises the floor.
    let leak: Vec<Sample> = (0..100).map(|i| sample(i as f64, 1000, 20 + i / 10)).collect();
    assert!(!growth(&leak, 0.0)[0].flat(10.0));
    // RSS growth fails it whatever the fds do.
    let rss: Vec<Sample> = (0..100).map(|i| sample(i as f64, 1000 + 5 * i, 20)).collect();
    assert!(!growth(&rss, 0.0)[0].flat(10.0));
}

#[test]
fn table_moves_count_changes_away_from_the_cut() {
    let sample = |t_s: f64, d: &str| Sample { tables: Some(d.into()), ..blank(t_s) };
    // a b a before the cut at 10; c inside (10, 14]; a after: seen before.
    let s = [
        sample(2.0, "a"),
        sample(4.0, "b"),
        sample(6.0, "a"),
        sample(10.0, "a"),
        sample(12.0, "c"),
        sample(16.0, "a"),
        sample(18.0, "a"),
    ];
    let m = table_moves(&s, 10.0, 4.0);
    assert_eq!((m.changes, m.after_seen_before), (2, Some(true)), "{m:?}");
    let mut s = s.to_vec();
    s[5] = sample(16.0, "d");
    s[6] = sample(18.0, "d");
    assert_eq!(table_moves(&s, 10.0, 4.0).after_seen_before, Some(false));
}

#[test]
fn a_failure_in_flight_at_a_server_kill_met_a_dead_server() {
    let ev = Event {
        fault: Fault::SimKill,
        start_s: 10.0,
        end_s: 20.0,
        recovered_s: Some(21.0),
        backend: Some("s".into()),
        gone_s: Some(10.5),
        picks_kept: None,
        affinity: None,
        detail: String::new(),
    };
    let mut r = rec("a", 9.5, "t");
    r.ok = false;
    assert_eq!(classify(&r, std::slice::from_ref(&ev)), Class::DeadServer);
    r.sent_s = 13.0;
    r.end_s = 13.1;
    assert_eq!(classify(&r, std::slice::from_ref(&ev)), Class::Avoidable);
    r.backend = Some("s".into());
    assert_eq!(classify(&r, &[ev]), Class::DeadServer);
}
