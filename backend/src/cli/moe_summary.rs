//! The summary printed by `upcycle` and `moerge` (text, or JSON with
//! `--json`): the method's report plus wall time, bytes on disk and the
//! process's peak resident memory.

use std::path::Path;
use std::time::Instant;

use moe_shared::methods::MoeReport;

/// Sum of the sizes of the files directly in `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// Peak resident set size of this process in MiB (`VmHWM` of
/// `/proc/self/status`; `None` where there is no procfs).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Prints `report` as JSON (with `seconds`, `bytes_on_disk`,
/// `peak_rss_mib`) or as a few lines of text.
pub fn print(report: &MoeReport, out: &Path, started: Instant, json: bool) -> anyhow::Result<()> {
    let seconds = started.elapsed().as_secs_f64();
    let bytes = dir_bytes(out);
    let rss = peak_rss_mib();
    if json {
        let mut v = serde_json::to_value(report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("seconds".into(), seconds.into());
            o.insert("bytes_on_disk".into(), bytes.into());
            o.insert("peak_rss_mib".into(), rss.into());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    println!("wrote {} ({} layout)", out.display(), report.layout);
    println!("experts per layer  {:?}", report.experts_per_layer);
    println!(
        "parameters         {:.2} M (dense {:.2} M)",
        report.parameters as f64 / 1e6,
        report.dense_parameters as f64 / 1e6
    );
    println!("tensors            {} ({:.1} MB, {})", report.tensors, bytes as f64 / 1e6, report.dtype);
    let rss = rss.map(|r| format!(", peak RSS {r:.0} MiB")).unwrap_or_default();
    println!("time               {seconds:.2} s{rss}");
    Ok(())
}
