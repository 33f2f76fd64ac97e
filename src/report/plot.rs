//! Plot specifications (data only, part of the [`Report`](super::Report)) and their rendering
//! with plotters to SVG and PNG.
//!
//! Rendering uses an embedded DejaVu Sans font registered with plotters' `ab_glyph` backend,
//! so it needs no system fonts. Builders for the standard dpaudit plots: [`per_step_mu`],
//! [`cumulative`], [`epsilon_vs_axis`], [`tradeoff`], [`epsilon_vs_delta`].

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};
use serde::{Deserialize, Serialize};

use super::num;
use crate::accountants::{AccountantKind, BoundKind};
use crate::error::{Error, Result};

/// The widest log axis drawn, in decades (beyond it a plot is refused with a clear error).
pub(crate) const MAX_LOG_DECADES: f64 = 60.0;

/// Width and height (pixels) of rendered plots.
pub(crate) const SIZE: (u32, u32) = (800, 480);

/// A line plot: two labelled axes and a list of series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plot {
    /// Stable identifier, used in file names (`plot-<id>.svg`): `[a-z0-9_-]+`.
    pub id: String,
    /// Title shown above the plot.
    pub title: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis.
    pub y: Axis,
    /// The lines.
    pub series: Vec<Series>,
    #[serde(default)]
    /// Where the legend goes.
    pub legend: LegendPosition,
    /// Shown under the plot (what is drawn and how to read it).
    #[serde(default)]
    pub caption: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
/// A plot axis: label, unit and scale.
pub struct Axis {
    /// Axis label.
    pub label: String,
    /// Unit shown in brackets after the label (`""` for dimensionless quantities is allowed but
    /// prefer a word such as `nats` or `probability`).
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    /// Linear or logarithmic.
    pub scale: Scale,
}

