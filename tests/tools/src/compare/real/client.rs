//! The client of the real-engine race: a closed loop of `concurrency` threads that send the
//! workload's requests in order (each thread takes the next one when its last is answered), each
//! on a fresh connection (`Connection: close`), tagged through ailb's client ABI where the
//! request says so (`ENOPROTOOPT` without ailb: sent untagged), streamed, timing the first
//! token and the end, and reading the usage chunk (prompt tokens, cached tokens, output tokens).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ailb_sim::replay::client::connect_tagged;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::workload::RealRequest;

/// What happened to one request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Record {
    pub index: usize,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// From the start of `connect()` to the first chunk with content, ms.
    pub ttft_ms: Option<f64>,
    /// From the start of `connect()` to the end of the stream, ms.
    pub e2e_ms: f64,
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (the server runs with
    /// `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Whether ailb accepted the socket's tags.
    pub tagged: bool,
}

impl Record {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.status == Some(200)
    }
}

/// Sends `requests` to `addrs` with `concurrency` threads; requests not started by `deadline`
/// are failures ("not sent"). With one address every request goes there; with more (the
/// `tenant-pinned` oracle) a request of tenant `t` goes to `addrs[t % len]`, one without a
/// tenant by its index. Returns the records in index order and the wall time, s.
pub fn run(
    addrs: &[SocketAddrV4],
    requests: &[RealRequest],
    concurrency: usize,
    deadline: Duration,
) -> (Vec<Record>, f64) {
    assert!(!addrs.is_empty(), "the client needs an address");
    let addrs = Arc::new(addrs.to_vec());
    let start = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let records = Arc::new(Mutex::new(Vec::with_capacity(requests.len())));
    let requests = Arc::new(requests.to_vec());
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (next, records, requests, addrs) = (next.clone(), records.clone(), requests.clone(), addrs.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(req) = requests.get(i) else { break };
                let left = deadline.saturating_sub(start.elapsed());
                let rec = if left.is_zero() {
                    Record {
                        index: i,
                        error: Some(format!("not sent: deadline of {deadline:?} reached")),
                        ..Default::default()
                    }
                } else {
                    send(addrs[req.tenant.unwrap_or(i) % addrs.len()], i, req, left)
                };
                records.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let wall_s = start.elapsed().as_secs_f64();
    let mut recs = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    recs.sort_by_key(|r| r.index);
    (recs, wall_s)
}

/// One request, at most `timeout` in all; errors are recorded, never raised.
pub fn send(addr: SocketAddrV4, index: usize, req: &RealRequest, timeout: Duration) -> Record {
    let mut rec = Record { index, ..Default::default() };
    let start = Instant::now();
    if let Err(e) = exchange(addr, req, timeout, start, &mut rec) {
        rec.error = Some(e);
    }
    rec.e2e_ms = start.elapsed().as_secs_f64() * 1000.0;
    rec
}

fn exchange(
    addr: SocketAddrV4,
    req: &RealRequest,
    timeout: Duration,
    start: Instant,
    rec: &mut Record,
) -> Result<(), String> {
    let conv = req.tag_conversation.as_deref().unwrap_or("");
    let mut stream = connect_tagged(addr, conv, req.memory_mb, timeout, &mut rec.tagged)?;
    let body = req.body.to_string();
    let session = req.session.as_ref().map(|s| format!("X-Session-ID: {s}\r\n")).unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\n{session}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(|e| format!("send: {e}"))?;
    let mut reader = BufReader::new(stream);
    let (status, chunked) = read_head(&mut reader)?;
    rec.status = Some(status);
    let body: Box<dyn Read> =
        if chunked { Box::new(ailb_sim::replay::client::Chunked::new(reader)) } else { Box::new(reader) };
    let mut body = BufReader::new(body);
    if status != 200 {
        let mut text = String::new();
        let _ = body.by_ref().take(512).read_to_string(&mut text);
        return Err(format!("HTTP {status}: {}", text.trim()));
    }
    let deadline = start + timeout;
    let mut line = String::new();
    loop {
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} reading the stream"));
        }
        line.clear();
        if body.read_line(&mut line).map_err(|e| format!("read stream: {e}"))? == 0 {
            return Err("stream ended without data: [DONE]".into());
        }
        let Some(data) = line.trim_end().strip_prefix("data:").map(str::trim) else { continue };
        if data == "[DONE]" {
            return Ok(());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("bad SSE chunk {data:?}: {e}"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("server error in stream: {err}"));
        }
        let content = v.pointer("/choices/0/delta/content").and_then(Value::as_str);
        if rec.ttft_ms.is_none() && content.is_some_and(|c| !c.is_empty()) {
            rec.ttft_ms = Some(start.elapsed().as_secs_f64() * 1000.0);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            rec.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
            rec.completion_tokens = u.get("completion_tokens").and_then(Value::as_u64);
            rec.cached_tokens = u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64);
        }
    }
}

/// The status and whether the body is chunked.
fn read_head<R: BufRead>(r: &mut R) -> Result<(u16, bool), String> {
    let mut line = String::new();
    let mut status = None;
    let mut chunked = false;
    for _ in 0..200 {
        line.clear();
        if r.read_line(&mut line).map_err(|e| format!("read response head: {e}"))? == 0 {
            return Err("connection closed before the end of the response head".into());
        }
        let l = line.trim_end();
        match status {
            None => {
                status = Some(
                    l.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or(format!("bad status line {l:?}"))?,
                )
            }
            Some(s) if l.is_empty() => return Ok((s, chunked)),
            Some(_) => {
                if let Some((k, v)) = l.split_once(':') {
                    chunked |= k.trim().eq_ignore_ascii_case("transfer-encoding")
                        && v.to_ascii_lowercase().contains("chunked");
                }
            }
        }
    }
    Err("response head over 200 lines".into())
}

#[cfg(test)]
mod tests;
