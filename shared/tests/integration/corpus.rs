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

/// A token file (`moe-studio tokenize`) holds exactly the text path's stream:
/// the same ids, documents and SHA-256 for every split, JSON lines and a
/// file with CRLF line ends, whitespace-only lines and no final newline
/// (the streaming reader cuts it as `split_documents` does); `read_stream`
/// maps it. Bad input is refused naming the file and nothing is left behind.
#[test]
fn token_file_is_the_text_stream_and_refuses_what_it_is_not() {
    use moe_shared::corpus::token_file::{write_token_file, TokenFile};
    use moe_shared::corpus::{read_stream, Stream};
    let Some(tok_path) = common::data_file("models/smollm2-135m-instruct/tokenizer.json") else { return };
    let tok = Tokenizer::from_hf_json(&std::fs::read(&tok_path).unwrap(), "smollm2").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.txt");
    std::fs::write(&odd, "  \r\nfirst line\r\n  indented\r\n \t \r\nsecond\r\n\r\n\r\nthird  \r\n   \r\nlast").unwrap();
    let jsonl = dir.path().join("docs.jsonl");
    std::fs::write(&jsonl, "{\"text\":\"a\\n\\nb\"}\n\n{\"text\":\" \"}\n{\"text\":\"c\"}\n").unwrap();
    let files = [root().join(FIXTURE), odd.clone(), jsonl.clone()];
    for (fi, text_path) in files.iter().enumerate() {
        let text = std::fs::read_to_string(text_path).unwrap();
        let name = text_path.display().to_string();
        for split in DocSplit::ALL {
            let out = dir.path().join(format!("f{fi}-{split}.tokens"));
            let h = write_token_file(text_path, split, &tok, &out, |_, _| {}).unwrap();
            let docs = split_documents(&text, &name, split).unwrap();
            let want = text_stream(&text, &name, split, &tok).unwrap();
            let f = TokenFile::open(&out).unwrap();
            assert_eq!(f.ids(), &want[..], "{name} {split}");
            assert_eq!((h.tokens, h.documents), (want.len() as u64, docs.len() as u64), "{name} {split}");
            assert_eq!(h.sha256, stream_sha256(&want));
            for (i, d) in docs.iter().enumerate() {
                assert_eq!(f.document(i), &document_ids(d, &tok).unwrap()[..], "{name} {split} document {i}");
            }
            let s = read_stream(&out.display().to_string(), DocSplit::Line, &tok).unwrap();
            assert!(matches!(s, Stream::Mapped(_)));
            assert_eq!((&s[..], s.sha256()), (&want[..], stream_sha256(&want)));
        }
    }
    // The odd file's documents under the default split, spelled out.
    let d = split_documents(&std::fs::read_to_string(&odd).unwrap(), "odd", DocSplit::Blank).unwrap();
    assert_eq!(d, vec!["first line\n  indented", "second", "third  ", "last"]);
    let good = dir.path().join("f0-blank.tokens");

    // Another tokenizer is refused, naming the file and the vocabulary.
    if let Some(t) = common::data_file("models/stories260K/tok512.bin") {
        let other = Tokenizer::Llama2c(
            moe_shared::tokenizer::Llama2cTokenizer::parse(&std::fs::read(&t).unwrap(), 512, "tok512").unwrap(),
        );
        let e = read_stream(&good.display().to_string(), DocSplit::Blank, &other).unwrap_err().to_string();
        assert!(e.contains("f0-blank.tokens") && e.contains("vocabulary of 49152"), "{e}");
    }
    // A truncated file, a text file named .tokens and a footer that lies.
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.tokens");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let e = TokenFile::open(&cut).unwrap_err().to_string();
    assert!(e.contains("cut.tokens") && e.contains("MOETOK01"), "{e}");
    let txt = dir.path().join("text.tokens");
    std::fs::copy(root().join(FIXTURE), &txt).unwrap();
    assert!(TokenFile::open(&txt).unwrap_err().to_string().contains("text.tokens"));
    let lie = dir.path().join("lie.tokens");
    let tokens = TokenFile::open(&good).unwrap().header().tokens;
    let (from, to) = (format!("\"tokens\":{tokens},"), format!("\"tokens\":{},", tokens - 1));
    assert_eq!(from.len(), to.len(), "same footer length");
    let at = bytes.windows(from.len()).rposition(|w| w == from.as_bytes()).expect("the footer's token count");
    let mut lied = bytes.clone();
    lied[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(&lie, &lied).unwrap();
    let e = TokenFile::open(&lie).unwrap_err().to_string();
    assert!(e.contains("lie.tokens") && e.contains("bytes before the footer"), "{e}");
    // One id changed after writing: the ids no longer hash to the footer's SHA-256.
    let edited = dir.path().join("edited.tokens");
    let mut e_bytes = bytes.clone();
    e_bytes[8] ^= 1;
    std::fs::write(&edited, &e_bytes).unwrap();
    let e = TokenFile::open(&edited).unwrap_err().to_string();
    assert!(e.contains("edited.tokens") && e.contains("changed after"), "{e}");
    // A temporary left by an interrupted run (its process gone, untouched for STALE_AFTER) is
    // removed by the next run; one written a moment ago may be a live writer's elsewhere: kept.
    let stale = dir.path().join(".again.tokens.tmp-4194303");
    std::fs::write(&stale, b"half").unwrap();
    let long_ago =
        std::time::SystemTime::now() - moe_shared::tensor_io::writer::STALE_AFTER - std::time::Duration::from_secs(60);
    std::fs::File::options().write(true).open(&stale).unwrap().set_modified(long_ago).unwrap();
    let fresh = dir.path().join(".again.tokens.tmp-4194302");
    std::fs::write(&fresh, b"half").unwrap();
    write_token_file(&odd, DocSplit::Blank, &tok, &dir.path().join("again.tokens"), |_, _| {}).unwrap();
    assert_eq!(stale.exists(), !cfg!(target_os = "linux"), "the stale temporary is gone (Linux)");
    assert!(fresh.exists(), "a temporary written to a moment ago is kept");
    std::fs::remove_file(&fresh).unwrap();
    std::fs::remove_file(dir.path().join("again.tokens")).unwrap();
    // A token file as the text to tokenize.
    let e = write_token_file(&good, DocSplit::Blank, &tok, &dir.path().join("again.tokens"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("already a token file"), "{e}");
    // An empty corpus, and a file that would overwrite its text: errors, and nothing is left behind.
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n \n").unwrap();
    let before = std::fs::read_dir(dir.path()).unwrap().count();
    let e = write_token_file(&empty, DocSplit::Blank, &tok, &dir.path().join("e.tokens"), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty.txt") && e.contains("empty"), "{e}");
    assert!(write_token_file(&odd, DocSplit::Blank, &tok, &odd, |_, _| {}).is_err());
    let nowhere = dir.path().join("no/such/x.tokens");
    let e = write_token_file(&odd, DocSplit::Blank, &tok, &nowhere, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("no/such/x.tokens"), "the error names the output asked for: {e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), before, "no half-written file left");
    assert_eq!(std::fs::read_to_string(&odd).unwrap().len(), 63, "the text is untouched");
}