impl Axis {
    /// An axis; an empty `unit` means none.
    pub fn new(label: &str, unit: &str, scale: Scale) -> Self {
        Axis {
            label: label.to_string(),
            unit: if unit.is_empty() { None } else { Some(unit.to_string()) },
            scale,
        }
    }
    /// `label [unit]`.
    pub fn description(&self) -> String {
        match &self.unit {
            Some(u) if !u.is_empty() => format!("{} [{}]", self.label, u),
            _ => self.label.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
/// Axis scale.
pub enum Scale {
    #[default]
    /// Linear.
    Linear,
    /// Base-10 logarithmic.
    Log,
}

impl Scale {
    /// Log when the positive values span more than two decades.
    pub fn auto<'a>(values: impl IntoIterator<Item = &'a f64>) -> Scale {
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for &v in values {
            if v.is_finite() && v > 0.0 {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        if hi > 0.0 && hi / lo > 100.0 {
            Scale::Log
        } else {
            Scale::Linear
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
/// How a line is drawn.
pub enum LineStyle {
    #[default]
    /// Solid: exact values and upper bounds.
    Solid,
    /// Used for estimates (e.g. the CLT), so they are never mistaken for bounds.
    Dashed,
    /// Used for reference lines (the perfect-privacy diagonal of a trade-off plot, budgets).
    Dotted,
    /// Markers only, no line (single values shown on a curve, e.g. the results at the δ in use).
    Points,
}

impl LineStyle {
    /// Dashed for estimates, solid for exact values and upper bounds.
    pub(crate) fn for_bound(kind: BoundKind) -> Self {
        if kind.is_sound() {
            LineStyle::Solid
        } else {
            LineStyle::Dashed
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
/// Where the legend is placed.
pub enum LegendPosition {
    /// The corner where the lines leave the most room.
    #[default]
    Auto,
    /// Upper right corner.
    UpperRight,
    /// Upper left corner.
    UpperLeft,
    /// Lower right corner.
    LowerRight,
    /// Lower left corner.
    LowerLeft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
/// The shape of a series' markers (filled shapes are drawn first, hollow ones over them, so
/// markers of coinciding series stay visible one inside the other).
pub enum Marker {
    /// Filled circle (the default).
    Circle,
    /// Hollow square.
    Square,
    /// Hollow upward triangle.
    Triangle,
    /// Hollow diamond.
    Diamond,
    /// Cross (×).
    Cross,
    /// Plus (+).
    Plus,
}

impl Marker {
    /// The shapes in the order series groups use them.
    pub const ALL: [Marker; 6] = [
        Marker::Circle,
        Marker::Square,
        Marker::Triangle,
        Marker::Diamond,
        Marker::Cross,
        Marker::Plus,
    ];
}

/// One line of a plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Series {
    /// Name shown in the legend.
    pub name: String,
    #[serde(default)]
    /// Line style.
    pub style: LineStyle,
    /// What kind of number the line shows, when it comes from an accountant.
    #[serde(default)]
    pub bound: Option<BoundKind>,
    /// Draw a marker at every point.
    #[serde(default)]
    pub markers: bool,
    /// Marker shape (default: filled circle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marker: Option<Marker>,
    /// Line and marker colour `#rrggbb` (default: the palette colour of the series' position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colour: Option<String>,
    #[serde(with = "num::vec")]
    /// x coordinates.
    pub x: Vec<f64>,
    #[serde(with = "num::vec")]
    /// y coordinates, one per x.
    pub y: Vec<f64>,
}

impl Series {
    /// A solid series without markers.
    pub fn new(name: impl Into<String>, x: Vec<f64>, y: Vec<f64>) -> Self {
        Series {
            name: name.into(),
            style: LineStyle::Solid,
            bound: None,
            markers: false,
            marker: None,
            colour: None,
            x,
            y,
        }
    }
    /// A series from an accountant: named `pld (upper bound)` etc., dashed if an estimate.
    pub fn for_accountant(acc: AccountantKind, kind: BoundKind, x: Vec<f64>, y: Vec<f64>) -> Self {
        Series {
            name: format!("{} ({})", acc.as_str(), kind.describe()),
            style: LineStyle::for_bound(kind),
            bound: Some(kind),
            markers: false,
            marker: None,
            colour: None,
            x,
            y,
        }
    }
    /// The same series drawn with `style`.
    pub(crate) fn with_style(mut self, style: LineStyle) -> Self {
        self.style = style;
        self
    }
    /// The same series with a marker at every point.
    pub fn with_markers(mut self) -> Self {
        self.markers = true;
        self
    }
    /// The same series with a marker of `shape` at every point.
    pub(crate) fn with_marker(mut self, shape: Marker) -> Self {
        self.markers = true;
        self.marker = Some(shape);
        self
    }
    /// The same series drawn in `rgb`.
    pub(crate) fn with_colour(mut self, (r, g, b): (u8, u8, u8)) -> Self {
        self.colour = Some(format!("#{r:02x}{g:02x}{b:02x}"));
        self
    }
}

impl Plot {
    /// On a log y axis, a value of exactly 0 cannot be placed: the renderer draws it on the
    /// bottom edge as a filled ▼. This says so in the caption when the plot has such a value.
    pub(crate) fn note_zeros(mut self) -> Self {
        let zero = self.y.scale == Scale::Log
            && self
                .series
                .iter()
                .filter(|s| s.style != LineStyle::Dotted)
                .flat_map(|s| s.y.iter())
                .any(|&y| y == 0.0);
        if zero {
            let note = format!(
                "{} = 0, which a log axis cannot show, is drawn on the bottom edge as a filled ▼.",
                self.y.label
            );
            self.caption = Some(match self.caption.take() {
                Some(c) => format!("{c} {note}"),
                None => note,
            });
        }
        self
    }
}

// ---------------------------------------------------------------- builders

/// Per-step μ_t along a trajectory (log y when it spans decades).
pub fn per_step_mu(steps: &[f64], mu: &[f64], x_label: &str, x_unit: &str) -> Plot {
    Plot {
        id: "per_step_mu".into(),
        title: "Per-step privacy cost μ_t".into(),
        x: Axis::new(x_label, x_unit, Scale::Linear),
        y: Axis::new("μ_t", "GDP μ", Scale::auto(mu)),
        series: vec![Series::new("μ_t", steps.to_vec(), mu.to_vec()).with_markers()],
        legend: LegendPosition::Auto,
        caption: Some("Gaussian-DP parameter of each step (larger = less private).".into()),
    }
}

/// Cumulative privacy along a trajectory: one series per quantity (e.g. composed μ, and ε at δ).
pub fn cumulative(steps: &[f64], series: Vec<Series>, y_label: &str, y_unit: &str, x_label: &str) -> Plot {
    let scale = Scale::auto(series.iter().flat_map(|s| s.y.iter()));
    Plot {
        id: "cumulative".into(),
        title: format!("Cumulative {y_label} along the trajectory"),
        x: Axis::new(x_label, "", Scale::Linear),
        y: Axis::new(y_label, y_unit, scale),
        series: series
            .into_iter()
            .map(|mut s| {
                if s.x.is_empty() {
                    s.x = steps.to_vec();
                }
                s
            })
            .collect(),
        legend: LegendPosition::Auto,
        caption: Some("Privacy spent after each step (composition of all steps so far).".into()),
    }
}

/// ε versus a swept axis (σ_min, sampling rate, steps, …): one series per accountant; estimates
/// dashed. Log scales are chosen where the data spans decades.
pub fn epsilon_vs_axis(id: &str, axis_label: &str, axis_unit: &str, delta: f64, series: Vec<Series>) -> Plot {
    let xs = Scale::auto(series.iter().flat_map(|s| s.x.iter()));
    let ys = Scale::auto(series.iter().flat_map(|s| s.y.iter()));
    Plot {
        id: id.to_string(),
        title: format!("ε at δ = {} versus {axis_label}", fmt_delta(delta)),
        x: Axis::new(axis_label, axis_unit, xs),
        y: Axis::new("ε", "nats", ys),
        series,
        legend: LegendPosition::Auto,
        caption: Some("Solid lines are exact values or sound upper bounds; dashed lines are estimates.".into()),
    }
    .note_zeros()
}

/// ε versus δ, one series per accountant (log δ axis); estimates dashed.
pub fn epsilon_vs_delta(series: Vec<Series>) -> Plot {
    let ys = Scale::auto(series.iter().flat_map(|s| s.y.iter()));
    Plot {
        id: "epsilon_vs_delta".into(),
        title: "ε versus δ".into(),
        x: Axis::new("δ", "probability", Scale::Log),
        y: Axis::new("ε", "nats", ys),
        series,
        legend: LegendPosition::Auto,
        caption: Some("Solid lines are exact values or sound upper bounds; dashed lines are estimates.".into()),
    }
    .note_zeros()
}

/// Trade-off curves (type I error α against the smallest type II error β), with the
/// perfect-privacy diagonal β = 1 − α dotted for reference (no test beats a coin flip there).
pub fn tradeoff(mut series: Vec<Series>) -> Plot {
    series
        .push(Series::new("perfect privacy: β = 1 − α", vec![0.0, 1.0], vec![1.0, 0.0]).with_style(LineStyle::Dotted));
    Plot {
        id: "tradeoff".into(),
        title: "Trade-off curve: type I vs type II error".into(),
        x: Axis::new("type I error α", "probability", Scale::Linear),
        y: Axis::new("type II error β", "probability", Scale::Linear),
        series,
        legend: LegendPosition::Auto,
        caption: Some(
            "Any membership test has (α, β) on or above a sound curve; the dotted diagonal is perfect privacy \
(no test does better than guessing), so closer to it is more private. Dashed curves are estimates."
                .into(),
        ),
    }
}

/// α grid for trade-off curves: dense near 0 and 1 where the curves bend.
pub(crate) fn alpha_grid(n: usize) -> Vec<f64> {
    (0..=n)
        .map(|i| {
            let u = i as f64 / n as f64;
            // Smoothstep-like spacing: denser at both ends.
            0.5 - 0.5 * (std::f64::consts::PI * u).cos()
        })
        .collect()
}

/// The μ-GDP trade-off curve G_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2022, Def. 2.5).
pub fn gdp_tradeoff_series(name: &str, mu: f64, kind: BoundKind) -> Series {
    let alpha = alpha_grid(200);
    let beta: Vec<f64> = alpha
        .iter()
        .map(|&a| crate::accountants::gdp::tradeoff(mu, a).clamp(0.0, 1.0))
        .collect();
    Series {
        name: name.to_string(),
        style: LineStyle::for_bound(kind),
        bound: Some(kind),
        markers: false,
        marker: None,
        colour: None,
        x: alpha,
        y: beta,
    }
}

/// The trade-off curve implied by a privacy profile δ(ε) given at finitely many points:
/// β(α) = max(0, max_i max(1 − δ_i − e^{ε_i} α, e^{−ε_i}(1 − δ_i − α))) (Dong, Roth & Su 2022,
/// Prop. 2.12 / 2.13: (ε, δ)-DP for every ε_i is the intersection of the f_{ε_i, δ_i}). When the
/// δ_i are upper bounds, the curve is a sound lower bound on the true trade-off function.
pub(crate) fn profile_tradeoff(eps: &[f64], delta: &[f64], alpha: &[f64]) -> Vec<f64> {
    alpha
        .iter()
        .map(|&a| {
            let mut b = 0.0f64;
            for (&e, &d) in eps.iter().zip(delta) {
                if !(e.is_finite() && d.is_finite()) {
                    continue;
                }
                b = b.max(1.0 - d - e.exp() * a).max((-e).exp() * (1.0 - d - a));
            }
            b.clamp(0.0, 1.0)
        })
        .collect()
}

fn fmt_delta(d: f64) -> String {
    super::num::fmt_num(d)
}

// ---------------------------------------------------------------- rendering

const FONT: &str = "sans-serif";

fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The embedded DejaVu fonts always parse; ignore the impossible error.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// The embedded DejaVu Sans (regular or bold) for the PNG text drawn by [`glyph_coverage`].
fn glyph_font(style: FontStyle) -> Option<&'static ab_glyph::FontRef<'static>> {
    static FONTS: std::sync::OnceLock<[Option<ab_glyph::FontRef<'static>>; 2]> = std::sync::OnceLock::new();
    let fonts = FONTS.get_or_init(|| {
        [
            ab_glyph::FontRef::try_from_slice(dejavu::sans::regular()).ok(),
            ab_glyph::FontRef::try_from_slice(dejavu::sans::bold()).ok(),
        ]
    });
    match style {
        FontStyle::Bold => fonts[1].as_ref().or(fonts[0].as_ref()),
        _ => fonts[0].as_ref(),
    }
}

/// Rasterises `text` at `size` pixels: calls `pixel(x, y, coverage)` for every covered pixel,
/// x from the pen's start, y from the top of the line as plotters lays text out (so the layout
/// box plotters computes still fits). Each glyph's outline is placed at the pen position plus
/// its left side bearing (the outline's own bounds): plotters' ab_glyph text drawing drops the
/// bearing, which moves every glyph left by it, so narrow glyphs with a wide bearing run into
/// their left neighbour ("clt" reads "dt").
pub(crate) fn glyph_coverage(text: &str, size: f64, style: FontStyle, mut pixel: impl FnMut(i32, i32, f32)) {
    use ab_glyph::{Font, ScaleFont};
    let Some(font) = glyph_font(style) else { return };
    let scaled = font.as_scaled(size as f32);
    let mut pen = 0f32;
    let mut prev: Option<ab_glyph::GlyphId> = None;
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = prev {
            pen += scaled.kern(p, id);
        }
        let glyph = id.with_scale_and_position(size as f32, ab_glyph::point(pen, 0.0));
        if let Some(outline) = font.outline_glyph(glyph) {
            let b = outline.px_bounds();
            let (bx, by) = (b.min.x as i32, (size as f32 / 2.0 + b.min.y) as i32);
            outline.draw(|x, y, a| pixel(bx + x as i32, by + y as i32, a));
        }
        pen += scaled.h_advance(id);
        prev = Some(id);
    }
}

/// The bitmap backend with its text drawn by [`glyph_coverage`] (see there why); everything
/// else is the bitmap backend's own.
struct PngBackend<'a>(BitMapBackend<'a>);

impl<'a> DrawingBackend for PngBackend<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;
    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }
    fn ensure_prepared(&mut self) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.ensure_prepared()
    }
    fn present(&mut self) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.present()
    }
    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.fill_polygon(vert, style)
    }
    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        (iw, ih): (u32, u32),
        src: &[u8],
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.blit_bitmap(pos, (iw, ih), src)
    }
    /// plotters' default text drawing (anchor, layout box, rotation) with the glyphs of
    /// [`glyph_coverage`].
    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> std::result::Result<(), DrawingErrorKind<Self::ErrorType>> {
        use plotters::style::text_anchor::{HPos, VPos};
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        let mut result = Ok(());
        glyph_coverage(text, style.size(), style.style(), |x, y, a| {
            if result.is_err() {
                return;
            }
            let (x, y) = trans.transform(x + dx - min_x, y + dy - min_y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                result = self.0.draw_pixel(
                    (x, y),
                    BackendColor {
                        alpha: color.alpha * f64::from(a.min(1.0)),
                        rgb: color.rgb,
                    },
                );
            }
        });
        result
    }
}

/// Colour-blind-friendly palette (Okabe–Ito), in series order.
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
];

/// The palette colour of accountant or series number `i` (without the grey of reference lines).
pub fn palette(i: usize) -> (u8, u8, u8) {
    let c = PALETTE[i % (PALETTE.len() - 1)];
    (c.0, c.1, c.2)
}

fn parse_colour(s: &str) -> Option<RGBColor> {
    let h = s.strip_prefix('#').filter(|h| h.len() == 6)?;
    let v = |i: usize| u8::from_str_radix(&h[i..i + 2], 16).ok();
    Some(RGBColor(v(0)?, v(2)?, v(4)?))
}

fn colour(i: usize, s: &Series) -> RGBColor {
    if let Some(c) = s.colour.as_deref().and_then(parse_colour) {
        return c;
    }
    if s.style == LineStyle::Dotted {
        RGBColor(90, 90, 90)
    } else {
        PALETTE[i % (PALETTE.len() - 1)]
    }
}

/// Renders `plot` as a standalone SVG document.
pub fn render_svg(plot: &Plot) -> Result<String> {
    register_fonts();
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, SIZE).into_drawing_area();
        draw(&root, plot)?;
        root.present().map_err(|e| render_err(plot, e))?;
    }
    Ok(s)
}

