//! Training data: text / JSON-lines files -> token ids -> packed
//! fixed-length sequences, mixed by weight, with a per-sequence source tag
//! (language or domain, and whether it is an ORIGINAL language for
//! MoE-LPR's language-prior loss), shuffled deterministically and resumable.
//!
//! Packing (as Hugging Face `run_clm.py`'s `group_texts`, plus one token of
//! overlap so that every input position has a target): each source's
//! documents are tokenized and concatenated into one stream; sequence `i`
//! is `stream[i*L .. i*L + L + 1]` (`L` inputs, the `L` targets shifted by
//! one). The stream is [`crate::corpus::token_stream`]: documents as the
//! file defines them (`--docs`, blank-line separated by default), each
//! followed by the tokenizer's end-of-text token (llama2.c vocabularies: a
//! BOS before each instead) — the same ids `eval`, `perplexity`, `route`
//! and `neurons` read.
//!
//! Mixture: every sequence of a batch first draws its source with
//! probability `weight_i / sum(weights)`, then takes that source's next
//! sequence in a per-epoch permutation (Fisher-Yates, seeded by
//! `(seed, source, epoch)`). The whole position is [`MixtureState`]: the
//! mixing generator's state and each source's `(epoch, position)` — saved in
//! training checkpoints so that `--resume` sees exactly the same batches.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StudioError};
use crate::tokenizer::Tokenizer;

/// A SplitMix64 generator whose whole state is one `u64` (saved in
/// checkpoints). Source: Steele et al., "Fast splittable pseudorandom
/// number generators" (OOPSLA 2014).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitMix64 {
    /// The generator state.
    pub state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform sample in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `0..n` (`n > 0`; multiply-shift, bias < 2^-32
    /// for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// One `--data NAME=FILE[:weight][:orig]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSpec {
    /// The source's name (language or domain), used in metrics and errors.
    pub name: String,
    /// A `.txt` file (documents cut by the command's `--docs`, blank-line
    /// separated by default: [`crate::corpus::DocSplit`]) or a `.jsonl` file
    /// (one JSON object per line with a string field `text`).
    pub path: String,
    /// Mixture weight (> 0); sources are drawn with probability
    /// proportional to it. Default 1.
    pub weight: f64,
    /// Whether this is an ORIGINAL language of the model (MoE-LPR's
    /// language-prior loss sends its tokens to expert 0).
    pub original: bool,
}

impl DataSpec {
    /// Parses `NAME=FILE[:weight][:orig]`. The optional suffixes are read
    /// from the right, so a path may contain `:` unless its last part is a
    /// number or `orig`.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the entry: no `=`, an empty name or
    /// path, a weight that is not a positive finite number.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = |what: &str| {
            StudioError::config("--data", format!("`{spec}`: {what} (expected NAME=FILE[:weight][:orig])"))
        };
        let (name, rest) = spec.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(bad("the name is empty"));
        }
        let mut parts: Vec<&str> = rest.split(':').collect();
        let mut original = false;
        let mut weight = None;
        if parts.len() > 1 && parts.last() == Some(&"orig") {
            original = true;
            parts.pop();
        }
        if parts.len() > 1 {
            if let Ok(w) = parts.last().expect("len > 1").parse::<f64>() {
                weight = Some(w);
                parts.pop();
            }
        }
        let path = parts.join(":");
        if path.is_empty() {
            return Err(bad("the file is empty"));
        }
        let weight = weight.unwrap_or(1.0);
        if !(weight.is_finite() && weight > 0.0) {
            return Err(bad(&format!("weight {weight} must be a positive number")));
        }
        Ok(DataSpec { name: name.to_string(), path, weight, original })
    }
}

/// Tokenizes and packs one source's text held in memory (`spec.path`
/// names it in errors): [`crate::corpus::text_stream`] (documents cut by
/// `split`) then [`PackedSource::new`] — what [`load_source`] does after
/// reading the file, and what the browser's training stages call on the
/// page's texts.
///
/// # Errors
/// As [`crate::corpus::split_documents`] and [`PackedSource::new`].
pub fn source_from_text(
    spec: &DataSpec,
    text: &str,
    split: crate::corpus::DocSplit,
    tok: &Tokenizer,
    seq_len: usize,
) -> Result<PackedSource> {
    let ids = crate::corpus::text_stream(text, &spec.path, split, tok)?;
    PackedSource::new(spec.clone(), ids, seq_len)
}

/// One source's token stream, cut into sequences of `seq_len + 1` tokens.
#[derive(Debug, Clone)]
pub struct PackedSource {
    /// The source's entry.
    pub spec: DataSpec,
    /// The token stream (in memory, or a memory-mapped token file).
    pub ids: crate::corpus::Stream,
    /// Input length `L` of a sequence.
    pub seq_len: usize,
}

