use super::metric_value;

#[test]
fn reads_a_sample_with_or_without_labels() {
    let text = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_running_x 9\nplain 1.5\n";
    assert_eq!(metric_value(text, "vllm:num_requests_running"), Some(3.0));
    assert_eq!(metric_value(text, "plain"), Some(1.5));
    assert_eq!(metric_value(text, "vllm:num_requests_waiting"), None);
    assert_eq!(metric_value("a_b 2\n", "a"), None, "a longer name is another metric");
}
