//! `[discovery.nacos]`: serde types with documented defaults and their validation.

use std::{fmt, path::PathBuf, time::Duration};

use reqwest::Url;
use serde::Deserialize;

use crate::validate::{parse_duration, ConfigError};

/// Which Nacos HTTP API reads the instance lists.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NacosApi {
    /// The v3 client API first; the v1 Open API when a server answers v3 with 404, 405 or 501
    /// (decided once per server).
    #[default]
    Auto,
    /// `/nacos/v1/ns/instance/list` (Nacos 1.x to 3.1, rnacos and other compatible servers).
    V1,
    /// `/nacos/v3/client/ns/instance/list` (Nacos 3.0 and later; 3.2 has no v1 HTTP API).
    V3,
}

/// A password: compared and cloned like a string, never printed.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// `[discovery.nacos]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NacosConfig {
    /// Servers tried in order until one answers, e.g. `["http://10.0.0.5:8848"]`. The path is
    /// the server's context path; none (or `/`) means the default `/nacos`.
    pub servers: Vec<String>,
    /// `"auto"` (default), `"v1"` or `"v3"`.
    #[serde(default)]
    pub api: NacosApi,
    /// Namespace id; default `""`, the `public` namespace.
    #[serde(default)]
    pub namespace: String,
    /// Default `"DEFAULT_GROUP"`.
    #[serde(default = "default_group")]
    pub group: String,
    /// Only instances of these clusters; default: all clusters.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Login user; set `username` and one password source (`password`, `password_file` or
    /// `password_env`), or none of them (no login).
    #[serde(default)]
    pub username: Option<String>,
    /// The password inline. Prefer `password_file` or `password_env`: a config file is often
    /// readable by more people than the secret should be.
    #[serde(default)]
    pub password: Option<Secret>,
    /// An absolute path to a file whose content is the password (one trailing newline is
    /// removed); read at start-up and on every reload. Keep it 0600 or 0400, owned by the
    /// daemon's user.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The name of an environment variable that holds the password (e.g. `AILB_NACOS_PASSWORD`).
    #[serde(default)]
    pub password_env: Option<String>,
    /// How often every service is read; at least 10ms. Default `"100ms"`: with one small HTTP
    /// read per service it keeps metadata propagation p99 near 100 ms (the goal is <= 250 ms).
    #[serde(default = "default_poll_interval")]
    pub poll_interval: String,
    /// Per HTTP request, connecting and reading the whole answer. Default `"2s"`.
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Ask for the v1 UDP push (a hint to read again at once). Default on.
    #[serde(default = "yes")]
    pub udp_push: bool,
    /// PEM file with extra CA certificates for `https://` servers (added to the built-in roots).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

fn default_group() -> String {
    DEFAULT_GROUP.to_string()
}
fn default_poll_interval() -> String {
    "100ms".to_string()
}
fn default_timeout() -> String {
    "2s".to_string()
}
fn yes() -> bool {
    true
}

/// Nacos' default group.
pub const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// The shortest accepted poll interval.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The longest accepted request timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The section, which every error's field starts with.
const P: &str = "discovery.nacos";

/// Login credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
}

/// A validated `[discovery.nacos]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidNacos {
    /// Each server's context root, ending in `/` (`http://h:8848/nacos/`).
    pub servers: Vec<Url>,
    pub api: NacosApi,
    pub namespace: String,
    pub group: String,
    pub clusters: Vec<String>,
    pub credentials: Option<Credentials>,
    pub poll_interval: Duration,
    pub timeout: Duration,
    pub udp_push: bool,
    pub tls_ca_file: Option<PathBuf>,
}

impl NacosConfig {
    /// A config with every default and these servers.
    pub fn with_servers<S: Into<String>>(servers: impl IntoIterator<Item = S>) -> Self {
        Self {
            servers: servers.into_iter().map(Into::into).collect(),
            api: NacosApi::Auto,
            namespace: String::new(),
            group: default_group(),
            clusters: Vec::new(),
            username: None,
            password: None,
            password_file: None,
            password_env: None,
            poll_interval: default_poll_interval(),
            timeout: default_timeout(),
            udp_push: true,
            tls_ca_file: None,
        }
    }

    pub fn validate(&self) -> Result<ValidNacos, ConfigError> {
        let servers = self.server_roots()?;
        self.check_names()?;
        let credentials = self.credentials()?;
        let (poll_interval, timeout) = self.intervals()?;
        if let Some(ca) = &self.tls_ca_file {
            if !ca.is_absolute() {
                return Err(ConfigError::invalid(format!("{P}.tls_ca_file"), ca.display(), "must be an absolute path"));
            }
        }
        Ok(ValidNacos {
            servers,
            api: self.api,
            namespace: self.namespace.clone(),
            group: self.group.clone(),
            clusters: self.clusters.clone(),
            credentials,
            poll_interval,
            timeout,
            udp_push: self.udp_push,
            tls_ca_file: self.tls_ca_file.clone(),
        })
    }

