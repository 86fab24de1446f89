//! Text corpora → documents → the token stream: the one rule every command
//! that reads text follows (`train`, `eval`, `perplexity`, `route`,
//! `neurons`, `allocate --similarity`, the server's jobs and the tab).
//!
//! **Documents.** A `.jsonl`/`.json` file holds one document per line (the
//! string field `text`). A plain-text file is cut by a [`DocSplit`], the
//! `sample_by` of Hugging Face `datasets`' text loader, close to it but not
//! byte for byte (`datasets` splits on exactly `"\n\n"`, so a whitespace-only
//! line or a third newline stays inside its neighbour; the studio takes a
//! run of blank or whitespace-only lines as one separator):
//! - [`DocSplit::Blank`] (the default; `datasets`' `paragraph`): documents
//!   are separated by one or more blank lines (empty or whitespace only);
//!   the lines of a document are kept as they are (indentation included,
//!   a trailing `\r` removed) and joined by `\n`. This is how the corpora
//!   under `../shared/data/corpora` are written (`SOURCES.md`: "Documents
//!   are separated by a blank line"; each Python file of `domain/code` is
//!   one document).
//! - [`DocSplit::Line`] (`datasets`' `line`): every non-empty line is a
//!   document (trailing whitespace removed).
//! - [`DocSplit::File`] (`datasets`' `document`): the whole file is one
//!   document (leading/trailing blank lines and trailing whitespace removed).
//!
//! **Token ids of a document** ([`document_ids`]): the tokenizer's encoding
//! with its special tokens (transformers' `tokenizer(text)` default: the
//! BOS a vocabulary adds — Gemma, llama2.c — and nothing for SmolLM2 or
//! Qwen2), then the end-of-text token when the vocabulary has one
//! ([`document_separator`]: `<|endoftext|>`, `</s>`, ...). llama2.c
//! vocabularies have none and mark documents with the BOS their encoding
//! puts first, as llama2.c's own pre-tokenisation does.
//!
//! **The token stream** ([`token_stream`]) of a file is the concatenation of
//! its documents' ids: `ids(doc1) + EOS + ids(doc2) + EOS + ...`. Training
//! packs it into sequences, `eval`/`perplexity` score it in windows, `route`
//! cuts it into sequences for statistics and held-out accuracy, and
//! `neurons` pools over each document's own ids. So the same file gives the
//! same token ids in every command
//! (`shared/tests/integration/corpus.rs` checks them against the Hugging
//! Face tokenizer), and every report records the stream's
//! [`stream_sha256`] so that a reader can check that two commands saw the
//! same tokens.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
use crate::tokenizer::Tokenizer;

#[cfg(not(target_arch = "wasm32"))]
pub mod token_file;

/// How a plain-text file is cut into documents (`--docs`); the names are
/// those of the studio, `datasets`' `sample_by` equivalents in brackets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocSplit {
    /// One document per non-empty line (`sample_by="line"`).
    Line,
    /// Documents separated by blank lines (`sample_by="paragraph"`); the default.
    #[default]
    Blank,
    /// The whole file is one document (`sample_by="document"`).
    File,
}

impl DocSplit {
    /// Every variant, in the order `--docs` lists them.
    pub const ALL: [DocSplit; 3] = [DocSplit::Line, DocSplit::Blank, DocSplit::File];

    /// The `--docs` name: `line`, `blank` or `file`.
    pub fn name(self) -> &'static str {
        match self {
            DocSplit::Line => "line",
            DocSplit::Blank => "blank",
            DocSplit::File => "file",
        }
    }
}

impl fmt::Display for DocSplit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DocSplit {
    type Err = String;

    /// Parses `line`, `blank` or `file`; `datasets`' names `paragraph` and
    /// `document` are accepted as `blank` and `file`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "line" => Ok(DocSplit::Line),
            "blank" | "paragraph" => Ok(DocSplit::Blank),
            "file" | "document" => Ok(DocSplit::File),
            o => Err(format!("`{o}`: expected line (one document per line), blank (documents separated by blank lines) or file (the whole file is one document)")),
        }
    }
}

/// Whether `file_name` is read as JSON lines (field `text`), whatever the split.
pub fn is_jsonl(file_name: &str) -> bool {
    file_name.ends_with(".jsonl") || file_name.ends_with(".json")
}

