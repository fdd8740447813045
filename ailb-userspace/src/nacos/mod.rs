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
//! Only the HTTP APIs are spoken, not the gRPC protocol of Nacos 2.x/3.x: the gateway polls
//! and the agent keeps its instance alive with beats. Measured against rnacos 0.8.8 with the
//! official Rust SDK (nacos-sdk 0.5.3): a gRPC subscriber got each metadata change 0.75 to
//! 0.85 s after it was written (p50 0.81 s), while the 100 ms poll saw it after 5 to 100 ms
//! (p50 0.05 s; the server shows it within 3 ms); and registering again over gRPC with new
//! metadata left the stored metadata unchanged, which would freeze what the agent publishes.

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
