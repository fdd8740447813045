//! The gateway config (`ailb run --config`): TOML parse, then validation. Besides no panic: a
//! valid config validates the same again, and the same text parses and validates the same.
#![no_main]

use ailb_userspace::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = Config::parse(text, "fuzz") else { return };
    let Ok(valid) = config.validate() else { return };
    assert_eq!(config.validate().expect("validates again"), valid);
    let again = Config::parse(text, "fuzz").expect("parses again").validate().expect("validates again");
    assert_eq!(again, valid);
});
