//! The Mooncake conversation trace: a streaming parser that reports bad lines instead of
//! stopping, the conversation id derived from the leading prompt blocks, and the memory hint.
//!
//! One JSON object per line: `timestamp` (ms since start), `input_length`, `output_length`
//! (tokens) and `hash_ids` (the prompt's 512-token KV-cache blocks; two requests that share a
//! leading run of `hash_ids` share that prompt prefix).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use flate2::bufread::MultiGzDecoder;

use serde_json::Value;

/// Largest accepted `input_length` / `output_length` (tokens). The trace peaks at about
/// 126,000 prompt tokens; anything past a million is a corrupt line, not a prompt.
pub const MAX_TOKENS: u64 = 1_000_000;
/// Largest accepted `timestamp`: one week in ms (the trace spans about an hour).
pub const MAX_TIMESTAMP_MS: u64 = 7 * 24 * 3600 * 1000;
/// Largest accepted number of `hash_ids` (MAX_TOKENS / 512 blocks, rounded up).
pub const MAX_BLOCKS: usize = 2_000;
/// Longest accepted line in bytes; a longer one is reported and skipped.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Tokens per KV-cache block in `hash_ids`.
pub const BLOCK_TOKENS: u64 = 512;

/// One request of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRequest {
    /// 1-based line number in the file.
    pub line: usize,
    pub timestamp_ms: u64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

/// A line that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseIssue {
    /// 1-based line number in the file.
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for ParseIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// Why a trace file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceFileError {
    #[error("opening trace {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the start of trace {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The first bytes of a gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Opens a trace file for [`parse`]: gzip-compressed (the shipped `.jsonl.gz`; recognised by its
/// first bytes, whatever its name) or plain JSON lines.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceFileError> {
    let file = File::open(path).map_err(|source| TraceFileError::Open { path: path.to_path_buf(), source })?;
    let mut reader = BufReader::new(file);
    let head = reader.fill_buf().map_err(|source| TraceFileError::Read { path: path.to_path_buf(), source })?;
    Ok(if head.starts_with(&GZIP_MAGIC) {
        Box::new(BufReader::new(MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader)
    })
}

/// [`open`] and [`parse`]: the trace's requests and its bad lines. A stream that stops
/// decoding midway ends with a `read error` issue.
pub fn load(path: &Path) -> Result<(Vec<TraceRequest>, Vec<ParseIssue>), TraceFileError> {
    Ok(parse(open(path)?))
}

/// Parses a trace line by line. Blank lines are ignored; every other line that is not a valid
/// request (unreadable, too long, not JSON, not an object, a field missing, negative, too large
/// or of the wrong type) becomes a [`ParseIssue`] with its line number and parsing goes on.
pub fn parse<R: BufRead>(mut reader: R) -> (Vec<TraceRequest>, Vec<ParseIssue>) {
    let mut requests = Vec::new();
    let mut issues = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        line += 1;
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                issues.push(ParseIssue { line, reason: format!("read error: {e}") });
                break;
            }
        }
        if buf.len() > MAX_LINE_BYTES {
            issues.push(ParseIssue { line, reason: format!("line of {} bytes (limit {MAX_LINE_BYTES})", buf.len()) });
            continue;
        }
        let text = match std::str::from_utf8(&buf) {
            Ok(t) => t.trim(),
            Err(e) => {
                issues.push(ParseIssue { line, reason: format!("not UTF-8: {e}") });
                continue;
            }
        };
        if text.is_empty() {
            continue;
        }
        match parse_line(line, text) {
            Ok(r) => requests.push(r),
            Err(reason) => issues.push(ParseIssue { line, reason }),
        }
    }
    (requests, issues)
}

/// Parses one non-empty line.
pub fn parse_line(line: usize, text: &str) -> Result<TraceRequest, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = v.as_object().ok_or_else(|| format!("expected a JSON object, got {}", kind(&v)))?;
    let timestamp_ms = uint_field(obj, "timestamp", MAX_TIMESTAMP_MS)?;
    let input_length = uint_field(obj, "input_length", MAX_TOKENS)? as u32;
    let output_length = uint_field(obj, "output_length", MAX_TOKENS)? as u32;
    let ids = obj.get("hash_ids").ok_or("field `hash_ids` is missing")?;
    let arr = ids.as_array().ok_or_else(|| format!("field `hash_ids`: expected an array, got {}", kind(ids)))?;
    if arr.len() > MAX_BLOCKS {
        return Err(format!("field `hash_ids`: {} blocks (limit {MAX_BLOCKS})", arr.len()));
    }
    let mut hash_ids = Vec::with_capacity(arr.len());
    for (i, h) in arr.iter().enumerate() {
        let id = h
            .as_u64()
            .ok_or_else(|| format!("field `hash_ids[{i}]`: expected a non-negative integer, got {}", show(h)))?;
        hash_ids.push(id);
    }
    Ok(TraceRequest { line, timestamp_ms, input_length, output_length, hash_ids })
}

