//! A rendered prompt's token ids, segment by segment, each segment's ids reused across requests.
//!
//! Why: a chat's prompt repeats what earlier requests sent (a tenant's system prompt, a
//! conversation's history), and tokenizing it whole costs milliseconds per request on the
//! request path. A chat template ends every message with a special token (`<|im_end|>`,
//! `<|eot_id|>`, `</s>`), so the prompt is cut right after each special token and each
//! segment's ids are looked up in an LRU cache, bounded in bytes; only new segments are encoded.
//!
//! Why this gives the ids of the whole text, exactly: the tokenizer itself first splits the text
//! at its added tokens and then normalizes, pre-tokenizes and encodes each piece on its own, and
//! encoding without special tokens adds nothing around them. So where a cut falls right after an
//! added token that the tokenizer splits out wherever it occurs, the ids of the parts are the
//! ids of the whole. A token is cut after only when that holds whatever surrounds it ([`cut_after`]):
//! it is special and not normalized (it is matched in the raw text), strips no whitespace on its
//! right (that would take the next segment's leading spaces) and need not stand as a single word
//! (that depends on the next character); and no added token overlaps it, itself included (the
//! leftmost-longest match could then start before it or end after it). A tokenizer that
//! truncates or pads, that does not split special tokens out (`encode_special_tokens`), or whose
//! pre-tokenizer marks only the text's first piece as a word's start (SentencePiece's
//! `prepend_scheme: "first"`: it reads each piece's offset in the whole text) is not cut at all;
//! nor is one whose cut probes (a few texts around each token) do not encode as their whole. The
//! property is tested against whole-text encoding.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use aho_corasick::{AhoCorasick, MatchKind};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokenizers::{AddedToken, Tokenizer};

/// Bytes a cached segment is charged besides its text and ids (the entry, its links, the `Arc`).
const ENTRY_OVERHEAD: usize = 96;

/// Where to cut a tokenizer's rendered prompts: right after each of these special tokens.
#[derive(Debug)]
pub struct Cuts {
    finder: AhoCorasick,
    tokens: Vec<String>,
}

impl Cuts {
    /// The cut tokens of `tokenizer`; `None` when none qualifies or the tokenizer cannot be cut.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        if !whole_and_split(tokenizer) {
            return None;
        }
        let added: Vec<AddedToken> = tokenizer.get_added_tokens_decoder().into_values().collect();
        let mut tokens: Vec<String> =
            added.iter().filter(|t| cut_after(t, &added)).map(|t| t.content.clone()).collect();
        tokens.sort();
        tokens.dedup();
        if tokens.is_empty() {
            return None;
        }
        let finder = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&tokens).ok()?;
        let cuts = Cuts { finder, tokens };
        (!first_piece_only(tokenizer) && cuts.agree_on_probes(tokenizer)).then_some(cuts)
    }

    /// Whether cut texts encode as their whole on a few texts around each cut token (letters,
    /// spaces, newlines, non-ASCII, the token twice): a last check against a pipeline step that
    /// treats pieces differently by where they are.
    fn agree_on_probes(&self, tokenizer: &Tokenizer) -> bool {
        let ids = |text: &str| tokenizer.encode_fast(text, false).ok().map(|e| e.get_ids().to_vec());
        self.tokens.iter().all(|t| {
            let probes = [
                format!("a{t}b"),
                format!("x {t} y"),
                format!("{t}\n{t}  z"),
                format!("é字{t}\n\nword"),
                format!(" {t}"),
            ];
            probes.iter().all(|p| {
                let cut: Option<Vec<Vec<u32>>> = self.segments(p).map(ids).collect();
                cut.map(|c| c.concat()).is_some_and(|c| Some(c) == ids(p))
            })
        })
    }

    /// The tokens cut after.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The end of the last cut token that ends at or before byte `limit` of `text` (a segment's
    /// end in `text`), if any. Cut tokens never overlap, so a match in `text[..limit]` is one
    /// of `text`'s.
    pub fn last_cut_within(&self, text: &str, limit: usize) -> Option<usize> {
        let limit = limit.min(text.len());
        let head = text.get(..limit)?;
        self.finder.find_iter(head).last().map(|m| m.end())
    }

    /// `text` in segments, each ending right after a cut token (the last one: the rest).
    pub fn segments<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let mut start = 0;
        let ends = self.finder.find_iter(text).map(|m| m.end()).chain(std::iter::once(text.len()));
        // A cut token is never empty, so only the rest can be: when the text ends with a cut.
        ends.filter_map(move |end| {
            let seg = (end > start).then(|| &text[start..end]);
            start = end;
            seg
        })
    }
}

/// Whether the tokenizer encodes a text whole (no truncation, no padding) and splits its special
/// tokens out (`encode_special_tokens` off): what taking a text apart and encoding its pieces
/// needs, here and in [`super::byte_level`].
pub(super) fn whole_and_split(tokenizer: &Tokenizer) -> bool {
    tokenizer.get_truncation().is_none() && tokenizer.get_padding().is_none() && !tokenizer.get_encode_special_tokens()
}

