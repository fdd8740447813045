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

/// How long a learnt entry, or a backend whose engine evicted the block, counts unless the
/// model sets `prefix_ttl`: an engine's prefix cache on a busy GPU turns over within about a
/// minute (the fleet model's reading of the Mooncake trace in `docs/replay.md`), after which
/// such a holder more likely misleads than helps.
pub const DEFAULT_PREFIX_TTL: Duration = Duration::from_secs(60);

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
