use super::*;

/// A round at `rps` (saturated) whose closed loop answers at a third of `p50` and `p99`.
fn sample(rps: f64, p50: f64, p99: f64, cpu: Option<(f64, f64)>) -> Sample {
    let requests = (rps * 5.0) as u64;
    let (c50, c99) = (p50 / 3.0, p99 / 3.0);
    Sample {
        wrk: WrkRun { requests, rps, p50_us: p50, p99_us: p99, ..WrkRun::default() },
        closed: WrkRun { requests: 5_000, rps: 1e6 / c50, p50_us: c50, p99_us: c99, ..WrkRun::default() },
        failure: None,
        router_cpu: cpu.map(|(u, s)| CpuTime { user_s: u, sys_s: s }),
        server_cpu: Some(CpuTime { user_s: requests as f64 * 20e-6, sys_s: 0.0 }),
    }
}

fn path(name: &str, role: Role, samples: Vec<Sample>) -> PathResult {
    PathResult { name: name.into(), role, settings: format!("{name} settings"), samples, missing: None }
}

fn setup() -> Setup {
    Setup {
        date: "d".into(),
        machine: "m".into(),
        ailb: "a".into(),
        server: "s".into(),
        load: "l".into(),
        rounds: 3,
        reproduce: "r".into(),
    }
}

fn fixture() -> Vec<PathResult> {
    vec![
        path("direct", Role::Direct, vec![sample(10_000.0, 1000.0, 2000.0, None); 3]),
        path(
            "gateway",
            Role::Ailb,
            vec![
                sample(9_000.0, 1080.0, 2100.0, Some((0.5, 0.25))),
                sample(8_000.0, 1090.0, 2300.0, Some((0.5, 0.25))),
                sample(8_500.0, 1200.0, 2500.0, Some((0.5, 0.25))),
            ],
        ),
        path("nginx", Role::Peer, vec![sample(6_000.0, 1500.0, 3000.0, Some((0.5, 0.5))); 3]),
        path("vllm", Role::Peer, vec![sample(7_000.0, 1400.0, 2900.0, Some((1.0, 0.5))); 3]),
        PathResult {
            name: "sglang".into(),
            role: Role::Peer,
            settings: String::new(),
            samples: vec![],
            missing: Some("not installed".into()),
        },
    ]
}

#[test]
fn medians_ratios_and_added_latency_per_round() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0]), Some(2.5));
    assert_eq!(median(&[]), None);
    let (rows, fastest) = rows(&fixture());
    assert_eq!(fastest, Some(3), "vllm is the fastest peer");
    let gw = rows[1].as_ref().expect("gateway row");
    assert_eq!((gw.rps, gw.rps_min, gw.rps_max), (8_500.0, 8_000.0, 9_000.0));
    assert_eq!(gw.added_p50_us, Some(90.0));
    assert_eq!(gw.added_p99_us, Some(300.0));
    // The closed loop's medians and its own per-round differences.
    assert_eq!((gw.closed_p50_us, gw.closed_p99_us), (1090.0 / 3.0, 2300.0 / 3.0));
    assert!((gw.closed_added_p50_us.expect("closed p50") - 30.0).abs() < 1e-9);
    assert!((gw.closed_added_p99_us.expect("closed p99") - 100.0).abs() < 1e-9);
    assert!((gw.vs_direct - 0.85).abs() < 1e-9);
    assert!((gw.vs_fastest_peer.expect("peer") - 8_500.0 / 7_000.0).abs() < 1e-9);
    // 0.5 s user over 45,000 requests in the 9,000 req/s round, and so on: the median.
    let (u, s) = gw.router_us_per_req.expect("cpu");
    assert!((u - 0.5e6 / 42_500.0).abs() < 1e-6 && (s - 0.25e6 / 42_500.0).abs() < 1e-6, "{u} {s}");
    assert!((gw.server_us_per_req.expect("server") - 20.0).abs() < 1e-6);
    assert!(rows[0].as_ref().expect("direct").added_p50_us.is_none());
    assert!(rows[4].is_none());
}

