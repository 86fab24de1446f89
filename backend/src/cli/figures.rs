//! Figures with `plotters` (NeuronMoE, `allocate`, `moe-studio plot` for the
//! experiment reports), each written as `STEM.svg` and
//! `STEM.png`: line charts (specific neurons per layer), small multiples
//! (one panel per component) and grouped bars (expert allocations).
//!
//! The SVG backend writes text as `<text>` elements (the viewer's font); the
//! PNG backend rasterises text with `ab_glyph` from DejaVu Sans, bundled by
//! the `dejavu` crate and registered once as `sans-serif`, so nothing depends
//! on the system's fonts.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One named line or bar group: `values[x]` for `x = 0, 1, ...` (layers).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// One value per x position.
    pub values: Vec<f64>,
    /// Draw thicker (e.g. the union over the new languages).
    pub emphasis: bool,
}

/// One panel of [`panels`].
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel caption.
    pub title: String,
    /// Its lines.
    pub series: Vec<Series>,
}

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // DejaVu Sans is a valid TrueType font; a failure would only remove
        // text from the PNGs.
        if plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_err() {
            eprintln!("warning: could not register the bundled DejaVu Sans font; PNG figures will lack text");
        }
    });
}

fn color(i: usize) -> RGBColor {
    // Tableau 10.
    const C: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e}")
}

fn with_ext(stem: &Path, ext: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Draws with `$f(&area, args...)` (a function generic over the drawing
/// backend) into `STEM.svg` and `STEM.png` of `$size` pixels; evaluates to
/// both paths.
macro_rules! render {
    ($stem:expr, $size:expr, $f:ident ( $($arg:expr),* )) => {{
        register_font();
        let svg = with_ext($stem, "svg");
        let png = with_ext($stem, "png");
        {
            let root = SVGBackend::new(&svg, $size).into_drawing_area();
            root.fill(&WHITE).map_err(err)?;
            $f(&root, $($arg),*)?;
            root.present().map_err(err)?;
        }
        {
            let root = BitMapBackend::new(&png, $size).into_drawing_area();
            root.fill(&WHITE).map_err(err)?;
            $f(&root, $($arg),*)?;
            root.present().map_err(err)?;
        }
        Ok(vec![svg, png])
    }};
}

fn max_value(series: &[Series]) -> f64 {
    series.iter().flat_map(|s| s.values.iter().copied()).fold(0.0, f64::max)
}

/// Legend line height in pixels (14 px labels and their spacing) and the
/// legend box's padding plus a bar's value label above it.
const LEGEND_LINE_PX: f64 = 20.0;
const LEGEND_PAD_PX: f64 = 34.0;

/// The y-axis top for bars up to `max` that leaves a band above them for a
/// legend of `entries` lines in a plotting area `plot_px` pixels high, so
/// the legend in a top corner covers no bar (the band is at most 60 % of
/// the area).
fn top_with_legend(max: f64, entries: usize, plot_px: f64) -> f64 {
    let band = ((LEGEND_LINE_PX * entries as f64 + LEGEND_PAD_PX) / plot_px).min(0.6);
    max / (1.0 - band)
}

fn draw_lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    font: u32,
    legend: bool,
) -> Result<()> {
    let n = series.iter().map(|s| s.values.len()).max().unwrap_or(1).max(1);
    let top = (max_value(series) * 1.08).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", font + 4))
        .margin(12)
        .x_label_area_size(font * 2 + 10)
        .y_label_area_size(font * 3 + 10)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(n.min(16))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| if top >= 10.0 { format!("{y:.0}") } else { format!("{y:.1}") })
        .label_style(("sans-serif", font))
        .max_light_lines(0)
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = if s.emphasis { BLACK } else { color(i) };
        let width = if s.emphasis { 3 } else { 2 };
        let pts: Vec<(f64, f64)> = s.values.iter().enumerate().map(|(x, &y)| (x as f64, y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(width)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(width)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 2, c.filled()))).map_err(err)?;
    }
    if !legend {
        return Ok(());
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperMiddle)
        .label_font(("sans-serif", font))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// A line chart over layers (`STEM.svg`, `STEM.png`).
