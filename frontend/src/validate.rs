//! One validation for the tab, the CLI and the server (issue 19 item 2):
//! each form builds the job spec the server's Jobs API takes
//! ([`moe_shared::api::JobSpec`]) and runs its
//! [`validate`](moe_shared::api::JobSpec::validate), so a value the server
//! would refuse is refused here too, next to its field, before any work.
//! Nothing is clamped. The rules that need the model (top-k against the
//! experts, frozen experts that exist) come from the same `shared` plan or
//! option checks the CLI runs (`plan_upcycle`, `RouteParams::check`).
//! The tab's own limits (at most [`crate::compute::upcycle::MAX_EXPERTS`]
//! experts per layer, the wasm memory) stay separate refusals that say
//! they are the tab's.
//!
//! The spec's checkpoint and upload ids are placeholders: the tab holds its
//! models itself, so only the parameters are checked.

use moe_shared::api::{
    ApiError, DataRef, GraftSpec, JobSpec, MoergeSpec, NeuronsSpec, RouteSpec, TrainSpec, UpcycleSpec,
};

/// A syntactically valid id for the spec fields that name checkpoints or
/// uploads (the tab's models are not on a server).
pub const PLACEHOLDER_ID: &str = "00000000-0000-4000-8000-000000000000";

/// The tab's one refusal type: the form field at fault and the message in
/// the page's words. The tab's tool pages and the Jobs page's form both
/// use it (a spec field path `domains[1].name` is `key` `domains`, `index`
/// 1, `sub` `.name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The form field (a spec field name such as `top_k`, or `name`); empty
    /// when the error belongs to no input of the form shown.
    pub key: String,
    /// The entry of a list field (row of a data field), when one.
    pub index: Option<usize>,
    /// The rest of the spec field's path (`.upload`, `.name`), when any.
    pub sub: String,
    /// What was wrong and what was expected.
    pub message: String,
}

impl FieldError {
    /// An error about form field `key` as a whole.
    pub fn form(key: &str, message: impl Into<String>) -> Self {
        FieldError { key: key.to_string(), index: None, sub: String::new(), message: message.into() }
    }

    /// An error about the spec field at `path` (`top_k`, `domains[1].name`,
    /// `experts_per_layer[0]`), split into key, entry and sub-field.
    pub fn at_path(path: &str, message: impl Into<String>) -> Self {
        let end = path.find(['[', '.']).unwrap_or(path.len());
        let (key, mut rest) = path.split_at(end);
        let mut index = None;
        if let Some(r) = rest.strip_prefix('[') {
            if let Some((n, tail)) = r.split_once(']') {
                index = n.parse().ok();
                rest = tail;
            }
        }
        FieldError { key: key.to_string(), index, sub: rest.to_string(), message: message.into() }
    }

    /// The spec field path again (`domains[1].name`).
    pub fn path(&self) -> String {
        match self.index {
            Some(i) => format!("{}[{i}]{}", self.key, self.sub),
            None => format!("{}{}", self.key, self.sub),
        }
    }

    /// The text shown next to the input: the message, preceded by the
    /// entry (`#2`) and sub-field it is about.
    pub fn text(&self) -> String {
        let mut at = String::new();
        if let Some(i) = self.index {
            at.push_str(&format!("#{}", i + 1));
        }
        if let Some(s) = self.sub.strip_prefix('.').filter(|s| !s.is_empty()) {
            if !at.is_empty() {
                at.push(' ');
            }
            at.push_str(s);
        }
        if at.is_empty() {
            self.message.clone()
        } else {
            format!("{at}: {}", self.message)
        }
    }
}

/// `spec.validate()` as a [`FieldError`] whose message names the field's
/// label: the page's own where it words a field differently (`labels`
/// maps spec fields to labels), else the operation's (the job kind's form
/// fields, [`moe_shared::jobs::JobKind::fields`], which the Jobs page
/// shows), else the spec name.
fn check(spec: &JobSpec, labels: &[(&str, &str)]) -> Result<(), FieldError> {
    spec.validate().map_err(|e: ApiError| {
        let field = e.field.as_deref().unwrap_or("").trim_start_matches("spec.");
        let base = field.split(['[', '.']).next().unwrap_or("");
        let own = labels.iter().find(|(f, _)| *f == field || *f == base).map(|(_, l)| *l);
        let op = || moe_shared::jobs::JobKind::parse(spec.kind()).and_then(|k| k.field(base)).map(|f| f.label);
        let label = own.or_else(op).unwrap_or(field);
        FieldError::at_path(field, format!("{label}: {} (the server and the CLI refuse it too)", e.error))
    })
}

