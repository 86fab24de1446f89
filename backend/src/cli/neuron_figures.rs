//! NeuronMoE figures with `plotters`, each written as `STEM.svg` and
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
        let top = (max_value(series) * 1.25).max(1.0).ceil();
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
