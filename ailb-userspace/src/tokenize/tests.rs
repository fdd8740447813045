use std::path::PathBuf;

use serde_json::json;

use super::*;

/// A ChatML template like the tiny model's (`tests/engines/tiny_model.py`), with whitespace
/// control of every kind, a BOS and a Python string method, so that the environment's settings
/// show in the output.
const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}
    {% if true %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% endif %}
    {% if message['content'] is string %}
        {{- message['content'].strip() }}
    {%- else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
";

/// A word-level tokenizer.json written out in full: three special tokens, a few words, split
/// on whitespace and punctuation. Deterministic, and read by the same library as a model's.
fn tokenizer_json() -> Vec<u8> {
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let words = [
        "[UNK]",
        "<s>",
        "<|im_start|>",
        "<|im_end|>",
        "user",
        "assistant",
        "system",
        "hello",
        "world",
        "!",
        "be",
        "brief",
    ];
    let vocab: serde_json::Map<String, serde_json::Value> =
        words.iter().enumerate().map(|(i, w)| (w.to_string(), json!(i))).collect();
    let t = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(1, "<s>"), special(2, "<|im_start|>"), special(3, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    serde_json::to_vec(&t).expect("json")
}

fn config(template: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "bos_token": {"content": "<s>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
        "eos_token": "<|im_end|>",
        "chat_template": template,
    }))
    .expect("json")
}

/// The library's own ids of `text` (its whole pipeline, no special tokens added): what every
/// faster way to them must give.
pub(crate) fn library(t: &ChatTokenizer, text: &str) -> Vec<u32> {
    t.tokenizer().encode_fast(text, false).expect("the library encodes").get_ids().to_vec()
}

/// A chat tokenizer of the fixture's words and template (also for the front door's key tests).
pub(crate) fn fixture() -> ChatTokenizer {
    ChatTokenizer::from_parts("fixture", &tokenizer_json(), &config(json!(TEMPLATE)), None).expect("fixture loads")
}

#[test]
fn renders_as_transformers_does() {
    let t = fixture();
    let messages = json!([
        {"role": "system", "content": "  be brief "},
        {"role": "user", "content": [{"type": "text", "text": "hello world!"}, {"type": "image_url"}]},
    ]);
    // What Jinja2 3.1.6 renders with transformers' settings (`ImmutableSandboxedEnvironment(
    // trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])`), pasted: trim_blocks
    // drops the newline after a block tag, not after `}}`, hence the blank lines.
    assert_eq!(
        t.render(&messages, true).expect("renders"),
        "<s><|im_start|>system\nbe brief<|im_end|>\n\n<|im_start|>user\nhello world!<|im_end|>\n\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&messages, false).expect("renders"),
        "<s><|im_start|>system\nbe brief<|im_end|>\n\n<|im_start|>user\nhello world!<|im_end|>\n\n"
    );
}

#[test]
fn chat_token_ids_are_the_rendered_text_without_added_specials() {
    let t = fixture();
    let messages = json!([{"role": "user", "content": "hello world!"}]);
    assert_eq!(t.chat_token_ids(&messages, true).expect("tokens"), vec![1, 2, 4, 7, 8, 9, 3, 2, 5]);
}

