//! Model cards: the `README.md` every model directory the studio writes
//! carries, in the Hugging Face model-card format — YAML front matter
//! (metadata the Hub reads) between `---` lines, then Markdown.
//!
//! Front matter ([`FrontMatter`]): `base_model` (the inputs, as the user
//! named them: Hub ids or paths), `library_name: moe-studio`, `license`
//! (only when every input states the same one: an input's own card's
//! `license`, or a GGUF's `general.license`), `pipeline_tag:
//! text-generation` and `tags` (`moe`, `mixture-of-experts` for MoE outputs,
//! the method: `upcycling`, `dume`, `deltamoe`, `merge`, and `moe-studio`).
//! The body says what was done, with the method's source, lists the inputs,
//! gives the exact command (CLI, server job) or the options (the browser
//! tab), the studio version, facts of the output (layout, experts, how they
//! are stored, dtype) and extra sections such as a routed model's routing
//! accuracy.
//!
//! As mergekit's `mergekit/card.py` (`generate_card`: front matter with
//! `base_model`, `tags`, `library_name`; the merge method; the models; the
//! YAML used), with two differences: inputs that are local paths stay in
//! `base_model` (mergekit keeps Hub ids only), so the card always names what
//! went in; and an input's license is carried over only when all inputs
//! agree. An input's own card is never copied: the writer writes this card
//! as `README.md` and drops any other file of that name
//! ([`crate::tensor_io::SafetensorsWriter::finish`]).
//!
//! Format: <https://huggingface.co/docs/hub/model-cards> (the metadata keys
//! of `modelcard.md` / `huggingface_hub.ModelCardData`).

use serde::Serialize;

/// The file name of a model card.
pub const CARD_FILE: &str = "README.md";

/// What made the model (its `tags` entry and the card's description).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CardMethod {
    /// Dense -> MoE by copying the FFN into experts (`upcycle`; DeltaMoE
    /// phase 1, sparse upcycling).
    Upcycling,
    /// Dense domain experts merged into one MoE (`moerge`) and/or its ridge
    /// router (`route`): DUME.
    Dume,
    /// DeltaMoE's continued pre-training of the experts / router (`train`
    /// on an MoE) or its alignment-delta graft (`graft`).
    DeltaMoe,
    /// A weight merge of dense models (`merge`: linear, task arithmetic,
    /// TIES, DARE).
    Merge,
    /// The same model in another format or layout (`convert`).
    Conversion,
    /// Training of a dense model (`train --stage dense`).
    Training,
    /// Random weights of a configuration's shape (`init-random`).
    RandomInit,
}

impl CardMethod {
    /// The method tags (the Hub's `tags`).
    pub fn tags(self) -> &'static [&'static str] {
        match self {
            CardMethod::Upcycling => &["upcycling"],
            CardMethod::Dume => &["dume", "merge"],
            CardMethod::DeltaMoe => &["deltamoe"],
            CardMethod::Merge => &["merge"],
            CardMethod::Conversion | CardMethod::Training | CardMethod::RandomInit => &[],
        }
    }

    /// A paragraph on the method and its source (methods.md has the
    /// details).
    pub fn describe(self) -> &'static str {
        match self {
            CardMethod::Upcycling => {
                "**Upcycling** (sparse upcycling, Komatsuzaki et al. 2023; DeltaMoE's first phase): every feed-forward \
                 block of the dense base is copied into the experts of a mixture-of-experts layer, with a router in \
                 front; with the router as initialised the model computes what the dense base computes, up to the \
                 noise and variants listed below."
            }
            CardMethod::Dume => {
                "**DUME** (dense domain experts merged into one MoE): the feed-forward blocks of the dense expert \
                 models become the experts of one MoE layer per layer (MoErge, as mergekit-moe), the other tensors \
                 are averaged or taken from the base, and the router is either the one given or DUME's closed-form \
                 ridge regression on the hidden states of each domain's text (`moe-studio route`)."
            }
            CardMethod::DeltaMoe => {
                "**DeltaMoE**: an upcycled MoE whose new experts and router are trained on new-language text while \
                 the original expert stays frozen, and onto which the alignment delta (instruct − base) of the dense \
                 models is grafted."
            }
            CardMethod::Merge => {
                "**Merge** of dense models with mergekit's semantics (linear, task arithmetic, TIES, DARE), computed \
                 in f32 and rounded once."
            }
            CardMethod::Conversion => {
                "**Conversion**: the same model written as Hugging Face safetensors (and, for an MoE, in the layout \
                 and expert storage named below); values are unchanged up to the dtype named below."
            }
            CardMethod::Training => "**Training** of a dense model with moe-studio's trainer.",
            CardMethod::RandomInit => {
                "**Random weights** of the configuration's shape (transformers' initialisation), a model to train \
                 from scratch."
            }
        }
    }
}