/// Splits file contents into documents (see the module docs): JSON lines
/// (field `text`) when `file_name` ends in `.jsonl`/`.json`, else plain
/// text cut by `split`. Empty (whitespace-only) documents are dropped.
/// The lines go through a [`DocumentSplitter`], the rule the streaming
/// reader of a token file ([`token_file::write_token_file`]) also follows.
///
/// # Errors
/// [`StudioError::Format`] for a JSON line that does not parse or lacks a
/// string `text` (naming the line); [`StudioError::Invalid`] naming the file
/// when there is no document.
pub fn split_documents(contents: &str, file_name: &str, split: DocSplit) -> Result<Vec<String>> {
    let mut docs = Vec::new();
    let mut s = DocumentSplitter::new(file_name, split);
    for line in contents.lines() {
        if let Some(d) = s.push_line(line)? {
            docs.push(d);
        }
    }
    docs.extend(s.finish());
    if docs.is_empty() {
        return Err(StudioError::Invalid(format!("{file_name}: the corpus is empty (no non-empty document)")));
    }
    Ok(docs)
}

/// Cuts a file into documents one line at a time (module docs): fed the
/// file's lines in order (without their `\n`), it returns each document
/// as soon as it ends; [`DocumentSplitter::finish`] returns the last one.
/// [`split_documents`] (a file in memory) and the token file writer (a file
/// streamed from disk) both use it, so both cut a file the same way.
#[derive(Debug, Clone)]
pub struct DocumentSplitter {
    file_name: String,
    split: DocSplit,
    jsonl: bool,
    line_no: usize,
    /// The document being built (`Blank`, `File`).
    cur: String,
    started: bool,
    /// `File`: whitespace-only lines after the last non-blank line (kept
    /// only if another non-blank line follows).
    pending: Vec<String>,
}

impl DocumentSplitter {
    /// A splitter for `file_name` (JSON lines when [`is_jsonl`], else `split`).
    pub fn new(file_name: &str, split: DocSplit) -> Self {
        DocumentSplitter {
            file_name: file_name.to_string(),
            split,
            jsonl: is_jsonl(file_name),
            line_no: 0,
            cur: String::new(),
            started: false,
            pending: Vec::new(),
        }
    }

    /// Feeds the next line (without its line ending); returns the document
    /// this line completes, if any.
    ///
    /// # Errors
    /// [`StudioError::Format`] for a JSON line that does not parse or lacks
    /// a string `text`, naming the file and the line.
    pub fn push_line(&mut self, line: &str) -> Result<Option<String>> {
        self.line_no += 1;
        let blank = line.trim().is_empty();
        if self.jsonl {
            if blank {
                return Ok(None);
            }
            let (f, n) = (&self.file_name, self.line_no);
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| StudioError::format(f, "JSON lines", format!("line {n}: {e}")))?;
            let text = v
                .get("text")
                .and_then(|t| t.as_str())
                .ok_or_else(|| StudioError::format(f, "JSON lines", format!("line {n}: no string field `text`")))?;
            return Ok((!text.trim().is_empty()).then(|| text.to_string()));
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        match self.split {
            DocSplit::Line => Ok((!blank).then(|| line.trim_end().to_string())),
            DocSplit::Blank => {
                if blank {
                    return Ok(self.started.then(|| self.take()));
                }
                if self.started {
                    self.cur.push('\n');
                }
                self.cur.push_str(line);
                self.started = true;
                Ok(None)
            }
            DocSplit::File => {
                if blank {
                    if self.started {
                        self.pending.push(line.to_string());
                    }
                    return Ok(None);
                }
                if self.started {
                    for p in self.pending.drain(..) {
                        self.cur.push('\n');
                        self.cur.push_str(&p);
                    }
                    self.cur.push('\n');
                }
                self.cur.push_str(line);
                self.started = true;
                Ok(None)
            }
        }
    }

    fn take(&mut self) -> String {
        self.started = false;
        self.pending.clear();
        std::mem::take(&mut self.cur)
    }

    /// Ends the file: the last document, if one is open.
    pub fn finish(mut self) -> Option<String> {
        if !self.started {
            return None;
        }
        let doc = self.take();
        Some(if self.split == DocSplit::File { doc.trim_end().to_string() } else { doc })
    }
}

