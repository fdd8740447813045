use super::*;

#[test]
fn metric_sum_adds_every_label_set_and_ignores_longer_names() {
    let text =
        "# HELP x\nvllm:hits_total{engine=\"0\"} 3\nvllm:hits_total{engine=\"1\"} 4.5\nvllm:hits_total_created 9\n";
    assert_eq!(metric_sum(text, "vllm:hits_total"), Some(7.5));
    assert_eq!(metric_sum(text, "vllm:missing"), None);
    assert_eq!(metric_sum("plain 2\n", "plain"), Some(2.0));
}

#[test]
fn filler_is_deterministic_and_differs_by_seed() {
    assert_eq!(filler(1, 50), filler(1, 50));
    assert_ne!(filler(1, 50), filler(2, 50));
    assert_eq!(filler(4, 300).split_whitespace().count(), 300);
}
