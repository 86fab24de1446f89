//! `moe_shared::corpus` against Hugging Face's tokenizer
//! (`tests/reference/make_corpus_golden.py`): for each `--docs` split of a
//! two-document Python file, the documents' ids and the token stream —
//! `ids(doc1) + <|endoftext|> + ids(doc2) + <|endoftext|>` for the default
//! blank-line split — and its SHA-256 equal the golden ones; the training
//! packer reads the same stream.

use crate::common;

use moe_shared::corpus::{document_ids, split_documents, stream_sha256, text_stream, DocSplit};
use moe_shared::tokenizer::Tokenizer;
use moe_shared::train::{DataSpec, PackedSource};

const FIXTURE: &str = "tests/fixtures/corpus/two_docs.txt";

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn streams_equal_hugging_face_per_split() {
    let Some(tok_path) = common::data_file("models/smollm2-135m-instruct/tokenizer.json") else { return };
    let tok = Tokenizer::from_hf_json(&std::fs::read(&tok_path).unwrap(), "smollm2").unwrap();
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/reference/golden/corpus_streams.json")).unwrap(),
    )
    .unwrap();
    let text = std::fs::read_to_string(root().join(FIXTURE)).unwrap();
    let eos = golden["eos"].as_u64().unwrap() as u32;
    let ids_of = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    for split in DocSplit::ALL {
        let g = &golden["files"][FIXTURE][split.name()];
        let docs = split_documents(&text, FIXTURE, split).unwrap();
        assert_eq!(docs.len() as u64, g["documents"].as_u64().unwrap(), "{split}");
        for (d, want) in docs.iter().zip(g["document_ids"].as_array().unwrap()) {
            let mut want = ids_of(want);
            want.push(eos);
            assert_eq!(document_ids(d, &tok).unwrap(), want, "{split}: {d:?}");
        }
        let ids = text_stream(&text, FIXTURE, split, &tok).unwrap();
        assert_eq!(ids, ids_of(&g["ids"]), "{split}");
        assert_eq!(stream_sha256(&ids), g["sha256"].as_str().unwrap(), "{split}");
    }
    // The default: two documents, each followed by the end-of-text token.
    let blank = text_stream(&text, FIXTURE, DocSplit::default(), &tok).unwrap();
    let docs = split_documents(&text, FIXTURE, DocSplit::Blank).unwrap();
    let mut want = tok.encode(&docs[0], true).unwrap();
    want.push(eos);
    want.extend(tok.encode(&docs[1], true).unwrap());
    want.push(eos);
    assert_eq!(blank, want);
    assert_eq!(blank.iter().filter(|&&i| i == eos).count(), 2, "one separator per document, none per line");
    // What `train` packs is that stream.
    let spec = DataSpec { name: "code".into(), path: FIXTURE.into(), weight: 1.0, original: false };
    let packed = PackedSource::new(spec, blank.clone(), 8).unwrap();
    assert_eq!(packed.sequence(0), &blank[..9]);
}
