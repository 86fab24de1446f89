//! The live loss curve of a training job (SVG line chart).

use leptos::prelude::*;

/// A line chart of `(step, loss)` points; the axes follow the data.
#[component]
pub fn LossChart(#[prop(into)] points: Signal<Vec<(usize, f64)>>) -> impl IntoView {
    let (w, h, left, bottom, top, right) = (640.0, 200.0, 48.0, 30.0, 12.0, 10.0);
    let svg = move || {
        let pts = points.get();
        let n = pts.len();
        if n == 0 {
            return view! { <text x=w / 2.0 y=h / 2.0 class="axis" text-anchor="middle">"no steps yet"</text> }
                .into_any();
        }
        let (x0, x1) = (pts[0].0 as f64, pts[n - 1].0.max(pts[0].0 + 1) as f64);
        let lo = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.1).max(1e-3);
        let (lo, hi) = (lo - pad, hi + pad);
        let x = move |s: f64| left + (w - left - right) * (s - x0) / (x1 - x0);
        let y = move |v: f64| top + (h - top - bottom) * (1.0 - (v - lo) / (hi - lo));
        let line: Vec<String> = pts.iter().map(|&(s, v)| format!("{:.1},{:.1}", x(s as f64), y(v))).collect();
        let yticks: Vec<_> = (0..=3)
            .map(|i| {
                let v = lo + (hi - lo) * i as f64 / 3.0;
                view! {
                    <line x1=left x2=w - right y1=format!("{:.1}", y(v)) y2=format!("{:.1}", y(v)) class="grid"/>
                    <text x=left - 4.0 y=format!("{:.1}", y(v) + 4.0) class="tick" text-anchor="end">{format!("{v:.3}")}</text>
                }
            })
            .collect();
        let last = pts[n - 1];
        view! {
            {yticks}
            <polyline points=line.join(" ") fill="none" stroke="#4e79a7" stroke-width="2"/>
            <circle cx=format!("{:.1}", x(last.0 as f64)) cy=format!("{:.1}", y(last.1)) r="3" fill="#e15759"/>
            <text x=left y=h - 8.0 class="tick">{format!("step {}", pts[0].0)}</text>
            <text x=w - right y=h - 8.0 class="tick" text-anchor="end">{format!("step {}", last.0)}</text>
            <text x=(w + left) / 2.0 y=h - 8.0 class="axis" text-anchor="middle">"training loss"</text>
        }
        .into_any()
    };
    view! {
        <figure class="chart">
            <svg viewBox=format!("0 0 {w} {h}") width="100%" role="img" data-testid="loss-curve"
                data-points=move || points.with(|p| p.len().to_string())>
                {svg}
            </svg>
        </figure>
    }
}
