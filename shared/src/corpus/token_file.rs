//! Token files: a corpus tokenised once and read by offset (native only).
//!
//! `moe-studio tokenize` streams a text file through the rule of the module
//! above (documents cut by a [`DocSplit`], each document's ids followed by
//! the end-of-text token: [`super::document_ids`]) and writes its token
//! stream to a `.tokens` file; `train`, `eval`, `perplexity` and `route`
//! take that file wherever they take a text file. It is memory-mapped, so
//! reading it costs only the pages a sequence or window touches: `train`'s
//! resident memory does not grow with the corpus (docs/benchmarks.md,
//! "Corpora larger than memory"), and several processes (ranks) share one
//! copy in the page cache. The ids are exactly those of the text path, so a
//! run on the token file gives the same losses as on the text
//! (`backend/tests/inspect_generate_route_cli.rs`,
//! `every_command_reads_the_same_token_stream`).
//!
//! The idea is that of Megatron-LM's indexed dataset and nanoGPT's
//! `train.bin` (ids on disk, documents by offset); the layout is our own.
//! Little-endian; the footer comes last, as in Parquet, so that the file is
//! written in one pass:
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `MOETOK01` |
//! | 4·T | the token ids, `u32` |
//! | 0 or 4 | zero padding to a multiple of 8 |
//! | 8·(D+1) | the start of each document in the ids, `u64`, then T |
//! | F | the footer, JSON ([`TokenFileHeader`]) |
//! | 8 | F, `u64` |
//! | 8 | magic `MOETOK01` |

use std::io::{BufRead, Write};
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{document_ids, document_separator, DocSplit, DocumentSplitter};
use crate::error::{Result, StudioError};
use crate::tensor_io::Bytes;
use crate::tokenizer::Tokenizer;

/// The first and last 8 bytes of a token file.
pub const MAGIC: [u8; 8] = *b"MOETOK01";

/// The extension that marks a token file (`corpus.tokens`).
pub const EXTENSION: &str = "tokens";

/// The footer's `format` value.
pub const FORMAT: &str = "moe-studio tokens";

/// The footer's `version` this reader understands.
pub const VERSION: u32 = 1;

/// The text whose ids identify a tokenizer in a token file's footer (it
/// mixes English, Hungarian, Greek, Turkish, code and CJK, so vocabularies
/// that merely share a size give different ids).
const PROBE: &str = "The quick brown fox jumps over the lazy dog. 0123456789 Árvíztűrő tükörfúrógép \
                     Ελληνικά Türkçe\ndef f(x):\n    return x ** 2  # 日本語 <|endoftext|>";

/// Documents tokenised per parallel batch while writing (by text size).
const BATCH_BYTES: usize = 4 << 20;

/// What identifies the tokenizer a token file was written with: a file is
/// only read with a tokenizer that gives the same vocabulary size,
/// end-of-text token, ids of a probe text and vocabulary (every id's
/// token: two tokenizers that differ in a pair of ids the probe never
/// meets are told apart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerFingerprint {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// The end-of-text token that follows each document ([`document_separator`]).
    pub separator: Option<u32>,
    /// [`super::stream_sha256`] of the probe text's ids (special tokens added).
    pub probe_sha256: String,
    /// [`vocab_sha256`] of the tokenizer; empty in files written before it
    /// was recorded (those are checked on the other fields only).
    #[serde(default)]
    pub vocab_sha256: String,
}

/// SHA-256 (hex) of a tokenizer's vocabulary: for each id in order, the
/// byte length (u32 little-endian) and the bytes of its piece as Hugging
/// Face spells it ([`Tokenizer::hf_pieces`]: a llama2.c `.bin` and
/// its converted `tokenizer.json` give the same hash), `u32::MAX` for an id
/// without one.
pub fn vocab_sha256(tok: &Tokenizer) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in tok.hf_pieces() {
        match p {
            Some(b) => {
                h.update((b.len() as u32).to_le_bytes());
                h.update(&b);
            }
            None => h.update(u32::MAX.to_le_bytes()),
        }
    }
    format!("{:x}", h.finalize())
}

