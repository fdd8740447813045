//! The Responses API's stored responses, as the front door follows them: which backend
//! produced each response id ([`ResponseTable`]), and the id found in an answer as it passes
//! ([`IdScanner`]). Pure: time is passed in, so every rule is unit-tested here.
//!
//! A server that stores a response (vLLM with `store: true`) keeps it in its own memory, so a
//! request naming it in `previous_response_id` must reach that server: the kernel's pick,
//! which knows nothing of response ids, cannot promise it. The id comes from the answer: the
//! JSON body's top-level `id` when not streamed, the `response.created` event's `response.id`
//! when streamed (the first event vLLM and OpenAI send).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

/// Bytes of an answer searched for its id at most: vLLM and OpenAI put `id` first in a
/// response object and `response.created` first in a stream, so an answer whose first
/// 64 KiB hold neither carries no id the front door can use.
pub const SCAN_LIMIT: usize = 64 * 1024;

/// What the front door remembers of a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The backend that answered it, where it is stored.
    pub backend: SocketAddrV4,
    /// The catalog model it was asked of.
    pub model: String,
    /// The conversation key of the request it answered, which a follow-up keeps.
    pub conversation: Option<String>,
}

#[derive(Debug)]
struct Entry {
    stored: Stored,
    at: Instant,
    /// Its place in `order` (an id remembered again is a new place).
    seq: u64,
}

/// Response id to [`Stored`], at most `max_entries` (the oldest forgotten first), each for at
/// most `ttl` from when it was learned (`None`: until pushed out).
#[derive(Debug)]
pub struct ResponseTable {
    max_entries: usize,
    ttl: Option<Duration>,
    map: HashMap<String, Entry>,
    order: VecDeque<(String, u64)>,
    next_seq: u64,
}

impl ResponseTable {
    pub fn new(max_entries: usize, ttl: Option<Duration>) -> Self {
        Self { max_entries: max_entries.max(1), ttl, map: HashMap::new(), order: VecDeque::new(), next_seq: 0 }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Remembers that `id` was answered as `stored` at `now`.
    pub fn insert(&mut self, id: String, stored: Stored, now: Instant) {
        self.expire(now);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((id.clone(), seq));
        self.map.insert(id, Entry { stored, at: now, seq });
        while self.map.len() > self.max_entries {
            self.pop_oldest();
        }
        // Places of ids remembered again are left behind in `order`; never more than the map.
        while self.order.len() > 2 * self.max_entries {
            self.pop_oldest();
        }
    }

    /// What is remembered of `id` at `now`.
    pub fn get(&mut self, id: &str, now: Instant) -> Option<Stored> {
        self.expire(now);
        self.map.get(id).map(|e| e.stored.clone())
    }

    fn pop_oldest(&mut self) {
        if let Some((id, seq)) = self.order.pop_front() {
            if self.map.get(&id).is_some_and(|e| e.seq == seq) {
                self.map.remove(&id);
            }
        }
    }

    /// Forgets the entries older than the ttl (they are in `order` oldest first).
    fn expire(&mut self, now: Instant) {
        let Some(ttl) = self.ttl else { return };
        while let Some((id, seq)) = self.order.front() {
            let live = match self.map.get(id) {
                Some(e) if e.seq == *seq => now.saturating_duration_since(e.at) < ttl,
                _ => false,
            };
            if live {
                break;
            }
            self.pop_oldest();
        }
    }
}

/// Finds a response's id in its answer body, fed frame by frame as the frames pass (nothing
/// is held back from the client): the top-level `id` of a JSON object, or the
/// `response.id` of a `response.created` event of an event stream.
#[derive(Debug)]
pub struct IdScanner {
    sse: bool,
    buf: Vec<u8>,
    /// Bytes seen, kept or not.
    seen: usize,
    done: bool,
}

impl IdScanner {
    /// A scanner for an event stream (`sse`) or a JSON body.
    pub fn new(sse: bool) -> Self {
        Self { sse, buf: Vec::new(), seen: 0, done: false }
    }

    /// Whether it found the id or gave up (past [`SCAN_LIMIT`], or the answer has none).
    pub fn done(&self) -> bool {
        self.done
    }