/// Renders `plot` as PNG bytes.
pub(crate) fn render_png(plot: &Plot) -> Result<Vec<u8>> {
    register_fonts();
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    {
        let root = PngBackend(BitMapBackend::with_buffer(&mut rgb, SIZE)).into_drawing_area();
        draw(&root, plot)?;
        root.present().map_err(|e| render_err(plot, e))?;
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        // Plots are mostly flat colour: adaptive filtering with the default deflate level makes
        // them several times smaller; the best level saves another ~10 % of bytes at 4–6× the
        // time (≈ 10 ms a plot, a visible part of a short `mia` run).
        enc.set_compression(png::Compression::Default);
        enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
        let mut wr = enc
            .write_header()
            .map_err(|e| Error::input(format!("plot `{}`: PNG encoding failed: {e}", plot.id)))?;
        wr.write_image_data(&rgb)
            .map_err(|e| Error::input(format!("plot `{}`: PNG encoding failed: {e}", plot.id)))?;
    }
    Ok(out)
}

fn render_err(plot: &Plot, e: impl std::fmt::Display) -> Error {
    Error::input(format!("plot `{}` could not be drawn: {e}", plot.id))
}

/// A series' drawable points and, among them, the zeros placed on a log axis' floor.
type Drawn = (Vec<(f64, f64)>, Vec<(f64, f64)>);

