//! From composed float weights to table weights: quantisation, and the minimum change below
//! which a model keeps its last table.

use std::{collections::BTreeMap, net::SocketAddr};

/// Largest table weight, and so the largest registry weight and static `weight` accepted:
/// keeps the kernel's load-bound arithmetic in u64.
pub const MAX_WEIGHT: u32 = 65_535;

/// The table weight of a model's heaviest backend when its weights are scaled. Three
/// significant digits: each factor shows to 0.1 % of the largest backend, finer than any
/// `min_weight_change` worth setting and than the smallest table (1,021 slots) can resolve; a backend
/// below 1/1000 of the largest still gets weight 1 (excluding it is eligibility's job).
pub const WEIGHT_SCALE: f64 = 1000.0;

/// Table weights for composed weights (all finite and > 0 for eligible backends).
///
/// When every composed weight is already a whole number in `1..=65535` (integer registry
/// weights with neutral factors: the static source, or Nacos without telemetry), they are
/// the table weights as they stand, so `ailb status` shows the weights the operator wrote.
/// Otherwise they are scaled so that the largest becomes [`WEIGHT_SCALE`], rounded, at least 1.
/// Either way the table shares are the composed shares (to 0.1 %).
pub(super) fn quantise(composed: &[f64]) -> Vec<u32> {
    let whole = |c: f64| c.fract() == 0.0 && (1.0..=MAX_WEIGHT as f64).contains(&c);
    if composed.iter().all(|&c| whole(c)) {
        return composed.iter().map(|&c| c as u32).collect();
    }
    let max = composed.iter().copied().filter(|c| c.is_finite() && *c > 0.0).fold(0.0_f64, f64::max);
    let scale = if max > 0.0 { WEIGHT_SCALE / max } else { 0.0 };
    composed
        .iter()
        .map(|&c| {
            let w = (c * scale).round();
            if w.is_finite() {
                w.clamp(1.0, WEIGHT_SCALE) as u32
            } else {
                1
            }
        })
        .collect()
}

/// Whether `new` may be replaced by `last`: same backends, and every backend's share of the
/// total weight moved by less than `min_change`, relative to its last share. Shares, not raw
/// weights, so that a change of scale alone (e.g. `1:2:3` to `333:667:1000`) is no change.
pub(super) fn within_min_change(
    last: &BTreeMap<SocketAddr, u32>,
    new: &BTreeMap<SocketAddr, u32>,
    min_change: f64,
) -> bool {
    if last.is_empty() || !last.keys().eq(new.keys()) {
        return false;
    }
    let total = |m: &BTreeMap<SocketAddr, u32>| m.values().map(|&w| f64::from(w)).sum::<f64>();
    let (lt, nt) = (total(last), total(new));
    if lt <= 0.0 || nt <= 0.0 {
        return false;
    }
    last.iter().zip(new.values()).all(|((_, &l), &n)| {
        let (ls, ns) = (f64::from(l) / lt, f64::from(n) / nt);
        ls > 0.0 && ((ns - ls) / ls).abs() < min_change
    })
}

#[cfg(test)]
mod tests;
