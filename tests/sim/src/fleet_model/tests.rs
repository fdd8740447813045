use super::*;
use std::collections::BTreeSet;

fn spec(i: usize, at_ms: u64, prompt: u32, out: u32, conv: &str) -> RequestSpec {
    RequestSpec {
        index: i,
        line: None,
        at_ms,
        conversation: conv.into(),
        memory_mb: (prompt + out) / 2,
        prompt_tokens: prompt,
        max_tokens: out,
        hash_ids: vec![],
        message_ends: Vec::new(),
        model: "m".into(),
        tag_socket: true,
        prefix_keys: false,
    }
}

/// `requests` of the shared-prefix workload: `tenants` system prompts, `per_s` requests a second.
fn tenants_specs(requests: usize, tenants: usize, per_s: f64) -> Vec<RequestSpec> {
    let opts = crate::replay::shared_prefix::SharedPrefixOpts {
        requests,
        tenants,
        requests_per_s: per_s,
        ..Default::default()
    };
    crate::replay::shared_prefix_specs(&opts, crate::replay::trace::DEFAULT_KV_MB_PER_TOKEN, "m")
}

/// ailb's pick with the prefix step as the daemon's defaults set it, the lifetime from the fill
/// time (that factor) where given.
fn ailb_prefix(ttl_fill_factor: Option<f64>) -> Placement {
    Placement::AilbPrefix {
        a100_weight: 3,
        load_factor: 1.25,
        affinity_wait_s: 20.0,
        prefix_load_factor: 2.0,
        prefix_ttl_s: 60.0,
        ttl_fill_factor,
    }
}

/// One request alone on one A100: TTFT is its prefill, E2E adds `out - 1` decode steps.
#[test]
fn a_lone_request_takes_prefill_plus_decode() {
    let r = run(&[spec(0, 0, 8000, 41, "")], &fleet_profiles(1, 0), 1.0, Placement::RoundRobin);
    assert!((r.outcomes[0].ttft_s - 1.0).abs() < 1e-9, "{:?}", r.outcomes[0]);
    assert!((r.outcomes[0].e2e_s - 2.0).abs() < 1e-9, "{:?}", r.outcomes[0]);
    assert!((r.utilisation[0] - 1.0).abs() < 1e-9);
}

/// A 3090 with one batch slot queues the second request behind the first; the load
/// factor stretches arrival times (load 0.5: the second comes at 2 s, after the first ended).
#[test]
fn queueing_and_load_scale() {
    let mut p = fleet_profiles(0, 1);
    p[0].max_seqs = 1;
    let specs = [spec(0, 0, 3000, 26, ""), spec(1, 500, 3000, 26, "")];
    let busy = run(&specs, &p, 1.0, Placement::RoundRobin);
    // First: 1 s prefill + 1 s decode. Second arrives at 0.5 s, starts at 2 s, ends at 4 s.
    assert!((busy.outcomes[1].e2e_s - 3.5).abs() < 1e-9, "{:?}", busy.outcomes[1]);
    let calm = run(&specs, &p, 0.25, Placement::RoundRobin);
    assert!((calm.outcomes[1].e2e_s - 2.0).abs() < 1e-9, "{:?}", calm.outcomes[1]);
}

/// Round robin sends a prompt larger than a 3090's KV pool to a 3090, where it fails; ailb's
/// memory fit sends it to the A100, and keeps a conversation's turns on one GPU.
#[test]
fn ailb_fits_memory_and_keeps_affinity() {
    let big = spec(1, 0, 30_000, 10, "c1");
    let specs = [spec(0, 0, 1000, 10, "c0"), big, spec(2, 100, 1000, 10, "c0"), spec(3, 200, 31_000, 10, "c1")];
    let profiles = fleet_profiles(1, 1);
    let rr = run(&specs, &profiles, 1.0, Placement::RoundRobin);
    assert_eq!(rr.failures(), 2, "both big prompts land on the 3090: {:?}", rr.outcomes);
    let ailb =
        run(&specs, &profiles, 1.0, Placement::Ailb { a100_weight: 3, load_factor: 1.25, affinity_wait_s: 20.0 });
    assert_eq!(ailb.failures(), 0, "{:?}", ailb.outcomes);
    assert_eq!(ailb.outcomes[1].gpu, 0);
    assert_eq!(ailb.outcomes[3].gpu, 0);
    assert_eq!(ailb.outcomes[2].gpu, ailb.outcomes[0].gpu);
    assert_eq!(ailb.affinity_hit_rate, 1.0);
}

