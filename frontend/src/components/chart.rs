//! Small SVG charts: grouped bars (per-layer counts, accuracies, loads) and
//! lines over training steps (losses, routing shares).

use leptos::prelude::*;

/// One series of a grouped bar chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// One value per group (`None`: no bar).
    pub values: Vec<Option<f64>>,
}

/// A part of one series' bars drawn hatched (e.g. the tie-weighted part of
/// a count): `parts[g]` of group `g`'s bar, at its top.
#[derive(Debug, Clone, PartialEq)]
pub struct Marked {
    /// Index of the series whose bars are marked.
    pub series: usize,
    /// The marked amount per group (0: nothing marked).
    pub parts: Vec<f64>,
    /// Legend label of the hatching.
    pub label: String,
}

const COLORS: [&str; 8] = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];

/// The colour of series or expert `i`.
pub fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// A grouped bar chart: `groups` along x (e.g. layers), one bar per series.
/// `max` fixes the y range (e.g. 1.0 for accuracies); `None` scales to the
/// data.
#[component]
pub fn BarChart(
    #[prop(into)] title: String,
    #[prop(into)] x_label: String,
    groups: Vec<String>,
    series: Vec<Series>,
    #[prop(optional)] max: Option<f64>,
    #[prop(optional)] reference: Option<(f64, String)>,
    #[prop(optional)] marked: Option<Marked>,
) -> impl IntoView {
    let (w, h, left, bottom, top) = (640.0, 220.0, 44.0, 36.0, 14.0);
    let data_max = series.iter().flat_map(|s| s.values.iter().flatten().copied()).fold(0.0, f64::max);
    // Counts get a y range divisible by 4 so the five ticks are whole numbers.
    let ymax = max.unwrap_or(if data_max > 1.5 {
        (data_max * 1.05 / 4.0).ceil() * 4.0
    } else if data_max > 0.0 {
        data_max * 1.1
    } else {
        1.0
    });
    let n = groups.len().max(1);
    let gw = (w - left - 8.0) / n as f64;
    let bw = (gw * 0.8) / series.len().max(1) as f64;
    let y = move |v: f64| top + (h - top - bottom) * (1.0 - (v / ymax).clamp(0.0, 1.0));
    let mut bars = Vec::new();
    for (si, s) in series.iter().enumerate() {
        for (g, v) in s.values.iter().enumerate() {
            if let Some(v) = v {
                let x = left + g as f64 * gw + gw * 0.1 + si as f64 * bw;
                let tip = format!("{} {}: {:.3}", s.label, groups.get(g).cloned().unwrap_or_default(), v);
                let marked_part = marked
                    .as_ref()
                    .filter(|m| m.series == si)
                    .and_then(|m| m.parts.get(g).copied().filter(|&p| p > 0.0).map(|p| (p, m.label.clone())));
                let mark_tip = marked_part.as_ref().map(|(p, label)| format!("{tip} (of which {p:.3} {label})"));
                bars.push(view! {
                    <rect x=format!("{x:.1}") y=format!("{:.1}", y(*v)) width=format!("{:.1}", bw.max(1.0))
                        height=format!("{:.1}", (h - bottom - y(*v)).max(0.0)) fill=color(si)><title>{tip}</title></rect>
                }.into_any());
                if let (Some((p, _)), Some(mark_tip)) = (marked_part, mark_tip) {
                    bars.push(view! {
                        <rect class="marked" x=format!("{x:.1}") y=format!("{:.1}", y(*v)) width=format!("{:.1}", bw.max(1.0))
                            height=format!("{:.1}", (y(*v - p) - y(*v)).max(0.0)) fill="url(#hatch)"><title>{mark_tip}</title></rect>
                    }.into_any());
                }
            }
        }
    }
    let step = (n / 16).max(1);
    let xticks: Vec<_> = groups
        .iter()
        .enumerate()
        .filter(|(g, _)| g % step == 0)
        .map(|(g, name)| {
            view! { <text x=format!("{:.1}", left + (g as f64 + 0.5) * gw) y=format!("{}", h - bottom + 14.0) class="tick" text-anchor="middle">{name.clone()}</text> }
        })
        .collect();
    let yticks: Vec<_> = (0..=4)
        .map(|i| {
            let v = ymax * i as f64 / 4.0;
            let label = if ymax <= 1.5 { format!("{v:.2}") } else { format!("{v:.0}") };
            view! {
                <line x1=format!("{left}") x2=format!("{}", w - 8.0) y1=format!("{:.1}", y(v)) y2=format!("{:.1}", y(v)) class="grid"/>
                <text x=format!("{}", left - 4.0) y=format!("{:.1}", y(v) + 4.0) class="tick" text-anchor="end">{label}</text>
            }
        })
        .collect();
    let refline = reference.map(|(v, label)| {
        view! {
            <line x1=format!("{left}") x2=format!("{}", w - 8.0) y1=format!("{:.1}", y(v)) y2=format!("{:.1}", y(v)) class="ref"/>
            <text x=format!("{}", w - 10.0) y=format!("{:.1}", y(v) - 4.0) class="tick" text-anchor="end">{label}</text>
        }
    });
    let mut legend: Vec<_> = series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            view! { <span class="legend"><i style=format!("background:{}", color(i))></i>{s.label.clone()}</span> }
                .into_any()
        })
        .collect();
    if let Some(m) = marked.as_ref().filter(|m| m.parts.iter().any(|&p| p > 0.0)) {
        legend.push(
            view! { <span class="legend" data-testid="chart-marked"><i class="hatched"></i>{m.label.clone()}</span> }
                .into_any(),
        );
    }
    view! {
        <figure class="chart">
            <figcaption>{title}</figcaption>
            <svg viewBox=format!("0 0 {w} {h}") width="100%" role="img">
                <defs>
                    <pattern id="hatch" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
                        <rect width="5" height="5" fill="#ffffff" fill-opacity="0.55"/>
                        <line x1="0" y1="0" x2="0" y2="5" stroke="#1d2430" stroke-width="1.6"/>
                    </pattern>
                </defs>
                {yticks}
                {bars}
                {refline}
                {xticks}
                <text x=format!("{}", (w + left) / 2.0) y=format!("{}", h - 4.0) class="axis" text-anchor="middle">{x_label}</text>
            </svg>
            <div class="legends">{legend}</div>
        </figure>
    }
}