#[test]
fn a_named_default_template_and_the_override() {
    let named = json!([{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ eos_token }}"}]);
    let t = ChatTokenizer::from_parts("fixture", &tokenizer_json(), &config(named), None).expect("loads");
    assert_eq!(t.render(&json!([]), false).expect("renders"), "<|im_end|>");
    let t = ChatTokenizer::from_parts("fixture", &tokenizer_json(), &config(json!(null)), Some("x{{ 1 }}".into()))
        .expect("loads");
    assert_eq!(t.render(&json!([]), false).expect("renders"), "x1");
}

#[test]
fn errors_name_what_is_wrong() {
    let err = ChatTokenizer::from_parts("m", &tokenizer_json(), &config(json!(null)), None).expect_err("no template");
    assert!(matches!(err, TokenizeError::NoChatTemplate { .. }), "{err}");
    let err = ChatTokenizer::from_parts("m", &tokenizer_json(), &config(json!(7)), None).expect_err("bad template");
    assert!(err.to_string().contains("`chat_template`: 7"), "{err}");
    let err = ChatTokenizer::from_parts("m", b"{}", &config(json!("x")), None).expect_err("bad tokenizer");
    assert!(matches!(err, TokenizeError::Tokenizer { .. }), "{err}");
    let err = ChatTokenizer::from_parts("m", &tokenizer_json(), &config(json!("{% if %}")), None).expect_err("parse");
    assert!(matches!(err, TokenizeError::Template { .. }), "{err}");
    let t = ChatTokenizer::from_parts(
        "m",
        &tokenizer_json(),
        &config(json!("{{ raise_exception('no system role') }}")),
        None,
    )
    .expect("loads");
    let err = t.render(&json!([]), false).expect_err("raises");
    assert!(crate::error_chain(&err).contains("no system role"), "{}", crate::error_chain(&err));
}

#[test]
fn tojson_writes_what_pythons_json_dumps_writes() {
    let t = ChatTokenizer::from_parts(
        "m",
        &tokenizer_json(),
        &config(json!("{{ messages | tojson }}|{{ messages[0] | tojson(indent=2) }}")),
        None,
    )
    .expect("loads");
    let messages = json!([{"a": [1, 2.5, "é<"], "b": {}}]);
    assert_eq!(
        t.render(&messages, false).expect("renders"),
        "[{\"a\": [1, 2.5, \"é<\"], \"b\": {}}]|{\n  \"a\": [\n    1,\n    2.5,\n    \"é<\"\n  ],\n  \"b\": {}\n}"
    );
}

#[test]
fn strftime_formats_a_date() {
    // 2024-02-29 13:05:09 UTC.
    assert_eq!(
        template::strftime("%d %b %Y %H:%M:%S %B %m %%", 1_709_211_909).expect("formats"),
        "29 Feb 2024 13:05:09 February 02 %"
    );
    assert!(template::strftime("%j", 0).is_err());
}

/// Ids without offsets are the ids with them, specials and all.
#[test]
fn ids_without_offsets_are_the_ids_with_them() {
    let t = fixture();
    for text in ["", "hello world", "<s>a b</s> c", "  spaced   out\n\ttext é ü 字", &"abc ".repeat(500)] {
        for specials in [false, true] {
            let full = t.tokenizer().encode(text, specials).expect("encodes");
            assert_eq!(t.encode(text, specials).expect("encodes"), full.get_ids(), "{text:?} {specials}");
        }
    }
}

/// The tiny model `cargo xtask setup` makes (or the folder `AILB_TINY_MODEL_DIR` names),
/// against what transformers itself renders and tokenizes (`tests/engines/chat_fixture.py`
/// wrote the expectation with the pinned packages).
#[test]
fn the_tiny_models_tokenizer_matches_transformers() {
    let dir = match (std::env::var_os("AILB_TINY_MODEL_DIR"), std::env::var_os("HOME")) {
        (Some(dir), _) => PathBuf::from(dir),
        (None, Some(home)) => PathBuf::from(home).join(".cache/ailb/models/tiny-llama"),
        (None, None) => {
            println!("skipped: neither AILB_TINY_MODEL_DIR nor HOME is set, so there is no tiny model to test against");
            return;
        }
    };
    if !dir.join("tokenizer.json").is_file() {
        println!("skipped: no tiny model at {} (cargo xtask setup makes it)", dir.display());
        return;
    }
    let t = ChatTokenizer::load(&dir).expect("the tiny model's tokenizer loads");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/engines/fixtures/tiny_llama_chat.json");
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the expectation file")).expect("json");
    let cases = cases.as_array().expect("a list of cases");
    assert!(!cases.is_empty());
    for case in cases {
        let messages = &case["messages"];
        let add = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
        assert_eq!(t.render(messages, add).expect("renders"), case["text"].as_str().expect("text"), "{messages}");
        let ids: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).expect("ids");
        assert_eq!(t.chat_token_ids(messages, add).expect("tokenizes"), ids, "{messages}");
    }
    println!("checked {} conversations against transformers' rendering and tokens", cases.len());
}

