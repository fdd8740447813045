use super::*;

#[test]
fn the_final_statistics_are_read_from_the_log() {
    let log = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #5000\tDONE   cov: 1234 ft: 5678 corp: 321/40Kb lim: 4096 exec/s: 500 rss: 80Mb\n\
                   stat::number_of_executed_units: 5000\nstat::average_exec_per_sec:     500\n";
    let lines: Vec<&str> = log.lines().collect();
    let o = outcome("t", 10, &lines);
    assert_eq!(
        (o.executions, o.per_second, o.coverage, o.corpus),
        (Some(5000), Some(500), Some((1234, 5678)), Some(321))
    );
    let md =
        report(&[o, Outcome { target: "tc".into(), skipped: Some("needs root".into()), ..Outcome::default() }], "x");
    assert!(md.contains("| `t` | 10 | 5000 | 500 | 1234 / 5678 | 321 | no crash |"), "{md}");
    assert!(md.contains("| `tc` | 0 | - | - | - | - | **skipped**: needs root |"), "{md}");
}
