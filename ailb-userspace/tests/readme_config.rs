//! The configuration example in README.md parses and validates, so the docs cannot drift from
//! the code unnoticed.

use ailb_userspace::config::Config;

#[test]
fn readme_config_example_is_valid() {
    let readme = include_str!("../../README.md");
    let start = readme.find("## Configuration").expect("README has a Configuration section");
    let block = &readme[start..];
    let open = block.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let close = block[open..].find("```").expect("end of the toml block");
    let text = &block[open..open + close];
    let cfg = Config::parse(text, "README.md").unwrap_or_else(|e| panic!("README example: {e}"));
    let valid = cfg.validate().unwrap_or_else(|e| panic!("README example: {e}"));
    assert!(valid.models.contains_key("demo-7b"));
    let gateway = cfg
        .gateway
        .validate(valid.models.keys().map(String::as_str))
        .unwrap_or_else(|e| panic!("README example [gateway]: {e}"));
    assert_eq!(gateway.kv_bytes_per_token.get("demo-7b"), Some(&131072));
}