/// The end-of-document token of a Hugging Face tokenizer, if it has one of
/// the usual names (`None` for llama2.c vocabularies, which mark documents
/// with BOS instead).
pub fn document_separator(tok: &Tokenizer) -> Option<u32> {
    match tok {
        Tokenizer::Hf(t) => {
            ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>"].iter().find_map(|s| t.token_to_id(s))
        }
        Tokenizer::Llama2c(_) => None,
    }
}

/// The token ids of one document: its encoding with the tokenizer's special
/// tokens, then the end-of-text token when the vocabulary has one (module
/// docs).
///
/// # Errors
/// [`StudioError::Tokenizer`] when encoding fails.
pub fn document_ids(doc: &str, tok: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = tok.encode(doc, true)?;
    if let Some(s) = document_separator(tok) {
        ids.push(s);
    }
    Ok(ids)
}

/// The token stream of `docs`: every document's [`document_ids`], concatenated.
///
/// # Errors
/// [`StudioError::Tokenizer`] when encoding fails.
pub fn token_stream(docs: &[String], tok: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for d in docs {
        ids.extend(document_ids(d, tok)?);
    }
    Ok(ids)
}

/// The token stream of file contents: [`split_documents`] then [`token_stream`].
/// What the tab calls for a pasted or uploaded text (`what` names it in errors).
///
/// # Errors
/// Those of [`split_documents`] and [`token_stream`].
pub fn text_stream(contents: &str, what: &str, split: DocSplit, tok: &Tokenizer) -> Result<Vec<u32>> {
    token_stream(&split_documents(contents, what, split)?, tok)
}

/// The SHA-256 of a token stream, lowercase hex: of the ids as
/// little-endian `u32` bytes (Python: `hashlib.sha256(numpy.asarray(ids,
/// dtype="<u4").tobytes()).hexdigest()`). `eval`, `perplexity`, `route`,
/// `train` and `neurons` report it for each file they read.
pub fn stream_sha256(ids: &[u32]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(4 * 16384);
    for chunk in ids.chunks(16384) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|id| id.to_le_bytes()));
        h.update(&buf);
    }
    format!("{:x}", h.finalize())
}

/// Reads a file's documents (native only).
///
/// # Errors
/// [`StudioError::Io`] naming the file; those of [`split_documents`].
#[cfg(not(target_arch = "wasm32"))]
pub fn read_documents(path: &str, split: DocSplit) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| StudioError::io(path, e))?;
    split_documents(&text, path, split)
}

/// A token stream held in memory or read from a token file
/// ([`token_file::TokenFile`], memory-mapped: its pages are read when a
/// window or sequence touches them, so a corpus larger than RAM costs no
/// resident memory beyond what is read). Dereferences to the ids, `[tokens]`.
#[derive(Debug, Clone)]
pub enum Stream {
    /// Ids tokenised by this process, with their [`stream_sha256`] once
    /// asked for (every report and checkpoint fingerprint asks again).
    Owned(Vec<u32>, std::sync::OnceLock<String>),
    /// A token file's ids (its SHA-256 is the one recorded when it was written).
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(std::sync::Arc<token_file::TokenFile>),
}

impl Stream {
    /// [`stream_sha256`] of the ids: computed for owned ids, read from the
    /// footer for a token file (whose ids are not all read for it).
    pub fn sha256(&self) -> String {
        match self {
            Stream::Owned(ids, sha) => sha.get_or_init(|| stream_sha256(ids)).clone(),
            #[cfg(not(target_arch = "wasm32"))]
            Stream::Mapped(f) => f.header().sha256.clone(),
        }
    }

    /// How the stream's documents were cut, for reports: `given` (the
    /// command's `--docs`) for ids tokenised here, the split recorded in a
    /// token file's footer otherwise (`--docs` does not apply to it).
    pub fn docs_name(&self, given: DocSplit) -> String {
        match self {
            Stream::Owned(..) => given.name().to_string(),
            #[cfg(not(target_arch = "wasm32"))]
            Stream::Mapped(f) => f.header().docs.clone(),
        }
    }
}

impl std::ops::Deref for Stream {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        match self {
            Stream::Owned(ids, _) => ids,
            #[cfg(not(target_arch = "wasm32"))]
            Stream::Mapped(f) => f.ids(),
        }
    }
}

