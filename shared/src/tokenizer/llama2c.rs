//! llama2.c vocabularies (`tokenizer.bin`, `tok512.bin`) and the
//! score-driven BPE of llama2.c's `run.c` (`encode` / `decode`).
//!
//! File layout: `i32 max_token_length`, then per token `f32 score`,
//! `i32 len`, `len` bytes. Byte-fallback tokens `<0xXX>` have ids
//! `3 + byte`; id 1 is BOS, id 2 EOS.

use std::collections::HashMap;

use crate::error::{Result, StudioError};

/// A merge candidate: tokens `left` (at `pos`) and `right` (its successor
/// when pushed) would become `id` with `score`. The heap pops the highest
/// score, then the leftmost position, as `run.c`'s scan picks it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    pos: usize,
    left: u32,
    right: u32,
    id: u32,
}

impl PartialEq for Candidate {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Candidate {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&o.score).then_with(|| o.pos.cmp(&self.pos))
    }
}

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
        crate::tensor_io::bytes::refuse_lfs_pointer(bytes, file_name, "llama2.c tokenizer")?;
        let err = |what: String| StudioError::format(file_name, "llama2.c tokenizer", what);
        let mut pos = 4usize;
        if bytes.len() < 4 {
            return Err(err("file is shorter than its 4-byte header".into()));
        }
        // Each token takes at least 8 bytes: reserve what the file can hold,
        // not what the model header claims.
        let cap = vocab_size.min(bytes.len() / 8);
        let mut pieces = Vec::with_capacity(cap);
        let mut scores = Vec::with_capacity(cap);
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

    /// The raw bytes of token `id` (`None` beyond the vocabulary).
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Encodes like `run.c`: optional BOS, a dummy-prefix space token,
    /// one token per UTF-8 character (byte fallback `3 + byte` when the
    /// character is not in the vocabulary), then repeatedly merges the
    /// adjacent pair whose concatenation has the highest score (the leftmost
    /// of equal scores).
    ///
    /// `run.c` rescans every pair after each merge (quadratic: minutes on a
    /// 100 KB text); this keeps the candidate pairs in a heap ordered by
    /// (score, leftmost position) and the tokens in a linked list, which
    /// performs the same merges in the same order in `O(n log n)`.
    pub fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        let tokens = self.initial_tokens(text, bos);
        let start = usize::from(bos);
        let n = tokens.len();
        if n <= start + 1 {
            return tokens;
        }
        const NONE: usize = usize::MAX;
        let mut tok = tokens;
        let mut next: Vec<usize> = (1..=n).map(|k| if k < n { k } else { NONE }).collect();
        let mut prev: Vec<usize> = (0..n).map(|k| if k > start { k - 1 } else { NONE }).collect();
        let mut alive = vec![true; n];
        let mut heap = std::collections::BinaryHeap::new();
        let push = |heap: &mut std::collections::BinaryHeap<Candidate>, tok: &[u32], i: usize, j: usize| {
            if let Some(id) = self.merged_id(tok[i], tok[j]) {
                heap.push(Candidate { score: self.scores[id as usize], pos: i, left: tok[i], right: tok[j], id });
            }
        };
        for i in start..n - 1 {
            push(&mut heap, &tok, i, i + 1);
        }
        while let Some(c) = heap.pop() {
            let i = c.pos;
            let j = next[i];
            // stale: a neighbour merged since this pair was pushed
            if !alive[i] || j == NONE || tok[i] != c.left || tok[j] != c.right {
                continue;
            }
            tok[i] = c.id;
            alive[j] = false;
            next[i] = next[j];
            if next[i] != NONE {
                prev[next[i]] = i;
            }
            if prev[i] != NONE {
                push(&mut heap, &tok, prev[i], i);
            }
            if next[i] != NONE {
                push(&mut heap, &tok, i, next[i]);
            }
        }
        (0..n).filter(|&k| alive[k]).map(|k| tok[k]).collect()
    }

    /// BOS, the dummy-prefix space and one token per character (or its
    /// bytes), before any merge.
    fn initial_tokens(&self, text: &str, bos: bool) -> Vec<u32> {
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
        tokens
    }

    /// The id of the piece `a` + `b`, when the vocabulary has it.
    fn merged_id(&self, a: u32, b: u32) -> Option<u32> {
        let mut merged = self.pieces[a as usize].clone();
        merged.extend_from_slice(&self.pieces[b as usize]);
        self.lookup.get(&merged).copied()
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
    /// byte fallback, `<unk>`/`<s>`/`</s>` at ids 0/1/2, and a post-processor
    /// that prepends BOS (id 1) when special tokens are added, as `run.c`
    /// and transformers' `LlamaTokenizerFast` (`add_bos_token`) do. It
    /// encodes like [`Llama2cTokenizer::encode`] with and without BOS
    /// (tested on real text), so a converted or upcycled llama2.c model
    /// generates the same continuation as the `.bin`.
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
        let bos = refs.get(1).copied().ok_or_else(|| StudioError::Tokenizer {
            source_name: src.into(),
            what: "the vocabulary has no BOS token (id 1)".into(),
        })?;
        let err = |e: tokenizers::Error| StudioError::Tokenizer {
            source_name: src.into(),
            what: format!("BOS template: {e}"),
        };
        let post = tokenizers::processors::template::TemplateProcessing::builder()
            .try_single(vec![format!("{bos}:0"), "$A:0".into()])
            .and_then(|b| b.try_pair(vec![format!("{bos}:0"), "$A:0".into(), format!("{bos}:1"), "$B:1".into()]))
            .map_err(|e| err(e.into()))?
            .special_tokens(vec![(bos.to_string(), 1)])
            .build()
            .map_err(|e| err(e.into()))?;
        tok.with_post_processor(Some(post));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `run.c`'s encode as written: rescan every adjacent pair after each
    /// merge, take the first of the highest score.
    fn encode_by_rescan(t: &Llama2cTokenizer, text: &str, bos: bool) -> Vec<u32> {
        let mut tokens = t.initial_tokens(text, bos);
        let start = usize::from(bos);
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in start..tokens.len().saturating_sub(1) {
                if let Some(id) = t.merged_id(tokens[i], tokens[i + 1]) {
                    let sc = t.scores[id as usize];
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
                None => return tokens,
            }
        }
    }

    /// A vocabulary file: `<unk>`, `<s>`, `</s>`, 256 byte tokens, then
    /// `pieces` with their scores.
    fn vocab(pieces: &[(&str, f32)]) -> Llama2cTokenizer {
        let mut all: Vec<(Vec<u8>, f32)> =
            vec![(b"<unk>".to_vec(), 0.0), (b"<s>".to_vec(), 0.0), (b"</s>".to_vec(), 0.0)];
        all.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>").into_bytes(), 0.0)));
        all.extend(pieces.iter().map(|(p, s)| (p.as_bytes().to_vec(), *s)));
        let mut bytes = 16i32.to_le_bytes().to_vec();
        for (p, s) in &all {
            bytes.extend(s.to_le_bytes());
            bytes.extend((p.len() as i32).to_le_bytes());
            bytes.extend(p);
        }
        Llama2cTokenizer::parse(&bytes, all.len(), "test").unwrap()
    }

    #[test]
    fn heap_merges_equal_run_c_rescan_with_ties_and_overlaps() {
        // equal scores (ties go leftmost), overlapping candidates ("aaa"),
        // merges that enable merges, and characters only bytes can encode
        let t = vocab(&[
            (" ", -1.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("aa", -2.0),
            ("ab", -2.0),
            ("bc", -2.0),
            ("aab", -3.0),
            ("abc", -1.5),
            (" a", -2.0),
            (" ab", -2.5),
            ("cc", -4.0),
            ("ccc", -0.5),
        ]);
        let mut seed = 7u64;
        let mut texts: Vec<String> = vec!["".into(), "a".into(), "aaaa".into(), "abcabc aab ccc".into(), "é ab".into()];
        for _ in 0..300 {
            let len = 1 + (seed % 40) as usize;
            let s: String = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    b"abc  e"[(seed >> 33) as usize % 6] as char
                })
                .collect();
            texts.push(s);
        }
        for text in &texts {
            for bos in [false, true] {
                assert_eq!(t.encode(text, bos), encode_by_rescan(&t, text, bos), "{text:?} bos={bos}");
            }
        }
        assert_eq!(t.encode("ab", true), vec![1, t.lookup[b" ab".as_slice()]]);
    }
}
