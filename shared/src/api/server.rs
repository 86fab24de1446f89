//! The server's error body, the checks of ids and names every route
//! shares, and `GET /api/info`.

use serde::{Deserialize, Serialize};

/// The JSON body of every 4xx/5xx answer: `{"error": "...", "field": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong and what was expected, in one sentence.
    pub error: String,
    /// The request field (or path parameter / header) at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// An error about `field`.
    pub fn field(field: &str, error: impl Into<String>) -> Self {
        ApiError { error: error.into(), field: Some(field.into()) }
    }
    /// An error not tied to one field.
    pub fn msg(error: impl Into<String>) -> Self {
        ApiError { error: error.into(), field: None }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(x) => write!(f, "{x}: {}", self.error),
            None => f.write_str(&self.error),
        }
    }
}

/// Whether `s` is an id as the server issues them: a lowercase hyphenated
/// UUID (36 characters `[0-9a-f-]`). Anything else never reaches a path.
pub fn is_valid_id(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// Whether `s` is acceptable as an uploaded file's name: 1-128 characters
/// of `[A-Za-z0-9._-]`, starting with a letter or digit (so never `.`, `..`,
/// a hidden file or anything with a separator).
pub fn is_valid_file_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Longest display name of a checkpoint or a job, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// Whether `c` may not appear in a display name: control characters
/// (Unicode `Cc`), the bidirectional formatting characters that reorder
/// what is shown (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069: a name
/// must read as it is stored), line and paragraph separators and the BOM.
pub fn is_forbidden_in_name(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

/// Checks the display name of a checkpoint or a job, the same way for the
/// server (`POST /api/checkpoints`, `POST /api/jobs`, job outputs) and the
/// browser's forms; returns it trimmed of surrounding whitespace.
///
/// # Errors
/// An [`ApiError`] about `field` for an empty (or all-whitespace) name, one
/// over [`MAX_NAME_CHARS`] characters, or one holding a character of
/// [`is_forbidden_in_name`] (named by its code point).
pub fn check_name(field: &str, name: &str) -> Result<String, ApiError> {
    let t = name.trim();
    if t.is_empty() {
        return Err(ApiError::field(field, "the name is empty: expected 1-200 printable characters"));
    }
    let n = t.chars().count();
    if n > MAX_NAME_CHARS {
        return Err(ApiError::field(
            field,
            format!("the name is {n} characters long: expected at most {MAX_NAME_CHARS}"),
        ));
    }
    if let Some((i, c)) = t.chars().enumerate().find(|(_, c)| is_forbidden_in_name(*c)) {
        return Err(ApiError::field(
            field,
            format!(
                "character {i} of the name is U+{:04X}, a control or bidirectional-formatting character: expected printable text",
                c as u32
            ),
        ));
    }
    Ok(t.to_string())
}

/// Whether `s` is a lowercase hex sha256 (64 characters).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// An [`ApiError`] about `field` unless `id` [`is_valid_id`].
pub(super) fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(ApiError::field(field, format!("`{id}` is not an id (expected a lowercase hyphenated UUID)")))
    }
}

/// `GET /api/info`: what this server is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// `moe-studio` version.
    pub version: String,
    /// Burn backends compiled in (`cpu` always; `wgpu`, `cuda`).
    pub backends: Vec<String>,
    /// The backend jobs use unless their spec names another.
    pub default_backend: String,
    /// Jobs that run at once.
    pub workers: usize,
    /// Largest accepted upload, bytes.
    pub max_upload_bytes: u64,
    /// Chunk size used when an upload does not choose one, bytes.
    pub default_chunk_size: u64,
    /// Largest chunk size an upload may choose, bytes.
    pub max_chunk_size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names() {
        assert!(is_valid_id("123e4567-e89b-42d3-a456-426614174000"));
        assert!(!is_valid_id("123E4567-e89b-42d3-a456-426614174000"));
        assert!(!is_valid_id("../../../../etc/passwd"));
        assert!(!is_valid_id("123e4567-e89b-42d3-a456-42661417400/"));
        assert!(is_valid_file_name("tok512.bin"));
        assert!(!is_valid_file_name(".."));
        assert!(!is_valid_file_name(".hidden"));
        assert!(!is_valid_file_name("a/b"));
    }

    #[test]
    fn names_are_checked_the_same_everywhere() {
        assert_eq!(check_name("name", "  stories260K MoE  ").unwrap(), "stories260K MoE");
        assert_eq!(check_name("name", "árvíztűrő 🦀 models").unwrap(), "árvíztűrő 🦀 models");
        for bad in ["", "   ", "a\nb", "a\u{7}b", "evil\u{202E}txt.exe", "x\u{2066}y", "\u{200F}", "a\u{FEFF}"] {
            let e = check_name("spec.name", bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("spec.name"), "{bad:?}");
        }
        assert!(check_name("name", &"x".repeat(200)).is_ok());
        assert!(check_name("name", &"x".repeat(201)).unwrap_err().error.contains("201 characters"));
        let e = check_name("name", "a\u{202E}b").unwrap_err().error;
        assert!(e.contains("U+202E"), "{e}");
    }
}