/// Points of a series that can be drawn on the given scales, in the series' order. With
/// `zero = Some(y)` (a log y axis whose floor is y), a value of exactly 0 is drawn at y; the
/// second list holds those points (marked ▼).
fn drawable(s: &Series, xs: Scale, ys: Scale, zero: Option<f64>) -> Drawn {
    let mut zeros = Vec::new();
    let pts =
        s.x.iter()
            .zip(&s.y)
            .map(|(&x, &y)| (x, y))
            .filter(|&(x, _)| x.is_finite() && (xs == Scale::Linear || x > 0.0))
            .filter_map(|(x, y)| match zero {
                Some(z) if ys == Scale::Log && y == 0.0 => {
                    zeros.push((x, z));
                    Some((x, z))
                }
                _ => (y.is_finite() && (ys == Scale::Linear || y > 0.0)).then_some((x, y)),
            })
            .collect();
    (pts, zeros)
}

fn range(vals: impl Iterator<Item = f64>, scale: Scale) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return match scale {
            Scale::Linear => (0.0, 1.0),
            Scale::Log => (0.1, 10.0),
        };
    }
    // Padded ends are kept inside the finite f64 range (a padding past ±f64::MAX or below the
    // smallest normal double would hand the plotting library an infinite or zero bound).
    let (big, tiny) = (f64::MAX / 4.0, f64::MIN_POSITIVE);
    match scale {
        Scale::Linear => {
            let (lo, hi) = (lo.clamp(-big, big), hi.clamp(-big, big));
            if hi - lo <= f64::EPSILON * hi.abs().max(1e-300) {
                let pad = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
                ((lo - pad).max(-2.0 * big), (hi + pad).min(2.0 * big))
            } else {
                let pad = (hi - lo) * 0.04;
                ((lo - pad).max(-2.0 * big), (hi + pad).min(2.0 * big))
            }
        }
        Scale::Log => {
            let (l, h) = (lo.max(tiny).log10(), hi.min(big).log10());
            let (a, b) = if h - l < 1e-9 {
                (lo / 3.0, hi * 3.0)
            } else {
                let pad = (h - l) * 0.04;
                (10f64.powf(l - pad), 10f64.powf(h + pad))
            };
            (a.clamp(tiny, big), b.clamp(tiny, big))
        }
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, plot: &Plot) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| render_err(plot, e))?;
    let (xs, ys) = (plot.x.scale, plot.y.scale);
    let pts: Vec<Vec<(f64, f64)>> = plot.series.iter().map(|s| drawable(s, xs, ys, None).0).collect();
    // Reference (dotted) lines do not decide the ranges unless nothing else is drawn.
    let data: Vec<&(f64, f64)> = {
        let main: Vec<&(f64, f64)> = plot
            .series
            .iter()
            .zip(&pts)
            .filter(|(s, _)| s.style != LineStyle::Dotted)
            .flat_map(|(_, p)| p.iter())
            .collect();
        if main.is_empty() {
            pts.iter().flatten().collect()
        } else {
            main
        }
    };
    // Reference lines (budgets) do count on the y axis: a budget drawn on the plot's edge would
    // read as a different value.
    let refs = plot
        .series
        .iter()
        .zip(&pts)
        .filter(|(s, _)| s.style == LineStyle::Dotted)
        .flat_map(|(_, p)| p.iter().map(|q| q.1));
    let (x0, x1) = range(data.iter().map(|p| p.0), xs);
    let (mut y0, y1) = range(data.iter().map(|p| p.1).chain(refs), ys);
    // Exact zeros on a log y axis: drawn at the old floor, the axis extended a little below it.
    let zeros = ys == Scale::Log
        && plot
            .series
            .iter()
            .filter(|s| s.style != LineStyle::Dotted)
            .any(|s| s.x.iter().zip(&s.y).any(|(x, &y)| y == 0.0 && x.is_finite()));
    let zero = zeros.then(|| {
        let floor = y0;
        y0 = (floor / (y1 / floor).powf(0.05)).max(f64::MIN_POSITIVE);
        floor
    });
    let drawn: Vec<Drawn> = plot.series.iter().map(|s| drawable(s, xs, ys, zero)).collect();
    // A log axis over hundreds of decades cannot be labelled (and makes the plotting library
    // generate ticks for every decade): refuse it clearly rather than hang.
    for (name, lo, hi, sc) in [("x", x0, x1, xs), ("y", y0, y1, ys)] {
        let decades = hi.log10() - lo.log10();
        if sc == Scale::Log && decades > MAX_LOG_DECADES {
            return Err(render_err(
                plot,
                format!(
                    "the {name} values span {decades:.0} decades ({lo:e} to {hi:e}); a log axis can show at most \
                     {MAX_LOG_DECADES} (drop the extreme points)"
                ),
            ));
        }
    }
    // Where the legend may not go: the lines and every marker, the ▼ of exact zeros on the
    // floor of a log axis included (single points).
    let mut ink = pts.clone();
    if let Some(floor) = zero {
        for s in plot.series.iter().filter(|s| s.style != LineStyle::Dotted) {
            for (&x, &y) in s.x.iter().zip(&s.y) {
                if y == 0.0 && x.is_finite() {
                    ink.push(vec![(x, floor)]);
                }
            }
        }
    }
    let hits = corner_hits(&ink, (x0, x1, xs), (y0, y1, ys));
    let legend = match plot.legend {
        LegendPosition::Auto => emptiest(&hits),
        // The asked corner unless lines or markers run through it and another is clearer.
        l => {
            let asked = CORNERS.iter().position(|&c| c == l).unwrap_or(0);
            if hits[asked] > 0 && hits.iter().any(|&h| h < hits[asked]) {
                emptiest(&hits)
            } else {
                l
            }
        }
    };
    match (xs, ys) {
        (Scale::Linear, Scale::Linear) => draw_in(root, plot, &drawn, legend, x0..x1, y0..y1),
        (Scale::Log, Scale::Linear) => draw_in(root, plot, &drawn, legend, (x0..x1).log_scale(), y0..y1),
        (Scale::Linear, Scale::Log) => draw_in(root, plot, &drawn, legend, x0..x1, (y0..y1).log_scale()),
        (Scale::Log, Scale::Log) => draw_in(root, plot, &drawn, legend, (x0..x1).log_scale(), (y0..y1).log_scale()),
    }
}

