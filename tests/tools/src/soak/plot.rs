//! The soak's timeline, drawn with `plotters` into SVG in the style of the other tools'
//! plots ([`crate::chart`]): four panels on one time axis, each fault's window shaded and
//! labelled in every panel: requests sent per second by entry point and failures per second by
//! class; the kernel's in-flight count against the open connections; the RSS and the open
//! file descriptors of the daemon, the gateway and every agent.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::analyze::{classify, Class};
use super::load::Entry;
use super::SoakRun;
use crate::chart::{
    self, draw_legend, draw_line, label_font, title_font, Dash, DrawError, LegendEntry, LineStyle, PALETTE,
};

/// Width of a time bin of the request rates, seconds.
pub const BIN_S: f64 = 5.0;
const PANEL_H: u32 = 220;
const FAULT_FILL: RGBColor = RGBColor(0xf2, 0xe6, 0xc8);

/// One curve of a panel.
struct Curve {
    label: String,
    style: LineStyle,
    points: Vec<(f64, f64)>,
}

/// Per bin of [`BIN_S`]: (bin middle, count / BIN_S) of the records `keep` selects, by send time.
fn rate(run: &SoakRun, t_max: f64, keep: impl Fn(&super::load::Rec) -> bool) -> Vec<(f64, f64)> {
    let n = (t_max / BIN_S).ceil() as usize + 1;
    let mut bins = vec![0u64; n];
    for r in run.records.iter().filter(|r| keep(r)) {
        let b = (r.sent_s.max(0.0) / BIN_S) as usize;
        if b < n {
            bins[b] += 1;
        }
    }
    bins.iter().enumerate().map(|(i, c)| ((i as f64 + 0.5) * BIN_S, *c as f64 / BIN_S)).collect()
}

/// The timeline as SVG.
pub fn timeline_svg(run: &SoakRun) -> Result<String, DrawError> {
    let t_max = run.samples.last().map(|s| s.t_s).unwrap_or(run.plan.duration_s).max(run.plan.duration_s);
    let mut requests = request_curves(run, t_max);
    let mut inflight = inflight_curves(run);
    if run.split.tc_lanes == 0 {
        requests.retain(|c| !c.label.contains("TC"));
        inflight.retain(|c| !c.label.contains("TC"));
    }
    let rss = per_role(run, |p| p.rss_kb as f64 / 1024.0);
    let fds = per_role(run, |p| p.fds as f64);
    let panels = [
        ("requests and failures per second (5 s bins)", "per second", requests),
        ("kernel in-flight count vs open connections (every 2 s)", "connections", inflight),
        ("resident memory", "RSS, MiB", rss),
        ("open file descriptors", "fds", fds),
    ];
    draw(run, t_max, &panels)
}

/// Colour `c` of the palette, dashed `d`.
fn style(c: usize, d: Dash) -> LineStyle {
    LineStyle::new(PALETTE[c], d)
}

/// Requests sent per second by entry point, and failures per second by class.
fn request_curves(run: &SoakRun, t_max: f64) -> Vec<Curve> {
    vec![
        Curve {
            label: "sent, socket ABI".into(),
            style: style(0, Dash::Solid),
            points: rate(run, t_max, |r| r.entry == Entry::Abi),
        },
        Curve {
            label: "sent, front door".into(),
            style: style(9, Dash::Long),
            points: rate(run, t_max, |r| r.entry == Entry::FrontDoor),
        },
        Curve {
            label: "sent, TC (remote clients)".into(),
            style: style(6, Dash::Short),
            points: rate(run, t_max, |r| r.entry == Entry::Tc),
        },
        Curve {
            label: "failed, a healthy backend could have served".into(),
            style: style(3, Dash::Solid),
            points: rate(run, t_max, |r| !r.ok && classify(r, &run.events) == Class::Avoidable),
        },
        Curve {
            label: "failed, met a dead server".into(),
            style: style(1, Dash::Short),
            points: rate(run, t_max, |r| !r.ok && classify(r, &run.events) == Class::DeadServer),
        },
    ]
}