impl TokenizerFingerprint {
    /// The fingerprint of `tok`.
    ///
    /// # Errors
    /// [`StudioError::Tokenizer`] when the probe does not encode.
    pub fn of(tok: &Tokenizer) -> Result<Self> {
        Ok(TokenizerFingerprint {
            vocab_size: tok.vocab_size(),
            separator: document_separator(tok),
            probe_sha256: super::stream_sha256(&tok.encode(PROBE, true)?),
            vocab_sha256: vocab_sha256(tok),
        })
    }

    /// Whether a file written with `self` may be read with the tokenizer
    /// `have` (its fingerprint): every recorded field equal.
    pub fn accepts(&self, have: &TokenizerFingerprint) -> bool {
        self.vocab_size == have.vocab_size
            && self.separator == have.separator
            && self.probe_sha256 == have.probe_sha256
            && (self.vocab_sha256.is_empty() || self.vocab_sha256 == have.vocab_sha256)
    }
}

/// A token file's footer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenFileHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The text file it was written from, as given to `tokenize`.
    pub source: String,
    /// Its size in bytes.
    pub source_bytes: u64,
    /// How it was cut into documents: `blank`, `line`, `file` ([`DocSplit`]) or `jsonl`.
    pub docs: String,
    /// The tokenizer.
    pub tokenizer: TokenizerFingerprint,
    /// Documents D.
    pub documents: u64,
    /// Tokens T (separators included).
    pub tokens: u64,
    /// [`super::stream_sha256`] of the T ids: what `train`, `eval` and
    /// `route` report as the stream's `stream_sha256`, equal to the text
    /// path's for the same file.
    pub sha256: String,
}

/// An open token file: the ids and document offsets, memory-mapped.
pub struct TokenFile {
    path: String,
    bytes: Bytes,
    header: TokenFileHeader,
    tokens: usize,
    offsets_at: usize,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenFile({}, {} tokens, {} documents)", self.path, self.tokens, self.header.documents)
    }
}

/// Whether `path` names a token file (extension `.tokens`).
pub fn is_token_file(path: &str) -> bool {
    Path::new(path).extension().is_some_and(|e| e == EXTENSION)
}

fn tokens_end(tokens: usize) -> usize {
    8 + 4 * tokens
}

fn offsets_start(tokens: usize) -> usize {
    tokens_end(tokens).next_multiple_of(8)
}