impl PackedSource {
    /// Packs `ids` (a `Vec<u32>` or a [`crate::corpus::Stream`]) for `spec`:
    /// sequence `i` is `ids[i·L .. i·L + L + 1]`, read where it lies (a
    /// token file's pages are read only when a sequence is drawn).
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when the stream is shorter than
    /// `seq_len + 1` tokens or `seq_len` is 0.
    pub fn new(spec: DataSpec, ids: impl Into<crate::corpus::Stream>, seq_len: usize) -> Result<Self> {
        let ids = ids.into();
        if seq_len == 0 {
            return Err(StudioError::config("--seq-len", "must be at least 1"));
        }
        if ids.len() < seq_len + 1 {
            return Err(StudioError::Invalid(format!(
                "data `{}` ({}): {} tokens, fewer than the {} one sequence of --seq-len {seq_len} needs",
                spec.name,
                spec.path,
                ids.len(),
                seq_len + 1
            )));
        }
        Ok(PackedSource { spec, ids, seq_len })
    }

    /// Number of packed sequences, `(tokens - 1) / L`.
    pub fn num_sequences(&self) -> usize {
        (self.ids.len() - 1) / self.seq_len
    }

    /// Sequence `i`: `L + 1` token ids.
    pub fn sequence(&self, i: usize) -> &[u32] {
        let s = i * self.seq_len;
        &self.ids[s..s + self.seq_len + 1]
    }
}

/// A source's place in its shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cursor {
    /// Completed passes over the source.
    pub epoch: u64,
    /// Next index into this epoch's permutation.
    pub pos: usize,
}

/// The whole position of a [`Mixture`] (resume state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixtureState {
    /// The generator that picks each sequence's source.
    pub rng: SplitMix64,
    /// One cursor per source.
    pub cursors: Vec<Cursor>,
    /// Sequences drawn so far.
    pub drawn: u64,
}

/// What a checkpoint records about each source, to refuse resuming on
/// different data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFingerprint {
    /// Name.
    pub name: String,
    /// Tokens in the stream.
    pub tokens: usize,
    /// Packed sequences.
    pub sequences: usize,
    /// Mixture weight.
    pub weight: f64,
    /// Original-language tag.
    pub original: bool,
    /// [`crate::corpus::stream_sha256`] of the token stream (empty in
    /// checkpoints written before it was recorded, which then do not
    /// resume: their stream was cut differently).
    #[serde(default)]
    pub sha256: String,
}

/// A batch of packed sequences, `[batch, L]` inputs and targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Sequences in the batch.
    pub batch: usize,
    /// Tokens per sequence `L`.
    pub seq_len: usize,
    /// Input ids, row-major `[batch, L]`.
    pub inputs: Vec<i64>,
    /// Target ids (inputs shifted by one), row-major `[batch, L]`.
    pub targets: Vec<i64>,
    /// The source index of each sequence, `[batch]`.
    pub sources: Vec<usize>,
    /// Whether each sequence is from an original language, `[batch]`.
    pub original: Vec<bool>,
}

impl Batch {
    /// Splits into `n` batches of consecutive sequences (data parallelism;
    /// `batch` must be a multiple of `n`).
    pub fn split(&self, n: usize) -> Vec<Batch> {
        let per = self.batch / n;
        let l = self.seq_len;
        (0..n)
            .map(|i| Batch {
                batch: per,
                seq_len: l,
                inputs: self.inputs[i * per * l..(i + 1) * per * l].to_vec(),
                targets: self.targets[i * per * l..(i + 1) * per * l].to_vec(),
                sources: self.sources[i * per..(i + 1) * per].to_vec(),
                original: self.original[i * per..(i + 1) * per].to_vec(),
            })
            .collect()
    }
}

/// A weighted, deterministically shuffled mixture of packed sources.
#[derive(Debug, Clone)]
pub struct Mixture {
    sources: Vec<PackedSource>,
    seed: u64,
    state: MixtureState,
    /// Cached permutation per source: `(epoch, order)`.
    perms: Vec<(u64, Vec<u32>)>,
}

fn mix_seed(seed: u64, source: usize, epoch: u64) -> u64 {
    let mut r = SplitMix64::new(seed ^ 0x5851_f42d_4c95_7f2d);
    let a = r.next_u64() ^ (source as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut r = SplitMix64::new(a);
    r.next_u64() ^ epoch.wrapping_mul(0xd1b5_4a32_d192_ed03)
}

fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    let mut r = SplitMix64::new(seed);
    for i in (1..n).rev() {
        let j = r.below(i + 1);
        p.swap(i, j);
    }
    p
}

