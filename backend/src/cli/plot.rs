//! `moe-studio plot SPEC.json --out STEM`: draws one figure described by a
//! small JSON file, as `STEM.svg` and `STEM.png` (the experiment reports of
//! `experiments/*_report.py` write the specs; the drawing is
//! [`super::figures`], the same `plotters` code as the NeuronMoE figures).
//!
//! The spec (`kind` selects the chart):
//! ```json
//! {"kind": "lines", "title": "...", "x": "step", "y": "loss",
//!  "series": [{"name": "naive", "points": [[10, 3.2], [20, 3.1]]}]}
//! {"kind": "bars", "title": "...", "y": "retention",
//!  "categories": ["code", "math", "docs"],
//!  "series": [{"name": "DUME top-1", "values": [0.97, 0.95, null]}]}
//! ```
//! A `null` value draws no bar (or no point).

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::Deserialize;

use super::figures::{category_bars, xy_lines, Series, XySeries};

/// Arguments of `plot`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The figure's JSON spec (see `moe-studio plot --help` / the module docs:
    /// `kind` "lines" with `series[].points` [[x, y], ...], or "bars" with
    /// `categories` and `series[].values`).
    pub spec: PathBuf,
    /// Output stem: writes STEM.svg and STEM.png.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    kind: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    x: String,
    #[serde(default)]
    y: String,
    #[serde(default)]
    categories: Vec<String>,
    series: Vec<SpecSeries>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecSeries {
    name: String,
    #[serde(default)]
    points: Vec<(f64, Option<f64>)>,
    #[serde(default)]
    values: Vec<Option<f64>>,
}

/// Runs `plot`.
///
/// # Errors
/// An unreadable or malformed spec (naming the file and the field), an
/// unknown `kind`, a `bars` spec whose series have more values than
/// categories, or a drawing/file error.
pub fn run(a: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.spec).with_context(|| format!("reading {}", a.spec.display()))?;
    let spec: Spec = serde_json::from_str(&text).with_context(|| format!("{}: not a figure spec", a.spec.display()))?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let written = match spec.kind.as_str() {
        "lines" => {
            let series: Vec<XySeries> = spec
                .series
                .into_iter()
                .map(|s| XySeries {
                    name: s.name,
                    points: s.points.into_iter().filter_map(|(x, y)| y.map(|y| (x, y))).collect(),
                })
                .collect();
            xy_lines(&a.out, &spec.title, &spec.x, &spec.y, &series)?
        }
        "bars" => {
            if spec.categories.is_empty() {
                bail!("{}: a `bars` figure needs `categories`", a.spec.display());
            }
            let series: Vec<Series> = spec
                .series
                .into_iter()
                .map(|s| Series {
                    name: s.name,
                    values: s.values.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect(),
                    emphasis: false,
                })
                .collect();
            category_bars(&a.out, &spec.title, &spec.y, &spec.categories, &series)
                .with_context(|| a.spec.display().to_string())?
        }
        other => bail!("{}: `kind` is {other:?}; expected \"lines\" or \"bars\"", a.spec.display()),
    };
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_file(dir: &std::path::Path, json: &str) -> PathBuf {
        let p = dir.join("spec.json");
        std::fs::write(&p, json).unwrap();
        p
    }

    #[test]
    fn draws_lines_and_bars_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let lines = spec_file(
            dir.path(),
            r#"{"kind":"lines","title":"loss","x":"step","y":"loss",
                "series":[{"name":"a","points":[[0,3.0],[10,2.5],[20,null],[30,2.2]]}]}"#,
        );
        run(Args { spec: lines, out: dir.path().join("l") }).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("l.svg")).unwrap();
        assert!(svg.contains("<polyline") || svg.contains("<path"), "the line is drawn");
        assert!(std::fs::metadata(dir.path().join("l.png")).unwrap().len() > 1000);
        let bars = spec_file(
            dir.path(),
            r#"{"kind":"bars","title":"retention","y":"retention","categories":["code","math"],
                "series":[{"name":"dume","values":[0.97,0.93]},{"name":"avg","values":[0.8,null]}]}"#,
        );
        run(Args { spec: bars, out: dir.path().join("b") }).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("b.svg")).unwrap();
        // Category names on the x axis and each value above its bar.
        for text in ["code", "math", "0.97", "0.93", "0.80"] {
            assert!(svg.contains(text), "{text} is written in the figure");
        }
        // The null value draws no bar: three rectangles + legend marks, never "NaN".
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn bad_specs_are_refused_naming_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let e = run(Args { spec: spec_file(dir.path(), r#"{"kind":"pie","series":[]}"#), out: dir.path().join("x") })
            .unwrap_err();
        assert!(format!("{e:#}").contains("\"pie\""), "{e:#}");
        let e = run(Args {
            spec: spec_file(dir.path(), r#"{"kind":"bars","categories":["a"],"series":[{"name":"s","values":[1,2]}]}"#),
            out: dir.path().join("x"),
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("2 values for 1 categories"), "{e:#}");
        let e = run(Args {
            spec: spec_file(dir.path(), r#"{"kind":"lines","colour":1,"series":[]}"#),
            out: dir.path().join("x"),
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("not a figure spec"), "{e:#}");
        // An axis whose span overflows f64 is refused (plotters looped on its ticks).
        for (spec, says) in [
            (r#"{"kind":"lines","series":[{"name":"a","points":[[1,1],[2,1e308],[3,-1e308]]}]}"#, "too wide an axis"),
            (r#"{"kind":"bars","categories":["a"],"series":[{"name":"s","values":[1.6e308]}]}"#, "too high an axis"),
        ] {
            let e = run(Args { spec: spec_file(dir.path(), spec), out: dir.path().join("x") }).unwrap_err();
            assert!(format!("{e:#}").contains(says), "{e:#}");
        }
        assert!(!dir.path().join("x.svg").exists(), "nothing is written on refusal");
    }
}
