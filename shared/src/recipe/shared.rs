//! mergekit-moe's `shared_experts` key in MoE recipes (docs/methods.md
//! §6.1 "mergekit recipes"; the arithmetic is
//! [`crate::methods::moerge_shared`]).
//!
//! ```yaml
//! shared_experts:
//!   - source_model: base-model          # its FFN, always on
//!     positive_prompts: ["..."]         # the gate's prompts (optional)
//!     negative_prompts: ["..."]
//! ```
//!
//! The rules are mergekit 0.1.5's (`mergekit/scripts/moe.py` `build`,
//! `mergekit/moe/{qwen,deepseek,mixtral,qwen3}.py` `supports_config`):
//! the shared experts are gated when all of them have `positive_prompts`
//! or the gate mode needs no prompts (`random`; the studio's `zeros` too),
//! ungated when none has prompts under `hidden` / `cheap_embed`, and a mix
//! is refused. `architecture: qwen` holds exactly one gated shared expert,
//! `mixtral` and `qwen3` none (refused by name here); the rest is the
//! layout registry's to decide (`deepseek` has no writer; without
//! `architecture` several or ungated shared experts go to the studio
//! layout with the reason). The studio refuses shared experts with
//! `upcycle:` (the upcycle job makes its own, `--shared-experts`), and
//! with the ridge router or without `base_model` (DUME's MoErge: see
//! [`crate::methods::moerge`]).

use serde::Deserialize;
use serde_yaml_ng::Value;

use super::keys::{check_keys, fields_of, get, kind, string, strings, Refused};
use super::moe::{Expert, Gate};
use crate::error::{Result, StudioError};

/// The keys of one `shared_experts` entry (mergekit-moe's `Expert`).
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct SharedExpertKeys {
    source_model: Value,
    positive_prompts: Value,
    negative_prompts: Value,
}

/// The shared experts of an MoE recipe.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SharedExperts {
    /// The models whose FFN becomes a shared expert, with the gate's
    /// prompts (`name`, `data`, `heldout` unused).
    pub experts: Vec<Expert>,
    /// Whether each is scaled by `sigmoid(g · x)` (Qwen2-MoE) rather than
    /// added as it is (DeepSeek-MoE).
    pub gated: bool,
}

impl SharedExperts {
    /// Whether the gate is initialised from the shared experts' prompts
    /// (gated under a `hidden` / `cheap_embed` gate mode).
    pub fn prompt_gate(&self, gate: &Gate) -> bool {
        self.gated && gate.needs_prompts()
    }
}

/// Reads `shared_experts` (the value `v`; an empty list is none, as in
/// mergekit) for routers initialised by `gate` and the output `layout`
/// (the registry name `architecture` / `layout` gave, if any).
///
/// # Errors
/// [`StudioError::Config`] naming `source` and the key: not a list, an
/// entry's unknown or refused keys (`noise_scale`, `residual_scale`, as for
/// experts), a missing `source_model`, `negative_prompts` without
/// `positive_prompts`, prompts on some shared experts and not on others,
/// an output layout that cannot hold them (`mixtral`, `qwen3_moe`, or
/// `qwen2_moe` with anything but one gated shared expert).
pub fn shared_experts(
    source: &str,
    v: &Value,
    gate: &Gate,
    layout: Option<&str>,
    refused: &[Refused],
) -> Result<SharedExperts> {
    let cfg = |what: String| StudioError::config(source, what);
    let Value::Sequence(list) = v else {
        return Err(cfg(format!("`shared_experts`: expected a list of `- source_model: PATH`, got {}", kind(v))));
    };
    let mut experts = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let path = format!("shared_experts[{i}]");
        let m = check_keys(source, &path, e, fields_of::<SharedExpertKeys>(), refused)?;
        let l = |key: &str| -> Result<Vec<String>> {
            Ok(get(m, key).map(|v| strings(source, &format!("{path}.{key}"), v)).transpose()?.unwrap_or_default())
        };
        let source_model = get(m, "source_model")
            .map(|v| string(source, &format!("{path}.source_model"), v))
            .transpose()?
            .ok_or_else(|| cfg(format!("`{path}.source_model` is missing")))?;
        let ex = Expert {
            source_model,
            positive_prompts: l("positive_prompts")?,
            negative_prompts: l("negative_prompts")?,
            name: format!("shared{i}"),
            ..Default::default()
        };
        if ex.positive_prompts.is_empty() && !ex.negative_prompts.is_empty() {
            return Err(cfg(format!(
                "`{path}.negative_prompts` without `positive_prompts`: the gate is the positive prompts' vector \
                 minus the negative ones'"
            )));
        }
        experts.push(ex);
    }
    if experts.is_empty() {
        return Ok(SharedExperts::default());
    }
    let with_prompts = experts.iter().filter(|e| !e.positive_prompts.is_empty()).count();
    if with_prompts != 0 && with_prompts != experts.len() {
        return Err(cfg(format!(
            "`shared_experts`: {with_prompts} of {} have `positive_prompts`: give prompts to every shared expert \
             (a gated shared expert each) or to none (ungated; mergekit-moe refuses a mix too)",
            experts.len()
        )));
    }
    let gated = match gate {
        Gate::Hidden | Gate::CheapEmbed => with_prompts > 0,
        Gate::Random { .. } | Gate::Zeros => true,
        Gate::Ridge => {
            return Err(cfg(
                "`shared_experts` with `gate_mode: ridge`: DUME's ridge router picks one domain's expert per \
                 token, and an always-on shared FFN that no domain was trained with has no place in that \
                 arithmetic (docs/methods.md §2); use `gate_mode: hidden`, `cheap_embed` or `random` with \
                 `base_model`"
                    .into(),
            ))
        }
    };
    match layout {
        Some(l @ ("mixtral" | "qwen3_moe")) => Err(cfg(format!(
            "`shared_experts`: the `{l}` output has no shared experts (mergekit-moe refuses this too); use \
             `architecture: qwen` (one gated shared expert, Qwen2-MoE) or leave `architecture` out (several or \
             ungated shared experts are written in the studio layout)"
        ))),
        Some("qwen2_moe") if experts.len() != 1 || !gated => Err(cfg(format!(
            "`shared_experts` with `architecture: qwen`: Qwen2-MoE holds exactly one gated shared expert (got {} \
             {}); give one shared expert with `positive_prompts` (or `gate_mode: random`), or leave \
             `architecture` out for the studio layout",
            experts.len(),
            if gated { "gated" } else { "ungated: no prompts" }
        ))),
        _ => Ok(SharedExperts { experts, gated }),
    }
}

