//! The plots read apart: in the SVG of every policy's latency CDF each policy's curve has its
//! own colour and dash pattern (the ones [`plots::style`] fixes for it), and the legend's box
//! lies beside the plotting area, never on a curve; the same for the utilisation panels and
//! the fleet model's plot. Pure: the SVG is parsed back.

use std::collections::{BTreeMap, BTreeSet};

use ailb_sim::fleet_model::Placement;
use ailb_tools::capacity::plot::{self as fleet_plot, Curve};
use ailb_tools::chart::{Dash, PixelRect};
use ailb_tools::compare::outcome::{GpuOutcome, Outcome};
use ailb_tools::compare::plots::{self, Plot};
use ailb_tools::compare::policy::Policy;
use serde_json::json;

/// Every policy the comparison knows.
const ALL: [Policy; 17] = [
    Policy::RoundRobin,
    Policy::Random,
    Policy::LeastConn,
    Policy::Ailb,
    Policy::AilbStatic,
    Policy::AilbGateway,
    Policy::AilbPrefix,
    Policy::AilbGatewayPrefix,
    Policy::AilbStaticGateway,
    Policy::Nginx,
    Policy::SglangCacheAware,
    Policy::SglangRoundRobin,
    Policy::SmgCacheAware,
    Policy::SmgPrefixHash,
    Policy::SmgLeastLoad,
    Policy::VllmCacheAware,
    Policy::VllmConsistentHash,
];

/// `policy`'s outcome: 200 requests whose latencies span three decades (shifted by `k`), two
/// of them failed; two GPUs sampled for 10 s.
fn outcome(policy: Policy, k: usize) -> Outcome {
    let requests: Vec<_> = (0..200u64)
        .map(|i| {
            let ok = i % 100 != 7;
            let e2e = 10f64.powf(1.0 + 3.0 * i as f64 / 200.0) * (1.0 + k as f64 * 0.07);
            json!({"index": i, "status": if ok { 200 } else { 400 }, "error": null, "e2e_ms": e2e})
        })
        .collect();
    let report = json!({"summary": {"requests": 200, "failures": 2}, "requests": requests});
    let gpu = |n: u8, profile| GpuOutcome {
        addr: format!("127.0.10.{n}:18100"),
        profile,
        util_mean: 0.5,
        busy: 0.5,
        prefix_hit: None,
    };
    let series = (0..40).map(|t| (t as f64 * 0.25, vec![0.2 + 0.01 * t as f64, 0.9 - 0.01 * (t + k) as f64])).collect();
    Outcome::from_replay(policy, &report, vec![gpu(1, "a100-80gb"), gpu(2, "rtx3090-24gb")], series, 8.0, 10.0)
}

/// A `<polyline>` of the SVG: its stroke colour and its points.
struct Polyline {
    stroke: String,
    points: Vec<(f64, f64)>,
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[start..start + tag[start..].find('"')?])
}

fn polylines(svg: &str) -> Vec<Polyline> {
    svg.split("<polyline")
        .skip(1)
        .filter_map(|rest| {
            let tag = &rest[..rest.find("/>")?];
            let points = attr(tag, "points")?
                .split_whitespace()
                .filter_map(|p| p.split_once(',').and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?))))
                .collect();
            Some(Polyline { stroke: attr(tag, "stroke")?.to_string(), points })
        })
        .collect()
}

/// Every `<text>`: its anchor point and its content.
fn texts(svg: &str) -> Vec<((f64, f64), String)> {
    svg.split("<text")
        .skip(1)
        .filter_map(|rest| {
            let (tag, body) = rest.split_once('>')?;
            let at = (attr(tag, "x")?.parse().ok()?, attr(tag, "y")?.parse().ok()?);
            Some((at, body[..body.find("</text>")?].trim().to_string()))
        })
        .collect()
}

fn length(p: &[(f64, f64)]) -> f64 {
    p.windows(2).map(|w| (w[1].0 - w[0].0).hypot(w[1].1 - w[0].1)).sum()
}

