use super::*;

#[test]
fn extents_start_on_chunks_and_freed_runs_merge() {
    let mut a = Arena::new("limits.table_slots", 1024, 10);
    let x = a.alloc(4093).unwrap();
    let y = a.alloc(1).unwrap();
    let z = a.alloc(2048).unwrap();
    assert_eq!((x.pos, y.pos, z.pos), (0, 4096, 5120));
    assert_eq!(a.free_entries(), 3 * 1024);
    a.release(x);
    a.release(y);
    assert_eq!(a.free_entries(), 3 * 1024, "released extents wait out their grace");
    a.reclaim(Duration::ZERO);
    assert_eq!(a.free.iter().map(|(&s, &n)| (s, n)).collect::<Vec<_>>(), vec![(0, 5), (7, 3)]);
    assert_eq!(a.alloc(5 * 1024).unwrap().pos, 0, "the merged run holds a 5-chunk extent");
}

#[test]
fn a_full_arena_waits_for_released_extents_then_names_its_field() {
    let mut a = Arena::new("limits.table_slots", 1024, 4);
    let x = a.alloc(4093).unwrap();
    a.release(x);
    let started = Instant::now();
    let y = a.alloc(4093).unwrap();
    assert!(started.elapsed() >= GRACE, "reused before the grace ended");
    assert_eq!(y.pos, 0);
    let e = a.alloc(1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "limits.table_slots = 4096 is full: 1024 more needed, 0 free (raise it; a new size takes effect after \
             `ailb teardown`)"
    );
}

#[test]
fn reserve_takes_exactly_the_extent_and_refuses_overlaps() {
    let mut a = Arena::new("limits.member_slots", 16, 8);
    assert!(a.reserve(Extent { pos: 32, len: 20 }));
    assert!(!a.reserve(Extent { pos: 48, len: 1 }), "chunk 3 is taken");
    assert!(!a.reserve(Extent { pos: 8, len: 1 }), "not on a chunk");
    assert!(!a.reserve(Extent { pos: 112, len: 32 }), "past the end");
    assert_eq!(a.free.iter().map(|(&s, &n)| (s, n)).collect::<Vec<_>>(), vec![(0, 2), (4, 4)]);
}
