//! What users hold and what they read (issue 49): diffusers files as diffusers writes them, `mia`
//! conclusions that state the measured result, reports that identify what they audited by
//! content hash. Every test runs the real binary.

use super::common::{dpaudit, mnist_mia, root, stderr, stdout};

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(o)))
}

/// The `sha256:` value `model info` prints for `file` of `dir`.
fn info_sha(dir: &str, file: &str) -> String {
    let o = dpaudit(&["model", "info", dir]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{file} sha256: ")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {file} line in {}", stdout(&o)))
}

const QUICK: [&str; 8] = [
    "--attack",
    "loss,pia",
    "--timesteps",
    "20",
    "--max-examples",
    "32",
    "--bootstrap",
    "50",
];

/// The mia conclusion on the memorising models/mnist-ddpm states the result (AUC 1.00, members
/// identifiable) in JSON, Markdown, HTML and the terminal text; the report's inputs carry the
/// folder's weights, config and scheduler with the SHA-256 `model info` prints; `report` reads
/// the JSON back (its conclusion derives again).
#[test]
fn mia_conclusion_names_the_result_and_the_inputs_identify_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = QUICK.to_vec();
    a.extend(["--quiet", "--out", dir.path().to_str().unwrap()]);
    let o = mnist_mia(&a);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("conclusion:") && text.contains("members identifiable") && text.contains("AUC 1.00"),
        "{text}"
    );
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap()).unwrap();
    let verdict = rep["conclusion"]["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("AUC 1.00") && verdict.contains("members identifiable"),
        "{verdict}"
    );
    let guarantee = rep["conclusion"]["guarantee"].as_str().unwrap();
    assert!(!guarantee.contains("computes no privacy guarantee"), "{guarantee}");
    for f in ["report.md", "report.html"] {
        let s = std::fs::read_to_string(dir.path().join(f)).unwrap();
        assert!(s.contains("members identifiable") && s.contains("AUC 1.00"), "{f}");
    }
    let inputs = rep["inputs"].as_array().unwrap();
    let sha = |role: &str| -> String {
        inputs
            .iter()
            .find(|i| i["role"] == role)
            .unwrap_or_else(|| panic!("no {role} input in {inputs:?}"))["sha256"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        sha("weights"),
        info_sha("models/mnist-ddpm", "diffusion_pytorch_model.safetensors")
    );
    assert_eq!(sha("config"), info_sha("models/mnist-ddpm", "config.json"));
    for role in ["scheduler", "data", "split"] {
        assert_eq!(sha(role).len(), 64, "{role}");
    }
    let o = dpaudit(&[
        "report",
        dir.path().join("report.json").to_str().unwrap(),
        "--format",
        "md",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A DP folder without --data/--split: the card's data and split (paths relative to the card),
/// listed with the card and the ledger among the inputs. A one-run audit whose 1000 canaries
/// could not have shown the ledger's ε ≈ 7.9 is not demonstrated (INCONCLUSIVE, with the most it
/// could have shown), not a green "PASS: consistent".
#[test]
fn mia_on_a_dp_folder_uses_its_card_and_says_when_the_audit_lacks_power() {
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        "models/mnist-dp-ddpm",
        "--attack",
        "loss",
        "--timesteps",
        "20",
        "--max-examples",
        "16",
        "--bootstrap",
        "20",
        "--audit",
        "one-run",
        "--quiet",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rep = json(&o);
    let inputs = rep["inputs"].as_array().unwrap();
    let path = |role: &str| -> String {
        inputs
            .iter()
            .find(|i| i["role"] == role)
            .unwrap_or_else(|| panic!("no {role} input in {inputs:?}"))["path"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(path("data"), "fixtures/data/mnist/mnist-10k.u8.gz");
    assert_eq!(path("split"), "fixtures/splits/mnist-dp.toml");
    assert_eq!(path("ledger"), "models/mnist-dp-ddpm/dpaudit-ledger.toml");
    assert_eq!(path("card"), "models/mnist-dp-ddpm/dpaudit-card.toml");
    let audit = rep["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["source"].as_str().is_some_and(|s| s.starts_with("one-run audit")))
        .expect("one-run verdict");
    assert_eq!(audit["status"], "inconclusive", "{audit}");
    let verdict = rep["conclusion"]["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("could not have shown ε above") && !verdict.contains("PASS"),
        "{verdict}"
    );
    // One limit per report: the Guarantee's attacker line states the comparisons' ASR limit.
    let limit = rep["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "comparisons")
        .unwrap()["rows"][0][4]
        .as_f64()
        .unwrap();
    let guarantee = rep["conclusion"]["guarantee"].as_str().unwrap();
    let shown = dpaudit::report::export::fmt_num(limit);
    assert!(
        guarantee.contains(&format!("membership accuracy ≤ {shown}")),
        "{guarantee} / {limit}"
    );
}

/// The five scheduler configs diffusers 0.42.1 saves with Stable Diffusion v1.5's schedule
/// (scripts/gen_diffusers_scheduler_configs.py): DDPM and DDIM are analysed; Euler, DPM-Solver++
/// (whose file holds `-Infinity`, read as Python reads it) and PNDM are refused naming the class,
/// why no per-step μ exists, and the way out.
#[test]
fn stable_diffusion_scheduler_configs_each_get_an_answer_or_a_reasoned_refusal() {
    for (name, class, ok) in [
        ("ddpm", "DDPMScheduler", true),
        ("ddim", "DDIMScheduler", true),
        ("euler", "EulerDiscreteScheduler", false),
        ("dpmsolver", "DPMSolverMultistepScheduler", false),
        ("pndm", "PNDMScheduler", false),
    ] {
        let f = format!("fixtures/samplers/diffusers/sd15-{name}-scheduler_config.json");
        let text = std::fs::read_to_string(root().join(&f)).unwrap();
        assert!(text.contains(&format!("\"_class_name\": \"{class}\"")), "{f}");
        let o = dpaudit(&[
            "analyze",
            &f,
            "--dataset-size",
            "50000",
            "--inference-steps",
            "50",
            "--accountant",
            "gdp",
            "--quiet",
            "--format",
            "json",
        ]);
        if ok {
            assert_eq!(o.status.code(), Some(0), "{f}: {}", stderr(&o));
            continue;
        }
        assert_eq!(o.status.code(), Some(2), "{f}: {}", stdout(&o));
        let e = stderr(&o);
        assert!(!e.contains("not valid JSON") && !e.contains("panicked"), "{f}: {e}");
        assert!(
            e.contains(class) && e.contains("no finite per-step μ") && e.contains("Way out"),
            "{f}: {e}"
        );
    }
    assert!(
        std::fs::read_to_string(root().join("fixtures/samplers/diffusers/sd15-dpmsolver-scheduler_config.json"))
            .unwrap()
            .contains("-Infinity")
    );
}

/// A pipeline folder (unet/, scheduler/ holding SD v1.5's PNDM config) is read through its
/// unet/ and scheduler/: `model info` names the scheduler class, `analyze FOLDER` reaches the
/// scheduler config and refuses PNDM with its reason (not "a sampler TOML").
#[test]
fn pipeline_folders_resolve_to_their_unet_and_scheduler() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    std::fs::create_dir_all(p.join("unet")).unwrap();
    std::fs::create_dir_all(p.join("scheduler")).unwrap();
    for f in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(root().join("models/mnist-ddpm").join(f), p.join("unet").join(f)).unwrap();
    }
    std::fs::copy(
        root().join("fixtures/samplers/diffusers/sd15-pndm-scheduler_config.json"),
        p.join("scheduler/scheduler_config.json"),
    )
    .unwrap();
    std::fs::write(p.join("model_index.json"), r#"{"_class_name": "DDPMPipeline"}"#).unwrap();
    let dir = p.to_str().unwrap();
    let o = dpaudit(&["model", "info", dir]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("(PNDMScheduler)"), "{}", stdout(&o));
    let o = dpaudit(&["analyze", dir, "--dataset-size", "100", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("`PNDMScheduler` is not analysed"), "{}", stderr(&o));
}

/// `check FOLDER` checks the folder's DP ledger (it was "Is a directory"); a folder without a
/// ledger is exit 2 saying so. `model info` prints the DP line from the card.
#[test]
fn check_a_diffusers_folder_by_its_ledger_and_model_info_states_dp() {
    let o = dpaudit(&["check", "models/mnist-dp-ddpm", "--max-epsilon", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("PASS") && stdout(&o).contains("dpaudit-ledger.toml"),
        "{}",
        stdout(&o)
    );
    let o = dpaudit(&["check", "models/mnist-dp-ddpm", "--max-epsilon", "7"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = dpaudit(&["check", "models/mnist-ddpm", "--max-epsilon", "8"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("dpaudit-ledger.toml") && !stderr(&o).contains("os error"),
        "{}",
        stderr(&o)
    );
    // A negative budget is the value's error (exit 2 naming the flag), not clap's "use -- -1".
    let o = dpaudit(&["check", "models/mnist-dp-ddpm", "--max-epsilon", "-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("`--max-epsilon`: must be a finite number ≥ 0"),
        "{}",
        stderr(&o)
    );
    let o = dpaudit(&["model", "info", "models/mnist-dp-ddpm"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dp = stdout(&o).lines().find(|l| l.starts_with("DP: ")).map(str::to_string);
    let dp = dp.unwrap_or_else(|| panic!("{}", stdout(&o)));
    assert!(
        dp.contains("noise multiplier 1.72") && dp.contains("ε = 7.94666"),
        "{dp}"
    );
    let o = dpaudit(&["model", "info", "models/mnist-ddpm"]);
    assert!(stdout(&o).contains("DP: not recorded"), "{}", stdout(&o));
}

/// Significant digits of a number written in text (`0.00106667` → 6, `1.1138114835236157` → 17,
/// `2.000000` → 7, `50000` → 1, `1e-5` → 1).
fn significant_digits(n: &str) -> usize {
    let mantissa = n.trim_start_matches('-').split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let digits = digits.trim_start_matches('0');
    if mantissa.contains('.') {
        digits.len()
    } else {
        digits.trim_end_matches('0').len()
    }
}

/// Every number in `text` (digits with an optional fraction and exponent, not part of a word
/// such as a hash or an identifier) with more than six significant digits.
fn long_numbers(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.' || b[i - 1] == b'_'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
            j += 1;
        }
        if j < b.len() && (b[j] == b'e' || b[j] == b'E') {
            let mut k = j + 1;
            if k < b.len() && (b[k] == b'-' || b[k] == b'+') {
                k += 1;
            }
            if k < b.len() && b[k].is_ascii_digit() {
                j = k;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
            }
        }
        let word = j < b.len() && (b[j].is_ascii_alphabetic() || b[j] == b'_');
        let n = text[i..j].trim_end_matches('.');
        if !word && significant_digits(n) > 6 {
            out.push(n.to_string());
        }
        i = j.max(i + 1);
    }
    out
}

/// No sentence of a shipped report (reports/, regenerated by scripts/regen-reports.sh): the
/// conclusion, warnings, verdict messages, assumptions and table titles and notes, holds a number
/// with more than six significant digits (full precision lives in the JSON numbers and CSV).
#[test]
fn shipped_report_sentences_use_six_significant_digits() {
    assert_eq!(
        long_numbers("q = 0.0010666666666666667, 2.000000 and 0.813754, 1e-5, 50000, sha 5ab8b1e509a0"),
        ["0.0010666666666666667", "2.000000"]
    );
    let mut seen = 0;
    let mut bad = Vec::new();
    for entry in std::fs::read_dir(root().join("reports")).unwrap() {
        let p = entry.unwrap().path().join("report.json");
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        seen += 1;
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut sentences: Vec<String> = Vec::new();
        if let Some(c) = r["conclusion"].as_object() {
            sentences.extend(c.values().filter_map(|v| v.as_str().map(str::to_string)));
        }
        for key in ["warnings", "verdicts"] {
            for w in r[key].as_array().into_iter().flatten() {
                sentences.extend(w["message"].as_str().map(str::to_string));
            }
        }
        if let Some(a) = r["assumptions"].as_object() {
            sentences.extend(a.values().filter_map(|v| v.as_str().map(str::to_string)));
        }
        for t in r["tables"].as_array().into_iter().flatten() {
            for k in ["title", "note"] {
                sentences.extend(t[k].as_str().map(str::to_string));
            }
        }
        for s in sentences {
            for n in long_numbers(&s) {
                bad.push(format!("{}: {n} in \"{s}\"", p.display()));
            }
        }
    }
    assert!(seen >= 4, "reports/ holds {seen} reports");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The terminal text of the commands a reviewer reads (stdout and stderr: results, warnings,
/// notes) holds no number with more than six significant digits either; full precision is in
/// `--format json` and CSV.
#[test]
fn command_text_output_uses_six_significant_digits() {
    let runs: &[&[&str]] = &[
        &[
            "account",
            "--noise-multiplier",
            "1.1",
            "--sample-rate",
            "0.004",
            "--steps",
            "14062",
            "--delta",
            "1e-5",
        ],
        &[
            "account",
            "--event",
            "fixtures/events/heterogeneous.toml",
            "--delta",
            "1e-5",
        ],
        &[
            "calibrate",
            "--target-epsilon",
            "8",
            "--sample-rate",
            "0.01",
            "--steps",
            "10000",
            "--delta",
            "1e-5",
        ],
        &[
            "check",
            "fixtures/events/dpsgd-mnist-sigma0.8.toml",
            "--max-epsilon",
            "2",
        ],
        &["check", "models/mnist-dp-ddpm", "--max-epsilon", "8"],
        &["analyze", "fixtures/samplers/edm-cifar10-subsampled.toml"],
        &["verify", "fixtures/claims/dp-rdm-cifar10.toml"],
        &["model", "info", "models/mnist-dp-ddpm"],
    ];
    let mut bad = Vec::new();
    for args in runs {
        let o = dpaudit(args);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{args:?}: {}", stderr(&o));
        let out = format!("{}\n{}", stdout(&o), stderr(&o));
        assert!(out.trim().len() > 20, "{args:?} printed nothing");
        for line in out.lines() {
            for n in long_numbers(line) {
                bad.push(format!("dpaudit {}: {n} in \"{line}\"", args.join(" ")));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// `train` speaks Opacus: --batch-size under --dp is the expected batch (q = B/N), --epochs
/// gives ⌈E/q⌉ steps, --target-epsilon calibrates σ (ε ≤ target in the card); -q prints nothing
/// on stderr. --epochs with --steps, and an expected batch of 0, are refused.
#[test]
fn train_takes_epochs_expected_batch_and_target_epsilon() {
    let t = tempfile::tempdir().unwrap();
    let out = format!("{}/", t.path().join("m").display());
    let o = dpaudit(&[
        "train",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--dp",
        "--target-epsilon",
        "3",
        "-q",
        "--out",
        &out,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "-q must be quiet");
    assert!(stdout(&o).contains("--delta 1e-5"), "{}", stdout(&o));
    let card: toml::Table = toml::from_str(&std::fs::read_to_string(t.path().join("m/m.toml")).unwrap()).unwrap();
    let dp = card["dp"].as_table().unwrap();
    // 400 members in fixtures/splits/digits.toml: q = 64/400, steps = ⌈2/0.16⌉ = 13.
    assert_eq!(dp["sample_rate"].as_float(), Some(0.16));
    assert_eq!(dp["steps"].as_integer(), Some(13));
    let eps = dp["epsilon"].as_float().unwrap();
    assert!(eps <= 3.0 && eps > 2.9, "ε = {eps}");
    for bad in [
        vec!["train", "--epochs", "2", "--steps", "5", "--out", &out],
        vec!["train", "--dp", "--batch-size", "0", "--out", &out],
    ] {
        let o = dpaudit(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
}

/// `train --unet` speaks Opacus too: under --dp --batch-size is the expected batch (q = B/N over
/// the shipped MNIST split's 128 members), the chunk is --max-physical-batch-size, and -q prints
/// nothing on stderr (the executor line was printed regardless). With --sample-rate, --batch-size
/// keeps its old reading (the chunk) and says so.
#[test]
fn train_unet_takes_the_expected_batch_under_dp() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("u");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--dp",
        "--batch-size",
        "16",
        "--max-physical-batch-size",
        "8",
        "--steps",
        "1",
        "--seed",
        "1",
        "-q",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "-q must be quiet");
    let card: toml::Table = toml::from_str(&std::fs::read_to_string(out.join("dpaudit-card.toml")).unwrap()).unwrap();
    assert_eq!(card["dp"]["sample_rate"].as_float(), Some(16.0 / 128.0), "{card:?}");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--dp",
        "--sample-rate",
        "0.5",
        "--batch-size",
        "8",
        "--steps",
        "1",
        "--seed",
        "1",
        "--force",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("read as the per-sample-gradient chunk"),
        "{}",
        stderr(&o)
    );
    let card: toml::Table = toml::from_str(&std::fs::read_to_string(out.join("dpaudit-card.toml")).unwrap()).unwrap();
    assert_eq!(card["dp"]["sample_rate"].as_float(), Some(0.5));
}

/// A `[[dp_sgd]]` claim in Opacus' own names (`max_grad_norm`, `target_delta`) is read like
/// `clip` and `delta` (it was an unknown-key error, exit 2).
#[test]
fn dp_sgd_claims_accept_opacus_names() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("opacus.toml");
    std::fs::write(
        &f,
        "schema_version = 1\n\n[[dp_sgd]]\nid = \"opacus-names\"\nsource = \"illustration\"\ndataset_size = 100000\n\
         batch_size = 1000\nsteps = 100\nsampling = \"poisson\"\nnoise_multiplier = 1.0\nmax_grad_norm = 1.0\n\
         epsilon = 2.0\ntarget_delta = 1e-5\n",
    )
    .unwrap();
    let o = dpaudit(&["verify", f.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("δ = 1e-5") && stdout(&o).contains("holds"),
        "{}",
        stdout(&o)
    );
}
