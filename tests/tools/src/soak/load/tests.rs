use super::*;

#[test]
fn the_entry_points_split_the_conversations() {
    let abi = (0..1000).filter(|i| entry_of(&format!("0-c{i}")) == Entry::Abi).count();
    assert!((400..=600).contains(&abi), "{abi} of 1000 to the socket ABI");
}

#[test]
fn with_the_tc_stream_each_entry_point_gets_a_third_and_every_lane_some() {
    let split = Split { tc_lanes: 8, tc_max_blocks: 0 };
    let mut by = std::collections::BTreeMap::<(Entry, usize), usize>::new();
    for i in 0..9000 {
        *by.entry(split.of(&format!("0-c{i}"))).or_default() += 1;
    }
    let per = |e: Entry| by.iter().filter(|((x, _), _)| *x == e).map(|(_, n)| n).sum::<usize>();
    for e in [Entry::Abi, Entry::FrontDoor, Entry::Tc] {
        assert!((2700..=3300).contains(&per(e)), "{} of 9000 to {e:?}", per(e));
    }
    for lane in 0..8 {
        let n = by.get(&(Entry::Tc, lane)).copied().unwrap_or(0);
        assert!((250..=500).contains(&n), "{n} TC conversations on lane {lane}");
    }
    assert!(by.keys().all(|(e, lane)| *e == Entry::Tc || *lane == 0));
    // The same conversation always gets the same entry point and lane.
    assert_eq!(split.of("3-c17"), split.of("3-c17"));
}

#[test]
fn only_the_tc_share_leaves_out_what_the_smallest_gpu_cannot_hold() {
    let spec = |prompt_tokens: u32, max_tokens: u32| RequestSpec {
        index: 0,
        line: None,
        at_ms: 0,
        conversation: "c".into(),
        memory_mb: 0,
        prompt_tokens,
        max_tokens,
        hash_ids: Vec::new(),
        message_ends: Vec::new(),
        model: MODEL.into(),
        tag_socket: false,
        prefix_keys: false,
    };
    let split = Split { tc_lanes: 8, tc_max_blocks: 43 };
    assert_eq!(blocks(&spec(43 * 512 - 10, 10)), 43);
    assert!(split.sends(Entry::Tc, &spec(43 * 512 - 10, 10)));
    assert!(!split.sends(Entry::Tc, &spec(43 * 512 - 10, 11)));
    assert!(split.sends(Entry::Abi, &spec(100_000, 500)) && split.sends(Entry::FrontDoor, &spec(100_000, 500)));
    assert!(Split { tc_max_blocks: 0, ..split }.sends(Entry::Tc, &spec(100_000, 500)));
}
