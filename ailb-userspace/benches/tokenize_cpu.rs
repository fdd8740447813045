//! The front door's token-exact keys: process CPU per request, tokenized inline on the calling
//! thread against tokio's blocking pool (`Keyer::keys_off_thread`), one request at a time and
//! two at once: `cargo bench -p ailb-userspace --bench tokenize_cpu` (`docs/prefix.md` quotes a
//! run). Needs the tiny model's tokenizer that `cargo xtask setup` fetches
//! (`~/.cache/ailb/models/tiny-llama`, or `AILB_TOKENIZER_DIR`); without it, it says so and
//! measures nothing.
//!
//! The workload: 60 chat requests of about 14,000 tokens each (a system message and a long user
//! message of words in a different order per request), the modes alternating over three rounds
//! (these machines are noisy). CPU is the process's user and system time (`getrusage`), so the
//! pool's threads count.
//!
//! Then the tokenizer alone on the same prompts rendered, and on prompts of words that rarely
//! repeat (the BPE's word cache misses): the library's ids with offsets tracked
//! (`Tokenizer::encode`) against its ids only (`encode_fast`) and the byte-level path's ids
//! (`tokenize::byte_level`, which the front door takes where the tokenizer allows), and the
//! byte-level path on a new thread per prompt (the BPE's word cache is per thread: cold there),
//! CPU ms per prompt, alternating.
//!
//! Then the segment cache (`tokenize::segments`): chats that repeat what earlier requests sent,
//! as conversations growing turn by turn and as tenants' long system prompts under new
//! questions, tokenized with the cache (a fresh one per round) and without, alternating; CPU ms
//! per request and the share of tokens taken from the cache.
//!
//! The modes' table tokenizes without the segment cache (each body is sent in every mode and
//! round, so a cache would take the later ones from the first): it measures where the
//! tokenizing runs, not what it costs.
//!
//! Then a conversation's later turns tokenized up to their new message on the request's path, the
//! rest warmed into the cache after it (`ChatTokenizer::chat_head`, `ChatTokenizer::warm`),
//! against the whole prompt through the cache: CPU ms per request on the path and after it.
//!
//! Run by `cargo test` (without `--bench`, in a debug build), it only checks that the three modes
//! send the same keys, over 4 requests and one round, that the three encodings give the same ids, and
//! that the cache gives the ids tokenizing without it gives.

use std::{num::NonZeroU32, path::PathBuf, sync::Arc, time::Instant};

use ailb_userspace::{
    gateway::{
        inputs::{parse_body, Endpoint},
        prefix_keys::Keyer,
    },
    tokenize::ChatTokenizer,
};

const REQUESTS: usize = 60;
const ROUNDS: usize = 3;

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, which is zeroed and ours.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        r
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(r.ru_utime) + t(r.ru_stime)
}

fn bodies(requests: usize) -> Vec<bytes::Bytes> {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma"];
    (0..requests)
        .map(|i| {
            let text: Vec<&str> = (0..3_000).map(|j| words[(i * 7 + j * 13 + j / 5) % words.len()]).collect();
            let body = serde_json::json!({
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": text.join(" ")},
                ],
            });
            bytes::Bytes::from(serde_json::to_vec(&body).expect("a JSON body"))
        })
        .collect()
}

/// Chat bodies of about 14,000 tokens of words that rarely repeat (one [`Words`] stream).
fn distinct_bodies(requests: usize) -> Vec<bytes::Bytes> {
    let mut words = Words(0x5eed);
    (0..requests)
        .map(|_| {
            let body =
                serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": words.take(2_400)}]});
            bytes::Bytes::from(serde_json::to_vec(&body).expect("a JSON body"))
        })
        .collect()
}

/// Words of 3 to 9 letters that rarely repeat, drawn by a splitmix64 sequence from its state.
struct Words(u64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next `n` words, joined by spaces.
    fn take(&mut self, n: usize) -> String {
        let w: Vec<String> = (0..n)
            .map(|_| {
                let r = self.next();
                (0..3 + r % 7).map(|i| (b'a' + ((r >> (8 + 5 * i)) % 26) as u8) as char).collect()
            })
            .collect();
        w.join(" ")
    }
}

