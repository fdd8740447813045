//! The upstream side of the front door: a request sent to the backend the kernel picks for
//! it, and its answer brought back.
//!
//! The kernel picks a backend per connection, in `cgroup/connect4`, from the routing inputs
//! the socket was tagged with, so a request goes only on a connection tagged with exactly its
//! inputs: a fresh one ([`connect`]), or (`gateway.upstream_reuse = "conversation"`, the
//! default) an idle one kept from an earlier request with the same model, memory need and
//! conversation key ([`pool`]). A request without a conversation key always gets a fresh one.
//!
//! - [`connect`]: a socket tagged with the request's inputs, connected to the model's VIP.
//! - [`conn`]: one HTTP/1.1 connection to the backend, and one request sent on it.
//! - [`pool`]: idle connections kept per routing inputs, marked idle in the kernel.
//! - [`request`]: the request as the backend gets it ([`request::UpRequest`]).
//! - [`h1`], [`scan`], [`body`]: the front door's own HTTP/1 client (the request written
//!   as one buffer, the response head scanned in place, the body read off the socket).
//! - [`relay`]: the answer relayed to the client, the connection given back at its end.
//!
//! Two HTTP/1 clients: the front door's own ([`h1`], with `gateway.http1_fast_path = true`, the
//! default), and hyper's (`http1_fast_path = false`). hyper's stays because that setting is
//! the operator's way back to hyper on BOTH sides, a general HTTP/1 implementation in place of
//! the hand-written one, and the front-door benchmark measures it as a variant. HTTP/2 (h2c)
//! clients do not need it: whichever server reads their requests, the request goes upstream
//! as HTTP/1.1 through the client the setting selects ([`request::UpRequest::encode_head`] or
//! [`request::UpRequest::to_hyper`]).

pub mod body;
pub mod conn;
pub mod connect;
pub mod h1;
pub mod pool;
pub mod relay;
pub mod request;
pub mod scan;
