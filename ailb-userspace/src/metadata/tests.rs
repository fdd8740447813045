use super::*;

fn meta(pairs: &[(&str, &str)]) -> Metadata {
    Metadata::parse(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn numbers_accept_spaces_units_and_exponents() {
    let cases: &[(&str, &[&str], Option<f64>)] = &[
        ("12", &[], Some(12.0)),
        (" 12.5 ", &[], Some(12.5)),
        ("1e3", &[], Some(1000.0)),
        ("12GB", &["gib", "gb"], Some(12.0)),
        ("12 gib", &["gib", "gb"], Some(12.0)),
        ("85%", &["%"], Some(85.0)),
        ("12MB", &["gib", "gb"], None),
        ("GB", &["gib", "gb"], None),
        ("NaN", &[], None),
        ("inf", &[], None),
        ("-inf", &[], None),
        ("", &[], None),
        ("1,000", &[], None),
        ("１２", &[], None),
        ("12é", &["gb"], None),
    ];
    for (raw, units, want) in cases {
        assert_eq!(parse_number(raw, units).ok(), *want, "{raw:?} with units {units:?}");
    }
}

#[test]
fn memory_prefers_mb_and_converts_gb_in_binary_units() {
    let m = meta(&[("remaining_memory", "12"), ("remaining_memory_mb", "100")]);
    assert_eq!((m.free_memory_mb, m.free_memory_key), (Field::Valid(100), keys::REMAINING_MEMORY_MB));
    let m = meta(&[("remaining_memory", "8.5GB")]);
    assert_eq!((m.free_memory_mb, m.free_memory_key), (Field::Valid(8704), keys::REMAINING_MEMORY));
    // An invalid `_mb` is not silently replaced by the GB key.
    let m = meta(&[("remaining_memory", "12"), ("remaining_memory_mb", "lots")]);
    assert!(matches!(m.free_memory_mb, Field::Invalid { .. }));
    for bad in ["-1", "nan", "11 TiB", "20000000", "1e400"] {
        let m = meta(&[("remaining_memory_mb", bad)]);
        assert!(matches!(m.free_memory_mb, Field::Invalid { .. }), "{bad:?}");
    }
}

#[test]
fn ranges_and_whole_numbers() {
    let m = meta(&[
        ("gpu_util", "100.5"),
        ("current_requests", "2.5"),
        ("queue_length", "-1"),
        ("max_inflight", "8.5"),
        ("kv_cache_usage", "0.9"),
        ("updated_at_ms", "1700000000000"),
    ]);
    assert!(matches!(m.signal(&signals::GPU_UTIL), Field::Invalid { .. }));
    assert_eq!(*m.signal(&signals::CURRENT_REQUESTS), Field::Valid(2.5), "averaged counts are fine");
    assert!(matches!(m.signal(&signals::QUEUE_LENGTH), Field::Invalid { .. }));
    assert!(matches!(m.max_inflight, Field::Invalid { .. }));
    assert_eq!(*m.signal(&signals::KV_CACHE_USAGE), Field::Valid(0.9));
    assert_eq!(m.updated_at_ms, Field::Valid(1_700_000_000_000));
}

#[test]
fn text_lists_and_health() {
    let m = meta(&[
        ("model_id", "  qwen-7b "),
        ("supported_models", "a, b,,c "),
        ("model_version", "\u{7}"),
        ("health_status", " Healthy"),
    ]);
    assert_eq!(m.model_id, Field::Valid("qwen-7b".to_string()));
    assert_eq!(m.supported_models, Field::Valid(vec!["a".into(), "b".into(), "c".into()]));
    assert!(matches!(m.model_version, Field::Invalid { .. }));
    assert_eq!(m.health_status, Field::Valid(HealthStatus::Healthy));
    for (raw, want) in [("DRAINING", HealthStatus::Draining), ("degraded", HealthStatus::NotHealthy)] {
        assert_eq!(meta(&[("health_status", raw)]).health_status, Field::Valid(want));
    }
    assert!(matches!(meta(&[("supported_models", " , ,")]).supported_models, Field::Invalid { .. }));
}

#[test]
fn the_policy_reads_what_the_agent_writes() {
    // GB is rounded down: 12.49 GB free must not read as 12.5 GB.
    assert_eq!(format_gb(12_790), "12.4");
    assert_eq!(format_gb(0), "0.0");
    assert_eq!(format_number(2.5), "2.5");
    assert_eq!(format_number(1.0 / 3.0), "0.333");
    // What the agent writes parses back to what it measured (GB: never more).
    for mb in [0u64, 1, 1023, 1024, 12_790, 81_920, 10 * 1024 * 1024] {
        let m = meta(&[("remaining_memory", &format_gb(mb))]);
        let read = *m.free_memory_mb.valid().expect("valid") as u64;
        assert!(read <= mb && mb - read < 103, "{mb} MiB -> {:?} -> {read}", format_gb(mb));
    }
    for v in [0.0, 3.0, 2.5, 40.125, 99.999, 1e6] {
        let m = meta(&[("current_requests", &format_number(v))]);
        assert!((m.signal(&signals::CURRENT_REQUESTS).valid().unwrap() - v).abs() < 1e-3, "{v}");
    }
}

#[test]
fn declared_values_are_typed_as_their_string_form_would_parse() {
    let cases = [
        Declared { model_id: "m", gpu_type: Some("A100-80GB"), free_memory_mb: Some(80_000), max_inflight: Some(8) },
        Declared { model_id: " m ", gpu_type: None, free_memory_mb: None, max_inflight: None },
        Declared {
            model_id: "",
            gpu_type: Some("\u{7}"),
            free_memory_mb: Some(20_000_000),
            max_inflight: Some(2_000_000),
        },
        Declared { model_id: "m", gpu_type: Some(" "), free_memory_mb: Some(0), max_inflight: Some(1_000_000) },
    ];
    for d in cases {
        let i = InstanceMetadata::declared(d);
        assert_eq!(i.contract(), &Metadata::parse(i.raw()), "{d:?}");
    }
    let i = InstanceMetadata::declared(cases[0]);
    assert_eq!(i.contract().free_memory_mb, Field::Valid(80_000));
    assert_eq!(i.contract().free_memory_key, keys::REMAINING_MEMORY_MB);
    assert_eq!(i[keys::REMAINING_MEMORY_MB], "80000", "shown as the registry would carry it");
    assert!(matches!(InstanceMetadata::declared(cases[2]).contract().free_memory_mb, Field::Invalid { .. }));
}

#[test]
fn long_values_are_shortened_on_a_char_boundary() {
    let raw = "é".repeat(1000);
    match meta(&[("gpu_util", &raw)]).signals[signals::GPU_UTIL.id].clone() {
        Field::Invalid { raw, .. } => assert_eq!(raw.chars().count(), MAX_SHOWN_CHARS + 1),
        other => panic!("{other:?}"),
    }
}

/// The KV-event keys are read together; any bad one makes the whole invalid, its key named.
#[test]
fn kv_event_keys() {
    let ok = meta(&[
        ("kv_events_endpoint", " tcp://10.0.0.7:5557 "),
        ("kv_events_replay", "tcp://10.0.0.7:5558"),
        ("kv_block_size", "128"),
    ]);
    let Field::Valid(source) = &ok.kv_events else { panic!("{:?}", ok.kv_events) };
    assert_eq!(
        (source.endpoint.as_str(), source.replay.as_deref()),
        ("tcp://10.0.0.7:5557", Some("tcp://10.0.0.7:5558"))
    );
    assert_eq!(source.block_size.get(), 128);
    assert_eq!(meta(&[("kv_block_size", "16")]).kv_events, Field::Absent);
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("kv_events_endpoint", "tcp://*:5557"), ("kv_block_size", "16")], "kv_events_endpoint: a wildcard"),
        (&[("kv_events_endpoint", "tcp://10.0.0.7:5557")], "kv_block_size is required"),
        (
            &[("kv_events_endpoint", "tcp://10.0.0.7:5557"), ("kv_block_size", "16.5")],
            "kv_block_size: is not a whole number",
        ),
        (
            &[("kv_events_endpoint", "tcp://10.0.0.7:5557"), ("kv_block_size", "0")],
            "kv_block_size: expected a block size",
        ),
        (
            &[("kv_events_endpoint", "tcp://10.0.0.7:5557"), ("kv_events_replay", "5558"), ("kv_block_size", "16")],
            "kv_events_replay: expected tcp://",
        ),
    ];
    for (pairs, want) in cases {
        match meta(pairs).kv_events {
            Field::Invalid { reason, .. } => assert!(reason.contains(want), "{pairs:?}: {reason}"),
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
}