/// `n` words of a stream seeded `seed`.
fn words(seed: u64, n: usize) -> String {
    Words(seed).take(n)
}

/// Keys for every body in `mode`; the keys sent, summed (to check the modes agree).
async fn run(mode: &str, keyer: &Keyer, bodies: &[bytes::Bytes]) -> usize {
    match mode {
        "inline" => bodies
            .iter()
            .map(|b| keyer.keys(Endpoint::ChatCompletions, &parse_body(b).expect("a valid body"), b).len())
            .sum(),
        "pool, one at a time" => {
            let mut n = 0;
            for b in bodies {
                n += keyer.keys_off_thread(Endpoint::ChatCompletions, b).await.len();
            }
            n
        }
        _ => {
            // Two requests in flight at once, as two streams on one front-door worker.
            let mut n = 0;
            let one = |b: &bytes::Bytes| {
                let b = b.clone();
                async move { keyer.keys_off_thread(Endpoint::ChatCompletions, &b).await.len() }
            };
            for pair in bodies.chunks_exact(2) {
                let (a, b) = tokio::join!(one(&pair[0]), one(&pair[1]));
                n += a + b;
            }
            n
        }
    }
}

fn main() {
    let dir = std::env::var_os("AILB_TOKENIZER_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ailb/models/tiny-llama")
    });
    let tokenizer = match ChatTokenizer::load(&dir) {
        Ok(t) => t,
        Err(e) => {
            println!("tokenize_cpu: skipped: no tokenizer at {} ({e}); run `cargo xtask setup`", dir.display());
            return;
        }
    };
    // Each body is sent in every mode and round: without the segment cache, each is tokenized.
    let tokenizer = Arc::new(tokenizer.with_segment_cache(None));
    let keyer =
        Keyer::Tokens { tokenizer: tokenizer.clone(), block: NonZeroU32::new(16).expect("16 > 0"), withhold: false };
    // `cargo bench` passes `--bench`; `cargo test` does not.
    let measure = std::env::args().any(|a| a == "--bench");
    let (requests, rounds) = if measure { (REQUESTS, ROUNDS) } else { (4, 1) };
    let bodies = bodies(requests);
    // The front door's workers are current-thread runtimes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let modes = ["inline", "pool, one at a time", "pool, two at once"];
    println!(
        "tokenize_cpu: {requests} chat requests per mode and round, tokenizer {}{}",
        dir.display(),
        if measure { "" } else { " (a check that the modes agree, not a measurement: run `cargo bench`)" }
    );
    println!("| round | mode | CPU ms per request | wall ms per request |\n|---|---|---:|---:|");
    let mut sent = None;
    for round in 1..=rounds {
        for mode in modes {
            let (c0, w0) = (cpu_seconds(), Instant::now());
            let n = rt.block_on(run(mode, &keyer, &bodies));
            let (cpu, wall) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
            assert_eq!(*sent.get_or_insert(n), n, "every mode sends the same keys");
            println!("| {round} | {mode} | {:.2} | {:.2} |", cpu * 1e3 / requests as f64, wall * 1e3 / requests as f64);
        }
    }
    encodings(&tokenizer, &bodies, &distinct_bodies(requests), rounds);
    segments(&dir, measure, rounds);
    heads(&dir, measure, rounds);
}

