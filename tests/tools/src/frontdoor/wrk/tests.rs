use super::*;

const OUTPUT: &str = "Running 5s test @ http://127.0.0.11:18001/v1/chat/completions
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.46ms  374.62us   6.99ms   84.43%
    Req/Sec    11.03k   586.45    11.94k    78.00%
  Latency Distribution
     50%    1.40ms
     75%    1.57ms
     90%    1.83ms
     99%    2.80ms
  54879 requests in 5.00s, 21.09MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 12
Requests/sec:  10975.34
Transfer/sec:      4.22MB
";

#[test]
fn reads_rate_percentiles_and_errors_from_the_latency_table() {
    let r = parse(OUTPUT).expect("parses");
    assert_eq!(r.requests, 54_879);
    assert!((r.rps - 10_975.34).abs() < 1e-9);
    assert_eq!((r.p50_us, r.p75_us, r.p90_us, r.p99_us), (1400.0, 1570.0, 1830.0, 2800.0));
    assert_eq!((r.non_2xx, r.socket_errors), (12, [0, 2, 0, 1]));
    assert_eq!(r.failure().as_deref(), Some("12 non-2xx/3xx responses, 3 socket errors (read 2, timeout 1)"));
}

#[test]
fn the_done_line_gives_exact_microseconds_and_counts() {
    let text = format!(
        "{OUTPUT}{DONE_TAG} requests=54880 non2xx=0 connect=0 read=0 write=0 timeout=0 p50_us=1398 \
             p75_us=1566 p90_us=1831 p99_us=2797\n"
    );
    let r = parse(&text).expect("parses");
    assert_eq!(r.requests, 54_880);
    assert_eq!((r.p50_us, r.p99_us), (1398.0, 2797.0));
    assert_eq!((r.non_2xx, r.socket_errors), (0, [0; 4]));
    assert_eq!(r.failure(), None);
}

#[test]
fn durations_in_every_unit_and_a_missing_rate() {
    assert_eq!(duration_us("374.62us"), Some(374.62));
    assert_eq!(duration_us("1.40ms"), Some(1400.0));
    assert_eq!(duration_us("2.00s"), Some(2e6));
    assert_eq!(duration_us("1.00m"), Some(60e6));
    assert_eq!(duration_us("12"), None);
    assert!(parse("Running 5s test\n").is_err());
    let none = parse("  0 requests in 5.00s, 0B read\nRequests/sec: 0.00\n").expect("parses");
    assert_eq!(none.failure().as_deref(), Some("no request completed"));
}

#[test]
fn the_script_posts_json_and_the_body_asks_for_one_token() {
    let s = script();
    assert!(s.contains("wrk.method = \"POST\""), "{s}");
    assert!(s.contains("wrk.headers[\"Content-Type\"] = \"application/json\""), "{s}");
    assert!(s.contains("function done(summary, latency, requests)"), "{s}");
    assert!(s.contains(&format!("wrk.headers[\"X-Session-ID\"] = \"{SESSION}\"")), "{s}");
    let v: serde_json::Value = serde_json::from_str(&body()).expect("the body is JSON");
    assert_eq!(v["max_tokens"], 1);
    assert_eq!(v["stream"], false);
    assert_eq!(v["model"], MODEL);
}
