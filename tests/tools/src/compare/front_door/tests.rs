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
