//! Policy plus table recompute for 100 models x 100 backends (goal: <= 100 ms on a
//! 2-core machine, so that a fleet-wide change reaches the kernel well within the 1 s propagation goal): `cargo bench -p ailb-userspace --bench plan`.

use std::{collections::BTreeMap, net::SocketAddr};

use ailb_common::{
    hash::backend_key,
    maglev::{table_size_for, MaglevBackend},
};
use ailb_userspace::{
    config::Config,
    datapath::tables::build_all,
    discovery::{Instance, Snapshot},
    policy::{self, PolicyState},
};
use criterion::{criterion_group, criterion_main, Criterion};

const MODELS: usize = 100;
const BACKENDS: usize = 100;

fn fleet() -> (ailb_userspace::config::ValidConfig, Snapshot) {
    // The kernel maps hold 32 models; the policy itself has no such limit, and the
    // goal is stated for 100 models, so the catalog is widened after validation.
    let text = "[[models]]\nname = \"model-0\"\nvips = [\"127.77.0.1:8000\"]\nrequired_memory_mb = 8000\n";
    let mut cfg = Config::parse(text, "bench").expect("config").validate().expect("valid");
    let template = cfg.models["model-0"].clone();
    for m in 1..MODELS {
        let mut model = template.clone();
        model.spec.vips = vec![SocketAddr::new([127, 77, (m / 200) as u8, (m % 200 + 1) as u8].into(), 8000)];
        model.nacos_services = vec![format!("model-{m}")];
        cfg.models.insert(format!("model-{m}"), model);
    }
    let gpus = ["A100-80GB", "RTX3090-24GB", "H100-80GB", "L40S-48GB"];
    let mut instances = Vec::with_capacity(MODELS * BACKENDS);
    for m in 0..MODELS {
        for b in 0..BACKENDS {
            let i = m * BACKENDS + b;
            let mut md = BTreeMap::new();
            md.insert("model_id".to_string(), format!("model-{m}"));
            md.insert("gpu_type".to_string(), gpus[i % gpus.len()].to_string());
            md.insert("remaining_memory".to_string(), format!("{}", 6 + i % 20));
            md.insert("gpu_util".to_string(), format!("{}", (i * 37) % 100));
            md.insert("current_requests".to_string(), format!("{}", i % 9));
            md.insert("queue_length".to_string(), format!("{}", i % 4));
            md.insert("health_status".to_string(), "healthy".to_string());
            instances.push(Instance {
                model: format!("model-{m}"),
                service: format!("model-{m}"),
                group: "DEFAULT_GROUP".into(),
                cluster: "DEFAULT".into(),
                address: SocketAddr::new([10, (i >> 16) as u8, (i >> 8) as u8, i as u8].into(), 8000),
                weight: 1.0,
                healthy: true,
                enabled: true,
                metadata: md.into(),
            });
        }
    }
    (cfg, Snapshot { instances, services: Vec::new() })
}

fn bench(c: &mut Criterion) {
    let (cfg, snap) = fleet();
    let mut g = c.benchmark_group("plan_100_models_x_100_backends");
    g.sample_size(10);
    g.bench_function("policy_only", |b| {
        b.iter(|| {
            let mut state = PolicyState::default();
            policy::plan(&snap, &cfg.models, &cfg.policy, &mut state).len()
        })
    });
    // As the daemon does it: the policy, then every model's table through `build_all` (on all
    // cores; this machine has 2).
    g.bench_function("policy_and_tables", |b| {
        b.iter(|| {
            let mut state = PolicyState::default();
            let p = policy::plan(&snap, &cfg.models, &cfg.policy, &mut state);
            let members: Vec<Vec<MaglevBackend>> = p
                .values()
                .map(|mp| {
                    mp.backends
                        .iter()
                        .enumerate()
                        .filter(|(_, b)| b.eligible && b.weight > 0)
                        .map(|(i, b)| MaglevBackend {
                            id: i as u32,
                            key: match b.address {
                                SocketAddr::V4(a) => {
                                    backend_key(u32::from_ne_bytes(a.ip().octets()), a.port().to_be(), 0)
                                }
                                SocketAddr::V6(_) => unreachable!("the bench's backends are IPv4"),
                            },
                            weight: b.weight,
                        })
                        .collect()
                })
                .collect();
            let jobs: Vec<(&[MaglevBackend], u32)> =
                members.iter().filter(|m| !m.is_empty()).map(|m| (m.as_slice(), table_size_for(m.len()))).collect();
            build_all(&jobs).into_iter().map(|b| b.table.expect("table").len()).sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