/// A tokenizer.json with the given added tokens, each `(content, special, lstrip, rstrip,
/// single_word, normalized)`, over the fixture's words.
fn with_added(tokens: &[(&str, bool, bool, bool, bool, bool)]) -> Tokenizer {
    let mut t: serde_json::Value = serde_json::from_slice(&tokenizer_json()).expect("json");
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, (content, special, lstrip, rstrip, single_word, normalized))| {
            json!({"id": 100 + i, "content": content, "single_word": single_word, "lstrip": lstrip,
                   "rstrip": rstrip, "normalized": normalized, "special": special})
        })
        .collect();
    t["added_tokens"] = json!(added);
    Tokenizer::from_bytes(serde_json::to_vec(&t).expect("json")).expect("loads")
}

/// Only special tokens that the tokenizer splits out whatever surrounds them are cut after.
#[test]
fn cut_tokens_are_the_special_tokens_that_split_out_cleanly() {
    let t = with_added(&[
        ("<|im_end|>", true, false, false, false, false),
        // Strips whitespace on its left: still clean, the whitespace is on its own side.
        ("<|eot|>", true, true, false, false, false),
        ("<rstrip>", true, false, true, false, false),
        ("<word>", true, false, false, true, false),
        ("<norm>", true, false, false, false, true),
        ("<plain>", false, false, false, false, false),
        // Overlapping pairs: one inside another, and an end that begins another.
        ("<a>", true, false, false, false, false),
        ("<a>b", true, false, false, false, false),
        ("x]", true, false, false, false, false),
        ("]y", true, false, false, false, false),
        // Overlapping itself ("aa" occurs twice in "aaa").
        ("aa", true, false, false, false, false),
    ]);
    let cuts = segments::Cuts::of(&t).expect("some tokens qualify");
    assert_eq!(cuts.tokens(), ["<|eot|>", "<|im_end|>"]);
    let text = "a<|im_end|>\nb <|eot|><|im_end|>c";
    assert_eq!(cuts.segments(text).collect::<Vec<_>>(), ["a<|im_end|>", "\nb <|eot|>", "<|im_end|>", "c"]);
    assert_eq!(cuts.segments("<|im_end|>").collect::<Vec<_>>(), ["<|im_end|>"]);
    assert_eq!(cuts.segments("").count(), 0);

    // SentencePiece's Metaspace marking only the text's first piece: a segment would read as a
    // prompt's start.
    let mut first: serde_json::Value = serde_json::from_slice(&tokenizer_json()).expect("json");
    first["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
    let first = Tokenizer::from_bytes(serde_json::to_vec(&first).expect("json")).expect("loads");
    assert!(segments::Cuts::of(&first).is_none(), "a pre-tokenizer that reads offsets is not cut");

    let mut truncating: serde_json::Value = serde_json::from_slice(&tokenizer_json()).expect("json");
    truncating["truncation"] = json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
    let truncating = Tokenizer::from_bytes(serde_json::to_vec(&truncating).expect("json")).expect("loads");
    assert!(segments::Cuts::of(&truncating).is_none(), "a truncating tokenizer is encoded whole");
}

/// Chats that share leading messages: the second encoding of a message comes from the cache, and
/// every prompt's ids are those of its whole text.
fn check_segments_match_whole(t: &ChatTokenizer, chats: &[serde_json::Value]) {
    assert!(!t.cut_tokens().is_empty(), "the tokenizer is cut after its end-of-message token");
    for messages in chats {
        let text = t.render(messages, true).expect("renders");
        let whole = library(t, &text);
        assert_eq!(t.chat_token_ids(messages, true).expect("encodes"), whole, "{text:?}");
        assert_eq!(t.chat_token_ids(messages, true).expect("encodes again"), whole, "from the cache: {text:?}");
    }
    let stats = t.segment_cache().expect("a cache").stats();
    assert!(stats.hits.get() > 0);
    assert!(stats.tokens_reused.get() > 0);
}

/// Conversations growing turn by turn, with whitespace and text around every message boundary.
fn growing_chats(pieces: &[&str]) -> Vec<serde_json::Value> {
    let mut chats = Vec::new();
    let mut messages = vec![json!({"role": "system", "content": pieces[0]})];
    for (i, p) in pieces.iter().enumerate().skip(1) {
        let role = if i % 2 == 1 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": p}));
        chats.push(json!(messages.clone()));
    }
    chats
}

#[test]
fn segmented_ids_are_the_whole_texts_ids() {
    let t = fixture();
    check_segments_match_whole(&t, &growing_chats(&["be brief", "hello world !", " hello", "world  ", "brief"]));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// The tiny model's byte-level BPE (when `cargo xtask setup` made it): any text around the
    /// cuts, spaces and newlines next to them included, encodes as the whole text does.
    #[test]
    fn the_tiny_models_segmented_ids_are_its_whole_ids(
        pieces in proptest::collection::vec("[ \\n\\ta-zé字0-9.,!<>|_]{0,40}", 2..7),
    ) {
        let Some(t) = tiny_model() else { return Ok(()) };
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        for messages in growing_chats(&refs) {
            let text = t.render(&messages, true).expect("renders");
            proptest::prop_assert_eq!(t.chat_token_ids(&messages, true).expect("encodes"), library(t, &text));
        }
        // Raw text with the end-of-message token anywhere, spaces on both sides.
        let raw = refs.join("<|im_end|>");
        proptest::prop_assert_eq!(t.encode_rendered(&raw).expect("encodes"), library(t, &raw));
    }
}

/// The tiny model's folder (`AILB_TINY_MODEL_DIR`, else where `cargo xtask setup` makes it);
/// `None`, and a line saying so, where it has no tokenizer.
pub(crate) fn tiny_model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("AILB_TINY_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ailb/models/tiny-llama")))?;
    if !dir.join("tokenizer.json").is_file() {
        println!("skipped: no tiny model at {} (cargo xtask setup makes it)", dir.display());
        return None;
    }
    Some(dir)
}

