//! The Responses API's stored responses: the backend that answered each response is learned
//! from its answer as it passes ([`Learn`], [`learn_whole`]), and a request that names it is
//! sent there ([`Responses::pinned`]), by a direct connect to that backend's address, since the
//! server keeps the stored response in its own memory and no other has it: a follow-up
//! (`POST /v1/responses` with `previous_response_id`), and the requests for one response by
//! its id ([`by_id`]: `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`).
//!
//! A request whose response the front door does not know (never answered through it, or
//! forgotten: `gateway.responses_max_entries`, `gateway.responses_ttl`, a restart), or whose
//! backend refuses the connection (gone), is answered 404 (`previous_response_not_found` for
//! a follow-up) naming the id: the status vLLM answers for an id it does not hold, since the
//! response is as lost to the client as if it had never been stored. A 503 would invite a
//! retry that can never succeed.
//!
//! Cost of the direct connect: the kernel does not pick it, so it is not counted in flight at
//! the backend (the load bound and the memory fit of other picks do not see it); the
//! front door's own admission still counts it.

use std::net::SocketAddrV4;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper::StatusCode;
use prometheus_client::metrics::gauge::Gauge;

use super::http::{ApiError, BoxError};
use super::response_ids::{IdScanner, ResponseTable, Stored};
use crate::config::gateway::ValidGateway;

/// The response ids the front door learned, shared by every worker.
pub struct Responses {
    table: Mutex<ResponseTable>,
    /// `ailb_gateway_responses_remembered`.
    remembered: Gauge,
}

impl Responses {
    /// An empty table of `cfg`'s size and age, its size shown on `remembered`.
    pub fn new(cfg: &ValidGateway, remembered: Gauge) -> Arc<Self> {
        let table = ResponseTable::new(cfg.responses_max_entries as usize, cfg.responses_ttl);
        Arc::new(Self { table: Mutex::new(table), remembered })
    }

    fn table(&self) -> MutexGuard<'_, ResponseTable> {
        // Every change of the table completes under the lock, so a panic elsewhere leaves it whole.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the response `id` is stored, or the 404 that says the front door does not know it
    /// (`param`: the request's field or path part that named it).
    pub fn pinned(&self, id: &str, param: Param) -> Result<Stored, ApiError> {
        self.table().get(id, Instant::now()).ok_or_else(|| {
            not_found(
                param,
                format!(
                    "Response with id '{id}' not found: this gateway knows no backend that stored it (it was not \
                     answered through this gateway, or was forgotten: gateway.responses_max_entries, \
                     gateway.responses_ttl, a restart)"
                ),
            )
        })
    }

    /// Remembers that the response `id` is stored as `stored`.
    pub fn learn(&self, id: String, stored: Stored) {
        let mut table = self.table();
        table.insert(id, stored, Instant::now());
        self.remembered.set(i64::try_from(table.len()).unwrap_or(i64::MAX));
    }

    /// Responses remembered now.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }
}

/// What named a stored response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A follow-up's `previous_response_id`.
    PreviousResponseId,
    /// The id in the path (`/v1/responses/{id}`), as vLLM names it.
    ResponseId,
}

/// The 404 of a request whose stored response's backend refused the connection.
pub fn gone(id: &str, backend: SocketAddrV4, param: Param) -> ApiError {
    not_found(
        param,
        format!("Response with id '{id}' not found: the backend that stored it, {backend}, is gone (it refused the connection)"),
    )
}

fn not_found(param: Param, message: String) -> ApiError {
    let (code, name) = match param {
        Param::PreviousResponseId => ("previous_response_not_found", "previous_response_id"),
        Param::ResponseId => ("response_not_found", "response_id"),
    };
    ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", code, message).param(Some(name))
}

/// The id of a request for one stored response: `GET /v1/responses/{id}` (retrieve, also
/// `?stream=true` to replay a stream) and `POST /v1/responses/{id}/cancel`.
pub fn by_id<'p>(method: &hyper::Method, path: &'p str) -> Option<&'p str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let id = match (method, rest.strip_suffix("/cancel")) {
        (&hyper::Method::POST, Some(id)) => id,
        (&hyper::Method::GET, None) => rest,
        _ => return None,
    };
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// What an answer's id is learned with.
pub struct Learner {
    pub responses: Arc<Responses>,
    pub stored: Stored,
}

impl Learner {
    fn found(&self, id: String) {
        self.responses.learn(id, self.stored.clone());
    }
}

/// An answer that came whole: its id learned at once.
pub fn learn_whole(learner: Learner, data: &[u8]) {
    if let Some(id) = IdScanner::new(false).feed(data) {
        learner.found(id);
    }
}

/// A relayed answer whose frames are read for the response's id as they pass to the client,
/// each passed on as it comes.
pub struct Learn<B> {
    inner: B,
    scan: Option<(IdScanner, Learner)>,
}

impl<B> Learn<B> {
    /// `inner` relayed, read as an event stream (`sse`) or a JSON body.
    pub fn new(inner: B, sse: bool, learner: Learner) -> Self {
        Self { inner, scan: Some((IdScanner::new(sse), learner)) }
    }
}

impl<B> HttpBody for Learn<B>
where
    B: HttpBody<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some((scanner, learner)), Some(data)) = (this.scan.as_mut(), frame.data_ref()) {
                if let Some(id) = scanner.feed(data) {
                    learner.found(id);
                }
                if scanner.done() {
                    this.scan = None;
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
