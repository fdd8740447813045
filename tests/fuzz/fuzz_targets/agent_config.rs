//! The agent config (`ailb agent --config`): TOML parse, then validation. Besides no panic: a
//! valid config validates the same again (compared by its `Debug` form, the type has no `Eq`).
#![no_main]

use ailb_userspace::agent::config::AgentConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = AgentConfig::parse(text, "fuzz") else { return };
    let Ok(valid) = config.validate() else { return };
    let again = config.validate().expect("validates again");
    assert_eq!(format!("{again:?}"), format!("{valid:?}"));
    assert!(!valid.instances.is_empty());
});