    /// Each server's context root; at least one server.
    fn server_roots(&self) -> Result<Vec<Url>, ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::invalid(format!("{P}.servers"), "[]", "at least one server URL is needed"));
        }
        self.servers
            .iter()
            .enumerate()
            .map(|(i, s)| server_root(s).map_err(|reason| ConfigError::invalid(format!("{P}.servers[{i}]"), s, reason)))
            .collect()
    }

    /// The namespace, the group and the clusters: names Nacos accepts.
    fn check_names(&self) -> Result<(), ConfigError> {
        if self.namespace.len() > 128 || has_control(&self.namespace) {
            return Err(ConfigError::invalid(
                format!("{P}.namespace"),
                &self.namespace,
                "at most 128 bytes, no control characters",
            ));
        }
        if self.group.is_empty() || self.group.len() > 128 || has_control(&self.group) || self.group.contains("@@") {
            return Err(ConfigError::invalid(
                format!("{P}.group"),
                &self.group,
                "1 to 128 bytes, no control characters and no \"@@\"",
            ));
        }
        for (i, c) in self.clusters.iter().enumerate() {
            if c.is_empty() || c.len() > 128 || has_control(c) || c.contains(',') {
                return Err(ConfigError::invalid(
                    format!("{P}.clusters[{i}]"),
                    c,
                    "1 to 128 bytes, no control characters and no ','",
                ));
            }
        }
        Ok(())
    }

    /// The login: a username and a password together, or neither.
    fn credentials(&self) -> Result<Option<Credentials>, ConfigError> {
        let has_password = self.password.is_some() || self.password_file.is_some() || self.password_env.is_some();
        let password = match &self.username {
            Some(_) => self.password()?,
            None if has_password => {
                return Err(ConfigError::invalid(format!("{P}.username"), "", "a password is set without a username"))
            }
            None => None,
        };
        match (&self.username, password) {
            (None, None) => Ok(None),
            (Some(u), Some(p)) if !u.is_empty() && !has_control(u) => {
                Ok(Some(Credentials { username: u.clone(), password: p }))
            }
            (Some(u), Some(_)) => {
                Err(ConfigError::invalid(format!("{P}.username"), u, "must be non-empty, no control characters"))
            }
            (Some(u), None) => {
                Err(ConfigError::invalid(format!("{P}.password"), "", format!("username {u:?} needs a password")))
            }
            (None, Some(_)) => {
                Err(ConfigError::invalid(format!("{P}.username"), "", "a password is set without a username"))
            }
        }
    }

    /// The poll interval (at least [`MIN_POLL_INTERVAL`]) and the request timeout (10ms to
    /// [`MAX_TIMEOUT`]).
    fn intervals(&self) -> Result<(Duration, Duration), ConfigError> {
        let poll_interval = parse_duration(&format!("{P}.poll_interval"), &self.poll_interval)?;
        if poll_interval < MIN_POLL_INTERVAL {
            return Err(ConfigError::invalid(
                format!("{P}.poll_interval"),
                &self.poll_interval,
                "must be at least 10ms",
            ));
        }
        let timeout = parse_duration(&format!("{P}.timeout"), &self.timeout)?;
        if timeout < Duration::from_millis(10) || timeout > MAX_TIMEOUT {
            return Err(ConfigError::invalid(format!("{P}.timeout"), &self.timeout, "must be 10ms to 60s"));
        }
        Ok((poll_interval, timeout))
    }
}

impl NacosConfig {
    /// The password from whichever of `password`, `password_file` and `password_env` is set
    /// (at most one may be). Errors name the field and the file or variable, never the secret.
    fn password(&self) -> Result<Option<Secret>, ConfigError> {
        let set: Vec<&str> = [
            self.password.as_ref().map(|_| "password"),
            self.password_file.as_ref().map(|_| "password_file"),
            self.password_env.as_ref().map(|_| "password_env"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if set.len() > 1 {
            return Err(ConfigError::invalid(
                format!("{P}.{}", set[1]),
                "<set>",
                format!("{} and {} are both set; set only one password source", set[0], set[1]),
            ));
        }
        if let Some(p) = &self.password {
            return Ok(Some(p.clone()));
        }
        if let Some(path) = &self.password_file {
            let field = format!("{P}.password_file");
            if !path.is_absolute() {
                return Err(ConfigError::invalid(field, path.display(), "must be an absolute path"));
            }
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::invalid(&field, path.display(), format!("cannot read the file: {e}")))?;
            let secret = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
            if secret.is_empty() {
                return Err(ConfigError::invalid(field, path.display(), "the file is empty"));
            }
            return Ok(Some(Secret::new(secret)));
        }
        if let Some(var) = &self.password_env {
            let field = format!("{P}.password_env");
            if var.is_empty() || var.contains('=') || var.contains('\0') {
                return Err(ConfigError::invalid(field, var, "expected the name of an environment variable"));
            }
            return match std::env::var(var) {
                Ok(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
                Ok(_) => Err(ConfigError::invalid(field, var, "the environment variable is empty")),
                Err(std::env::VarError::NotPresent) => {
                    Err(ConfigError::invalid(field, var, "the environment variable is not set"))
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    Err(ConfigError::invalid(field, var, "the environment variable is not valid UTF-8"))
                }
            };
        }
        Ok(None)
    }
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// `http://h:8848` -> `http://h:8848/nacos/`; `https://h/registry` -> `https://h/registry/`.
fn server_root(s: &str) -> Result<Url, String> {
    let mut url = Url::parse(s).map_err(|e| format!("expected a URL like \"http://10.0.0.5:8848\" ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("the scheme must be http or https".to_string());
    }
    if url.host().is_none() {
        return Err("a host is needed".to_string());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("no credentials in the URL; use username and password".to_string());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("no query or fragment".to_string());
    }
    let path = url.path().trim_end_matches('/');
    let path = if path.is_empty() { "/nacos/".to_string() } else { format!("{path}/") };
    url.set_path(&path);
    Ok(url)
}

#[cfg(test)]
mod tests;
