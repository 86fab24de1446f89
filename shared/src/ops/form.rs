//! The job form's description of an input: what the Jobs page shows for
//! one field of a job spec (its key, label, how it is entered, the
//! default as a hint). Each operation lists the inputs of its parameters
//! next to them (e.g. [`super::route::RouteParams::form_fields`]);
//! each job's `api::Operation::fields` adds its own inputs (checkpoints, data).

/// How a field is entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// One registered checkpoint (a select).
    Checkpoint,
    /// A checkpoint or none (a select with an empty choice).
    OptCheckpoint,
    /// Several checkpoints, in the order they are ticked.
    Checkpoints,
    /// Uploaded text files as [`crate::api::DataRef`]s: one row each, with the
    /// sub-fields the spec reads.
    Data {
        /// Rows shown at first (the spec's minimum).
        rows: usize,
        /// `weight` (train's mixture weight).
        weight: bool,
        /// `original` (train's language prior).
        original: bool,
        /// `heldout` (route).
        heldout: bool,
    },
    /// A whole number.
    Int,
    /// A number.
    Float,
    /// One of a few words; empty = the server's default unless required.
    Choice(&'static [&'static str]),
    /// Whole numbers separated by commas (`none` = an empty list).
    IntList,
    /// Experts per layer separated by commas, `-` for a dense layer.
    LayerList,
    /// Numbers separated by commas.
    FloatList,
    /// Names separated by commas.
    Names,
    /// On or off (a checkbox; a `bool` field that is `false` by default).
    Flag,
}

/// One input of the form: a field of a spec type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The spec's field name (`top_k`); also the input's test id `job-top_k`.
    pub key: &'static str,
    /// Label.
    pub label: &'static str,
    /// How it is entered.
    pub input: Input,
    /// Placeholder: the CLI's default (the operation's `Default`), or an example.
    pub hint: String,
    /// Whether the spec needs a value (else empty = the CLI's default).
    pub required: bool,
    /// Shown under "more options".
    pub advanced: bool,
    /// For a [`Input::Choice`] whose words are not the spec's values: each
    /// word with the value the spec takes (`("none", "")`); empty = the
    /// word itself.
    pub values: &'static [(&'static str, &'static str)],
}

impl Field {
    /// An optional input shown at first.
    pub fn new(key: &'static str, label: &'static str, input: Input, hint: &str) -> Field {
        Field { key, label, input, hint: hint.to_string(), required: false, advanced: false, values: &[] }
    }

    /// The spec's value of each of the choice's words (see [`Field::values`]).
    pub fn values(self, values: &'static [(&'static str, &'static str)]) -> Field {
        Field { values, ..self }
    }

    /// The spec's value of the choice's word `word`.
    pub fn value_of<'a>(&self, word: &'a str) -> &'a str {
        self.values.iter().find(|(w, _)| *w == word).map_or(word, |(_, v)| v)
    }

    /// The spec needs a value.
    pub fn required(self) -> Field {
        Field { required: true, ..self }
    }

    /// Shown under "more options".
    pub fn advanced(self) -> Field {
        Field { advanced: true, ..self }
    }
}
