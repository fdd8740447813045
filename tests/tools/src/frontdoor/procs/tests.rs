use super::*;

#[test]
fn reads_utime_and_stime_after_an_odd_command_name() {
    let stat = "4242 (nginx (w) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 123 0 0";
    assert_eq!(stat_user_sys(stat), Some((250, 75)));
    assert_eq!(stat_user_sys("4242 (cut short) S 1 2"), None);
}

#[test]
fn children_lists_and_differences() {
    assert_eq!(parse_children("12 345 \n"), vec![12, 345]);
    assert!(parse_children("").is_empty());
    let d = CpuTime { user_s: 2.0, sys_s: 1.0 }.since(CpuTime { user_s: 1.5, sys_s: 1.25 });
    assert_eq!(d, CpuTime { user_s: 0.5, sys_s: 0.0 });
    assert_eq!(d.total_s(), 0.5);
}

#[test]
fn this_process_is_its_own_tree() {
    let me = std::process::id();
    assert_eq!(tree_pids(me).first(), Some(&me));
    assert!(tree_cpu(me).is_some_and(|c| c.total_s() >= 0.0));
}