///
/// # Errors
/// Drawing or file errors.
pub fn line_chart(stem: &Path, title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<Vec<PathBuf>> {
    render!(stem, (1000, 600), draw_lines(title, x_desc, y_desc, series, 15, true))
}

/// Small multiples: one line chart per panel in a grid of `cols` columns
/// (`STEM.svg`, `STEM.png`); the legend is drawn in the last panel.
///
/// # Errors
/// Drawing or file errors.
pub fn panels(
    stem: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    panels: &[Panel],
    cols: usize,
) -> Result<Vec<PathBuf>> {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let size = (420 * cols as u32, 300 * rows as u32 + 40);
    render!(stem, size, draw_panels(title, x_desc, y_desc, panels, rows, cols))
}

fn draw_panels<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    panels: &[Panel],
    rows: usize,
    cols: usize,
) -> Result<()> {
    let a = area.titled(title, ("sans-serif", 22)).map_err(err)?;
    for (i, (p, cell)) in panels.iter().zip(a.split_evenly((rows, cols))).enumerate() {
        draw_lines(&cell, &p.title, x_desc, y_desc, &p.series, 12, i + 1 == panels.len())?;
    }
    Ok(())
}

/// Grouped bars over layers: one bar per series at each x
/// (`STEM.svg`, `STEM.png`).
///
/// # Errors
/// Drawing or file errors.
pub fn grouped_bars(stem: &Path, title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<Vec<PathBuf>> {
    render!(stem, (1200, 560), draw_bars(title, x_desc, y_desc, series))
}

fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<()> {
    {
        let n = series.iter().map(|s| s.values.len()).max().unwrap_or(1).max(1);
        // 560 px high: ~466 px of plotting area under the caption and above the x labels.
        let top = top_with_legend(max_value(series).max(1.0), series.len(), 466.0).ceil();
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 19))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_labels(n.min(32))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(top as usize + 1)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 14))
            .max_light_lines(0)
            .draw()
            .map_err(err)?;
        let k = series.len().max(1) as f64;
        let w = 0.8 / k;
        for (i, s) in series.iter().enumerate() {
            let c = color(i);
            let x0 = -0.4 + i as f64 * w;
            chart
                .draw_series(
                    s.values.iter().enumerate().map(|(x, &v)| {
                        Rectangle::new([(x as f64 + x0, 0.0), (x as f64 + x0 + w * 0.92, v)], c.filled())
                    }),
                )
                .map_err(err)?
                .label(s.name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// One named line with its own x values (e.g. a loss curve over steps).
#[derive(Debug, Clone)]
pub struct XySeries {
    /// Legend entry.
    pub name: String,
    /// `(x, y)` points, drawn in the given order.
    pub points: Vec<(f64, f64)>,
}

/// A padded `[lo, hi]` range around `values` (never empty).
///
/// # Errors
/// When the padded range is not finite (values near ±f64::MAX whose span
/// overflows): the axis could not be drawn, and plotters would loop on its
/// ticks. The figure functions check it before a file is opened.
fn padded_range(values: impl Iterator<Item = f64>, from_zero: bool) -> Result<(f64, f64)> {
    let (mut lo, mut hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = ((hi - lo) * 0.06).max(1e-9);
    let range = (if from_zero && lo >= 0.0 { 0.0 } else { lo - pad }, hi + pad);
    if !(range.0.is_finite() && range.1.is_finite()) {
        return Err(anyhow!("the values span {lo:e} to {hi:e}, too wide an axis to draw"));
    }
    Ok(range)
}

/// Lines over arbitrary x values (`STEM.svg`, `STEM.png`): loss or
/// perplexity curves over training steps, routing accuracy over layers. The
/// y axis spans the data (not from zero), so close curves stay apart.
///
/// # Errors
/// Drawing or file errors; values whose axis overflows f64 (nothing written).
pub fn xy_lines(stem: &Path, title: &str, x_desc: &str, y_desc: &str, series: &[XySeries]) -> Result<Vec<PathBuf>> {
    // The axes, once, before a file is opened (a backend writes what it has when dropped).
    let x = padded_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), false)?;
    let y = padded_range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), false)?;
    render!(stem, (1000, 600), draw_xy(title, x_desc, y_desc, series, x, y))
}

