//! The prefix signal, described once: how a model's kernel prefix map learns which backend
//! holds which cached prompt prefix (`ailb_common::abi` has the map, `ailb_common::pick` the
//! search, `ailb_common::prefix` the keys).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use ailb_common::{MODEL_PREFIX_EVENTS, MODEL_PREFIX_LEARN};

/// A model's `prefix` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefixMode {
    /// No prefix search: keys a connect carries are ignored.
    #[default]
    Off,
    /// The kernel records each request's keys for the backend it got, and an entry counts for
    /// the model's `prefix_ttl`: no engine support needed, but each gateway learns only from
    /// its own picks and cannot see evictions.
    Approximate,
    /// The daemon keeps the map equal to what the engines report in their KV events
    /// (evictions included: an evicted block's backend counts as a weaker holder for
    /// `prefix_ttl`), so every gateway daemon on the same events holds the same map.
    Precise,
}

/// The most a learnt entry, or a backend whose engine evicted the block, counts unless the
/// model sets `prefix_ttl` (the lifetime itself follows the caches' fill time below it,
/// [`fill_time_lifetime`]; this is the lifetime where no backend reports its cache): an
/// engine's prefix cache on a busy GPU turns over within about a minute (the fleet model's
/// reading of the Mooncake trace in `docs/replay.md`), after which such a holder more likely
/// misleads than helps.
pub const DEFAULT_PREFIX_TTL: Duration = Duration::from_secs(60);

/// How many times the longest fill time of a model's KV caches a learnt entry (or an evicted
/// holder) counts, unless the model sets `prefix_ttl_fill`.
///
/// An entry should count as long as its backend likely still holds the prompt. An engine's
/// cache evicts the least recently used blocks, and it turns over in about the time the prompt
/// tokens it is sent take to fill it: its capacity in tokens over the tokens per second. On six
/// RTX 3090s whose caches each held three of 24 tenants' prompts, a fixed 60 s sent a third of
/// the requests to a learnt holder that had evicted the prompt; a fixed 15 s suited them but
/// cost most of the prefix step's gain on two A100s and four RTX 3090s, whose A100s keep a
/// prompt longer than a tenant's requests are apart. In `ailb-fleet-model` (50 seeds each,
/// held out 21-70 too), this factor times the longest fill time, with the most recently
/// recorded holder taken first (`ailb_common::pick`), cut TTFT P95 on both fleets: 0.71x,
/// 0.17x, 0.06x the pick's without the prefix step against 0.85x, 0.21x, 0.07x at 60 s on the
/// RTX 3090s (loads 0.75, 1, 1.25), 0.07x against 0.10x and 0.16x on the mixed fleet (loads 1
/// and 2); factor 1 cost the mixed fleet at load 1 (`docs/prefix.md`). The longest, not each
/// backend's own: an entry names holders on several backends, and one lifetime per model
/// keeps the kernel's check one comparison.
pub const DEFAULT_PREFIX_TTL_FILL: f64 = 1.25;

/// The largest `prefix_ttl_fill` accepted.
pub const MAX_PREFIX_TTL_FILL: f64 = 100.0;

/// A model's prefix lifetime: `factor` times the longest fill time among `caches` (each a KV
/// cache's capacity in tokens and the prompt tokens per second it is sent), capped at `cap`,
/// rounded to the millisecond; `cap` when no cache reports both with a rate above 0, or with
/// `factor` 0 (the lifetime fixed).
///
/// An LRU cache keeps a prompt nobody asks for again until its capacity of other tokens came
/// in after it, so a learnt holder counts about as long as the cache that keeps prompts
/// longest would still hold the prompt; a smaller cache's holders may mislead for the
/// difference, as they do under any one lifetime per model. Counting every prompt token, cached
/// or not, keeps the rule from feeding on itself: a shorter lifetime that cost cache hits would
/// otherwise raise the rate of new tokens and shorten the lifetime again. It undercounts where
/// many of those tokens are hits, which evict nothing (the A100s of a mixed fleet on a
/// shared-prefix workload); the factor above 1 makes up for it.
pub fn fill_time_lifetime(caches: impl IntoIterator<Item = (f64, f64)>, factor: f64, cap: Duration) -> Duration {
    if !(factor > 0.0 && factor.is_finite()) {
        return cap;
    }
    let longest = caches
        .into_iter()
        .filter(|&(capacity, rate)| capacity > 0.0 && capacity.is_finite() && rate > 0.0 && rate.is_finite())
        .map(|(capacity, rate)| capacity / rate)
        .max_by(f64::total_cmp);
    match longest {
        Some(fill) => {
            let ms = (fill * factor * 1000.0).round().max(1.0);
            if ms >= cap.as_millis() as f64 {
                cap
            } else {
                Duration::from_millis(ms as u64)
            }
        }
        None => cap,
    }
}

impl PrefixMode {
    /// The setting's name in the config and the plan.
    pub fn name(self) -> &'static str {
        match self {
            PrefixMode::Off => "off",
            PrefixMode::Approximate => "approximate",
            PrefixMode::Precise => "precise",
        }
    }

    /// Parses the config's value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(PrefixMode::Off),
            "approximate" => Some(PrefixMode::Approximate),
            "precise" => Some(PrefixMode::Precise),
            _ => None,
        }
    }

    /// The model's `ModelState::flags` bits for this mode.
    pub fn kernel_flags(self) -> u32 {
        match self {
            PrefixMode::Off => 0,
            PrefixMode::Approximate => MODEL_PREFIX_LEARN,
            PrefixMode::Precise => MODEL_PREFIX_EVENTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifetime_is_the_longest_fill_time_times_the_factor_capped() {
        let cap = Duration::from_secs(60);
        // 100,000 tokens at 10,000 tokens/s fill in 10 s; 50,000 at 2,000/s in 25 s.
        let caches = [(100_000.0, 10_000.0), (50_000.0, 2_000.0)];
        assert_eq!(fill_time_lifetime(caches, 1.25, cap), Duration::from_millis(31_250));
        assert_eq!(fill_time_lifetime(caches, 1.0, cap), Duration::from_secs(25));
        // Capped; a factor 0 keeps the cap.
        assert_eq!(fill_time_lifetime(caches, 4.0, cap), cap);
        assert_eq!(fill_time_lifetime(caches, 0.0, cap), cap);
        // A cache nobody sends prompts to fills never: it does not set the lifetime, and
        // neither does one that reports no capacity; with none left, the cap.
        assert_eq!(fill_time_lifetime([(100_000.0, 10_000.0), (80_000.0, 0.0)], 1.0, cap), Duration::from_secs(10));
        assert_eq!(fill_time_lifetime([(0.0, 5.0), (f64::NAN, 1.0)], 1.0, cap), cap);
        assert_eq!(fill_time_lifetime([], 1.25, cap), cap);
        // Never below a millisecond.
        assert_eq!(fill_time_lifetime([(1.0, 1e9)], 1.0, cap), Duration::from_millis(1));
    }
}