/// One line of a [`LineChart`]: `(x, y)` points in x order.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend label.
    pub label: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
    /// Dashed (e.g. the original language beside the new one).
    pub dashed: bool,
    /// Colour index ([`color`]).
    pub color: usize,
}

/// Lines over a shared x axis (training steps). `max` fixes the y range
/// (e.g. 1.0 for shares); `None` scales to the data (from 0).
#[component]
pub fn LineChart(
    #[prop(into)] title: String,
    #[prop(into)] x_label: String,
    lines: Vec<Line>,
    #[prop(optional)] max: Option<f64>,
    #[prop(optional, into)] id: Option<String>,
) -> impl IntoView {
    let (w, h, left, bottom, top, right) = (640.0, 200.0, 44.0, 34.0, 12.0, 10.0);
    let pts = || lines.iter().flat_map(|l| l.points.iter().copied());
    let xmax = pts().map(|p| p.0).fold(1.0, f64::max);
    let xmin = pts().map(|p| p.0).fold(xmax, f64::min).min(0.0);
    let data_max = pts().map(|p| p.1).filter(|y| y.is_finite()).fold(0.0, f64::max);
    let ymax = max.unwrap_or(if data_max > 0.0 { data_max * 1.08 } else { 1.0 });
    let x = move |v: f64| left + (w - left - right) * (v - xmin) / (xmax - xmin).max(1e-9);
    let y = move |v: f64| top + (h - top - bottom) * (1.0 - (v / ymax).clamp(0.0, 1.0));
    let paths: Vec<_> = lines
        .iter()
        .map(|l| {
            let d: String = l
                .points
                .iter()
                .filter(|p| p.1.is_finite())
                .enumerate()
                .map(|(i, p)| format!("{}{:.1},{:.1}", if i == 0 { "M" } else { " L" }, x(p.0), y(p.1)))
                .collect();
            let last = l.points.last().map(|p| format!("{}: {:.3} at {}", l.label, p.1, p.0)).unwrap_or_default();
            let dash = if l.dashed { "5 3" } else { "" };
            view! {
                <path d=d fill="none" stroke=color(l.color) stroke-width="1.8" stroke-dasharray=dash><title>{last}</title></path>
            }
        })
        .collect();
    let yticks: Vec<_> = (0..=4)
        .map(|i| {
            let v = ymax * i as f64 / 4.0;
            let label = if ymax <= 1.5 { format!("{v:.2}") } else if ymax < 20.0 { format!("{v:.1}") } else { format!("{v:.0}") };
            view! {
                <line x1=format!("{left}") x2=format!("{}", w - right) y1=format!("{:.1}", y(v)) y2=format!("{:.1}", y(v)) class="grid"/>
                <text x=format!("{}", left - 4.0) y=format!("{:.1}", y(v) + 4.0) class="tick" text-anchor="end">{label}</text>
            }
        })
        .collect();
    let xticks: Vec<_> = (0..=4)
        .map(|i| {
            let v = xmin + (xmax - xmin) * i as f64 / 4.0;
            view! { <text x=format!("{:.1}", x(v)) y=format!("{}", h - bottom + 14.0) class="tick" text-anchor="middle">{format!("{v:.0}")}</text> }
        })
        .collect();
    let legend: Vec<_> = lines
        .iter()
        .map(|l| {
            let style = if l.dashed {
                format!(
                    "background: repeating-linear-gradient(90deg, {c} 0 4px, transparent 4px 6px)",
                    c = color(l.color)
                )
            } else {
                format!("background:{}", color(l.color))
            };
            view! { <span class="legend"><i style=style></i>{l.label.clone()}</span> }
        })
        .collect();
    view! {
        <figure class="chart" data-testid=id.unwrap_or_default()>
            <figcaption>{title}</figcaption>
            <svg viewBox=format!("0 0 {w} {h}") width="100%" role="img">
                {yticks}
                {paths}
                {xticks}
                <text x=format!("{}", (w + left) / 2.0) y=format!("{}", h - 4.0) class="axis" text-anchor="middle">{x_label}</text>
            </svg>
            <div class="legends">{legend}</div>
        </figure>
    }
}