/// The tiny model's tokenizer, loaded once; `None` where it is absent ([`tiny_model_dir`]).
fn tiny_model() -> Option<&'static ChatTokenizer> {
    static TINY: std::sync::OnceLock<Option<ChatTokenizer>> = std::sync::OnceLock::new();
    TINY.get_or_init(|| Some(ChatTokenizer::load(&tiny_model_dir()?).expect("the tiny model's tokenizer loads")))
        .as_ref()
}

#[test]
fn the_tiny_models_prompts_are_cut_after_each_message() {
    let Some(t) = tiny_model() else { return };
    assert_eq!(t.cut_tokens(), ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]);
    let system = "You are a helpful assistant. ".repeat(200);
    check_segments_match_whole(
        t,
        &growing_chats(&[&system, "What is the capital of France?", "Paris.", "And of Italy?", " Rome.\n", "Thanks"]),
    );
}

/// The cache keeps its bytes within the budget, dropping the least recently used segments.
#[test]
fn the_segment_cache_stays_within_its_budget() {
    let cache = segments::SegmentCache::new(NonZeroUsize::new(2_000).expect("non-zero"));
    let encode = |s: &str| Ok::<_, ()>(vec![0u32; s.len() / 4]);
    let mut out = Vec::new();
    for i in 0..100 {
        let segment = format!("{i:03}{}", "x".repeat(197));
        cache.extend(&segment, &mut out, encode).expect("encodes");
        assert!(cache.usage().0 <= 2_000, "{:?}", cache.usage());
    }
    // Each entry costs 200 bytes of text, 196 of ids and the overhead: four fit.
    assert_eq!(cache.usage().1, 4);
    assert_eq!(cache.stats().bytes.get() as usize, cache.usage().0);
    // The most recent is kept, the oldest is gone.
    let misses = || cache.stats().misses.get();
    let before = misses();
    cache.extend(&format!("099{}", "x".repeat(197)), &mut out, encode).expect("encodes");
    assert_eq!(misses(), before);
    cache.extend(&format!("000{}", "x".repeat(197)), &mut out, encode).expect("encodes");
    assert_eq!(misses(), before + 1);
    // A segment larger than the budget is encoded and not kept.
    cache.extend(&"y".repeat(5_000), &mut out, encode).expect("encodes");
    assert!(cache.usage().0 <= 2_000);
    // An encoding error is returned, and nothing is kept.
    assert!(cache.extend("bad", &mut out, |_| Err(())).is_err());
}

