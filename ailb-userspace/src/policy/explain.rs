//! Why a backend got its weight: a structured explanation (served as JSON from `/v1/plan`,
//! printed by `ailb explain`) and the one-line summary in [`super::PlannedBackend::reason`].

use std::{borrow::Cow, fmt, sync::Arc};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use super::factors::UtilBand;
use crate::metadata::{keys, InvalidField};

/// The rule that excluded a backend. `as_str` is a stable name for logs and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    /// `model_id` / `supported_models` do not name the model (or are invalid).
    ModelId,
    /// The catalog pins a `model_version` the instance does not report.
    ModelVersion,
    /// Free memory below the model's `required_memory_mb`.
    Memory,
    /// The model needs memory and the reported free memory is invalid.
    MemoryInvalid,
    /// Nacos `enabled = false`.
    RegistryDisabled,
    /// Nacos `healthy = false`.
    RegistryUnhealthy,
    /// The agent's `health_status` is not healthy (or invalid).
    HealthStatus,
    /// Registry weight 0 or below: drained.
    Drained,
    /// Registry weight NaN, infinite, below 0.001 or above 65535.
    RegistryWeight,
    /// Another cluster's backend while the gateway's own cluster serves the model.
    OtherCluster,
}

impl Exclusion {
    pub const fn as_str(self) -> &'static str {
        match self {
            Exclusion::ModelId => "model_id",
            Exclusion::ModelVersion => "model_version",
            Exclusion::Memory => "memory",
            Exclusion::MemoryInvalid => "memory_invalid",
            Exclusion::RegistryDisabled => "registry_disabled",
            Exclusion::RegistryUnhealthy => "registry_unhealthy",
            Exclusion::HealthStatus => "health_status",
            Exclusion::Drained => "drained",
            Exclusion::RegistryWeight => "registry_weight",
            Exclusion::OtherCluster => "other_cluster",
        }
    }
}

/// One decision about a backend, kept as data and formatted when shown (`Display`: the line
/// `/v1/plan` serves and `ailb explain` prints, as a string). The lines an eligible backend
/// leaves in every plan are variants of their own, so that a plan writes no text for them;
/// the rarer lines (exclusions, invalid values, spills) are written when the decision is made.
/// Read back from JSON, every line is [`Reason::Text`]; equal text is an equal reason.
#[derive(Debug, Clone)]
pub enum Reason {
    /// `model: serves "<model>"` (the name is shared by the model's backends).
    Serves(Arc<str>),
    /// `cluster: own cluster "<cluster>"` (the gateway's cluster, shared likewise).
    OwnCluster(Arc<str>),
    /// A line without a value (`health_status: healthy`).
    Fixed(&'static str),
    /// Any other line, as written.
    Text(String),
}

impl Reason {
    /// The line as shown; borrowed unless it has a value to format.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Reason::Fixed(s) => Cow::Borrowed(s),
            Reason::Text(s) => Cow::Borrowed(s),
            other => Cow::Owned(other.to_string()),
        }
    }

    pub fn starts_with(&self, prefix: &str) -> bool {
        self.text().starts_with(prefix)
    }

    pub fn contains(&self, part: &str) -> bool {
        self.text().contains(part)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Serves(model) => write!(f, "model: serves {:?}", &**model),
            Reason::OwnCluster(own) => write!(f, "cluster: own cluster {:?}", &**own),
            Reason::Fixed(s) => f.write_str(s),
            Reason::Text(s) => f.write_str(s),
        }
    }
}

impl PartialEq for Reason {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl From<String> for Reason {
    fn from(s: String) -> Self {
        Reason::Text(s)
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Reason::Text)
    }
}

/// The load factor and its inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadExplain {
    pub current_requests: Option<f64>,
    pub queue_length: Option<f64>,
    pub factor: f64,
}

/// The GPU-utilisation factor and its inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UtilExplain {
    /// This plan's `gpu_util` (%), when valid.
    pub sample: Option<f64>,
    /// The EWMA the band is decided on.
    pub smoothed: Option<f64>,
    pub band: UtilBand,
    pub factor: f64,
}

/// The memory check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryExplain {
    /// Free GPU memory (MiB) when known and valid.
    pub free_mb: Option<u32>,
    /// The metadata key it came from.
    pub key: &'static str,
    /// The model's `required_memory_mb`.
    pub required_mb: Option<u32>,
    /// `None`: not checked (no requirement, or free memory unknown).
    pub fits: Option<bool>,
}

/// Everything that went into one backend's weight, for `ailb explain` and `/v1/plan`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendExplain {
    /// The registry service that listed the instance.
    pub service: String,
    pub gpu_type: Option<String>,
    /// `None`: not a finite number.
    pub registry_weight: Option<f64>,
    /// Nacos returned every instance of the service because too few were healthy; its
    /// `healthy` flags may have been rewritten to true (Nacos 2.x does).
    pub protection_threshold: bool,
    pub gpu_capability: f64,
    pub load: LoadExplain,
    pub util: UtilExplain,
    pub memory: MemoryExplain,
    /// Registry weight x capability x load x util, before scaling to table weights.
    pub composed: f64,
    /// Scaled weight before the minimum-change rule (0 when excluded).
    pub candidate_weight: u32,
    /// The model kept its last table weights (every share moved less than `min_weight_change`).
    pub held: bool,
    pub cap: u32,
    /// Metadata values that were refused, and what that did.
    pub invalid: Vec<InvalidField>,
    /// One line per decision, in the order taken.
    pub reasons: Vec<Reason>,
    /// The first rule that excluded the backend.
    pub excluded_by: Option<Exclusion>,
}

