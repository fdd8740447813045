use super::http::{ClientBuildError, TransportError};

/// What went wrong talking to Nacos. `server` is a context root as configured (no
/// credentials, no token); `message`s are server text made printable and cut to 200 chars.
#[derive(Debug, thiserror::Error)]
pub enum NacosError {
    #[error("nacos: no server configured")]
    NoServers,
    #[error("nacos: {0}")]
    Client(#[from] ClientBuildError),
    /// The server refused the credentials (or answered the login without a token).
    #[error("nacos {server}: login as {username:?} refused: http {status}: {message}")]
    LoginRefused { server: String, username: String, status: u16, message: String },
    #[error("nacos {server}: login answer unusable: {reason}")]
    LoginAnswer { server: String, reason: String },
    #[error("nacos {server}: {path}")]
    Transport {
        server: String,
        path: &'static str,
        #[source]
        source: TransportError,
    },
    /// A non-success HTTP status for an instance list.
    #[error("nacos {server}: service {service:?}: http {status}: {message}")]
    Status { server: String, service: String, status: u16, message: String },
    /// A v3 answer with a non-zero code.
    #[error("nacos {server}: service {service:?}: code {code}: {message}")]
    Api { server: String, service: String, code: i64, message: String },
    /// The answer could not be read (not JSON, wrong types, missing fields, ...).
    #[error("nacos {server}: service {service:?}: unusable answer: {reason}")]
    Answer { server: String, service: String, reason: String },
    /// Every server failed for this service; the last server's error is the source.
    #[error("nacos: service {service:?}: all {servers} servers failed")]
    AllServersFailed {
        service: String,
        servers: usize,
        #[source]
        last: Box<NacosError>,
    },
}