#[test]
fn the_report_states_the_goals_as_measured() {
    let setup = Setup {
        date: "2026-12-01".into(),
        machine: "2 cores".into(),
        ailb: "/tmp/ailb".into(),
        server: "ailb-sim".into(),
        load: "wrk".into(),
        rounds: 3,
        reproduce: "`ailb-frontdoor-bench --focus`".into(),
    };
    let mut paths = fixture();
    let text = render(&setup, &paths, "## Where the time goes\n");
    assert!(text.contains("Reproduce: `ailb-frontdoor-bench --focus` (as root)."), "{text}");
    assert!(
        text.contains("| gateway | 8500 (8000-9000) | 1090 us | 2300 us | +90 us | +300 us | 0.85x | 1.21x |"),
        "{text}"
    );
    assert!(
        text.contains(
            "ahead of the fastest peer (vllm, 7000 req/s): met (8500 req/s, 1.21x; ahead in 3 of 3 rounds, median \
                 ratio of the rounds 1.21x; a coin gives 3 or more of 3 12 % of the time)"
        ),
        "{text}"
    );
    assert!(text.contains("under 100 us added at p50 (closed loop): met (+30 us; +90 us at 16 connections)"), "{text}");
    assert!(text.contains("| gateway | 2752 | 363 us | 767 us | +30 us | +100 us |"), "{text}");
    assert!(text.contains("| sglang | - |") && text.contains("not measured: not installed"), "{text}");
    assert!(text.ends_with("## Where the time goes\n"));
    // One failed round fails the row and its goals; a slower median misses the first.
    paths[1].samples[2].failure = Some("3 non-2xx/3xx responses".into());
    paths[1].samples[2].wrk.non_2xx = 3;
    paths[3].samples = vec![sample(9_500.0, 1400.0, 2900.0, None); 3];
    let text = render(&setup, &paths, "");
    assert!(text.contains("FAILED: round 3: 3 non-2xx/3xx responses"), "{text}");
    assert!(
        text.contains(
            "ahead of the fastest peer (vllm, 9500 req/s): NOT met (8500 req/s, 0.89x; ahead in 0 of 3 rounds, \
                 median ratio of the rounds 0.89x; a coin gives 0 or more of 3 100 % of the time) (but it had failed \
                 runs: not met)"
        ),
        "{text}"
    );
    assert!(text.contains("under 100 us added at p50 (closed loop): NOT met (+30 us"), "{text}");
}

#[test]
fn the_chance_of_as_many_rounds_ahead_is_a_sign_test() {
    let close = |won, of, want: f64| {
        let got = as_often_by_chance(won, of);
        assert!((got - want).abs() < 5e-5, "{won} of {of}: {got}, want {want}");
    };
    // Binomial tail sums, 1/2 each toss.
    close(0, 3, 1.0);
    close(3, 3, 0.125);
    close(2, 3, 0.5);
    close(12, 15, 0.017_578);
    close(9, 15, 0.303_619);
    close(24, 37, 0.049_437);
    close(0, 0, 1.0);
    close(1, 0, 0.0);
    assert!(as_often_by_chance(600, 1000) > 0.0 && as_often_by_chance(600, 1000) < 1e-9);
}

#[test]
fn ahead_by_the_medians_but_in_one_round_of_three_is_not_ahead() {
    let mut paths = fixture();
    let rounds = |rps: [f64; 3]| rps.map(|r| sample(r, 1100.0, 2200.0, Some((0.5, 0.25)))).to_vec();
    paths[1].samples = rounds([5_000.0, 6_500.0, 10_000.0]);
    paths[2].samples = rounds([5_000.0; 3]);
    paths[3].samples = rounds([6_000.0, 7_000.0, 1_000.0]);
    let (rows, fastest) = rows(&paths);
    assert_eq!(fastest, Some(3));
    let (won, of, ratio) = rows[1].as_ref().expect("gateway").vs_peer_rounds.expect("paired");
    assert_eq!((won, of), (1, 3));
    assert!((ratio - 6_500.0 / 7_000.0).abs() < 1e-9, "{ratio}");
    let text = render(&setup(), &paths, "");
    assert!(
        text.contains(
            "ahead of the fastest peer (vllm, 6000 req/s): NOT met (6500 req/s, 1.08x; ahead in 1 of 3 rounds, \
                 median ratio of the rounds 0.93x; a coin gives 1 or more of 3 88 % of the time)"
        ),
        "{text}"
    );
}

#[test]
fn a_reference_row_is_shown_and_not_judged() {
    let setup = setup();
    let mut paths = fixture();
    paths.push(path("outside", Role::Reference, vec![sample(9_500.0, 1050.0, 2050.0, Some((0.4, 0.2))); 3]));
    let (_, fastest) = rows(&paths);
    assert_eq!(fastest, Some(3), "a reference row is no peer");
    let text = render(&setup, &paths, "");
    assert!(text.contains("| outside | 9500 (9500-9500) |"), "{text}");
    assert!(!text.contains("- outside: ahead of the fastest peer"), "no goal line for it: {text}");
}

#[test]
fn a_relay_is_the_floor_not_a_peer() {
    let setup = setup();
    let mut paths = fixture();
    // Faster than every peer, and still not the fastest peer: it routes nothing.
    paths.push(path("relay", Role::Floor, vec![sample(9_900.0, 1030.0, 2050.0, Some((0.1, 0.2))); 3]));
    let (rows, fastest) = rows(&paths);
    assert_eq!(fastest, Some(3), "vllm stays the fastest peer");
    assert!((rows[5].as_ref().expect("relay").closed_added_p50_us.expect("added") - 10.0).abs() < 1e-9);
    let text = render(&setup, &paths, "");
    assert!(text.contains("(+30 us; +90 us at 16 connections); +20 us over the relay (+10 us)."), "{text}");
    assert!(text.contains("- The floor: the relay added +10 us at p50 (closed loop)"), "{text}");
    assert!(text.contains("The rest of a path's added latency is its own work."), "{text}");
    paths[5].samples = vec![sample(9_900.0, 1400.0, 2050.0, None); 3];
    let text = render(&setup, &paths, "");
    assert!(text.contains("It is over 100 us by itself, so no proxy could meet that goal in this run."), "{text}");
}
