//! The model card of a command's output (`moe_shared::tensor_io::card`):
//! the command line exactly as it ran (a server job runs the same command
//! in a child process, so its card says what the job ran) and the inputs as
//! the user named them, with the license each states.

use std::path::Path;
use std::sync::Mutex;

use moe_shared::tensor_io::card::{CardMethod, ModelCard};

/// The license an input model states (native only): a directory's own
/// `README.md` front matter `license`, or a GGUF file's `general.license`
/// (also a directory's single `.gguf`); `None` when it states none.
fn input_license(path: &std::path::Path) -> Option<moe_shared::tensor_io::card::License> {
    if path.is_dir() {
        if let Ok(text) = std::fs::read_to_string(path.join(moe_shared::tensor_io::card::CARD_FILE)) {
            if let Some(l) = moe_shared::tensor_io::card::card_license(&text) {
                return Some(l);
            }
        }
        let ggufs: Vec<std::path::PathBuf> = std::fs::read_dir(path)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        return match ggufs.as_slice() {
            [one] if !path.join("config.json").exists() => input_license(one),
            _ => None,
        };
    }
    if path.extension().is_some_and(|e| e == "gguf") {
        let bytes = moe_shared::tensor_io::Bytes::map_file(path).ok()?;
        let model = moe_shared::checkpoint::gguf::open(bytes, &path.display().to_string()).ok()?;
        return model.file.get_str("general.license").map(moe_shared::tensor_io::card::License::id);
    }
    None
}

/// An input of a CLI command: `role`, the path as given, its license.
fn cli_input(role: impl Into<String>, path: &std::path::Path) -> moe_shared::tensor_io::card::CardInput {
    moe_shared::tensor_io::card::CardInput {
        role: role.into(),
        name: path.display().to_string(),
        license: input_license(path),
    }
}

/// Quotes one argument for a POSIX shell when it needs it.
fn quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./=:,@%+".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// `moe-studio ARGS...`, each argument quoted for a shell where needed.
pub fn command_of<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> String {
    let mut out = "moe-studio".to_string();
    for a in args {
        out.push(' ');
        out.push_str(&quote(a.as_ref()));
    }
    out
}

static COMMAND: Mutex<Option<String>> = Mutex::new(None);

/// Sets (or clears) the command line the cards of this process name
/// instead of its own: `run-job` names the job's command typed out (what
/// its typed arguments equal) rather than `moe-studio run-job job.json`.
pub fn set_command(command: Option<String>) {
    *COMMAND.lock().unwrap_or_else(|e| e.into_inner()) = command;
}

/// This process's command line as `moe-studio ARGS...`, each argument
/// quoted for a shell where needed (the binary's own path is replaced by
/// its name), or the one [`set_command`] gave.
pub fn command_line() -> String {
    if let Some(c) = COMMAND.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return c;
    }
    command_of(std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()))
}

/// The recipe a `moe-studio recipe` run is executing (its stages run in this
/// process, so their cards describe the recipe: its YAML, its inputs and
/// the stage).
#[derive(Debug, Clone)]
pub struct RecipeContext {
    /// The recipe file's text.
    pub yaml: String,
    /// The recipe's inputs `(key, path)`.
    pub inputs: Vec<(String, std::path::PathBuf)>,
    /// The stage running now (`moe-studio ...`).
    pub stage: String,
}

static RECIPE: Mutex<Option<RecipeContext>> = Mutex::new(None);

/// Sets (or clears) the recipe the following cards belong to.
pub fn set_recipe(ctx: Option<RecipeContext>) {
    *RECIPE.lock().unwrap_or_else(|e| e.into_inner()) = ctx;
}

/// A card for `method` with this process's command line and `inputs`
/// (`(role, path)`, each with the license it states). Inside a recipe the
/// inputs are the recipe's (a later stage reads the work directory) and the
/// card carries the recipe and the stage.
pub fn card<'a>(method: CardMethod, inputs: impl IntoIterator<Item = (String, &'a Path)>) -> ModelCard {
    let mut c = ModelCard::new(method).command(command_line());
    c.inputs = inputs.into_iter().map(|(role, path)| cli_input(role, path)).collect();
    if let Some(r) = RECIPE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        c.inputs = r.inputs.iter().map(|(key, path)| cli_input(key.clone(), path)).collect();
        c.recipe = Some(("yaml".into(), r.yaml.clone()));
        c.detail("recipe stage", format!("`{}`", r.stage));
    }
    c
}

/// `card` as the `README.md` extra file of an output written to `out`
/// (for writers that take ready files: `save_model`), titled with the
/// directory's name.
pub fn readme(mut card: ModelCard, out: &Path) -> (&'static str, Vec<u8>) {
    if card.title.is_empty() {
        card.title = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    }
    (moe_shared::tensor_io::card::CARD_FILE, card.render().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_quoted_only_when_needed() {
        assert_eq!(quote("--experts"), "--experts");
        assert_eq!(quote("en=data/en.txt:held.txt"), "en=data/en.txt:held.txt");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
    }
}