impl TokenFile {
    /// Opens and checks a token file: the magic at both ends, the footer,
    /// that its sections have the sizes the footer gives, that the document
    /// offsets increase, and that the ids hash to the footer's SHA-256 (the
    /// `stream_sha256` every report prints; read in 4 MiB chunks whose
    /// pages are released after hashing, ~1 s per GB here).
    ///
    /// # Errors
    /// [`StudioError::Io`] naming the file when it cannot be mapped;
    /// [`StudioError::Format`] naming it for anything else (not a token
    /// file, truncated, a footer that does not parse, a newer version,
    /// section sizes that disagree with the footer, offsets that do not
    /// increase, ids changed since the file was written).
    pub fn open(path: &Path) -> Result<Self> {
        if cfg!(target_endian = "big") {
            return Err(StudioError::Invalid("token files are little-endian; this machine is big-endian".into()));
        }
        let name = path.display().to_string();
        let bad = |what: String| StudioError::format(&name, "moe-studio token file", what);
        let bytes = Bytes::map_file(path)?;
        let b = bytes.as_slice();
        let n = b.len();
        if n < 32 || b[..8] != MAGIC || b[n - 8..] != MAGIC {
            return Err(bad(format!(
                "{n} bytes without the MOETOK01 magic at both ends: not a file written by `moe-studio tokenize`, or a truncated one"
            )));
        }
        let f = u64::from_le_bytes(b[n - 16..n - 8].try_into().expect("8 bytes")) as usize;
        if f > n - 24 {
            return Err(bad(format!("its footer claims {f} bytes, the file has {n}")));
        }
        let footer_at = n - 16 - f;
        let header: TokenFileHeader = serde_json::from_slice(&b[footer_at..n - 16])
            .map_err(|e| bad(format!("the footer is not a token file's JSON: {e}")))?;
        if header.format != FORMAT || header.version > VERSION {
            return Err(bad(format!(
                "footer format `{}` version {}; this build reads `{FORMAT}` up to version {VERSION}",
                header.format, header.version
            )));
        }
        let (t, d) = (header.tokens as usize, header.documents as usize);
        let offsets_at = offsets_start(t);
        if offsets_at + 8 * (d + 1) != footer_at {
            return Err(bad(format!(
                "{t} tokens and {d} documents (the footer) need {} bytes before the footer, the file has {footer_at}",
                offsets_at + 8 * (d + 1)
            )));
        }
        let file = TokenFile { path: name.clone(), bytes, header, tokens: t, offsets_at };
        let off = file.offsets();
        if off[0] != 0 || off[d] != t as u64 {
            return Err(bad(format!("document offsets run from {} to {}, expected 0 to {t}", off[0], off[d])));
        }
        if let Some(i) = off.windows(2).position(|w| w[0] >= w[1]) {
            return Err(bad(format!(
                "document {i} starts at {} and ends at {}: offsets must increase",
                off[i],
                off[i + 1]
            )));
        }
        // The footer's SHA-256 is what every report prints as the stream's, so it is checked
        // against the ids, a chunk at a time, each chunk's pages released once hashed (a
        // corpus larger than memory stays out of the resident set).
        let mut sha = Sha256::new();
        const CHUNK: usize = 4 << 20;
        let mut at = 8;
        while at < tokens_end(t) {
            let end = (at + CHUNK).min(tokens_end(t));
            sha.update(&file.bytes.as_slice()[at..end]);
            file.bytes.release(at..end);
            at = end;
        }
        let got: String = format!("{:x}", sha.finalize());
        if got != file.header.sha256 {
            return Err(bad(format!(
                "its ids hash to {got}, its footer records {}: the file was changed after `tokenize` wrote it",
                file.header.sha256
            )));
        }
        Ok(file)
    }

    /// The footer.
    pub fn header(&self) -> &TokenFileHeader {
        &self.header
    }

    /// The file's path, as opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The token stream, `[tokens]` (pages are read as they are touched).
    pub fn ids(&self) -> &[u32] {
        // The map starts on a page boundary and the ids at byte 8, so the
        // cast is aligned; the sizes were checked by `open`.
        bytemuck::cast_slice(&self.bytes.as_slice()[8..tokens_end(self.tokens)])
    }

    /// The start of each document in [`TokenFile::ids`], `[documents + 1]`
    /// (the last entry is the number of tokens).
    pub fn offsets(&self) -> &[u64] {
        let d = self.header.documents as usize;
        bytemuck::cast_slice(&self.bytes.as_slice()[self.offsets_at..self.offsets_at + 8 * (d + 1)])
    }

    /// Number of documents.
    pub fn num_documents(&self) -> usize {
        self.header.documents as usize
    }

    /// Document `i`'s ids, its end-of-text token included.
    ///
    /// # Panics
    /// When `i >= num_documents()`, as slice indexing does.
    pub fn document(&self, i: usize) -> &[u32] {
        let off = self.offsets();
        &self.ids()[off[i] as usize..off[i + 1] as usize]
    }

