//! The worked examples of the weighting chain, exactly, and its properties (order independence,
//! hysteresis, exclusion reasons).

use std::{collections::BTreeMap, net::SocketAddr};

use proptest::prelude::*;

use super::*;
use crate::{
    config::{Config, ValidConfig},
    discovery::{from_static, Instance, ServiceInfo, Snapshot},
};

/// [`super::plan`] over a whole config's catalog and `[policy]`.
fn plan(snapshot: &Snapshot, cfg: &ValidConfig, state: &mut PolicyState) -> Plan {
    super::plan(snapshot, &cfg.models, &cfg.policy, state)
}

const CATALOG: &str = r#"
[[models]]
name = "m"
vips = ["127.77.0.1:8000"]
"#;

fn config(extra: &str) -> ValidConfig {
    Config::parse(&format!("{extra}\n{CATALOG}"), "t").unwrap().validate().unwrap()
}

fn config_with_model(model_fields: &str, policy: &str) -> ValidConfig {
    Config::parse(&format!("{policy}\n{CATALOG}{model_fields}\n"), "t").unwrap().validate().unwrap()
}

fn addr(i: u8) -> SocketAddr {
    SocketAddr::new([10, 0, 0, i].into(), 8000)
}

fn inst(i: u8, meta: &[(&str, &str)]) -> Instance {
    Instance::test(i, meta)
}

fn snap(instances: Vec<Instance>) -> Snapshot {
    Snapshot { instances, services: Vec::new() }
}

fn run(cfg: &ValidConfig, instances: Vec<Instance>) -> ModelPlan {
    plan(&snap(instances), cfg, &mut PolicyState::default()).remove("m").unwrap()
}

/// (eligible, weight) per backend, in address order.
fn outcome(p: &ModelPlan) -> Vec<(bool, u32)> {
    p.backends.iter().map(|b| (b.eligible, b.weight)).collect()
}

// ---- Worked examples: the chain's steps on small fleets, number by number ----

#[test]
fn article_memory_need_8gb_nodes_12_6_9_keeps_first_and_third() {
    let cfg = config_with_model("required_memory_mb = 8192", "");
    let p = run(
        &cfg,
        vec![
            inst(1, &[("remaining_memory", "12")]),
            inst(2, &[("remaining_memory", "6")]),
            inst(3, &[("remaining_memory", "9")]),
        ],
    );
    assert_eq!(outcome(&p), [(true, 1), (false, 0), (true, 1)]);
    assert_eq!(p.backends[1].explain.excluded_by, Some(Exclusion::Memory));
    assert_eq!(p.backends[1].reason(), "excluded: memory: 6144 MB free (remaining_memory=\"6\") < 8192 MB required");
    assert_eq!(p.backends.iter().map(|b| b.free_memory_mb).collect::<Vec<_>>(), [Some(12288), Some(6144), Some(9216)]);
}

#[test]
fn article_5_vs_2_current_requests_gives_the_second_more_weight() {
    let p = run(
        &config("[policy]\nload_factor = true\n"),
        vec![inst(1, &[("current_requests", "5")]), inst(2, &[("current_requests", "2")])],
    );
    // 1/(1+5) : 1/(1+2) = 1 : 2, scaled to a maximum of 1000.
    assert_eq!(outcome(&p), [(true, 500), (true, 1000)]);
    assert!(p.backends[1].reason().contains("load: 2 running, 0 queued"), "{}", p.backends[1].reason());
}

#[test]
fn article_80pct_util_lowers_a_weight_40pct_keeps_it() {
    let p = run(
        &config(""),
        vec![
            inst(1, &[("gpu_util", "80")]),
            inst(2, &[("gpu_util", "40")]),
            inst(3, &[]),
            inst(4, &[("gpu_util", "25")]),
        ],
    );
    // 0.5 (80 % > 70) : 1 (40 %) : 1 (unknown) : 1.25 (25 % < 30), scaled to a maximum of 1000.
    assert_eq!(outcome(&p), [(true, 400), (true, 800), (true, 800), (true, 1000)]);
    assert_eq!(p.backends[0].explain.util.band, UtilBand::High);
    assert_eq!(p.backends[1].explain.util.factor, 1.0);
}