/// Whether the pre-tokenizer treats a text's first piece apart (SentencePiece's `Metaspace` with
/// `prepend_scheme: "first"` marks only the piece at the text's start as a word's start): a
/// segment's first piece would then be encoded as if it began the prompt.
fn first_piece_only(tokenizer: &Tokenizer) -> bool {
    tokenizer
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_string(p).ok())
        .is_some_and(|json| json.contains(r#""prepend_scheme":"first""#))
}

/// Whether a cut right after `t` leaves the tokenizer's ids unchanged (see the module docs).
fn cut_after(t: &AddedToken, all: &[AddedToken]) -> bool {
    t.special
        && !t.normalized
        && !t.rstrip
        && !t.single_word
        && !t.content.is_empty()
        && all.iter().all(|o| !overlaps(&t.content, &o.content, std::ptr::eq(t, o)))
}

/// Whether an occurrence of `a` and one of `b` can overlap in some text (`same`: `b` is `a`
/// itself, whose occurrence overlaps itself trivially): one contains the other, or a proper end
/// of one begins the other.
pub(super) fn overlaps(a: &str, b: &str, same: bool) -> bool {
    let end_begins = |x: &[u8], y: &[u8]| (1..x.len()).any(|k| y.starts_with(&x[x.len() - k..]));
    (!same && (a.contains(b) || b.contains(a)))
        || end_begins(a.as_bytes(), b.as_bytes())
        || end_begins(b.as_bytes(), a.as_bytes())
}

/// Counters of a [`SegmentCache`], registered on the front door's `/metrics` per model.
#[derive(Debug, Default, Clone)]
pub struct SegmentStats {
    /// Segments whose ids came from the cache.
    pub hits: Counter,
    /// Segments encoded.
    pub misses: Counter,
    /// Token ids taken from the cache.
    pub tokens_reused: Counter,
    /// Token ids encoded.
    pub tokens_encoded: Counter,
    /// Bytes the cache holds now.
    pub bytes: Gauge,
}

struct Lru {
    map: lru::LruCache<Box<str>, Arc<[u32]>>,
    bytes: usize,
}

/// Segments' token ids, least recently used evicted first, at most `budget` bytes (text, ids
/// and [`ENTRY_OVERHEAD`] per entry).
pub struct SegmentCache {
    lru: Mutex<Lru>,
    budget: usize,
    stats: SegmentStats,
}

impl std::fmt::Debug for SegmentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentCache").field("budget", &self.budget).field("stats", &self.stats).finish()
    }
}

fn cost(text: &str, ids: &[u32]) -> usize {
    text.len() + std::mem::size_of_val(ids) + ENTRY_OVERHEAD
}

impl SegmentCache {
    /// A cache of at most `budget` bytes.
    pub fn new(budget: NonZeroUsize) -> Self {
        SegmentCache {
            lru: Mutex::new(Lru { map: lru::LruCache::unbounded(), bytes: 0 }),
            budget: budget.get(),
            stats: SegmentStats::default(),
        }
    }

    /// The cache's counters.
    pub fn stats(&self) -> &SegmentStats {
        &self.stats
    }

    /// Bytes charged now, and entries.
    pub fn usage(&self) -> (usize, usize) {
        let lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
        (lru.bytes, lru.map.len())
    }

    /// Appends `segment`'s ids to `out`: from the cache, or from `encode` (then kept, if it fits).
    pub fn extend<E>(
        &self,
        segment: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce(&str) -> Result<Vec<u32>, E>,
    ) -> Result<(), E> {
        let hit = self.lru.lock().unwrap_or_else(|e| e.into_inner()).map.get(segment).cloned();
        if let Some(ids) = hit {
            self.stats.hits.inc();
            self.stats.tokens_reused.inc_by(ids.len() as u64);
            out.extend_from_slice(&ids);
            return Ok(());
        }
        let ids = encode(segment)?;
        self.stats.misses.inc();
        self.stats.tokens_encoded.inc_by(ids.len() as u64);
        out.extend_from_slice(&ids);
        let size = cost(segment, &ids);
        if size <= self.budget {
            let mut lru = self.lru.lock().unwrap_or_else(|e| e.into_inner());
            // Another request may have put the same segment meanwhile: charge it once.
            if let Some(old) = lru.map.put(segment.into(), ids.into()) {
                lru.bytes -= cost(segment, &old);
            }
            lru.bytes += size;
            while lru.bytes > self.budget {
                let Some((text, ids)) = lru.map.pop_lru() else { break };
                lru.bytes -= cost(&text, &ids);
            }
            self.stats.bytes.set(lru.bytes as i64);
        }
        Ok(())
    }
}