    /// Refuses a tokenizer other than the one the file was written with.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] naming the file and what differs; the
    /// tokenizer's own errors.
    pub fn check_tokenizer(&self, tok: &Tokenizer) -> Result<()> {
        let want = &self.header.tokenizer;
        let have = TokenizerFingerprint::of(tok)?;
        if want.accepts(&have) {
            return Ok(());
        }
        let what = if want.vocab_size != have.vocab_size {
            format!("a vocabulary of {} tokens, this model's tokenizer has {}", want.vocab_size, have.vocab_size)
        } else if want.separator != have.separator {
            format!("end-of-text token {:?}, this model's tokenizer has {:?}", want.separator, have.separator)
        } else if want.probe_sha256 != have.probe_sha256 {
            "a tokenizer that encodes text differently from this model's (same vocabulary size)".to_string()
        } else {
            "a tokenizer whose vocabulary differs from this model's (same size; some ids name other tokens)".to_string()
        };
        Err(StudioError::Invalid(format!(
            "{}: tokenised with {what}; run `moe-studio tokenize` again with this model's tokenizer",
            self.path
        )))
    }
}

/// Removes a half-written output when dropped before `keep`.
struct TmpGuard<'a>(&'a Path, bool);

impl Drop for TmpGuard<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_file(self.0);
        }
    }
}