/// A chat's head (up to its last message) and its tail make the whole prompt, and the head's
/// ids are the whole prompt's first ids.
fn check_heads(t: &ChatTokenizer, chats: &[serde_json::Value]) {
    for messages in chats {
        let list = messages.as_array().expect("a list");
        if !list[..list.len() - 1].iter().any(|m| m["role"] == "assistant") {
            assert_eq!(t.chat_head(messages).expect("renders"), None, "a first turn is tokenized whole");
            continue;
        }
        let text = t.render(messages, true).expect("renders");
        let whole = library(t, &text);
        let head = t.chat_head(messages).expect("renders").expect("a later turn: a head");
        assert_eq!(format!("{}{}", &text[..head.head_bytes], head.tail), text);
        assert_eq!(whole[..head.ids.len()], head.ids[..], "{text:?}");
        // The head covers the earlier messages up to their last cut: the last message and the
        // generation prompt are in the tail, and nothing of an earlier message but its spacing.
        let earlier = t.render(&list[..list.len() - 1], false).expect("renders");
        assert!(earlier.len() - head.head_bytes <= 2, "{earlier:?} against {:?}", &text[..head.head_bytes]);
        let last = list[list.len() - 1]["content"].as_str().expect("text").trim();
        assert!(head.tail.contains(last), "{:?} in {:?}", last, head.tail);
    }
}

#[test]
fn a_chats_head_is_the_whole_prompts_start_up_to_its_last_message() {
    let t = fixture();
    check_heads(&t, &growing_chats(&["be brief", "hello world !", " hello", "world  ", "brief"]));
    // One message, or a first turn with a system prompt: no head; nor without a segment cache.
    assert_eq!(t.chat_head(&json!([{"role": "user", "content": "hello"}])).expect("renders"), None);
    let first = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]);
    assert_eq!(t.chat_head(&first).expect("renders"), None);
    let two = json!([{"role": "user", "content": "be brief"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "world"}]);
    assert!(t.chat_head(&two).expect("renders").is_some());
    let uncached = fixture().with_segment_cache(None);
    assert_eq!(uncached.chat_head(&two).expect("renders"), None);
    // A template that renders the earlier messages otherwise than it starts the whole prompt
    // (here: the last message first) is not cut.
    let reversed =
        "{% for message in messages|reverse %}{{ '<|im_start|>' + message['content'] + '<|im_end|>' }}{% endfor %}";
    let t = ChatTokenizer::from_parts("fixture", &tokenizer_json(), &config(json!(reversed)), None).expect("loads");
    assert_eq!(t.chat_head(&two).expect("renders"), None);
    if let Some(t) = tiny_model() {
        let system = "You are a helpful assistant. ".repeat(50);
        check_heads(t, &growing_chats(&[&system, "What is the capital of France?", "Paris.", "And of Italy?"]));
    }
}

