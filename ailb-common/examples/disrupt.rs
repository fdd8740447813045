//! Prints how many slots move when one backend is removed, and the build time.
//! `cargo run --release -p ailb-common --features std --example disrupt`
use ailb_common::hash::backend_key;
use ailb_common::maglev::*;
fn main() {
    for &(n, m) in &[(10u32, 1021u32), (16, 2039), (10, 4093), (100, 16381), (100, 65521), (1000, 65521)] {
        let all: Vec<_> = (0..n)
            .map(|i| MaglevBackend {
                id: i,
                key: backend_key(0x7f00_0001u32.to_be() + i, 8000u16.to_be(), 42),
                weight: 1 + i % 3,
            })
            .collect();
        let t = std::time::Instant::now();
        let t1 = build(&all, m).unwrap();
        let el = t.elapsed();
        let mut worst = 0.0f64;
        for r in [0, n / 3, n / 2, n - 1] {
            let rest: Vec<_> = all.iter().copied().filter(|b| b.id != r).collect();
            let t2 = build(&rest, m).unwrap();
            let moved = t1.iter().zip(&t2).filter(|(a, b)| a != b).count() as f64 / m as f64 * n as f64;
            worst = worst.max(moved);
        }
        println!(
            "N={n} M={m} weights 1..3: removing one backend moves at most {worst:.2}/N of the slots; build {el:?}"
        );
    }
}
