//! The shared-prefix workload, as llm-d's prefix-cache benchmarks shape it: many tenants, each
//! with a long system prompt that all its users share, and every request a different user's
//! question under one tenant's system prompt. No request continues another: there is no
//! conversation (no session header, no conversation tag), so what a router can use is the
//! prompt's text alone. Arrivals are Poisson, the tenant of each request uniform. Seeded: the
//! same options give the same requests.
//!
//! Prompts are block ids as in the Mooncake trace (512-token blocks; [`crate::text`] renders
//! them): tenant `t`'s system prompt is blocks `1 + t x system_blocks ..` (`system_blocks` of
//! them, full), and each request's question is `question_blocks` blocks no other request has,
//! the last one partial (128 to 512 tokens), so that every policy and peer sees the same text
//! and two requests share exactly their tenant's system blocks.

use super::synthetic::Rng;
use super::trace::BLOCK_TOKENS;

/// Options of the shared-prefix workload.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedPrefixOpts {
    /// Requests to generate.
    pub requests: usize,
    /// Tenants, each with a system prompt of its own.
    pub tenants: usize,
    /// 512-token blocks of each tenant's system prompt.
    pub system_blocks: u32,
    /// 512-token blocks of each user's question (the last one 128 to 512 tokens).
    pub question_blocks: u32,
    /// Requests per (simulated) second, Poisson arrivals.
    pub requests_per_s: f64,
    /// Output tokens of a request: uniform in half to one and a half times this.
    pub output_tokens: u32,
    pub seed: u64,
}

impl Default for SharedPrefixOpts {
    fn default() -> Self {
        Self {
            requests: 1000,
            tenants: 24,
            system_blocks: 12,
            question_blocks: 1,
            requests_per_s: 5.0,
            output_tokens: 200,
            seed: 1,
        }
    }
}

impl SharedPrefixOpts {
    /// Rejects options no workload can have; the message names the option and its value.
    pub fn validate(&self) -> Result<(), String> {
        if self.tenants == 0 || self.tenants > 100_000 {
            return Err(format!("tenants must be 1..=100000, not {}", self.tenants));
        }
        let prompt_blocks = u64::from(self.system_blocks) + u64::from(self.question_blocks);
        if self.system_blocks == 0 || self.question_blocks == 0 || prompt_blocks > super::trace::MAX_BLOCKS as u64 {
            return Err(format!(
                "system blocks ({}) and question blocks ({}) must each be at least 1 and together at most {}",
                self.system_blocks,
                self.question_blocks,
                super::trace::MAX_BLOCKS
            ));
        }
        if !(self.requests_per_s > 0.0 && self.requests_per_s.is_finite()) {
            return Err(format!(
                "the rate must be a finite number of requests per second above 0, not {}",
                self.requests_per_s
            ));
        }
        if self.output_tokens == 0 {
            return Err("output tokens must be at least 1, not 0".to_string());
        }
        Ok(())
    }
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPrefixRequest {
    pub at_ms: u64,
    /// The tenant whose system prompt leads the prompt.
    pub tenant: usize,
    pub input_length: u32,
    pub output_length: u32,
    /// The tenant's system blocks, then the question's own.
    pub hash_ids: Vec<u64>,
}

/// The system prompt's block ids of `tenant`.
pub fn system_ids(opts: &SharedPrefixOpts, tenant: usize) -> impl Iterator<Item = u64> {
    let sb = u64::from(opts.system_blocks);
    let first = 1 + tenant as u64 * sb;
    first..first + sb
}

/// Generates the workload (sorted by arrival time). Options that [`SharedPrefixOpts::validate`]
/// rejects give no requests.
pub fn generate(opts: &SharedPrefixOpts) -> Vec<SharedPrefixRequest> {
    if opts.validate().is_err() {
        return Vec::new();
    }
    let mut rng = Rng(opts.seed);
    let mut next_question = 1 + opts.tenants as u64 * u64::from(opts.system_blocks);
    let mut at = 0f64;
    let block = BLOCK_TOKENS as u32;
    let half = (opts.output_tokens / 2).max(1);
    (0..opts.requests)
        .map(|_| {
            at += -(1.0 - rng.unit()).ln() / opts.requests_per_s * 1000.0;
            let tenant = (rng.next() % opts.tenants as u64) as usize;
            let question = (opts.question_blocks - 1) * block + rng.range(block / 4, block);
            let mut hash_ids: Vec<u64> = system_ids(opts, tenant).collect();
            for _ in 0..opts.question_blocks {
                hash_ids.push(next_question);
                next_question += 1;
            }
            SharedPrefixRequest {
                at_ms: at as u64,
                tenant,
                input_length: opts.system_blocks * block + question,
                output_length: rng.range(half, opts.output_tokens + half),
                hash_ids,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