impl Mixture {
    /// A mixture of `sources` shuffled under `seed`.
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when there is no source or two sources
    /// share a name, or their sequence lengths differ.
    pub fn new(sources: Vec<PackedSource>, seed: u64) -> Result<Self> {
        if sources.is_empty() {
            return Err(StudioError::config("--data", "no training data given"));
        }
        for (i, s) in sources.iter().enumerate() {
            if sources[..i].iter().any(|o| o.spec.name == s.spec.name) {
                return Err(StudioError::config("--data", format!("the name `{}` is used twice", s.spec.name)));
            }
            if s.seq_len != sources[0].seq_len {
                return Err(StudioError::Invalid("all sources must be packed with the same --seq-len".into()));
            }
        }
        let n = sources.len();
        let state = MixtureState {
            rng: SplitMix64::new(seed ^ 0x2545_f491_4f6c_dd1d),
            cursors: vec![Cursor::default(); n],
            drawn: 0,
        };
        Ok(Mixture { sources, seed, state, perms: vec![(u64::MAX, Vec::new()); n] })
    }

    /// The packed sources.
    pub fn sources(&self) -> &[PackedSource] {
        &self.sources
    }

    /// Sequence length `L`.
    pub fn seq_len(&self) -> usize {
        self.sources[0].seq_len
    }

    /// The current position (to save).
    pub fn state(&self) -> &MixtureState {
        &self.state
    }

    /// Restores a position saved by [`Mixture::state`].
    ///
    /// # Errors
    /// [`StudioError::Invalid`] when it does not fit these sources.
    pub fn set_state(&mut self, state: MixtureState) -> Result<()> {
        if state.cursors.len() != self.sources.len() {
            return Err(StudioError::Invalid(format!(
                "the saved data position has {} sources, the data given has {}",
                state.cursors.len(),
                self.sources.len()
            )));
        }
        for (c, s) in state.cursors.iter().zip(&self.sources) {
            if c.pos > s.num_sequences() {
                return Err(StudioError::Invalid(format!(
                    "the saved data position is past the end of `{}`",
                    s.spec.name
                )));
            }
        }
        self.state = state;
        Ok(())
    }

    /// What identifies these sources (saved in checkpoints).
    pub fn fingerprint(&self) -> Vec<SourceFingerprint> {
        self.sources
            .iter()
            .map(|s| SourceFingerprint {
                name: s.spec.name.clone(),
                tokens: s.ids.len(),
                sequences: s.num_sequences(),
                weight: s.spec.weight,
                original: s.spec.original,
                sha256: s.ids.sha256(),
            })
            .collect()
    }

    fn pick_source(&mut self) -> usize {
        if self.sources.len() == 1 {
            // Still advance the generator so that the state stays a pure
            // function of the number of draws.
            self.state.rng.next_u64();
            return 0;
        }
        let total: f64 = self.sources.iter().map(|s| s.spec.weight).sum();
        let mut u = self.state.rng.next_f64() * total;
        for (i, s) in self.sources.iter().enumerate() {
            if u < s.spec.weight {
                return i;
            }
            u -= s.spec.weight;
        }
        self.sources.len() - 1
    }

    /// The next sequence: `(source index, L + 1 token ids)`.
    pub fn next_sequence(&mut self) -> (usize, &[u32]) {
        let src = self.pick_source();
        let n = self.sources[src].num_sequences();
        let c = &mut self.state.cursors[src];
        if c.pos >= n {
            c.epoch += 1;
            c.pos = 0;
        }
        let (epoch, pos) = (c.epoch, c.pos);
        c.pos += 1;
        self.state.drawn += 1;
        if self.perms[src].0 != epoch {
            self.perms[src] = (epoch, permutation(n, mix_seed(self.seed, src, epoch)));
        }
        let idx = self.perms[src].1[pos] as usize;
        (src, self.sources[src].sequence(idx))
    }

    /// The next `batch` sequences as a [`Batch`].
    pub fn next_batch(&mut self, batch: usize) -> Batch {
        let l = self.seq_len();
        let mut b = Batch {
            batch,
            seq_len: l,
            inputs: Vec::with_capacity(batch * l),
            targets: Vec::with_capacity(batch * l),
            sources: Vec::with_capacity(batch),
            original: Vec::with_capacity(batch),
        };
        for _ in 0..batch {
            let (src, seq) = self.next_sequence();
            b.inputs.extend(seq[..l].iter().map(|&x| x as i64));
            b.targets.extend(seq[1..].iter().map(|&x| x as i64));
            let original = self.sources[src].spec.original;
            b.sources.push(src);
            b.original.push(original);
        }
        b
    }
}

