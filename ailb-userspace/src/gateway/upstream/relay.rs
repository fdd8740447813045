//! The upstream's answer relayed to the client ([`Relay`]), or ended at once when it came whole
//! with its head ([`whole`]); either way the request's connection then goes back to the
//! [`Pool`] or is shut down, before the last frame reaches the client. Dropping the relay
//! (the client went away) closes the upstream connection, so the model server frees the
//! request's slot.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use super::body::UpBody;
use super::conn::{Conn, Link};
use super::pool::{Pool, PoolKey};
use crate::gateway::http::{ApiError, BoxError, Deadline, ErrorShape};
use crate::gateway::log::RequestLog;

/// Where a connection goes when its response has been relayed whole: back to the pool under
/// its routing inputs.
pub struct Reuse {
    pub pool: Arc<Pool>,
    pub key: PoolKey,
}

/// Why a relayed body stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream sent nothing for {0:?} (gateway.idle_timeout)")]
    Idle(Duration),
    #[error("the request ran past {0:?} (gateway.total_timeout)")]
    Total(Duration),
}

/// The upstream's response body, forwarded frame by frame as it arrives; it records the
/// time to first byte, and on its end (or drop) the request's duration and access log.
///
/// When an event stream (`text/event-stream`) breaks off (the upstream reset, or a timeout),
/// the client gets one last event, `data: {"error": {...}}` in OpenAI's error shape (or
/// Anthropic's `event: error`, on its route: see [`ApiError::event`]), and a
/// clean end of the stream: an SSE client reads that as the answer's end with a reason, where a
/// cut connection would look like a network fault or, to some clients, like a hang. Other
/// bodies end with an error, which aborts the response (the client sees it incomplete).
pub struct Relay<T> {
    inner: UpBody,
    /// An event stream's error shape (`None`: not an event stream).
    sse: Option<ErrorShape>,
    done: bool,
    idle: Duration,
    /// When the last frame came (or the body first had to wait): the idle timeout counts
    /// from it.
    last_frame: Option<tokio::time::Instant>,
    /// The request's end (`gateway.total_timeout`), as every earlier wait of it had.
    deadline: Deadline,
    /// The timers, armed only when the body has to wait: a response that is there whole never
    /// touches the timer wheel.
    idle_timer: Option<Pin<Box<Sleep>>>,
    total_timer: Option<Pin<Box<Sleep>>>,
    log: Option<RequestLog>,
    started: Instant,
    /// The connection: closed on drop, or back to the pool after a whole response.
    conn: Option<Box<Conn>>,
    reuse: Option<Reuse>,
    held: Held<T>,
}

/// What a request holds: its `max_concurrent` slot until its answer is relayed whole (handed
/// to the client's connection, for an answer that came whole with its head) or dropped, and its
/// share of the admission's memory (`ticket`: the admission's, which the upstream side only
/// drops) until the upstream's answer is whole.
pub struct Held<T> {
    pub _permit: OwnedSemaphorePermit,
    pub ticket: Option<T>,
}

