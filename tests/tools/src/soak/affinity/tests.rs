use super::*;

fn addrs(pairs: &[(u32, &str)]) -> Addresses {
    pairs.iter().map(|&(id, a)| (id, a.to_string())).collect()
}

#[test]
fn untouched_entries_must_come_back_with_the_same_backend_and_address() {
    let before: Entries = [((0, 0, 1), (3, 100)), ((0, 0, 2), (4, 100)), ((0, 1, 7), (3, 50))].into();
    let ids = addrs(&[(3, "10.0.0.3:80"), (4, "10.0.0.4:80")]);
    // Nothing touched, nothing renumbered.
    let k = compare(&before, &before, &ids, &ids);
    assert_eq!(k, Kept { before: 3, untouched_kept: 3, ..Kept::default() });
    assert!(k.met());
    // The traffic re-picked one (its last use moved) and refreshed another: not the restart's.
    let mut after = before.clone();
    after.insert((0, 0, 1), (4, 200));
    after.insert((0, 0, 2), (4, 300));
    let k = compare(&before, &after, &ids, &ids);
    assert_eq!((k.untouched_kept, k.touched_moved, k.touched_same, k.untouched_lost), (1, 1, 1, 0));
    assert!(k.met());
    // A renumbered backend: id 3 now names another address.
    let renumbered = addrs(&[(3, "10.0.0.9:80"), (4, "10.0.0.4:80")]);
    let k = compare(&before, &before, &ids, &renumbered);
    assert_eq!((k.untouched_kept, k.untouched_lost), (1, 2));
    assert!(!k.met());
    // A recreated map: every entry gone.
    let k = compare(&before, &Entries::new(), &ids, &ids);
    assert_eq!(k.untouched_lost, 3);
    assert!(!k.met());
    // No entries at all is not a pass.
    assert!(!compare(&Entries::new(), &Entries::new(), &ids, &ids).met());
}
