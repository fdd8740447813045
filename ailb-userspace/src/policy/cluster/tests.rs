use std::collections::BTreeMap;

use super::super::{plan, ModelPlan, PolicyState};
use crate::{
    config::{Config, ValidConfig},
    discovery::{Instance, Snapshot},
};

fn config(daemon: &str, model: &str, policy: &str) -> ValidConfig {
    let text = format!(
        "[daemon]\n{daemon}\n[policy]\n{policy}\n[[models]]\nname = \"m\"\nvips = [\"127.77.0.1:8000\"]\n{model}\n"
    );
    Config::parse(&text, "t").unwrap().validate().unwrap()
}

/// Backend `i` of cluster `c`, with a cap of 4 and `running` requests.
fn inst(i: u8, c: &str, running: &str) -> Instance {
    let mut x = Instance::test(i, &[("max_inflight", "4"), ("current_requests", running), ("queue_length", "0")]);
    x.cluster = c.to_string();
    x
}

fn run(cfg: &ValidConfig, state: &mut PolicyState, instances: Vec<Instance>) -> ModelPlan {
    let models: BTreeMap<_, _> = cfg.models.iter().map(|(k, v)| (k.clone(), v.spec.clone())).collect();
    plan(&Snapshot { instances, services: Vec::new() }, &models, &cfg.policy, state).remove("m").unwrap()
}

fn last_octet(a: &std::net::SocketAddr) -> u8 {
    match a.ip() {
        std::net::IpAddr::V4(v4) => v4.octets()[3],
        std::net::IpAddr::V6(v6) => v6.octets()[15],
    }
}

/// The addresses' last octets that are in the table.
fn serving(p: &ModelPlan) -> Vec<u8> {
    p.backends.iter().filter(|b| b.weight > 0).map(|b| last_octet(&b.address)).collect()
}

fn reason(p: &ModelPlan, i: u8) -> String {
    p.backends.iter().find(|b| last_octet(&b.address) == i).unwrap().reason()
}

#[test]
fn own_cluster_serves_and_others_wait_with_the_reason() {
    let cfg = config("cluster = \"a\"", "", "");
    let mut st = PolicyState::default();
    let p = run(&cfg, &mut st, vec![inst(1, "a", "1"), inst(2, "a", "2"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2]);
    let r = reason(&p, 3);
    assert!(r.contains("other_cluster") && r.contains("other cluster \"b\", own cluster \"a\" serving"), "{r}");
    assert!(r.contains("3 running + queued of 8"), "{r}");
    assert_eq!(p.backends[2].explain.excluded_by, Some(super::Exclusion::OtherCluster));
    // No own cluster configured: no preference.
    let p = run(&config("", "", ""), &mut PolicyState::default(), vec![inst(1, "a", "1"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 3]);
}

#[test]
fn spills_when_the_own_cluster_is_gone_excluded_or_saturated() {
    let cfg = config("cluster = \"a\"", "", "");
    let mut st = PolicyState::default();
    // Gone: only cluster b listed.
    let p = run(&cfg, &mut st, vec![inst(3, "b", "0")]);
    assert_eq!(serving(&p), [3]);
    assert!(p.backends[0].explain.reasons.iter().any(|r| r.contains("has no eligible backend: spilling here")));
    // Excluded: cluster a's only backend is unhealthy.
    let mut sick = inst(1, "a", "0");
    sick.healthy = false;
    assert_eq!(serving(&run(&cfg, &mut st, vec![sick, inst(3, "b", "0")])), [3]);
    // Saturated: 8 of 8 slots (threshold 1.0) -> every eligible backend serves.
    let mut st = PolicyState::default();
    let p = run(&cfg, &mut st, vec![inst(1, "a", "4"), inst(2, "a", "4"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2, 3]);
    assert!(reason(&p, 3).contains("load"), "spilled backends keep their weight reason");
    assert!(p.backends[2].explain.reasons.iter().any(|r| r.contains("is saturated (8 running + queued of 8)")));
    // Hysteresis: 7.5 of 8 (>= 0.9) keeps the spill; 7 of 8 ends it.
    let p = run(&cfg, &mut st, vec![inst(1, "a", "4"), inst(2, "a", "3.5"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2, 3]);
    let p = run(&cfg, &mut st, vec![inst(1, "a", "4"), inst(2, "a", "3"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2]);
    // 7.5 of 8 from a plan that was not spilling stays home.
    let p = run(&cfg, &mut st, vec![inst(1, "a", "4"), inst(2, "a", "3.5"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2]);
}

#[test]
fn thresholds_and_capacity_per_model() {
    // A model threshold of 0.5: 4 of 8 spills.
    let cfg = config("cluster = \"a\"", "spill_saturation = 0.5", "");
    let p = run(&cfg, &mut PolicyState::default(), vec![inst(1, "a", "2"), inst(2, "a", "2"), inst(3, "b", "0")]);
    assert_eq!(serving(&p), [1, 2, 3]);
    // No cap and no backend_capacity: load never spills; with backend_capacity = 2 it does.
    let nocap = |i: u8, c: &str| {
        let mut x = Instance::test(i, &[("current_requests", "50")]);
        x.cluster = c.to_string();
        x
    };
    let cfg = config("cluster = \"a\"", "", "");
    let p = run(&cfg, &mut PolicyState::default(), vec![nocap(1, "a"), nocap(3, "b")]);
    assert_eq!(serving(&p), [1]);
    assert!(reason(&p, 3).contains("no capacity reported"), "{}", reason(&p, 3));
    let cfg = config("cluster = \"a\"", "backend_capacity = 2", "spill_saturation = 5.0");
    assert_eq!(serving(&run(&cfg, &mut PolicyState::default(), vec![nocap(1, "a"), nocap(3, "b")])), [1, 3]);
}

#[test]
fn bad_cluster_settings_name_the_field() {
    let err = |daemon: &str, model: &str, policy: &str| {
        let text = format!(
            "[daemon]\n{daemon}\n[policy]\n{policy}\n[[models]]\nname = \"m\"\nvips = [\"127.77.0.1:8000\"]\n{model}\n"
        );
        Config::parse(&text, "t").unwrap().validate().unwrap_err().to_string()
    };
    let e = err("cluster = \" \"", "", "");
    assert!(e.contains("daemon.cluster"), "{e}");
    let e = err("", "spill_saturation = 0.0", "");
    assert!(e.contains("models[0].spill_saturation") && e.contains('0'), "{e}");
    let e = err("", "backend_capacity = 0", "");
    assert!(e.contains("models[0].backend_capacity"), "{e}");
    let e = err("", "", "spill_saturation = 11.0");
    assert!(e.contains("policy.spill_saturation") && e.contains("11"), "{e}");
}
