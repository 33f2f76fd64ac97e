//! Integration tests: inputs the way users state them, through the real binary: Opacus-style
//! DP-SGD flags against fixtures/reference/dpsgd.csv, `account --save-event` → `check`,
//! multi-file `check` with JUnit, sampler names and defaulted-field warnings, sweeps over every
//! axis, and `calibrate --sampler`.

use super::common::{dpaudit, read_csv, rel, root, stderr, stdout};
use std::path::PathBuf;

fn f(r: &std::collections::HashMap<String, String>, k: &str) -> f64 {
    r[k].parse().unwrap_or_else(|_| panic!("{k} = {}", r[k]))
}

fn json(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stderr(o)))
}

/// A fresh scratch directory under the system temp dir.
/// A summary fact of a report (`--format json` is the shared report, schema_version 2).
fn fact(v: &serde_json::Value, name: &str) -> String {
    v["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no fact `{name}` in {v}"))["value"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The smallest sound ε among a report's results.
fn sound_eps(v: &serde_json::Value) -> f64 {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "exact" || r["kind"] == "upper_bound")
        .map(|r| r["epsilon"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min)
}

/// Runs `args` with `--out` into a scratch folder and reads the command's detailed record.
fn detail(args: &[&str], file: &str) -> (std::process::Output, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut a = args.to_vec();
    let d = dir.path().to_str().unwrap().to_string();
    a.extend(["--out", &d, "-q"]);
    let o = dpaudit(&a);
    let v = std::fs::read_to_string(dir.path().join(file))
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(serde_json::Value::Null);
    (o, v)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dpaudit-inputs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn opacus_flags_reproduce_the_mnist_and_cifar10_rows() {
    // fixtures/reference/dpsgd.csv (RAPID setting, batch 64, δ = 1e-5): steps_T = int(epochs / q)
    // with q = 64/N, as Opacus' get_noise_multiplier counts; ε by dp_accounting 0.6.0 (PLD,
    // RDP), Opacus 1.6.0 (RDP) and prv_accountant 0.2.0 (lower bound on the true ε).
    let rows = read_csv("fixtures/reference/dpsgd.csv");
    let mut seen = [0usize; 2];
    for r in &rows {
        let n = f(r, "N") as u64;
        let i = match n {
            60_000 => 0,
            50_000 => 1,
            _ => continue,
        };
        seen[i] += 1;
        let (epochs, batch, sigma) = (
            r["epochs"].as_str(),
            r["batch"].as_str(),
            r["noise_multiplier"].as_str(),
        );
        let o = dpaudit(&[
            "account",
            "--noise-multiplier",
            sigma,
            "--epochs",
            epochs,
            "--batch-size",
            batch,
            "--dataset-size",
            &n.to_string(),
            "--delta",
            &r["delta"],
            "--accountant",
            "pld,rdp",
            "--format",
            "json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v = json(&o);
        let what = format!("N={n} E={epochs} σ={sigma}");
        assert_eq!(
            fact(&v, "steps").parse::<u64>().ok(),
            Some(f(r, "steps_T") as u64),
            "{what}"
        );
        assert_eq!(fact(&v, "sample rate q").parse::<f64>().ok(), Some(f(r, "q")), "{what}");
        let eps = |a: &str| {
            v["results"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["accountant"] == a)
                .unwrap_or_else(|| panic!("{what}: no {a} result"))["epsilon"]
                .as_f64()
                .unwrap()
        };
        let (pld, rdp) = (eps("pld"), eps("rdp"));
        let low = f(r, "eps_prv_low");
        // Within 1 % of dp_accounting's grid-1e-4 value, or below it where the grid was refined
        // for a small ε (docs/pld.md, "Tiny ε"); never below PRV's lower bound.
        let dpacc = f(r, "eps_dpacc_pld");
        assert!(
            pld >= low && pld <= 1.01 * dpacc && (rel(pld, dpacc) < 1e-2 || pld < 0.2),
            "{what}: pld {pld}"
        );
        // Our RDP optimises the order continuously: never above Opacus' RDP, never below PRV's
        // lower bound.
        assert!(
            rdp <= f(r, "eps_opacus_rdp") * (1.0 + 1e-9) && rdp >= low,
            "{what}: rdp {rdp}"
        );
        // The derivation is printed in the text output too.
        assert!(
            v["assumptions"]["other"][0]["value"]
                .as_str()
                .unwrap()
                .contains("⌊E·N/B⌋"),
            "{v}"
        );
    }
    assert_eq!(seen, [8, 8], "all MNIST and CIFAR-10 rows");
}

#[test]
fn account_text_states_the_derivation() {
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "1.0",
        "--epochs",
        "10",
        "--batch-size",
        "64",
        "--dataset-size",
        "50000",
        "--delta",
        "1e-5",
        "--accountant",
        "pld",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("q = B/N = 64/50000 = 0.00128"), "{out}");
    assert!(out.contains("⌊10·50000/64⌋ = 7812"), "{out}");
    assert!(out.contains("get_noise_multiplier"), "{out}");
}

#[test]
fn partial_or_conflicting_run_flags_exit_2() {
    for args in [
        vec![
            "account",
            "--noise-multiplier",
            "1",
            "--epochs",
            "10",
            "--batch-size",
            "64",
            "--delta",
            "1e-5",
        ],
        vec![
            "account",
            "--noise-multiplier",
            "1",
            "--epochs",
            "10",
            "--batch-size",
            "64",
            "--dataset-size",
            "60000",
            "--steps",
            "5",
            "--delta",
            "1e-5",
        ],
        vec![
            "account",
            "--noise-multiplier",
            "1",
            "--epochs",
            "1",
            "--batch-size",
            "640",
            "--dataset-size",
            "64",
            "--delta",
            "1e-5",
        ],
    ] {
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
    }
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "1",
        "--epochs",
        "10",
        "--batch-size",
        "64",
        "--delta",
        "1e-5",
    ]);
    assert!(stderr(&o).contains("--dataset-size"), "{}", stderr(&o));
}

#[test]
fn save_event_then_check_gives_the_same_sound_epsilon() {
    let dir = scratch("save");
    let file = dir.join("mnist.toml");
    let file_s = file.to_str().unwrap();
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "0.8",
        "--epochs",
        "10",
        "--batch-size",
        "64",
        "--dataset-size",
        "60000",
        "--delta",
        "1e-5",
        "--format",
        "json",
        "--save-event",
        file_s,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let acc = json(&o);
    let head = sound_eps(&acc);
    // The saved event is the accounted one, and the shipped fixture for the same run.
    let again = json(&dpaudit(&["account", "--event", file_s, "--format", "json"]));
    assert_eq!(again["event"], acc["event"]);
    assert_eq!(again["delta"], acc["delta"]);
    assert_eq!(sound_eps(&again), head);
    let fixture = json(&dpaudit(&[
        "account",
        "--event",
        "fixtures/events/dpsgd-mnist-sigma0.8.toml",
        "--format",
        "json",
    ]));
    assert_eq!(fixture["event"], acc["event"]);
    // `check` on the saved file: the same sound ε, exactly.
    let o = dpaudit(&["check", file_s, "--max-epsilon", "100", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let chk = json(&o);
    assert_eq!(chk["verdicts"][0]["epsilon"].as_f64(), Some(head), "{chk}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_from_flags_equals_check_of_the_event_file() {
    let a = dpaudit(&[
        "check",
        "fixtures/events/dpsgd-mnist-sigma0.8.toml",
        "--max-epsilon",
        "1",
    ]);
    let b = dpaudit(&[
        "check",
        "--noise-multiplier",
        "0.8",
        "--epochs",
        "10",
        "--batch-size",
        "64",
        "--dataset-size",
        "60000",
        "--delta",
        "1e-5",
        "--max-epsilon",
        "1",
    ]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    let tail = |s: String| s.split_once(": ").unwrap().1.to_string();
    assert_eq!(tail(stdout(&a)), tail(stdout(&b)));
}

#[test]
fn check_three_files_writes_three_testcases() {
    let dir = scratch("junit");
    let junit = dir.join("ci.xml");
    let files = [
        "fixtures/events/dpsgd.toml",
        "fixtures/events/dpsgd-mnist-sigma0.8.toml",
        "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
    ];
    let mut args = vec!["check"];
    args.extend(files);
    args.extend([
        "--max-epsilon",
        "3",
        "--delta",
        "1e-5",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    let o = dpaudit(&args);
    // The EDM fixture's sound ε is 3.23818 > 3 (tests/integration/check.rs): exit 1.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 3, "{out}");
    for (line, file) in out.lines().zip(files) {
        assert!(line.contains(file), "{line}");
    }
    assert!(out.lines().nth(2).unwrap().starts_with("FAIL "), "{out}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 3, "{xml}");
    for file in files {
        assert!(xml.contains(&format!("<testcase name=\"{file}\"")), "{xml}");
    }
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains("tests=\"3\" failures=\"1\" errors=\"0\""), "{xml}");
    // A bad input among them is an error test case and exit 2; the others are still checked.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "schema_version = 1\n").unwrap();
    let o = dpaudit(&[
        "check",
        files[0],
        bad.to_str().unwrap(),
        "--max-epsilon",
        "8",
        "--delta",
        "1e-5",
        "--junit",
        junit.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"2\" failures=\"0\" errors=\"1\""), "{xml}");
    assert!(stdout(&o).starts_with("PASS "), "{}", stdout(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

const DDPM_NAMED: &str = r#"schema_version = 1
sampler = "ddpm"
[schedule]
kind = "ddpm_linear"
beta_start = 1e-4
beta_end = 0.02
timesteps = 1000
levels = 50
[privacy]
dataset_size = 50000
[density]
kind = "constant"
"#;

#[test]
fn sampler_name_sets_the_convention_and_defaults_are_warned() {
    let dir = scratch("named");
    let cfg = dir.join("ddpm.toml");
    std::fs::write(&cfg, DDPM_NAMED).unwrap();
    let o = dpaudit(&["analyze", cfg.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(fact(&json(&o), "step convention"), "B");
    let err = stderr(&o);
    for field in ["delta", "privacy.samples", "privacy.clip_norm", "density.beta"] {
        assert!(
            err.contains(&format!("{field} not set: using the default")),
            "{field}: {err}"
        );
    }
    // Stated explicitly: no warnings.
    let full = DDPM_NAMED
        .replace("sampler = \"ddpm\"", "sampler = \"ddpm\"\ndelta = 1e-5")
        .replace(
            "dataset_size = 50000",
            "dataset_size = 50000\nsamples = 1\nclip_norm = 1.0",
        )
        .replace("kind = \"constant\"", "kind = \"constant\"\nbeta = 1.0");
    std::fs::write(&cfg, full).unwrap();
    let o = dpaudit(&["analyze", cfg.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("not set"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sweep's rows (`sweep.json` in `--out DIR`; `--format json` is the shared report).
fn sweep_rows(args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["sweep"];
    a.extend(args);
    let (o, v) = detail(&a, "sweep.json");
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    v.as_array().unwrap().clone()
}

fn gdp_eps(r: &serde_json::Value) -> f64 {
    r["accountants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["accountant"] == "gdp")
        .unwrap()["epsilon"]
        .as_f64()
        .unwrap()
}

#[test]
fn sweep_crosses_every_axis_in_grid_order() {
    // DDPM schedule: stop step × clip × samples = 2 × 2 × 2 points, the first axis outermost.
    let rows = sweep_rows(&[
        "fixtures/samplers/ddpm-linear-ddim50.toml",
        "--stop-step",
        "20,30",
        "--clip",
        "0.5,1",
        "--samples",
        "1,4",
    ]);
    assert_eq!(rows.len(), 8);
    let key = |r: &serde_json::Value| {
        (
            r["stop_step"].as_u64().unwrap(),
            r["clip_norm"].as_f64().unwrap(),
            r["samples"].as_u64().unwrap(),
        )
    };
    let keys: Vec<_> = rows.iter().map(key).collect();
    assert_eq!(
        keys,
        vec![
            (20, 0.5, 1),
            (20, 0.5, 4),
            (20, 1.0, 1),
            (20, 1.0, 4),
            (30, 0.5, 1),
            (30, 0.5, 4),
            (30, 1.0, 1),
            (30, 1.0, 4)
        ]
    );
    // Full batch: μ ∝ C (§3.1) and √S (composition); a later stop adds steps.
    let mu = |i: usize| rows[i]["full_batch_mu"].as_f64().unwrap();
    assert!(rel(mu(2), 2.0 * mu(0)) < 1e-12);
    assert!(rel(mu(1), 2.0 * mu(0)) < 1e-12);
    assert!(mu(4) > mu(0));
    assert_eq!(rows[0]["private_steps"].as_u64(), Some(20));
}

#[test]
fn sweep_axes_work_for_every_schedule_kind() {
    let dir = scratch("kinds");
    let flow = dir.join("flow.toml");
    std::fs::write(
        &flow,
        "schema_version = 1\nsampler = \"flow-euler\"\ndelta = 1e-5\n[schedule]\nkind = \"flow_matching\"\ns_min = 0.01\ns_max = 0.99\nlevels = 30\n\
         [privacy]\nclip_norm = 1.0\ndataset_size = 50000\nsamples = 1\n[density]\nkind = \"constant\"\nbeta = 1.0\n",
    )
    .unwrap();
    for cfg in [
        "fixtures/samplers/edm-cifar10-subsampled.toml".to_string(),
        "fixtures/samplers/ddpm-linear-ddim50.toml".to_string(),
        flow.to_str().unwrap().to_string(),
    ] {
        let rows = sweep_rows(&[
            &cfg,
            "--t-min",
            "0.05,0.5",
            "--switch-step",
            "0,10",
            "--dataset-size",
            "1000,50000",
            "--delta",
            "1e-5,1e-6",
            "--subsample-rate",
            "1",
        ]);
        assert_eq!(rows.len(), 16, "{cfg}");
        for (i, r) in rows.iter().enumerate() {
            // t_min is the outermost axis: 8 points at 0.05, then 8 at 0.5. EDM and flow matching
            // reach exactly that level; DDPM stops at the first level ≤ it.
            let t = if i < 8 { 0.05 } else { 0.5 };
            if cfg.contains("ddpm") {
                assert_eq!(r["stop_at"].as_f64(), Some(t), "{cfg}: {r}");
            } else {
                assert!(rel(r["t_min"].as_f64().unwrap(), t) < 1e-9, "{cfg}: {r}");
            }
        }
        // ε decreases with t_min, |D| and δ, and with a later switch (full batch, exact GDP).
        let e = |i: usize| gdp_eps(&rows[i]);
        assert!(e(0) > e(8), "{cfg}: t_min");
        assert!(e(0) > e(2), "{cfg}: |D|");
        assert!(e(0) < e(1), "{cfg}: δ");
        assert!(e(0) >= e(4), "{cfg}: switch step");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `src` with `key = old` replaced by `key = new` into `dir/name`.
fn with_value(dir: &std::path::Path, name: &str, src: &str, from: &str, to: &str) -> PathBuf {
    assert!(src.contains(from), "{from}");
    let p = dir.join(name);
    let mut s = src.replace(from, to);
    // Keep relative paths in the copy meaningful (none in these fixtures).
    s.push('\n');
    std::fs::write(&p, s).unwrap();
    p
}

#[test]
fn calibrated_sigma_min_meets_the_target_and_one_step_past_does_not() {
    let src = std::fs::read_to_string(root().join("fixtures/samplers/edm-cifar10-paper.toml")).unwrap();
    let (o, v) = detail(
        &[
            "calibrate",
            "--sampler",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--solve-for",
            "sigma-min",
            "--target-epsilon",
            "8",
        ],
        "calibrate.json",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meets = v["sound"]["meets"]["value"].as_f64().unwrap();
    let past = v["sound"]["past"]["value"].as_f64().unwrap();
    assert!(past < meets && (meets - past) / meets < 2e-5, "{meets} {past}");
    // Re-analysed independently by `check` on configs with that σ_min.
    let dir = scratch("calib");
    let good = with_value(
        &dir,
        "good.toml",
        &src,
        "sigma_min = 0.002",
        &format!("sigma_min = {meets}"),
    );
    let bad = with_value(
        &dir,
        "bad.toml",
        &src,
        "sigma_min = 0.002",
        &format!("sigma_min = {past}"),
    );
    let o = dpaudit(&["check", good.to_str().unwrap(), "--max-epsilon", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let o = dpaudit(&["check", bad.to_str().unwrap(), "--max-epsilon", "8"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibrated_samples_meet_the_target_and_one_more_does_not() {
    // Subsampled (p = 0.5): the sound answer from PLD/GDP, the CLT estimate beside it.
    let src = std::fs::read_to_string(root().join("fixtures/samplers/edm-cifar10-subsampled.toml")).unwrap();
    let src = src.replace("sigma_min = 0.002", "sigma_min = 0.01");
    let dir = scratch("calib-s");
    let base = dir.join("base.toml");
    std::fs::write(&base, &src).unwrap();
    let (o, v) = detail(
        &[
            "calibrate",
            "--sampler",
            base.to_str().unwrap(),
            "--solve-for",
            "samples",
            "--target-epsilon",
            "0.05",
        ],
        "calibrate.json",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meets = v["sound"]["meets"]["value"].as_f64().unwrap() as u64;
    let past = v["sound"]["past"]["value"].as_f64().unwrap() as u64;
    assert_eq!(past, meets + 1);
    assert_eq!(v["clt"]["meets"]["line"]["kind"], "estimate", "{v}");
    let acc = v["sound"]["meets"]["line"]["accountant"].as_str().unwrap().to_string();
    for (s, code) in [(meets, 0), (past, 1)] {
        let p = with_value(
            &dir,
            &format!("s{s}.toml"),
            &src,
            "samples = 1",
            &format!("samples = {s}"),
        );
        let o = dpaudit(&[
            "check",
            p.to_str().unwrap(),
            "--max-epsilon",
            "0.05",
            "--accountant",
            "gdp,pld",
        ]);
        assert_eq!(
            o.status.code(),
            Some(code),
            "S = {s} ({acc}): {}{}",
            stdout(&o),
            stderr(&o)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
