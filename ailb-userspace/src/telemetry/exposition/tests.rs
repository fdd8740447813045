use super::*;

#[test]
fn reads_names_with_colons_labels_and_specials() {
    let text = "# HELP vllm:num_requests_running Number of requests.\n\
                    # TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{model_name=\"a,b\",engine=\"0\"} 3.0\n\
                    \n\
                    x_total 1e3 1700000000000\n\
                    y{a=\"q\\\"uote\\\\\\n\",} NaN\n\
                    z +Inf\n";
    let s = parse(text).unwrap();
    assert_eq!(s.len(), 4);
    assert_eq!(s[0].name, "vllm:num_requests_running");
    assert_eq!(s[0].labels, vec![("model_name".into(), "a,b".into()), ("engine".into(), "0".into())]);
    assert_eq!(s[0].value, 3.0);
    assert_eq!(s[1].value, 1000.0);
    assert_eq!(s[2].labels[0].1, "q\"uote\\\n");
    assert!(s[2].value.is_nan());
    assert_eq!(s[3].value, f64::INFINITY);
}

#[test]
fn rejects_what_is_not_exposition_text() {
    for bad in [
        "<html><body>502 Bad Gateway</body></html>",
        "vllm:x{a=\"1\" 3",
        "vllm:x{a=1} 3",
        "vllm:x 3 4 5",
        "vllm:x abc",
        "vllm:x inf",
        "vllm:x",
        "1abc 3",
        "{\"running\": 3}",
        "vllm:x{a=\"unterminated} 3",
    ] {
        let e = parse(&format!("# ok\nfine 1\n{bad}\n")).unwrap_err();
        assert_eq!(e.line, 3, "{bad}: {e:?}");
    }
}

proptest::proptest! {
    #[test]
    fn never_panics(s in "\\PC*") {
        let _ = parse(&s);
    }
}
