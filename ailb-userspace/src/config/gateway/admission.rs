//! `gateway.admission`: `false` (the default), `true` (the in-flight mode, as before the
//! table existed) or a table:
//!
//! ```toml
//! [gateway.admission]
//! mode = "fleet_memory"   # "off" | "inflight" | "fleet_memory"
//! factor = 1.0            # admit while the hinted MB in flight + this request's <= factor x KV
//! max_wait = "5s"         # longest wait in the front door's queue, then 503 ("0s": at once)
//! max_queued = 1024       # requests waiting per model; one more gets 429 at once
//! reserve = 0.5           # share of the limit kept for the front door's own requests
//! ```
//!
//! `reserve`: the socket ABI cannot be gated (a kernel hook does not wait), so offered more than
//! the fleet holds it keeps the memory in flight above the limit alone, and every front-door
//! request would wait out `max_wait` and get 503. With a reserve, a front-door request is
//! admitted while the front door's own admitted requests plus its need fit `reserve` x the
//! limit, whatever the ABI holds (it still waits for a backend under its `max_inflight`, the
//! kernel's cap for both entry points). 0 keeps no share.

use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::validate::{parse_duration, ConfigError};

/// The largest `factor` accepted: far above any server's queue, past it the limit sheds nothing.
pub const MAX_FACTOR: f64 = 100.0;
/// The largest `max_queued` accepted.
pub const MAX_QUEUED: u32 = 1_000_000;

/// `gateway.admission` as written: a flag or a table.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum AdmissionSetting {
    /// `false`, or absent.
    #[default]
    Off,
    /// `true`: the in-flight mode.
    Inflight,
    Table(AdmissionTable),
}

/// `[gateway.admission]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionTable {
    /// `"off"`, `"inflight"` (connections in flight against the sum of the members'
    /// `max_inflight`, 429 at once) or `"fleet_memory"` (hinted memory in flight against the
    /// live members' KV capacity, a bounded wait, then 503). Default "fleet_memory".
    #[serde(default = "default_mode")]
    pub mode: String,
    /// `fleet_memory`: the multiple of the model's KV capacity that may be in flight.
    /// Default 1.0: what the servers hold at once; the rest waits in the front door.
    #[serde(default = "default_factor")]
    pub factor: f64,
    /// `fleet_memory`: the longest a request waits for room before 503. Default "5s".
    #[serde(default = "default_max_wait")]
    pub max_wait: String,
    /// `fleet_memory`: requests of one model waiting at once; one more gets 429 at once.
    /// Default 1024.
    #[serde(default = "default_max_queued")]
    pub max_queued: u32,
    /// `fleet_memory`: the share (0 to 1) of the limit kept for the front door's own requests
    /// while the socket ABI holds the rest. Default 0.5.
    #[serde(default = "default_reserve")]
    pub reserve: f64,
}

fn default_mode() -> String {
    "fleet_memory".to_string()
}
fn default_factor() -> f64 {
    1.0
}
fn default_max_wait() -> String {
    "5s".to_string()
}
fn default_max_queued() -> u32 {
    1024
}
fn default_reserve() -> f64 {
    0.5
}

impl<'de> Deserialize<'de> for AdmissionSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AdmissionSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or a table [gateway.admission]")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(if v { AdmissionSetting::Inflight } else { AdmissionSetting::Off })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                AdmissionTable::deserialize(de::value::MapAccessDeserializer::new(map)).map(AdmissionSetting::Table)
            }
        }
        d.deserialize_any(V)
    }
}

/// The fleet-memory mode's limits, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetMemoryLimits {
    pub factor: f64,
    pub max_wait: Duration,
    pub max_queued: u32,
    /// The share of the limit kept for the front door's own requests.
    pub reserve: f64,
    /// `Retry-After` of a shed request (`gateway.admission_retry_after`), whole seconds.
    pub retry_after: u32,
}

/// `gateway.admission`, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidAdmission {
    Off,
    /// The in-flight mode, with its `Retry-After`.
    Inflight {
        retry_after: Duration,
    },
    FleetMemory(FleetMemoryLimits),
}

impl AdmissionSetting {
    /// Checks the setting; `retry_after` is `gateway.admission_retry_after`, checked.
    pub fn validate(&self, retry_after: Duration) -> Result<ValidAdmission, ConfigError> {
        let t = match self {
            AdmissionSetting::Off => return Ok(ValidAdmission::Off),
            AdmissionSetting::Inflight => return Ok(ValidAdmission::Inflight { retry_after }),
            AdmissionSetting::Table(t) => t,
        };
        match t.mode.as_str() {
            "off" => return Ok(ValidAdmission::Off),
            "inflight" => return Ok(ValidAdmission::Inflight { retry_after }),
            "fleet_memory" => {}
            other => {
                return Err(ConfigError::invalid(
                    "gateway.admission.mode",
                    other,
                    "expected \"off\", \"inflight\" or \"fleet_memory\"",
                ))
            }
        }
        if !(t.factor.is_finite() && t.factor > 0.0 && t.factor <= MAX_FACTOR) {
            return Err(ConfigError::invalid(
                "gateway.admission.factor",
                t.factor,
                format!("must be above 0 and at most {MAX_FACTOR}"),
            ));
        }
        if t.max_queued > MAX_QUEUED {
            return Err(ConfigError::invalid(
                "gateway.admission.max_queued",
                t.max_queued,
                format!("must be at most {MAX_QUEUED}"),
            ));
        }
        if !(t.reserve.is_finite() && (0.0..=1.0).contains(&t.reserve)) {
            return Err(ConfigError::invalid("gateway.admission.reserve", t.reserve, "must be from 0 to 1"));
        }
        Ok(ValidAdmission::FleetMemory(FleetMemoryLimits {
            factor: t.factor,
            max_wait: parse_duration("gateway.admission.max_wait", &t.max_wait)?,
            max_queued: t.max_queued,
            reserve: t.reserve,
            retry_after: retry_after.as_secs().clamp(1, u64::from(u32::MAX)) as u32,
        }))
    }
}