/// The kernel's in-flight count against the open connections (and the TC clients' share).
fn inflight_curves(run: &SoakRun) -> Vec<Curve> {
    vec![
        Curve {
            label: "kernel in-flight count".into(),
            style: style(4, Dash::Solid),
            points: run.samples.iter().filter_map(|s| Some((s.t_s, s.inflight_before? as f64))).collect(),
        },
        Curve {
            label: "open connections to backends".into(),
            style: style(2, Dash::Short),
            points: run.samples.iter().map(|s| (s.t_s, s.open as f64)).collect(),
        },
        Curve {
            label: "of which the TC clients'".into(),
            style: style(6, Dash::Long),
            points: run.samples.iter().filter_map(|s| Some((s.t_s, s.open_tc? as f64))).collect(),
        },
    ]
}

/// One curve of `f` per process role sampled (in the roles' order; the agents dashed).
fn per_role(run: &SoakRun, f: fn(&super::sample::ProcSample) -> f64) -> Vec<Curve> {
    let roles: Vec<String> = {
        let mut r: Vec<String> = run.samples.iter().flat_map(|s| s.procs.iter().map(|p| p.role.clone())).collect();
        r.sort();
        r.dedup();
        r
    };
    roles
        .iter()
        .enumerate()
        .map(|(k, role)| Curve {
            label: role.clone(),
            style: style(k % PALETTE.len(), if role.starts_with("agent") { Dash::Long } else { Dash::Solid }),
            points: run
                .samples
                .iter()
                .filter_map(|s| s.procs.iter().find(|p| &p.role == role).map(|p| (s.t_s, f(p))))
                .collect(),
        })
        .collect()
}

fn draw(run: &SoakRun, t_max: f64, panels: &[(&str, &str, Vec<Curve>); 4]) -> Result<String, DrawError> {
    let cw = 820;
    let legends: Vec<Vec<LegendEntry>> = panels
        .iter()
        .map(|(_, _, cs)| cs.iter().map(|c| LegendEntry { label: c.label.clone(), style: c.style }).collect())
        .collect();
    let lw = legends.iter().map(|l| chart::legend_width("", l)).max().unwrap_or(200);
    let h = 50 + PANEL_H * panels.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (cw + lw, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, rest) = root.split_vertically(50);
        let title = format!(
            "ailb chaos soak: {:.0} min at load {:.2}, faults shaded",
            run.plan.duration_s / 60.0,
            run.speed / 20.0
        );
        top.draw(&Text::new(title, (12, 12), title_font()))?;
        let rows = rest.split_evenly((panels.len(), 1));
        for (k, ((caption, y_desc, curves), row)) in panels.iter().zip(&rows).enumerate() {
            let (left, right) = row.split_horizontally(cw);
            panel(&left, run, t_max, caption, y_desc, curves, k + 1 == panels.len())?;
            draw_legend(&right.margin(20, 0, 0, 0), "", &legends[k])?;
        }
        root.present()?;
    }
    Ok(svg)
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    run: &SoakRun,
    t_max: f64,
    caption: &str,
    y_desc: &str,
    curves: &[Curve],
    last: bool,
) -> Result<(), DrawError> {
    let y_max = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.12;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, chart::panel_font())
        .margin_left(12)
        .margin_right(12)
        .x_label_area_size(if last { 40 } else { 22 })
        .y_label_area_size(58)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart::time_panel_mesh(&mut chart, y_desc, 4, 12, last.then_some("time since the load started, s"))?;
    let plot = chart.plotting_area();
    for e in &run.events {
        let end = e.recovered_s.unwrap_or(e.end_s).max(e.start_s + 1.0);
        plot.draw(&Rectangle::new([(e.start_s, 0.0), (end, y_max)], FAULT_FILL.filled()))?;
        plot.draw(&Text::new(e.fault.label().to_string(), (e.start_s, y_max * 0.98), label_font()))?;
    }
    for c in curves {
        draw_line(plot, &c.points, c.style)?;
    }
    Ok(())
}
