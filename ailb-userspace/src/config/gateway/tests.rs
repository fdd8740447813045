use crate::config::Config;

const CATALOG: &str = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n";

fn check(gateway: &str) -> Result<super::ValidGateway, String> {
    let c = Config::parse(&format!("{CATALOG}[gateway]\n{gateway}"), "test").map_err(|e| e.to_string())?;
    let v = c.validate().map_err(|e| e.to_string())?;
    c.gateway.validate(v.models.keys().map(String::as_str)).map_err(|e| e.to_string())
}

#[test]
fn absent_section_gets_documented_defaults() {
    let c = Config::parse(CATALOG, "t").unwrap();
    let g = c.gateway.validate(["m"]).unwrap();
    assert_eq!(g.listen, vec!["127.0.0.1:8080".parse().unwrap()]);
    assert_eq!(g.max_body_bytes, 32 << 20);
    assert_eq!(g.max_concurrent, 1024);
    assert_eq!(g.header_timeout.as_secs(), 30);
    assert_eq!(g.connect_timeout.as_secs(), 5);
    assert_eq!(g.idle_timeout.as_secs(), 300);
    assert_eq!(g.total_timeout.as_secs(), 1800);
    assert_eq!(g.session_header, None);
    assert_eq!(g.completion_prefix_bytes, 1024);
    assert!(g.kv_bytes_per_token.is_empty());
    assert!(g.kv_block_tokens.is_empty(), "every model gets DEFAULT_KV_BLOCK_TOKENS");
    assert_eq!(g.upstream_reuse, super::UpstreamReuse::Conversation);
    assert_eq!(g.upstream_max_age.as_secs(), 1);
    assert_eq!(g.upstream_idle_mark_after, std::time::Duration::from_millis(10));
    assert_eq!(g.upstream_max_idle, 256);
    assert_eq!(g.worker_threads, None, "one per core");
    assert_eq!(g.admission, super::ValidAdmission::Off, "admission off");
    assert_eq!(g.responses_max_entries, 100_000);
    assert_eq!(g.responses_ttl, None, "kept while there is room, as vLLM keeps stored responses");
    assert_eq!(c.gateway.tokenizer_cache_mb, 64, "64 MiB of segments' ids per tokenizer");
}

#[test]
fn values_are_taken() {
    let g = check(
        "listen = [\"127.0.0.1:0\", \"[::1]:9\"]\nmax_body_bytes = 10\nsession_header = \"X-User\"\n\
         idle_timeout = \"250ms\"\nupstream_reuse = \"never\"\nworker_threads = 3\n[gateway.kv_bytes_per_token]\nm = 4096\n\
         [gateway.kv_block_tokens]\nm = 512\n",
    )
    .unwrap();
    assert_eq!(g.listen.len(), 2);
    assert_eq!(g.max_body_bytes, 10);
    assert_eq!(g.session_header.unwrap().as_str(), "x-user");
    assert_eq!(g.idle_timeout.as_millis(), 250);
    assert_eq!(g.kv_bytes_per_token["m"], 4096);
    assert_eq!(g.kv_block_tokens["m"], 512);
    assert_eq!(g.upstream_reuse, super::UpstreamReuse::Never);
    assert_eq!(g.worker_threads, Some(3));
    assert_eq!(g.admission, super::ValidAdmission::Off);
    let g = check("admission = true\nadmission_retry_after = \"2s\"").unwrap();
    assert_eq!(g.admission, super::ValidAdmission::Inflight { retry_after: std::time::Duration::from_secs(2) });
    let g = check("responses_max_entries = 7\nresponses_ttl = \"2h\"").unwrap();
    assert_eq!((g.responses_max_entries, g.responses_ttl), (7, Some(std::time::Duration::from_secs(7200))));
    let g = check("admission = false").unwrap();
    assert_eq!(g.admission, super::ValidAdmission::Off);
    let g = check("[gateway.admission]\nmode = \"inflight\"").unwrap();
    assert_eq!(g.admission, super::ValidAdmission::Inflight { retry_after: std::time::Duration::from_secs(1) });
    let g = check("[gateway.admission]\nmode = \"off\"").unwrap();
    assert_eq!(g.admission, super::ValidAdmission::Off);
}

