//! What the comparison's plots draw, saved as `replay-plots.json` beside them, so that a change
//! of the plots can redraw a past run's without running it again (`ailb-compare --replot`, no
//! root): per policy, every successful request's E2E and every GPU's utilisation samples.

use std::path::Path;

use ailb_sim::GpuProfile;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::outcome::{GpuOutcome, Outcome};
use super::plots;
use super::policy::Policy;

/// The file's name in the output directory.
pub const FILE: &str = "replay-plots.json";

/// Every policy's plotted data, in the order the policies ran.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct PlotData {
    pub policies: Vec<PolicyPlot>,
}

/// One policy's plotted data.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct PolicyPlot {
    /// `--policies` key.
    pub policy: String,
    /// Requests sent (the CDF's 100 %), failed ones included.
    pub requests: u64,
    /// Real seconds from the first to the last planned arrival.
    pub window_s: f64,
    /// E2E of the successful requests, ms, sorted (to the microsecond: far below a pixel).
    pub e2e_sorted_ms: Vec<f64>,
    pub gpus: Vec<GpuPlot>,
    /// (seconds since the replay started, to the ms; utilisation per GPU in 0..1, to 1e-4;
    /// null: no sample).
    pub util_series: Vec<(f64, Vec<Option<f64>>)>,
}

/// One GPU as the utilisation plot names it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct GpuPlot {
    pub addr: String,
    pub profile: String,
    /// Mean of its samples (the panel's title gives the mean and spread).
    pub util_mean: f64,
}

fn round(v: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (v * k).round() / k
}

impl PlotData {
    /// The plotted data of `outs`.
    pub fn of(outs: &[Outcome]) -> Self {
        let policies = outs
            .iter()
            .map(|o| PolicyPlot {
                policy: o.policy.key().to_string(),
                requests: o.requests(),
                window_s: o.window_s,
                e2e_sorted_ms: o.e2e_sorted.iter().map(|v| round(*v, 3)).collect(),
                gpus: o
                    .gpus
                    .iter()
                    .map(|g| GpuPlot { addr: g.addr.clone(), profile: g.profile.to_string(), util_mean: g.util_mean })
                    .collect(),
                util_series: o
                    .util_series
                    .iter()
                    .map(|(t, row)| (round(*t, 3), row.iter().map(|u| u.is_finite().then(|| round(*u, 4))).collect()))
                    .collect(),
            })
            .collect();
        PlotData { policies }
    }

    /// Outcomes that draw as the saved ones did (only what the plots read is filled in).
    pub fn outcomes(&self) -> anyhow::Result<Vec<Outcome>> {
        self.policies.iter().map(PolicyPlot::outcome).collect()
    }
}

impl PolicyPlot {
    fn outcome(&self) -> anyhow::Result<Outcome> {
        let policy = Policy::parse(&self.policy)?;
        let gpus = self
            .gpus
            .iter()
            .map(|g| {
                let profile = GpuProfile::PRESETS
                    .into_iter()
                    .find(|p| *p == g.profile)
                    .with_context(|| format!("GPU {}: unknown preset {:?}", g.addr, g.profile))?;
                Ok(GpuOutcome { addr: g.addr.clone(), profile, util_mean: g.util_mean, busy: 0.0, prefix_hit: None })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let util_series =
            self.util_series.iter().map(|(t, row)| (*t, row.iter().map(|u| u.unwrap_or(f64::NAN)).collect())).collect();
        let mut o = Outcome::from_replay(policy, &json!({}), gpus, util_series, self.window_s, 0.0);
        o.summary = json!({ "requests": self.requests });
        o.e2e_sorted = self.e2e_sorted_ms.clone();
        Ok(o)
    }
}

/// Writes `replay-plots.json` for `outs` into `dir`.
pub fn save(dir: &Path, outs: &[Outcome]) -> anyhow::Result<()> {
    let path = dir.join(FILE);
    let text = serde_json::to_string(&PlotData::of(outs)).context("encoding the plots' data")?;
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// `--replot`: redraws `replay-cdf.svg` and `replay-util.svg` in `dir` from its
/// `replay-plots.json`.
pub fn replot(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let data: PlotData = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let outs = data.outcomes().with_context(|| format!("reading {}", path.display()))?;
    for (name, svg) in [("replay-cdf.svg", plots::cdf_svg(&outs)?), ("replay-util.svg", plots::util_svg(&outs)?)] {
        let out = dir.join(name);
        std::fs::write(&out, svg).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("ailb-compare: redrew {}", out.display());
    }
    Ok(())
}
