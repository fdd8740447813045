use super::*;
use crate::config::Config;

const OK: &str = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n";

fn err(policy: &str) -> String {
    match Config::parse(&format!("[policy]\n{policy}\n{OK}"), "t").and_then(|c| c.validate()) {
        Ok(_) => panic!("[policy] {policy} should be rejected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_are_documented_values_and_valid() {
    let c = Config::parse(OK, "t").unwrap().validate().unwrap();
    assert_eq!(c.policy, PolicyConfig::default());
    assert_eq!(c.policy.min_weight_change, 0.1);
    assert_eq!((c.policy.util_low, c.policy.util_high, c.policy.util_hysteresis), (30.0, 70.0, 5.0));
    PolicyConfig::default().validate().unwrap();
}

#[test]
fn capability_table_parses_and_matches_case_insensitively() {
    let text = format!("[policy.gpu_capability]\n\"A100-80GB\" = 2.0\n\"RTX3090-24GB\" = 1.0\n{OK}");
    let c = Config::parse(&text, "t").unwrap().validate().unwrap();
    assert_eq!(c.policy.capability(" a100-80gb "), Some(2.0));
    assert_eq!(c.policy.capability("H100"), None);
}

#[test]
fn bad_values_name_the_field() {
    let cases = [
        ("min_weight_change = 1.0", "policy.min_weight_change"),
        ("min_weight_change = -0.1", "policy.min_weight_change"),
        ("load_scale = 0.0", "policy.load_scale"),
        ("queue_weight = -1.0", "policy.queue_weight"),
        ("util_high = 101.0", "policy.util_high"),
        ("util_low = 60.0\nutil_high = 65.0", "policy.util_high"),
        ("util_hysteresis = 40.0", "policy.util_high"),
        ("util_low = 2.0", "policy.util_hysteresis"),
        ("util_smoothing = 0.0", "policy.util_smoothing"),
        ("util_down_factor = 1.5", "policy.util_down_factor"),
        ("util_up_factor = 0.5", "policy.util_up_factor"),
        ("gpu_capability = { \"A100\" = 0.0 }", "policy.gpu_capability.\"A100\""),
        ("gpu_capability = { \"A100\" = 1.0, \"a100\" = 2.0 }", "same GPU type"),
        ("gpu_capability = { \" \" = 1.0 }", "must not be empty"),
        ("bogus = 1", "bogus"),
    ];
    for (policy, want) in cases {
        let e = err(policy);
        assert!(e.contains(want), "[policy] {policy}: error {e:?} should mention {want:?}");
    }
    let e = err("util_smoothing = nan");
    assert!(e.contains("policy.util_smoothing") && e.contains("NaN"), "{e}");
}
