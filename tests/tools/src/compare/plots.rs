//! The comparison's plots, drawn with `plotters` into SVG: the E2E latency CDFs of every
//! policy, and every GPU's utilisation over time per policy. Each policy keeps one colour and
//! dash pattern in every plot and every run ([`style`]); legends sit in a column of their own
//! beside the plotting area.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::outcome::Outcome;
use super::policy::Policy;
pub use crate::chart::Plot;
use crate::chart::{
    self, draw_legend, draw_line, label_font, legend_height, legend_width, padded, title_font, Dash, DrawError,
    LegendEntry, LineStyle, PixelRect, AXIS, PALETTE,
};

/// The look of `policy`'s curve: fixed per policy, so that a policy is drawn the same in every
/// plot whichever others ran. ailb's rows are solid (socket ABI) or long dashes (front door),
/// the L4 baselines short dashes, the L7 routers long dashes or dots (the two darkest colours,
/// indigo and black, one each, and SMG's rows the three dark colours after them); every colour
/// differs.
pub fn style(policy: Policy) -> LineStyle {
    let (color, dash) = match policy {
        Policy::Ailb => (0, Dash::Solid),
        Policy::AilbStatic => (1, Dash::Solid),
        Policy::AilbGateway => (9, Dash::Long),
        Policy::AilbPrefix => (15, Dash::Solid),
        Policy::AilbGatewayPrefix => (16, Dash::Long),
        Policy::AilbGatewayAdmission => (9, Dash::Dot),
        Policy::AilbStaticGateway => (6, Dash::Long),
        Policy::RoundRobin => (3, Dash::Short),
        Policy::Random => (8, Dash::Short),
        Policy::LeastConn => (5, Dash::Short),
        Policy::Nginx => (7, Dash::Long),
        Policy::SglangCacheAware => (2, Dash::Dot),
        Policy::SglangRoundRobin => (11, Dash::Long),
        Policy::SmgCacheAware => (12, Dash::Dot),
        Policy::SmgPrefixHash => (13, Dash::Dot),
        Policy::SmgLeastLoad => (14, Dash::Long),
        Policy::SmgKvEvents => (12, Dash::Solid),
        Policy::VllmCacheAware => (4, Dash::Dot),
        Policy::VllmConsistentHash => (10, Dash::Dot),
        Policy::AilbGatewayPrecise => (0, Dash::Long),
        Policy::AilbGatewayApprox => (1, Dash::Long),
        Policy::TenantPinned => (7, Dash::Short),
    };
    LineStyle::new(PALETTE[color], dash)
}

/// The E2E latency CDF of every policy, as SVG.
pub fn cdf_svg(outs: &[Outcome]) -> Result<String, DrawError> {
    Ok(cdf_plot(outs)?.svg)
}

/// Below this ratio of the slowest to the fastest request the latency axis is linear.
const LOG_FROM_RATIO: f64 = 20.0;

/// The E2E latency CDF of every policy: x the latency of each successful request (log scale
/// when they span more than a decade or so), y the share of all requests served by then, so a
/// policy with failures ends below 100 %.
pub fn cdf_plot(outs: &[Outcome]) -> Result<Plot, DrawError> {
    let mut entries: Vec<LegendEntry> =
        outs.iter().map(|o| LegendEntry { label: o.policy.title().to_string(), style: style(o.policy) }).collect();
    entries.push(LegendEntry { label: "95 % of requests".to_string(), style: P95 });
    let (cw, lw) = (720, legend_width("policy", &entries));
    let h = 480.max(legend_height(entries.len()) + 60);
    let mut svg = String::new();
    let (areas, legend) = {
        let root = SVGBackend::with_string(&mut svg, (cw + lw, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, right) = root.split_horizontally(cw);
        let all = || outs.iter().flat_map(|o| o.e2e_sorted.iter().copied());
        let (lo, hi) = all().filter(|v| *v > 0.0).fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let area = if lo < hi && hi / lo > LOG_FROM_RATIO {
            let x = lo / 1.25..hi * 1.25;
            cdf_chart(&left, x.log_scale(), "end-to-end latency of each successful request, ms (log scale)", outs)?
        } else {
            let x = padded(0.0, hi.max(1.0));
            cdf_chart(&left, x.start.max(0.0)..x.end, "end-to-end latency of each successful request, ms", outs)?
        };
        let legend = draw_legend(&right.margin(40, 0, 0, 0), "policy", &entries)?;
        root.present()?;
        (vec![area], legend)
    };
    Ok(Plot { svg, plotting_areas: areas, legend })
}

/// The line at 95 % of the requests.
const P95: LineStyle = LineStyle::new(RGBColor(0xaa, 0xaa, 0xaa), Dash::Short);

/// The CDF chart in `area` over the latency axis `x`; returns its plotting area.
fn cdf_chart<X>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    x: X,
    x_desc: &str,
    outs: &[Outcome],
) -> Result<PixelRect, DrawError>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption("E2E latency CDF per policy (share of all requests served within x)", title_font())
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(58)
        .build_cartesian_2d(x, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("share of all requests, %")
        .x_label_formatter(&|v| chart::log_tick(v))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .y_labels(11)
        .axis_style(AXIS)
        .max_light_lines(0)
        .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()?;
    let plot = chart.plotting_area();
    let (x0, x1) = (plot.get_x_range().start, plot.get_x_range().end);
    // The P95 line, light, under the curves: where a policy's curve crosses it is its P95.
    draw_line(plot, &[(x0, 95.0), (x1, 95.0)], P95)?;
    for o in outs {
        let n = o.requests().max(1) as f64;
        let points: Vec<(f64, f64)> =
            o.e2e_sorted.iter().enumerate().map(|(i, v)| (*v, (i + 1) as f64 * 100.0 / n)).collect();
        draw_line(plot, &points, style(o.policy))?;
    }
    Ok(PixelRect::of(plot))
}

