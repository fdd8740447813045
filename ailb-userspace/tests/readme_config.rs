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

#[test]
fn readme_limits_example_shows_the_defaults() {
    let readme = include_str!("../../README.md");
    let open = readme.find("```toml\n  [limits]").expect("README shows [limits]") + "```toml\n".len();
    let close = readme[open..].find("```").expect("end of the toml block");
    let cfg = Config::parse(&readme[open..open + close], "README.md [limits]").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.limits.table_slots, ailb_common::DEFAULT_TABLE_SLOTS);
    assert_eq!(cfg.limits.member_slots, ailb_common::DEFAULT_MEMBER_SLOTS);
}
