use std::{
    collections::BTreeSet,
    sync::{Arc, RwLock},
};

use super::*;
use crate::{
    config::Config,
    daemon::http,
    discovery::{Instance, Snapshot},
    gateway::control::plan,
    policy::{self, PolicyState},
};

fn inst(i: u8, meta: &[(&str, &str)]) -> Instance {
    Instance::test(i, meta)
}

/// A plan with an eligible backend (every factor reported), one excluded for memory, and
/// two whose every metadata key is invalid (each of the two memory keys once).
fn view() -> PlanView {
    let text = "[policy.gpu_capability]\n\"A100-80GB\" = 2.0\n[[models]]\nname = \"m\"\n\
                vips = [\"127.77.0.1:8000\"]\nrequired_memory_mb = 8192\naffinity_ttl = \"10m\"\n";
    let cfg = Config::parse(text, "t").unwrap().validate().unwrap();
    let garbage: Vec<(&str, &str)> = [
        "model_id",
        "supported_models",
        "model_version",
        "supported_tasks",
        "gpu_type",
        "gpu_memory_total_mb",
        "gpu_util",
        "current_requests",
        "queue_length",
        "health_status",
        "max_inflight",
        "kv_cache_usage",
        "agent_version",
        "updated_at_ms",
    ]
    .into_iter()
    .map(|k| (k, if k.starts_with("supported") { "," } else { "" }))
    .collect();
    let with = |key: &'static str| garbage.iter().copied().chain([(key, "lots")]).collect::<Vec<_>>();
    let snapshot = Snapshot {
        instances: vec![
            inst(
                1,
                &[
                    ("gpu_type", "A100-80GB"),
                    ("remaining_memory_mb", "20000"),
                    ("gpu_util", "25"),
                    ("current_requests", "2"),
                    ("max_inflight", "16"),
                ],
            ),
            inst(2, &[("remaining_memory", "6")]),
            inst(3, &with("remaining_memory_mb")),
            inst(4, &with("remaining_memory")),
        ],
        services: Vec::new(),
    };
    let models = policy::plan(&snapshot, &cfg.models, &cfg.policy, &mut PolicyState::default());
    PlanView { generation: 7, models }
}

#[test]
fn the_plan_reads_back_as_the_daemon_serves_it() {
    let v = view();
    // The daemon serves its `Option<PlanView>` through `axum::Json`, i.e. serde_json.
    let body = serde_json::to_string(&Some(&v)).unwrap();
    assert_eq!(plan::parse(&body).unwrap(), Some(v.clone()));
    assert_eq!(plan::parse(&serde_json::to_string(&None::<PlanView>).unwrap()).unwrap(), None);
    // Every metadata key of the contract can be named in an explanation and reads back.
    let named: BTreeSet<&str> = v.models["m"]
        .backends
        .iter()
        .flat_map(|b| b.explain.invalid.iter().map(|f| f.key).chain([b.explain.memory.key]))
        .collect();
    assert_eq!(named.len(), 16, "{named:?}");
    assert!(plan::parse(&body.replace("\"gpu_util\"", "\"gpu_utilisation\"")).is_err(), "unknown keys are refused");
}

#[test]
fn the_json_keeps_the_keys_that_clients_read() {
    let v = serde_json::to_value(view()).unwrap();
    assert_eq!(v["generation"], 7);
    let m = &v["models"]["m"];
    assert_eq!(m["vips"], serde_json::json!(["127.77.0.1:8000"]));
    assert_eq!((&m["available"], &m["weights_held"], &m["affinity_ttl"]), (&true.into(), &false.into(), &"10m".into()));
    let b = &m["backends"][0];
    assert_eq!(b["address"], "10.0.0.1:8000");
    assert_eq!(
        (&b["eligible"], &b["weight"], &b["cap"], &b["free_memory_mb"]),
        (&true.into(), &1000.into(), &16.into(), &20000.into())
    );
    assert!(b["reason"].as_str().is_some_and(|r| r.starts_with("eligible: weight 1000")), "{b}");
    assert_eq!(b["explain"]["util"]["smoothed"], 25.0);
    assert_eq!(b["explain"]["util"]["band"], "low");
    let excluded = &m["backends"][1];
    assert_eq!((&excluded["eligible"], &excluded["weight"]), (&false.into(), &0.into()));
    assert_eq!(excluded["explain"]["excluded_by"], "memory");
    assert_eq!(m["backends"][2]["explain"]["invalid"][0]["effect"], "excluded");
}

#[test]
fn explain_json_nests_the_models_plan() {
    let plan = model_plan(Some(view()), "m").unwrap();
    let out = serde_json::to_value(ExplainOutput { request: None, model: "m", plan: Some(plan), conversation: None })
        .unwrap();
    assert_eq!(out["model"], "m");
    assert_eq!(out["plan"]["backends"][0]["address"], "10.0.0.1:8000");
    assert_eq!(out["plan"]["backends"][1]["eligible"], false);
    assert!(out["conversation"].is_null());
    let e = model_plan(Some(view()), "other").unwrap_err().to_string();
    assert!(e.contains("\"other\"") && e.contains("[\"m\"]"), "{e}");
    let e = model_plan(None, "m").unwrap_err().to_string();
    assert!(e.contains("(models: [])"), "{e}");
}

#[tokio::test]
async fn explain_fetches_what_the_endpoint_serves() {
    let shared = Arc::new(http::Shared { registry: Default::default(), plan: RwLock::new(None) });
    let addr = http::serve("127.0.0.1:0".parse().unwrap(), shared.clone()).await.unwrap();
    assert_eq!(fetch_plan(addr).await.unwrap(), None, "before the first plan");
    *shared.plan.write().unwrap() = Some(view());
    assert_eq!(fetch_plan(addr).await.unwrap(), Some(view()));
}