fn draw_xy<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[XySeries],
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) -> Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 19))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let span = y1 - y0;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| {
            if span >= 20.0 {
                format!("{y:.0}")
            } else if span >= 2.0 {
                format!("{y:.1}")
            } else {
                format!("{y:.3}")
            }
        })
        .label_style(("sans-serif", 14))
        .max_light_lines(0)
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(s.points.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        if s.points.len() <= 40 {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Grouped bars over named categories (`STEM.svg`, `STEM.png`): one bar per
/// series in each category (e.g. the retention of each method per domain),
/// the value printed above each bar. `series[j].values[i]` belongs to
/// `categories[i]`; a NaN value draws no bar.
///
/// # Errors
/// Drawing or file errors; a series with more values than categories.
pub fn category_bars(
    stem: &Path,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[Series],
) -> Result<Vec<PathBuf>> {
    if let Some(s) = series.iter().find(|s| s.values.len() > categories.len()) {
        return Err(anyhow!("series `{}` has {} values for {} categories", s.name, s.values.len(), categories.len()));
    }
    // The y axis, once, before a file is opened. 600 px high: ~500 px of plotting area under
    // the caption and above the x labels.
    let (_, padded) = padded_range(series.iter().flat_map(|s| s.values.iter().copied()), true)?;
    let top = top_with_legend(padded, series.len(), 500.0);
    if !top.is_finite() {
        return Err(anyhow!("the values reach {padded:e}, too high an axis to draw (with the legend's band)"));
    }
    let width = (160 + 90 * categories.len() * series.len().max(1)).clamp(700, 1600) as u32;
    render!(stem, (width, 600), draw_category_bars(title, y_desc, categories, series, top))
}

fn draw_category_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    categories: &[String],
    series: &[Series],
    top: f64,
) -> Result<()> {
    let n = categories.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 19))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(err)?;
    let cats = categories.to_vec();
    chart
        .configure_mesh()
        .y_desc(y_desc)
        .x_labels(n)
        .x_label_formatter(&move |x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                cats.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| if top >= 20.0 { format!("{y:.0}") } else { format!("{y:.2}") })
        .label_style(("sans-serif", 14))
        .max_light_lines(0)
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    let k = series.len().max(1) as f64;
    let w = 0.84 / k;
    for (j, s) in series.iter().enumerate() {
        let c = color(j);
        let x0 = -0.42 + j as f64 * w;
        let bars: Vec<(f64, f64)> =
            s.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| (i as f64 + x0, v)).collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| Rectangle::new([(x, 0.0), (x + w * 0.9, v)], c.filled())))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        let label = |v: f64| if top >= 20.0 { format!("{v:.1}") } else { format!("{v:.2}") };
        chart
            .draw_series(
                bars.iter().map(|&(x, v)| {
                    Text::new(label(v), (x, v + top * 0.01), ("sans-serif", 11).into_font().color(&BLACK))
                }),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The band above the bars holds the legend: `entries` lines and the
    /// padding, in pixels of the plotting area; and the bars keep at least
    /// 40 % of the height.
    #[test]
    fn the_legend_band_fits_the_legend() {
        for entries in 1..=12 {
            let top = top_with_legend(80.0, entries, 500.0);
            let band_px = (top - 80.0) / top * 500.0;
            let legend_px = LEGEND_LINE_PX * entries as f64 + LEGEND_PAD_PX;
            assert!(
                band_px >= legend_px.min(300.0) - 1e-9,
                "{entries} entries: band {band_px} px, legend {legend_px} px"
            );
            assert!(80.0 / top >= 0.4 - 1e-12, "{entries} entries: bars keep {}", 80.0 / top);
        }
        assert_eq!(top_with_legend(0.0, 3, 500.0), 0.0);
    }
}