/// The keys' ids: a later turn's head, a first turn's whole ids; the same as asked apart.
#[test]
fn chat_ids_are_the_head_of_a_later_turn_and_a_first_turns_whole_ids() {
    let t = fixture();
    let chats = growing_chats(&["be brief", "hello world !", " hello", "world world brief"]);
    for messages in &chats {
        let want = match t.chat_head(messages).expect("renders") {
            Some(head) => ChatIds::Head(head),
            None => ChatIds::Whole(t.chat_token_ids(messages, true).expect("encodes")),
        };
        assert_eq!(t.chat_ids(messages).expect("renders"), want, "{messages}");
    }
    assert!(matches!(t.chat_ids(&chats[0]).expect("renders"), ChatIds::Whole(_)), "a first turn");
    assert!(matches!(t.chat_ids(&chats[2]).expect("renders"), ChatIds::Head(_)), "a later turn");
}

/// A tail warmed into the segment cache is a hit when the next turn sends it among its earlier
/// messages.
#[test]
fn a_warmed_tail_is_found_cached_by_the_next_turn() {
    let t = fixture();
    let chats = growing_chats(&["be brief", "hello world !", " hello", "world world brief", "brief", "hello"]);
    // Turn two ([2]: system, question, answer, question) and turn three ([4]).
    let head = t.chat_head(&chats[2]).expect("renders").expect("a head");
    let stats = t.segment_cache().expect("a cache").stats();
    // The next turn without warming: turn two's question is encoded anew, with the answer.
    let cold = fixture();
    cold.chat_head(&chats[2]).expect("renders");
    let misses = cold.segment_cache().expect("a cache").stats().misses.get();
    cold.chat_head(&chats[4]).expect("renders");
    let cold_misses = cold.segment_cache().expect("a cache").stats().misses.get() - misses;
    t.warm(&head.tail);
    let misses = stats.misses.get();
    t.chat_head(&chats[4]).expect("renders");
    let warm_misses = stats.misses.get() - misses;
    assert_eq!(warm_misses + 1, cold_misses, "{warm_misses} segments encoded warmed, {cold_misses} cold");
    assert_eq!(warm_misses, 1, "only the answer `brief` is new to turn three's head");
}

/// A byte-level BPE tokenizer.json written out in full: every byte's character, a few merges
/// (`hello`, ` world`, `ll`, digits), added tokens `<|im_start|>` and `<|im_end|>` (ids 300,
/// 301), and the given pre-tokenizer and normalizer.
fn byte_level_json(pre_tokenizer: serde_json::Value, normalizer: serde_json::Value) -> serde_json::Value {
    let chars = super::byte_level::tests_alphabet();
    let mut vocab: serde_json::Map<String, serde_json::Value> =
        chars.iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d", "1 2", "' s"];
    for (i, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), json!(256 + i));
    }
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(300, "<|im_start|>"), added(301, "<|im_end|>")],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

fn byte_level_gpt2() -> serde_json::Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
}

/// Llama 3's shape: a `Split` by regex (digits in threes here), then `ByteLevel` without its own.
fn byte_level_split() -> serde_json::Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})
}

/// DeepSeek's shape: `Split`s in turn, the first isolating digits in threes (the text between
/// them is a piece too), then `ByteLevel` with its own regex.
fn byte_level_splits() -> serde_json::Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated", "invert": false},
        {"type": "Split", "pattern": {"Regex": r"[一-龥]+"}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]})
}

fn tokenizer_of(json: &serde_json::Value) -> Tokenizer {
    Tokenizer::from_bytes(serde_json::to_vec(json).expect("json")).expect("loads")
}

fn chat_of(json: &serde_json::Value) -> ChatTokenizer {
    ChatTokenizer::from_parts(
        "byte-level fixture",
        &serde_json::to_vec(json).expect("json"),
        &config(json!(TEMPLATE)),
        None,
    )
    .expect("loads")
}

