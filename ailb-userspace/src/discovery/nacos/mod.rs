//! Nacos source (v1 Open API and v3 client API). Configuration lives here; the client is
//! being written in this module.

use serde::Deserialize;

use crate::config::ConfigError;

/// `[discovery.nacos]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NacosConfig {
    /// Base URLs tried in order, e.g. `["http://127.0.0.1:8848"]`.
    pub servers: Vec<String>,
}

/// A validated `[discovery.nacos]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidNacos {
    pub servers: Vec<String>,
}

impl NacosConfig {
    pub fn validate(&self) -> Result<ValidNacos, ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::invalid("discovery.nacos.servers", "[]", "at least one server URL is needed"));
        }
        Ok(ValidNacos { servers: self.servers.clone() })
    }
}
