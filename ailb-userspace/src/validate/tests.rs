use super::*;

#[test]
fn durations_parse_and_errors_name_field_and_value() {
    assert_eq!(parse_duration("f", "250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("f", "30m").unwrap(), Duration::from_secs(1800));
    let e = parse_duration("balancer.affinity_ttl", "soon").unwrap_err().to_string();
    assert!(e.starts_with("config: field `balancer.affinity_ttl`: invalid value \"soon\": expected a duration"), "{e}");
}
