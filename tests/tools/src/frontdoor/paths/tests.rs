use super::*;

#[test]
fn the_gateway_section_names_its_listen_address_and_reuse() {
    let addr = "127.0.0.21:8080".parse().expect("addr");
    let t = gateway_toml(addr, &Variant { reuse: "never", fast: false, idle_mark_after: None });
    let want = "\n[gateway]\nlisten = [\"127.0.0.21:8080\"]\nupstream_reuse = \"never\"\nhttp1_fast_path = false\n";
    assert_eq!(t, want);
    let t = gateway_toml(addr, &Variant { reuse: "conversation", fast: true, idle_mark_after: Some("0s") });
    assert!(t.ends_with("http1_fast_path = true\nupstream_idle_mark_after = \"0s\"\n"), "{t}");
}