/// The legend corners, in the order ties are broken.
const CORNERS: [LegendPosition; 4] = [
    LegendPosition::UpperRight,
    LegendPosition::UpperLeft,
    LegendPosition::LowerRight,
    LegendPosition::LowerLeft,
];

/// The corner with the fewest hits ([`corner_hits`]; ties: the order of [`CORNERS`]).
fn emptiest(hits: &[usize; 4]) -> LegendPosition {
    CORNERS[(0..4).min_by_key(|&k| hits[k]).unwrap_or(0)]
}

/// How often the drawn lines (sampled densely in plot coordinates) and single points fall in
/// each corner of the plot area a legend takes, in the order of [`CORNERS`].
fn corner_hits(pts: &[Vec<(f64, f64)>], x: (f64, f64, Scale), y: (f64, f64, Scale)) -> [usize; 4] {
    let norm = |v: f64, (lo, hi, sc): (f64, f64, Scale)| match sc {
        Scale::Linear => (v - lo) / (hi - lo),
        Scale::Log => (v.ln() - lo.ln()) / (hi.ln() - lo.ln()),
    };
    let corners = [
        (LegendPosition::UpperRight, true, true),
        (LegendPosition::UpperLeft, false, true),
        (LegendPosition::LowerRight, true, false),
        (LegendPosition::LowerLeft, false, false),
    ];
    let mut hits = [0usize; 4];
    for line in pts {
        let np: Vec<(f64, f64)> = line.iter().map(|&(a, b)| (norm(a, x), norm(b, y))).collect();
        let mut visit = |(u, v): (f64, f64)| {
            for (k, &(_, right, upper)) in corners.iter().enumerate() {
                let in_x = if right { u > 0.55 } else { u < 0.45 };
                let in_y = if upper { v > 0.7 } else { v < 0.3 };
                if in_x && in_y {
                    hits[k] += 1;
                }
            }
        };
        if np.len() == 1 {
            visit(np[0]);
        }
        for w in np.windows(2) {
            for i in 0..20 {
                let t = i as f64 / 20.0;
                visit((w[0].0 + t * (w[1].0 - w[0].0), w[0].1 + t * (w[1].1 - w[0].1)));
            }
        }
    }
    hits
}

