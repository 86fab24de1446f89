//! NeuronMoE in the browser (small models): pooled activations of every
//! linear unit on the user's texts, Average Precision per language
//! (`average_precision_table`, `analyze`), the union of the new languages'
//! specific neurons per layer, and the NeuronMoE allocation with
//! `E_min..=E_max` — the same calls as `moe-studio neurons` / `allocate`.

use moe_shared::methods::allocate::{neuronmoe_allocation, ExpertRange};
use moe_shared::methods::neurons::{
    analyze, average_precision_table, AnalysisOptions, CollectOptions, NeuronCollector, NeuronReport, NeuronWarning,
};
use serde::{Deserialize, Serialize};

use super::progress::Progress;
use super::{cpu_model, msg};
use crate::store::Picked;

/// Texts of one language (each a document: `texts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LanguageTexts {
    /// Language code (`en`, `hu`, ...); the first is the original language.
    pub code: String,
    /// Texts, each scored as its document ids (`moe_shared::corpus::document_ids`).
    pub lines: Vec<String>,
}

/// One language's top-N cut-off, as the page's table shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CutRow {
    /// Language code.
    pub code: String,
    /// Texts of the language.
    pub texts: usize,
    /// The AP of the N-th neuron.
    pub cut_ap: f64,
    /// Neurons tied at the cut (0: no tie crosses it).
    pub tied: usize,
    /// Places of the N they share.
    pub places: usize,
}

/// What the page shows of an analysis and its allocation (plain data, so it
/// can cross from a worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeuronOutcome {
    /// Language codes (the first is the original language).
    pub codes: Vec<String>,
    /// Per language, specific neurons per layer (tie-weighted).
    pub per_lang: Vec<Vec<f64>>,
    /// `S_l`: the union of the new languages per layer (tie-weighted).
    pub union: Vec<f64>,
    /// The tie-weighted part of `union` per layer.
    pub union_tied: Vec<f64>,
    /// New experts per layer (NeuronMoE).
    pub allocation: Vec<usize>,
    /// Neurons analysed.
    pub neurons: usize,
    /// Texts analysed.
    pub texts: usize,
    /// N of top-N.
    pub top_n: usize,
    /// Per language, the top-N cut-off.
    pub cuts: Vec<CutRow>,
    /// Ties and too few texts ([`NeuronReport::warnings`]).
    pub warnings: Vec<NeuronWarning>,
    /// Milliseconds.
    pub millis: f64,
}

impl NeuronOutcome {
    /// The page's view of `report` and its allocation.
    pub fn new(report: &NeuronReport, allocation: Vec<usize>, millis: f64) -> Self {
        NeuronOutcome {
            codes: report.codes(),
            per_lang: report.languages.iter().map(|l| l.counts.iter().map(|c| c.total).collect()).collect(),
            union: report.union_counts.iter().map(|c| c.total).collect(),
            union_tied: report.union_counts.iter().map(|c| c.tie_weighted).collect(),
            allocation,
            neurons: report.layout.num_neurons(),
            texts: report.languages.iter().map(|l| l.texts).sum(),
            top_n: report.top_n,
            cuts: report
                .languages
                .iter()
                .map(|l| CutRow {
                    code: l.code.clone(),
                    texts: l.texts,
                    cut_ap: l.top_cut.ap,
                    tied: if l.top_cut.crosses() { l.top_cut.tied.len() } else { 0 },
                    places: l.top_cut.slots,
                })
                .collect(),
            warnings: report.warnings(),
            millis,
        }
    }
}

/// Splits pasted text into texts: its documents by `split`
/// (`moe_shared::corpus::split_documents`, as the CLI's `neurons --docs`),
/// at most `max`; none for an empty text.
pub fn texts(text: &str, split: moe_shared::corpus::DocSplit, max: usize) -> Vec<String> {
    moe_shared::corpus::split_documents(text, "the text", split)
        .map(|d| d.into_iter().take(max).collect())
        .unwrap_or_default()
}