#[test]
fn kept_connections_are_marked_idle_at_once_by_default_when_the_admission_reads_the_counts() {
    use std::time::Duration;
    let mark = |text: &str| check(text).unwrap().upstream_idle_mark_after;
    assert_eq!(mark(""), Duration::from_millis(10), "admission off: the deferred mark");
    assert_eq!(mark("admission = true"), Duration::ZERO);
    assert_eq!(mark("[gateway.admission]\nmode = \"fleet_memory\""), Duration::ZERO);
    assert_eq!(mark("upstream_idle_mark_after = \"20ms\"\nadmission = true"), Duration::from_millis(20));
    assert_eq!(mark("upstream_idle_mark_after = \"0s\""), Duration::ZERO);
    // A short max_age alone is no error about a mark the config never set.
    assert_eq!(mark("upstream_max_age = \"8ms\""), Duration::from_millis(4));
}

#[test]
fn fleet_memory_admission_has_documented_defaults_and_takes_values() {
    let g = check("[gateway.admission]\nmode = \"fleet_memory\"").unwrap();
    let want = super::FleetMemoryLimits {
        factor: 1.0,
        max_wait: std::time::Duration::from_secs(5),
        max_queued: 1024,
        reserve: 0.5,
        retry_after: 1,
    };
    assert_eq!(g.admission, super::ValidAdmission::FleetMemory(want));
    let g = check(
        "admission_retry_after = \"3s\"\n[gateway.admission]\nfactor = 1.5\nmax_wait = \"250ms\"\nmax_queued = 0\n\
         reserve = 0.25",
    )
    .unwrap();
    let want = super::FleetMemoryLimits {
        factor: 1.5,
        max_wait: std::time::Duration::from_millis(250),
        max_queued: 0,
        reserve: 0.25,
        retry_after: 3,
    };
    assert_eq!(g.admission, super::ValidAdmission::FleetMemory(want), "the table's mode defaults to fleet_memory");
}