fn tick(v: &f64) -> String {
    super::num::fmt_num(*v)
}

/// Two strokes (pixel offsets) and a filled circle's radius.
type MarkerParts = (Vec<(i32, i32)>, Vec<(i32, i32)>, u32);

/// The strokes of a marker of `shape` at `s` pixels (relative to its centre) and the radius
/// of its filled circle (0: none). Circles are filled, the other shapes hollow, so markers of
/// coinciding series stay visible one inside the other.
fn marker_parts(shape: Marker, s: i32) -> MarkerParts {
    match shape {
        Marker::Circle => (vec![], vec![], s as u32),
        // Each shape a little larger than the one before, so that on coinciding lines (drawn in
        // this order) every marker shows around the earlier ones.
        Marker::Square => {
            let s = s + 1;
            (vec![(-s, -s), (s, -s), (s, s), (-s, s), (-s, -s)], vec![], 0)
        }
        Marker::Triangle => {
            let s = s + 3;
            (vec![(0, -s - 1), (s + 1, s), (-s - 1, s), (0, -s - 1)], vec![], 0)
        }
        Marker::Diamond => {
            let s = s + 4;
            (vec![(0, -s), (s, 0), (0, s), (-s, 0), (0, -s)], vec![], 0)
        }
        Marker::Cross => {
            let s = s + 3;
            (vec![(-s, -s), (s, s)], vec![(-s, s), (s, -s)], 0)
        }
        Marker::Plus => {
            let s = s + 5;
            (vec![(-s, 0), (s, 0)], vec![(0, -s), (0, s)], 0)
        }
    }
}

/// The ▼ drawn for a value 0 on the floor of a log axis.
const ZERO_MARK: [(i32, i32); 3] = [(-6, -5), (6, -5), (0, 5)];

