//! llama2.c vocabularies (`tokenizer.bin`, `tok512.bin`) and the
//! score-driven BPE of llama2.c's `run.c` (`encode` / `decode`).
//!
//! File layout: `i32 max_token_length`, then per token `f32 score`,
//! `i32 len`, `len` bytes. Byte-fallback tokens `<0xXX>` have ids
//! `3 + byte`; id 1 is BOS, id 2 EOS.

use std::collections::HashMap;

use crate::error::{Result, StudioError};

/// A llama2.c vocabulary with merge scores.
#[derive(Debug, Clone)]
pub struct Llama2cTokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    lookup: HashMap<Vec<u8>, u32>,
}

impl Llama2cTokenizer {
    /// Parses a llama2.c tokenizer file holding `vocab_size` tokens.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `file_name` when the file is
    /// truncated or a token length is invalid.
    pub fn parse(bytes: &[u8], vocab_size: usize, file_name: &str) -> Result<Self> {
        let err = |what: String| StudioError::format(file_name, "llama2.c tokenizer", what);
        let mut pos = 4usize;
        if bytes.len() < 4 {
            return Err(err("file is shorter than its 4-byte header".into()));
        }
        let mut pieces = Vec::with_capacity(vocab_size);
        let mut scores = Vec::with_capacity(vocab_size);
        for i in 0..vocab_size {
            if pos + 8 > bytes.len() {
                return Err(err(format!("truncated at token {i} of {vocab_size} (byte {pos})")));
            }
            let score = f32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4"));
            let len = i32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4"));
            pos += 8;
            if len < 0 || pos + len as usize > bytes.len() {
                return Err(err(format!("token {i}: length {len} runs past the end of the file")));
            }
            pieces.push(bytes[pos..pos + len as usize].to_vec());
            scores.push(score);
            pos += len as usize;
        }
        let mut lookup = HashMap::new();
        for (i, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(i as u32);
        }
        Ok(Llama2cTokenizer { pieces, scores, lookup })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Encodes like `run.c`: optional BOS, a dummy-prefix space token,
    /// one token per UTF-8 character (byte fallback `3 + byte` when the
    /// character is not in the vocabulary), then repeatedly merges the
    /// adjacent pair whose concatenation has the highest score.
    pub fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        let mut tokens: Vec<u32> = Vec::new();
        if bos {
            tokens.push(1);
        }
        if !text.is_empty() {
            if let Some(&sp) = self.lookup.get(b" ".as_slice()) {
                tokens.push(sp);
            }
        }
        let mut buf = [0u8; 4];
        for ch in text.chars() {
            let s = ch.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(s) {
                Some(&id) => tokens.push(id),
                None => tokens.extend(s.iter().map(|b| *b as u32 + 3)),
            }
        }
        let start = usize::from(bos);
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in start..tokens.len().saturating_sub(1) {
                let mut merged = self.pieces[tokens[i] as usize].clone();
                merged.extend_from_slice(&self.pieces[tokens[i + 1] as usize]);
                if let Some(&id) = self.lookup.get(&merged) {
                    let sc = self.scores[id as usize];
                    if best.map(|b| sc > b.0).unwrap_or(true) {
                        best = Some((sc, i, id));
                    }
                }
            }
            match best {
                Some((_, i, id)) => {
                    tokens[i] = id;
                    tokens.remove(i + 1);
                }
                None => break,
            }
        }
        tokens
    }

    /// The bytes of one token as `run.c`'s `decode` prints them, given the
    /// previous token (a leading space is stripped after BOS; `<0xXX>`
    /// pieces become the raw byte).
    pub fn piece_bytes(&self, prev: u32, id: u32) -> Vec<u8> {
        let Some(p) = self.pieces.get(id as usize) else {
            return Vec::new();
        };
        let mut p = p.as_slice();
        if prev == 1 && p.first() == Some(&b' ') {
            p = &p[1..];
        }
        if p.len() == 6 && p.starts_with(b"<0x") && p[5] == b'>' {
            if let Ok(b) = u8::from_str_radix(std::str::from_utf8(&p[3..5]).unwrap_or("zz"), 16) {
                return vec![b];
            }
        }
        p.to_vec()
    }

    /// The same vocabulary as a Hugging Face `tokenizers` tokenizer (for
    /// `tokenizer.json` beside converted checkpoints): pieces with `▁` for
    /// spaces, merges ranked by score as transformers' `generate_merges`,
    /// byte fallback, `<unk>`/`<s>`/`</s>` at ids 0/1/2. It encodes like
    /// [`Llama2cTokenizer::encode`] without BOS (tested on real text).
    ///
    /// # Errors
    /// [`StudioError::Tokenizer`] when a piece is not UTF-8 or the BPE model
    /// cannot be built.
    pub fn to_hf(&self, src: &str) -> Result<tokenizers::Tokenizer> {
        let mut tokens: Vec<String> = Vec::with_capacity(self.pieces.len());
        for (i, p) in self.pieces.iter().enumerate() {
            let s = std::str::from_utf8(p).map_err(|_| StudioError::Tokenizer {
                source_name: src.into(),
                what: format!("token {i} is not UTF-8"),
            })?;
            tokens.push(s.replace(' ', "▁"));
        }
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let scores: Vec<f64> = self.scores.iter().map(|&x| f64::from(x)).collect();
        let merges = super::gguf::merges_from_scores(&refs, &scores);
        let vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let mut tok = super::gguf::spm_tokenizer(vocab, merges, refs.first().copied(), true, src)?;
        let special: Vec<tokenizers::AddedToken> =
            refs.iter().take(3).map(|t| tokenizers::AddedToken::from(t.to_string(), true).normalized(false)).collect();
        tok.add_special_tokens(&special);
        Ok(tok)
    }

    /// Decodes ids to text (BOS/EOS dropped; invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = Vec::new();
        let mut prev = 1u32;
        for &id in ids {
            if id == 1 || id == 2 {
                prev = id;
                continue;
            }
            out.extend(self.piece_bytes(prev, id));
            prev = id;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}
