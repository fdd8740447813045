//! Table build cost: `cargo bench -p ailb-common --features std --bench maglev`.
//! Goal: 1,000 backends at M = 65521 in <= 50 ms (a rebuild on every weight change stays cheap).

use ailb_common::{
    hash::backend_key,
    maglev::{build, table_size_for, MaglevBackend},
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

/// Weights: equal, 1..7, or spread like the policy's (33..1000: GPU capability x load x
/// utilisation factors).
#[derive(Clone, Copy)]
enum Weights {
    Equal,
    Small,
    Policy,
    /// 1..3, the scale bench's recompute (16 backends a model).
    Narrow,
}

fn fleet(n: u32, weights: Weights) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| MaglevBackend {
            id: i,
            key: backend_key(0x0000_007f + (i << 8), 8000u16.to_be(), 0),
            weight: match weights {
                Weights::Equal => 1,
                Weights::Small => 1 + i % 7,
                Weights::Policy => 1000 / (1 + (i * 7919) % 30),
                Weights::Narrow => 1 + i % 3,
            },
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("maglev_build");
    g.sample_size(20);
    let cases = [
        (10u32, Weights::Equal),
        (16, Weights::Narrow),
        (100, Weights::Small),
        (90, Weights::Policy),
        (1000, Weights::Equal),
        (1000, Weights::Small),
    ];
    for (n, weights) in cases {
        let backends = fleet(n, weights);
        let m = table_size_for(n as usize);
        let label = format!(
            "{n}{}_M{m}",
            match weights {
                Weights::Equal => "",
                Weights::Small => "_weighted",
                Weights::Policy => "_policy_weights",
                Weights::Narrow => "_weights_1_to_3",
            }
        );
        g.bench_with_input(BenchmarkId::from_parameter(label), &backends, |b, backends| {
            b.iter(|| build(backends, m).expect("table"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