/// What the policy did about an invalid value ([`InvalidField::effect`]).
const EFFECTS: [&str; 2] = ["excluded", "ignored"];

/// Reading an explanation back maps each name to its `&'static str` constant (names are metric
/// labels, kept without an allocation per plan); a name outside `names` is an error.
fn known<E: de::Error>(what: &str, name: &str, names: &[&'static str]) -> Result<&'static str, E> {
    names.iter().copied().find(|k| *k == name).ok_or_else(|| E::custom(format!("unknown {what} {name:?}")))
}

impl<'de> Deserialize<'de> for MemoryExplain {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// [`MemoryExplain`] as it reads from JSON.
        #[derive(Deserialize)]
        struct Owned {
            free_mb: Option<u32>,
            key: String,
            required_mb: Option<u32>,
            fits: Option<bool>,
        }
        let o = Owned::deserialize(d)?;
        Ok(MemoryExplain {
            free_mb: o.free_mb,
            key: known("metadata key", &o.key, &keys::ALL)?,
            required_mb: o.required_mb,
            fits: o.fits,
        })
    }
}

impl<'de> Deserialize<'de> for InvalidField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// [`InvalidField`] as it reads from JSON.
        #[derive(Deserialize)]
        struct Owned {
            key: String,
            value: String,
            reason: String,
            effect: String,
        }
        let o = Owned::deserialize(d)?;
        Ok(InvalidField {
            key: known("metadata key", &o.key, &keys::ALL)?,
            value: o.value,
            reason: o.reason,
            effect: known("effect", &o.effect, &EFFECTS)?,
        })
    }
}

/// A factor for display: up to 3 decimals, trailing zeros dropped (`2`, `0.333`, `1.25`).
pub(super) fn num(v: f64) -> String {
    // Fast path (the policy formats tens of thousands of these per plan, and `{:.3}` takes the
    // exact, slow route): below 1e9, `v * 1000` rounded to an integer is `{:.3}`'s rounding
    // unless the thousandths are within 1e-6 of a tie (the product's error is under 1e-7).
    let scaled = v * 1000.0;
    if scaled.abs() < 1e9 && ((scaled - scaled.trunc()).abs() - 0.5).abs() > 1e-6 {
        let t = scaled.round() as i64;
        let (sign, int, frac) = (if t < 0 { "-" } else { "" }, t.abs() / 1000, t.abs() % 1000);
        return match frac {
            _ if t == 0 => "0".to_string(),
            0 => format!("{sign}{int}"),
            f if f % 100 == 0 => format!("{sign}{int}.{}", f / 100),
            f if f % 10 == 0 => format!("{sign}{int}.{:02}", f / 10),
            f => format!("{sign}{int}.{f:03}"),
        };
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

impl BackendExplain {
    /// The first line recorded for the excluding rule `e` (it carries field and value).
    pub fn exclusion_detail(&self, e: Exclusion) -> Option<Cow<'_, str>> {
        let prefix = e.as_str();
        self.reasons.iter().map(Reason::text).find(|r| r.starts_with(prefix) && r[prefix.len()..].starts_with(": "))
    }

    /// The one-line summary: why excluded, or the product that gave the weight.
    pub fn summary(&self, weight: u32) -> String {
        if let Some(e) = self.excluded_by {
            // The first reason recorded for the excluding rule carries field and value.
            let detail = self.exclusion_detail(e).unwrap_or(Cow::Borrowed(e.as_str()));
            return format!("excluded: {detail}");
        }
        let gpu = self.gpu_type.as_deref().unwrap_or("gpu_type unknown");
        let load = match (self.load.current_requests, self.load.queue_length) {
            (None, None) => "load unknown".to_string(),
            // An absent count counts as 0 in the formula, and is shown so.
            (c, q) => format!("load: {} running, {} queued", num(c.unwrap_or(0.0)), num(q.unwrap_or(0.0))),
        };
        let util = match (self.util.smoothed, self.util.band) {
            (None, _) => "util unknown".to_string(),
            (Some(u), UtilBand::High) => format!("util {}% high", num(u)),
            (Some(u), UtilBand::Low) => format!("util {}% low", num(u)),
            (Some(u), UtilBand::Neutral) => format!("util {}%", num(u)),
        };
        let held =
            if self.held { format!(", held (new {} within min change)", self.candidate_weight) } else { String::new() };
        format!(
            "eligible: weight {weight}{held} ~ {} = {} (registry) x {} ({gpu}) x {} ({load}) x {} ({util})",
            num(self.composed),
            self.registry_weight.map_or("?".to_string(), num),
            num(self.gpu_capability),
            num(self.load.factor),
            num(self.util.factor),
        )
    }
}

#[cfg(test)]
mod tests;
