//! Replays one request: a TCP socket tagged through the ailb client ABI before `connect()`
//! (unless the spec says not to), `POST /v1/chat/completions` with `"stream": true`, the
//! prompt as text (a conversation's later turn as the chat so far: its earlier questions and
//! answers as user and assistant messages) and the conversation as `X-Session-ID`, and the SSE
//! stream read to the end, timing the first token and the last byte.
//!
//! What the client reads back from the server, all optional: the standard OpenAI usage chunk
//! (`usage.completion_tokens`, `usage.prompt_tokens_details.cached_tokens`, asked for with
//! `stream_options.include_usage`), and the backend that served the request, from the response
//! header `x-ailb-backend` or else a chunk's `system_fingerprint`.

#![forbid(unsafe_code)]

use std::error::Error as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use ailb_common::abi::MAX_CONVERSATION_LEN;
use ailb_common::client::{self, Tags};
use serde_json::{json, Value};

use crate::text;

/// Largest response header block accepted.
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Longest SSE line accepted.
const MAX_LINE_BYTES: u64 = 1 << 20;

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Position in the replay (send order).
    pub index: usize,
    /// Trace line, when replaying a trace.
    pub line: Option<usize>,
    /// Planned send time, ms after the replay started.
    pub at_ms: u64,
    pub conversation: String,
    pub memory_mb: u32,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub hash_ids: Vec<u64>,
    /// Where each earlier message of a conversation ends in the prompt, in tokens (ascending;
    /// empty: the prompt is one user message). The prompt is sent cut there, the messages
    /// alternating user and assistant, as a chat client resends a conversation's history.
    pub message_ends: Vec<u32>,
    pub model: String,
    /// Whether the socket carries the conversation and memory tags of the ailb client ABI
    /// (`false`: a client of an L4 or L7 balancer, which knows neither). The conversation is
    /// sent as `X-Session-ID` either way.
    pub tag_socket: bool,
    /// Whether a tagged socket also carries the prompt's text prefix keys (`AILB_PREFIX`:
    /// `ailb_common::prefix::text_keys` of the prompt text, the ones `prefix::sent` picks), for
    /// ailb's prefix-aware kernel pick.
    pub prefix_keys: bool,
}

impl RequestSpec {
    /// The JSON body: an OpenAI chat completion request, streamed, whose messages are the
    /// prompt's text ([`text::prompt_text`]: each block id rendered as the same 512 tokens of
    /// text) cut at `message_ends` ([`Self::messages`]), so that the server and any router in
    /// between see only text, no block ids.
    pub fn body(&self) -> Value {
        self.body_of(&self.prompt())
    }

    /// The prompt's text ([`text::prompt_text`]).
    pub fn prompt(&self) -> String {
        text::prompt_text(&self.hash_ids, u64::from(self.prompt_tokens), self.index as u64)
    }

    /// The prefix keys a socket of this request carries (empty unless `tag_socket` and
    /// `prefix_keys`): the text keys of `prompt`, at most 16.
    pub fn socket_prefix_keys(&self, prompt: &str) -> Vec<u64> {
        if !(self.tag_socket && self.prefix_keys) {
            return Vec::new();
        }
        let all = ailb_common::prefix::text_keys(prompt.as_bytes());
        ailb_common::prefix::sent(&all).map(|(_, k)| k).collect()
    }

    /// The chat messages of `prompt`: its text cut where `message_ends` say (each end taken
    /// as its bytes under the simulator's [`text::BYTES_PER_TOKEN`], kept inside the prompt),
    /// the pieces alternating user and assistant, the last one the user's. Concatenated, the
    /// contents are `prompt` again, so a router or server that reads the text alone sees what
    /// one message would give.
    pub fn messages(&self, prompt: &str) -> Vec<Value> {
        let mut cuts: Vec<usize> = self
            .message_ends
            .iter()
            .map(|&t| (u64::from(t) * text::BYTES_PER_TOKEN) as usize)
            .filter(|&b| b > 0 && b < prompt.len())
            .collect();
        cuts.dedup();
        cuts.push(prompt.len());
        // Roles are counted back from the last piece, the user's new question.
        let last = cuts.len() - 1;
        let mut start = 0;
        cuts.iter()
            .enumerate()
            .map(|(i, &end)| {
                let role = if (last - i).is_multiple_of(2) { "user" } else { "assistant" };
                let piece = &prompt[start..end];
                start = end;
                json!({"role": role, "content": piece})
            })
            .collect()
    }

