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
        "'=q",
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
