use super::*;

#[test]
fn a_line_counts_only_for_a_backend_peer() {
    let peers: BTreeSet<String> = ["127.0.11.1:18300".to_string()].into();
    let l = "0      0      127.0.0.1:5000  127.0.11.1:18300";
    assert!(counts(l, &peers));
    assert!(!counts(&l.replace("18300", "18301"), &peers));
    assert!(!counts("0 0 127.0.11.1:18300 127.0.0.1:5000", &peers), "the server's end");
}

#[test]
fn a_sample_lists_again_until_both_reads_equal_the_listing() {
    // Counter reads 5, 6 around a listing of 6 (a connection opened meanwhile), then 6, 6.
    let mut reads = [Some(5), Some(6), Some(6), Some(6)].into_iter();
    let mut lists = [6, 6].into_iter();
    let got = agreeing(|| reads.next().flatten(), || lists.next().unwrap_or(0));
    assert_eq!(got, (Some(6), 6, Some(6), 2));
    // Never agreeing: the last of MAX_TRIES tries is kept.
    let mut n = 0;
    let got = agreeing(
        || {
            n += 1;
            Some(n)
        },
        || 0,
    );
    assert_eq!(got, (Some(2 * u64::from(MAX_TRIES) - 1), 0, Some(2 * u64::from(MAX_TRIES)), MAX_TRIES));
    // Unreadable counters never agree.
    assert_eq!(agreeing(|| None, || 0).3, MAX_TRIES);
}
