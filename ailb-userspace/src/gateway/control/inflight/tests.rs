use super::*;
use crate::gateway::control::plan;
use crate::policy::{self, Plan};
use crate::{config::Config, discovery::from_static};

/// The plan the daemon makes of a catalog with model `m` and two static backends, capped at 16
/// and 64 in flight.
fn planned() -> Plan {
    let text = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n\
                [[backends]]\nmodel = \"m\"\naddress = \"10.1.0.1:80\"\nweight = 1\nmax_inflight = 16\n\
                [[backends]]\nmodel = \"m\"\naddress = \"10.1.0.2:80\"\nweight = 3\nmax_inflight = 64\n";
    let cfg = Config::parse(text, "test").and_then(|c| c.validate()).unwrap();
    policy::plan(&from_static(&cfg.backends), &cfg.models, &cfg.policy, &mut Default::default())
}

/// A model's plan with `backends` as (weight, cap, eligible).
fn model(backends: &[(u32, u32, bool)]) -> ModelPlan {
    let template = planned()["m"].backends[0].clone();
    let backends = backends
        .iter()
        .map(|&(weight, cap, eligible)| PlannedBackend { weight, cap, eligible, ..template.clone() })
        .collect();
    ModelPlan { backends, ..Default::default() }
}

#[test]
fn capacity_is_the_sum_of_the_members_caps() {
    assert_eq!(capacity(&model(&[(3, 64, true), (1, 16, true)])), Some(80));
    // Not members (excluded, or weight 0): their caps do not count.
    assert_eq!(capacity(&model(&[(3, 64, true), (1, 16, false), (0, 16, true)])), Some(64));
    assert_eq!(capacity(&model(&[(3, 64, true), (1, 0, true)])), None, "a member without a cap");
    assert_eq!(capacity(&model(&[(1, 16, false)])), None, "no member");
}

#[test]
fn the_plan_parses_as_the_daemon_serves_it() {
    let served = serde_json::to_string(&policy::PlanView { generation: 1, models: planned() }).unwrap();
    let plan = plan::parse(&served).unwrap();
    assert_eq!(capacity(&plan.unwrap().models["m"]), Some(80));
}
