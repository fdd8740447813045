use super::*;

const TEXT: &str = "# HELP ailb_backend_weight x\n# TYPE ailb_backend_weight gauge\n\
        ailb_backend_weight{model=\"m\",backend=\"127.0.10.1:9000\"} 1000\n\
        ailb_backend_weight{model=\"m\",backend=\"127.0.10.2:9000\"} 333\n\
        # TYPE ailb_table_rebuilds counter\nailb_table_rebuilds_total{model=\"m\"} 7\n\
        ailb_table_rebuilds_total{model=\"n\"} 2\nailb_applies_total 40\n";

#[test]
fn reads_weights_and_rebuilds() {
    let s = parse(TEXT);
    assert_eq!(s.weights["127.0.10.1:9000"], 1000.0);
    assert_eq!(s.weights["127.0.10.2:9000"], 333.0);
    assert_eq!(s.rebuilds, 9.0);
}

#[test]
fn counts_changes_and_rebuilds_per_minute() {
    let at = |w1: f64, w2: f64, r: f64| WeightSample {
        weights: [("a".to_string(), w1), ("b".to_string(), w2)].into_iter().collect(),
        rebuilds: r,
    };
    let samples = [at(1000.0, 500.0, 3.0), at(667.0, 500.0, 4.0), at(1000.0, 500.0, 5.0), at(1000.0, 500.0, 5.0)];
    let s = WeightStats::of(&samples, 30.0).unwrap();
    assert_eq!(s.rebuilds, 2.0);
    assert_eq!(s.rebuilds_per_min, 4.0);
    assert_eq!((s.backends["a"].changes, s.backends["a"].min, s.backends["a"].max), (2, 667.0, 1000.0));
    assert_eq!(s.backends["b"].changes, 0);
    assert_eq!(s.changes(), (1.0, 2));
    assert_eq!(WeightStats::of(&samples[..1], 30.0), None);
}

#[test]
fn the_prefix_counters_are_summed_over_models_without_their_suffix() {
    let text = "# HELP ailb_prefix_lookups x\n# TYPE ailb_prefix_lookups counter\n\
                ailb_prefix_lookups_total{model=\"a\"} 10\nailb_prefix_lookups_total{model=\"b\"} 5\n\
                ailb_prefix_used_total{model=\"a\"} 7\nailb_prefix_entries{model=\"a\"} 300\n\
                ailb_backend_weight{backend=\"x\"} 1\n";
    let c = parse_prefix(text);
    assert_eq!(c.get("lookups"), Some(&15.0));
    assert_eq!(c.get("used"), Some(&7.0));
    assert_eq!(c.get("entries"), Some(&300.0));
    assert_eq!(c.len(), 3, "{c:?}");
}
