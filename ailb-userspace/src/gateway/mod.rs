//! The front door, `ailb gateway`: an OpenAI-style HTTP server (HTTP/1.1, and HTTP/2 with
//! prior knowledge) that sends each request to the kernel's pick on an upstream connection
//! tagged with the request's own routing inputs (model, memory, conversation; see [`inputs`]):
//! a fresh connection, or (`gateway.upstream_reuse = "conversation"`, the default) an idle one
//! kept from an earlier request with exactly the same inputs.
//!
//! Why it exists: ailb picks a backend per connection, in `cgroup/connect4`; an unchanged
//! client with a keep-alive pool (the official `openai` client) sends every request of a
//! process down one connection, so the pick would happen once per process. The front door
//! keeps the client's connection and sends each request upstream on a connection of its own
//! routing inputs, never one tagged with another request's.
//!
//! Why a separate process from `ailb run`: it must run INSIDE the cgroup ailb attaches to, so
//! that its upstream connects are the ones `connect4` steers (the daemon stays outside it). It
//! tags and connects without privilege (tagging a socket is a plain `setsockopt`); with an admission on
//! (`gateway.admission`) it also reads the daemon's pins under `daemon.bpffs`, which needs read
//! access to them, never write. `ailb run` must load programs and write maps as root. A crash
//! or restart of one does not take the other down.
//!
//! It reads the same config file as `ailb run`: the model catalog (`[[models]]`,
//! `[[services]]`; a model's first VIP is where its requests connect) and the `[gateway]`
//! section ([`crate::config::gateway::GatewayConfig`]).
//!
//! Here "gateway" is the front door (`ailb gateway`, `[gateway]`, the `ailb_gateway_*`
//! metrics), never the node that runs `ailb run`.
//!
//! The modules, each importing only those listed before it:
//! - [`http`]: the types both sides share (a request's head, its answer, the body of every
//!   answer, the OpenAI-shaped errors, a request's deadline, header names and checks);
//! - [`inputs`] (with `request_fields.rs`, the request body's first parse): a request's
//!   routing inputs, pure; [`response_ids`]: which backend stored each Responses API
//!   response, and the id found in an answer, pure;
//!   [`metrics`] and `log.rs` (the access log); [`tenants`]: a request's tenant and priority,
//!   its tenant's token rate and concurrency share, pure;
//! - the three sides, none of which imports another: [`client`] (client connections: hyper's
//!   server and the HTTP/1 fast path), [`upstream`] (tagged connects, kept connections, the
//!   front door's own HTTP/1 client and hyper's, the relayed answer) and [`control`] (the
//!   admission and the live models, from the daemon's plan and the kernel's pins);
//! - [`responses`]: a Responses API follow-up sent to the backend that stored its response,
//!   and each answer's id learned as it passes;
//! - [`pipeline`]: a proxied request's phases, in order, calling the upstream side and the
//!   admission;
//! - [`service`]: [`Gateway`], what the client side hands each request to;
//! - `run.rs`: start-up, the workers, their listening sockets and the signals.

#![forbid(unsafe_code)]

pub mod catalog;
pub mod client;
pub mod control;
pub mod http;
pub mod inputs;
mod log;
pub mod metrics;
pub mod pipeline;
pub mod prefix_keys;
mod request_fields;
pub mod response_ids;
pub mod responses;
mod run;
pub mod service;
pub mod tenants;
pub mod upstream;

pub use pipeline::{routing_inputs, Routing};
pub use run::{load, run, GatewayError};
pub use service::Gateway;
