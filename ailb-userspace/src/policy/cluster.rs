//! The cluster preference, per model, after every backend's own chain: a gateway with
//! `daemon.cluster` set sends a model's traffic to the backends of its own cluster (Nacos
//! `clusterName`, or a static backend's `cluster`) while that cluster can serve it, and spills to
//! the other clusters only when its own has no eligible backend or is saturated.
//!
//! Saturated: the own cluster's eligible backends report `current_requests + queue_length` of at
//! least `spill_saturation` (per model, else `[policy]`; default 1.0) times their capacity
//! (`max_inflight`, else the model's `backend_capacity`); backends with no capacity count in
//! neither sum, and with no capacity at all the load never spills. A spill for saturation ends
//! only once the load is below 0.9 x that threshold, so a load at the threshold does not flap
//! the tables. While spilling, every cluster's eligible backends serve (the own ones too).

use std::{fmt, net::SocketAddr};

use tracing::info;

use super::{
    evaluate::Evaluated,
    explain::{Exclusion, Reason},
    ModelSpec, PolicyConfig,
};

/// A spill for saturation ends below this fraction of the threshold.
pub(crate) const SPILL_HYSTERESIS: f64 = 0.9;

/// Why a model's traffic goes to other clusters too.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Spill {
    /// The own cluster has no eligible backend for the model.
    NoneEligible,
    /// Load and capacity of the own cluster's eligible backends.
    Saturated { load: f64, capacity: f64 },
}

impl fmt::Display for Spill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spill::NoneEligible => f.write_str("has no eligible backend"),
            Spill::Saturated { load, capacity } => write!(f, "is saturated ({load} running + queued of {capacity})"),
        }
    }
}

/// A backend's capacity for the saturation rule: its cap, else the model's `backend_capacity`.
pub(crate) fn capacity(ev: &Evaluated, spec: &ModelSpec) -> Option<f64> {
    match ev.explain.cap {
        0 => spec.backend_capacity.map(f64::from),
        c => Some(f64::from(c)),
    }
}

/// `spill_saturation` of the model, else `[policy]`'s.
fn threshold(spec: &ModelSpec, cfg: &PolicyConfig) -> f64 {
    spec.spill_saturation_milli.map_or(cfg.spill_saturation, |m| f64::from(m) / 1000.0)
}

/// Applies the preference to one model's evaluated backends; `last` is the model's spill of the
/// previous plan (updated here).
pub(super) fn prefer_own(
    model: &str,
    spec: &ModelSpec,
    cfg: &PolicyConfig,
    evaluated: &mut [(SocketAddr, Evaluated)],
    last: &mut Option<Spill>,
) {
    let Some(own) = cfg.own_cluster.as_deref() else { return };
    let eligible = |ev: &Evaluated| ev.explain.excluded_by.is_none();
    let (mut load, mut cap, mut any) = (0.0, 0.0, false);
    for (_, ev) in evaluated.iter().filter(|(_, ev)| ev.cluster == own && eligible(ev)) {
        any = true;
        if let Some(c) = capacity(ev, spec) {
            let l = &ev.explain.load;
            load += l.current_requests.unwrap_or(0.0) + l.queue_length.unwrap_or(0.0);
            cap += c;
        }
    }
    let t = threshold(spec, cfg);
    let was_saturated = matches!(last, Some(Spill::Saturated { .. }));
    let bound = if was_saturated { t * SPILL_HYSTERESIS } else { t };
    let spill = if !any {
        Some(Spill::NoneEligible)
    } else if cap > 0.0 && (load >= bound * cap) {
        Some(Spill::Saturated { load, capacity: cap })
    } else {
        None
    };
    if spill.is_some() != last.is_some() {
        match &spill {
            Some(s) => info!(model, cluster = own, "own cluster {s}: spilling to the other clusters"),
            None => info!(model, cluster = own, "own cluster serving again: other clusters get no new connections"),
        }
    }
    *last = spill;
    let shared: std::sync::Arc<str> = own.into();
    for (_, ev) in evaluated.iter_mut() {
        if ev.cluster == own {
            ev.explain.reasons.push(Reason::OwnCluster(shared.clone()));
            continue;
        }
        let other = ev.cluster.clone();
        match spill {
            Some(s) => ev.explain.reasons.push(Reason::Text(format!(
                "cluster: other cluster {other:?}; own cluster {own:?} {s}: spilling here"
            ))),
            None if eligible(ev) => {
                let why = if cap > 0.0 {
                    format!("{load} running + queued of {cap}, below {t} x capacity")
                } else {
                    "no capacity reported".to_string()
                };
                ev.explain.reasons.push(Reason::Text(format!(
                    "{}: other cluster {other:?}, own cluster {own:?} serving ({why})",
                    Exclusion::OtherCluster.as_str()
                )));
                ev.explain.excluded_by = Some(Exclusion::OtherCluster);
                ev.explain.composed = 0.0;
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests;