/// The clairvoyant bound puts a request where it ends first: an idle A100 over a busy one.
#[test]
fn earliest_finish_avoids_the_queue() {
    let mut p = fleet_profiles(2, 0);
    p[0].max_seqs = 1;
    p[1].max_seqs = 1;
    let specs = [spec(0, 0, 8000, 400, ""), spec(1, 10, 8000, 400, "")];
    let r = run(&specs, &p, 1.0, Placement::EarliestFinish);
    assert_ne!(r.outcomes[0].gpu, r.outcomes[1].gpu);
    assert!(r.e2e_percentile(1.0) < 12.0);
}

/// The cache oracle returns a later turn to the GPU that holds its prefix even when another
/// GPU would finish it sooner; the earliest-finish bound does not.
#[test]
fn cache_oracle_returns_to_the_cached_prefix() {
    let mut p = fleet_profiles(2, 0);
    p[0].max_seqs = 1;
    p[1].max_seqs = 1;
    let mut turn1 = spec(0, 0, 1536, 2, "a");
    turn1.hash_ids = vec![1, 2, 3];
    let mut other = spec(1, 1000, 500, 400, "b");
    other.hash_ids = vec![10];
    let mut turn2 = spec(2, 2000, 2048, 2, "a");
    turn2.hash_ids = vec![1, 2, 3, 4];
    let specs = [turn1, other, turn2];
    let oracle = run(&specs, &p, 1.0, Placement::CacheOracle);
    assert_eq!(oracle.outcomes[1].gpu, oracle.outcomes[0].gpu, "ties go to the first GPU");
    assert_eq!(oracle.outcomes[2].gpu, oracle.outcomes[0].gpu, "{:?}", oracle.outcomes);
    // 3 of turn 2's 2048 prompt tokens' blocks were cached: 1536 of 1536 + 500 + 2048 tokens.
    assert!((oracle.prefix_hit_rate - 1536.0 / 4084.0).abs() < 1e-9, "{}", oracle.prefix_hit_rate);
    let eft = run(&specs, &p, 1.0, Placement::EarliestFinish);
    assert_ne!(eft.outcomes[2].gpu, eft.outcomes[0].gpu, "{:?}", eft.outcomes);
}

/// With the prefix step, a tenant's requests (no conversation, a long system prompt of its own)
/// meet on the GPU that caches its prompt (and one more, which takes what the first's load
/// bound overflows); without it each request is placed by its own hash
/// and every tenant spreads over the fleet, prefilling its prompt on each GPU.
#[test]
fn the_prefix_step_keeps_a_tenant_where_its_prompt_is_cached() {
    let specs = tenants_specs(120, 4, 1.0);
    let profiles = fleet_profiles(0, 4);
    let plain = Placement::Ailb { a100_weight: 3, load_factor: 1.25, affinity_wait_s: 20.0 };
    let prefixed = ailb_prefix(None);
    // Per tenant (its system prompt's first block): requests per GPU.
    let per_tenant = |r: &RunResult| {
        let mut m: BTreeMap<u64, BTreeMap<usize, usize>> = BTreeMap::new();
        for (s, o) in specs.iter().zip(&r.outcomes) {
            *m.entry(s.hash_ids[0]).or_default().entry(o.gpu).or_default() += 1;
        }
        m
    };
    let without = run(&specs, &profiles, 1.0, plain);
    let with = run(&specs, &profiles, 1.0, prefixed);
    let (spread, kept) = (per_tenant(&without), per_tenant(&with));
    eprintln!(
        "without: {spread:?} cached {:.3}\nwith: {kept:?} cached {:.3}",
        without.prefix_hit_rate, with.prefix_hit_rate
    );
    assert_eq!((with.failures(), without.failures()), (0, 0));
    // A holder at its bound sends the overflow to one next GPU, which becomes a second holder.
    for (tenant, gpus) in &kept {
        assert!(gpus.len() <= 2, "tenant {tenant}: {gpus:?} with the prefix step");
    }
    assert!(spread.values().all(|g| g.len() >= 3), "without the prefix step each tenant spreads: {spread:?}");
    assert!(
        with.prefix_hit_rate > without.prefix_hit_rate + 0.1,
        "cached {:.3} with the step, {:.3} without",
        with.prefix_hit_rate,
        without.prefix_hit_rate
    );
}

