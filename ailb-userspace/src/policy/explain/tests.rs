use super::{num, Reason};

/// The structured lines print as the text the policy wrote before, go to JSON as strings
/// and read back as text equal to them.
#[test]
fn reasons_print_as_their_lines_and_round_trip_as_strings() {
    let model: std::sync::Arc<str> = "llama \"3\"".into();
    let reasons =
        vec![Reason::Serves(model.clone()), Reason::OwnCluster("east".into()), Reason::Fixed("health_status: healthy")];
    let lines: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    assert_eq!(lines, [r#"model: serves "llama \"3\"""#, r#"cluster: own cluster "east""#, "health_status: healthy"]);
    let json = serde_json::to_string(&reasons).unwrap();
    assert_eq!(json, serde_json::to_string(&lines).unwrap());
    let back: Vec<Reason> = serde_json::from_str(&json).unwrap();
    assert!(back.iter().all(|r| matches!(r, Reason::Text(_))));
    assert_eq!(back, reasons);
    assert_ne!(Reason::Serves(model), Reason::Text("model: serves \"qwen\"".into()));
    assert!(reasons[0].starts_with("model: serves") && reasons[1].contains("east"));
}

#[test]
fn numbers_are_short() {
    assert_eq!(num(2.0), "2");
    assert_eq!(num(1.0 / 3.0), "0.333");
    assert_eq!(num(1.25), "1.25");
    assert_eq!(num(-0.0001), "0");
    assert_eq!(num(f64::NAN), "NaN");
    assert_eq!(num(-2.5), "-2.5");
    assert_eq!(num(0.05), "0.05");
    assert_eq!(num(1e12), "1000000000000");
}

#[test]
fn the_fast_path_formats_as_the_exact_one() {
    let exact = |v: f64| {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.').to_string();
        if s == "-0" {
            "0".to_string()
        } else {
            s
        }
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..200_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Values like the policy's (factors, percentages, counts) and ties at .0005.
        let v = match i % 4 {
            0 => (x % 2_000_000) as f64 / 1000.0 - 1000.0,
            1 => (x % 1_000_000) as f64 / 7919.0,
            2 => (x % 100_000) as f64 / 10_000.0 + 0.0005,
            _ => f64::from_bits(x >> 2) % 1e7,
        };
        assert_eq!(num(v), exact(v), "{v:e}");
    }
}