impl From<Vec<u32>> for Stream {
    fn from(ids: Vec<u32>) -> Self {
        Stream::Owned(ids, Default::default())
    }
}

/// Reads a file's token stream (native only). A token file
/// ([`token_file::is_token_file`]: `.tokens`, written by `moe-studio
/// tokenize`) is memory-mapped and checked against `tok` (its documents
/// were cut when it was written, so `split` does not apply); any other
/// file is [`read_documents`] then [`token_stream`].
///
/// # Errors
/// Those of [`read_documents`] and [`token_stream`]; for a token file those
/// of [`token_file::TokenFile::open`] and
/// [`token_file::TokenFile::check_tokenizer`].
#[cfg(not(target_arch = "wasm32"))]
pub fn read_stream(path: &str, split: DocSplit, tok: &Tokenizer) -> Result<Stream> {
    if token_file::is_token_file(path) {
        let f = token_file::TokenFile::open(std::path::Path::new(path))?;
        f.check_tokenizer(tok)?;
        return Ok(Stream::Mapped(std::sync::Arc::new(f)));
    }
    Ok(token_stream(&read_documents(path, split)?, tok)?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: &str = "# ===== file: a.py =====\ndef f():\n    return 1\n\n\n# ===== file: b.py =====\nx = 2  \n";

    #[test]
    fn blank_lines_separate_documents_and_keep_indentation() {
        let d = split_documents(CODE, "c.txt", DocSplit::Blank).unwrap();
        assert_eq!(d, vec!["# ===== file: a.py =====\ndef f():\n    return 1", "# ===== file: b.py =====\nx = 2  "]);
        let d = split_documents("a\r\nb\r\n \r\nc\r\n", "w.txt", DocSplit::Blank).unwrap();
        assert_eq!(d, vec!["a\nb", "c"]);
    }

    #[test]
    fn line_and_file_splits() {
        assert_eq!(split_documents("a\n\n b \n", "f.txt", DocSplit::Line).unwrap(), vec!["a", " b"]);
        assert_eq!(split_documents(CODE, "c.txt", DocSplit::Line).unwrap().len(), 5);
        let f = split_documents("\n\n a\n\nb  \n\n", "f.txt", DocSplit::File).unwrap();
        assert_eq!(f, vec![" a\n\nb"]);
    }

    #[test]
    fn jsonl_is_one_document_per_line_whatever_the_split() {
        for s in DocSplit::ALL {
            let d = split_documents("{\"text\":\"x\\n\\ny\"}\n\n{\"text\":\"z\"}\n", "f.jsonl", s).unwrap();
            assert_eq!(d, vec!["x\n\ny", "z"]);
        }
        let e = split_documents("{\"text\":\"x\"}\n{\"t\":1}\n", "f.jsonl", DocSplit::Blank).unwrap_err().to_string();
        assert!(e.contains("f.jsonl") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn an_empty_corpus_names_the_file() {
        for s in DocSplit::ALL {
            let e = split_documents("\n \n\t\n", "empty.txt", s).unwrap_err().to_string();
            assert!(e.contains("empty.txt") && e.contains("empty"), "{e}");
        }
    }

    #[test]
    fn digest_is_sha256_of_little_endian_u32() {
        // python3 -c 'import hashlib,struct; print(hashlib.sha256(struct.pack("<3I",1,2,65536)).hexdigest())'
        assert_eq!(stream_sha256(&[1, 2, 65536]), "b9f5fe6ff037564f7628f61b720ece17b215389c80de1c7c9dc538029eaf63e3");
        assert_ne!(stream_sha256(&[1, 2]), stream_sha256(&[2, 1]));
    }

    #[test]
    fn names_parse_and_print() {
        for s in DocSplit::ALL {
            assert_eq!(s.name().parse::<DocSplit>().unwrap(), s);
        }
        assert_eq!("paragraph".parse::<DocSplit>().unwrap(), DocSplit::Blank);
        assert_eq!("document".parse::<DocSplit>().unwrap(), DocSplit::File);
        assert!("lines".parse::<DocSplit>().unwrap_err().contains("expected line"));
        assert_eq!(DocSplit::default(), DocSplit::Blank);
        assert_eq!(serde_json::to_string(&DocSplit::File).unwrap(), "\"file\"");
    }
}
