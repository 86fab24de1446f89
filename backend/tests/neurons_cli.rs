//! `moe-studio neurons` and `moe-studio allocate` end to end on stories260K
//! (shared data): the output files and figures, an allocation file that
//! `upcycle --allocation` accepts, and clear errors on bad input (an empty
//! file, a single language, a language with one text, E_min > E_max, an
//! unknown new language).
//!
//! The shared data directory is `$MOE_STUDIO_DATA`, default
//! `$CARGO_MANIFEST_DIR/../../shared/data`; when it is missing the tests
//! print a notice and pass, except under `CI=true`.

mod common;

use common::{arg as s, data_dir as data, failure, ok, run, tmp};

#[test]
fn neurons_then_allocate_then_upcycle() {
    let Some(d) = data() else { return };
    let dir = tmp("e2e");
    let model = s(&d.join("models/stories260K/stories260K.bin"));
    let lang = |c: &str| format!("{c}={}", s(&d.join(format!("corpora/lang/{c}/valid.txt"))));
    let out = dir.join("neurons");
    let stdout = ok(&run(&[
        "neurons",
        &model,
        "--lang",
        &lang("en"),
        "--lang",
        &lang("hu"),
        "--lang",
        &lang("tr"),
        "--new",
        "hu,tr",
        "--top-n",
        "50",
        "--max-texts",
        "12",
        "--max-tokens",
        "48",
        "--pool",
        "max",
        "--bench",
        "--out",
        &s(&out),
    ]));
    assert!(stdout.contains("S_l (union of hu,tr)") && stdout.contains("capture overhead"), "{stdout}");
    for f in [
        "neurons.json",
        "layer_counts.csv",
        "counts.csv",
        "top_neurons.csv",
        "similarity.csv",
        "bench.json",
        "specific_per_layer.svg",
        "specific_per_component.svg",
    ] {
        assert!(out.join(f).metadata().map(|m| m.len() > 0).unwrap_or(false), "{f} missing");
    }
    for f in ["specific_per_layer.png", "specific_per_component.png"] {
        let b = std::fs::read(out.join(f)).unwrap();
        assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{f} is not a PNG");
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("neurons.json")).unwrap()).unwrap();
    assert_eq!(report["languages"].as_array().unwrap().len(), 3);
    // The top-50: the neurons above the cut plus the places its tie shares.
    let hu = &report["languages"][1];
    assert_eq!(hu["top"].as_array().unwrap().len() + hu["top_cut"]["slots"].as_u64().unwrap() as usize, 50);
    assert_eq!(report["version"], 2);
    assert!(stdout.contains("cut_AP") && stdout.contains("tied_at_cut"), "{stdout}");
    assert_eq!(report["pooling"], "max");
    let layers = report["union_counts"].as_array().unwrap().len();
    let csv = std::fs::read_to_string(out.join("layer_counts.csv")).unwrap();
    assert_eq!(csv.lines().next().unwrap(), "layer,en,hu,tr,union_new,union_new_tie_weighted");
    assert_eq!(csv.lines().count(), layers + 1);

    let alloc = dir.join("alloc.json");
    let stdout = ok(&run(&["allocate", "--neurons", &s(&out), "--min", "1", "--max", "6", "--out", &s(&alloc)]));
    assert!(stdout.contains("neuronmoe:") && stdout.contains("layermoe:"), "{stdout}");
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(&alloc).unwrap()).unwrap();
    let e: Vec<u64> = f["new_experts_per_layer"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(e.len(), layers);
    assert!(e.iter().all(|&x| (1..=6).contains(&x)));
    assert!(e.contains(&1) && e.contains(&6), "the extremes map to E_min and E_max: {e:?}");
    assert_eq!(f["method"], "neuronmoe");
    for ext in ["csv", "json", "svg", "png"] {
        assert!(dir.join(format!("alloc.comparison.{ext}")).exists(), "alloc.comparison.{ext}");
    }
    // The default uniform baseline adds NeuronMoE's budget, spread evenly.
    let cmp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("alloc.comparison.json")).unwrap()).unwrap();
    let uniform: Vec<u64> = cmp["uniform"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    // Exactly NeuronMoE's total (docs/methods.md §3.5), as even as whole experts allow.
    let total: u64 = e.iter().sum();
    assert_eq!(uniform.iter().sum::<u64>(), total, "neuronmoe {e:?}, uniform {uniform:?}");
    let (lo, hi) = (*uniform.iter().min().unwrap(), *uniform.iter().max().unwrap());
    assert!(hi - lo <= 1 && lo == total / layers as u64, "neuronmoe {e:?}, uniform {uniform:?}");
    assert!(stdout.contains("NeuronMoE's total"), "{stdout}");
    let base = dir.join("uniform.json");
    ok(&run(&[
        "allocate",
        "--neurons",
        &s(&out.join("neurons.json")),
        "--min",
        "1",
        "--max",
        "6",
        "--baseline",
        "uniform",
        "--uniform",
        "2",
        "--out",
        &s(&base),
    ]));
    let f: serde_json::Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    assert!(f["new_experts_per_layer"].as_array().unwrap().iter().all(|x| x == 2));

    // The file drives `upcycle --allocation`: total = 1 + new per layer.
    let up = dir.join("moe");
    let stdout = ok(&run(&["upcycle", &model, "--allocation", &s(&alloc), "--out", &s(&up)]));
    let want: Vec<String> = e.iter().map(|x| (x + 1).to_string()).collect();
    assert!(stdout.contains(&format!("[{}]", want.join(", "))), "{stdout}");
}