/// A later turn tokenized up to its new message on the request's path (`ChatTokenizer::
/// chat_head`), its tail warmed into the cache afterwards (`ChatTokenizer::warm`), against the
/// whole prompt through the cache, on the conversations of [`segments`], alternating which runs
/// first, a fresh cache per side and round; CPU ms per request on the path and after it. Checks
/// that the head's ids are the whole prompt's first ids.
fn heads(dir: &std::path::Path, measure: bool, rounds: usize) {
    let (conversations, turns) = if measure { (12, 6) } else { (2, 3) };
    let chats = conversation_chats(conversations, turns);
    println!(
        "\n{conversations} conversations x {turns} turns, through the segment cache:\n| round | whole, CPU ms per \
         request | head on the path | tail warmed after it | head / whole, on the path |"
    );
    println!("|---|---:|---:|---:|---:|");
    for round in 1..=rounds {
        let (whole_t, head_t) = (ChatTokenizer::load(dir).expect("loads"), ChatTokenizer::load(dir).expect("loads"));
        let whole = || {
            let c0 = cpu_seconds();
            let ids: Vec<Vec<u32>> = chats.iter().map(|m| whole_t.chat_token_ids(m, true).expect("encodes")).collect();
            ((cpu_seconds() - c0) * 1e3 / chats.len() as f64, ids)
        };
        let head = || {
            let (mut path, mut after, mut ids) = (0.0, 0.0, Vec::new());
            for m in &chats {
                let c0 = cpu_seconds();
                let h = head_t.chat_head(m).expect("renders");
                let c1 = cpu_seconds();
                path += c1 - c0;
                match h {
                    Some(h) => {
                        head_t.warm(&h.tail);
                        after += cpu_seconds() - c1;
                        ids.push(Some(h.ids));
                    }
                    None => {
                        let c0 = cpu_seconds();
                        head_t.chat_token_ids(m, true).expect("encodes");
                        path += cpu_seconds() - c0;
                        ids.push(None);
                    }
                }
            }
            let n = chats.len() as f64;
            (path * 1e3 / n, after * 1e3 / n, ids)
        };
        let ((w, whole_ids), (p, a, head_ids)) = if round % 2 == 1 {
            let w = whole();
            (w, head())
        } else {
            let h = head();
            (whole(), h)
        };
        for (whole, head) in whole_ids.iter().zip(&head_ids) {
            if let Some(head) = head {
                assert_eq!(whole[..head.len()], head[..], "a head's ids are the whole prompt's first ids");
            }
        }
        println!("| {round} | {w:.2} | {p:.2} | {a:.2} | {:.2}x |", p / w);
    }
}

/// `conversations` conversations of `turns` turns, in arrival order (every conversation's first
/// turn, then every second turn...): each turn a user message of about 1,500 tokens and, before
/// the next, the assistant's answer of about 300; each request carries the whole history.
fn conversation_chats(conversations: usize, turns: usize) -> Vec<serde_json::Value> {
    let system = serde_json::json!({"role": "system", "content": "You are a careful assistant."});
    let mut out = Vec::new();
    for turn in 0..turns {
        for c in 0..conversations {
            let mut messages = vec![system.clone()];
            for t in 0..=turn {
                let seed = (c * 1_000 + t) as u64;
                messages.push(serde_json::json!({"role": "user", "content": words(seed, 600)}));
                if t < turn {
                    messages.push(serde_json::json!({"role": "assistant", "content": words(seed + 500, 120)}));
                }
            }
            out.push(serde_json::Value::Array(messages));
        }
    }
    out
}

/// `requests` requests of `tenants` tenants in turn, each tenant's system prompt about 6,000
/// tokens, each request's question about 200 tokens of its own.
fn tenant_chats(tenants: usize, requests: usize) -> Vec<serde_json::Value> {
    (0..requests)
        .map(|i| {
            serde_json::json!([
                {"role": "system", "content": words(10_000 + (i % tenants) as u64, 2_400)},
                {"role": "user", "content": words(20_000 + i as u64, 80)},
            ])
        })
        .collect()
}

