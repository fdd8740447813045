//! The answer to a fast-path request, written the way hyper's server writes it: the status
//! line in the client's version, the headers as the handler left them, `date` when there is
//! none, the body framed by its `Content-Length` (the header's, or the body's exact size), by
//! chunks when its size is unknown (close-delimited for HTTP/1.0), and `connection: close`
//! when the connection ends after it. The head and a body that is there whole go out in one
//! write; a body that has to wait (a stream) goes out frame by frame as each arrives.
//!
//! While it waits for the next frame it also reads the client: an end of the connection
//! (the client went away) drops the body at once, which closes the upstream connection so
//! the model server frees the request's slot; bytes that arrive (a pipelined request) are
//! kept for the next head.

use std::cell::RefCell;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame};
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, CONTENT_LENGTH, DATE};
use hyper::{Response, StatusCode, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Client;
use crate::gateway::http::{Answer, Body, BoxError, HeadLines, MAX_HEAD_BYTES};

/// How a response's body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (1xx, 204, 304).
    None,
    /// `Content-Length`; `true` when the head must say it (the handler did not).
    Length(u64, bool),
    Chunked,
    /// Until the connection closes (HTTP/1.0, size unknown).
    Close,
}

/// How a response's body is delimited, as hyper's server decides it (`lines`: the upstream's
/// headers written before the response's own).
pub fn framing(resp: &Response<Body>, lines: Option<&HeadLines>, version: Version) -> Framing {
    let status = resp.status();
    if status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Framing::None;
    }
    let declared = lines
        .and_then(|l| l.content_length)
        .or_else(|| resp.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok()));
    match (declared, resp.body().size_hint().exact()) {
        (Some(n), _) => Framing::Length(n, false),
        (None, Some(n)) => Framing::Length(n, true),
        (None, None) if version == Version::HTTP_10 => Framing::Close,
        (None, None) => Framing::Chunked,
    }
}

/// Appends the response head to `out`: `lines` (the upstream's headers), then `headers`.
pub fn encode_head(
    out: &mut Vec<u8>,
    version: Version,
    status: StatusCode,
    (lines, headers): (Option<&HeadLines>, &HeaderMap),
    framing: Framing,
    close: bool,
) {
    out.extend_from_slice(if version == Version::HTTP_10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(l) = lines {
        out.extend_from_slice(l.as_bytes());
    }
    for (name, value) in headers {
        header(out, name.as_str(), value.as_bytes());
    }
    if !headers.contains_key(DATE) && !lines.is_some_and(|l| l.has_date) {
        DATE_NOW.with(|d| header(out, "date", d.borrow_mut().now().as_bytes()));
    }
    match framing {
        Framing::Length(n, true) => header(out, "content-length", n.to_string().as_bytes()),
        Framing::Chunked => header(out, "transfer-encoding", b"chunked"),
        Framing::Length(..) | Framing::None | Framing::Close => {}
    }
    if close && version == Version::HTTP_11 && !headers.contains_key(CONNECTION) {
        header(out, "connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
}

fn header(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `date` as HTTP writes it, formatted once a second per thread (as hyper caches it).
struct CachedDate {
    second: u64,
    value: HeaderValue,
}

impl CachedDate {
    fn now(&mut self) -> &HeaderValue {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            self.value = HeaderValue::try_from(httpdate::fmt_http_date(now)).expect("an HTTP date is a header value");
        }
        &self.value
    }
}

thread_local! {
    static DATE_NOW: RefCell<CachedDate> =
        const { RefCell::new(CachedDate { second: u64::MAX, value: HeaderValue::from_static("") }) };
}

/// Appends one body frame's data to `out`, framed.
fn encode_data(out: &mut Vec<u8>, framing: Framing, data: &Bytes) {
    if data.is_empty() {
        return;
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(data);
    }
}

/// The next frame when the body has one now, without waiting.
fn frame_now(body: &mut Body) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(body).poll_frame(&mut cx)
}

/// The next frame; meanwhile the client's connection is read, and `None` comes back (with
/// the body left unfinished) when the client closed it or it failed.
async fn next_frame(client: &mut Client, body: &mut Body) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
    loop {
        let room = client.buf.len() < MAX_HEAD_BYTES;
        tokio::select! {
            biased;
            f = body.frame() => return Some(f),
            r = client.stream.read_buf(&mut client.buf), if room => match r {
                Ok(0) | Err(_) => return None,
                Ok(_) => continue,
            },
        }
    }
}

/// Writes `resp` to the client of a `version` request; `close` when the connection ends after
/// it. Whether the connection can carry another request. `out` is the connection's write
/// buffer, kept by the caller from one answer to the next (its contents are not).
pub async fn send(client: &mut Client, out: &mut Vec<u8>, answer: Answer, version: Version, close: bool) -> bool {
    let Answer { resp, lines } = answer;
    let framing = framing(&resp, lines.as_ref(), version);
    let close = close || framing == Framing::Close;
    let (parts, mut body) = resp.into_parts();
    out.clear();
    out.reserve(512 + lines.as_ref().map_or(0, |l| l.as_bytes().len()));
    encode_head(out, version, parts.status, (lines.as_ref(), &parts.headers), framing, close);
    drop(lines);
    if framing == Framing::None {
        return client.stream.write_all(out).await.is_ok() && !close;
    }
    let mut sent = 0u64;
    loop {
        let frame = match frame_now(&mut body) {
            Poll::Ready(f) => f,
            Poll::Pending => {
                // The body has to wait: what is ready goes out now (the head of a stream, its
                // last event).
                if !out.is_empty() && client.stream.write_all(out).await.is_err() {
                    return false;
                }
                out.clear();
                match next_frame(client, &mut body).await {
                    Some(f) => f,
                    None => return false,
                }
            }
        };
        let end = match frame {
            None => true,
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    sent += data.len() as u64;
                    encode_data(out, framing, data);
                }
                body.is_end_stream()
            }
            Some(Err(e)) => {
                // As hyper does: the answer is cut, the client sees it incomplete.
                tracing::debug!(error = %crate::error_chain(&*e), "gateway: a response body failed");
                let _ = client.stream.write_all(out).await;
                return false;
            }
        };
        if end {
            if framing == Framing::Chunked {
                out.extend_from_slice(b"0\r\n\r\n");
            }
            let whole = !matches!(framing, Framing::Length(n, _) if n != sent);
            return client.stream.write_all(out).await.is_ok() && whole && !close;
        }
    }
}

#[cfg(test)]
mod tests;