    fn body_of(&self, prompt: &str) -> Value {
        json!({
            "model": self.model,
            "messages": self.messages(prompt),
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": self.max_tokens,
        })
    }
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestRecord {
    pub index: usize,
    pub line: Option<usize>,
    pub conversation: String,
    pub at_ms: u64,
    /// Actual send time, ms after the replay started.
    pub sent_ms: f64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub memory_mb: u32,
    /// Whether ailb accepted the tags (`false`: `ENOPROTOOPT`, no balancer for this cgroup).
    pub tagged: bool,
    pub status: Option<u16>,
    pub error: Option<String>,
    /// From the start of `connect()` to the first chunk with content.
    pub ttft_ms: Option<f64>,
    /// From the start of `connect()` to the end of the stream.
    pub e2e_ms: f64,
    /// Output tokens: the server's `usage.completion_tokens`, else the chunks with content.
    pub tokens: u32,
    pub cached_tokens: Option<u32>,
    pub backend: Option<String>,
    /// The answer's `Retry-After`, seconds (a refusal's advice to the client).
    pub retry_after: Option<u32>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.status == Some(200)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "index": self.index, "line": self.line, "conversation": self.conversation, "at_ms": self.at_ms,
            "sent_ms": self.sent_ms, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
            "memory_mb": self.memory_mb, "tagged": self.tagged, "status": self.status, "error": self.error,
            "ttft_ms": self.ttft_ms, "e2e_ms": self.e2e_ms, "tokens": self.tokens,
            "cached_tokens": self.cached_tokens, "backend": self.backend, "retry_after": self.retry_after,
        })
    }
}

impl RequestRecord {
    /// A record of `spec` with no outcome yet.
    pub fn for_spec(spec: &RequestSpec) -> Self {
        Self {
            index: spec.index,
            line: spec.line,
            conversation: spec.conversation.clone(),
            at_ms: spec.at_ms,
            prompt_tokens: spec.prompt_tokens,
            max_tokens: spec.max_tokens,
            memory_mb: spec.memory_mb,
            ..Default::default()
        }
    }
}

/// Sends `spec` to `vip` and reads the stream, giving up after `timeout` in all.
/// Never panics on a network or protocol error: it is recorded in `error`.
pub fn send(vip: SocketAddrV4, spec: &RequestSpec, timeout: Duration) -> RequestRecord {
    let mut rec = RequestRecord::for_spec(spec);
    let start = Instant::now();
    let res = exchange(vip, spec, timeout, start, &mut rec);
    rec.e2e_ms = ms(start.elapsed());
    if let Err(e) = res {
        rec.error = Some(e);
    }
    rec
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn exchange(
    vip: SocketAddrV4,
    spec: &RequestSpec,
    timeout: Duration,
    start: Instant,
    rec: &mut RequestRecord,
) -> Result<(), String> {
    let deadline = start + timeout;
    let (conv, memory_mb) = if spec.tag_socket { (spec.conversation.as_str(), spec.memory_mb) } else { ("", 0) };
    let prompt = spec.prompt();
    let keys = spec.socket_prefix_keys(&prompt);
    let mut stream = connect_tagged_with(vip, conv, memory_mb, &keys, timeout, &mut rec.tagged)?;
    let body = spec.body_of(&prompt).to_string();
    let session = session_header(&spec.conversation);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {vip}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\n{session}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(|e| format!("send: {e}"))?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_head(&mut reader)?;
    rec.status = Some(status);
    rec.backend = header(&headers, "x-ailb-backend").map(str::to_string);
    rec.retry_after = header(&headers, "retry-after").and_then(|v| v.parse().ok());
    let chunked = header(&headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body: Box<dyn Read> = if chunked { Box::new(Chunked::new(reader)) } else { Box::new(reader) };
    let mut body = BufReader::new(body);
    if status != 200 {
        let mut text = String::new();
        let _ = body.by_ref().take(512).read_to_string(&mut text);
        return Err(format!("HTTP {status}: {}", text.trim()));
    }
    let (mut chunks, mut usage_tokens, mut done) = (0u32, None, false);
    let mut line = String::new();
    loop {
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} reading the stream"));
        }
        line.clear();
        let n = body.by_ref().take(MAX_LINE_BYTES).read_line(&mut line).map_err(|e| format!("read stream: {e}"))?;
        if n == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data:") else { continue };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("bad SSE chunk {data:?}: {e}"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("server error in stream: {err}"));
        }
        let content = v.pointer("/choices/0/delta/content").or_else(|| v.pointer("/choices/0/text"));
        if content.and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            if rec.ttft_ms.is_none() {
                rec.ttft_ms = Some(ms(start.elapsed()));
            }
            chunks += 1;
        }
        if rec.backend.is_none() {
            rec.backend = v.get("system_fingerprint").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage_tokens = u.get("completion_tokens").and_then(Value::as_u64).map(|t| t as u32);
            rec.cached_tokens =
                u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).map(|t| t as u32);
        }
    }
    rec.tokens = usage_tokens.unwrap_or(chunks);
    if !done {
        return Err("stream ended without data: [DONE]".to_string());
    }
    Ok(())
}

