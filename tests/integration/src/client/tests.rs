use super::*;

#[test]
fn formats_pids_without_allocating() {
    let mut b = [0u8; 20];
    let n = format_pid(0, &mut b);
    assert_eq!(&b[20 - n..], b"0");
    let n = format_pid(4_194_304, &mut b);
    assert_eq!(&b[20 - n..], b"4194304");
    let n = format_pid(u32::MAX, &mut b);
    assert_eq!(&b[20 - n..], b"4294967295");
}

#[test]
fn parses_client_lines() {
    let lines = vec![
            r#"{"i":0,"conversation":"c-0","backend":"127.0.0.11:1","reply":"127.0.0.11:1","ok":true,"errno":null,"error":null}"#.to_owned(),
            r#"{"i":1,"conversation":null,"backend":null,"reply":null,"ok":false,"errno":111,"error":null}"#.to_owned(),
        ];
    let r = parse_results(&lines, 2);
    assert_eq!(r[0].conversation.as_deref(), Some("c-0"));
    assert_eq!(r[1].errno, Some(111));
    assert_eq!(count_by_backend(&r).get("127.0.0.11:1"), Some(&1));
}