fn uint_field(obj: &serde_json::Map<String, Value>, name: &str, max: u64) -> Result<u64, String> {
    let v = obj.get(name).ok_or_else(|| format!("field `{name}` is missing"))?;
    match v.as_u64() {
        Some(n) if n <= max => Ok(n),
        Some(n) => Err(format!("field `{name}`: {n} is too large (limit {max})")),
        None if v.as_i64().is_some() || v.as_f64().is_some_and(|f| f < 0.0) => {
            Err(format!("field `{name}`: {} is negative", show(v)))
        }
        None => Err(format!("field `{name}`: expected a non-negative integer, got {}", show(v))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!("{}...", &s[..s.char_indices().nth(40).map_or(s.len(), |(i, _)| i)])
    } else {
        s
    }
}

/// Default share of requests above which a block counts as shared by everyone (a system
/// prompt) rather than as part of one conversation: in the Mooncake trace block 0 is in every
/// request and the next most common block is in 43 of 12,031 (0.4 %).
pub const DEFAULT_COMMON_SHARE: f64 = 0.05;

/// Conversation ids for `requests` (same order), and how the trace groups.
///
/// The rule: a block that appears in more than `common_share` of the requests is a shared
/// system prompt, not a conversation. A request's conversation is its **first block that is
/// not shared** (`conv-<hash_id>`): a later turn of a conversation resends the whole history,
/// so it starts with the same leading run of blocks. Only the first such block is used, not
/// two or more, because a turn's last block is partial (a prompt is rarely a multiple of 512
/// tokens) and so changes when the next turn extends it: keying on two blocks would split a
/// conversation whose first turn had a single non-shared block. A request made only of shared
/// blocks is a conversation of its own (`req-<line>`).
pub fn conversations(requests: &[TraceRequest], common_share: f64) -> (Vec<String>, ConversationStats) {
    let mut count: HashMap<u64, usize> = HashMap::new();
    for r in requests {
        let mut seen: Vec<u64> = r.hash_ids.clone();
        seen.sort_unstable();
        seen.dedup();
        for h in seen {
            *count.entry(h).or_default() += 1;
        }
    }
    let limit = common_share * requests.len() as f64;
    let common = |h: &u64| count.get(h).is_some_and(|&c| c as f64 > limit);
    let mut turns: HashMap<String, usize> = HashMap::new();
    let ids: Vec<String> = requests
        .iter()
        .map(|r| {
            let id = match r.hash_ids.iter().find(|h| !common(h)) {
                Some(h) => format!("conv-{h}"),
                None => format!("req-{}", r.line),
            };
            *turns.entry(id.clone()).or_default() += 1;
            id
        })
        .collect();
    let multi: Vec<usize> = turns.values().copied().filter(|&t| t > 1).collect();
    let stats = ConversationStats {
        requests: requests.len(),
        conversations: turns.len(),
        multi_turn_conversations: multi.len(),
        requests_in_multi_turn: multi.iter().sum(),
        max_turns: turns.values().copied().max().unwrap_or(0),
        shared_blocks: count.keys().filter(|h| common(h)).count(),
    };
    (ids, stats)
}

/// How a trace groups into conversations.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationStats {
    pub requests: usize,
    pub conversations: usize,
    pub multi_turn_conversations: usize,
    pub requests_in_multi_turn: usize,
    pub max_turns: usize,
    /// Blocks above the common share (skipped as system prompts).
    pub shared_blocks: usize,
}

impl ConversationStats {
    pub fn mean_turns(&self) -> f64 {
        if self.conversations == 0 {
            0.0
        } else {
            self.requests as f64 / self.conversations as f64
        }
    }
}

impl std::fmt::Display for ConversationStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests in {} conversations (mean {:.2} turns, max {}; {} multi-turn conversations hold {} requests; \
             {} shared blocks skipped)",
            self.requests,
            self.conversations,
            self.mean_turns(),
            self.max_turns,
            self.multi_turn_conversations,
            self.requests_in_multi_turn,
            self.shared_blocks
        )
    }
}

/// Default KV-cache size per token in MB: a 7B fp16 model (32 layers x 2 (K, V) x 4096 x 2
/// bytes = 0.5 MiB).
pub const DEFAULT_KV_MB_PER_TOKEN: f64 = 0.5;

/// The `AILB_REQUIRED_MEMORY_MB` hint of a request: its whole context (prompt and output
/// tokens) rounded up to whole [`BLOCK_TOKENS`]-token KV blocks (the unit a paged KV cache,
/// and `ailb-sim`, allocates: a context one token over a block boundary holds one more
/// block), times the KV bytes per token, in MB, rounded up and capped at `u32::MAX`.
pub fn memory_mb(input_tokens: u32, output_tokens: u32, kv_mb_per_token: f64) -> u32 {
    let tokens = (input_tokens as u64 + output_tokens as u64).div_ceil(BLOCK_TOKENS) * BLOCK_TOKENS;
    let mb = (tokens as f64 * kv_mb_per_token).ceil();
    if mb.is_nan() || mb <= 0.0 {
        0
    } else if mb >= u32::MAX as f64 {
        u32::MAX
    } else {
        mb as u32
    }
}
