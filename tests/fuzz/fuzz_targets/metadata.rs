//! The instance metadata contract: one `key=value` pair a line (lossy UTF-8) -> the string map a
//! registry reports -> `InstanceMetadata::parse`. Besides no panic: the map is kept as given,
//! every valid value is in its documented range, and an invalid raw value is shortened for display.
#![no_main]

use std::collections::BTreeMap;

use ailb_userspace::metadata::{
    signals::{CURRENT_REQUESTS, GPU_UTIL, KV_CACHE_USAGE, PREFIX_CACHE_HIT_RATE, QUEUE_LENGTH},
    Field, InstanceMetadata, Metadata, MAX_MEMORY_MB, MAX_REQUESTS, MAX_SHOWN_CHARS,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let map: BTreeMap<String, String> =
        text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let m = InstanceMetadata::parse(map.clone());
    assert_eq!(m.raw(), &map);
    let c = m.contract();
    assert_eq!(c, &Metadata::parse(&map));

    in_range(c.signal(&GPU_UTIL), 0.0, 100.0);
    in_range(c.signal(&KV_CACHE_USAGE), 0.0, 1.0);
    in_range(c.signal(&PREFIX_CACHE_HIT_RATE), 0.0, 1.0);
    in_range(c.signal(&CURRENT_REQUESTS), 0.0, MAX_REQUESTS);
    in_range(c.signal(&QUEUE_LENGTH), 0.0, MAX_REQUESTS);
    for f in [&c.free_memory_mb, &c.gpu_memory_total_mb] {
        assert!(f.valid().is_none_or(|&v| f64::from(v) <= MAX_MEMORY_MB), "{f:?}");
    }
    assert!(c.max_inflight.valid().is_none_or(|&v| f64::from(v) <= MAX_REQUESTS));
    assert!(c.updated_at_ms.valid().is_none_or(|&v| v <= 1 << 53));
    for f in [&c.model_id, &c.model_version, &c.gpu_type, &c.agent_version] {
        assert!(f.valid().is_none_or(|s| !s.is_empty() && !s.chars().any(char::is_control)), "{f:?}");
        shown(f);
    }
    for f in [&c.supported_models, &c.supported_tasks] {
        assert!(f.valid().is_none_or(|l| !l.is_empty() && l.iter().all(|s| !s.is_empty())), "{f:?}");
        shown(f);
    }
    shown(&c.free_memory_mb);
    shown(&c.health_status);
});

fn in_range(f: &Field<f64>, lo: f64, hi: f64) {
    assert!(f.valid().is_none_or(|v| (lo..=hi).contains(v)), "{f:?} outside {lo}..={hi}");
    shown(f);
}

/// An invalid value keeps at most `MAX_SHOWN_CHARS` characters of the raw text (and an ellipsis).
fn shown<T: std::fmt::Debug>(f: &Field<T>) {
    if let Field::Invalid { raw, .. } = f {
        assert!(raw.chars().count() <= MAX_SHOWN_CHARS + 1, "{f:?}");
    }
}