/// The dash pattern that drew `lines` (one curve's polylines, in order): one polyline is a
/// solid line; dashes are as long as the median polyline and as far apart as the median gap.
fn dash_of(lines: &[&Polyline]) -> Dash {
    if lines.len() == 1 {
        return Dash::Solid;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let dash = median(lines.iter().map(|l| length(&l.points)).collect());
    let gap = median(
        lines
            .windows(2)
            .map(|w| {
                let (a, b) = (w[0].points.last().expect("a point"), w[1].points[0]);
                (b.0 - a.0).hypot(b.1 - a.1)
            })
            .collect(),
    );
    let dist = |d: Dash| d.pattern().map_or(f64::MAX, |(s, g)| (s as f64 - dash).abs() + (g as f64 - gap).abs());
    [Dash::Long, Dash::Short, Dash::Dot].into_iter().min_by(|a, b| dist(*a).total_cmp(&dist(*b))).expect("a dash")
}

/// The (colour, dash) of every curve drawn inside `area`, by colour.
fn curves_in(svg: &str, area: &PixelRect) -> BTreeMap<String, Dash> {
    let mut by_color: BTreeMap<String, Vec<Polyline>> = BTreeMap::new();
    for p in polylines(svg) {
        if p.points.iter().all(|pt| area.contains(*pt)) {
            by_color.entry(p.stroke.clone()).or_default().push(p);
        }
    }
    by_color.into_iter().map(|(c, lines)| (c, dash_of(&lines.iter().collect::<Vec<_>>()))).collect()
}

/// The legend's box is clear of every plotting area, every legend label lies in it, and every
/// line of a curve's colour (`colours`) lies either in a plotting area or in the legend (its
/// samples).
fn assert_legend_clear(plot: &Plot, labels: &[String], colours: &[String]) {
    for area in &plot.plotting_areas {
        assert!(!plot.legend.overlaps(area), "legend {:?} overlaps the plotting area {area:?}", plot.legend);
    }
    let texts = texts(&plot.svg);
    for l in labels {
        let (at, _) = texts.iter().find(|(_, t)| t == l).unwrap_or_else(|| panic!("no legend label {l:?}"));
        assert!(plot.legend.contains(*at), "legend label {l:?} at {at:?} outside the legend {:?}", plot.legend);
    }
    for p in polylines(&plot.svg).into_iter().filter(|p| colours.contains(&p.stroke)) {
        for pt in &p.points {
            let inside = plot.legend.contains(*pt) || plot.plotting_areas.iter().any(|a| a.contains(*pt));
            assert!(inside, "a {} line at {pt:?} is neither in a plotting area nor in the legend", p.stroke);
        }
    }
}

#[test]
fn every_policy_has_its_own_colour_and_dash_and_the_legend_is_beside_the_curves() {
    for n in [1, 4, ALL.len()] {
        let outs: Vec<Outcome> = ALL.iter().take(n).enumerate().map(|(k, p)| outcome(*p, k)).collect();
        let plot = plots::cdf_plot(&outs).expect("the CDF");
        assert!(plot.svg.contains("(log scale)"), "three decades of latency: a log axis");
        let curves = curves_in(&plot.svg, &plot.plotting_areas[0]);
        let mut pairs = BTreeSet::new();
        for o in &outs {
            let want = plots::style(o.policy);
            let dash =
                curves.get(&want.hex()).unwrap_or_else(|| panic!("no curve of {} ({})", o.policy.title(), want.hex()));
            assert_eq!(*dash, want.dash, "{}'s curve", o.policy.title());
            pairs.insert((want.hex(), *dash));
        }
        assert_eq!(pairs.len(), n, "{n} policies, {n} distinct (colour, dash) pairs: {pairs:?}");
        let labels: Vec<String> = outs.iter().map(|o| o.policy.title().to_string()).collect();
        let colours: Vec<String> = outs.iter().map(|o| plots::style(o.policy).hex()).collect();
        assert_legend_clear(&plot, &labels, &colours);
    }
}

/// A policy keeps its look whichever other policies ran: the map is by policy, not by place.
#[test]
fn a_policy_is_drawn_the_same_whoever_else_ran() {
    let all: Vec<_> = ALL.iter().map(|p| plots::style(*p)).collect();
    let distinct: BTreeSet<_> = all.iter().map(|s| (s.hex(), s.dash)).collect();
    assert_eq!(distinct.len(), ALL.len());
    let colours: BTreeSet<_> = all.iter().map(|s| s.hex()).collect();
    assert_eq!(colours.len(), ALL.len(), "every policy its own colour");
    let without_first: Vec<Outcome> = ALL[1..].iter().map(|p| outcome(*p, 0)).collect();
    let plot = plots::cdf_plot(&without_first).expect("the CDF");
    let curves = curves_in(&plot.svg, &plot.plotting_areas[0]);
    for p in &ALL[1..] {
        assert_eq!(curves.get(&plots::style(*p).hex()), Some(&plots::style(*p).dash), "{}", p.title());
    }
}

#[test]
fn the_utilisation_legend_is_beside_every_panel() {
    let outs: Vec<Outcome> = ALL.iter().take(5).enumerate().map(|(k, p)| outcome(*p, k)).collect();
    let plot = plots::util_plot(&outs).expect("the utilisation plot");
    assert_eq!(plot.plotting_areas.len(), outs.len(), "one panel per policy");
    for w in plot.plotting_areas.windows(2) {
        assert!(!w[0].overlaps(&w[1]), "panels {:?} and {:?} overlap", w[0], w[1]);
    }
    let labels = ["127.0.10.1 a100-80gb", "127.0.10.2 rtx3090-24gb", "last arrival"].map(String::from);
    let curves = curves_in(&plot.svg, &plot.plotting_areas[0]);
    let colours: Vec<String> = curves.keys().filter(|c| *c != "#444444").cloned().collect();
    assert_eq!(colours.len(), 2, "two GPUs: {curves:?}");
    assert_legend_clear(&plot, &labels, &colours);
    assert!(curves.values().any(|d| *d == Dash::Solid) && curves.values().any(|d| *d == Dash::Long), "{curves:?}");
}

#[test]
fn the_fleet_model_plot_keeps_its_legend_beside_the_curves() {
    let loads = [0.25, 0.5, 1.0];
    let placements =
        [Placement::RoundRobin, Placement::LeastConnections, Placement::EarliestFinish, Placement::CacheOracle];
    let curves: Vec<Curve> = placements
        .iter()
        .enumerate()
        .map(|(k, p)| Curve {
            placement: *p,
            label: p.label(),
            short: loads.iter().map(|l| 10.0 * (k + 1) as f64 / l).collect(),
            long: loads.iter().map(|l| 12.0 * (k + 1) as f64 / l).collect(),
        })
        .collect();
    let plot = fleet_plot::plot(&loads, &curves, 1000).expect("the plot");
    let mut labels: Vec<String> = placements.iter().map(|p| p.label()).collect();
    labels.extend(["1000 requests", "2000 requests"].map(String::from));
    let colours: Vec<String> = placements.iter().map(|p| fleet_plot::style(*p).hex()).collect();
    assert_legend_clear(&plot, &labels, &colours);
    let drawn = curves_in(&plot.svg, &plot.plotting_areas[0]);
    let colours: BTreeSet<_> = colours.into_iter().collect();
    assert_eq!(colours.len(), placements.len(), "every placement its own colour");
    for c in &colours {
        assert!(drawn.contains_key(c), "no curve in {c}: {drawn:?}");
    }
}
