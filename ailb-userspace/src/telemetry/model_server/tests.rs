use super::{exposition, read, ServerKind};

fn scrape(kind: ServerKind, text: &str) -> super::ServerSample {
    read(&exposition::parse(text).expect("exposition text"), &kind.names(), true)
}

#[test]
fn prefix_cache_counters_and_gauges_are_read_as_each_server_exports_them() {
    // vLLM 0.32: counters, one label set per engine and model: summed.
    let vllm = "# TYPE vllm:prefix_cache_queries counter\n\
                    vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 6000.0\n\
                    vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 1000.0\n\
                    # TYPE vllm:prefix_cache_hits counter\n\
                    vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 2944.0\n\
                    vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 56.0\n";
    let s = scrape(ServerKind::Vllm, vllm);
    assert_eq!((s.prefix_cache_counters, s.prefix_cache_hit_rate), (Some((3000.0, 7000.0)), None));
    // One counter without the other: not read.
    let s = scrape(ServerKind::Vllm, "vllm:prefix_cache_hits_total 5\n");
    assert_eq!(s.prefix_cache_counters, None);
    // SGLang: a gauge already in 0..1.
    let s = scrape(ServerKind::Sglang, "sglang:cache_hit_rate{model_name=\"m\"} 0.75\n");
    assert_eq!((s.prefix_cache_counters, s.prefix_cache_hit_rate), (None, Some(0.75)));
    // A custom server names no prefix cache.
    let custom = ServerKind::Custom { running: "r".into(), waiting: "w".into(), kv_cache_usage: None };
    let s = scrape(custom, vllm);
    assert_eq!((s.prefix_cache_counters, s.prefix_cache_hit_rate), (None, None));
}