/// Byte-level tokenizers of the three shapes take the direct path and get the library's ids; a
/// pipeline with a step it does not take keeps the library's.
#[test]
fn byte_level_tokenizers_take_the_direct_path_and_others_do_not() {
    for pre in [byte_level_gpt2(), byte_level_split(), byte_level_splits()] {
        let t = chat_of(&byte_level_json(pre.clone(), json!(null)));
        assert!(t.direct_path(), "{pre}");
        for text in ["hello world", "<|im_start|>user\nhello world<|im_end|>\n", "it's 12345 héllo\n\n  world  ", ""] {
            assert_eq!(t.encode(text, false).expect("encodes"), library(&t, text), "{text:?} {pre}");
        }
        assert!(!t.with_direct_path(false).direct_path());
    }
    let refused = |why: &str, json: serde_json::Value| {
        assert!(super::byte_level::ByteLevelPath::of(&tokenizer_of(&json)).is_none(), "{why}");
    };
    refused("a normalizer", byte_level_json(byte_level_gpt2(), json!({"type": "NFC"})));
    let none = byte_level_json(byte_level_gpt2(), json!({"type": "Sequence", "normalizers": []}));
    assert!(chat_of(&none).direct_path(), "an empty sequence of normalizers normalizes nothing");
    refused(
        "a prefix space",
        byte_level_json(
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
            json!(null),
        ),
    );
    refused("not byte-level", byte_level_json(json!({"type": "Whitespace"}), json!(null)));
    let mut split_merged = byte_level_split();
    split_merged["pretokenizers"][0]["behavior"] = json!("MergedWithPrevious");
    refused("a split that merges", byte_level_json(split_merged, json!(null)));
    let mut lstrip = byte_level_json(byte_level_gpt2(), json!(null));
    lstrip["added_tokens"][1]["lstrip"] = json!(true);
    refused("an added token that strips", lstrip);
    let mut overlapping = byte_level_json(byte_level_gpt2(), json!(null));
    overlapping["added_tokens"][1]["content"] = json!("<|im_start|>x");
    refused("added tokens that overlap", overlapping);
    let mut truncating = byte_level_json(byte_level_gpt2(), json!(null));
    truncating["truncation"] = json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
    refused("truncation", truncating);
    assert!(!fixture().direct_path(), "a word-level tokenizer");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Any text, added tokens, contractions, digits, whitespace runs and non-ASCII included,
    /// gets the library's ids through the direct path: the fixtures of the three shapes, and the
    /// tiny model's tokenizer where `cargo xtask setup` made it.
    #[test]
    fn the_direct_paths_ids_are_the_librarys(
        pieces in proptest::collection::vec(
            "([ \\n\\t\\r]{0,3}|[a-zA-Zé字🙂]{1,6}|[0-9]{1,5}|'(s|t|re|ll|d|M)|[.,!?'\"()-]{1,3}|<\\|im_(start|end)\\|>|hello| world|12)",
            0..24,
        ),
    ) {
        let text: String = pieces.concat();
        for pre in [byte_level_gpt2(), byte_level_split(), byte_level_splits()] {
            let t = tokenizer_of(&byte_level_json(pre, json!(null)));
            let direct = super::byte_level::ByteLevelPath::of(&t).expect("taken");
            let want = t.encode_fast(text.as_str(), false).expect("encodes").get_ids().to_vec();
            proptest::prop_assert_eq!(direct.encode(&t, &text).expect("encodes"), want, "{:?}", text);
        }
        if let Some(t) = tiny_model() {
            proptest::prop_assert!(t.direct_path());
            proptest::prop_assert_eq!(t.encode(&text, false).expect("encodes"), library(t, &text), "{:?}", text);
        }
    }
}

/// The tiny model's long prompts, as the races send them (words of the simulator's list, about
/// 2,000 tokens), get the library's ids through the direct path.
#[test]
fn the_tiny_models_long_prompts_get_the_librarys_ids() {
    let Some(t) = tiny_model() else { return };
    assert!(t.direct_path(), "the tiny model's byte-level BPE takes the direct path");
    let words = ["the", "model", "answer", "Question:", "token", "cache", "42,", "é字", "don't", "\n\n", "  "];
    let mut state = 7u64;
    let text: String = (0..1_500)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            format!("{} ", words[(state >> 33) as usize % words.len()])
        })
        .collect();
    let prompt = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
    let ids = t.encode(&prompt, false).expect("encodes");
    assert!(ids.len() > 1_500, "{} tokens", ids.len());
    assert_eq!(ids, library(t, &prompt));
}