#[test]
fn article_model_id_mismatch_excludes() {
    let p = run(
        &config(""),
        vec![
            inst(1, &[("model_id", "m")]),
            inst(2, &[("model_id", "other")]),
            inst(3, &[("model_id", "other"), ("supported_models", "x, m")]),
            inst(4, &[]),
        ],
    );
    assert_eq!(outcome(&p), [(true, 1), (false, 0), (true, 1), (true, 1)]);
    assert_eq!(p.backends[1].explain.excluded_by, Some(Exclusion::ModelId));
    assert!(p.backends[3].explain.reasons[0].contains("trusted from registry service"));
}

// ---- The rest of the contract, table-driven ----

#[test]
fn exclusions_name_the_rule_field_and_value() {
    let with_version = config_with_model("required_memory_mb = 8192\nmodel_version = \"v2\"", "");
    let cases: Vec<(Instance, Exclusion, &str)> = vec![
        (inst(1, &[("model_version", "v1")]), Exclusion::ModelVersion, "model_version=\"v1\" is not \"v2\""),
        (inst(1, &[]), Exclusion::ModelVersion, "model_version absent"),
        (
            inst(1, &[("model_version", "v2"), ("remaining_memory", "abc")]),
            Exclusion::MemoryInvalid,
            "remaining_memory=\"abc\" is not a number",
        ),
        (
            inst(1, &[("model_version", "v2"), ("health_status", "draining")]),
            Exclusion::HealthStatus,
            "health_status=\"draining\"",
        ),
        (
            inst(1, &[("model_version", "v2"), ("health_status", "Loading")]),
            Exclusion::HealthStatus,
            "health_status=\"Loading\" is not healthy",
        ),
        (
            Instance { enabled: false, ..inst(1, &[("model_version", "v2")]) },
            Exclusion::RegistryDisabled,
            "enabled=false",
        ),
        (
            Instance { healthy: false, ..inst(1, &[("model_version", "v2")]) },
            Exclusion::RegistryUnhealthy,
            "healthy=false",
        ),
        (Instance { weight: 0.0, ..inst(1, &[("model_version", "v2")]) }, Exclusion::Drained, "weight 0 (drained)"),
        (Instance { weight: -3.0, ..inst(1, &[("model_version", "v2")]) }, Exclusion::Drained, "weight -3"),
        (Instance { weight: f64::NAN, ..inst(1, &[("model_version", "v2")]) }, Exclusion::RegistryWeight, "NaN"),
        (Instance { weight: f64::INFINITY, ..inst(1, &[("model_version", "v2")]) }, Exclusion::RegistryWeight, "inf"),
        (Instance { weight: 1e-9, ..inst(1, &[("model_version", "v2")]) }, Exclusion::RegistryWeight, "outside"),
    ];
    for (i, want, needle) in cases {
        let p = run(&with_version, vec![i.clone()]);
        let b = &p.backends[0];
        assert_eq!((b.eligible, b.weight, b.explain.excluded_by), (false, 0, Some(want)), "{i:?}: {}", b.reason());
        assert!(b.reason().starts_with(&format!("excluded: {}: ", want.as_str())), "{}", b.reason());
        assert!(b.reason().contains(needle), "{:?} should contain {needle:?}", b.reason());
        assert!(!p.available);
    }
}

