use super::decimal;

#[test]
fn decimal_pids() {
    let mut buf = [0u8; 10];
    for n in [0, 7, 10, 4_194_304, u32::MAX] {
        assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
    }
}