/// The `X-Session-ID` header line of a conversation (what vLLM's router hashes for
/// `consistent_hash`), empty for none; a conversation that is not a valid header value is not sent.
fn session_header(conversation: &str) -> String {
    let valid = !conversation.is_empty() && conversation.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if valid {
        format!("X-Session-ID: {conversation}\r\n")
    } else {
        String::new()
    }
}

/// A TCP socket tagged with the conversation and the memory need, connected to `vip`.
/// The conversation is cut to the ABI's [`MAX_CONVERSATION_LEN`] bytes; an empty one and a
/// memory need of 0 are not sent. `ENOPROTOOPT` from `setsockopt` means ailb is not loaded
/// here: the socket is used untagged and `tagged` stays false.
pub fn connect_tagged(
    vip: SocketAddrV4,
    conversation: &str,
    memory_mb: u32,
    timeout: Duration,
    tagged: &mut bool,
) -> Result<TcpStream, String> {
    connect_tagged_with(vip, conversation, memory_mb, &[], timeout, tagged)
}

/// [`connect_tagged`], the socket also carrying `prefix_keys` (`AILB_PREFIX`, none when empty).
pub fn connect_tagged_with(
    vip: SocketAddrV4,
    conversation: &str,
    memory_mb: u32,
    prefix_keys: &[u64],
    timeout: Duration,
    tagged: &mut bool,
) -> Result<TcpStream, String> {
    let conv = conversation.as_bytes();
    let conv = &conv[..conv.len().min(MAX_CONVERSATION_LEN)];
    let mut tags = Tags::new();
    if !conv.is_empty() {
        tags = tags.conversation(conv);
    }
    if memory_mb > 0 {
        tags = tags.required_memory_mb(memory_mb);
    }
    if !prefix_keys.is_empty() {
        tags = tags.prefix(prefix_keys);
    }
    *tagged = false;
    let (stream, outcome) = client::connect(vip, &tags, Some(timeout)).map_err(|e| error_chain(&e))?;
    *tagged = outcome.tagging.is_accepted();
    stream.set_write_timeout(Some(timeout)).map_err(|e| format!("set timeout: {e}"))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| format!("set timeout: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("set nodelay: {e}"))?;
    Ok(stream)
}

/// `e` and its sources, joined by ": ".
fn error_chain(e: &client::ClientError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn read_head<R: BufRead>(r: &mut R) -> Result<(u16, Vec<(String, String)>), String> {
    let mut total = 0usize;
    let mut line = String::new();
    let mut status = None;
    let mut headers = Vec::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).map_err(|e| format!("read response head: {e}"))?;
        if n == 0 {
            return Err("connection closed before the end of the response head".to_string());
        }
        total += n;
        if total > MAX_HEADER_BYTES {
            return Err(format!("response head over {MAX_HEADER_BYTES} bytes"));
        }
        let l = line.trim_end();
        match status {
            None => {
                let code = l.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok());
                status = Some(code.ok_or_else(|| format!("bad status line {l:?}"))?);
            }
            Some(_) if l.is_empty() => break,
            Some(_) => {
                if let Some((k, v)) = l.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
        }
    }
    Ok((status.unwrap_or_default(), headers))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// A `Transfer-Encoding: chunked` body decoder (the replay's and the real-engine race's).
pub struct Chunked<R> {
    inner: R,
    left: u64,
    done: bool,
}

impl<R: BufRead> Chunked<R> {
    pub fn new(inner: R) -> Self {
        Self { inner, left: 0, done: false }
    }
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        while self.left == 0 {
            if self.done {
                return Ok(0);
            }
            let mut size = String::new();
            if self.inner.by_ref().take(1024).read_line(&mut size)? == 0 {
                return Err(bad("chunked body: connection closed mid-body".into()));
            }
            let s = size.trim();
            if s.is_empty() {
                continue; // the CRLF after a chunk's data
            }
            let hex = s.split(';').next().unwrap_or("");
            self.left = u64::from_str_radix(hex, 16).map_err(|_| bad(format!("chunked body: bad size {s:?}")))?;
            if self.left == 0 {
                self.done = true;
            }
        }
        let want = buf.len().min(self.left as usize);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(bad("chunked body: connection closed mid-chunk".into()));
        }
        self.left -= n as u64;
        Ok(n)
    }
}