fn data(name: &str) -> DataRef {
    DataRef { name: name.to_string(), upload: PLACEHOLDER_ID.into(), weight: None, original: false, heldout: None }
}

/// The router form (DUME's ridge router): domain names and the route
/// parameters (λ, top-k, tokens per domain), as the server's `route` job.
///
/// # Errors
/// The first field the server would refuse.
pub fn route(names: &[String], params: &moe_shared::ops::route::RouteParams) -> Result<(), FieldError> {
    let spec = JobSpec::Route(RouteSpec {
        model: PLACEHOLDER_ID.into(),
        domains: names.iter().map(|n| data(n)).collect(),
        params: params.clone(),
    });
    check(&spec, &[("domains", "domain")])
}

/// The MoErge form: `models` ticked, top-k.
///
/// # Errors
/// As [`route`].
pub fn moerge(models: usize, params: &moe_shared::ops::moerge::MoergeParams) -> Result<(), FieldError> {
    let spec = JobSpec::Moerge(MoergeSpec {
        models: vec![PLACEHOLDER_ID.to_string(); models],
        dtype: None,
        params: params.clone(),
    });
    check(&spec, &[("models", "models")])
}

/// The graft form's parameters (the scale λ).
///
/// # Errors
/// As [`route`].
pub fn graft(params: &moe_shared::ops::graft::GraftParams) -> Result<(), FieldError> {
    let spec = JobSpec::Graft(GraftSpec {
        target: PLACEHOLDER_ID.into(),
        base: PLACEHOLDER_ID.into(),
        instruct: PLACEHOLDER_ID.into(),
        params: params.clone(),
    });
    check(&spec, &[("scale", "scale λ")])
}

/// The Neurons form: language codes and top-N.
///
/// # Errors
/// As [`route`].
pub fn neurons(codes: &[String], top_n: usize) -> Result<(), FieldError> {
    let spec = JobSpec::Neurons(NeuronsSpec {
        model: PLACEHOLDER_ID.into(),
        langs: codes.iter().map(|c| data(c)).collect(),
        new: Vec::new(),
        params: moe_shared::ops::neurons::NeuronsParams { top_n, ..Default::default() },
    });
    check(&spec, &[("top_n", "top-N"), ("langs", "language")])
}

/// The Upcycle form's values the server's `upcycle` job takes: uniform
/// `experts` or an allocation, and the operation's parameters (top-k,
/// frozen experts, router, noise, variants: `UpcycleParams::check`).
///
/// # Errors
/// As [`route`].
pub fn upcycle(
    experts: Option<usize>,
    per_layer: Option<Vec<Option<usize>>>,
    params: &moe_shared::ops::upcycle::UpcycleParams,
) -> Result<(), FieldError> {
    let spec = JobSpec::Upcycle(UpcycleSpec {
        model: PLACEHOLDER_ID.into(),
        experts,
        experts_per_layer: per_layer,
        dtype: None,
        params: params.clone(),
    });
    // The parameters' labels are the operation's own (the Jobs page's
    // too); the page words its two expert-count inputs its own way.
    check(&spec, &[("experts", "experts per layer"), ("experts_per_layer", "allocation")])
}