#[test]
fn invalid_optional_fields_are_ignored_with_a_line() {
    let meta = [
        ("gpu_util", "hot"),
        ("current_requests", "-2"),
        ("queue_length", "NaN"),
        ("max_inflight", "lots"),
        ("remaining_memory_mb", "1e30"),
        ("kv_cache_usage", "95"),
        ("prefix_cache_hit_rate", "1.5"),
        ("gpu_type", "\u{0}"),
    ];
    let p = run(&config(""), vec![inst(1, &meta), inst(2, &[])]);
    let b = &p.backends[0];
    assert_eq!((b.eligible, b.weight, b.cap, b.free_memory_mb), (true, 1, 0, None), "{}", b.reason());
    let keys: Vec<_> = b.explain.invalid.iter().map(|f| (f.key, f.effect)).collect();
    for key in [
        "gpu_util",
        "current_requests",
        "queue_length",
        "max_inflight",
        "remaining_memory_mb",
        "kv_cache_usage",
        "prefix_cache_hit_rate",
    ] {
        assert!(keys.contains(&(key, "ignored")), "{key} in {keys:?}");
        assert!(b.explain.reasons.iter().any(|r| r.starts_with(&format!("{key}=")) && r.contains("ignored")));
    }
    assert_eq!((b.explain.load.factor, b.explain.util.factor), (1.0, 1.0));
}

#[test]
fn composition_capability_cap_and_one_line_reason() {
    let cfg =
        config("[policy]\nload_factor = true\n[policy.gpu_capability]\n\"A100-80GB\" = 2.0\n\"RTX3090-24GB\" = 1.0\n");
    let p = run(
        &cfg,
        vec![
            inst(
                1,
                &[("gpu_type", "a100-80gb"), ("current_requests", "2"), ("gpu_util", "25"), ("max_inflight", "16")],
            ),
            inst(2, &[("gpu_type", "RTX3090-24GB")]),
            inst(3, &[("gpu_type", "T4")]),
        ],
    );
    // 1 x 2 x 1/(1 + 2/2) x 1.25 = 1.25 ; 1 ; 1  -> scaled to max 1000 (the load counts
    // against the capability: 2 running on a capability-2 GPU is half its load scale).
    assert_eq!(outcome(&p), [(true, 1000), (true, 800), (true, 800)]);
    assert_eq!(p.backends[0].cap, 16);
    assert_eq!(
        p.backends[0].reason(),
        "eligible: weight 1000 ~ 1.25 = 1 (registry) x 2 (a100-80gb) x 0.5 (load: 2 running, 0 queued) x 1.25 \
         (util 25% low)"
    );
    assert!(p.backends[2].explain.reasons.iter().any(|r| r.contains("\"T4\" is not in [policy.gpu_capability]")));
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["backends"][0]["explain"]["util"]["band"], "low");
    assert_eq!(json["backends"][0]["explain"]["gpu_capability"], 2.0);
}

/// `load_factor` is off by default: the reported load does not move the weights (the kernel's
/// live load bound balances per connection instead).
#[test]
fn by_default_the_reported_load_does_not_move_the_weights() {
    let p = run(&config(""), vec![inst(1, &[("current_requests", "5")]), inst(2, &[("current_requests", "2")])]);
    let o = outcome(&p);
    assert_eq!(o[0], o[1], "equal weights whatever the reported load: {o:?}");
    assert_eq!(p.backends[0].explain.load.factor, 1.0);
}

#[test]
fn static_weights_reach_the_table_unchanged() {
    // The embedded default: weights 1, 2, 5, no telemetry.
    let cfg = crate::config::load_valid(None).unwrap();
    let p = plan(&from_static(&cfg.backends), &cfg, &mut PolicyState::default());
    let m = &p["demo-7b"];
    assert_eq!(outcome(m), [(true, 1), (true, 2), (true, 5)]);
    assert_eq!(
        m.backends.iter().map(|b| b.free_memory_mb).collect::<Vec<_>>(),
        [Some(80000), Some(24000), Some(24000)]
    );
    assert!(m.available);
}

#[test]
fn no_eligible_backend_makes_the_model_unavailable() {
    let p = run(&config(""), vec![Instance { healthy: false, ..inst(1, &[]) }]);
    assert!(!p.available && p.backends.len() == 1);
    assert!(!run(&config(""), vec![]).available);
}

