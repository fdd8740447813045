//! The Nacos client: the gateway's discovery reads through it and the node agent writes
//! through it, so both sides share one behaviour for servers, failover, login and API choice.
//!
//! - [`Session`] ([`session`]): the server list, failover, tokens and their renewal, v1/v3
//!   detection; TLS comes with its transport ([`http::ReqwestTransport`]).
//! - Reads ([`naming`]): instance lists; [`push`]: the v1 UDP push, a hint to read again.
//! - Writes ([`registry`]): register, beat, deregister one ephemeral instance.
//! - [`wire`]: Nacos answers to ailb types, pure and defensive (answers are bounded to
//!   [`http::MAX_BODY`] and parsed from `serde_json::Value` by hand; nothing panics on input).
//! - [`config`]: the `[nacos]` / `[discovery.nacos]` table, shared by both configs.
//!
//! Only the HTTP APIs are spoken (the gRPC protocol of Nacos 2.x/3.x is not): the gateway
//! polls, and the agent keeps its instance alive with beats.

pub mod config;
mod error;
pub mod http;
mod naming;
pub(crate) mod push;
mod registry;
mod session;
pub(crate) mod wire;

pub use config::{
    Credentials, NacosApi, NacosConfig, Secret, ValidNacos, DEFAULT_GROUP, MAX_TIMEOUT, MIN_POLL_INTERVAL,
};
pub use error::{NacosError, Op};
pub use registry::{Beat, Endpoint, Registration, CODE_NOT_FOUND};
pub use session::Session;
pub use wire::WireError;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;