/// The look of GPU `g` in the utilisation plot: its own colour; A100s solid, the others dashed.
fn gpu_style(g: usize, profile: &str) -> LineStyle {
    LineStyle::new(PALETTE[g % PALETTE.len()], if profile.starts_with("a100") { Dash::Solid } else { Dash::Long })
}

/// The last arrival's line in every panel.
const LAST_ARRIVAL: LineStyle = LineStyle::new(AXIS, Dash::Short);

/// Every GPU's sampled utilisation over time, one panel per policy (same axes), with the
/// spread of the per-GPU means in each panel's title, as SVG.
pub fn util_svg(outs: &[Outcome]) -> Result<String, DrawError> {
    Ok(util_plot(outs)?.svg)
}

/// Height of one policy's panel, px.
const PANEL_H: u32 = 190;

/// [`util_svg`], with where its panels and legend lie.
pub fn util_plot(outs: &[Outcome]) -> Result<Plot, DrawError> {
    let mut entries: Vec<LegendEntry> = outs
        .first()
        .map(|o| &o.gpus[..])
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(g, gpu)| LegendEntry {
            label: format!("{} {}", gpu.host(), gpu.profile),
            style: gpu_style(g, gpu.profile),
        })
        .collect();
    entries.push(LegendEntry { label: "last arrival".to_string(), style: LAST_ARRIVAL });
    let (cw, lw) = (760, legend_width("GPU", &entries));
    let h = (40 + PANEL_H * outs.len().max(1) as u32).max(legend_height(entries.len()) + 60);
    let t_max = outs.iter().filter_map(|o| o.util_series.last().map(|r| r.0)).fold(1.0, f64::max);
    let mut svg = String::new();
    let (areas, legend) = {
        let root = SVGBackend::with_string(&mut svg, (cw + lw, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, rest) = root.split_vertically(40);
        top.draw(&Text::new("GPU utilisation over time per policy (sampled every 250 ms)", (12, 12), title_font()))?;
        let (left, right) = rest.split_horizontally(cw);
        let panels = left.split_evenly((outs.len().max(1), 1));
        let mut areas = Vec::new();
        for (k, (o, panel)) in outs.iter().zip(&panels).enumerate() {
            areas.push(util_panel(panel, o, t_max, k + 1 == outs.len())?);
        }
        let legend = draw_legend(&right, "GPU", &entries)?;
        root.present()?;
        (areas, legend)
    };
    Ok(Plot { svg, plotting_areas: areas, legend })
}

/// One policy's panel: every GPU's utilisation over the replay's seconds.
fn util_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    o: &Outcome,
    t_max: f64,
    last: bool,
) -> Result<PixelRect, DrawError> {
    let caption = format!(
        "{}: mean {:.0} %, spread of the per-GPU means {:.0} points",
        o.policy.title(),
        o.util_mean() * 100.0,
        o.util_spread() * 100.0
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, chart::panel_font())
        .margin_left(12)
        .margin_right(12)
        .x_label_area_size(if last { 40 } else { 22 })
        .y_label_area_size(58)
        .build_cartesian_2d(0.0..t_max, 0.0..100.0)?;
    chart::time_panel_mesh(&mut chart, "utilisation, %", 3, 8, last.then_some("time since the replay started, s"))?;
    let plot = chart.plotting_area();
    let at = o.window_s.min(t_max);
    draw_line(plot, &[(at, 0.0), (at, 100.0)], LAST_ARRIVAL)?;
    for (g, gpu) in o.gpus.iter().enumerate() {
        let points: Vec<(f64, f64)> = o
            .util_series
            .iter()
            .filter_map(|(t, row)| row.get(g).filter(|u| u.is_finite()).map(|u| (*t, u.clamp(0.0, 1.0) * 100.0)))
            .collect();
        draw_line(plot, &points, gpu_style(g, gpu.profile))?;
    }
    Ok(PixelRect::of(plot))
}