#[test]
fn bad_values_name_field_and_value() {
    let cases: &[(&str, &[&str])] = &[
        ("listen = []", &["gateway.listen", "[]"]),
        ("listen = [\"nowhere\"]", &["gateway.listen[0]", "nowhere"]),
        ("max_body_bytes = 0", &["gateway.max_body_bytes", "0"]),
        ("max_concurrent = 0", &["gateway.max_concurrent"]),
        ("header_timeout = \"soon\"", &["gateway.header_timeout", "soon"]),
        ("total_timeout = \"0s\"", &["gateway.total_timeout", "above zero"]),
        ("session_header = \"bad header\"", &["gateway.session_header", "bad header"]),
        ("completion_prefix_bytes = 0", &["gateway.completion_prefix_bytes"]),
        ("kv_bytes_per_token = { other = 1 }", &["gateway.kv_bytes_per_token.other", "catalog"]),
        ("kv_bytes_per_token = { m = 0 }", &["gateway.kv_bytes_per_token.m", "above zero"]),
        ("kv_block_tokens = { other = 16 }", &["gateway.kv_block_tokens.other", "catalog"]),
        ("kv_block_tokens = { m = 0 }", &["gateway.kv_block_tokens.m", "1 to 65536"]),
        ("tokenizer_cache_mb = 100000", &["gateway.tokenizer_cache_mb", "100000", "at most 65536"]),
        ("tokenizer_cache_mb = -1", &["tokenizer_cache_mb"]),
        ("admission_retry_after = \"1500ms\"", &["gateway.admission_retry_after", "1500ms", "whole seconds"]),
        ("admission_retry_after = \"0s\"", &["gateway.admission_retry_after", "above zero"]),
        ("admission = 1", &["admission", "true, false or a table"]),
        ("[gateway.admission]\nmode = \"memory\"", &["gateway.admission.mode", "memory", "fleet_memory"]),
        ("[gateway.admission]\nfactor = 0.0", &["gateway.admission.factor", "0", "above 0"]),
        ("[gateway.admission]\nfactor = -1.0", &["gateway.admission.factor", "-1", "above 0"]),
        ("[gateway.admission]\nfactor = 1000.0", &["gateway.admission.factor", "1000", "at most 100"]),
        ("[gateway.admission]\nfactor = nan", &["gateway.admission.factor", "NaN"]),
        ("[gateway.admission]\nmax_wait = \"later\"", &["gateway.admission.max_wait", "later"]),
        ("[gateway.admission]\nmax_queued = 2000000", &["gateway.admission.max_queued", "2000000"]),
        ("[gateway.admission]\nmax_wait_ms = 5", &["max_wait_ms"]),
        ("[gateway.admission]\nreserve = 1.5", &["gateway.admission.reserve", "1.5", "from 0 to 1"]),
        ("[gateway.admission]\nreserve = -0.1", &["gateway.admission.reserve", "-0.1", "from 0 to 1"]),
        ("[gateway.admission]\nreserve = nan", &["gateway.admission.reserve", "NaN"]),
        ("upstream_reuse = \"always\"", &["gateway.upstream_reuse", "always", "never"]),
        ("upstream_max_age = \"0s\"", &["gateway.upstream_max_age", "above zero"]),
        ("upstream_idle_mark_after = \"2s\"", &["gateway.upstream_idle_mark_after", "2s", "upstream_max_age"]),
        ("upstream_idle_mark_after = \"soon\"", &["gateway.upstream_idle_mark_after", "soon"]),
        ("responses_max_entries = 0", &["gateway.responses_max_entries", "above zero"]),
        ("responses_ttl = \"0s\"", &["gateway.responses_ttl", "above zero"]),
        ("responses_ttl = \"forever\"", &["gateway.responses_ttl", "forever"]),
        ("bogus = 1", &["bogus"]),
    ];
    for (text, wants) in cases {
        let e = check(text).expect_err(text);
        for want in *wants {
            assert!(e.contains(want), "error {e:?} for {text:?} should mention {want:?}");
        }
    }
}

#[test]
fn tenants_are_off_by_default_and_on_with_a_scheduler_table_or_a_tenant() {
    assert_eq!(check("").unwrap().tenancy, None);
    let t = check("[gateway.scheduler]\n").unwrap().tenancy.expect("on");
    assert_eq!((t.levels, t.default_priority, t.max_queued, t.max_queued_per_tenant), (3, 1, 1024, 256));
    assert_eq!(t.fair_lag_tokens, 0, "by weight at every request");
    let lagged = check("[gateway.scheduler]\nfair_lag_tokens = 4096\n").unwrap().tenancy.expect("on");
    assert_eq!(lagged.fair_lag_tokens, 4096);
    assert_eq!(t.priority_header.as_str(), "x-ailb-priority");
    assert_eq!(t.tenants.len(), 1, "the implicit default");
    let d = &t.tenants[0];
    assert_eq!((d.name.as_str(), d.weight, d.max_priority, d.rate, d.max_concurrent), ("default", 1, 1, None, 1024));
}