/// Writes the token file of the text file `text` to `out`: documents cut by
/// `split` (JSON lines for `.jsonl`/`.json`), streamed, so memory holds one
/// batch of documents (4 MiB of text, tokenised in parallel) and the
/// document offsets (8 bytes per document), never the corpus — but a single
/// document is encoded whole, so one huge document (a 50 MB line, or
/// `--docs file` on a large file) needs the tokenizer's working memory for
/// all of it (~200 bytes per character with SmolLM2's). The file is written
/// beside `out` (`.NAME.tmp-PID`) and renamed into place: `out` is never
/// half-written; a temporary an interrupted run leaves is removed by the
/// next run for the same `out`. `progress(read, total)` is called after
/// each batch with bytes of text read and the file's size.
///
/// # Errors
/// [`StudioError::Io`] naming the file read or written; those of
/// [`DocumentSplitter::push_line`] (bad JSON line) and of the tokenizer;
/// [`StudioError::Invalid`] naming the file when a line is not UTF-8, when
/// it holds no document, when `out` is `text` itself, or when `text` is a
/// token file.
pub fn write_token_file(
    text: &Path,
    split: DocSplit,
    tok: &Tokenizer,
    out: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<TokenFileHeader> {
    let name = text.display().to_string();
    let same_file =
        out == text || matches!((std::fs::canonicalize(text), std::fs::canonicalize(out)), (Ok(a), Ok(b)) if a == b);
    if same_file {
        return Err(StudioError::Invalid(format!("{name}: the token file would overwrite the text it is made from")));
    }
    if is_token_file(&name) {
        return Err(StudioError::Invalid(format!(
            "{name}: this is already a token file (`.{EXTENSION}`); tokenize reads a text file (.txt, .jsonl)"
        )));
    }
    let io = |p: &Path, e: std::io::Error| StudioError::io(p.display(), e);
    let file = std::fs::File::open(text).map_err(|e| io(text, e))?;
    let total = file.metadata().map_err(|e| io(text, e))?.len();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let stem = format!(".{}.tmp-", out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    crate::tensor_io::writer::remove_stale_temporaries(out);
    let tmp = out.with_file_name(format!("{stem}{}", std::process::id()));
    let mut guard = TmpGuard(&tmp, false);
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).map_err(|e| io(out, e))?);
    w.write_all(&MAGIC).map_err(|e| io(out, e))?;

    let mut splitter = DocumentSplitter::new(&name, split);
    let mut sha = Sha256::new();
    let mut offsets: Vec<u64> = vec![0];
    let mut batch: Vec<String> = Vec::new();
    let mut batch_bytes = 0usize;
    let (mut read, mut line_no) = (0u64, 0usize);
    let mut line = Vec::new();
    let mut flush = |batch: &mut Vec<String>, w: &mut std::io::BufWriter<std::fs::File>| -> Result<()> {
        let ids: Vec<Vec<u32>> = batch.par_iter().map(|d| document_ids(d, tok)).collect::<Result<_>>()?;
        for d in ids {
            let b: &[u8] = bytemuck::cast_slice(&d);
            w.write_all(b).map_err(|e| io(out, e))?;
            sha.update(b);
            offsets.push(offsets.last().expect("starts with 0") + d.len() as u64);
        }
        batch.clear();
        Ok(())
    };
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(|e| io(text, e))?;
        if n == 0 {
            break;
        }
        read += n as u64;
        line_no += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let s = std::str::from_utf8(&line)
            .map_err(|e| StudioError::Invalid(format!("{name}: line {line_no} is not UTF-8 ({e})")))?;
        if let Some(doc) = splitter.push_line(s)? {
            batch_bytes += doc.len();
            batch.push(doc);
            if batch_bytes >= BATCH_BYTES {
                flush(&mut batch, &mut w)?;
                batch_bytes = 0;
                progress(read, total);
            }
        }
    }
    batch.extend(splitter.finish());
    flush(&mut batch, &mut w)?;
    progress(read, total);

    let tokens = *offsets.last().expect("starts with 0");
    let documents = offsets.len() as u64 - 1;
    if documents == 0 {
        return Err(StudioError::Invalid(format!("{name}: the corpus is empty (no non-empty document)")));
    }
    let pad = offsets_start(tokens as usize) - tokens_end(tokens as usize);
    w.write_all(&[0u8; 4][..pad]).map_err(|e| io(out, e))?;
    w.write_all(bytemuck::cast_slice(&offsets)).map_err(|e| io(out, e))?;
    let header = TokenFileHeader {
        format: FORMAT.into(),
        version: VERSION,
        source: name.clone(),
        source_bytes: total,
        docs: if super::is_jsonl(&name) { "jsonl".into() } else { split.name().into() },
        tokenizer: TokenizerFingerprint::of(tok)?,
        documents,
        tokens,
        sha256: format!("{:x}", sha.finalize()),
    };
    let footer = serde_json::to_vec(&header).expect("the footer serialises");
    w.write_all(&footer).map_err(|e| io(out, e))?;
    w.write_all(&(footer.len() as u64).to_le_bytes()).map_err(|e| io(out, e))?;
    w.write_all(&MAGIC).map_err(|e| io(out, e))?;
    let f = w.into_inner().map_err(|e| io(out, e.into_error()))?;
    f.sync_all().map_err(|e| io(out, e))?;
    std::fs::rename(&tmp, out).map_err(|e| io(out, e))?;
    guard.1 = true;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word_level(vocab: &str) -> Tokenizer {
        let json = format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,
            "model":{{"type":"WordLevel","vocab":{vocab},"unk_token":"[UNK]"}}}}"#
        );
        Tokenizer::from_hf_json(json.as_bytes(), "t").unwrap()
    }

    /// Two tokenizers of one size that encode the probe alike but name two
    /// ids differently are told apart by the vocabulary hash (the probe
    /// alone accepted such a file, and its ids were read as other tokens);
    /// a file written before the hash was recorded is checked as before.
    #[test]
    fn a_vocabulary_with_swapped_ids_is_refused() {
        let a = word_level(r#"{"[UNK]":0,"zz":1,"yy":2}"#);
        let b = word_level(r#"{"[UNK]":0,"yy":1,"zz":2}"#);
        let (fa, fb) = (TokenizerFingerprint::of(&a).unwrap(), TokenizerFingerprint::of(&b).unwrap());
        assert_eq!((fa.vocab_size, &fa.probe_sha256), (fb.vocab_size, &fb.probe_sha256));
        assert_ne!(fa.vocab_sha256, fb.vocab_sha256);
        assert!(fa.accepts(&TokenizerFingerprint::of(&a).unwrap()));
        assert!(!fa.accepts(&fb));
        let old = TokenizerFingerprint { vocab_sha256: String::new(), ..fa.clone() };
        assert!(old.accepts(&fb));
        let parsed: TokenizerFingerprint =
            serde_json::from_str(r#"{"vocab_size":3,"separator":null,"probe_sha256":"x"}"#).unwrap();
        assert!(parsed.vocab_sha256.is_empty());
    }
}
