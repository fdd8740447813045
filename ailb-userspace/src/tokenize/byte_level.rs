//! A byte-level BPE tokenizer's ids without the library's general pipeline: the same ids as
//! `Tokenizer::encode_fast(text, false)`, in about a third of the time on this project's
//! machines (`cargo bench -p ailb-userspace --bench tokenize_cpu` measures both).
//!
//! Why: a conversation's first turn is tokenized whole on the request's path (its kernel pick
//! needs its keys), and for a long prompt most of that time is the library's bookkeeping, not
//! the tokenizer's rules: each piece of text becomes a `NormalizedString` that tracks, byte by
//! byte, where every byte came from (offsets no one reads here), rebuilt at each step.
//!
//! What the library does with a text, for the tokenizers taken here, and so what this does:
//! 1. split out the added tokens (each becomes its own id);
//! 2. normalize each piece between them (here: no normalizer, nothing to do);
//! 3. pre-tokenize: split each piece by the pre-tokenizer's regexes in turn, each regex's matches
//!    and the text between them becoming pieces (`Isolated`), then write each piece's bytes as
//!    the byte-level alphabet's characters;
//! 4. hand each piece to the model (`Model::tokenize`, the library's own BPE, its merges and
//!    word cache), whose ids are the text's, in order.
//!
//! Taken only where these steps are all there is, read from the tokenizer itself: no
//! normalizer (or an empty sequence of them), no truncation or padding, special tokens split
//! out; a pre-tokenizer that is `ByteLevel` without a prefix space, alone (with its GPT-2
//! regex) or last after `Split`s by regex into isolated pieces (Llama 3's shape, DeepSeek's);
//! added tokens that strip no whitespace, need not stand as single words, and never overlap one
//! another (so where each occurs does not depend on the order the library matches them in).
//! Then a set of probe texts (letters, digits, contractions, whitespace runs, non-ASCII, each
//! added token among text) must encode exactly as the library encodes them; any difference and
//! the library's pipeline is used throughout. The property is also tested on random text
//! against the library.

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use tokenizers::{utils::SysRegex, AddedToken, Model, Tokenizer};

/// The regex `ByteLevel` splits by when `use_regex` is set (GPT-2's).
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Probe texts: each encoded alone, and the five after the empty one also around every added
/// token.
const PROBES: [&str; 12] = [
    "",
    "hello world",
    "Hello, World! It's 2026; you'll see: 3.14159 and 1,000,000.",
    "  leading and trailing  ",
    "a\n\nb\n \n\tc   d\t\t",
    "é字🙂 naïve café Ünïcödé 日本語のテキスト",
    "don't I'M we've THEY'LL she'd o'clock '' 's",
    "tabs\tand\r\nCRLF\r\n",
    "!!!??? ... --- *** #1 @x $2.50 (a) [b] {c}",
    "x  \n  y",
    "   ",
    "\n",
];

/// The pipeline of a tokenizer that this path encodes exactly (see the module docs).
pub struct ByteLevelPath {
    /// The pre-tokenizer's regexes, applied in turn, each to the pieces of the one before.
    splits: Vec<SysRegex>,
    /// The added tokens' texts, and their ids in the same order.
    added: Option<AhoCorasick>,
    added_ids: Vec<u32>,
    /// Each byte's character in the byte-level alphabet.
    chars: [char; 256],
}

impl std::fmt::Debug for ByteLevelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLevelPath")
            .field("splits", &self.splits.len())
            .field("added", &self.added_ids.len())
            .finish_non_exhaustive()
    }
}