#[cfg(test)]
mod tests {
    use crate::recipe::{parse, plan, Recipe, RecipeContext};

    const HEAD: &str = "base_model: b\nexperts:\n  - {source_model: e1, positive_prompts: [x]}\n  - {source_model: e2, positive_prompts: [y]}\n";

    fn argv(yaml: &str) -> Vec<String> {
        let ctx = RecipeContext { base_dir: "/r".into(), work_dir: "/w".into(), out: "/o".into(), seed: None };
        let r = parse(yaml, "s.yml").unwrap();
        assert_eq!(r.kind(), "mergekit-moe");
        plan(&r, &ctx).unwrap().stages[0].argv.clone()
    }

    #[test]
    fn gating_follows_mergekit_s_rule_and_the_stage_gets_the_flags() {
        // Prompts under a prompt-based gate mode: gated, gate from the
        // shared expert's own prompt file.
        let y = format!(
            "{HEAD}gate_mode: cheap_embed\nshared_experts:\n  - source_model: s\n    positive_prompts: [p]\n    \
             negative_prompts: [n]\n"
        );
        let a = argv(&y);
        assert!(a.contains(&"--shared-expert=/r/s".into()) && a.contains(&"--shared-gate".into()), "{a:?}");
        assert!(a.contains(&"--shared-prompts=/w/shared_prompts.json".into()), "{a:?}");
        let Recipe::Moe(r) = parse(&y, "s.yml").unwrap() else { panic!() };
        assert_eq!(r.shared.experts[0].negative_prompts, ["n"]);
        // No prompts under a prompt-based mode: ungated (mergekit's DeepSeek).
        let a = argv(&format!("{HEAD}gate_mode: hidden\nshared_experts:\n  - source_model: s\n"));
        assert!(a.contains(&"--shared-expert=/r/s".into()) && !a.iter().any(|x| x.starts_with("--shared-g")), "{a:?}");
        // `random` needs no prompts: gated, random gate, no prompt file.
        let a = argv(&format!("{HEAD}gate_mode: random\nshared_experts:\n  - source_model: s\n  - source_model: t\n"));
        assert!(a.contains(&"--shared-gate".into()) && !a.iter().any(|x| x.starts_with("--shared-prompts")));
        assert_eq!(a.iter().filter(|x| x.starts_with("--shared-expert=")).count(), 2);
        // An empty list is none, as in mergekit.
        assert!(!argv(&format!("{HEAD}gate_mode: random\nshared_experts: []\n")).iter().any(|x| x.contains("shared")));
    }

    #[test]
    fn refusals_name_the_key_and_the_reason() {
        let cases = [
            (
                format!(
                    "{HEAD}gate_mode: cheap_embed\nshared_experts:\n  - {{source_model: s, positive_prompts: [p]}}\n  \
                     - {{source_model: t}}\n"
                ),
                "1 of 2 have `positive_prompts`",
            ),
            (
                format!("{HEAD}gate_mode: hidden\nshared_experts:\n  - {{source_model: s, negative_prompts: [n]}}\n"),
                "`shared_experts[0].negative_prompts` without `positive_prompts`",
            ),
            (format!("{HEAD}layout: qwen3_moe\nshared_experts:\n  - {{source_model: s}}\n"), "the `qwen3_moe` output"),
            (
                format!(
                    "{HEAD}architecture: qwen\ngate_mode: random\nshared_experts:\n  - {{source_model: s}}\n  - \
                     {{source_model: t}}\n"
                ),
                "exactly one gated shared expert (got 2 gated)",
            ),
            (
                "experts:\n  - {source_model: a, data: a.txt}\n  - {source_model: b, data: b.txt}\ngate_mode: ridge\n\
                 shared_experts:\n  - {source_model: s}\n"
                    .to_string(),
                "`shared_experts` with `gate_mode: ridge`",
            ),
            (
                "base_model: m\nupcycle: {experts: 4}\nshared_experts:\n  - {source_model: s}\n".to_string(),
                "set `upcycle: {shared_experts: N}`",
            ),
            (
                format!("{HEAD}shared_experts:\n  - {{sourc_model: s}}\n"),
                "did you mean `shared_experts[0].source_model`",
            ),
            (format!("{HEAD}shared_experts: s\n"), "`shared_experts`: expected a list"),
        ];
        for (yaml, want) in cases {
            let e = parse(&yaml, "s.yml").unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("s.yml"), "{yaml}\n{e}\nwanted: {want}");
        }
    }
}