/// The training form (DeltaMoE's stages in the tab): stage, steps and the
/// run's parameters (sequence length, batch, learning rate, the two loss
/// coefficients, ...), as the server's `train` job.
///
/// # Errors
/// As [`route`].
pub fn train(
    stage: moe_shared::train::Stage,
    steps: usize,
    params: &moe_shared::ops::train::TrainParams,
) -> Result<(), FieldError> {
    let spec = JobSpec::Train(TrainSpec {
        model: PLACEHOLDER_ID.into(),
        stage,
        data: vec![data("new")],
        steps,
        engine: None,
        params: params.clone(),
    });
    check(
        &spec,
        &[
            ("steps", "steps"),
            ("seq_len", "sequence length"),
            ("batch", "batch"),
            ("lr", "learning rate"),
            ("alpha", "load-balancing coefficient α"),
            ("prior", "language-prior coefficient β"),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_shared::ops::route::RouteParams;

    /// The values the issue found accepted or clamped are refused, with
    /// the page's label, the same way the server refuses them.
    #[test]
    fn the_servers_rules_refuse_what_the_tab_used_to_accept() {
        let names = vec!["en".to_string(), "hu".to_string()];
        let p = |lambda: f64, top_k: usize, max_tokens: usize| RouteParams {
            lambda,
            top_k,
            max_tokens: Some(max_tokens),
            ..RouteParams::default()
        };
        assert!(route(&names, &p(0.01, 1, 10_000)).is_ok());
        let e = route(&names, &p(0.01, 0, 10_000)).unwrap_err();
        assert_eq!(e.path(), "top_k");
        assert!(e.message.starts_with("top-k: 0 is out of range 1..=64"), "{}", e.message);
        let e = route(&names, &p(1e10, 1, 10_000)).unwrap_err();
        assert_eq!(e.path(), "lambda");
        let e = route(&["en".into(), "en".into()], &p(0.01, 1, 10_000)).unwrap_err();
        assert_eq!(e.path(), "domains[1].name");
        assert!(e.message.contains("appears twice"), "{}", e.message);
        let e = route(&["e n".into(), "hu".into()], &p(0.01, 1, 10_000)).unwrap_err();
        assert_eq!(e.path(), "domains[0].name");
        // Labels the page does not word its own way are the operation's
        // (`RouteParams::form_fields`, the Jobs page's).
        let e = route(&names, &p(0.01, 1, 0)).unwrap_err();
        assert_eq!(e.path(), "max_tokens");
        assert!(e.message.starts_with("tokens per domain: 0 is out of range"), "{}", e.message);
        assert!(route(&names, &p(1e10, 1, 10_000)).unwrap_err().message.starts_with("lambda: "));
        // top-k above the domains (one expert each) is the server's refusal too now
        assert_eq!(route(&names, &p(0.01, 3, 10_000)).unwrap_err().path(), "top_k");

        assert_eq!(neurons(&names, 0).unwrap_err().path(), "top_n");
        assert!(neurons(&names, 100).is_ok());
        assert_eq!(neurons(&names[..1], 100).unwrap_err().path(), "langs");

        let scale = |scale| moe_shared::ops::graft::GraftParams { scale };
        assert!(graft(&scale(1.0)).is_ok());
        let e = graft(&scale(1e30)).unwrap_err();
        assert!(e.message.starts_with("scale λ: "), "{}", e.message);

        let up = |top_k, frozen: &[usize]| moe_shared::ops::upcycle::UpcycleParams {
            top_k,
            frozen: frozen.to_vec(),
            ..Default::default()
        };
        let e = upcycle(Some(1), None, &up(1, &[0])).unwrap_err();
        assert_eq!(e.path(), "experts");
        assert!(e.message.starts_with("experts per layer: 1 is out of range 2..=256"), "{}", e.message);
        assert!(upcycle(Some(2), None, &up(2, &[0])).is_ok());
        assert_eq!(upcycle(Some(2), None, &up(0, &[0])).unwrap_err().path(), "top_k");
        assert_eq!(upcycle(None, Some(vec![Some(0)]), &up(1, &[])).unwrap_err().path(), "experts_per_layer[0]");
        // A parameter's label is the operation's (`UpcycleParams::form_fields`).
        let drop = moe_shared::ops::upcycle::UpcycleParams { drop_ratio: 1.5, ..up(1, &[0]) };
        let e = upcycle(Some(2), None, &drop).unwrap_err();
        assert_eq!(e.path(), "drop_ratio");
        assert!(e.message.starts_with("drop ratio (Drop-Upcycling): "), "{}", e.message);

        use moe_shared::train::Stage;
        let tr = |stage, steps, lr, alpha| {
            let p = moe_shared::ops::train::TrainParams {
                seq_len: 64,
                batch: 8,
                lr: Some(lr),
                alpha,
                prior: 0.1,
                ..Default::default()
            };
            train(stage, steps, &p)
        };
        assert!(tr(Stage::Experts, 30, 3e-3, 0.01).is_ok());
        let e = tr(Stage::Experts, 30, 0.0, 0.01).unwrap_err();
        assert_eq!(e.path(), "lr");
        assert!(e.message.starts_with("learning rate: 0 is out of range (exclusive) 0..=10"), "{}", e.message);
        assert_eq!(tr(Stage::Experts, 30, f64::NAN, 0.01).unwrap_err().path(), "lr");
        assert_eq!(tr(Stage::Router, 0, 1e-3, 0.01).unwrap_err().path(), "steps");
        assert_eq!(tr(Stage::Router, 10, 1e-3, -1.0).unwrap_err().path(), "alpha");

        use moe_shared::ops::moerge::MoergeParams;
        let k = |top_k| MoergeParams { top_k, ..Default::default() };
        assert!(moerge(2, &k(1)).is_ok());
        let e = moerge(2, &k(3)).unwrap_err();
        assert_eq!(e.path(), "top_k");
        assert_eq!(
            e.message,
            "top-k: 3: expected 1 to 2 (the experts: one per model) (the server and the CLI refuse it too)"
        );
        assert_eq!(moerge(2, &k(0)).unwrap_err().path(), "top_k");
        let frozen = MoergeParams { frozen: vec![2], ..Default::default() };
        assert_eq!(moerge(2, &frozen).unwrap_err().path(), "frozen");
    }
}