/// One input of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardInput {
    /// Its role (`dense base`, `expert 2`, `instruct`, ...).
    pub role: String,
    /// The model as the user named it (a path or a Hub id).
    pub name: String,
    /// Its license, when it states one (its own card's `license`, a GGUF's
    /// `general.license`).
    pub license: Option<License>,
}

/// A license as a model card states it: the Hub's license id and, for
/// `other`, the `license_name` and `license_link` that say which one (the
/// Hub asks for both with `other`; two `other` licenses are the same only
/// when these agree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct License {
    /// The `license` id (`apache-2.0`, `other`, ...).
    pub id: String,
    /// `license_name` (with `other`).
    pub name: Option<String>,
    /// `license_link` (with `other`).
    pub link: Option<String>,
}

impl License {
    /// A license given by its id alone (a GGUF's `general.license`).
    pub fn id(id: impl Into<String>) -> Self {
        License { id: id.into(), name: None, link: None }
    }
}

impl std::fmt::Display for License {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)?;
        match (&self.name, &self.link) {
            (None, None) => Ok(()),
            (n, l) => write!(
                f,
                " ({})",
                [n.as_deref().map(|n| format!("name {n}")), l.as_deref().map(|l| format!("link {l}"))]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The front matter of a card (serialised as YAML).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct FrontMatter {
    /// The inputs.
    pub base_model: Vec<String>,
    /// `moe-studio`.
    pub library_name: String,
    /// The inputs' license when they all state the same one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub license: Option<String>,
    /// Its `license_name` (a shared `other` license).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub license_name: Option<String>,
    /// Its `license_link` (a shared `other` license).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub license_link: Option<String>,
    /// `text-generation`.
    pub pipeline_tag: String,
    /// `moe`, `mixture-of-experts`, the method, `moe-studio`.
    pub tags: Vec<String>,
}

/// A model card under construction (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    /// Heading (the output directory's name when empty).
    pub title: String,
    /// The method.
    pub method: CardMethod,
    /// Whether the output is a mixture of experts (adds the `moe` tags).
    pub moe: bool,
    /// The inputs, in the order they were given.
    pub inputs: Vec<CardInput>,
    /// The exact command line (`moe-studio ...`), when run from the CLI or
    /// a server job.
    pub command: Option<String>,
    /// The options or recipe (`(language, text)`, e.g. `("json", ...)` from
    /// the browser tab, `("yaml", ...)` for a recipe file).
    pub recipe: Option<(String, String)>,
    /// Facts about the output (`layout`, `experts`, `dtype`, ...), in order.
    pub details: Vec<(String, String)>,
    /// Extra Markdown sections `(heading, body)`, e.g. the routing accuracy.
    pub sections: Vec<(String, String)>,
}

impl ModelCard {
    /// A card for `method` with no inputs yet.
    pub fn new(method: CardMethod) -> Self {
        ModelCard {
            title: String::new(),
            method,
            moe: false,
            inputs: Vec::new(),
            command: None,
            recipe: None,
            details: Vec::new(),
            sections: Vec::new(),
        }
    }

    /// Adds an input.
    pub fn input(mut self, role: impl Into<String>, name: impl Into<String>, license: Option<String>) -> Self {
        self.inputs.push(CardInput { role: role.into(), name: name.into(), license: license.map(License::id) });
        self
    }

    /// Sets the command line.
    pub fn command(mut self, command: impl Into<String>) -> Self {
        self.command = Some(command.into());
        self
    }

    /// Adds (or replaces) a fact about the output.
    pub fn detail(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.details.iter_mut().find(|(k, _)| k == key) {
            Some(d) => d.1 = value,
            None => self.details.push((key.to_string(), value)),
        }
    }

    /// Adds a Markdown section.
    pub fn section(&mut self, heading: impl Into<String>, body: impl Into<String>) {
        self.sections.push((heading.into(), body.into()));
    }

    /// The license every input states, when they all state the same one
    /// (id, and name and link for `other`).
    pub fn common_license(&self) -> Option<License> {
        let first = self.inputs.first()?.license.clone()?;
        self.inputs.iter().all(|i| i.license.as_ref() == Some(&first)).then_some(first)
    }

    /// The front matter.
    pub fn front_matter(&self) -> FrontMatter {
        let mut tags: Vec<String> = Vec::new();
        if self.moe {
            tags.extend(["moe".to_string(), "mixture-of-experts".to_string()]);
        }
        tags.extend(self.method.tags().iter().map(|t| t.to_string()));
        tags.push("moe-studio".into());
        let mut base_model: Vec<String> = Vec::new();
        for i in &self.inputs {
            if !base_model.contains(&i.name) {
                base_model.push(i.name.clone());
            }
        }
        let common = self.common_license();
        FrontMatter {
            base_model,
            library_name: "moe-studio".into(),
            license: common.as_ref().map(|l| l.id.clone()),
            license_name: common.as_ref().and_then(|l| l.name.clone()),
            license_link: common.as_ref().and_then(|l| l.link.clone()),
            pipeline_tag: "text-generation".into(),
            tags,
        }
    }

    /// The card's text (`README.md`).
    pub fn render(&self) -> String {
        let yaml = serde_yaml_ng::to_string(&self.front_matter()).expect("the front matter serialises");
        let title = if self.title.is_empty() { "moe-studio model" } else { self.title.as_str() };
        let mut out = format!("---\n{yaml}---\n# {title}\n\n");
        out.push_str(&format!(
            "This model was made with moe-studio {}.\n\n{}\n",
            crate::VERSION,
            self.method.describe()
        ));
        if !self.inputs.is_empty() {
            out.push_str("\n## Inputs\n\n| role | model | license |\n|---|---|---|\n");
            for i in &self.inputs {
                out.push_str(&format!(
                    "| {} | `{}` | {} |\n",
                    cell(&i.role),
                    i.name.replace('`', "'"),
                    i.license.as_ref().map_or("not stated".to_string(), |l| cell(&l.to_string()))
                ));
            }
        }
        if !self.details.is_empty() {
            out.push_str("\n## The model\n\n");
            for (k, v) in &self.details {
                out.push_str(&format!("- {k}: {v}\n"));
            }
        }
        if self.command.is_some() || self.recipe.is_some() {
            out.push_str("\n## How it was made\n\n");
            if let Some(c) = &self.command {
                out.push_str(&format!("The command:\n\n{}", fence("sh", c)));
            }
            if let Some((lang, text)) = &self.recipe {
                out.push_str(&format!("The options:\n\n{}", fence(lang, text)));
            }
        }
        for (h, body) in &self.sections {
            out.push_str(&format!("\n## {h}\n\n{}\n", body.trim_end()));
        }
        out.push_str("\n## License\n\n");
        match self.common_license() {
            Some(l) => out.push_str(&format!("Every input states the license `{l}`; it is carried over.\n")),
            None => out.push_str(
                "The inputs do not all state the same license (see the table above), so none is stated here: the \
                 terms of each input apply.\n",
            ),
        }
        out
    }
}

/// A Markdown table cell (pipes escaped, one line).
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A fenced code block long enough not to be closed by `text`.
fn fence(lang: &str, text: &str) -> String {
    let mut ticks = "```".to_string();
    while text.contains(&ticks) {
        ticks.push('`');
    }
    format!("{ticks}{lang}\n{}\n{ticks}\n", text.trim_end())
}

/// The front matter of a card's text (between a first line `---` and the
/// next `---` line), parsed as YAML; `None` when there is none or it does
/// not parse.
pub fn parse_front_matter(text: &str) -> Option<serde_yaml_ng::Value> {
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n"))?;
    let end = rest.lines().scan(0usize, |pos, line| {
        let start = *pos;
        *pos += line.len() + 1;
        Some((start, line))
    });
    let end = end.filter(|(_, l)| l.trim_end() == "---").map(|(s, _)| s).next()?;
    serde_yaml_ng::from_str(&rest[..end]).ok()
}

/// A card's front matter read as the fields the studio writes ([`FrontMatter`]);
/// `None` when there is none or it lacks them.
pub fn read_front_matter(text: &str) -> Option<FrontMatter> {
    serde_yaml_ng::from_value(parse_front_matter(text)?).ok()
}

/// The license of a card's front matter: `license`, with `license_name`
/// and `license_link` when they are there.
pub fn card_license(text: &str) -> Option<License> {
    let v = parse_front_matter(text)?;
    let field = |k: &str| match v.get(k)? {
        serde_yaml_ng::Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        _ => None,
    };
    let id = field("license")?;
    // The name and link say which license only for `other`: a standard id is one license
    // whatever link a card adds (Qwen's and Phi's cards link their own copies).
    if id == "other" {
        Some(License { id, name: field("license_name"), link: field("license_link") })
    } else {
        Some(License::id(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_parses_names_the_inputs_and_keeps_an_agreed_license_only() {
        let mut card = ModelCard::new(CardMethod::Upcycling)
            .input("dense base", "models/SmolLM2: 135M", Some("apache-2.0".into()))
            .command("moe-studio upcycle 'models/SmolLM2: 135M' --experts 4 --out x");
        card.moe = true;
        card.detail("layout", "mixtral");
        card.section("Routing accuracy", "| layer | en |\n|---|---|\n| 0 | 0.9 |");
        let text = card.render();
        let fm = read_front_matter(&text).unwrap();
        assert_eq!(fm.base_model, vec!["models/SmolLM2: 135M"]);
        assert_eq!(fm.license.as_deref(), Some("apache-2.0"));
        assert_eq!(fm.library_name, "moe-studio");
        assert_eq!(fm.tags, vec!["moe", "mixture-of-experts", "upcycling", "moe-studio"]);
        assert!(text.contains("```sh\nmoe-studio upcycle") && text.contains("- layout: mixtral"), "{text}");
        assert!(text.contains("## Routing accuracy\n\n| layer | en |"), "{text}");
        let two = card.clone().input("expert", "b", Some("mit".into()));
        assert_eq!(two.common_license(), None);
        assert!(!two.render().contains("\nlicense:"));
        let unknown = card.input("expert", "c", None);
        assert_eq!(unknown.common_license(), None);
    }

    #[test]
    fn input_cards_give_their_license_only() {
        let text = "---\nlicense: apache-2.0\nbase_model: HuggingFaceTB/SmolLM2-135M\n---\n# SmolLM2\n";
        assert_eq!(card_license(text), Some(License::id("apache-2.0")));
        let linked = "---\nlicense: apache-2.0\nlicense_link: https://x/LICENSE\n---\n";
        assert_eq!(card_license(linked), Some(License::id("apache-2.0")));
        // `other` licenses agree only with the same name and link, which the output carries.
        let other =
            |name: &str| format!("---\nlicense: other\nlicense_name: {name}\nlicense_link: https://x/{name}\n---\n");
        let (llama, gemma) = (card_license(&other("llama3")).unwrap(), card_license(&other("gemma")).unwrap());
        assert_eq!(llama.name.as_deref(), Some("llama3"));
        let with = |a: &License, b: &License| {
            let mut c = ModelCard::new(CardMethod::Dume);
            for (i, l) in [a, b].into_iter().enumerate() {
                c.inputs.push(CardInput {
                    role: format!("expert {i}"),
                    name: format!("m{i}"),
                    license: Some(l.clone()),
                });
            }
            c
        };
        assert_eq!(with(&llama, &gemma).common_license(), None);
        let fm = read_front_matter(&with(&llama, &llama).render()).unwrap();
        assert_eq!(
            (fm.license.as_deref(), fm.license_name.as_deref(), fm.license_link.as_deref()),
            (Some("other"), Some("llama3"), Some("https://x/llama3"))
        );
        assert_eq!(card_license("# no front matter\n"), None);
        assert_eq!(card_license("---\ntags: [a]\n---\n"), None);
        // a code fence with backticks in the command stays closed
        assert!(fence("sh", "echo ```").starts_with("````sh\n"));
    }
}