/// The segment cache against none, alternating which runs first, a fresh cache (and tokenizer)
/// per round; checks the ids agree.
fn segments(dir: &std::path::Path, measure: bool, rounds: usize) {
    let (conversations, turns, tenants, requests) = if measure { (12, 6, 8, 72) } else { (2, 3, 2, 4) };
    let workloads = [
        (format!("{conversations} conversations x {turns} turns"), conversation_chats(conversations, turns)),
        (format!("{tenants} tenants' system prompts, {requests} questions"), tenant_chats(tenants, requests)),
    ];
    println!(
        "\n| round | workload | requests | tokens per request | no cache, CPU ms per request | segment cache, CPU ms per \
         request | cache / none | tokens from the cache |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for round in 1..=rounds {
        for (name, chats) in &workloads {
            let none = ChatTokenizer::load(dir).expect("loads").with_segment_cache(None);
            let cached = ChatTokenizer::load(dir).expect("loads");
            // Each side's CPU ms per request and ids; the first to run alternates by round.
            let time = |t: &ChatTokenizer| {
                let c0 = cpu_seconds();
                let ids: Vec<Vec<u32>> = chats.iter().map(|m| t.chat_token_ids(m, true).expect("encodes")).collect();
                ((cpu_seconds() - c0) * 1e3 / chats.len() as f64, ids)
            };
            let ((a, plain), (b, fast)) = if round % 2 == 1 {
                let a = time(&none);
                (a, time(&cached))
            } else {
                let b = time(&cached);
                (time(&none), b)
            };
            assert_eq!(plain, fast, "the segment cache gives the ids tokenizing whole gives");
            let n = chats.len() as f64;
            let tokens = plain.iter().map(Vec::len).sum::<usize>() as f64;
            let stats = cached.segment_cache().expect("a cache").stats();
            let reused = stats.tokens_reused.get() as f64 / tokens;
            println!(
                "| {round} | {name} | {} | {:.0} | {a:.2} | {b:.2} | {:.2}x | {:.1} % |",
                chats.len(),
                tokens / n,
                b / a,
                reused * 100.0
            );
        }
    }
}

/// The tokenizer alone: the library's ids with offsets, its ids only, and the byte-level path's
/// ids (`tokenize::byte_level`, where the tokenizer takes it), on the rendered prompts of both
/// texts, alternating; checks that they agree.
fn encodings(t: &ChatTokenizer, repeated: &[bytes::Bytes], distinct: &[bytes::Bytes], rounds: usize) {
    let render = |bodies: &[bytes::Bytes]| -> Vec<String> {
        bodies
            .iter()
            .map(|b| {
                let v: serde_json::Value = serde_json::from_slice(b).expect("a JSON body");
                t.render(&v["messages"], true).expect("renders")
            })
            .collect()
    };
    let texts = [("10 words, repeated", render(repeated)), ("words that rarely repeat", render(distinct))];
    println!(
        "\nThe byte-level path is {}.",
        if t.direct_path() { "taken" } else { "not taken: its column is the library's ids only again" }
    );
    println!(
        "\n| round | text | tokens per prompt | with offsets, CPU ms | ids only, CPU ms | ids only / with offsets | \
         byte-level path, CPU ms | byte-level / ids only | byte-level, a new thread per prompt, CPU ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for round in 1..=rounds {
        for (name, prompts) in &texts {
            let c0 = cpu_seconds();
            let full: Vec<Vec<u32>> = prompts
                .iter()
                .map(|p| t.tokenizer().encode(p.as_str(), false).expect("encodes").get_ids().to_vec())
                .collect();
            let c1 = cpu_seconds();
            let fast: Vec<Vec<u32>> = prompts
                .iter()
                .map(|p| t.tokenizer().encode_fast(p.as_str(), false).expect("encodes").get_ids().to_vec())
                .collect();
            let c2 = cpu_seconds();
            let direct: Vec<Vec<u32>> = prompts.iter().map(|p| t.encode(p, false).expect("encodes")).collect();
            let c3 = cpu_seconds();
            // A thread of its own per prompt: the BPE's word cache is per thread, so each starts
            // cold (as a prompt does on a blocking-pool thread that has not tokenized before).
            for p in prompts.iter() {
                std::thread::scope(|sc| {
                    sc.spawn(|| t.encode(p, false).expect("encodes"));
                });
            }
            let c4 = cpu_seconds();
            assert_eq!(full, fast, "both of the library's encodings give the same ids");
            assert_eq!(full, direct, "the byte-level path gives the library's ids");
            let n = prompts.len() as f64;
            let tokens = full.iter().map(Vec::len).sum::<usize>() as f64 / n;
            let ms = |a: f64, b: f64| (b - a) * 1e3 / n;
            let (with, only, byte, cold) = (ms(c0, c1), ms(c1, c2), ms(c2, c3), ms(c3, c4));
            println!(
                "| {round} | {name} | {tokens:.0} | {with:.2} | {only:.2} | {:.2}x | {byte:.2} | {:.2}x | {cold:.2} |",
                only / with,
                byte / only
            );
        }
    }
}
