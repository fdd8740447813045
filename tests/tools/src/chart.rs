//! What every plot of the tools shares, drawn with `plotters` into SVG: the palette, the line
//! styles (a colour, a dash pattern and a marker), and a legend drawn in its own column beside
//! the plotting area, so that it never covers a curve.

use std::ops::Range;

use plotters::coord::{CoordTranslate, Shift};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The drawing errors of the SVG backend (it writes into a `String`, so in practice only a
/// layout that does not fit).
pub type DrawError = DrawingAreaErrorKind<std::io::Error>;

/// Tableau 10, a qualitative palette whose colours stay apart on white and for most colour
/// vision deficiencies; with five dark additions for plots of more than ten lines (the fleet
/// comparison draws fifteen policies, each in its own colour).
pub const PALETTE: [RGBColor; 17] = [
    RGBColor(0x1f, 0x77, 0xb4), // blue
    RGBColor(0xff, 0x7f, 0x0e), // orange
    RGBColor(0x2c, 0xa0, 0x2c), // green
    RGBColor(0xd6, 0x27, 0x28), // red
    RGBColor(0x94, 0x67, 0xbd), // purple
    RGBColor(0x8c, 0x56, 0x4b), // brown
    RGBColor(0xe3, 0x77, 0xc2), // pink
    RGBColor(0x7f, 0x7f, 0x7f), // grey
    RGBColor(0xbc, 0xbd, 0x22), // olive
    RGBColor(0x17, 0xbe, 0xcf), // cyan
    RGBColor(0x00, 0x00, 0x00), // black
    RGBColor(0x39, 0x3b, 0x79), // indigo
    RGBColor(0x1b, 0x5e, 0x20), // dark green
    RGBColor(0x80, 0x00, 0x00), // maroon
    RGBColor(0xb8, 0x86, 0x0b), // dark goldenrod
    RGBColor(0x00, 0x80, 0x80), // teal
    RGBColor(0xd9, 0x5f, 0x02), // dark orange
];

/// The axes and frames: dark grey, so that no curve (the palette's black included) is taken
/// for an axis.
pub const AXIS: RGBColor = RGBColor(0x44, 0x44, 0x44);
/// The typeface: the SVG names it and the viewer picks the font (no font library here).
pub const FONT: &str = "sans-serif";
/// The SVG backend writes a font size of `size / 1.24`: this many px asked give 13 px written.
const PX13: f64 = 13.0 * 1.24;
/// And these 15 px.
const PX15: f64 = 15.0 * 1.24;

/// How a line is stroked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dash {
    Solid,
    /// 10 px dashes, 4 px gaps.
    Long,
    /// 4 px dashes, 4 px gaps.
    Short,
    /// 2 px dots, 4 px apart.
    Dot,
}

impl Dash {
    /// (dash, gap) in pixels; `None` when solid.
    pub fn pattern(self) -> Option<(u32, u32)> {
        match self {
            Self::Solid => None,
            Self::Long => Some((10, 4)),
            Self::Short => Some((4, 4)),
            Self::Dot => Some((2, 4)),
        }
    }
}

/// A mark drawn at a data point (the fleet model's few points per line), or in the legend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    None,
    Circle,
    Square,
    Triangle,
    Cross,
    Diamond,
}

/// One curve's look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LineStyle {
    pub color: RGBColor,
    pub dash: Dash,
    pub marker: Marker,
}

impl LineStyle {
    pub const fn new(color: RGBColor, dash: Dash) -> Self {
        LineStyle { color, dash, marker: Marker::None }
    }
    /// `#rrggbb`, as the SVG writes the colour (upper case hex).
    pub fn hex(self) -> String {
        let RGBColor(r, g, b) = self.color;
        format!("#{r:02X}{g:02X}{b:02X}")
    }
}

/// Stroke width of the curves, px.
pub const STROKE: u32 = 2;

/// Draws the path through `points` (coordinates of `area`) in `style`: the line in its dash
/// pattern, and its marker at every point.
pub fn draw_line<DB, CT>(area: &DrawingArea<DB, CT>, points: &[CT::From], style: LineStyle) -> Result<(), DrawError>
where
    DB: DrawingBackend<ErrorType = std::io::Error>,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    let stroke = style.color.stroke_width(STROKE);
    match style.dash.pattern() {
        None => area.draw(&PathElement::new(points.to_vec(), stroke))?,
        Some((dash, gap)) => area.draw(&DashedPathElement::new(points.iter().cloned(), dash, gap, stroke))?,
    }
    for p in points {
        draw_marker(area, p.clone(), style)?;
    }
    Ok(())
}

fn draw_marker<DB, CT>(area: &DrawingArea<DB, CT>, at: CT::From, style: LineStyle) -> Result<(), DrawError>
where
    DB: DrawingBackend<ErrorType = std::io::Error>,
    CT: CoordTranslate,
    CT::From: Clone + 'static,
{
    let fill = style.color.filled();
    match style.marker {
        Marker::None => Ok(()),
        Marker::Circle => area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), 4, fill))),
        Marker::Square => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], fill))),
        Marker::Triangle => area.draw(&(EmptyElement::at(at) + TriangleMarker::new((0, 0), 5, fill))),
        Marker::Cross => area.draw(&(EmptyElement::at(at) + Cross::new((0, 0), 4, style.color.stroke_width(STROKE)))),
        Marker::Diamond => {
            area.draw(&(EmptyElement::at(at) + Polygon::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0)], fill)))
        }
    }
}

/// A pixel rectangle of the whole image: `x` and `y` are half-open ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PixelRect {
    pub x: Range<i32>,
    pub y: Range<i32>,
}

