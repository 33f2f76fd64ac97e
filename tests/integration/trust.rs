//! Trust at the edges (issue 48): formula cells in every CSV, output folders that are symbolic
//! links, device outputs, and the smaller input checks, through the real binary.

use std::path::Path;

use super::common::{dpaudit, stderr, stdout};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A scores file whose record ids a spreadsheet would run as formulas: `--scores-out` writes
/// them as text (a leading `'`), like every report CSV, and reading that file back gives the
/// same ids and the same report. Before, `--scores-out` wrote `=HYPERLINK(…)` as a formula cell.
#[test]
fn scores_out_writes_formula_ids_as_text_and_reads_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut body = String::from("record_id,member,attack,t,score,set\n");
    let ids = [
        "\"=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\"",
        "+1+1",
        "@SUM(A1)",
        "-2+3",
        "-7",
        "''=q",
    ];
    for i in 0..8 {
        let id = ids.get(i).map_or(i.to_string(), |s| s.to_string());
        body.push_str(&format!("{id},{},loss,10,{},split\n", u8::from(i < 4), i));
    }
    let f = dir.path().join("in.csv");
    std::fs::write(&f, body).unwrap();
    let out = dir.path().join("out.csv");
    let o = dpaudit(&[
        "mia",
        "--scores",
        s(&f),
        "--bootstrap",
        "20",
        "--scores-out",
        s(&out),
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    for line in text.lines().skip(1) {
        let first = line.trim_start_matches('"');
        assert!(!first.starts_with(['=', '+', '@']), "formula cell written: {line}");
    }
    assert!(text.contains("\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\""), "{text}");
    assert!(text.contains("'-2+3,"), "{text}");
    assert!(text.contains("\n-7,"), "a number stays a number: {text}");
    assert!(text.contains("''=q,"), "{text}");
    // Read back: the same records, so the same report.
    let again = dir.path().join("again.csv");
    let o2 = dpaudit(&[
        "mia",
        "--scores",
        s(&out),
        "--bootstrap",
        "20",
        "--scores-out",
        s(&again),
        "-q",
    ]);
    assert_eq!(o2.status.code(), Some(0), "{}", stderr(&o2));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
}

/// A symbolic link at an output folder dpaudit writes into is refused before any work, naming
/// it, and nothing is written where it points: `train --unet … --checkpoint-every 1 --force`
/// with `OUT/checkpoint` a link (before: the whole checkpoint set, and with `--force` a
/// replaced `config.json`, landed in the link's target), and `--out LINK` of a report command.
#[test]
fn output_folders_that_are_symbolic_links_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("config.json"), "{\"keep\": true}").unwrap();
    let out = dir.path().join("run");
    std::fs::create_dir_all(&out).unwrap();
    std::os::unix::fs::symlink(&target, out.join("checkpoint")).unwrap();
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--seed",
        "1",
        "--checkpoint-every",
        "1",
        "--force",
        "--out",
        s(&out),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(stderr(&o).contains("checkpoint"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(target.join("config.json")).unwrap(),
        "{\"keep\": true}"
    );
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 1);
    assert!(!out.join("config.json").exists(), "refused before any work");

    let link = dir.path().join("report-link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--delta",
        "1e-5",
        "--out",
        s(&link),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 1);
    let _ = stdout(&o);
}

/// `--junit /dev/stdout` with stdout redirected to a regular file writes the XML into that
/// file through the descriptor and leaves `/dev/stdout` the link it was (before, the link was
/// replaced by a regular file, system-wide as root); a symbolic link at an output path is never
/// replaced (refused, naming it).
#[test]
fn junit_to_dev_stdout_writes_into_the_descriptor_and_links_are_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let captured = dir.path().join("stdout.txt");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args([
            "check",
            "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
            "--max-epsilon",
            "1e9",
            "--junit",
            "/dev/stdout",
        ])
        .current_dir(super::common::root())
        .stdout(std::fs::File::create(&captured).unwrap())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        std::fs::symlink_metadata("/dev/stdout")
            .unwrap()
            .file_type()
            .is_symlink(),
        "/dev/stdout was replaced"
    );
    let text = std::fs::read_to_string(&captured).unwrap();
    assert!(text.contains("<testsuites"), "{text}");

    let real = dir.path().join("real.xml");
    std::fs::write(&real, "keep").unwrap();
    let link = dir.path().join("link.xml");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let o = dpaudit(&[
        "check",
        "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
        "--max-epsilon",
        "1e9",
        "--junit",
        s(&link),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&real).unwrap(), "keep");
}

