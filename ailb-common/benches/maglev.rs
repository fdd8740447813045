//! Table build cost: `cargo bench -p ailb-common --features std --bench maglev`.
//! Goal from the issue: 1,000 backends at M = 65521 in <= 50 ms.

use ailb_common::{
    hash::backend_key,
    maglev::{build, table_size_for, MaglevBackend},
};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn fleet(n: u32, weighted: bool) -> Vec<MaglevBackend> {
    (0..n)
        .map(|i| MaglevBackend {
            id: i,
            key: backend_key(0x0000_007f + (i << 8), 8000u16.to_be(), 0),
            weight: if weighted { 1 + i % 7 } else { 1 },
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("maglev_build");
    g.sample_size(20);
    for &(n, weighted) in &[(10u32, false), (100, true), (1000, false), (1000, true)] {
        let backends = fleet(n, weighted);
        let m = table_size_for(n as usize);
        let label = format!("{n}{}_M{m}", if weighted { "_weighted" } else { "" });
        g.bench_with_input(BenchmarkId::from_parameter(label), &backends, |b, backends| {
            b.iter(|| build(backends, m).expect("table"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