/// Reads, tokenizes and packs one `--data` entry (native only): the file's
/// token stream ([`crate::corpus::read_stream`], documents cut by `split`;
/// a `.tokens` file is memory-mapped, not read).
///
/// # Errors
/// [`StudioError::Io`] for a missing file, the errors of
/// [`crate::corpus::split_documents`] (empty corpus, bad JSON line) and
/// [`PackedSource::new`] (fewer tokens than one sequence).
#[cfg(not(target_arch = "wasm32"))]
pub fn load_source(
    spec: &DataSpec,
    split: crate::corpus::DocSplit,
    tok: &Tokenizer,
    seq_len: usize,
) -> Result<PackedSource> {
    let ids = crate::corpus::read_stream(&spec.path, split, tok)?;
    PackedSource::new(spec.clone(), ids, seq_len)
}

/// Loads every entry and builds the mixture (native only).
///
/// # Errors
/// Those of [`load_source`] and [`Mixture::new`].
#[cfg(not(target_arch = "wasm32"))]
pub fn load_mixture(
    specs: &[DataSpec],
    split: crate::corpus::DocSplit,
    tok: &Tokenizer,
    seq_len: usize,
    seed: u64,
) -> Result<Mixture> {
    let sources = specs.iter().map(|s| load_source(s, split, tok, seq_len)).collect::<Result<Vec<_>>>()?;
    Mixture::new(sources, seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, w: f64) -> DataSpec {
        DataSpec { name: name.into(), path: format!("{name}.txt"), weight: w, original: name == "en" }
    }

    #[test]
    fn parses_data_specs() {
        let s = DataSpec::parse("hu=/a/b.txt").unwrap();
        assert_eq!((s.name.as_str(), s.path.as_str(), s.weight, s.original), ("hu", "/a/b.txt", 1.0, false));
        let s = DataSpec::parse("en=x.txt:0.25:orig").unwrap();
        assert_eq!((s.path.as_str(), s.weight, s.original), ("x.txt", 0.25, true));
        let s = DataSpec::parse("en=x.txt:orig").unwrap();
        assert_eq!((s.weight, s.original), (1.0, true));
        assert_eq!(DataSpec::parse("c=C:/d/x.txt").unwrap().path, "C:/d/x.txt");
        for bad in ["x.txt", "=x.txt", "a=", "a=x.txt:0", "a=x.txt:-1:orig"] {
            assert!(DataSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mixture_is_deterministic_weighted_and_resumable() {
        let mk = || {
            let a = PackedSource::new(spec("en", 3.0), (0..401).collect::<Vec<u32>>(), 4).unwrap();
            let b = PackedSource::new(spec("hu", 1.0), (1000..1201).collect::<Vec<u32>>(), 4).unwrap();
            Mixture::new(vec![a, b], 7).unwrap()
        };
        let mut m = mk();
        let first: Vec<Batch> = (0..50).map(|_| m.next_batch(8)).collect();
        let mut again = mk();
        assert_eq!(first, (0..50).map(|_| again.next_batch(8)).collect::<Vec<_>>());
        // Weights: ~3/4 of the sequences from `en`.
        let en = first.iter().flat_map(|b| &b.sources).filter(|&&s| s == 0).count() as f64 / 400.0;
        assert!((en - 0.75).abs() < 0.06, "en fraction {en}");
        // Targets are inputs shifted by one; tags follow the source.
        let b = &first[0];
        for r in 0..b.batch {
            assert_eq!(b.inputs[r * 4 + 1..r * 4 + 4], b.targets[r * 4..r * 4 + 3]);
            assert_eq!(b.original[r], b.sources[r] == 0);
        }
        // Each epoch visits every sequence of a source exactly once.
        let mut one =
            Mixture::new(vec![PackedSource::new(spec("hu", 1.0), (0..41).collect::<Vec<u32>>(), 4).unwrap()], 1)
                .unwrap();
        let mut starts: Vec<i64> = (0..10).map(|_| one.next_batch(1).inputs[0]).collect();
        starts.sort();
        assert_eq!(starts, (0..10).map(|i| i * 4).collect::<Vec<_>>());
        // Resume from a saved state.
        let mut m = mk();
        for _ in 0..20 {
            m.next_batch(8);
        }
        let saved = m.state().clone();
        let mut r = mk();
        r.set_state(saved).unwrap();
        assert_eq!(r.next_batch(8), first[20]);
    }

    #[test]
    fn too_short_corpus_is_an_error() {
        let e = PackedSource::new(spec("x", 1.0), vec![1, 2, 3], 8).unwrap_err().to_string();
        assert!(e.contains("3 tokens") && e.contains("--seq-len 8"), "{e}");
    }
}