#[test]
fn protection_threshold_is_shown_and_health_status_still_excludes() {
    let mut s = snap(vec![inst(1, &[]), inst(2, &[("health_status", "unhealthy")])]);
    s.services.push(ServiceInfo { model: "m".into(), service: "m".into(), reach_protection_threshold: true });
    let p = plan(&s, &config(""), &mut PolicyState::default()).remove("m").unwrap();
    assert_eq!(outcome(&p), [(true, 1), (false, 0)]);
    assert!(p.backends.iter().all(|b| b.explain.protection_threshold));
}

#[test]
fn duplicates_resolve_the_same_whatever_the_order() {
    let a = Instance { service: "svc-a".into(), ..inst(1, &[("gpu_util", "90")]) };
    let b = Instance { service: "svc-b".into(), healthy: false, ..inst(1, &[]) };
    let cfg = config("");
    let p1 = run(&cfg, vec![a.clone(), b.clone(), inst(2, &[])]);
    let p2 = run(&cfg, vec![inst(2, &[]), b, a]);
    assert_eq!(p1, p2);
    assert_eq!(p1.backends.len(), 2);
    assert_eq!(p1.backends[0].explain.service, "svc-a");
    assert!(p1.backends[0].explain.reasons.iter().any(|r| r.starts_with("listed 2 times")));
}

// ---- State: smoothing, hysteresis, minimum change ----

#[test]
fn small_changes_keep_the_last_table_and_eligibility_changes_do_not() {
    let cfg = config("[policy]\nload_factor = true\n");
    let mut st = PolicyState::default();
    let two = |a: &str, b: &str| snap(vec![inst(1, &[("current_requests", a)]), inst(2, &[("current_requests", b)])]);
    let p = plan(&two("0", "1"), &cfg, &mut st).remove("m").unwrap();
    assert_eq!(outcome(&p), [(true, 1000), (true, 500)]);
    // 1 : 0.5 -> 1 : 0.476: the shares move by less than 10 %: the table stays.
    let p = plan(&two("0", "1.1"), &cfg, &mut st).remove("m").unwrap();
    assert_eq!((outcome(&p), p.weights_held), (vec![(true, 1000), (true, 500)], true));
    assert_eq!(p.backends[1].explain.candidate_weight, 476);
    assert!(p.backends[1].reason().contains("held (new 476 within min change)"), "{}", p.backends[1].reason());
    // Drift adds up against the last emitted table, not the last candidate.
    let p = plan(&two("0", "1.5"), &cfg, &mut st).remove("m").unwrap();
    assert_eq!((outcome(&p), p.weights_held), (vec![(true, 1000), (true, 400)], false));
    // A third backend: fresh weights at once.
    let mut s = two("0", "1.5");
    s.instances.push(inst(3, &[("current_requests", "0")]));
    let p = plan(&s, &cfg, &mut st).remove("m").unwrap();
    assert_eq!((outcome(&p), p.weights_held), (vec![(true, 1000), (true, 400), (true, 1000)], false));
    assert_eq!(st.last_weights("m").unwrap().len(), 3);
}

#[test]
fn utilisation_hovering_at_70_does_not_flip_the_weight() {
    let cfg = config("");
    let mut st = PolicyState::default();
    let mut weights = Vec::new();
    for (i, u) in ["69", "71", "69", "71", "69", "71", "69", "71"].into_iter().enumerate() {
        let stamp = i.to_string();
        let s = snap(vec![inst(1, &[("gpu_util", u), ("updated_at_ms", &stamp)]), inst(2, &[("gpu_util", "50")])]);
        let p = plan(&s, &cfg, &mut st).remove("m").unwrap();
        assert_eq!(p.backends[0].explain.util.band, UtilBand::Neutral, "sample {i}");
        weights.push(outcome(&p));
    }
    assert!(weights.windows(2).all(|w| w[0] == w[1]), "{weights:?}");
}