/// `completions bash > /dev/full` is an error naming stdout (exit 2), not a panic (exit 101).
#[test]
fn completions_to_a_full_device_is_an_error_not_a_panic() {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args(["completions", "bash"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("stdout"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

/// A `.npy` of float32 values with `shape` (format 1.0, little-endian).
fn npy_f32(path: &Path, shape: &[usize], values: &[f32]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if shape.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    npy_raw(
        path,
        "<f4",
        &shape_txt,
        &values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    );
}

fn npy_raw(path: &Path, descr: &str, shape: &str, data: &[u8]) {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

/// The smaller input checks: an infinite score (NaN already was refused), a NaN pixel given to
/// `model eval`, and a ledger with δ = 1 given to `mia` (refused by `account`, accepted by `mia`
/// before) are input errors naming the file, line or field.
#[test]
fn infinite_scores_nan_pixels_and_a_ledger_with_delta_one_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["inf", "-inf", "Infinity"] {
        let mut body = String::from("record_id,member,attack,t,score,set\n");
        for i in 0..8 {
            let score = if i == 5 { bad.to_string() } else { i.to_string() };
            body.push_str(&format!("{i},{},loss,10,{score},split\n", u8::from(i < 4)));
        }
        let f = dir.path().join("inf.csv");
        std::fs::write(&f, body).unwrap();
        let o = dpaudit(&["mia", "--scores", s(&f), "--bootstrap", "20", "-q"]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{}:7: field `score`", f.display())),
            "{}",
            stderr(&o)
        );
    }

    let x = dir.path().join("x.npy");
    let mut pixels = vec![0.0f32; 28 * 28];
    pixels[100] = f32::NAN;
    npy_f32(&x, &[1, 1, 28, 28], &pixels);
    let t = dir.path().join("t.npy");
    npy_raw(&t, "<i8", "(1,)", &10i64.to_le_bytes());
    let y = dir.path().join("y.npy");
    let o = dpaudit(&[
        "model",
        "eval",
        "--checkpoint",
        "models/mnist-ddpm",
        "--input",
        s(&x),
        "--timesteps",
        s(&t),
        "--out",
        s(&y),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("element 100 is NaN"), "{}", stderr(&o));
    assert!(stderr(&o).contains("x.npy"), "{}", stderr(&o));
    assert!(!y.exists());

    let ledger = dir.path().join("ledger.toml");
    std::fs::write(
        &ledger,
        "schema_version = 1\nneighbouring = \"add_remove\"\ndelta = 1.0\n[event]\ntype = \"gaussian\"\nnoise_multiplier = 1.0\n",
    )
    .unwrap();
    let o = super::common::mnist_mia(&[
        "--ledger",
        s(&ledger),
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "4",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("field `delta`"), "{}", stderr(&o));
    let o = dpaudit(&["account", "--event", s(&ledger)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// RAPID's `theorem_1` event (the record in every batch) only over-approximates a run drawing
/// Poisson batches: its numbers are upper bounds only, so no claim is `violated` under it (all
/// 16 were, from the exact GDP value used as a lower bound), and the GDP evidence is an upper
/// bound.
#[test]
fn rapid_theorem_1_keeps_upper_bounds_only() {
    let o = dpaudit(&["verify", "fixtures/claims/rapid-scenarios.toml", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let t = v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "analyses")
        .unwrap();
    let col = |name: &str| {
        t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["name"] == name)
            .unwrap()
    };
    let (ii, ik, iv) = (col("interpretation"), col("kind"), col("verdict"));
    let rows: Vec<&serde_json::Value> = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r[ii] == "theorem_1")
        .collect();
    assert_eq!(rows.len(), 16 * 4, "gdp, rdp, pld and the closed form per claim");
    for r in rows {
        assert_ne!(r[iv], "violated", "{r}");
        assert_eq!(r[ik], "upper_bound", "{r}");
    }
}

/// `--canaries` is checked against the memory cap before any canary is drawn: at the limit the
/// run goes on, one above it is refused naming the flag and the largest value that passes
/// (before, `--canaries 10⁹` asked for terabytes and aborted).
#[test]
fn canaries_are_limited_at_and_above_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let run = |m: &str, out: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args([
                "train",
                "--dp",
                "--noise-multiplier",
                "1",
                "--sample-rate",
                "0.1",
                "--steps",
                "1",
                "--canaries",
                m,
                "--hidden",
                "16",
                "--depth",
                "1",
                "--time-dim",
                "8",
                "--batch-size",
                "16",
                "--seed",
                "1",
                "--quiet",
                "--out",
                s(&dir.path().join(out)),
            ])
            .env("DPAUDIT_MAX_MEMORY", "1M")
            .current_dir(super::common::root())
            .output()
            .unwrap()
    };
    // 1 MiB / (64 values × 32 B) = 512 canaries of the 8×8 digits.
    let o = run("512", "at");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = run("513", "above");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("field `--canaries`: 513 is above the limit of 512"),
        "{}",
        stderr(&o)
    );
    let o = dpaudit(&[
        "train",
        "--dp",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.1",
        "--steps",
        "1",
        "--canaries",
        "1000000000",
        "--quiet",
        "--out",
        s(&dir.path().join("huge")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--canaries"), "{}", stderr(&o));
}

/// A diffusers config deeper than the limit (`layers_per_block` 65; 64 is the limit) is
/// refused when the config is read, naming the file and field, before anything is built.
#[test]
fn deep_unet_configs_are_refused_before_building() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new("fixtures/diffusers/unet-28-c1-attn");
    let dst = dir.path().join("deep");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(super::common::root().join(src)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let cfg = dst.join("config.json");
    let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    j["layers_per_block"] = serde_json::json!(65);
    std::fs::write(&cfg, j.to_string()).unwrap();
    let o = dpaudit(&["model", "info", s(&dst)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("layers_per_block"), "{}", stderr(&o));
    assert!(stderr(&o).contains("config.json"), "{}", stderr(&o));
}

/// A `.npy` image set is size-checked from its header before its data is read: a (sparse) file
/// declaring 700,000 MNIST images is refused for its pixel values, not after reading it whole
/// (before: read whole, or refused for its file size only).
#[test]
fn npy_image_sets_are_checked_from_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("big.npy");
    npy_raw(&f, "|u1", "(700000, 1, 28, 28)", &[]);
    let header = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(header + 700_000 * 28 * 28).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args([
            "mia",
            "--checkpoint",
            "models/mnist-ddpm",
            "--data",
            s(&f),
            "--split",
            "fixtures/splits/mnist.toml",
            "--quiet",
        ])
        .env("DPAUDIT_MAX_MEMORY", "512M")
        .current_dir(super::common::root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("images (pixel values)"), "{}", stderr(&o));
    // A header whose shape disagrees with the file's size is refused before reading, too.
    let g = dir.path().join("short.npy");
    npy_raw(&g, "|u1", "(10, 1, 28, 28)", &[0u8; 100]);
    let o = dpaudit(&[
        "model",
        "eval",
        "--checkpoint",
        "models/mnist-ddpm",
        "--input",
        s(&g),
        "--timesteps",
        s(&g),
        "--out",
        s(&dir.path().join("y.npy")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("needs 7840 data bytes, the file has 100"),
        "{}",
        stderr(&o)
    );
}

/// Signed provenance: `train --unet --sign-key` signs the released folder; `mia --trust-key`
/// accepts it and its report says who signed; a key that is not trusted, an unsigned folder, or
/// a card edited after signing (the laundering edit: the manifest deleted, the card changed) is
/// refused by `train --unet --init … --trust-key`, naming the file.
#[test]
fn signed_folders_verify_and_edits_after_signing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let o = dpaudit(&["model", "keygen", "--out", s(&keys)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let other = dir.path().join("other");
    assert_eq!(dpaudit(&["model", "keygen", "--out", s(&other)]).status.code(), Some(0));
    // Never replaces a key.
    assert_eq!(dpaudit(&["model", "keygen", "--out", s(&keys)]).status.code(), Some(2));
    let (secret, public) = (keys.join("dpaudit-signing.key"), keys.join("dpaudit-signing.pub"));
    let out = dir.path().join("signed");
    let train = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--unet",
            "tiny",
            "--dp",
            "--noise-multiplier",
            "1.0",
            "--sample-rate",
            "0.1",
            "--steps",
            "2",
            "--batch-size",
            "8",
            "--seed",
            "1",
            "--quiet",
            "--out",
            s(out),
        ];
        a.extend_from_slice(extra);
        dpaudit(&a)
    };
    let o = train(&out, &["--sign-key", s(&secret)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.join("dpaudit-signature.toml").is_file());

    let m = dir.path().join("mia");
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        s(&out),
        "--data",
        "fixtures/data/mnist/mnist-10k.u8.gz",
        "--split",
        "fixtures/splits/mnist.toml",
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "8",
        "--bootstrap",
        "20",
        "--trust-key",
        s(&public),
        "--out",
        s(&m),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(m.join("mia.json")).unwrap()).unwrap();
    let src = v["checkpoint_basis"]["source"].as_str().unwrap();
    assert!(src.contains("signed by the trusted key ed25519:"), "{src}");

    // --init of the signed folder with its key trusted: accepted; with another key: refused.
    let o = train(
        &dir.path().join("next"),
        &["--init", s(&out), "--trust-key", s(&public)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = train(
        &dir.path().join("next2"),
        &["--init", s(&out), "--trust-key", s(&other.join("dpaudit-signing.pub"))],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a trusted key"), "{}", stderr(&o));

    // An unsigned folder is refused when a key is trusted.
    let plain = dir.path().join("plain");
    assert_eq!(train(&plain, &[]).status.code(), Some(0));
    let o = train(
        &dir.path().join("next3"),
        &["--init", s(&plain), "--trust-key", s(&public)],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is not signed"), "{}", stderr(&o));

    // The card edited after signing (the manifest deleted so no set check sees it): refused,
    // naming the card.
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("dpaudit-manifest.json")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    let card = out.join("dpaudit-card.toml");
    let text = std::fs::read_to_string(&card).unwrap();
    std::fs::write(&card, format!("{text}\n# trained on public rows\n")).unwrap();
    let o = train(
        &dir.path().join("next4"),
        &["--init", s(&out), "--trust-key", s(&public)],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("dpaudit-card.toml") && stderr(&o).contains("changed after signing"),
        "{}",
        stderr(&o)
    );
    // The signature file itself edited (a hash recomputed by whoever edited the card): refused.
    let sig = out.join("dpaudit-signature.toml");
    let stext = std::fs::read_to_string(&sig).unwrap();
    let new_sha = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(std::fs::read(&card).unwrap());
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let mut edited = String::new();
    let mut next_is_card = false;
    for line in stext.lines() {
        if line.contains("dpaudit-card.toml") {
            next_is_card = true;
        } else if next_is_card && line.starts_with("sha256") {
            edited.push_str(&format!("sha256 = \"{new_sha}\"\n"));
            next_is_card = false;
            continue;
        }
        edited.push_str(line);
        edited.push('\n');
    }
    assert_ne!(edited, stext);
    std::fs::write(&sig, edited).unwrap();
    let o = train(
        &dir.path().join("next5"),
        &["--init", s(&out), "--trust-key", s(&public)],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not verify"), "{}", stderr(&o));
}

/// `merge` names the part file a record that does not match the split came from (before, the
/// error named the record but not its part).
#[test]
fn merge_names_the_part_of_a_bad_record() {
    let dir = tempfile::tempdir().unwrap();
    let parts = dir.path().join("parts");
    for i in 0..2 {
        let spec = format!("{i}/2");
        let o = dpaudit(&[
            "mia",
            "--checkpoint",
            "models/digits-mlp.toml",
            "--attack",
            "loss",
            "--timesteps",
            "10",
            "--bootstrap",
            "20",
            "--shard",
            &spec,
            "--out",
            s(&parts),
            "-q",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let p1 = parts.join("mia-part-1-of-2.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p1).unwrap()).unwrap();
    v["records"][0]["record_id"] = serde_json::json!("999999");
    std::fs::write(&p1, v.to_string()).unwrap();
    let p0 = parts.join("mia-part-0-of-2.json");
    let o = dpaudit(&["merge", s(&p0), s(&p1), "--out", s(&dir.path().join("m")), "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("mia-part-1-of-2.json"), "{}", stderr(&o));
    assert!(stderr(&o).contains("999999"), "{}", stderr(&o));
}

/// Diffusion-sampling verdicts rest on the paper's per-step Gaussian model (each step exactly
/// μ_t-GDP, its worst-case pair attained at every x_t), which is not shown for the clipped
/// empirical denoiser: every `violated` says so in the verdicts table, the claims table and the
/// JSON, and the conclusion counts the FAIL verdicts that are about that model (before, the
/// conclusion read "89 FAIL" with no model named); `dpaudit report` derives the same conclusion.
#[test]
fn diffusion_sampling_verdicts_name_their_model_in_the_conclusion() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("v");
    let o = dpaudit(&[
        "verify",
        "fixtures/claims/diffusion-sampling.toml",
        "--out",
        s(&out),
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("report.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let model = "under the per-step Gaussian model of §3";
    let fails: Vec<&serde_json::Value> = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["status"] == "fail")
        .collect();
    assert!(fails.len() > 50, "{}", fails.len());
    for f in &fails {
        assert!(f["message"].as_str().unwrap().contains(model), "{f}");
    }
    let claims = v["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "claims")
        .unwrap();
    let cols: Vec<&str> = claims["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let (iv, id) = (
        cols.iter().position(|c| *c == "verdict").unwrap(),
        cols.iter().position(|c| *c == "detail").unwrap(),
    );
    for r in claims["rows"].as_array().unwrap() {
        if r[iv] == "violated" {
            assert!(r[id].as_str().unwrap().contains(model), "{r}");
        }
    }
    let verdict = v["conclusion"]["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(&format!(
            "{} of the FAIL verdicts are verdicts about a stated model, not shown for the real mechanism: verdicts {model}",
            fails.len()
        )),
        "{verdict}"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("verdicts about a stated model"), "the Markdown conclusion");
    // The conclusion is derived from the report's content: `report` accepts it as it is.
    let o = dpaudit(&["report", s(&out.join("report.json")), "--format", "md"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A verify report without such a check says nothing of a model.
    let o = dpaudit(&["verify", "fixtures/claims/dp-rdm.toml", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(!v["conclusion"]["verdict"].as_str().unwrap().contains("stated model"));
}

/// A negative number given to a flag that takes a number reaches the flag's validator, which
/// names the flag (before: clap's "unexpected argument '-1' found", naming none).
#[test]
fn negative_numbers_are_refused_naming_their_flag() {
    for (args, flag) in [
        (vec!["train", "--steps", "-1"], "--steps"),
        (vec!["train", "--unet", "tiny", "--batch-size", "-3"], "--batch-size"),
        (
            vec![
                "sweep",
                "fixtures/samplers/edm-cifar10-paper.toml",
                "--sigma-min",
                "0.002..5",
                "--points",
                "-1",
            ],
            "--points",
        ),
        (
            vec!["mia", "--checkpoint", "models/digits-mlp.toml", "--timesteps", "-5"],
            "--timesteps",
        ),
        (
            vec!["mia", "--checkpoint", "models/digits-mlp.toml", "--bootstrap", "-2"],
            "--bootstrap",
        ),
    ] {
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("unexpected argument"), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{args:?}: {}", stderr(&o));
    }
}

/// `train --unet` takes a config path that is not UTF-8 (an `OsString`, as every other path
/// flag; before, clap refused "invalid UTF-8 was detected").
#[test]
fn train_unet_takes_a_non_utf8_config_path() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"cfg-\xff"));
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::copy(
        super::common::root().join("fixtures/diffusers/unet-28-c1-attn/config.json"),
        odd.join("config.json"),
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .arg("train")
        .arg("--unet")
        .arg(&odd)
        .args(["--steps", "1", "--seed", "1", "--quiet", "--out"])
        .arg(dir.path().join(std::ffi::OsStr::from_bytes(b"out-\xfe")))
        .current_dir(super::common::root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"out-\xfe"))
        .join("diffusion_pytorch_model.safetensors")
        .is_file());
}

/// A config whose `in_channels` disagrees with the images is blamed on the config (its file
/// and field), with the data file as the reason (before: the data file was named as the error).
#[test]
fn a_config_in_channels_mismatch_names_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    let src = super::common::root().join("fixtures/diffusers/unet-28-c1-attn/config.json");
    let mut j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    j["in_channels"] = serde_json::json!(3);
    j["out_channels"] = serde_json::json!(3);
    std::fs::write(&cfg, j.to_string()).unwrap();
    let o = dpaudit(&[
        "train",
        "--unet",
        s(&cfg),
        "--steps",
        "1",
        "--quiet",
        "--out",
        s(&dir.path().join("o")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains(&format!("{}: field `in_channels`", cfg.display())), "{e}");
    assert!(e.contains("mnist-10k.u8.gz have 1 channel"), "{e}");
}

/// DPAgg-TI on embeddings of ±1e308 (whose squared norms overflow): the rows are normalised
/// with scaling, so the release equals the release on the same rows at ±1 with the same seed
/// (an overflowing norm would make them zero vectors and change every output).
#[test]
fn dpagg_ti_normalises_rows_of_1e308() {
    let dir = tempfile::tempdir().unwrap();
    let mut big = String::new();
    let mut one = String::new();
    for i in 0..40u32 {
        let row: Vec<i32> = (0..16u32)
            .map(|j| if (i * 7 + j * 3) % 5 < 2 { -1 } else { 1 })
            .collect();
        let fmt = |scale: &str| {
            row.iter()
                .map(|v| format!("{}{scale}", if *v < 0 { "-" } else { "" }))
                .collect::<Vec<_>>()
                .join(",")
        };
        big.push_str(&(fmt("1e308") + "\n"));
        one.push_str(&(fmt("1") + "\n"));
    }
    let mut outs = Vec::new();
    for (name, body) in [("big", big), ("one", one)] {
        std::fs::write(dir.path().join(format!("{name}.csv")), body).unwrap();
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!("schema_version = 1\nembeddings = \"{name}.csv\"\nm = 16\nepsilon = 1.0\nsigma_rule = \"classic\"\nreleases = 2\n"),
        )
        .unwrap();
        let out = dir.path().join(format!("out-{name}"));
        let o = dpaudit(&["run", "dpagg-ti", s(&cfg), "--seed", "7", "--out", s(&out), "-q"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        outs.push(std::fs::read_to_string(out.join("outputs.csv")).unwrap());
    }
    assert_eq!(outs[0], outs[1]);
}

/// `analyze` of a full-batch sampler with 10⁵ levels: the critical window's suffix sums and the
/// CSV's window lookup were O(n²) (≈ 10 s of CPU); now linear-logarithmic.
#[test]
fn analyze_of_a_hundred_thousand_levels_is_fast() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(super::common::root().join("fixtures/samplers/edm-cifar10-paper.toml"))
        .unwrap()
        .replace("levels = 50", "levels = 100000");
    let cfg = dir.path().join("l5.toml");
    std::fs::write(&cfg, text).unwrap();
    // The CSV (every step with its window row) on stdout: the report files of --out are
    // ≈ 270 MB at this size, whose writing is linear but not what this test times. The time is
    // the child's CPU time (bash's `time`), so a loaded machine does not make it fail.
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg("TIMEFORMAT='cpu %3U %3S'; time \"$0\" analyze \"$1\" --format csv -q | wc -l")
        .arg(env!("CARGO_BIN_EXE_dpaudit"))
        .arg(&cfg)
        .current_dir(super::common::root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "100001");
    let cpu: f64 = stderr(&o)
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .unwrap()
        .split(' ')
        .map(|x| x.parse::<f64>().unwrap())
        .sum();
    assert!(cpu < 5.0, "{cpu} s of CPU (was ≈ 10.8 s)");
}

/// A folder as a tool that is not dpaudit sees it: every visible file is named in the
/// manifest with its SHA-256, and every name in the manifest is there with that hash.
fn whole_set(dir: &Path) -> Result<(), String> {
    use sha2::Digest as _;
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(".dpaudit-manifest.json")).map_err(|e| format!("manifest: {e}"))?,
    )
    .map_err(|e| e.to_string())?;
    let mut named = std::collections::BTreeSet::new();
    for f in m["files"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        named.insert(name.to_string());
        let bytes = std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        let h: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if h != f["sha256"].as_str().unwrap() {
            return Err(format!("{name} is not the file of its set"));
        }
    }
    let present: std::collections::BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    if present != named {
        return Err(format!("files {present:?} against the manifest's {named:?}"));
    }
    Ok(())
}

/// `--checkpoint-every 1` killed at every commit step (`DPAUDIT_FAULT_AT`, as a kill): the
/// folder `OUT/checkpoint` is, at every moment, one whole checkpoint that a tool reading the
/// files directly sees as a set, and once a checkpoint was written a later kill never loses
/// it (its steps only grow). Before, each member was renamed in turn into the folder, so a
/// kill between two renames left a mix of two checkpoints there (refused by dpaudit, but read
/// as it is by other tools) and the earlier good checkpoint was gone.
#[test]
fn a_killed_checkpoint_commit_leaves_the_previous_checkpoint_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut last_steps = 0;
    for n in 1..=6 {
        let out = dir.path().join(format!("run-{n}"));
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args([
                "train",
                "--unet",
                "tiny",
                "--dp",
                "--noise-multiplier",
                "1",
                "--sample-rate",
                "0.05",
            ])
            .args([
                "--steps",
                "4",
                "--checkpoint-every",
                "1",
                "--seed",
                "3",
                "--quiet",
                "--out",
                s(&out),
            ])
            .env("DPAUDIT_FAULT_AT", n.to_string())
            .current_dir(super::common::root())
            .output()
            .unwrap();
        let ck = out.join("checkpoint");
        if o.status.code() == Some(0) {
            // The fault came after the last commit: the run finished.
            whole_set(&ck).unwrap();
            continue;
        }
        assert_eq!(o.status.code(), Some(134), "n = {n}: {}", stderr(&o));
        if n == 1 {
            assert!(!ck.exists(), "killed before the first checkpoint was in place");
            continue;
        }
        whole_set(&ck).unwrap_or_else(|e| panic!("n = {n}: {e}"));
        let card = std::fs::read_to_string(ck.join("dpaudit-card.toml")).unwrap();
        let steps: usize = card
            .lines()
            .find_map(|l| l.strip_prefix("steps = "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Commits 1–3 are the checkpoints after steps 1–3; later ones are the final folder's.
        assert_eq!(
            steps,
            (n - 1).min(3),
            "n = {n}: the checkpoint of the last completed commit"
        );
        assert!(steps >= last_steps);
        last_steps = steps;
        // dpaudit reads it too.
        let o = dpaudit(&["model", "info", s(&ck)]);
        assert_eq!(o.status.code(), Some(0), "n = {n}: {}", stderr(&o));
    }
    assert_eq!(last_steps, 3);
}

/// `model relocate`: a trained folder moved after training records where it and its --init
/// folder are now, is sealed again (the card holds the new ledger's SHA-256, `check` and
/// `model info` read it), leaves the event untouched; a hand-edited folder and a signed folder
/// without its key are refused, and the key signs the relocated folder again.
#[test]
fn relocate_records_the_new_location_and_seals_the_folder_again() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    let shipped = dir.path().join("shipped");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::create_dir_all(&shipped).unwrap();
    let train = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "train",
            "--unet",
            "tiny",
            "--steps",
            "2",
            "--batch-size",
            "8",
            "--seed",
            "1",
            "--quiet",
            "--out",
            s(out),
        ];
        a.extend_from_slice(extra);
        let o = dpaudit(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    };
    let dp = ["--dp", "--noise-multiplier", "1.0", "--sample-rate", "0.1"];
    train(&scratch.join("base"), &dp);
    let base = scratch.join("base");
    let mut extra = vec!["--init", s(&base)];
    extra.extend_from_slice(&dp);
    train(&scratch.join("run"), &extra);
    let ledger_before = std::fs::read_to_string(scratch.join("run/dpaudit-ledger.toml")).unwrap();
    for f in ["base", "run"] {
        std::fs::rename(scratch.join(f), shipped.join(f)).unwrap();
    }
    let run = shipped.join("run");
    let o = dpaudit(&["model", "relocate", s(&run)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let card = std::fs::read_to_string(run.join("dpaudit-card.toml")).unwrap();
    let ledger = std::fs::read_to_string(run.join("dpaudit-ledger.toml")).unwrap();
    let record = std::fs::read_to_string(run.join("training.json")).unwrap();
    for text in [&card, &ledger, &record] {
        assert!(!text.contains(s(&scratch)), "{text}");
    }
    assert!(card.contains(&format!("--out {}", s(&run))), "{card}");
    assert!(card.contains(&format!("--init {}", s(&shipped.join("base")))), "{card}");
    assert!(card.contains("relocated = "), "{card}");
    assert!(record.contains("\"relocated\""), "{record}");
    // The event is byte for byte the run's: only comment lines changed.
    let body = |t: &str| t.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    assert_eq!(body(&ledger), body(&ledger_before));
    // The card seals the new ledger bytes.
    let sha = dpaudit::report::sha256_hex(ledger.as_bytes());
    assert!(card.contains(&format!("ledger_sha256 = \"{sha}\"")), "{card}");
    let o = dpaudit(&["model", "info", s(&run)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&sha), "{}", stdout(&o));
    let o = dpaudit(&["check", s(&run), "--max-epsilon", "1000"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // A second relocate has nothing to do.
    let o = dpaudit(&["model", "relocate", s(&run)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing written"), "{}", stderr(&o));

    // A hand edit of the ledger after training: refused, naming the seal it breaks.
    let edited = shipped.join("edited");
    train(&scratch.join("edited"), &dp);
    std::fs::rename(scratch.join("edited"), &edited).unwrap();
    let l = edited.join("dpaudit-ledger.toml");
    let t = std::fs::read_to_string(&l).unwrap();
    std::fs::write(&l, t.replace(s(&scratch), "somewhere/else")).unwrap();
    let o = dpaudit(&["model", "relocate", s(&edited)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // Caught when the folder is read (its output-set manifest), before relocate's own check of
    // the card's seal (dp.ledger_sha256): either way nothing is written.
    let e = stderr(&o);
    assert!(
        e.contains("differs from the output set") || e.contains("dp.ledger_sha256"),
        "{e}"
    );
    assert!(std::fs::read_to_string(&l).unwrap().contains("somewhere/else"));
    assert!(std::fs::read_to_string(edited.join("dpaudit-card.toml"))
        .unwrap()
        .contains(s(&scratch)));

    // A signed folder: refused without its key, signed again with it (and the signature verifies).
    let keys = dir.path().join("keys");
    assert_eq!(dpaudit(&["model", "keygen", "--out", s(&keys)]).status.code(), Some(0));
    let (secret, public) = (keys.join("dpaudit-signing.key"), keys.join("dpaudit-signing.pub"));
    let mut extra = vec!["--sign-key", s(&secret)];
    extra.extend_from_slice(&dp);
    train(&scratch.join("signed"), &extra);
    let signed = shipped.join("signed");
    std::fs::rename(scratch.join("signed"), &signed).unwrap();
    let o = dpaudit(&["model", "relocate", s(&signed)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--sign-key"), "{}", stderr(&o));
    let o = dpaudit(&["model", "relocate", s(&signed), "--sign-key", s(&secret)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut extra = vec!["--init", s(&signed), "--trust-key", s(&public)];
    extra.extend_from_slice(&dp);
    let after = dir.path().join("after-signed");
    train(&after, &extra);
}
