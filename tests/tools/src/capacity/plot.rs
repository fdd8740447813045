//! The plot of `ailb-fleet-model`, drawn with `plotters` into SVG: every placement's E2E P95
//! against the offered load, at N and at 2 x N requests.

use ailb_sim::fleet_model::Placement;
use plotters::prelude::*;

use crate::chart::{
    self, decades, draw_legend, draw_line, label_font, legend_height, legend_width, padded, title_font, Dash,
    DrawError, LegendEntry, LineStyle, Marker, PixelRect, Plot, AXIS, PALETTE,
};

/// One placement's E2E P95 (simulated seconds) per load, at N and at 2 x N requests.
pub struct Curve {
    pub placement: Placement,
    pub label: String,
    pub short: Vec<f64>,
    pub long: Vec<f64>,
}

/// The look of `placement`'s curves: its own colour and marker (round robin, least connections
/// and ailb in the colours the comparison gives the same policies), solid; the 2 x N run's
/// curve is the same with long dashes.
pub fn style(placement: Placement) -> LineStyle {
    let (color, marker) = match placement {
        Placement::RoundRobin => (3, Marker::Circle),
        Placement::LeastConnections => (5, Marker::Square),
        Placement::Ailb { .. } => (0, Marker::Triangle),
        Placement::AilbPrefix { .. } => (1, Marker::Triangle),
        Placement::EarliestFinish => (4, Marker::Cross),
        Placement::CacheOracle => (2, Marker::Diamond),
        Placement::SmgCacheAware { .. } => (6, Marker::Square),
    };
    LineStyle { color: PALETTE[color], dash: Dash::Solid, marker }
}

/// E2E P95 against offered load, log scale: solid at N requests, dashed at 2 x N. Where the two
/// part, the placement is past what the fleet (or the placement) can carry.
pub fn svg(loads: &[f64], curves: &[Curve], n: usize) -> Result<String, DrawError> {
    Ok(plot(loads, curves, n)?.svg)
}

/// The samples of the two run lengths in the legend.
const LENGTH: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// [`svg`], with where its plotting area and legend lie.
pub fn plot(loads: &[f64], curves: &[Curve], n: usize) -> Result<Plot, DrawError> {
    let mut entries: Vec<LegendEntry> =
        curves.iter().map(|c| LegendEntry { label: c.label.clone(), style: style(c.placement) }).collect();
    entries.push(LegendEntry { label: format!("{n} requests"), style: LineStyle::new(LENGTH, Dash::Solid) });
    entries.push(LegendEntry { label: format!("{} requests", 2 * n), style: LineStyle::new(LENGTH, Dash::Long) });
    let (cw, lw) = (680, legend_width("placement, run length", &entries));
    let h = 460.max(legend_height(entries.len()) + 60);
    let y = decades(curves.iter().flat_map(|c| c.short.iter().chain(&c.long)).copied());
    let (lmin, lmax) = loads.iter().fold((f64::MAX, f64::MIN), |(lo, hi), l| (lo.min(*l), hi.max(*l)));
    let mut svg = String::new();
    let (area, legend) = {
        let root = SVGBackend::with_string(&mut svg, (cw + lw, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(cw);
        let mut chart = ChartBuilder::on(&left)
            .caption("E2E P95 per placement against the offered load (fleet model)", title_font())
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(padded(lmin.min(lmax), lmax.max(lmin)), y.log_scale())?;
        chart
            .configure_mesh()
            .x_desc("offered load, x the trace's arrival rate")
            .y_desc("E2E P95, simulated s (log scale)")
            .x_label_formatter(&|v| format!("{v:.2}"))
            .y_label_formatter(&|v| chart::log_tick(v))
            .axis_style(AXIS)
            .max_light_lines(0)
            .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
            .label_style(label_font())
            .axis_desc_style(label_font())
            .draw()?;
        let plot = chart.plotting_area();
        for c in curves {
            let s = style(c.placement);
            let pts = |v: &[f64]| loads.iter().copied().zip(v.iter().copied()).collect::<Vec<_>>();
            draw_line(plot, &pts(&c.long), LineStyle { dash: Dash::Long, marker: Marker::None, ..s })?;
            draw_line(plot, &pts(&c.short), s)?;
        }
        let area = PixelRect::of(plot);
        let legend = draw_legend(&right.margin(40, 0, 0, 0), "placement, run length", &entries)?;
        root.present()?;
        (area, legend)
    };
    Ok(Plot { svg, plotting_areas: vec![area], legend })
}
