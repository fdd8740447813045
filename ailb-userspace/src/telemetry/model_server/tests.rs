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

#[test]
fn the_kv_capacity_is_read_whenever_the_server_exports_it() {
    // vLLM: per engine, blocks x block size, whichever model names label the gauge.
    let vllm = "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n\
                vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"500\"} 1.0\n\
                vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"500\",model_name=\"b\"} 1.0\n";
    assert_eq!(scrape(ServerKind::Vllm, vllm).kv_capacity_tokens, Some(24_000.0));
    // Before the engine is initialised its labels are not numbers: unknown.
    let early = "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"None\"} 1.0\n";
    assert_eq!(scrape(ServerKind::Vllm, early).kv_capacity_tokens, None);
    // SGLang's pool, summed over label sets.
    let sglang = "sglang:max_total_num_tokens{model_name=\"m\"} 300000\n";
    assert_eq!(scrape(ServerKind::Sglang, sglang).kv_capacity_tokens, Some(300_000.0));
    assert_eq!(scrape(ServerKind::Vllm, "vllm:num_requests_running 1\n").kv_capacity_tokens, None);
}