#[test]
fn bad_input_is_explained() {
    let Some(d) = data() else { return };
    let dir = tmp("bad");
    let model = s(&d.join("models/stories260K/stories260K.bin"));
    let en = format!("en={}", s(&d.join("corpora/lang/en/valid.txt")));
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    let one = dir.join("one.txt");
    std::fs::write(&one, "Just one paragraph.\n\n").unwrap();
    let out = s(&dir.join("out"));
    let base = ["neurons", model.as_str(), "--max-texts", "4", "--max-tokens", "16", "--out", out.as_str()];
    let with = |extra: &[&str]| {
        let mut v: Vec<String> = base.iter().map(|x| x.to_string()).collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        run(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let e = failure(&with(&["--lang", &en, "--lang", &format!("xx={}", s(&empty))]));
    assert!(e.contains("empty.txt") && e.contains("language `xx`") && e.contains("empty"), "{e}");
    let e = failure(&with(&["--lang", &en]));
    assert!(e.contains("at least 2 languages"), "{e}");
    let e = failure(&with(&["--lang", &en, "--lang", &format!("xx={}", s(&one))]));
    assert!(e.contains("`xx` has 1 text") && e.contains("at least 2"), "{e}");
    let e = failure(&with(&[
        "--lang",
        &en,
        "--lang",
        &format!("hu={}", s(&d.join("corpora/lang/hu/valid.txt"))),
        "--new",
        "el",
    ]));
    assert!(e.contains("--new `el` is not among"), "{e}");
    let e = failure(&with(&["--lang", "en", "--lang", "hu=x"]));
    assert!(e.contains("expected CODE=FILE"), "{e}");
    let e = failure(&with(&["--lang", &en, "--lang", &format!("xx={}", s(&dir.join("missing.txt")))]));
    assert!(e.contains("missing.txt"), "{e}");
    assert!(!dir.join("out").exists(), "nothing is written on bad input");

    let e = failure(&run(&[
        "allocate",
        "--neurons",
        &s(&dir),
        "--min",
        "6",
        "--max",
        "1",
        "--out",
        &s(&dir.join("a.json")),
    ]));
    assert!(e.contains("E_min (6) is greater than E_max (1)"), "{e}");
    let e = failure(&run(&["allocate", "--neurons", &s(&dir), "--out", &s(&dir.join("a.json"))]));
    assert!(e.contains("neurons.json") && e.contains("moe-studio neurons"), "{e}");
    std::fs::write(dir.join("neurons.json"), "{}").unwrap();
    let e = failure(&run(&["allocate", "--neurons", &s(&dir), "--out", &s(&dir.join("a.json"))]));
    assert!(e.contains("malformed neurons JSON"), "{e}");
    let e =
        failure(&run(&["allocate", "--neurons", &s(&dir), "--baseline", "random", "--out", &s(&dir.join("a.json"))]));
    assert!(e.contains("--baseline `random`") && e.contains("expected one of neuronmoe, uniform, layermoe"), "{e}");
}

/// Too few texts for the Average Precision (3 per language on stories260K's
/// 3,000 neurons: C(9, 3) = 84 orders, so ~36 neurons reach AP = 1 by
/// chance) and a tie at the cut are said on stderr, with the advice.
#[test]
fn few_texts_and_ties_are_warned() {
    let Some(d) = data() else { return };
    let dir = tmp("warn");
    let model = s(&d.join("models/stories260K/stories260K.bin"));
    let lang = |c: &str| format!("{c}={}", s(&d.join(format!("corpora/lang/{c}/valid.txt"))));
    let out = dir.join("neurons");
    let o = run(&[
        "neurons",
        &model,
        "--lang",
        &lang("en"),
        "--lang",
        &lang("hu"),
        "--lang",
        &lang("el"),
        "--top-n",
        "50",
        "--max-texts",
        "3",
        "--max-tokens",
        "24",
        "--out",
        &s(&out),
    ]);
    let stdout = ok(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("warning: `hu`: 3 of 9 texts are too few for the Average Precision")
            && stderr.contains("1/C(9, 3)")
            && stderr.contains("Give at least 6 texts per language"),
        "{stderr}"
    );
    // Such few texts also tie at the cut: the CLI says how many and the
    // union's tie-weighted part.
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("neurons.json")).unwrap()).unwrap();
    let tied: Vec<u64> = report["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["top_cut"]["tied"].as_array().unwrap().len() as u64)
        .collect();
    if tied.iter().any(|&t| t > 0) {
        assert!(stdout.contains("tie-weighted"), "{stdout}");
    }
    eprintln!("tied at the cut per language: {tied:?}\n{stdout}\n{stderr}");
}
