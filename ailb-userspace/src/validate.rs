//! What every configuration file of ailb shares: the error that names the field and the
//! value, and duration parsing. A leaf: it imports nothing of the crate, so the gateway's
//! config, the policy's `[policy]`, Nacos' `[discovery.nacos]` and the agent's config can all
//! use it without depending on one another.
#![forbid(unsafe_code)]

use std::{path::PathBuf, time::Duration};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("config: field `{field}`: invalid value {value:?}: {reason}")]
    InvalidValue { field: String, value: String, reason: String },
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> Self {
        Self::InvalidValue { field: field.into(), value: value.to_string(), reason: reason.into() }
    }
}

/// A duration such as `"30m"` or `"250ms"` (humantime's syntax); an error names `field`.
pub fn parse_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value)
        .map_err(|e| ConfigError::invalid(field, value, format!("expected a duration like \"30m\" or \"250ms\" ({e})")))
}

#[cfg(test)]
mod tests;