#[test]
fn tenants_are_taken_with_the_default_last() {
    let key = "ab".repeat(32);
    let t = check(&format!(
        "max_concurrent = 100\n[gateway.scheduler]\nlevels = 4\ntenant_header = \"X-Team\"\n\
         [[gateway.tenants]]\nname = \"default\"\nweight = 2\n\
         [[gateway.tenants]]\nname = \"search\"\napi_key_sha256 = [\"{key}\"]\nheader_values = [\"s\"]\n\
         cidrs = [\"10.1.0.0/16\", \"::1\"]\nweight = 3\nmax_priority = 3\ntokens_per_second = 50.5\n\
         concurrency_share = 0.25\n"
    ))
    .unwrap()
    .tenancy
    .unwrap();
    assert_eq!(t.tenant_header.unwrap().as_str(), "x-team");
    let names: Vec<_> = t.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["search", "default"]);
    let s = &t.tenants[0];
    assert_eq!((s.weight, s.max_priority, s.rate, s.max_concurrent), (3, 3, Some((50.5, 50.5)), 25));
    assert_eq!(s.api_keys, vec![[0xab; 32]]);
    assert_eq!(s.cidrs.len(), 2);
    assert_eq!(t.tenants[1].weight, 2);
}

#[test]
fn bad_tenants_are_refused_naming_the_field_and_value() {
    let key = "ab".repeat(32);
    let cases: &[(&str, &str)] = &[
        ("[gateway.scheduler]\nlevels = 0", "gateway.scheduler.levels"),
        ("[gateway.scheduler]\nlevels = 2\ndefault_priority = 2", "gateway.scheduler.default_priority"),
        ("[gateway.scheduler]\nmax_queued = 4\nmax_queued_per_tenant = 5", "gateway.scheduler.max_queued_per_tenant"),
        ("[gateway.scheduler]\nmax_wait = \"soon\"", "gateway.scheduler.max_wait"),
        ("[gateway.scheduler]\nfair_lag_tokens = -1", "fair_lag_tokens"),
        ("[gateway.scheduler]\npriority_header = \"a b\"", "gateway.scheduler.priority_header"),
        ("[[gateway.tenants]]\nname = \"a b\"\ncidrs = [\"10.0.0.0/8\"]", "gateway.tenants[0].name"),
        ("[[gateway.tenants]]\nname = \"a\"", "gateway.tenants[0].name"),
        ("[[gateway.tenants]]\nname = \"default\"\ncidrs = [\"10.0.0.0/8\"]", "gateway.tenants[0].name"),
        ("[[gateway.tenants]]\nname = \"a\"\napi_key_sha256 = [\"sk-secret\"]", "gateway.tenants[0].api_key_sha256[0]"),
        ("[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"10.0.0.0/33\"]", "gateway.tenants[0].cidrs[0]"),
        ("[[gateway.tenants]]\nname = \"a\"\nheader_values = [\"a\"]", "gateway.tenants[0].header_values"),
        ("[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"::1\"]\nweight = 0", "gateway.tenants[0].weight"),
        ("[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"::1\"]\nmax_priority = 3", "gateway.tenants[0].max_priority"),
        (
            "[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"::1\"]\ntokens_per_second = 0.0",
            "gateway.tenants[0].tokens_per_second",
        ),
        ("[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"::1\"]\nburst_tokens = 5.0", "gateway.tenants[0].burst_tokens"),
        (
            "[[gateway.tenants]]\nname = \"a\"\ncidrs = [\"::1\"]\nconcurrency_share = 1.5",
            "gateway.tenants[0].concurrency_share",
        ),
    ];
    for (toml, field) in cases {
        let e = check(toml).unwrap_err();
        assert!(e.contains(field), "{toml:?}: {e}");
    }
    let twice = format!(
        "[[gateway.tenants]]\nname = \"a\"\napi_key_sha256 = [\"{key}\"]\n[[gateway.tenants]]\nname = \"b\"\napi_key_sha256 = [\"{key}\"]\n"
    );
    let e = check(&twice).unwrap_err();
    assert!(e.contains("gateway.tenants[1].api_key_sha256[0]") && e.contains("another tenant"), "{e}");
    let e = check("[[gateway.tenants]]\nname = \"a\"\napi_key_sha256 = [\"sk-secret\"]").unwrap_err();
    assert!(e.contains("never the key itself") && !e.contains("sk-secret"), "a key in clear is not echoed: {e}");
}
