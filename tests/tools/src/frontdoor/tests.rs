use super::*;

#[test]
fn the_command_to_run_it_again_names_what_differs_from_the_defaults() {
    let cmd = |argv: &[&str]| reproduce(&Args::parse_from(argv));
    assert_eq!(cmd(&["b"]), "`cargo xtask bench --only frontdoor`");
    let focused = cmd(&["b", "--focus", "--rounds", "15"]);
    assert!(focused.ends_with("target/release/ailb-frontdoor-bench --focus --rounds 15`"), "{focused}");
}
