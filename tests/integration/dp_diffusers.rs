//! DP-SGD training of diffusers UNets (`train --unet`) and guarantees for diffusers checkpoints
//! (`mia` with the folder's own ledger, `--ledger FILE`, or Opacus-style flags), through the
//! real binary.

use std::path::Path;
use std::process::Output;
use std::time::Instant;

use dpaudit::events::{DpEvent, EventFile};

use super::common::{dpaudit, mnist_mia, stderr, stdout};

const MNIST: &str = "fixtures/data/mnist/mnist-10k.u8.gz";
const MNIST_SPLIT: &str = "fixtures/splits/mnist.toml";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn mia_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("mia.json")).unwrap()).unwrap()
}

/// `mia` with the loss attack at t = 50 on 16 members and 16 non-members, into `out`.
fn quick_mia(checkpoint: &str, out: &Path, extra: &[&str]) -> Output {
    let mut a = vec![
        "mia",
        "--checkpoint",
        checkpoint,
        "--data",
        MNIST,
        "--split",
        MNIST_SPLIT,
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "16",
        "--bootstrap",
        "50",
        "--out",
        s(out),
        "--quiet",
    ];
    a.extend_from_slice(extra);
    dpaudit(&a)
}

/// CPU seconds (user + system) of this process's finished children (`/proc/self/stat` fields 16
/// and 17, in 1/100 s). Children of tests running in parallel count too: an over-estimate.
fn children_cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split_whitespace().collect();
    (f[13].parse::<f64>().unwrap() + f[14].parse::<f64>().unwrap()) / 100.0
}

/// Every attack is compared with a finite limit from `source`, and nothing is a violation.
fn assert_finite_limits(v: &serde_json::Value, source: &str) {
    let basis = &v["checkpoint_basis"];
    assert!(
        basis["source"].as_str().unwrap().contains(source),
        "{}",
        basis["source"]
    );
    let gs = basis["guarantees"].as_array().unwrap();
    assert!(!gs.is_empty(), "no sound guarantee: {basis}");
    for g in gs {
        let e = g["epsilon"].as_f64().unwrap();
        assert!(e.is_finite() && e > 0.0, "{g}");
    }
    let cs = v["comparisons"].as_array().unwrap();
    assert!(!cs.is_empty());
    for c in cs {
        let lim = c["limit"].as_f64().unwrap_or(f64::NAN);
        assert!(lim.is_finite() && lim > 0.5 && lim <= 1.0, "{c}");
        assert_eq!(c["violation"], false, "{c}");
    }
    for r in v["results"].as_array().unwrap() {
        let asr = r["limits"]["asr"].as_f64().unwrap();
        assert!(asr.is_finite() && asr <= 1.0, "{r}");
    }
}

