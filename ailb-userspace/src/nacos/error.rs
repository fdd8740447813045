use std::fmt;

use super::{
    http::{ClientBuildError, TransportError},
    wire::WireError,
};

/// What a request to a service was for (named in errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// An instance list read.
    List,
    Register,
    Beat,
    Deregister,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::List => "read",
            Op::Register => "register",
            Op::Beat => "beat",
            Op::Deregister => "deregister",
        })
    }
}

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
    #[error("nacos {server}: login answer unusable")]
    LoginAnswer {
        server: String,
        #[source]
        source: WireError,
    },
    /// A login answered with a status that is neither success, refusal nor a missing API.
    #[error("nacos {server}: login: http {status}: {message}")]
    LoginStatus { server: String, status: u16, message: String },
    /// Neither login API exists on this server.
    #[error("nacos {server}: no login api (v3 and v1 both answered as missing)")]
    NoLoginApi { server: String },
    #[error("nacos {server}: {path}")]
    Transport {
        server: String,
        path: &'static str,
        #[source]
        source: TransportError,
    },
    /// A non-success HTTP status.
    #[error("nacos {server}: {op} of service {service:?}: http {status}: {message}")]
    Status { server: String, op: Op, service: String, status: u16, message: String },
    /// A Nacos result envelope with a non-zero code.
    #[error("nacos {server}: {op} of service {service:?}: code {code}: {message}")]
    Api { server: String, op: Op, service: String, code: i64, message: String },
    /// The answer could not be read (not JSON, wrong types, missing fields, ...).
    #[error("nacos {server}: {op} of service {service:?}: unusable answer")]
    Answer {
        server: String,
        op: Op,
        service: String,
        #[source]
        source: WireError,
    },
    /// Every server failed; the last server's error is the source.
    #[error("nacos: {op} of service {service:?}: all {servers} servers failed")]
    AllServersFailed {
        op: Op,
        service: String,
        servers: usize,
        #[source]
        last: Box<NacosError>,
    },
}
