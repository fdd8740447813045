use super::*;

#[test]
fn the_low_memory_state_changes_only_the_used_line() {
    let s = "count 1\n0 name A100-80GB\n0 total_mb 81920\n0 used_mb 100\n0 util 3\n";
    assert_eq!(with_used(s, 81_408), "count 1\n0 name A100-80GB\n0 total_mb 81920\n0 used_mb 81408\n0 util 3\n");
}