/// A tiny DP UNet trains through the binary in under a minute into a folder the diffusers
/// loader reads; its ledger is the event that ran; `mia` on it compares every attack with that
/// ledger's finite limit and reports no violation; `--init` resumes from it, composing the
/// ledgers; stating another mechanism for a folder with its own ledger is refused.
#[test]
fn a_tiny_dp_unet_trains_in_under_a_minute_and_mia_uses_its_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("dp-tiny");
    let (start, cpu0) = (Instant::now(), children_cpu_s());
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--dp",
        "--noise-multiplier",
        "1.0",
        "--clip",
        "1",
        "--sample-rate",
        "0.1",
        "--steps",
        "6",
        "--batch-size",
        "16",
        "--lr",
        "2e-3",
        "--seed",
        "3",
        "--out",
        s(&out),
        "--quiet",
    ]);
    let (secs, cpu) = (start.elapsed().as_secs_f64(), children_cpu_s() - cpu0);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    eprintln!("tiny DP UNet: 6 DP-SGD steps in {cpu:.1} CPU s ({secs:.1} s wall)");
    // CPU time: wall time depends on whatever else the machine runs.
    assert!(cpu < 60.0, "training took {cpu:.1} CPU s");
    for f in [
        "config.json",
        "diffusion_pytorch_model.safetensors",
        "scheduler_config.json",
        "dpaudit-card.toml",
        "dpaudit-ledger.toml",
        "training.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let ledger = EventFile::load(&out.join("dpaudit-ledger.toml")).unwrap();
    assert_eq!(ledger.event, DpEvent::dpsgd(1.0, 0.1, 6));
    assert_eq!(ledger.delta, Some(1e-5));
    assert!(stdout(&o).contains("ε spent:"), "{}", stdout(&o));
    let card = std::fs::read_to_string(out.join("dpaudit-card.toml")).unwrap();
    // On the CPU the hand-written per-sample pass runs (the tiny preset is covered); the card
    // records it, and --quiet keeps the executor line off stderr.
    assert!(card.contains("per_sample = \"hand-written\""), "{card}");
    assert!(!stderr(&o).contains("per-sample gradients:"), "{}", stderr(&o));
    assert!(card.contains("epsilon = "), "{card}");
    let info = dpaudit(&["model", "info", s(&out)]);
    assert_eq!(info.status.code(), Some(0), "{}", stderr(&info));
    assert!(stdout(&info).contains("DDPMScheduler"), "{}", stdout(&info));

    let m = tmp.path().join("mia");
    let o = quick_mia(s(&out), &m, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = mia_json(&m);
    assert_finite_limits(&v, "dpaudit-ledger.toml");
    assert_eq!(v["target"]["dp"]["noise_multiplier"], 1.0);
    let text = std::fs::read_to_string(m.join("report.md")).unwrap_or_default();
    assert!(!text.contains("no theoretical limit applies"), "{text}");

    // Its own ledger states the mechanism: another statement is refused.
    let o = quick_mia(
        s(&out),
        &tmp.path().join("m2"),
        &["--ledger", "fixtures/events/dpsgd.toml"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("own ledger"), "{}", stderr(&o));

    // Resume: the new ledger is the init's, then this run's.
    let out2 = tmp.path().join("dp-tiny-2");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--init",
        s(&out),
        "--dp",
        "--noise-multiplier",
        "2.0",
        "--sample-rate",
        "0.05",
        "--steps",
        "3",
        "--seed",
        "4",
        "--out",
        s(&out2),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("composed with the --init ledger"), "{}", stdout(&o));
    let ledger2 = EventFile::load(&out2.join("dpaudit-ledger.toml")).unwrap();
    assert_eq!(
        ledger2.event,
        DpEvent::Composed {
            events: vec![DpEvent::dpsgd(1.0, 0.1, 6), DpEvent::dpsgd(2.0, 0.05, 3)]
        }
    );
}

/// `mia --ledger FILE` on the shipped (non-dpaudit) MNIST DDPM compares every attack with that
/// ledger's finite limit and reports no violation (a single model's ASR is never a violation).
#[test]
fn mia_ledger_on_the_mnist_ddpm_states_the_mechanism() {
    let tmp = tempfile::tempdir().unwrap();
    let o = quick_mia(
        "models/mnist-ddpm",
        tmp.path(),
        &["--ledger", "fixtures/events/dpsgd.toml"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = mia_json(tmp.path());
    assert_finite_limits(&v, "stated ledger fixtures/events/dpsgd.toml");
    let ev: DpEvent = serde_json::from_value(v["checkpoint_basis"]["event"].clone()).unwrap();
    assert_eq!(ev, DpEvent::dpsgd(1.1, 0.004, 14062));
    // The backend the plan ran is recorded beside the device: on the CPU, the CPU forward.
    if v["device"].as_str().is_some_and(|d| d.starts_with("cpu")) {
        assert_eq!(v["backend"].as_str(), Some("CPU forward"), "{v}");
        assert!(stdout(&o).contains("backend: CPU forward"), "{}", stdout(&o));
    } else {
        assert!(v["backend"].is_string(), "{v}");
    }
}

/// `train` records the backend it ran in its report: the device and the gradient path (the
/// hand-written CPU pass for the tiny preset on the CPU), for the diffusers UNet and for the
/// 8×8 models alike.
#[test]
fn train_reports_record_the_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let facts = |args: &[&str]| -> Vec<(String, String)> {
        let o = dpaudit(args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["summary"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["name"].as_str().unwrap().to_string(),
                    f["value"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let unet = tmp.path().join("unet");
    let f = facts(&[
        "train",
        "--unet",
        "tiny",
        "--steps",
        "2",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--out",
        s(&unet),
        "--quiet",
        "--format",
        "json",
    ]);
    assert!(f.iter().any(|(n, v)| n == "device" && v.starts_with("cpu")), "{f:?}");
    assert!(f.contains(&("backend".into(), "hand-written CPU pass".into())), "{f:?}");
    let toy = tmp.path().join("toy");
    let f = facts(&[
        "train",
        "--dp",
        "--steps",
        "3",
        "--seed",
        "1",
        "--device",
        "cpu",
        "--out",
        s(&toy),
        "--quiet",
        "--format",
        "json",
    ]);
    assert!(
        f.contains(&("backend".into(), "candle, ghost clipping (CPU)".into())),
        "{f:?}"
    );
}

/// Opacus-style flags: q = B/N and ⌈N/B⌉ steps per epoch, as Opacus' Poisson loader runs them.
#[test]
fn mia_opacus_flags_state_the_dpsgd_event() {
    let tmp = tempfile::tempdir().unwrap();
    let o = quick_mia(
        "models/mnist-ddpm",
        tmp.path(),
        &[
            "--noise-multiplier",
            "1.1",
            "--train-batch-size",
            "32",
            "--dataset-size",
            "128",
            "--epochs",
            "2",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = mia_json(tmp.path());
    assert_finite_limits(&v, "stated DP-SGD mechanism");
    let ev: DpEvent = serde_json::from_value(v["checkpoint_basis"]["event"].clone()).unwrap();
    assert_eq!(ev, DpEvent::dpsgd(1.1, 0.25, 8));
}

/// Incomplete or misplaced statements are usage errors naming the flag.
#[test]
fn mechanism_flags_errors_name_the_flag() {
    let o = mnist_mia(&[
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.1",
        "--train-batch-size",
        "4",
        "--dataset-size",
        "9",
        "--steps",
        "3",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--sample-rate"), "{}", stderr(&o));
    let o = mnist_mia(&["--noise-multiplier", "1", "--sample-rate", "0.1", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--steps"), "{}", stderr(&o));
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        "models/digits-mlp.toml",
        "--ledger",
        "fixtures/events/dpsgd.toml",
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--ledger"), "{}", stderr(&o));
}

/// `train --unet`: a non-DP run writes no ledger and `mia` finds no guarantee; an unknown preset,
/// and a DP run from a folder without a ledger, are usage errors naming the flag.
#[test]
fn train_unet_non_dp_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("plain");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--out",
        s(&out),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!out.join("dpaudit-ledger.toml").exists());
    // Four steps (fewer than the EMA's update interval) still release trained weights.
    let card: toml::Value = toml::from_str(&std::fs::read_to_string(out.join("dpaudit-card.toml")).unwrap()).unwrap();
    let (b, a) = (
        card["training"]["eval_loss_before"].as_float().unwrap(),
        card["training"]["eval_loss_after"].as_float().unwrap(),
    );
    assert_ne!(b, a, "the released weights are the initial ones");
    assert!(out.join("diffusion_pytorch_model.safetensors").is_file());
    let m = tmp.path().join("mia");
    let o = quick_mia(s(&out), &m, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(mia_json(&m).get("checkpoint_basis").is_none());
    // The same output again is refused before any work.
    let o = dpaudit(&["train", "--unet", "tiny", "--steps", "4", "--out", s(&out), "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    let o = dpaudit(&[
        "train",
        "--unet",
        "no-such-preset",
        "--out",
        s(&tmp.path().join("x")),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--unet"), "{}", stderr(&o));
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--init",
        "models/mnist-ddpm",
        "--dp",
        "--steps",
        "2",
        "--out",
        s(&tmp.path().join("y")),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--init"), "{}", stderr(&o));
}

/// A tiny DP UNet trained with `canaries` canaries into `out` (seeded: a test fixture).
fn train_tiny_canaries(out: &Path, canaries: &str) {
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--dp",
        "--noise-multiplier",
        "1.0",
        "--clip",
        "1",
        "--sample-rate",
        "0.25",
        "--steps",
        "4",
        "--batch-size",
        "32",
        "--lr",
        "2e-3",
        "--canaries",
        canaries,
        "--seed",
        "5",
        "--out",
        s(out),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `train --unet … --canaries m` writes the canaries (and the card names them by hash); the
/// one-run audit on that folder gives an ε lower bound no larger than the ledger's accounted ε
/// (exit 0, no violation), and `--scores-out` holds every split and canary record.
#[test]
fn one_run_audit_on_a_tiny_canary_unet_stays_below_the_accounted_epsilon() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("canary-tiny");
    train_tiny_canaries(&out, "40");
    let csv = std::fs::read_to_string(out.join("canaries.csv")).unwrap();
    assert_eq!(csv.lines().count(), 41, "header + 40 canaries");
    let card: toml::Value = toml::from_str(&std::fs::read_to_string(out.join("dpaudit-card.toml")).unwrap()).unwrap();
    assert_eq!(card["canaries"]["count"].as_integer(), Some(40));
    let m = tmp.path().join("mia");
    let scores = tmp.path().join("scores.csv");
    let o = quick_mia(s(&out), &m, &["--audit", "one-run", "--scores-out", s(&scores)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = mia_json(&m);
    let lower = v["one_run"]["epsilon_lower"].as_f64().unwrap();
    let accounted = v["checkpoint_basis"]["guarantees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["epsilon"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(accounted.is_finite() && accounted > 0.0, "{}", v["checkpoint_basis"]);
    assert!(
        lower >= 0.0 && lower <= accounted,
        "one-run lower bound {lower} > accounted ε {accounted}"
    );
    let audit = v["comparisons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["what"].as_str().unwrap().starts_with("one-run"))
        .unwrap_or_else(|| panic!("no one-run comparison: {}", v["comparisons"]));
    assert_eq!(audit["violation"], false, "{audit}");
    // Every record: 16 members + 16 non-members and the 40 canaries, loss at t = 50.
    let rows = std::fs::read_to_string(&scores).unwrap();
    let body: Vec<&str> = rows.lines().skip(1).collect();
    assert_eq!(body.len(), 32 + 40, "{rows}");
    assert_eq!(body.iter().filter(|l| l.ends_with(",canary")).count(), 40, "{rows}");
    // Read back with the folder, the scores give the same audit; with a canary's inclusion bit
    // changed they are refused: the folder's card names the canaries they must be.
    let again = tmp.path().join("again");
    let from_scores = |f: &Path, dest: &Path| {
        dpaudit(&[
            "mia",
            "--scores",
            s(f),
            "--checkpoint",
            s(&out),
            "--audit",
            "one-run",
            "--bootstrap",
            "20",
            "--out",
            s(dest),
            "--quiet",
        ])
    };
    let o = from_scores(&scores, &again);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        mia_json(&again)["one_run"]["epsilon_lower"],
        v["one_run"]["epsilon_lower"]
    );
    let first = body.iter().position(|l| l.ends_with(",canary")).unwrap();
    let flipped: String = std::iter::once(rows.lines().next().unwrap())
        .chain(body.iter().copied())
        .enumerate()
        .map(|(i, l)| {
            if i == first + 1 {
                let v: Vec<&str> = l.splitn(3, ',').collect();
                format!("{},{},{}\n", v[0], if v[1] == "1" { "0" } else { "1" }, v[2])
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let bad = tmp.path().join("flipped.csv");
    std::fs::write(&bad, flipped).unwrap();
    let o = from_scores(&bad, &tmp.path().join("bad"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{}:{}: field `record_id`: canary", bad.display(), first + 2))
            && stderr(&o).contains("dpaudit-card.toml has it"),
        "{}",
        stderr(&o)
    );
    // A folder without canaries is refused for the one-run audit, naming what to do.
    let o = quick_mia("models/mnist-ddpm", &tmp.path().join("m2"), &["--audit", "one-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--canaries"), "{}", stderr(&o));
}

/// `mia --shard i/3` on a diffusers folder (with canaries and its ledger) and `merge` give the
/// report and scores of one unsharded run: the same score file byte for byte, the same results,
/// audit and comparisons. A part from another folder is refused.
#[test]
fn shard_and_merge_of_a_diffusers_folder_equal_the_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("canary-tiny");
    train_tiny_canaries(&out, "12");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "mia",
            "--checkpoint",
            s(&out),
            "--data",
            MNIST,
            "--split",
            MNIST_SPLIT,
            "--attack",
            "loss,pia",
            "--timesteps",
            "20,100",
            "--max-examples",
            "10",
            "--bootstrap",
            "50",
            "--audit",
            "one-run",
            "--quiet",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let run = |a: Vec<String>| {
        let r: Vec<&str> = a.iter().map(String::as_str).collect();
        dpaudit(&r)
    };
    let one = tmp.path().join("one");
    let one_scores = tmp.path().join("one.csv");
    let o = run(args(&[
        "--out",
        s(&one),
        "--scores-out",
        s(&one_scores),
        "--batch-size",
        "7",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let parts = tmp.path().join("parts");
    for i in 0..3 {
        let spec = format!("{i}/3");
        // Each shard with its own batch size: a row's score does not depend on its batch.
        let b = ["5", "16", "3"][i];
        let o = run(args(&["--shard", &spec, "--out", s(&parts), "--batch-size", b]));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let merged = tmp.path().join("merged");
    let merged_scores = tmp.path().join("merged.csv");
    let p: Vec<String> = (0..3)
        .map(|i| parts.join(format!("mia-part-{i}-of-3.json")).display().to_string())
        .collect();
    let o = dpaudit(&[
        "merge",
        &p[0],
        &p[1],
        &p[2],
        "--out",
        s(&merged),
        "--scores-out",
        s(&merged_scores),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&one_scores).unwrap(),
        std::fs::read_to_string(&merged_scores).unwrap()
    );
    let (a, b) = (mia_json(&one), mia_json(&merged));
    for key in ["results", "one_run", "comparisons", "checkpoint_basis", "target"] {
        assert_eq!(a[key], b[key], "{key} differs");
    }
    assert!(a["one_run"]["epsilon_lower"].is_number());
    // Two parts with the third missing are refused; so is a part of another folder.
    let o = dpaudit(&["merge", &p[0], &p[1], "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("missing shard"), "{}", stderr(&o));
    let other = tmp.path().join("other");
    train_tiny_canaries(&other, "10");
    let o = dpaudit(&["merge", &p[0], &p[1], &p[2], "--checkpoint", s(&other), "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("SHA-256"), "{}", stderr(&o));
}

/// `--checkpoint-every N` leaves, after every N steps, the folder the run would have written had
/// it been asked for that many steps: the same weights as a run of that length with the same
/// seed, a ledger of exactly the steps that ran, and a folder `--init` resumes from.
#[test]
fn periodic_checkpoints_are_the_folder_of_a_shorter_run_and_resume_with_their_ledger() {
    let tmp = tempfile::tempdir().unwrap();
    let train = |out: &Path, steps: &str, extra: &[&str]| {
        let mut args = vec![
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
            "5",
            "--out",
            s(out),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        o
    };
    let long = tmp.path().join("long");
    train(&long, "5", &["--checkpoint-every", "3"]);
    let ck = long.join("checkpoint");
    let short = tmp.path().join("short");
    train(&short, "3", &[]);
    let weights = |d: &Path| std::fs::read(d.join("diffusion_pytorch_model.safetensors")).unwrap();
    assert_eq!(
        weights(&ck),
        weights(&short),
        "the checkpoint after 3 steps differs from a 3-step run"
    );
    assert_ne!(weights(&ck), weights(&long));
    let ledger = |d: &Path| EventFile::load(&d.join("dpaudit-ledger.toml")).unwrap().event;
    assert_eq!(ledger(&ck), DpEvent::dpsgd(1.0, 0.05, 3));
    assert_eq!(ledger(&long), DpEvent::dpsgd(1.0, 0.05, 5));
    let card = std::fs::read_to_string(ck.join("dpaudit-card.toml")).unwrap();
    assert!(card.contains("steps = 3"), "{card}");
    // The checkpoint is a folder mia and --init take.
    let resumed = tmp.path().join("resumed");
    let o = train(&resumed, "2", &["--init", s(&ck)]);
    assert!(stdout(&o).contains("composed with the --init ledger"), "{}", stdout(&o));
    assert_eq!(
        ledger(&resumed),
        DpEvent::Composed {
            events: vec![DpEvent::dpsgd(1.0, 0.05, 3), DpEvent::dpsgd(1.0, 0.05, 2)]
        }
    );
    // A second run into the same folder is refused before any work unless --force.
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--steps",
        "2",
        "--checkpoint-every",
        "1",
        "--out",
        s(&long),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = dpaudit(&[
        "train",
        "--steps",
        "2",
        "--checkpoint-every",
        "1",
        "--out",
        s(&tmp.path().join("mlp")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--checkpoint-every"), "{}", stderr(&o));
}

/// Public pretraining, then DP fine-tuning: a DP run may start from a folder dpaudit trained from
/// scratch on the split's public rows (no ledger to compose: its ledger is this run's alone);
/// a ledger-less folder trained on anything else is refused.
#[test]
fn dp_fine_tuning_starts_from_a_public_only_folder_and_refuses_others() {
    let tmp = tempfile::tempdir().unwrap();
    let public = tmp.path().join("public");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--on",
        "public",
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--out",
        s(&public),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let dp = |init: &Path, out: &Path| {
        dpaudit(&[
            "train",
            "--unet",
            "tiny",
            "--init",
            s(init),
            "--dp",
            "--noise-multiplier",
            "1.0",
            "--sample-rate",
            "0.05",
            "--steps",
            "2",
            "--seed",
            "2",
            "--out",
            s(out),
            "--quiet",
        ])
    };
    let ft = tmp.path().join("ft");
    let o = dp(&public, &ft);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("public rows only"), "{}", stderr(&o));
    let ledger = EventFile::load(&ft.join("dpaudit-ledger.toml")).unwrap();
    assert_eq!(ledger.event, DpEvent::dpsgd(1.0, 0.05, 2));
    let text = std::fs::read_to_string(ft.join("dpaudit-ledger.toml")).unwrap();
    assert!(text.contains("public rows only"), "{text}");
    // Trained on the members without a ledger: refused.
    let members = tmp.path().join("members");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--out",
        s(&members),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = dp(&members, &tmp.path().join("ft2"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--init"), "{}", stderr(&o));
    // The public folder's card no longer matches once its weights come from elsewhere (--init).
    let chained = tmp.path().join("chained");
    let o = dpaudit(&[
        "train",
        "--unet",
        "tiny",
        "--init",
        s(&members),
        "--on",
        "public",
        "--steps",
        "1",
        "--batch-size",
        "8",
        "--seed",
        "1",
        "--out",
        s(&chained),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = dp(&chained, &tmp.path().join("ft3"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A public folder whose weights were swapped for members-trained ones: its card no longer
    // speaks for them, and the folder is refused.
    let swapped = tmp.path().join("swapped");
    std::fs::create_dir_all(&swapped).unwrap();
    for f in [
        "config.json",
        "scheduler_config.json",
        "dpaudit-card.toml",
        "training.json",
    ] {
        std::fs::copy(public.join(f), swapped.join(f)).unwrap();
    }
    let w = "diffusion_pytorch_model.safetensors";
    std::fs::copy(members.join(w), swapped.join(w)).unwrap();
    let o = dp(&swapped, &tmp.path().join("ft4"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// The shipped demonstration (docs/attacks.md): models/mnist-dp-ddpm carries the ledger of its
/// DP fine-tuning (100 steps of q = 0.25, σ = 1.72: PLD ε ≈ 7.95 at δ = 1e-5), its canaries and
/// its public-only init; `mia` on it compares with that ledger's finite limits; the twin and
/// the public folder have no ledger, and the public folder is one `--dp --init` accepts.
#[test]
fn the_shipped_dp_mnist_model_carries_its_ledger_canaries_and_public_init() {
    let dp = Path::new("models/mnist-dp-ddpm");
    let ledger = EventFile::load(&dp.join("dpaudit-ledger.toml")).unwrap();
    assert_eq!(ledger.event, DpEvent::dpsgd(1.72, 0.25, 100));
    let o = dpaudit(&[
        "account",
        "--event",
        "models/mnist-dp-ddpm/dpaudit-ledger.toml",
        "--delta",
        "1e-5",
        "--accountant",
        "pld",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let eps = v.to_string();
    assert!(eps.contains("7.94"), "{eps}");
    let card = std::fs::read_to_string(dp.join("dpaudit-card.toml")).unwrap();
    assert!(card.contains("count = 1000"), "{card}");
    assert!(card.contains("init = \"../mnist-public-ddpm\""), "{card}");
    assert!(Path::new("models/mnist-public-ddpm/config.json").is_file());
    assert!(!Path::new("models/mnist-nodp-ddpm/dpaudit-ledger.toml").exists());
    assert!(!Path::new("models/mnist-public-ddpm/dpaudit-ledger.toml").exists());
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("mia");
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        "models/mnist-dp-ddpm",
        "--data",
        MNIST,
        "--split",
        "fixtures/splits/mnist-dp.toml",
        "--attack",
        "loss",
        "--timesteps",
        "50",
        "--max-examples",
        "16",
        "--bootstrap",
        "50",
        "--out",
        s(&m),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_finite_limits(&mia_json(&m), "dpaudit-ledger.toml");
}

/// `mia --ledger` of another folder's ledger: the ledger names its release by SHA-256, and these
/// weights are not it (the shipped DP folder's ledger given for the non-DP MNIST DDPM), so it is
/// refused naming the flag, the ledger file and both hashes; before, the non-DP model was called
/// differentially private (exit 0).
#[test]
fn mia_ledger_of_other_weights_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let o = quick_mia(
        "models/mnist-ddpm",
        tmp.path(),
        &["--ledger", "models/mnist-dp-ddpm/dpaudit-ledger.toml"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("--ledger"), "{e}");
    assert!(e.contains("models/mnist-dp-ddpm/dpaudit-ledger.toml"), "{e}");
    assert!(e.contains("other weights"), "{e}");
    assert!(!tmp.path().join("mia.json").exists());
    // A ledger that names no release is the trainer's word, and the report says so.
    let o = quick_mia(
        "models/mnist-ddpm",
        &tmp.path().join("stated"),
        &["--ledger", "fixtures/events/dpsgd.toml"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = mia_json(&tmp.path().join("stated"));
    let src = v["checkpoint_basis"]["source"].as_str().unwrap();
    assert!(src.contains("the trainer's word"), "{src}");
}

/// The two part files of a sharded `mia` run on the shipped DP folder, in `dir`.
fn dp_parts(dir: &Path) -> Vec<std::path::PathBuf> {
    (0..2)
        .map(|i| {
            let spec = format!("{i}/2");
            let o = dpaudit(&[
                "mia",
                "--checkpoint",
                "models/mnist-dp-ddpm",
                "--data",
                MNIST,
                "--split",
                "fixtures/splits/mnist-dp.toml",
                "--attack",
                "loss",
                "--timesteps",
                "50",
                "--max-examples",
                "8",
                "--bootstrap",
                "20",
                "--shard",
                &spec,
                "--out",
                s(dir),
                "--quiet",
            ]);
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            dir.join(format!("mia-part-{i}-of-2.json"))
        })
        .collect()
}

/// `merge` derives every guarantee again: parts whose stated ε was scaled by 0.1 (both, so they
/// still agree with each other) merge to the ledger's ε and limits, not the parts'; parts whose
/// event was edited (σ × 10 in both) are refused naming the part and field. Before, the scaled
/// parts gave a report with ε/10 and a lower ASR limit, exit 0.
#[test]
fn merge_derives_guarantees_from_the_ledger_not_the_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let parts = dp_parts(&tmp.path().join("parts"));
    let merge = |ps: &[std::path::PathBuf], out: &Path| {
        let mut a = vec!["merge".to_string()];
        a.extend(ps.iter().map(|p| p.display().to_string()));
        a.extend(["--out".to_string(), s(out).to_string(), "--quiet".to_string()]);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        dpaudit(&a)
    };
    let o = merge(&parts, &tmp.path().join("true"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let truth = mia_json(&tmp.path().join("true"));
    let edited = |name: &str, f: &dyn Fn(&mut serde_json::Value)| -> Vec<std::path::PathBuf> {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        parts
            .iter()
            .map(|p| {
                let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
                f(&mut v);
                let q = d.join(p.file_name().unwrap());
                std::fs::write(&q, serde_json::to_string(&v).unwrap()).unwrap();
                q
            })
            .collect()
    };
    let scaled = edited("scaled", &|v| {
        for g in v["plan"]["diffusers"]["basis"]["guarantees"].as_array_mut().unwrap() {
            let e = g["epsilon"].as_f64().unwrap();
            g["epsilon"] = serde_json::json!(e * 0.1);
        }
    });
    let o = merge(&scaled, &tmp.path().join("scaled-out"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got = mia_json(&tmp.path().join("scaled-out"));
    assert_eq!(
        got["checkpoint_basis"]["guarantees"],
        truth["checkpoint_basis"]["guarantees"]
    );
    assert_eq!(got["comparisons"], truth["comparisons"]);
    let sigma = edited("sigma", &|v| {
        let g = &mut v["plan"]["diffusers"]["basis"]["event"]["event"]["event"]["noise_multiplier"];
        let x = g.as_f64().unwrap();
        *g = serde_json::json!(x * 10.0);
    });
    let o = merge(&sigma, &tmp.path().join("sigma-out"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("plan.diffusers.basis.event") && e.contains("mia-part-0-of-2.json"),
        "{e}"
    );
    assert!(!tmp.path().join("sigma-out").join("mia.json").exists());
}

/// No shipped folder's record names a scratch folder it was trained in (`dpaudit model
/// relocate` rewrote them): cards, ledgers and training records name the folders under models/.
#[test]
fn shipped_models_record_where_they_are_now() {
    let mut bad = Vec::new();
    for entry in std::fs::read_dir("models").unwrap() {
        let dir = entry.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for name in ["dpaudit-card.toml", "dpaudit-ledger.toml", "training.json"] {
            let Ok(text) = std::fs::read_to_string(dir.join(name)) else {
                continue;
            };
            for stale in ["/tmp/", "models-next", "/work/"] {
                if text.contains(stale) {
                    bad.push(format!("{}/{name} names {stale}", dir.display()));
                }
            }
        }
        if dir.join("dpaudit-card.toml").is_file() {
            let card = std::fs::read_to_string(dir.join("dpaudit-card.toml")).unwrap();
            assert!(card.contains(&format!("--out {}", dir.display())), "{card}");
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
