//! The `ailb agent` configuration example in README.md parses and validates through the agent's
//! config type, so the docs cannot drift from the code unnoticed.

use std::time::Duration;

use ailb_userspace::agent::config::{AgentConfig, GpuRef, ServerKind};

#[test]
fn readme_agent_config_example_is_valid() {
    let readme = include_str!("../../README.md");
    let start = readme.find("## The GPU node agent: `ailb agent`").expect("README has the agent section");
    let block = &readme[start..];
    let open = block.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let close = block[open..].find("```").expect("end of the toml block");
    let text = &block[open..open + close];
    let cfg: AgentConfig = toml::from_str(text).unwrap_or_else(|e| panic!("README agent example: {e}"));
    let valid = cfg.validate().unwrap_or_else(|e| panic!("README agent example: {e}"));
    assert_eq!(valid.publish_interval, Duration::from_millis(500));
    assert_eq!(valid.heartbeat_interval, Duration::from_secs(5));
    assert_eq!(valid.drain_timeout, Duration::from_secs(30));
    assert!(valid.listen.is_some());
    assert_eq!(valid.thresholds, Default::default(), "the example shows the default thresholds");
    let [inst] = valid.instances.as_slice() else { panic!("one instance in the example") };
    assert_eq!(inst.service, "llama3-70b");
    assert_eq!(inst.gpus, vec![GpuRef::Index(0), GpuRef::Index(1)]);
    assert_eq!(inst.server, ServerKind::Vllm);
    assert!(inst.nvml);
}
