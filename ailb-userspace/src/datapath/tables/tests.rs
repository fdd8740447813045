use super::*;
use ailb_common::maglev::table_size_for;

#[test]
fn parallel_builds_equal_serial_ones_in_job_order() {
    let fleets: Vec<Vec<MaglevBackend>> = (1..40u32)
        .map(|n| {
            (0..n)
                .map(|i| MaglevBackend {
                    id: i,
                    key: u64::from(n) << 32 | u64::from(i.wrapping_mul(2654435761)),
                    weight: 1 + i % 5,
                })
                .collect()
        })
        .collect();
    let mut jobs: Vec<(&[MaglevBackend], u32)> =
        fleets.iter().map(|f| (f.as_slice(), table_size_for(f.len()))).collect();
    // One bad job: its error comes back in its place, the others are unaffected.
    jobs.insert(3, (fleets[5].as_slice(), 4096));
    let all = build_all(&jobs);
    assert_eq!(all.len(), jobs.len());
    for ((members, size), got) in jobs.iter().zip(&all) {
        assert_eq!(got.table, maglev::build(members, *size));
    }
    assert!(matches!(all[3].table, Err(MaglevError::SizeNotPrime(4096))));
    // Streamed: the same tables, handed over in job order.
    let mut order = Vec::new();
    build_streamed(&jobs, |j, got| {
        assert_eq!(got.table, all[j].table, "job {j}");
        order.push(j);
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(order, (0..jobs.len()).collect::<Vec<_>>());
    // An error of the taker stops the stream and comes back.
    let mut taken = 0;
    let stopped = build_streamed(&jobs, |j, _| {
        if j == 5 {
            return Err(j);
        }
        taken += 1;
        Ok(())
    });
    assert_eq!(stopped, Err(5));
    assert_eq!(taken, 5);
}