#[test]
fn utilisation_is_smoothed_per_report() {
    let cfg = config("");
    let mut st = PolicyState::default();
    let s = |u: &str, t: &str| snap(vec![inst(1, &[("gpu_util", u), ("updated_at_ms", t)])]);
    plan(&s("50", "1"), &cfg, &mut st);
    plan(&s("100", "2"), &cfg, &mut st);
    assert_eq!(st.smoothed_util("m", addr(1)), Some(65.0));
    // The same report seen again is not a new sample.
    plan(&s("100", "2"), &cfg, &mut st);
    assert_eq!(st.smoothed_util("m", addr(1)), Some(65.0));
    // A backend that is gone is forgotten.
    plan(&snap(vec![]), &cfg, &mut st);
    assert_eq!(st, PolicyState::default());
}

// ---- Properties ----

fn arb_meta_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,4}(\\.[0-9]{1,2})?",
        "-?[0-9]{1,3}(e[0-9]{1,3})?( ?(GB|gib|MB|%))?",
        Just("NaN".to_string()),
        Just("inf".to_string()),
        Just("1e999".to_string()),
        Just("18446744073709551616".to_string()),
        "healthy|draining|unhealthy|m|other|v1|A100-80GB",
        any::<String>(),
        "\\PC{0,200}",
    ]
}

fn arb_metadata() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        Just("model_id"),
        Just("supported_models"),
        Just("model_version"),
        Just("gpu_type"),
        Just("remaining_memory"),
        Just("remaining_memory_mb"),
        Just("gpu_util"),
        Just("current_requests"),
        Just("queue_length"),
        Just("health_status"),
        Just("max_inflight"),
        Just("kv_cache_usage"),
        Just("updated_at_ms"),
        Just("gpu_memory_total_mb"),
        Just("supported_tasks"),
        Just("agent_version"),
    ]
    .prop_map(str::to_string);
    proptest::collection::btree_map(prop_oneof![key, any::<String>()], arb_meta_value(), 0..10)
}

fn arb_instance() -> impl Strategy<Value = Instance> {
    (
        1u8..12,
        prop_oneof![Just(1.0), Just(0.0), Just(-1.0), Just(f64::NAN), Just(f64::INFINITY), 0.0f64..100.0, any::<f64>()],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just("m".to_string()), Just("other".to_string())],
        arb_metadata(),
    )
        .prop_map(|(i, weight, healthy, enabled, service, metadata)| Instance {
            model: "m".into(),
            service,
            healthy: healthy || i % 3 != 0,
            enabled: enabled || i % 4 != 0,
            weight,
            metadata: metadata.into(),
            ..inst(i, &[])
        })
}

fn arb_config() -> impl Strategy<Value = ValidConfig> {
    (prop::option::of(0u32..20000), 0.0f64..0.5).prop_map(|(mem, min)| {
        let model = mem.map_or(String::new(), |m| format!("required_memory_mb = {m}"));
        config_with_model(
            &model,
            &format!("[policy]\nmin_weight_change = {min}\n[policy.gpu_capability]\n\"A100-80GB\" = 2.5"),
        )
    })
}