fn draw_in<DB, X, Y>(
    root: &DrawingArea<DB, Shift>,
    plot: &Plot,
    drawn: &[Drawn],
    legend: LegendPosition,
    xr: X,
    yr: Y,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| render_err(plot, err);
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, (FONT, 22).into_font())
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(78)
        .build_cartesian_2d(xr, yr)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(plot.x.description())
        .y_desc(plot.y.description())
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(248, 248, 248))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(e)?;
    for (i, (s, (p, zeros))) in plot.series.iter().zip(drawn).enumerate() {
        let c = colour(i, s);
        let style = ShapeStyle {
            color: c.to_rgba(),
            filled: false,
            stroke_width: 2,
        };
        let none = ShapeStyle {
            color: TRANSPARENT,
            filled: false,
            stroke_width: 0,
        };
        let markers = (s.markers && p.len() <= 200) || s.style == LineStyle::Points;
        let size = 3;
        let (m1, m2, radius) = marker_parts(s.marker.unwrap_or(Marker::Circle), size);
        let stroke = |v: &Vec<(i32, i32)>| if v.is_empty() { none } else { style };
        let fill = if radius > 0 { c.filled() } else { none };
        let mark = |q: (f64, f64)| {
            EmptyElement::at(q)
                + PathElement::new(m1.clone(), stroke(&m1))
                + PathElement::new(m2.clone(), stroke(&m2))
                + Circle::new((0, 0), radius, fill)
        };
        let anno = match s.style {
            LineStyle::Solid => chart
                .draw_series(LineSeries::new(p.iter().copied(), style))
                .map_err(e)?,
            LineStyle::Dashed => chart
                .draw_series(DashedLineSeries::new(p.iter().copied(), 9, 6, style))
                .map_err(e)?,
            LineStyle::Dotted => chart
                .draw_series(DashedLineSeries::new(p.iter().copied(), 3, 5, style))
                .map_err(e)?,
            LineStyle::Points => chart.draw_series(p.iter().map(|&q| mark(q))).map_err(e)?,
        };
        let line_style = s.style;
        let (l1, l2, lr) = if markers {
            (m1.clone(), m2.clone(), radius)
        } else {
            (vec![], vec![], 0)
        };
        anno.label(s.name.clone()).legend(move |(x, y)| {
            let segs: Vec<(i32, i32)> = match line_style {
                LineStyle::Solid => vec![(x, y), (x + 24, y)],
                LineStyle::Points => vec![],
                _ => vec![(x, y), (x + 8, y)],
            };
            let segs = match line_style {
                LineStyle::Dotted => vec![(x, y), (x + 4, y)],
                _ => segs,
            };
            let extra: Vec<(i32, i32)> = match line_style {
                LineStyle::Dashed => vec![(x + 14, y), (x + 24, y)],
                LineStyle::Dotted => vec![(x + 10, y), (x + 14, y)],
                _ => vec![],
            };
            // A dotted sample's third dot takes the marker's place (reference lines have none).
            let l1 = match line_style {
                LineStyle::Dotted if l1.is_empty() => vec![(8, 0), (12, 0)],
                _ => l1.clone(),
            };
            let at = |v: &Vec<(i32, i32)>| v.iter().map(|&(a, b)| (x + 12 + a, y + b)).collect::<Vec<_>>();
            let pick = |v: &Vec<(i32, i32)>| if v.is_empty() { none } else { style };
            EmptyElement::at((0, 0))
                + PathElement::new(segs.clone(), pick(&segs))
                + PathElement::new(extra.clone(), pick(&extra))
                + PathElement::new(at(&l1), pick(&l1))
                + PathElement::new(at(&l2), pick(&l2))
                + Circle::new((x + 12, y), lr, if lr > 0 { c.filled() } else { none })
        });
        if markers && s.style != LineStyle::Points {
            chart
                .draw_series(p.iter().filter(|q| !zeros.contains(q)).map(|&q| mark(q)))
                .map_err(e)?;
        }
        if !zeros.is_empty() {
            chart
                .draw_series(
                    zeros
                        .iter()
                        .map(|&q| EmptyElement::at(q) + Polygon::new(ZERO_MARK.to_vec(), c.filled())),
                )
                .map_err(e)?;
        }
    }
    let pos = match legend {
        LegendPosition::UpperRight | LegendPosition::Auto => SeriesLabelPosition::UpperRight,
        LegendPosition::UpperLeft => SeriesLabelPosition::UpperLeft,
        LegendPosition::LowerRight => SeriesLabelPosition::LowerRight,
        LegendPosition::LowerLeft => SeriesLabelPosition::LowerLeft,
    };
    if !plot.series.is_empty() {
        chart
            .configure_series_labels()
            .position(pos)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ▼ of exact zeros on a log axis are ink too: a corner they fill is not "empty",
    /// so a legend asked for there moves (issue 49: the ROC legend sat on the markers).
    #[test]
    fn markers_on_the_floor_keep_the_legend_away() {
        let x = (1e-3, 1.0, Scale::Log);
        let y = (1e-3, 1.0, Scale::Log);
        let diagonal = vec![(1e-3, 1e-3), (1.0, 1.0)];
        let hits = corner_hits(std::slice::from_ref(&diagonal), x, y);
        assert_eq!(hits[2], 0, "lower right is clear of the diagonal: {hits:?}");
        let floor: Vec<Vec<(f64, f64)>> = [0.1, 0.2, 0.5].iter().map(|&f| vec![(f, 1e-3)]).collect();
        let mut ink = vec![diagonal];
        ink.extend(floor);
        let hits = corner_hits(&ink, x, y);
        assert_eq!(hits[2], 3, "{hits:?}");
        assert_ne!(emptiest(&hits), LegendPosition::LowerRight);
    }

    #[test]
    fn profile_tradeoff_of_gdp_profile_stays_below_gdp_curve() {
        // The trade-off from finitely many (ε, δ(ε)) points of μ-GDP is a lower envelope of G_μ.
        let mu = 1.0;
        let eps: Vec<f64> = (0..60).map(|i| i as f64 * 0.1).collect();
        let del: Vec<f64> = eps
            .iter()
            .map(|&e| crate::accountants::gdp::delta_for_epsilon(mu, e))
            .collect();
        let alpha = alpha_grid(50);
        let b = profile_tradeoff(&eps, &del, &alpha);
        for (a, bb) in alpha.iter().zip(&b) {
            let g = crate::accountants::gdp::tradeoff(mu, *a);
            assert!(*bb <= g + 1e-9, "α={a}: {bb} > {g}");
            assert!(*bb >= g - 0.03, "α={a}: {bb} ≪ {g}");
        }
    }

    /// Runs of ink columns (first, last) of `text` drawn at 14 px (the legend size) on a white
    /// bitmap, through the PNG backend (`fixed`) or plotters' own bitmap text drawing.
    fn ink_runs(text: &str, fixed: bool) -> Vec<(usize, usize)> {
        register_fonts();
        let (w, h) = (160usize, 40usize);
        let mut rgb = vec![0u8; w * h * 3];
        {
            let style = TextStyle::from((FONT, 14).into_font()).color(&BLACK);
            let bm = BitMapBackend::with_buffer(&mut rgb, (w as u32, h as u32));
            if fixed {
                let root = PngBackend(bm).into_drawing_area();
                root.fill(&WHITE).unwrap();
                root.draw_text(text, &style, (20, 10)).unwrap();
                root.present().unwrap();
            } else {
                let root = bm.into_drawing_area();
                root.fill(&WHITE).unwrap();
                root.draw_text(text, &style, (20, 10)).unwrap();
                root.present().unwrap();
            }
        }
        let ink: Vec<bool> = (0..w).map(|x| (0..h).any(|y| rgb[(y * w + x) * 3] < 160)).collect();
        let mut runs = Vec::new();
        let mut start = None;
        for (x, &i) in ink.iter().chain([false].iter()).enumerate() {
            match (i, start) {
                (true, None) => start = Some(x),
                (false, Some(s)) => {
                    runs.push((s, x - 1));
                    start = None;
                }
                _ => {}
            }
        }
        runs
    }

    #[test]
    fn png_text_draws_every_glyph_apart() {
        // "clt" must show three glyphs, each as wide as when drawn alone: plotters' own text
        // drawing drops the left side bearings and runs "c" into "l" ("dt").
        let word = ink_runs("clt", true);
        let alone: Vec<usize> = ["c", "l", "t"]
            .iter()
            .map(|g| {
                let r = ink_runs(g, true);
                assert_eq!(r.len(), 1, "{g}: {r:?}");
                r[0].1 - r[0].0
            })
            .collect();
        assert_eq!(word.len(), 3, "clt drawn as {word:?}");
        for (run, w) in word.iter().zip(&alone) {
            assert!((run.1 - run.0).abs_diff(*w) <= 1, "{word:?} vs {alone:?}");
        }
        // The glyphs keep their spacing: the gaps between them are blank columns.
        assert!(word[1].0 > word[0].1 + 1 && word[2].0 > word[1].1 + 1, "{word:?}");
        // The reason for the PNG backend: plotters' drawing merges the first two glyphs.
        assert!(
            ink_runs("clt", false).len() < 3,
            "plotters draws clt apart now: {:?}",
            ink_runs("clt", false)
        );
    }

    #[test]
    fn renders_svg_and_png_for_all_scales() {
        for (xs, ys) in [
            (Scale::Linear, Scale::Linear),
            (Scale::Log, Scale::Linear),
            (Scale::Linear, Scale::Log),
            (Scale::Log, Scale::Log),
        ] {
            let p = Plot {
                id: "t".into(),
                title: "t".into(),
                x: Axis::new("σ_min", "data units", xs),
                y: Axis::new("ε", "nats", ys),
                series: vec![
                    Series::new("a", vec![0.001, 0.1, 10.0], vec![100.0, 1.0, 0.01]),
                    Series::new("b", vec![0.001, 10.0], vec![f64::INFINITY, 0.02]).with_style(LineStyle::Dashed),
                ],
                legend: LegendPosition::UpperRight,
                caption: None,
            };
            let svg = render_svg(&p).unwrap();
            assert!(
                svg.contains("<svg") && svg.contains("σ_min [data units]"),
                "{xs:?} {ys:?}"
            );
            let png = render_png(&p).unwrap();
            assert_eq!(&png[1..4], b"PNG");
        }
    }
}