    /// The next bytes of the body; the id, once, when they complete it.
    pub fn feed(&mut self, data: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        self.seen += data.len();
        let room = SCAN_LIMIT.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
        let found = if self.sse { self.scan_events() } else { self.scan_json() };
        match found {
            Found::Id(id) => {
                self.finish();
                Some(id)
            }
            Found::None => {
                self.finish();
                None
            }
            Found::More if self.seen >= SCAN_LIMIT => {
                self.finish();
                None
            }
            Found::More => None,
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.buf = Vec::new();
    }

    fn scan_json(&self) -> Found {
        top_level_id(&self.buf)
    }

    /// Each whole event in the buffer: its `data` parsed, the id taken from `response.created`.
    fn scan_events(&mut self) -> Found {
        loop {
            let Some((end, sep)) = event_end(&self.buf) else { return Found::More };
            let event: Vec<u8> = self.buf.drain(..end + sep).take(end).collect();
            let mut data = Vec::new();
            for line in event.split(|&b| b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(d) = line.strip_prefix(b"data:") {
                    if !data.is_empty() {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(d.strip_prefix(b" ").unwrap_or(d));
                }
            }
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&data) else { continue };
            if v["type"] == "response.created" {
                return match v["response"]["id"].as_str() {
                    Some(id) if !id.is_empty() => Found::Id(id.to_string()),
                    _ => Found::None,
                };
            }
        }
    }
}

/// Where the first event of `buf` ends (its length) and the blank line's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// What a scan of the bytes so far says.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Id(String),
    /// The answer has no id where one is looked for.
    None,
    /// The bytes end before it is known.
    More,
}

/// The top-level `"id"` string of the JSON object that `buf` begins (a prefix of the body):
/// the members before it are skipped without being parsed into values.
fn top_level_id(buf: &[u8]) -> Found {
    let mut p = Cursor { buf, at: 0 };
    match p.next_non_ws() {
        Some(b'{') => p.at += 1,
        Some(_) => return Found::None,
        None => return Found::More,
    }
    loop {
        match p.next_non_ws() {
            Some(b'"') => {}
            Some(_) => return Found::None,
            None => return Found::More,
        }
        let key_start = p.at;
        let Some(key_end) = p.skip_string() else { return Found::More };
        let is_id = &buf[key_start..key_end] == b"\"id\"";
        match p.next_non_ws() {
            Some(b':') => p.at += 1,
            Some(_) => return Found::None,
            None => return Found::More,
        }
        match p.next_non_ws() {
            None => return Found::More,
            Some(b'"') if is_id => {
                let start = p.at;
                let Some(end) = p.skip_string() else { return Found::More };
                return match serde_json::from_slice::<String>(&buf[start..end]) {
                    Ok(id) if !id.is_empty() => Found::Id(id),
                    _ => Found::None,
                };
            }
            Some(_) if is_id => return Found::None,
            Some(_) => {
                if !p.skip_value() {
                    return Found::More;
                }
            }
        }
        match p.next_non_ws() {
            Some(b',') => p.at += 1,
            Some(_) => return Found::None,
            None => return Found::More,
        }
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    /// The next byte that is not JSON whitespace (not consumed).
    fn next_non_ws(&mut self) -> Option<u8> {
        while let Some(&b) = self.buf.get(self.at) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    /// Past the string that starts here (at its `"`); its end, or `None` when it runs out.
    fn skip_string(&mut self) -> Option<usize> {
        let mut i = self.at + 1;
        while let Some(&b) = self.buf.get(i) {
            match b {
                b'\\' => i += 2,
                b'"' => {
                    self.at = i + 1;
                    return Some(self.at);
                }
                _ => i += 1,
            }
        }
        None
    }

    /// Past the value that starts here; `false` when it runs out first.
    fn skip_value(&mut self) -> bool {
        let mut depth = 0usize;
        loop {
            let Some(&b) = self.buf.get(self.at) else { return false };
            match b {
                b'"' => {
                    if self.skip_string().is_none() {
                        return false;
                    }
                    if depth == 0 {
                        return true;
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => return true,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        return true;
                    }
                }
                b',' if depth == 0 => return true,
                _ => {}
            }
            self.at += 1;
        }
    }
}

#[cfg(test)]
mod tests;