fn check_weights(p: &Plan) {
    for m in p.values() {
        assert_eq!(m.available, m.backends.iter().any(|b| b.eligible));
        for b in &m.backends {
            assert!(b.weight <= 65_535);
            assert_eq!(b.eligible, b.weight > 0, "{b:?}");
            let e = &b.explain;
            for f in [e.composed, e.gpu_capability, e.load.factor, e.util.factor] {
                assert!(f.is_finite() && f >= 0.0, "{f} in {e:?}");
            }
            assert!(!b.eligible || e.composed > 0.0, "{e:?}");
            assert!(!b.reason().contains('\n'), "{:?}", b.reason());
        }
        assert!(m.backends.windows(2).all(|w| addr_key(&w[0].address) < addr_key(&w[1].address)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Garbage never panics; weights are never negative or NaN; eligible means weight > 0.
    #[test]
    fn any_metadata_gives_sane_weights(cfg in arb_config(), rounds in proptest::collection::vec(proptest::collection::vec(arb_instance(), 0..12), 1..4)) {
        let mut st = PolicyState::default();
        for r in rounds {
            let p = plan(&snap(r), &cfg, &mut st);
            check_weights(&p);
            let json = serde_json::to_string(&p).expect("a plan serialises");
            prop_assert!(!json.is_empty());
        }
    }

    /// Same inputs and same state: same plan and same next state; unchanged inputs again:
    /// unchanged tables.
    #[test]
    fn deterministic_and_stable(cfg in arb_config(), first in proptest::collection::vec(arb_instance(), 0..12), second in proptest::collection::vec(arb_instance(), 0..12)) {
        let (mut a, mut b) = (PolicyState::default(), PolicyState::default());
        for s in [snap(first), snap(second)] {
            let pa = plan(&s, &cfg, &mut a);
            let pb = plan(&s, &cfg, &mut b);
            prop_assert_eq!(&pa, &pb);
            prop_assert_eq!(&a, &b);
            let again = plan(&s, &cfg, &mut a);
            let tables = |p: &Plan| p.values().map(outcome).collect::<Vec<_>>();
            prop_assert_eq!(tables(&pa), tables(&again));
        }
    }

    /// Any permutation of the registry's answer gives the same plan and the same state.
    #[test]
    fn order_of_instances_does_not_matter(cfg in arb_config(), instances in proptest::collection::vec(arb_instance(), 0..12), seed in any::<u64>(), next in proptest::collection::vec(arb_instance(), 0..12)) {
        let mut shuffled = instances.clone();
        // A seeded Fisher-Yates shuffle (proptest's own value, so failures replay).
        let mut x = seed | 1;
        for i in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (mut a, mut b) = (PolicyState::default(), PolicyState::default());
        prop_assert_eq!(plan(&snap(instances), &cfg, &mut a), plan(&snap(shuffled), &cfg, &mut b));
        prop_assert_eq!(&a, &b);
        let mut rev = next.clone();
        rev.reverse();
        prop_assert_eq!(plan(&snap(next), &cfg, &mut a), plan(&snap(rev), &cfg, &mut b));
    }
}

#[test]
fn memory_capacity_is_the_most_free_memory_reported() {
    let cfg = config("");
    let mut state = PolicyState::default();
    let mut cap_after = |free: &str| {
        let p = plan(&snap(vec![inst(1, &[("remaining_memory_mb", free)])]), &cfg, &mut state);
        let b = &p["m"].backends[0];
        (b.free_memory_mb, b.memory_capacity_mb)
    };
    assert_eq!(cap_after("20000"), (Some(20000), Some(20000)));
    assert_eq!(cap_after("3000"), (Some(3000), Some(20000)), "a busy GPU keeps its idle capacity");
    assert_eq!(cap_after("25000"), (Some(25000), Some(25000)));
    // Never reported: no capacity, so no queueing fallback in the kernel.
    let p = run(&cfg, vec![inst(2, &[])]);
    assert_eq!((p.backends[0].free_memory_mb, p.backends[0].memory_capacity_mb), (None, None));
}

#[test]
fn seeded_weights_are_held_by_a_restarted_policy() {
    // A restarted daemon seeds the weights the previous one wrote: its first plan, whose
    // candidate moved less than min_weight_change from them, emits them again.
    let cfg = config("[policy]\nload_factor = true\n");
    let two = |a: &str, b: &str| snap(vec![inst(1, &[("current_requests", a)]), inst(2, &[("current_requests", b)])]);
    let (a1, a2) = (inst(1, &[]).address, inst(2, &[]).address);
    let mut st = PolicyState::default();
    st.seed_weights("m", [(a1, 1000), (a2, 500)].into_iter().collect());
    let p = plan(&two("0", "1.1"), &cfg, &mut st).remove("m").unwrap();
    assert_eq!((outcome(&p), p.weights_held), (vec![(true, 1000), (true, 500)], true));
    // Without the seed the same plan takes the candidate.
    let p = plan(&two("0", "1.1"), &cfg, &mut PolicyState::default()).remove("m").unwrap();
    assert_eq!((outcome(&p), p.weights_held), (vec![(true, 1000), (true, 476)], false));
    // An empty seed is no seed.
    let mut st = PolicyState::default();
    st.seed_weights("m", BTreeMap::new());
    assert!(st.last_weights("m").is_none());
}

#[test]
fn a_seeded_capacity_survives_a_busy_first_report() {
    // A restarted daemon seeds the capacity the previous one wrote: the first report after
    // the restart (a busy GPU) does not shrink it, a larger one still raises it.
    let cfg = config("");
    let mut state = PolicyState::default();
    let addr = inst(1, &[]).address;
    state.seed_capacity("m", addr, 20000);
    let cap_after = |state: &mut PolicyState, free: &str| {
        let p = plan(&snap(vec![inst(1, &[("remaining_memory_mb", free)])]), &cfg, state);
        p["m"].backends[0].memory_capacity_mb
    };
    assert_eq!(cap_after(&mut state, "3000"), Some(20000));
    assert_eq!(cap_after(&mut state, "22000"), Some(22000));
    state.seed_capacity("m", addr, 1000);
    assert_eq!(cap_after(&mut state, "3000"), Some(22000), "a smaller seed lowers nothing");
}

#[test]
fn a_catalog_of_plain_specs_plans_as_the_config_does() {
    // The policy reads only the spec of each model: a catalog built without a config file
    // (no Nacos services) plans exactly as the validated config's catalog.
    let cfg = config_with_model("required_memory_mb = 8192\naffinity_ttl = \"10m\"", "");
    let specs: BTreeMap<String, ModelSpec> = cfg.models.iter().map(|(n, m)| (n.clone(), m.spec.clone())).collect();
    assert_eq!(specs["m"].affinity_ttl, Some(std::time::Duration::from_secs(600)));
    let s = snap(vec![inst(1, &[("remaining_memory_mb", "9000")]), inst(2, &[("remaining_memory_mb", "100")])]);
    let (mut a, mut b) = (PolicyState::default(), PolicyState::default());
    let from_specs = super::plan(&s, &specs, &cfg.policy, &mut a);
    assert_eq!(from_specs, plan(&s, &cfg, &mut b));
    assert_eq!(a, b);
    assert_eq!(outcome(&from_specs["m"]), [(true, 1), (false, 0)]);
    // A model gone from the catalog is forgotten.
    super::plan(&s, &BTreeMap::<String, ModelSpec>::new(), &cfg.policy, &mut a);
    assert_eq!(a, PolicyState::default());
}

#[test]
fn a_served_backend_carries_its_reason_where_it_always_did() {
    let cfg = config_with_model("required_memory_mb = 8192", "");
    let p = run(&cfg, vec![inst(1, &[("remaining_memory", "12")]), inst(2, &[("remaining_memory", "6")])]);
    assert!(p.backends[0].reason().starts_with("eligible: weight"), "{}", p.backends[0].reason());
    assert!(p.backends[1].reason().starts_with("excluded: memory:"), "{}", p.backends[1].reason());
    for b in &p.backends {
        let json = serde_json::to_string(b).unwrap();
        let fields =
            ["address", "weight", "cap", "free_memory_mb", "memory_capacity_mb", "eligible", "reason", "explain"];
        let at: Vec<usize> = fields.iter().map(|f| json.find(&format!("\"{f}\":")).expect(f)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "fields in their order: {json}");
        let reason = serde_json::to_string(&b.reason()).unwrap();
        assert!(json.contains(&format!(",\"reason\":{reason},\"explain\":")), "{json}");
        assert_eq!(&serde_json::from_str::<PlannedBackend>(&json).unwrap(), b, "reads back");
    }
}

#[test]
fn shown_signals_are_explained_and_change_no_weight() {
    let shown = [("kv_cache_usage", "0.25"), ("prefix_cache_hit_rate", "0.9")];
    let p = run(&config(""), vec![inst(1, &shown), inst(2, &[])]);
    let (a, b) = (&p.backends[0], &p.backends[1]);
    let info = a.explain.reasons.iter().find(|r| r.starts_with("info: ")).expect("an info line");
    assert!(info.contains("kv_cache_usage 0.25") && info.contains("prefix_cache_hit_rate 0.9"), "{info}");
    assert_eq!((a.eligible, a.weight), (b.eligible, b.weight), "shown signals do not score");
}

#[test]
fn the_prefix_lifetime_is_the_longest_fill_time_of_the_eligible_caches() {
    let fill = |capacity: &'static str, rate: &'static str| {
        [("kv_cache_capacity_tokens", capacity), ("prompt_tokens_per_s", rate)]
    };
    let model = "prefix = \"approximate\"\nprefix_ttl = \"60s\"";
    let cfg = config_with_model(model, "");
    // 100,000 tokens at 10,000/s fill in 10 s, 60,000 at 4,000/s in 15 s: 1.25 x 15 s.
    let p = run(&cfg, vec![inst(1, &fill("100000", "10000")), inst(2, &fill("60000", "4000")), inst(3, &[])]);
    assert_eq!(p.prefix_ttl, Some(Duration::from_millis(18_750)));
    // An excluded backend's cache does not count.
    let mut down = fill("60000", "4000").to_vec();
    down.push(("health_status", "unhealthy"));
    let p = run(&cfg, vec![inst(1, &fill("100000", "10000")), inst(2, &down)]);
    assert_eq!(p.prefix_ttl, Some(Duration::from_millis(12_500)));
    // Nothing reported, or caches that take longer than the cap to fill: the cap.
    assert_eq!(run(&cfg, vec![inst(1, &[])]).prefix_ttl, Some(Duration::from_secs(60)));
    assert_eq!(run(&cfg, vec![inst(1, &fill("100000", "100"))]).prefix_ttl, Some(Duration::from_secs(60)));
    // The model's own factor; 0 keeps the lifetime fixed; no lifetime stays none.
    let at = |fields: &str| run(&config_with_model(fields, ""), vec![inst(1, &fill("100000", "10000"))]).prefix_ttl;
    assert_eq!(at(&format!("{model}\nprefix_ttl_fill = 2")), Some(Duration::from_secs(20)));
    assert_eq!(at(&format!("{model}\nprefix_ttl_fill = 0")), Some(Duration::from_secs(60)));
    assert_eq!(at("prefix = \"approximate\"\nprefix_ttl = \"0s\""), None);
    // A value out of range is shown and ignored, as every signal's is.
    let p = run(&cfg, vec![inst(1, &[("kv_cache_capacity_tokens", "-5"), ("prompt_tokens_per_s", "10")])]);
    assert_eq!(p.prefix_ttl, Some(Duration::from_secs(60)));
    assert!(
        p.backends[0].explain.invalid.iter().any(|f| f.key == "kv_cache_capacity_tokens"),
        "{:?}",
        p.backends[0].explain
    );
}

#[test]
fn a_prefix_ttl_fill_out_of_range_stops_start_up_naming_the_field() {
    for bad in ["-1", "101", "nan"] {
        let text = format!("{CATALOG}prefix_ttl_fill = {bad}\n");
        let e =
            Config::parse(&text, "t").map_err(|e| e.to_string()).and_then(|c| c.validate().map_err(|e| e.to_string()));
        let e = e.expect_err(bad);
        assert!(e.contains("models[0].prefix_ttl_fill"), "{e}");
    }
    assert_eq!(config("").models["m"].spec.prefix_ttl_fill_milli, 1250);
}
