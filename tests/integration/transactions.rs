//! Integration tests (issue 29): secret noise, transactional output sets, and re-deriving what
//! is read instead of trusting it — all through the real binary.
//!
//! * Predictable DP noise: two unseeded `run dpagg-ti`, `run dp-rdm` and `train --dp` release
//!   different outputs; a seeded release says "not private against anyone who knows the seed"
//!   in its ledger, run.json / card and report.
//! * Ledgers that disagree: a kill at every rename of `run`, `check --out` and `train` (the
//!   `DPAUDIT_FAULT_AT` hook) never leaves a set that a reader accepts while its files come from
//!   two runs, and the next run succeeds; concurrent writers, existing outputs of
//!   `--save-event` / `model eval --out` / `train`, `--junit` onto the input and device files.
//! * Trusting inputs: `report` refuses a `pass` over budget and results that its own event does
//!   not give; `merge` refuses flipped labels, foreign record ids, one part relabelled as the
//!   complete run and foreign input hashes; a card and a ledger that disagree are refused by
//!   `mia --checkpoint`.

use super::common::{dpaudit, root, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SEEDED: &str = "not private against anyone who knows the seed";
const FAULT: &str = "DPAUDIT_FAULT_AT";
const FAULT_EXIT: i32 = 134;

fn run_env(args: &[String], env: &[(&str, String)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dpaudit"));
    c.args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("spawn dpaudit")
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn debris(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".dpaudit-tmp") || n.ends_with("dpaudit-lock"))
        .collect()
}

// ------------------------------------------------------------------------------------------
// Predictable DP noise

fn run_mech(mech: &str, config: &str, dir: &Path, extra: &[&str]) -> Output {
    let mut a = s(&["run", mech, config, "--out", dir.to_str().unwrap(), "-q"]);
    a.extend(s(extra));
    run_env(&a, &[])
}

/// Two unseeded runs of each mechanism release different outputs; two seeded runs agree, and
/// every file of a seeded run says it is not private against whoever knows the seed (and an
/// unseeded run says its noise came from the OS).
#[test]
fn unseeded_mechanisms_release_different_outputs_and_seeded_ones_say_so() {
    let tmp = tempfile::tempdir().unwrap();
    for (mech, config) in [
        ("dpagg-ti", "fixtures/runs/dpagg-ti-digits.toml"),
        ("dp-rdm", "fixtures/runs/dp-rdm-digits.toml"),
    ] {
        let d = |n: &str| tmp.path().join(format!("{mech}-{n}"));
        for n in ["a", "b"] {
            let o = run_mech(mech, config, &d(n), &[]);
            assert_eq!(o.status.code(), Some(0), "{mech}: {}", stderr(&o));
        }
        let (a, b) = (read(&d("a").join("outputs.csv")), read(&d("b").join("outputs.csv")));
        assert!(a.lines().count() > 1, "{mech}: nothing released");
        assert_ne!(a, b, "{mech}: two unseeded runs released the same outputs");
        let ledger = read(&d("a").join("ledger.toml"));
        assert!(
            ledger.contains("operating system's CSPRNG") && !ledger.contains(SEEDED),
            "{ledger}"
        );
        for n in ["s1", "s2"] {
            let o = run_mech(mech, config, &d(n), &["--seed", "5"]);
            assert_eq!(o.status.code(), Some(0), "{mech}: {}", stderr(&o));
        }
        assert_eq!(
            read(&d("s1").join("outputs.csv")),
            read(&d("s2").join("outputs.csv")),
            "{mech}"
        );
        for f in ["ledger.toml", "run.json", "report.json", "report.md", "report.html"] {
            assert!(
                read(&d("s1").join(f)).contains(SEEDED),
                "{mech}: {f} does not say it is seeded"
            );
        }
        let run: serde_json::Value = serde_json::from_str(&read(&d("s1").join("run.json"))).unwrap();
        assert_eq!(run["run"]["seed"].as_u64(), Some(5));
        let unseeded: serde_json::Value = serde_json::from_str(&read(&d("a").join("run.json"))).unwrap();
        assert!(unseeded["run"]["seed"].is_null(), "{unseeded}");
    }
    // train --dp: the same for the weights, the card and the ledger.
    let train = |stem: &Path, extra: &[&str]| {
        let mut a = s(&[
            "train",
            "--dp",
            "--steps",
            "3",
            "--hidden",
            "8",
            "--depth",
            "1",
            "--time-dim",
            "8",
            "--device",
            "cpu",
            "-q",
            "--out",
        ]);
        a.push(stem.display().to_string());
        a.extend(s(extra));
        let o = run_env(&a, &[]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    };
    let (a, b, c) = (tmp.path().join("ta"), tmp.path().join("tb"), tmp.path().join("tc"));
    train(&a, &[]);
    train(&b, &[]);
    train(&c, &["--seed", "9"]);
    let w = |p: &Path| std::fs::read(p.with_extension("safetensors")).unwrap();
    assert_ne!(w(&a), w(&b), "two unseeded DP trainings released the same weights");
    for f in ["toml", "ledger.toml"] {
        let text = read(&PathBuf::from(format!("{}.{f}", c.display())));
        assert!(text.contains(SEEDED), "{f}: {text}");
    }
}

// ------------------------------------------------------------------------------------------
// Transactional outputs: a kill at every rename

/// The marker each run leaves in every text file of its set.
fn markers(dir: &Path, files: &[&str], a: &str, b: &str) -> Vec<(String, &'static str)> {
    files
        .iter()
        .map(|f| {
            let t = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let m = match (t.contains(a), t.contains(b)) {
                (true, false) => "A",
                (false, true) => "B",
                (false, false) => "missing",
                (true, true) => "both",
            };
            (f.to_string(), m)
        })
        .collect()
}

fn one_run(m: &[(String, &'static str)]) -> bool {
    m.iter().all(|(_, x)| *x == m[0].1) && (m[0].1 == "A" || m[0].1 == "B")
}

/// Kills a command at every rename of its output set (1 = the manifest, then each file), over
/// an earlier complete set: every reader either refuses (exit 2) or reads files that all come
/// from one run; the staging folder left by the kill is removed by the next run, which
/// succeeds. `run`, `check --out` and `train --dp`.
#[test]
fn a_kill_at_any_rename_never_leaves_a_mixed_set_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let mut trials = 0;
    // Kills that left a mixed set which a reader then refused: proves the refusal is exercised.
    let mut refused = 0;

    // run dpagg-ti: marker = the seed (in the ledger, run.json and every report format).
    let dir = tmp.path().join("run");
    let run_args = |seed: &str| {
        s(&[
            "run",
            "dpagg-ti",
            "fixtures/runs/dpagg-ti-digits.toml",
            "--seed",
            seed,
            "--out",
            dir.to_str().unwrap(),
            "--force",
            "-q",
        ])
    };
    let files = ["ledger.toml", "run.json", "report.json", "report.md", "report.html"];
    let (ma, mb) = ("seed = 123456789", "seed = 987654321");
    let o = run_env(&run_args("123456789"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut step = 1;
    loop {
        let o = run_env(&run_args("987654321"), &[(FAULT, step.to_string())]);
        if o.status.code() == Some(0) {
            break; // past the last rename: the run completed
        }
        assert_eq!(o.status.code(), Some(FAULT_EXIT), "step {step}: {}", stderr(&o));
        trials += 1;
        // Markdown/HTML/JSON carry the seed in the command line ("--seed 987654321").
        let m: Vec<_> = markers(&dir, &files, "123456789", "987654321");
        let acc = run_env(
            &s(&["account", "--event", dir.join("ledger.toml").to_str().unwrap()]),
            &[],
        );
        let rep = run_env(
            &s(&["report", dir.join("report.json").to_str().unwrap(), "--format", "md"]),
            &[],
        );
        for (what, o) in [("account --event ledger.toml", &acc), ("report report.json", &rep)] {
            match o.status.code() {
                Some(0) => assert!(one_run(&m), "step {step}: {what} accepted a mixed set {m:?}"),
                Some(2) => {
                    refused += 1;
                    assert!(
                        stderr(o).contains("mixed or incomplete") || stderr(o).contains("disagree"),
                        "step {step}: {what}: {}",
                        stderr(o)
                    );
                }
                c => panic!("step {step}: {what}: exit {c:?} {}", stderr(o)),
            }
        }
        // Whatever the ledger says it released is what outputs.csv holds, when it is read.
        if acc.status.code() == Some(0) {
            let ledger = read(&dir.join("ledger.toml"));
            let released: usize = ledger
                .split("released = ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(
                read(&dir.join("outputs.csv")).lines().count(),
                released + 1,
                "step {step}"
            );
            assert!(ledger.contains(ma) || ledger.contains(mb));
        }
        step += 1;
        assert!(step < 40, "the commit never completed");
    }
    // A folder holding only the set is committed by one exchange of the folder: one step.
    assert_eq!(step, 2, "one rename of the whole folder");
    assert!(debris(&dir).is_empty(), "{:?}", debris(&dir));
    let m = markers(&dir, &files, "123456789", "987654321");
    assert!(m.iter().all(|(_, x)| *x == "B"), "{m:?}");

    // check --out (no plots: the loop stays fast): marker = the budget.
    let dir = tmp.path().join("check");
    let check_args = |budget: &str| {
        s(&[
            "check",
            "fixtures/events/dpsgd.toml",
            "--max-epsilon",
            budget,
            "--no-plots",
            "--out",
            dir.to_str().unwrap(),
            "--force",
            "-q",
        ])
    };
    let files = ["report.json", "report.md", "report.html", "report-verdicts.csv"];
    let o = run_env(&check_args("8.125"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut step = 1;
    loop {
        let o = run_env(&check_args("9.375"), &[(FAULT, step.to_string())]);
        if o.status.code() == Some(0) {
            break;
        }
        assert_eq!(o.status.code(), Some(FAULT_EXIT), "step {step}: {}", stderr(&o));
        trials += 1;
        let m = markers(&dir, &files, "8.125", "9.375");
        let rep = run_env(
            &s(&["report", dir.join("report.json").to_str().unwrap(), "--format", "md"]),
            &[],
        );
        match rep.status.code() {
            Some(0) => assert!(one_run(&m), "step {step}: a mixed set was rendered {m:?}"),
            Some(2) => {
                refused += 1;
                assert!(stderr(&rep).contains("mixed or incomplete"), "{}", stderr(&rep));
            }
            c => panic!("step {step}: exit {c:?} {}", stderr(&rep)),
        }
        step += 1;
        assert!(step < 40);
    }
    assert_eq!(step, 2, "one rename of the whole folder");
    assert!(debris(&dir).is_empty(), "{:?}", debris(&dir));

    // train --dp: marker = the steps (card and ledger); readers: the ledger, and mia on the card.
    let dir = tmp.path().join("train");
    std::fs::create_dir_all(&dir).unwrap();
    let stem = dir.join("m");
    let train_args = |steps: &str| {
        s(&[
            "train",
            "--dp",
            "--steps",
            steps,
            "--hidden",
            "8",
            "--depth",
            "1",
            "--time-dim",
            "8",
            "--device",
            "cpu",
            "-q",
            "--force",
            "--out",
            stem.to_str().unwrap(),
        ])
    };
    let files = ["m.toml", "m.ledger.toml"];
    let o = run_env(&train_args("3"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut step = 1;
    loop {
        let o = run_env(&train_args("4"), &[(FAULT, step.to_string())]);
        if o.status.code() == Some(0) {
            break;
        }
        assert_eq!(o.status.code(), Some(FAULT_EXIT), "step {step}: {}", stderr(&o));
        trials += 1;
        let m = markers(&dir, &files, "--steps 3 ", "--steps 4 ");
        let acc = run_env(
            &s(&["account", "--event", dir.join("m.ledger.toml").to_str().unwrap()]),
            &[],
        );
        let mia = run_env(
            &s(&[
                "mia",
                "--checkpoint",
                dir.join("m.toml").to_str().unwrap(),
                "--attack",
                "loss",
                "--timesteps",
                "10",
                "--bootstrap",
                "20",
                "--noise-draws",
                "1",
                "--device",
                "cpu",
                "-q",
            ]),
            &[],
        );
        for (what, o) in [("account", &acc), ("mia --checkpoint", &mia)] {
            match o.status.code() {
                Some(0) | Some(1) => assert!(one_run(&m), "step {step}: {what} accepted a mixed set {m:?}"),
                Some(2) => {
                    refused += 1;
                    assert!(
                        stderr(o).contains("mixed or incomplete") || stderr(o).contains("disagree"),
                        "step {step}: {what}: {}",
                        stderr(o)
                    );
                }
                c => panic!("step {step}: {what}: exit {c:?} {}", stderr(o)),
            }
        }
        step += 1;
        assert!(step < 20);
    }
    assert!(step > 3, "weights, ledger and card: {step}");
    assert!(debris(&dir).is_empty(), "{:?}", debris(&dir));
    let card = read(&dir.join("m.toml"));
    assert!(card.contains("steps = 4"), "{card}");

    // A kill before the manifest into a fresh folder leaves nothing: the next run needs no --force.
    let fresh = tmp.path().join("fresh");
    let mut a = s(&[
        "check",
        "fixtures/events/dpsgd.toml",
        "--max-epsilon",
        "8",
        "--no-plots",
        "-q",
        "--out",
    ]);
    a.push(fresh.display().to_string());
    let o = run_env(&a, &[(FAULT, "1".into())]);
    assert_eq!(o.status.code(), Some(FAULT_EXIT));
    assert!(!fresh.join("report.json").exists());
    let o = run_env(&a, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(debris(&fresh).is_empty(), "{:?}", debris(&fresh));
    assert!(trials >= 5, "{trials} kills");
    // Every kill of the stem set after its manifest and before its last rename leaves an
    // incomplete set, which the readers must refuse.
    assert!(refused >= 2, "only {refused} refusals in {trials} kills");
}

// ------------------------------------------------------------------------------------------
// Concurrent writers, existing outputs, inputs and devices

/// While another writer holds a set's lock, a writer without --force is refused (exit 2) and
/// one with --force waits for it, then writes the whole set.
#[test]
fn concurrent_writers_are_refused_without_force_and_serialised_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("o");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::File::create(dir.join(".dpaudit-lock")).unwrap();
    lock.lock().unwrap();
    let mut a = s(&[
        "check",
        "fixtures/events/dpsgd.toml",
        "--max-epsilon",
        "8",
        "--no-plots",
        "-q",
        "--out",
    ]);
    a.push(dir.display().to_string());
    let o = run_env(&a, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("another dpaudit is writing"), "{}", stderr(&o));
    assert!(!dir.join("report.json").exists());
    // --force waits until the holder is done.
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(700));
        drop(lock);
    });
    a.push("--force".into());
    let t0 = std::time::Instant::now();
    let o = run_env(&a, &[]);
    holder.join().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(t0.elapsed().as_millis() >= 600, "did not wait for the lock");
    let rep = dpaudit(&["report", dir.join("report.json").to_str().unwrap(), "--format", "md"]);
    assert_eq!(rep.status.code(), Some(0), "{}", stderr(&rep));

    // Two `train` runs of one stem at once, without --force: never both succeed, and the set
    // left is whole.
    let stem = tmp.path().join("t").join("m");
    let args = s(&[
        "train",
        "--steps",
        "3",
        "--hidden",
        "8",
        "--depth",
        "1",
        "--time-dim",
        "8",
        "--device",
        "cpu",
        "-q",
        "--out",
        stem.to_str().unwrap(),
    ]);
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args(&args)
            .current_dir(root())
            .output()
    };
    let (x, y) = std::thread::scope(|sc| {
        let h1 = sc.spawn(spawn);
        let h2 = sc.spawn(spawn);
        (h1.join().unwrap().unwrap(), h2.join().unwrap().unwrap())
    });
    let codes = [x.status.code(), y.status.code()];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(2)),
        "{codes:?} {} {}",
        stderr(&x),
        stderr(&y)
    );
    let dev = candle_core::Device::Cpu;
    dpaudit::models::toy::Checkpoint::load(&stem.with_extension("toml"), &dev).unwrap();
}

/// Every output path that exists is refused without --force (`--save-event`, `model eval
/// --out`, `train`'s stem); `--junit` onto the input file never replaces it; a device file is
/// written into, never replaced by a regular file.
#[test]
fn existing_inputs_and_devices_are_never_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    // --save-event
    let ev = tmp.path().join("saved.toml");
    std::fs::write(&ev, "mine").unwrap();
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/dpsgd.toml",
        "--save-event",
        ev.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(read(&ev), "mine");
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/dpsgd.toml",
        "--save-event",
        ev.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(read(&ev).contains("[event]"));
    // model eval --out: refused before the checkpoint is even read.
    let npy = tmp.path().join("pred.npy");
    std::fs::write(&npy, "mine").unwrap();
    let o = dpaudit(&[
        "model",
        "eval",
        "--checkpoint",
        "fixtures/does-not-exist",
        "--input",
        "x.npy",
        "--timesteps",
        "t.npy",
        "--out",
        npy.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--force") && !stderr(&o).contains("does-not-exist"),
        "{}",
        stderr(&o)
    );
    assert_eq!(read(&npy), "mine");
    // --junit onto the input file.
    let input = tmp.path().join("event.toml");
    std::fs::copy(root().join("fixtures/events/dpsgd.toml"), &input).unwrap();
    let before = read(&input);
    let o = dpaudit(&[
        "check",
        input.to_str().unwrap(),
        "--max-epsilon",
        "8",
        "--junit",
        input.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is an input of this command"), "{}", stderr(&o));
    assert_eq!(read(&input), before);
    // Device nodes: written into, never replaced.
    use std::os::unix::fs::FileTypeExt;
    let o = dpaudit(&[
        "report",
        "fixtures/golden/check-edm-fullbatch/report.json",
        "-o",
        "/dev/null",
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    let o = dpaudit(&[
        "check",
        "fixtures/events/dpsgd.toml",
        "--max-epsilon",
        "8",
        "--junit",
        "/dev/stdout",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("<testsuite"), "{}", stdout(&o));
    // A directory is not an output file.
    let o = dpaudit(&[
        "report",
        "fixtures/golden/check-edm-fullbatch/report.json",
        "-o",
        tmp.path().to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

// ------------------------------------------------------------------------------------------
// Re-derive, don't trust

fn report_exit(v: &serde_json::Value, dir: &Path, name: &str) -> Output {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(v).unwrap()).unwrap();
    dpaudit(&["report", p.to_str().unwrap(), "--format", "md"])
}

/// An edit of a report's JSON.
type Edit = Box<dyn Fn(&mut serde_json::Value)>;

/// Each (name, edit, field) applied to `honest` alone: `report` refuses it (exit 2), names
/// `field`, and renders nothing.
fn each_refused(honest: &serde_json::Value, dir: &Path, cases: Vec<(&str, Edit, &str)>) {
    for (name, edit, field) in cases {
        let mut v = honest.clone();
        edit(&mut v);
        let o = report_exit(&v, dir, &format!("{name}.json"));
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(field),
            "{name}: expected `{field}` in {}",
            stderr(&o)
        );
        assert!(stdout(&o).is_empty(), "{name}: rendered {}", stdout(&o));
    }
}

/// `report` renders nothing from a JSON whose statuses or numbers contradict each other: a
/// `pass` with ε = 99 over a budget of 1, or the ε of 9,375 steps under an event of 1 step.
#[test]
fn report_recomputes_verdicts_and_results() {
    let tmp = tempfile::tempdir().unwrap();
    let json = |steps: &str| -> serde_json::Value {
        let o = dpaudit(&[
            "check",
            "--noise-multiplier",
            "1.1",
            "--sample-rate",
            "0.01",
            "--steps",
            steps,
            "--delta",
            "1e-5",
            "--max-epsilon",
            "1",
            "--no-plots",
            "--format",
            "json",
        ]);
        assert!(matches!(o.status.code(), Some(0) | Some(1)), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let one = json("1");
    let many = json("9375");
    // The honest reports render.
    for (n, v) in [("one.json", &one), ("many.json", &many)] {
        let o = report_exit(v, tmp.path(), n);
        assert_eq!(o.status.code(), Some(0), "{n}: {}", stderr(&o));
    }
    // pass with ε = 99 > budget 1.
    let mut forged = many.clone();
    let v = &mut forged["verdicts"][0];
    assert_eq!(v["status"], "fail", "{v}");
    v["status"] = "pass".into();
    let o = report_exit(&forged, tmp.path(), "pass99.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("verdicts[0].status"), "{}", stderr(&o));
    let mut forged = one.clone();
    forged["verdicts"][0]["epsilon"] = 99.0.into();
    forged["verdicts"][0]["margin"] = (-98.0).into();
    let o = report_exit(&forged, tmp.path(), "eps99.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("verdicts[0].status"), "{}", stderr(&o));
    // 9,375 steps' results (and verdict) under the event of 1 step.
    let mut forged = one.clone();
    forged["results"] = many["results"].clone();
    forged["verdicts"] = many["verdicts"].clone();
    let o = report_exit(&forged, tmp.path(), "steps.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("results[") && stderr(&o).contains("own event"),
        "{}",
        stderr(&o)
    );
    // A verdict whose ε is not any result's.
    let mut forged = one.clone();
    let e = forged["verdicts"][0]["epsilon"].as_f64().unwrap();
    forged["verdicts"][0]["epsilon"] = (e / 2.0).into();
    forged["verdicts"][0]["margin"] = (1.0 - e / 2.0).into();
    let o = report_exit(&forged, tmp.path(), "eps-half.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("verdicts[0].epsilon"), "{}", stderr(&o));
}

/// Each way an edited `check` report once slipped through is refused, naming the field: a result
/// relabelled (exact, or a CLT estimate as an upper bound), the event or neighbouring relation
/// removed so nothing could be re-derived, a δ of 1, the cited accountant's result dropped, the
/// verdict's message, and the conclusion's guarantee or verdict sentence (in any letter case).
#[test]
fn report_refuses_forged_evidence() {
    let tmp = tempfile::tempdir().unwrap();
    let o = dpaudit(&[
        "check",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.01",
        "--steps",
        "9375",
        "--delta",
        "1e-5",
        "--max-epsilon",
        "1",
        "--no-plots",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let honest: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let at = |acc: &str| -> usize {
        honest["results"]
            .as_array()
            .unwrap()
            .iter()
            .position(|r| r["accountant"] == acc)
            .unwrap_or_else(|| panic!("no {acc} result"))
    };
    let (clt, pld) = (at("clt"), at("pld"));
    // The verdict a forger wants: pass at ε = 0.4 on the named accountant and kind.
    let pass = |v: &mut serde_json::Value, acc: &str, kind: &str| {
        let d = &mut v["verdicts"][0];
        d["status"] = "pass".into();
        d["epsilon"] = 0.4.into();
        d["margin"] = 0.6.into();
        d["accountant"] = acc.into();
        d["bound"] = kind.into();
        d["message"] = format!("sound ε = 0.4 ({acc} {}) ≤ budget 1", kind.replace('_', " ")).into();
    };
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "pld-exact",
            Box::new(move |v| {
                v["results"][pld]["kind"] = "exact".into();
                v["results"][pld]["epsilon"] = 0.4.into();
                pass(v, "pld", "exact");
            }),
            &*format!("results[{pld}].kind").leak(),
        ),
        (
            "clt-as-bound",
            Box::new(move |v| {
                v["results"][clt]["kind"] = "upper_bound".into();
                pass(v, "clt", "upper_bound");
            }),
            &*format!("results[{clt}].kind").leak(),
        ),
        (
            "no-event",
            Box::new(|v| v["event"] = serde_json::Value::Null),
            "no event",
        ),
        (
            "no-neighbouring",
            Box::new(|v| v["assumptions"]["neighbouring"] = serde_json::Value::Null),
            "no neighbouring relation",
        ),
        (
            "delta-1",
            Box::new(move |v| v["results"][pld]["delta"] = 1.0.into()),
            &*format!("results[{pld}].delta").leak(),
        ),
        (
            "pld-dropped",
            Box::new(move |v| {
                v["results"].as_array_mut().unwrap().remove(pld);
            }),
            "verdicts[0]",
        ),
        (
            "message",
            // The conclusion quotes the message: edited along with it, so that only the
            // verdict derived again from the results can tell.
            Box::new(|v| {
                v["verdicts"][0]["message"] = "sound ε within budget".into();
                v["conclusion"]["verdict"] = "FAIL: sound ε within budget.".into();
            }),
            "verdicts[0].message",
        ),
        (
            "guarantee",
            Box::new(|v| {
                let g = v["conclusion"]["guarantee"].as_str().unwrap().to_string();
                v["conclusion"]["guarantee"] = g.replacen("(ε = ", "(ε = 0.1, was ", 1).into();
            }),
            "conclusion.guarantee",
        ),
        (
            "verdict-case",
            Box::new(|v| v["conclusion"]["verdict"] = "Pass: sound ε within budget.".into()),
            "conclusion.verdict",
        ),
    ];
    each_refused(&honest, tmp.path(), cases);
    let o = report_exit(&honest, tmp.path(), "honest.json");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A `verify` report whose verdict was flipped is refused: against its claims table, and (with the
/// claims table edited to match) because the evidence it cites is none of the claim's analyses.
#[test]
fn report_refuses_a_forged_verify_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let o = dpaudit(&["verify", "fixtures/claims/dp-sgd.toml", "--format", "json"]);
    assert!(matches!(o.status.code(), Some(0) | Some(1)), "{}", stderr(&o));
    let honest: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let o = report_exit(&honest, tmp.path(), "honest.json");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let i = honest["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .position(|v| v["status"] != "pass")
        .expect("a claim that does not hold");
    let claim = honest["verdicts"][i]["subject"]
        .as_str()
        .unwrap()
        .split(" (")
        .next()
        .unwrap()
        .to_string();
    let forge = |v: &mut serde_json::Value| {
        let d = &mut v["verdicts"][i];
        d["status"] = "pass".into();
        d["epsilon"] = 0.5.into();
        d["accountant"] = "pld".into();
        d["bound"] = "upper_bound".into();
        d["source"] = serde_json::Value::Null;
        d["margin"] = (d["budget"].as_f64().unwrap() - 0.5).into();
    };
    let mut v = honest.clone();
    forge(&mut v);
    let o = report_exit(&v, tmp.path(), "flipped.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("claims table"), "{}", stderr(&o));
    // The claims row edited to agree: the cited ε is still no analysis of the claim.
    let claims = v["tables"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|t| t["id"] == "claims")
        .unwrap();
    let names: Vec<String> = claims["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    let col = |n: &str| names.iter().position(|c| c == n).unwrap();
    let row = claims["rows"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r[col("claim")] == claim.as_str())
        .unwrap();
    row[col("verdict")] = "holds".into();
    row[col("evidence ε")] = 0.5.into();
    row[col("accountant")] = "pld".into();
    row[col("kind")] = "upper_bound".into();
    let o = report_exit(&v, tmp.path(), "flipped-claims.json");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not one of the analyses"), "{}", stderr(&o));
}

/// A `mia` report on a DP checkpoint: its attack limits, each comparison's outcome and measured
/// text, and the attacks table's rows are derived again; an edit of any is refused.
#[test]
fn report_refuses_a_forged_mia_table() {
    let tmp = tempfile::tempdir().unwrap();
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        "models/digits-rapid.toml",
        "--attack",
        "loss",
        "--timesteps",
        "10",
        "--noise-draws",
        "1",
        "--bootstrap",
        "20",
        "--seed",
        "7",
        "-q",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let honest: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let o = report_exit(&honest, tmp.path(), "honest.json");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The cell of column `col` in row `row` of table `id`.
    fn cell<'a>(v: &'a mut serde_json::Value, id: &str, col: &str, row: usize) -> &'a mut serde_json::Value {
        let t = v["tables"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|t| t["id"] == id)
            .unwrap();
        let i = t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["name"] == col)
            .unwrap();
        &mut t["rows"][row][i]
    }
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "outcome",
            Box::new(|v| {
                *cell(v, "comparisons", "outcome", 0) =
                    "above the limit (one model, one split: not a bound; run an audit)".into()
            }),
            "outcome",
        ),
        (
            "limit",
            Box::new(|v| *cell(v, "attacks", "ASR limit", 0) = 0.99.into()),
            "ASR limit",
        ),
        (
            "measured",
            Box::new(|v| *cell(v, "attacks", "AUC", 0) = 0.99.into()),
            "measured",
        ),
        (
            "row-dropped",
            Box::new(|v| {
                let t = v["tables"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|t| t["id"] == "attacks")
                    .unwrap();
                t["rows"].as_array_mut().unwrap().clear();
            }),
            "attacks table",
        ),
    ];
    each_refused(&honest, tmp.path(), cases);
}

const MIA: &[&str] = &[
    "mia",
    "--checkpoint",
    "models/digits-mlp.toml",
    "--attack",
    "loss",
    "--timesteps",
    "10",
    "--noise-draws",
    "1",
    "--bootstrap",
    "20",
    "--seed",
    "7",
    "-q",
];

/// `merge` checks each part against the split and checkpoint: flipped member labels, record ids
/// that are not the split's rows, one part relabelled as the complete run, and foreign input
/// hashes are refused (exit 2); the honest parts merge.
#[test]
fn merge_checks_parts_against_the_split() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("parts");
    let parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let spec = format!("{i}/2");
            let mut a: Vec<&str> = MIA.to_vec();
            a.extend_from_slice(&["--shard", &spec, "--out", dir.to_str().unwrap()]);
            let o = dpaudit(&a);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            dir.join(format!("mia-part-{i}-of-2.json"))
        })
        .collect();
    let merge = |files: &[&Path]| {
        let mut a = vec!["merge".to_string()];
        a.extend(files.iter().map(|p| p.display().to_string()));
        a.push("-q".into());
        run_env(&a, &[])
    };
    let o = merge(&[&parts[0], &parts[1]]);
    assert!(matches!(o.status.code(), Some(0) | Some(1)), "{}", stderr(&o));
    let part0: serde_json::Value = serde_json::from_str(&read(&parts[0])).unwrap();
    let forged = |name: &str, f: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let mut v = part0.clone();
        f(&mut v);
        let p = tmp.path().join(name);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
        p
    };
    let flipped = forged("flipped.json", &|v| {
        let r = &mut v["records"][0];
        let m = r["member"].as_bool().unwrap();
        r["member"] = (!m).into();
    });
    let o = merge(&[&flipped, &parts[1]]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("labelled"), "{}", stderr(&o));
    let foreign = forged("foreign.json", &|v| v["records"][1]["record_id"] = "999999".into());
    let o = merge(&[&foreign, &parts[1]]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("999999"), "{}", stderr(&o));
    let complete = forged("complete.json", &|v| v["shard"]["count"] = 1.into());
    let o = merge(&[&complete]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("missing or relabelled"), "{}", stderr(&o));
    let other = forged("other-data.json", &|v| {
        v["inputs"]["split_sha256"] = "00".repeat(32).into()
    });
    let o = merge(&[&other, &parts[1]]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// A card and a ledger that disagree (the ledger of another run put beside the card, or the
/// weights swapped) are refused by `mia --checkpoint` (exit 2) instead of being attacked
/// against the wrong ε.
#[test]
fn cards_and_ledgers_carry_and_check_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let train = |stem: &Path, steps: &str| {
        let o = dpaudit(&[
            "train",
            "--dp",
            "--steps",
            steps,
            "--hidden",
            "8",
            "--depth",
            "1",
            "--time-dim",
            "8",
            "--device",
            "cpu",
            "-q",
            "--out",
            stem.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    };
    // Two folders so that no manifest covers the copy (the hashes alone must catch it).
    let a = tmp.path().join("a").join("m");
    let b = tmp.path().join("b").join("m");
    train(&a, "3");
    train(&b, "40");
    let card = read(&a.with_extension("toml"));
    assert!(card.contains("ledger_sha256 = "), "{card}");
    let ledger = read(&PathBuf::from(format!("{}.ledger.toml", a.display())));
    assert!(ledger.contains("# released: m.safetensors sha256 "), "{ledger}");
    // A copy of the card, ledger and weights elsewhere (no manifest) still reads.
    let c = tmp.path().join("c");
    std::fs::create_dir_all(&c).unwrap();
    for f in ["m.toml", "m.ledger.toml", "m.safetensors"] {
        std::fs::copy(a.parent().unwrap().join(f), c.join(f)).unwrap();
    }
    let mia = |card: &Path| {
        let mut v: Vec<String> = MIA.iter().map(|x| x.to_string()).collect();
        v[2] = card.display().to_string();
        run_env(&v, &[])
    };
    let o = mia(&c.join("m.toml"));
    assert!(matches!(o.status.code(), Some(0) | Some(1)), "{}", stderr(&o));
    // The 40-step ledger beside the 3-step card.
    std::fs::copy(b.parent().unwrap().join("m.ledger.toml"), c.join("m.ledger.toml")).unwrap();
    let o = mia(&c.join("m.toml"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("ledger_sha256"), "{}", stderr(&o));
    // The ledger names the weights it describes.
    std::fs::copy(a.parent().unwrap().join("m.ledger.toml"), c.join("m.ledger.toml")).unwrap();
    std::fs::copy(b.parent().unwrap().join("m.safetensors"), c.join("m.safetensors")).unwrap();
    let o = dpaudit(&["account", "--event", c.join("m.ledger.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("released"), "{}", stderr(&o));
    let o = mia(&c.join("m.toml"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // In one folder, the manifest refuses the mixed set too.
    std::fs::copy(
        b.parent().unwrap().join("m.ledger.toml"),
        a.parent().unwrap().join("m.ledger.toml"),
    )
    .unwrap();
    let o = mia(&a.with_extension("toml"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// Two `run --force` into one folder at once are serialised: the set left is one run's (the
/// ledger accounts exactly the rows of outputs.csv), and two `--save-event` of one new file at
/// once never both succeed.
#[test]
fn two_forced_runs_into_one_folder_leave_one_runs_set() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("o");
    let args = |seed: &str| {
        s(&[
            "run",
            "dpagg-ti",
            "fixtures/runs/dpagg-ti-digits.toml",
            "--seed",
            seed,
            "--out",
            dir.to_str().unwrap(),
            "--force",
            "-q",
        ])
    };
    let spawn = |a: Vec<String>| {
        Command::new(env!("CARGO_BIN_EXE_dpaudit"))
            .args(&a)
            .current_dir(root())
            .output()
            .unwrap()
    };
    for _ in 0..3 {
        let (x, y) = std::thread::scope(|sc| {
            let h1 = sc.spawn(|| spawn(args("123456789")));
            let h2 = sc.spawn(|| spawn(args("987654321")));
            (h1.join().unwrap(), h2.join().unwrap())
        });
        assert_eq!(x.status.code(), Some(0), "{}", stderr(&x));
        assert_eq!(y.status.code(), Some(0), "{}", stderr(&y));
        let files = ["ledger.toml", "run.json", "report.json", "report.md", "report.html"];
        let m = markers(&dir, &files, "123456789", "987654321");
        assert!(one_run(&m), "{m:?}");
        let o = dpaudit(&["account", "--event", dir.join("ledger.toml").to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let o = dpaudit(&["report", dir.join("report.json").to_str().unwrap(), "--format", "md"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(debris(&dir).is_empty(), "{:?}", debris(&dir));
    }
    let ev = tmp.path().join("e.toml");
    let save = || {
        spawn(s(&[
            "account",
            "--event",
            "fixtures/events/dpsgd.toml",
            "--save-event",
            ev.to_str().unwrap(),
        ]))
    };
    let (x, y) = std::thread::scope(|sc| {
        let h1 = sc.spawn(save);
        let h2 = sc.spawn(save);
        (h1.join().unwrap(), h2.join().unwrap())
    });
    let codes = [x.status.code(), y.status.code()];
    assert!(codes.contains(&Some(0)) && codes.contains(&Some(2)), "{codes:?}");
}

/// The weights' SHA-256 a card names, and whether the weights beside it have it.
fn card_matches_weights(dir: &Path) -> bool {
    use sha2::Digest as _;
    let card = read(&dir.join("dpaudit-card.toml"));
    let named = card
        .lines()
        .find_map(|l| l.strip_prefix("weights_sha256 = \""))
        .map(|r| r.trim_end_matches('"').to_string())
        .unwrap_or_default();
    let bytes = std::fs::read(dir.join("diffusion_pytorch_model.safetensors")).unwrap_or_default();
    let got: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    !named.is_empty() && named == got
}

/// Finding 11 of issue 48: a tool that is not dpaudit (reading the files at their final paths,
/// no manifest) never sees two runs mixed after a kill. A `train --unet` folder (with its
/// periodic `checkpoint/`) is replaced by one exchange of the folder: after a kill at any
/// commit step every file at the final paths, the checkpoint's included, comes from one run and
/// the earlier checkpoint stays whole until its successor is complete. In a folder the user
/// shares with other files, the set is committed file by file but old members move aside
/// first: a kill leaves files of one run (some possibly missing), and the user's file stays.
#[test]
fn other_tools_never_see_two_runs_at_the_final_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("unet");
    let train = |steps: &str, seed: &str, fault: Option<usize>| {
        let a = s(&[
            "train",
            "--unet",
            "tiny",
            "--dp",
            "--noise-multiplier",
            "1.0",
            "--sample-rate",
            "0.05",
            "--steps",
            steps,
            "--seed",
            seed,
            "--checkpoint-every",
            "2",
            "--force",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]);
        let env: Vec<(&str, String)> = fault.map(|f| (FAULT, f.to_string())).into_iter().collect();
        run_env(&a, &env)
    };
    let o = train("3", "5", None);
    assert!(
        card_matches_weights(&out.join("checkpoint")),
        "no checkpoint after step 2"
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let files = ["dpaudit-card.toml", "dpaudit-ledger.toml", "training.json"];
    let ck = out.join("checkpoint");
    let mut step = 1;
    let mut kills_before_the_swap = 0;
    loop {
        let o = train("4", "6", Some(step));
        if o.status.code() == Some(0) {
            break;
        }
        assert_eq!(o.status.code(), Some(FAULT_EXIT), "step {step}: {}", stderr(&o));
        let m = markers(&out, &files, "--steps 3 ", "--steps 4 ");
        assert!(one_run(&m), "step {step}: the final paths mix two runs {m:?}");
        assert!(card_matches_weights(&out), "step {step}: weights of another run");
        if m[0].1 == "A" {
            kills_before_the_swap += 1;
        }
        // The checkpoint is always a whole folder of one run, never lost by a later kill.
        assert!(card_matches_weights(&ck), "step {step}: torn checkpoint");
        let cm = markers(&ck, &files, "--steps 3 ", "--steps 4 ");
        assert!(one_run(&cm), "step {step}: checkpoint {cm:?}");
        step += 1;
        assert!(step < 10, "the run never completed");
    }
    assert!(kills_before_the_swap >= 1, "no kill landed before the final swap");
    let m = markers(&out, &files, "--steps 3 ", "--steps 4 ");
    assert!(m.iter().all(|(_, x)| *x == "B"), "{m:?}");
    assert!(card_matches_weights(&out) && card_matches_weights(&ck));
    assert!(debris(&out).is_empty(), "{:?}", debris(&out));

    // A folder shared with the user's own file: file by file, old members aside first.
    let shared = tmp.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("notes.txt"), "mine").unwrap();
    let run_args = |seed: &str| {
        s(&[
            "run",
            "dpagg-ti",
            "fixtures/runs/dpagg-ti-digits.toml",
            "--seed",
            seed,
            "--out",
            shared.to_str().unwrap(),
            "--force",
            "-q",
        ])
    };
    let files = ["ledger.toml", "run.json", "report.json", "report.md", "report.html"];
    let o = run_env(&run_args("123456789"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut step = 1;
    let mut partial = 0;
    loop {
        let o = run_env(&run_args("987654321"), &[(FAULT, step.to_string())]);
        if o.status.code() == Some(0) {
            break;
        }
        assert_eq!(o.status.code(), Some(FAULT_EXIT), "step {step}: {}", stderr(&o));
        let m = markers(&shared, &files, "123456789", "987654321");
        let a = m.iter().any(|(_, x)| *x == "A");
        let b = m.iter().any(|(_, x)| *x == "B");
        assert!(!(a && b) && m.iter().all(|(_, x)| *x != "both"), "step {step}: {m:?}");
        if m.iter().any(|(_, x)| *x == "missing") {
            partial += 1;
        }
        assert_eq!(read(&shared.join("notes.txt")), "mine");
        step += 1;
        assert!(step < 40, "the commit never completed");
    }
    assert!(partial >= 3, "the kills never landed between renames ({partial})");
    assert_eq!(read(&shared.join("notes.txt")), "mine");
    let m = markers(&shared, &files, "123456789", "987654321");
    assert!(m.iter().all(|(_, x)| *x == "B"), "{m:?}");
}