impl ByteLevelPath {
    /// The path for `tokenizer`; `None` where its pipeline has a step this does not take, or a
    /// probe text encodes differently.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        if !super::segments::whole_and_split(tokenizer) || !normalizes_nothing(tokenizer) {
            return None;
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let splits = split_patterns(&pre)?.iter().map(|p| SysRegex::new(p).ok()).collect::<Option<Vec<_>>>()?;
        let added: Vec<AddedToken> = tokenizer.get_added_tokens_decoder().into_values().collect();
        let plain = |t: &AddedToken| !t.lstrip && !t.rstrip && !t.single_word && !t.content.is_empty();
        let apart = |t: &AddedToken| {
            added.iter().all(|o| !super::segments::overlaps(&t.content, &o.content, std::ptr::eq(t, o)))
        };
        if !added.iter().all(|t| plain(t) && apart(t)) {
            return None;
        }
        let added_ids = added.iter().map(|t| tokenizer.token_to_id(&t.content)).collect::<Option<Vec<u32>>>()?;
        let texts: Vec<&str> = added.iter().map(|t| t.content.as_str()).collect();
        let finder = if texts.is_empty() {
            None
        } else {
            Some(AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&texts).ok()?)
        };
        let path = ByteLevelPath { splits, added: finder, added_ids, chars: byte_chars() };
        path.agrees_on_probes(tokenizer, &texts).then_some(path)
    }

    /// Whether every probe text, alone and around each of the `added` tokens, encodes as the
    /// library encodes it.
    fn agrees_on_probes(&self, tokenizer: &Tokenizer, added: &[&str]) -> bool {
        let library = |text: &str| tokenizer.encode_fast(text, false).ok().map(|e| e.get_ids().to_vec());
        let agrees = |text: &str| library(text).is_some_and(|ids| self.encode(tokenizer, text).ok() == Some(ids));
        PROBES.iter().all(|p| agrees(p))
            && added.iter().all(|t| {
                PROBES[1..6].iter().all(|p| {
                    let mid = p.len() / 2;
                    let mid = (0..=mid).rev().find(|&i| p.is_char_boundary(i)).unwrap_or(0);
                    agrees(&format!("{}{t}{}", &p[..mid], &p[mid..])) && agrees(&format!("{t}{p} {t}{t}\n"))
                })
            })
    }

    /// The ids of `text` (no special tokens added), as `tokenizer.encode_fast(text, false)`
    /// gives them; `tokenizer` is the one this path was made for.
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> tokenizers::Result<Vec<u32>> {
        let model = tokenizer.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut word = String::new();
        let mut piece = |p: &str, ids: &mut Vec<u32>| -> tokenizers::Result<()> {
            word.clear();
            word.extend(p.bytes().map(|b| self.chars[usize::from(b)]));
            ids.extend(model.tokenize(&word)?.into_iter().map(|t| t.id));
            Ok(())
        };
        let mut start = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                self.pieces(0, &text[start..m.start()], &mut |p| piece(p, &mut ids))?;
                ids.push(self.added_ids[m.pattern().as_usize()]);
                start = m.end();
            }
        }
        self.pieces(0, &text[start..], &mut |p| piece(p, &mut ids))?;
        Ok(ids)
    }

    /// Calls `f` on each non-empty piece of `text` after the regexes from `level` on.
    fn pieces(
        &self,
        level: usize,
        text: &str,
        f: &mut dyn FnMut(&str) -> tokenizers::Result<()>,
    ) -> tokenizers::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let Some(re) = self.splits.get(level) else { return f(text) };
        let mut prev = 0;
        for (start, end) in re.find_iter(text) {
            self.pieces(level + 1, &text[prev..start], f)?;
            self.pieces(level + 1, &text[start..end], f)?;
            prev = end;
        }
        self.pieces(level + 1, &text[prev..], f)
    }
}

/// Whether the tokenizer has no normalizer, or one that does nothing (an empty `Sequence`, as
/// DeepSeek's tokenizers write).
fn normalizes_nothing(tokenizer: &Tokenizer) -> bool {
    tokenizer.get_normalizer().is_none_or(|n| {
        serde_json::to_value(n).ok() == Some(serde_json::json!({"type": "Sequence", "normalizers": []}))
    })
}

/// The regexes a serialized pre-tokenizer splits by, in order, where it is one this path takes:
/// `ByteLevel` without a prefix space, alone or last after `Split`s by regex into isolated pieces.
fn split_patterns(pre: &Value) -> Option<Vec<String>> {
    let steps = match pre.get("type")?.as_str()? {
        "Sequence" => pre.get("pretokenizers")?.as_array()?.as_slice(),
        _ => std::slice::from_ref(pre),
    };
    let (last, splits) = steps.split_last()?;
    let mut out = Vec::new();
    for s in splits {
        let isolated = s.get("type")?.as_str()? == "Split"
            && s.get("behavior")?.as_str()? == "Isolated"
            && !s.get("invert")?.as_bool()?;
        if !isolated {
            return None;
        }
        out.push(s.get("pattern")?.get("Regex")?.as_str()?.to_string());
    }
    if last.get("type")?.as_str()? != "ByteLevel" || last.get("add_prefix_space")?.as_bool()? {
        return None;
    }
    if last.get("use_regex")?.as_bool()? {
        out.push(GPT2_SPLIT.to_string());
    }
    Some(out)
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for the
/// characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for (b, c) in chars.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *c = char::from_u32(code).unwrap_or('\0');
    }
    chars
}

/// The byte-level alphabet in byte order, for tests that write a byte-level vocabulary.
#[cfg(test)]
pub(super) fn tests_alphabet() -> [char; 256] {
    byte_chars()
}
