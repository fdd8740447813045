//! The synthetic workload: the classic mixed-GPU-fleet mix of short questions (about 100 prompt tokens,
//! about 10 output tokens, answered in ~10 ms) next to long generations (about 2,000 prompt
//! tokens, about 800 output tokens, ~10 s), in conversations of several turns whose prompts
//! grow by the previous answer and a new question and so share their prefix blocks.
//! Seeded: the same options give the same requests.

use super::trace::BLOCK_TOKENS;

/// Options of the synthetic workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticOpts {
    /// Requests to generate (the last conversations are cut short to fit).
    pub requests: usize,
    /// New conversations per second (Poisson arrivals).
    pub conversations_per_s: f64,
    /// Share of conversations that are long generations (the rest are short questions).
    pub long_share: f64,
    /// Turns per conversation, uniform in 1..=max_turns.
    pub max_turns: u32,
    pub seed: u64,
}

impl Default for SyntheticOpts {
    fn default() -> Self {
        Self { requests: 500, conversations_per_s: 5.0, long_share: 0.1, max_turns: 4, seed: 1 }
    }
}

/// One synthetic request (what a trace line gives, plus its conversation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticRequest {
    pub at_ms: u64,
    pub conversation: String,
    pub long: bool,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
    /// Where each earlier message of the conversation ends in the prompt, in tokens, ascending
    /// and under `input_length`: the earlier turns' questions and answers, so that the prompt is
    /// sent as the chat it is (user, assistant, user, ..., the new question last).
    pub message_ends: Vec<u32>,
}

/// splitmix64: small, seeded, good enough for workload shapes.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in lo..=hi.
    pub(super) fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }
}

/// Generates the workload, sorted by arrival time.
///
/// A conversation's turn `k` has the prompt of turn `k-1`, its answer and a new question; its
/// `hash_ids` are the conversation's blocks covering that prompt, so turn `k` shares all of
/// turn `k-1`'s blocks (the partial last block is kept too: a slight overestimate of the
/// reusable prefix). Its prompt is cut into messages where each earlier question and answer
/// ends. The next turn comes a think time after the previous one (short: 1-3 s,
/// long: 5-15 s).
pub fn generate(opts: &SyntheticOpts) -> Vec<SyntheticRequest> {
    let mut rng = Rng(opts.seed);
    let mut out = Vec::with_capacity(opts.requests);
    let mut next_block = 1u64;
    let mut start_ms = 0f64;
    let mut conv = 0usize;
    while out.len() < opts.requests {
        start_ms += -(1.0 - rng.unit()).ln() / opts.conversations_per_s.max(1e-6) * 1000.0;
        let long = rng.unit() < opts.long_share;
        let turns = rng.range(1, opts.max_turns.max(1));
        let mut blocks: Vec<u64> = Vec::new();
        let mut context = 0u32;
        let mut ends: Vec<u32> = Vec::new();
        let mut at = start_ms;
        for _ in 0..turns {
            if out.len() >= opts.requests {
                break;
            }
            let (question, answer) = if long {
                (rng.range(1500, 2500), rng.range(600, 1000))
            } else {
                (rng.range(50, 150), rng.range(5, 15))
            };
            let input = context + question;
            let need = u64::from(input).div_ceil(BLOCK_TOKENS) as usize;
            while blocks.len() < need {
                blocks.push(next_block);
                next_block += 1;
            }
            out.push(SyntheticRequest {
                at_ms: at as u64,
                conversation: format!("syn-{conv}"),
                long,
                input_length: input,
                output_length: answer,
                hash_ids: blocks.clone(),
                message_ends: ends.clone(),
            });
            context = input + answer;
            ends.extend([input, context]);
            at += f64::from(if long { rng.range(5000, 15000) } else { rng.range(1000, 3000) });
        }
        conv += 1;
    }
    out.sort_by_key(|r| r.at_ms);
    out
}