/// Runs the analysis and the allocation; progress in texts.
///
/// # Errors
/// Fewer than two languages or texts, MoE input, top-N outside
/// `1..=neurons`, analysis errors.
pub fn run(
    progress: &Progress,
    src: &Picked,
    langs: &[LanguageTexts],
    top_n: usize,
    range: (usize, usize),
) -> Result<NeuronOutcome, String> {
    let t0 = crate::web::now_ms();
    let m = src.model();
    if m.moe.is_some() {
        return Err(format!("{} is an MoE; the neuron analysis takes the dense model", src.name()));
    }
    if langs.len() < 2 {
        return Err("give texts for at least two languages (the first is the original one)".into());
    }
    let range = ExpertRange::new(range.0, range.1).map_err(msg)?;
    let tok = m.tokenizer.as_ref().ok_or_else(|| format!("{} has no tokenizer", src.name()))?;
    let mut encoded: Vec<(usize, Vec<u32>)> = Vec::new();
    for (i, l) in langs.iter().enumerate() {
        for line in &l.lines {
            let ids = moe_shared::corpus::document_ids(line, tok).map_err(msg)?;
            if !ids.is_empty() {
                encoded.push((i, ids));
            }
        }
        let n = encoded.iter().filter(|e| e.0 == i).count();
        if n < 2 {
            return Err(format!(
                "language `{}` has {n} non-empty text(s); at least 2 are needed (one per line)",
                l.code
            ));
        }
    }
    let model = cpu_model(m)?;
    let codes: Vec<String> = langs.iter().map(|l| l.code.clone()).collect();
    let mut col = NeuronCollector::new(&model, codes, CollectOptions::default()).map_err(msg)?;
    let neurons = col.layout().num_neurons();
    if top_n == 0 || top_n > neurons {
        return Err(format!("top-N must be between 1 and {neurons} (the neurons of {}); got {top_n}", src.name()));
    }
    col.reserve(encoded.len());
    // A few texts per forward pass (right-padded; the same rows as one by
    // one); progress in tokens.
    let max_tokens = CollectOptions::default().max_tokens;
    let total: u64 = encoded.iter().map(|(_, ids)| ids.len().min(max_tokens) as u64).sum();
    let mut done = 0u64;
    progress.step("activations of every neuron", 0, total, "tokens");
    for group in encoded.chunks(TEXTS_PER_PASS) {
        let texts: Vec<(usize, &[u32])> = group.iter().map(|(l, ids)| (*l, ids.as_slice())).collect();
        done += col.add_texts(&texts).map_err(msg)? as u64;
        progress.step("activations of every neuron", done, total, "tokens");
    }
    let pooled = col.finish().map_err(msg)?;
    progress.step("Average Precision per neuron and language", 0, 1, "tables");
    let table = average_precision_table(&pooled, 1).map_err(msg)?;
    let mut report = analyze(&pooled, &table, &AnalysisOptions { top_n, ..Default::default() }).map_err(msg)?;
    moe_shared::methods::neurons::stream_sha256_of_texts(&mut report, &encoded);
    let counts: Vec<f64> = report.union_counts.iter().map(|c| c.total).collect();
    let allocation = neuronmoe_allocation(&counts, range).map_err(msg)?;
    Ok(NeuronOutcome::new(&report, allocation, crate::web::now_ms() - t0))
}

/// Texts per forward pass of the capture.
const TEXTS_PER_PASS: usize = 4;

#[cfg(test)]
mod tests {
    #[test]
    fn pasted_text_splits_into_documents() {
        use moe_shared::corpus::DocSplit;
        assert_eq!(super::texts(" a \n\n b\nc", DocSplit::Line, 2), vec![" a".to_string(), " b".to_string()]);
        assert_eq!(super::texts(" a \n\n b\nc", DocSplit::Blank, 5), vec![" a ".to_string(), " b\nc".to_string()]);
        assert!(super::texts("\n \n", DocSplit::Blank, 5).is_empty());
    }
}