impl PixelRect {
    pub fn of<DB: DrawingBackend, CT: CoordTranslate>(area: &DrawingArea<DB, CT>) -> Self {
        let (x, y) = area.get_pixel_range();
        PixelRect { x, y }
    }
    pub fn overlaps(&self, o: &PixelRect) -> bool {
        self.x.start < o.x.end && o.x.start < self.x.end && self.y.start < o.y.end && o.y.start < self.y.end
    }
    pub fn contains(&self, (x, y): (f64, f64)) -> bool {
        (self.x.start as f64..=self.x.end as f64).contains(&x) && (self.y.start as f64..=self.y.end as f64).contains(&y)
    }
}

/// A drawn plot and where its parts lie (pixels of the whole image).
pub struct Plot {
    pub svg: String,
    /// The plotting areas (one per panel), where the curves are.
    pub plotting_areas: Vec<PixelRect>,
    /// The legend's box.
    pub legend: PixelRect,
}

/// One line of a legend: a sample of the style, and its label.
pub struct LegendEntry {
    pub label: String,
    pub style: LineStyle,
}

/// The legend's font size and the height of one of its lines, px.
const LEGEND_FONT: f64 = 13.0;
const LEGEND_LINE: i32 = 20;
/// The length of an entry's sample line, px.
const SAMPLE: i32 = 34;

/// The width a legend of `entries` under `title` needs, px: the SVG viewer sets the text, so
/// this allows a generous 0.58 em per character.
pub fn legend_width(title: &str, entries: &[LegendEntry]) -> u32 {
    let chars = entries.iter().map(|e| e.label.chars().count() as f64 * 0.58).fold(0.0, f64::max);
    let per_char = LEGEND_FONT;
    let w = (chars * per_char + (SAMPLE + 24) as f64).max(title.chars().count() as f64 * 0.58 * per_char + 16.0);
    w.ceil() as u32 + 16
}

/// The height of a legend of `n` entries under a title, px.
pub fn legend_height(n: usize) -> u32 {
    (LEGEND_LINE * (n as i32 + 1) + 14) as u32
}

/// Draws the legend in a framed box at the top left of `area` (the legend column, beside the
/// plotting area); returns the box.
pub fn draw_legend<DB>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    entries: &[LegendEntry],
) -> Result<PixelRect, DrawError>
where
    DB: DrawingBackend<ErrorType = std::io::Error>,
{
    let (w, h) = (legend_width(title, entries) as i32 - 8, legend_height(entries.len()) as i32);
    let (x0, y0) = (8, 8);
    area.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], AXIS.stroke_width(1)))?;
    let bold = (FONT, PX13).into_font().style(FontStyle::Bold).color(&BLACK);
    area.draw(&Text::new(title.to_string(), (x0 + 8, y0 + 8), bold))?;
    let font = (FONT, PX13).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for (k, e) in entries.iter().enumerate() {
        let y = y0 + 8 + LEGEND_LINE * (k as i32 + 1) + LEGEND_FONT as i32 / 2;
        let sample = [(x0 + 8, y), (x0 + 8 + SAMPLE / 2, y), (x0 + 8 + SAMPLE, y)];
        draw_line(area, &sample, LineStyle { marker: Marker::None, ..e.style })?;
        draw_marker(area, (x0 + 8 + SAMPLE / 2, y), e.style)?;
        area.draw(&Text::new(e.label.clone(), (x0 + SAMPLE + 16, y), font.clone()))?;
    }
    let (ax, ay) = area.get_base_pixel();
    Ok(PixelRect { x: ax + x0..ax + x0 + w, y: ay + y0..ay + y0 + h })
}

/// The labels' and axis descriptions' font.
pub fn label_font() -> TextStyle<'static> {
    (FONT, PX13).into_font().color(&BLACK)
}

/// A chart's title font.
pub fn title_font() -> TextStyle<'static> {
    (FONT, PX15).into_font().style(FontStyle::Bold).color(&BLACK)
}

/// A panel's title font.
pub fn panel_font() -> TextStyle<'static> {
    (FONT, PX13).into_font().style(FontStyle::Bold).color(&BLACK)
}

/// The value range `lo..hi` padded so that no point sits on the frame.
pub fn padded(lo: f64, hi: f64) -> Range<f64> {
    let span = if hi > lo { hi - lo } else { 1.0 };
    lo - span * 0.03..hi + span * 0.03
}

/// Decades of a log axis around `values` (positive ones; 1..10 when there are none).
pub fn decades(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) =
        values.filter(|v| *v > 0.0 && v.is_finite()).fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 1.0..10.0;
    }
    let (lo, hi) = (10f64.powf(lo.log10().floor()), 10f64.powf(hi.log10().ceil()));
    lo..if hi > lo { hi } else { lo * 10.0 }
}

/// Tick labels of a log axis: 1, 10, 100, 1000, 10k, ..., and 0.1, 0.01 below 1.
pub fn log_tick(v: &f64) -> String {
    if *v >= 10_000.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}

/// The mesh of one time-series panel of a stacked plot: `y_desc` with `y_labels` labels, whole
/// numbers on both axes, light grid lines only at the labels, and `x_desc` (time, s) on the
/// bottom panel only (`last`).
pub fn time_panel_mesh<DB: DrawingBackend>(
    chart: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    y_desc: &str,
    y_labels: usize,
    x_labels: usize,
    x_desc: Option<&str>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut mesh = chart.configure_mesh();
    mesh.y_desc(y_desc)
        .y_labels(y_labels)
        .x_labels(x_labels)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_style(AXIS)
        .max_light_lines(0)
        .bold_line_style(RGBColor(0xe4, 0xe4, 0xe4))
        .label_style(label_font())
        .axis_desc_style(label_font());
    if let Some(x) = x_desc {
        mesh.x_desc(x);
    }
    mesh.draw()
}
