use super::*;

#[test]
fn the_section_names_the_model_and_its_kv_bytes() {
    let t = toml(SocketAddrV4::new([127, 0, 10, 248].into(), 18_100), 524_288, false);
    assert_eq!(
        t,
        "\n[gateway]\nlisten = [\"127.0.10.248:18100\"]\n[gateway.kv_bytes_per_token]\n\"sim-7b\" = 524288\n\
             [gateway.kv_block_tokens]\n\"sim-7b\" = 512\n"
    );
    let t = toml(SocketAddrV4::new([127, 0, 10, 248].into(), 18_100), 524_288, true);
    assert!(
        t.starts_with("\n[gateway]\nlisten = [\"127.0.10.248:18100\"]\nprefix_keys = true\n[gateway."),
        "prefix_keys belongs to [gateway], before its tables: {t}"
    );
}

#[test]
fn the_admission_table_waits_in_real_time() {
    use clap::Parser;
    let args = crate::compare::args::Args::parse_from([
        "ailb-compare",
        "--admission-max-wait-s",
        "30",
        "--admission-factor",
        "1.5",
    ]);
    assert_eq!(
        admission_toml(&args),
        "[gateway.admission]\nmode = \"fleet_memory\"\nfactor = 1.5\nmax_wait = \"1500ms\"\n",
        "30 s of simulated time at the default time scale of 20"
    );
}

#[test]
fn the_simulated_gpus_keep_half_a_mib_of_kv_per_token() {
    // The replay's hint is 0.5 MB per token (DEFAULT_KV_MB_PER_TOKEN): the same figure.
    for p in ["a100-80gb", "rtx3090-24gb"] {
        assert_eq!(GpuProfile::preset(p).map(|p| p.kv_bytes_per_token), Some(524_288), "{p}");
    }
    assert_eq!(
        (ailb_sim::replay::trace::DEFAULT_KV_MB_PER_TOKEN * (1 << 20) as f64) as u64,
        524_288,
        "the replay's hint per token"
    );
}

#[test]
fn a_precise_front_door_reads_the_simulated_gpus_tokenizer() {
    let t = tokenizer_toml(Some(Path::new("/models/tiny"))).expect("a folder");
    assert_eq!(t, "[gateway.tokenizers]\n\"sim-7b\" = \"/models/tiny\"\n");
    let e = tokenizer_toml(None).expect_err("no tokenizer");
    assert!(e.to_string().contains("--sim-tokenizer"), "{e}");
}

#[test]
fn a_tokenizing_gpu_publishes_its_events_on_its_own_address() {
    let (events, replay) = crate::sim_gpus::kv_events_endpoints(SocketAddrV4::new([127, 0, 10, 3].into(), 18_104));
    assert_eq!((events.as_str(), replay.as_str()), ("tcp://127.0.10.3:19104", "tcp://127.0.10.3:20104"));
}

#[test]
fn the_front_doors_connections_and_key_times_are_read_from_its_metrics() {
    let text = "# HELP x\n\
        ailb_gateway_upstream_requests_total{reused=\"false\"} 60\n\
        ailb_gateway_upstream_requests_total{reused=\"true\"} 40\n\
        ailb_gateway_prefix_keys_seconds_sum{model=\"sim-7b\"} 0.12\n\
        ailb_gateway_prefix_keys_seconds_count{model=\"sim-7b\"} 60\n\
        ailb_gateway_prefix_keys_seconds_bucket{le=\"0.001\",model=\"sim-7b\"} 50\n\
        ailb_gateway_prefix_keys_seconds_bucket{le=\"0.002\",model=\"sim-7b\"} 56\n\
        ailb_gateway_prefix_keys_seconds_bucket{le=\"0.004\",model=\"sim-7b\"} 58\n\
        ailb_gateway_prefix_keys_seconds_bucket{le=\"+Inf\",model=\"sim-7b\"} 60\n\
        ailb_gateway_prefix_keys_withheld_total{model=\"sim-7b\",outcome=\"placed\"} 25\n\
        ailb_gateway_prefix_keys_withheld_total{model=\"sim-7b\",outcome=\"asked\"} 3\n";
    let s = FrontDoorStats::parse(text);
    assert_eq!((s.fresh, s.kept, s.keys_made, s.keys_s), (60.0, 40.0, 60.0, 0.12));
    assert_eq!((s.withheld_placed, s.withheld_asked), (25.0, 3.0));
    assert_eq!(s.keys_buckets.len(), 4);
    // The 50th of 60 is in the first bucket, the 57th in the third; the 60th past the last finite one.
    assert_eq!(s.keys_quantile_at_most(50.0 / 60.0), Some(0.001));
    assert_eq!(s.keys_quantile_at_most(0.95), Some(0.004));
    assert_eq!(s.keys_quantile_at_most(1.0), None);
    assert_eq!(FrontDoorStats::parse("").keys_quantile_at_most(0.5), None, "none made");
}
