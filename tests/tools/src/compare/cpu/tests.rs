use super::*;

#[test]
fn reads_utime_and_stime_after_an_odd_command_name() {
    let stat = "4242 (vllm (router) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 123 0 0";
    assert_eq!(stat_ticks(stat), Some(325));
    assert_eq!(stat_ticks("4242 (cut short) S 1 2"), None);
    assert_eq!(stat_ticks("no parenthesis"), None);
}

#[test]
fn this_process_has_used_some_cpu() {
    let mut x = 0u64;
    for i in 0..2_000_000u64 {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    std::hint::black_box(x);
    let s = process_cpu_s(std::process::id()).expect("our own /proc/PID/stat");
    assert!(s >= 0.0 && s.is_finite(), "{s}");
    assert_eq!(used(Some(1.5), Some(2.0)), Some(0.5));
    assert_eq!(used(None, Some(2.0)), None);
}