/// SMG's `cache_aware` in the model: while the fleet is balanced, a tenant's requests go where
/// its system prompt was sent before (the match is over the threshold), so each tenant stays on
/// one GPU; a threshold no match can pass leaves only the load path, which places exactly as
/// least connections does.
#[test]
fn smg_cache_aware_follows_its_tree_while_balanced_and_the_load_otherwise() {
    let specs = tenants_specs(120, 4, 0.2);
    let profiles = fleet_profiles(0, 4);
    let smg = Placement::SmgCacheAware { balance_abs: 16, balance_rel: 1.25, cache_threshold: 0.3 };
    let r = run(&specs, &profiles, 1.0, smg);
    let mut per_tenant: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
    for (s, o) in specs.iter().zip(&r.outcomes) {
        per_tenant.entry(s.hash_ids[0]).or_default().insert(o.gpu);
    }
    assert_eq!(per_tenant.len(), 4, "{per_tenant:?}");
    assert!(per_tenant.values().all(|g| g.len() == 1), "each tenant on one GPU: {per_tenant:?}");
    assert!(r.prefix_hit_rate > 0.8, "cached {:.3}", r.prefix_hit_rate);

    let never_matched = Placement::SmgCacheAware { balance_abs: 16, balance_rel: 1.25, cache_threshold: 1.0 };
    let specs = tenants_specs(200, 4, 4.0);
    let gpus = |r: &RunResult| r.outcomes.iter().map(|o| o.gpu).collect::<Vec<_>>();
    let (a, b) = (run(&specs, &profiles, 1.0, never_matched), run(&specs, &profiles, 1.0, Placement::LeastConnections));
    assert_eq!(gpus(&a), gpus(&b));
    assert!(gpus(&a).iter().collect::<BTreeSet<_>>().len() == 4, "the load path used every GPU");
}

/// The fill-time lifetime on four RTX 3090s and the shared-prefix workload: where the caches
/// take longer than the cap to fill, it is the cap and nothing changes; where every GPU is
/// busy with tenants' prompts, the caches fill within seconds, learnt holders stop counting
/// sooner, and the run differs.
#[test]
fn the_fill_time_lifetime_shortens_only_where_the_caches_turn_over() {
    let profiles = fleet_profiles(0, 4);
    let placement = |fill: bool| ailb_prefix(fill.then_some(1.0));
    let gpus = |r: &RunResult| r.outcomes.iter().map(|o| o.gpu).collect::<Vec<_>>();
    let specs = tenants_specs(120, 4, 0.2);
    assert_eq!(
        gpus(&run(&specs, &profiles, 1.0, placement(true))),
        gpus(&run(&specs, &profiles, 1.0, placement(false)))
    );

    let specs = tenants_specs(600, 16, 1.3);
    let (fill, fixed) = (run(&specs, &profiles, 1.0, placement(true)), run(&specs, &profiles, 1.0, placement(false)));
    assert_ne!(gpus(&fill), gpus(&fixed));
    eprintln!(
        "TTFT P95 {:.2} s with the fill time, {:.2} s with 60 s; cached {:.3} / {:.3}",
        fill.ttft_percentile(0.95),
        fixed.ttft_percentile(0.95),
        fill.prefix_hit_rate,
        fixed.prefix_hit_rate
    );
}
