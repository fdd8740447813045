use super::*;

const SUMMARY: &str = "% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.20    0.412000          10     40000           writev
 30.10    0.301000           7     40000     20000 recvfrom
 10.00    0.100000           5     20000           connect
  0.10    0.001000          50        20           futex
------ ----------- ----------- --------- --------- ----------------
100.00    1.000000          10    100020     20000 total
";

#[test]
fn reads_strace_rows_and_skips_the_total() {
    let rows = parse_strace_summary(SUMMARY);
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[1], SyscallCount { name: "recvfrom".into(), calls: 40_000, errors: 20_000 });
    assert_eq!(rows[0].errors, 0);
    assert!(parse_strace_summary("strace: Process 12 attached\n").is_empty());
}

#[test]
fn the_table_is_per_request_most_frequent_first() {
    let t = syscalls_table(&parse_strace_summary(SUMMARY), 20_000);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines[2], "| `recvfrom` | 2.00 | 1.00 |");
    assert_eq!(lines[3], "| `writev` | 2.00 | 0.00 |");
    assert_eq!(lines[4], "| `connect` | 1.00 | 0.00 |");
    assert_eq!(lines.last().copied(), Some("| all | 5.00 | |"), "{t}");
    assert!(!t.contains("futex"), "under 0.01 per request: left out\n{t}");
    assert_eq!(truncate("abcdef", 3), "abc...");
}
