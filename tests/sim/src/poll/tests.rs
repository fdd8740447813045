use super::*;

#[test]
fn a_timeout_names_what_was_waited_for_and_the_details() {
    let panic = std::panic::catch_unwind(|| {
        wait_until_or("nothing", Duration::ZERO, || None::<()>, || "state 7".to_string());
    })
    .expect_err("it never returns Some");
    let msg = panic.downcast_ref::<String>().expect("a formatted message");
    assert!(msg.contains("waiting for nothing: state 7"), "{msg}");
    assert_eq!(wait_until("at once", Duration::ZERO, || Some(3)), 3);
}
