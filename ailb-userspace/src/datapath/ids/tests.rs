use super::*;

fn key(model: u32, last: u8) -> BackendKey {
    (model, SocketAddr::new([10, 1, 0, last].into(), 80))
}

#[test]
fn known_names_keep_their_index_and_new_ones_take_the_lowest_free() {
    let mut ids = Ids::default();
    ids.recover_model("b".into(), 1);
    assert_eq!(ids.assign_model("a").unwrap(), 0);
    assert_eq!(ids.assign_model("b").unwrap(), 1);
    assert_eq!(ids.assign_model("c").unwrap(), 2);
    ids.forget_model("a");
    assert_eq!(ids.assign_model("d").unwrap(), 0);
    assert_eq!(ids.models_except(|n| n != "b"), vec![("b".to_string(), 1)]);
}

#[test]
fn a_retired_id_stays_taken_until_freed_and_a_returning_backend_keeps_it() {
    let mut ids = Ids::default();
    for last in 1..=3 {
        ids.assign_backend(key(0, last)).unwrap();
    }
    let planned: BTreeSet<_> = [key(0, 1), key(0, 3)].into();
    assert_eq!(ids.retire_unplanned(&planned), vec![1]);
    assert_eq!(ids.assign_backend(key(0, 4)).unwrap(), 3, "id 1 is still retired");
    assert_eq!(ids.assign_backend(key(0, 2)).unwrap(), 1, "a returning backend keeps its id");
    let planned: BTreeSet<_> = [key(0, 2), key(0, 3), key(0, 4)].into();
    assert_eq!(ids.retire_unplanned(&planned), vec![0]);
    ids.free(&key(0, 1));
    assert!(ids.retired().is_empty());
    assert_eq!(ids.assign_backend(key(1, 1)).unwrap(), 0, "a freed id is reused");
}

#[test]
fn full_maps_are_an_error_naming_the_limit() {
    let mut ids = Ids::default();
    for i in 0..MAX_MODELS {
        ids.assign_model(&format!("m{i}")).unwrap();
    }
    let e = ids.assign_model("one-more").unwrap_err();
    assert_eq!(e.to_string(), format!("models: no free slot (at most {MAX_MODELS})"));
}