impl<T> Relay<T> {
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a separate part of one relayed request; a struct would only rename them"
    )]
    pub fn new(
        inner: UpBody,
        sse: Option<ErrorShape>,
        conn: Box<Conn>,
        reuse: Option<Reuse>,
        held: Held<T>,
        log: RequestLog,
        idle: Duration,
        deadline: Deadline,
    ) -> Self {
        Self {
            inner,
            sse,
            done: false,
            idle,
            last_frame: None,
            deadline,
            idle_timer: None,
            total_timer: None,
            started: log.started(),
            log: Some(log),
            conn: Some(conn),
            reuse,
            held,
        }
    }

    fn finish(&mut self, outcome: &'static str) {
        if let Some(log) = self.log.take() {
            log.finish(outcome);
        }
    }

    /// The whole response came (or the upstream failed): the connection goes back to the pool
    /// for the next request with the same routing inputs, or is shut down now, and then the
    /// request's memory is given back to the admission. Both happen before the last frame
    /// reaches the client, whose next request must not wait behind this one. In that order
    /// because giving the memory back wakes the admission's waiters (possibly on another
    /// thread at once), which read the kernel's count of this connection: ended first (idle
    /// mark or shutdown), the count is already down when they look; ended after, a waiter
    /// saw the fleet full and slept until its next poll with a slot free.
    /// `now` gives the time (read only when the connection goes back to the pool).
    fn release(&mut self, now: impl FnOnce() -> Instant) {
        if let Some(conn) = self.conn.take() {
            give_back(&mut self.inner, conn, self.reuse.take(), now);
        }
        drop(self.held.ticket.take());
    }

    /// The body broke off: an event stream ends with an error event, any other body with `e`.
    fn fail(&mut self, outcome: &'static str, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.reuse = None;
        self.release(Instant::now);
        self.finish(outcome);
        let Some(shape) = self.sse else {
            return Poll::Ready(Some(Err(e)));
        };
        self.done = true;
        let msg = format!("the upstream stream broke off: {}", crate::error_chain(&*e));
        let event = ApiError::bad_gateway(msg).shaped(shape).event();
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

/// An upstream's whole answer: its connection goes back to the pool for the next request with
/// the same routing inputs (`reuse`), or is shut down now. `now` gives the time (read only when
/// the connection goes back to the pool).
fn give_back(body: &mut UpBody, mut conn: Box<Conn>, reuse: Option<Reuse>, now: impl FnOnce() -> Instant) {
    if let Link::Raw(raw @ None) = &mut conn.link {
        *raw = body.take_raw();
    }
    match reuse {
        Some(Reuse { pool, key }) => pool.put_at(key, conn, now()),
        None => conn.done(),
    }
}

/// The end of a request whose answer came whole with its head ([`UpBody::take_whole`]), which
/// then needs no [`Relay`]: what the relay does at its last frame, done now. The connection goes
/// back (or is shut down), then the admission's memory and the request's `max_concurrent` slot
/// are given back (in that order, as [`Relay`] does), and the request is counted and logged,
/// with its first byte now when `data` (the body) has one.
pub fn whole<T>(
    mut body: UpBody,
    data: &Bytes,
    conn: Box<Conn>,
    reuse: Option<Reuse>,
    held: Held<T>,
    mut log: RequestLog,
) {
    let now = Instant::now();
    give_back(&mut body, conn, reuse, || now);
    drop(held);
    if !data.is_empty() {
        log.first_byte(now.saturating_duration_since(log.started()));
    }
    log.finish("ok");
}

impl<T: Unpin> HttpBody for Relay<T> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // One clock read per poll serves the deadline, the idle timeout, the time to first
        // byte and the pool (a frame that comes is read within this poll, microseconds later).
        let now = tokio::time::Instant::now();
        if now >= this.deadline.at {
            return this.fail("total timeout", Box::new(RelayError::Total(this.deadline.total)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.last_frame = Some(now);
                if let (Some(log), Some(data)) = (this.log.as_mut(), frame.data_ref()) {
                    if !data.is_empty() {
                        log.first_byte(now.into_std().saturating_duration_since(this.started));
                    }
                }
                if this.inner.is_end_stream() {
                    // The upstream's answer is whole: its connection stops counting in the
                    // kernel BEFORE this last frame reaches the client, whose next request
                    // must not see this one still in flight.
                    this.release(|| now.into_std());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.fail("upstream error", e),
            Poll::Ready(None) => {
                this.finish("ok");
                this.release(|| now.into_std());
                Poll::Ready(None)
            }
            Poll::Pending => {
                let deadline = this.deadline.at;
                let total = this.total_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if total.as_mut().poll(cx).is_ready() {
                    return this.fail("total timeout", Box::new(RelayError::Total(this.deadline.total)));
                }
                let deadline = *this.last_frame.get_or_insert(now) + this.idle;
                let idle = this.idle_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if idle.deadline() != deadline {
                    idle.as_mut().reset(deadline);
                }
                if idle.as_mut().poll(cx).is_ready() {
                    return this.fail("idle timeout", Box::new(RelayError::Idle(this.idle)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<T> Drop for Relay<T> {
    fn drop(&mut self) {
        // Dropped before its end: the client went away (or its connection failed); an
        // empty body may be dropped unpolled.
        let whole = !self.done && self.inner.is_end_stream();
        let outcome = if self.done || whole { "ok" } else { "client gone" };
        self.finish(outcome);
        if whole {
            self.release(Instant::now);
        }
    }
}

#[cfg(test)]
mod tests;
