//! The accuracy table of multiple-choice tasks (`moe-studio eval --task`'s
//! numbers): the Jobs page shows a task job's `result.json` with it, the
//! Evaluate page what the tab computed.

use leptos::prelude::*;
use moe_shared::api::TaskResult;

/// `0.4500 ± 0.0500` (`± n/a` for one item, lm-eval's "N/A").
pub fn with_stderr(v: f64, se: Option<f64>) -> String {
    match se {
        Some(s) => format!("{v:.4} ± {s:.4}"),
        None => format!("{v:.4} ± n/a"),
    }
}

/// One row per task (or model: `first` names the first column): items, `acc`, `acc_norm`, `acc_bytes` with their
/// standard errors (test ids `task-acc-NAME`, `task-acc_norm-NAME` carry
/// the value in `data-value`).
pub fn task_table(first: &'static str, rows: Vec<TaskResult>) -> impl IntoView {
    view! {
        <table class="grid small" data-testid="task-result">
            <thead><tr><th>{first}</th><th>"items"</th><th>"acc"</th><th>"acc_norm (per character)"</th><th>"acc_bytes (per byte)"</th></tr></thead>
            <tbody>
                {rows.into_iter().map(|r| view! {
                    <tr>
                        <td>{r.name.clone()}</td>
                        <td>{r.items}</td>
                        <td data-testid=format!("task-acc-{}", r.name) data-value=r.acc.to_string()>{with_stderr(r.acc, r.acc_stderr)}</td>
                        <td data-testid=format!("task-acc_norm-{}", r.name) data-value=r.acc_norm.to_string()>{with_stderr(r.acc_norm, r.acc_norm_stderr)}</td>
                        <td>{with_stderr(r.acc_bytes, r.acc_bytes_stderr)}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_is_shown_or_marked_missing() {
        assert_eq!(with_stderr(0.5, Some(0.05)), "0.5000 ± 0.0500");
        assert_eq!(with_stderr(1.0, None), "1.0000 ± n/a");
    }
}
