#[test]
fn durations_are_logged_to_the_microsecond() {
    assert_eq!(super::ms(std::time::Duration::from_nanos(1_234_567_891)), 1234.568);
    assert_eq!(super::ms(std::time::Duration::from_nanos(499)), 0.0);
}
