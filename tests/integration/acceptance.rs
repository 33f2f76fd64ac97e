//! Acceptance of the application layer: every command runs on every shipped input it accepts,
//! through the real binary, and each sentence of its conclusion is checked against the report's
//! own JSON (results, verdicts, tables). Every warning `analyze` emits for a sampler config
//! appears in `check`'s and `sweep`'s reports for the same file.
//!
//! Left out on purpose (cost, not shape): `verify fixtures/claims/dp-rdm.toml` (≈ 85 CPU-s; its
//! report has the shape of dp-rdm-cifar10's, which runs), `train` (minutes) and `mia` on the
//! diffusers checkpoint (tests/integration/diffusers.rs covers it).

use super::common::*;
use serde_json::Value;

/// Runs `args` plus `--format json`; the exit code must be 0 or 1 (a verdict), never 2.
fn report_json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--format", "json", "--quiet"]);
    let o = dpaudit(&a);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{args:?}: exit {:?}\n{}",
        o.status.code(),
        stderr(&o)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

/// The number written right after `key` in `s` (as the report's formatter writes it).
fn num_after(s: &str, key: &str) -> Option<f64> {
    let i = s.find(key)? + key.len();
    let t: String = s[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '-' | '+' | '∞'))
        .collect();
    if t == "∞" {
        return Some(f64::INFINITY);
    }
    t.trim_end_matches('.').parse().ok()
}

fn f(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap(),
        Value::String(s) if s == "inf" => f64::INFINITY,
        other => panic!("not a number: {other}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-5 * a.abs().max(b.abs())
}

fn is_sound(kind: &Value) -> bool {
    kind == "exact" || kind == "upper_bound"
}

/// The rows of table `id` as (column name → cell) maps.
fn table_rows<'a>(v: &'a Value, id: &str) -> Vec<Vec<(&'a str, &'a Value)>> {
    let Some(t) = v["tables"].as_array().unwrap().iter().find(|t| t["id"] == id) else {
        return Vec::new();
    };
    let cols: Vec<&str> = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| cols.iter().copied().zip(r.as_array().unwrap().iter()).collect())
        .collect()
}

fn cell<'a>(row: &[(&str, &'a Value)], name: &str) -> Option<&'a Value> {
    row.iter().find(|(c, _)| *c == name).map(|(_, v)| *v)
}

/// (ε, δ)-DP ⇒ membership accuracy ≤ (e^ε + δ)/(1 + e^ε) (Kairouz, Oh & Viswanath 2015).
fn accuracy_limit(eps: f64, delta: f64) -> f64 {
    let em = (-eps).exp();
    ((1.0 + delta * em) / (1.0 + em)).min(1.0)
}

/// Checks a stated guarantee's "under: …" clause and its line of scale against (ε, δ).
fn check_scale(what: &str, g: &str, eps: f64, delta: f64) {
    assert!(
        g.contains("under: "),
        "{what}: a guarantee without its assumptions: {g}"
    );
    let acc = num_after(g, "membership accuracy ≤ ").unwrap_or_else(|| panic!("{what}: no scale line: {g}"));
    assert!(
        close(acc, accuracy_limit(eps, delta)),
        "{what}: accuracy {acc} for ε = {eps}, δ = {delta}: {g}"
    );
    assert!(num_after(g, "TPR at 1 % FPR ≤ ").is_some(), "{what}: no TPR line: {g}");
}

/// Every sentence of the conclusion against the report's own tables.
fn check_conclusion(what: &str, v: &Value) {
    let c = &v["conclusion"];
    for k in ["audited", "guarantee", "verdict", "estimates"] {
        assert!(!c[k].as_str().unwrap_or_default().is_empty(), "{what}: empty {k}");
    }
    let g = c["guarantee"].as_str().unwrap();
    let results = v["results"].as_array().cloned().unwrap_or_default();
    let sound: Vec<&Value> = results.iter().filter(|r| is_sound(&r["kind"])).collect();

    // Guarantee: the smallest sound ε of the results, its δ, its assumptions and its scale.
    if g.contains("differentially private") {
        let eps = num_after(g, "(ε = ").unwrap_or_else(|| panic!("{what}: {g}"));
        let delta = num_after(g, ", δ = ").unwrap_or_else(|| panic!("{what}: {g}"));
        let best = sound
            .iter()
            .min_by(|a, b| f(&a["epsilon"]).total_cmp(&f(&b["epsilon"])))
            .unwrap_or_else(|| panic!("{what}: a guarantee with no sound result: {g}"));
        assert!(
            close(eps, f(&best["epsilon"])),
            "{what}: ε {eps} vs {}",
            best["epsilon"]
        );
        assert!(
            close(delta, f(&best["delta"])),
            "{what}: δ {delta} vs {}",
            best["delta"]
        );
        assert!(g.contains(best["accountant"].as_str().unwrap()), "{what}: {g}");
        check_scale(what, g, eps, delta);
    } else if g.starts_with("No guarantee") {
        assert!(sound.is_empty(), "{what}: says no guarantee but has sound results: {g}");
    }
    if let Some(a) = v.get("answers").filter(|a| a.is_object()) {
        if let (Some(e), Some(d)) = (a.get("epsilon"), a.get("delta")) {
            if g.contains("gives") && !g.starts_with("None") {
                check_scale(what, g, f(e), f(d));
            }
        }
    }

    // Verdict: the verdicts' statuses, or every comparison's outcome.
    let verdict = c["verdict"].as_str().unwrap();
    let verdicts = v["verdicts"].as_array().cloned().unwrap_or_default();
    let count = |s: &str| verdicts.iter().filter(|x| x["status"] == s).count();
    if verdicts.len() > 1 && verdict.contains("subjects:") {
        assert!(
            verdict.starts_with(&format!("{} subjects", verdicts.len())),
            "{what}: {verdict}"
        );
        for (s, word) in [("pass", "PASS"), ("fail", "FAIL"), ("inconclusive", "INCONCLUSIVE")] {
            assert!(verdict.contains(&format!("{} {word}", count(s))), "{what}: {verdict}");
        }
    } else if verdict.starts_with("PASS") {
        assert!(
            !verdicts.is_empty() && count("pass") == verdicts.len(),
            "{what}: {verdict}"
        );
    } else if verdict.starts_with("FAIL") {
        assert!(count("fail") > 0, "{what}: {verdict}");
    } else if verdict.starts_with("INCONCLUSIVE") {
        assert!(count("inconclusive") > 0, "{what}: {verdict}");
    } else if verdicts.is_empty() {
        let rows = table_rows(v, "comparisons");
        if rows.is_empty() {
            assert!(
                verdict.contains("no verdict") || verdict.starts_with("No budget") || verdict.contains("grid points"),
                "{what}: {verdict}"
            );
        } else {
            assert!(
                verdict.starts_with(&format!("{} comparisons", rows.len())),
                "{what}: {verdict}"
            );
            for r in &rows {
                let w = cell(r, "what").unwrap().as_str().unwrap();
                let o = cell(r, "outcome").unwrap().as_str().unwrap();
                assert!(
                    verdict.contains(w) && verdict.contains(o),
                    "{what}: `{w}: {o}` missing: {verdict}"
                );
            }
        }
    }
    // No lower bound is shown without its label, and a verdict's ε always names its source.
    for x in &verdicts {
        if !x["epsilon"].is_null() {
            assert!(
                !x["accountant"].is_null() || x["source"].is_string(),
                "{what}: verdict ε without its source: {x}"
            );
        }
    }

    // Estimates: every estimate present (results and tables) is listed; "none" only when none.
    let e = c["estimates"].as_str().unwrap();
    let mut present = Vec::new();
    for r in &results {
        if r["kind"] == "estimate" || r["kind"] == "data_dependent" {
            present.push(r["accountant"].as_str().unwrap().to_string());
        }
    }
    for t in v["tables"].as_array().unwrap() {
        for row in table_rows(v, t["id"].as_str().unwrap()) {
            if cell(&row, "kind").is_some_and(|k| k == "estimate") {
                let who = cell(&row, "accountant")
                    .or_else(|| cell(&row, "method"))
                    .and_then(|w| w.as_str())
                    .unwrap_or("estimate");
                present.push(who.to_string());
            }
        }
    }
    if present.is_empty() {
        assert!(!e.contains("an estimate, not a guarantee, and never"), "{what}: {e}");
    } else {
        assert!(
            !e.contains("none is an estimate") && !e.contains("No accountant numbers"),
            "{what}: {e}"
        );
        for p in &present {
            assert!(e.contains(p.as_str()), "{what}: estimate `{p}` not listed: {e}");
        }
    }
    if e.starts_with("No accountant numbers") {
        assert!(results.is_empty(), "{what}: {e}");
    }
}

/// The rendered Markdown never puts a lower bound under a "sound ε" heading.
fn check_rendered(what: &str, v: &Value) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("r.json");
    std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
    let o = dpaudit(&["report", p.to_str().unwrap(), "--format", "md"]);
    assert_eq!(o.status.code(), Some(0), "{what}: {}", stderr(&o));
    let md = stdout(&o);
    let lower = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["bound"] == "lower_bound");
    if lower {
        assert!(!md.contains("| sound ε |"), "{what}: a lower bound under `sound ε`");
        assert!(md.contains("lower bound"), "{what}: the lower bound is not labelled");
    }
}

fn shipped(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    v.sort();
    v
}

fn codes(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap().to_string())
        .collect();
    for r in v["results"].as_array().unwrap() {
        for d in r["diagnostics"].as_array().into_iter().flatten() {
            out.push(d["code"].as_str().unwrap().to_string());
        }
    }
    out
}

#[test]
fn every_command_on_every_shipped_input_concludes_what_its_tables_say() {
    let mut ran = 0;
    for ev in shipped("fixtures/events") {
        for args in [
            vec!["account", "--event", ev.as_str(), "--delta", "1e-5"],
            vec!["check", ev.as_str(), "--max-epsilon", "8", "--delta", "1e-5"],
        ] {
            let v = report_json(&args);
            check_conclusion(&format!("{args:?}"), &v);
            ran += 1;
        }
    }
    for s in shipped("fixtures/samplers") {
        let analyze = report_json(&["analyze", &s]);
        check_conclusion(&format!("analyze {s}"), &analyze);
        let check = report_json(&["check", &s, "--max-epsilon", "8"]);
        check_conclusion(&format!("check {s}"), &check);
        let account = report_json(&["account", "--event", &s]);
        check_conclusion(&format!("account {s}"), &account);
        ran += 3;
        // The same file carries the same warnings whichever command reads it.
        let want = codes(&analyze);
        let mut others = vec![("check", check)];
        let sweep = dpaudit(&["sweep", &s, "--samples", "1,2", "--format", "json", "--quiet"]);
        if sweep.status.code() == Some(0) {
            let v: Value = serde_json::from_slice(&sweep.stdout).unwrap();
            check_conclusion(&format!("sweep {s}"), &v);
            others.push(("sweep", v));
            ran += 1;
        }
        for (cmd, v) in others {
            let got = codes(&v);
            for w in &want {
                if w.starts_with("clt_") {
                    continue; // a CLT validity warning belongs to the accountant run, not the file
                }
                assert!(
                    got.contains(w),
                    "{cmd} {s}: analyze's warning `{w}` missing (has {got:?})"
                );
            }
        }
        // Calibration of the sample count where its search is quick (edm-hybrid-single-step's
        // takes minutes; the trajectory density and edm-cifar10-paper's ε are refused, exit 2).
        if !["ddpm-linear-ddim50", "diffusers-ddpm-ddim50", "edm-cifar10-subsampled"]
            .iter()
            .any(|n| s.contains(n))
        {
            continue;
        }
        let cal = dpaudit(&[
            "calibrate",
            "--sampler",
            &s,
            "--solve-for",
            "samples",
            "--target-epsilon",
            "8",
            "--format",
            "json",
            "--quiet",
        ]);
        if cal.status.code() == Some(0) {
            let v: Value = serde_json::from_slice(&cal.stdout).unwrap();
            assert!(v["answers"]["samples"].is_number(), "calibrate {s}: {}", v["answers"]);
            check_conclusion(&format!("calibrate {s}"), &v);
            ran += 1;
        }
    }
    for claims in shipped("fixtures/claims") {
        if claims.ends_with("/dp-rdm.toml") {
            continue; // ≈ 85 CPU-s; dp-rdm-cifar10.toml has the same report shape
        }
        let v = report_json(&["verify", &claims]);
        check_conclusion(&format!("verify {claims}"), &v);
        check_rendered(&format!("verify {claims}"), &v);
        ran += 1;
    }
    let d = tempfile::tempdir().unwrap();
    for (i, cfg) in shipped("fixtures/runs").iter().enumerate() {
        let out = d.path().join(format!("run{i}"));
        let mech = if cfg.contains("dpagg") { "dpagg-ti" } else { "dp-rdm" };
        let v = report_json(&["run", mech, cfg, "--out", out.to_str().unwrap(), "--audit"]);
        check_conclusion(&format!("run {cfg}"), &v);
        check_rendered(&format!("run {cfg}"), &v);
        // One ε for the run: the ledger's (gdp; a subsampled ledger, as dp-rdm's, is skipped
        // with its reason instead).
        let n = v["results"].as_array().unwrap().len() + v["skipped"].as_array().unwrap().len();
        assert_eq!(n, 1, "run {cfg}: {} {}", v["results"], v["skipped"]);
        ran += 1;
    }
    let v = report_json(&[
        "calibrate",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.004",
        "--solve-for",
        "steps",
        "--target-epsilon",
        "2",
        "--delta",
        "1e-5",
    ]);
    for k in ["noise_multiplier", "sample_rate", "steps", "epsilon", "delta"] {
        assert!(v["answers"][k].is_number(), "calibrate: answers.{k}: {}", v["answers"]);
    }
    check_conclusion("calibrate dp-sgd", &v);
    assert!(ran >= 30, "only {ran} command runs");
}

/// The DP `mia` example: the conclusion names the ledger's ε and the outcome of every
/// comparison, and no ROC is drawn against the limit of a mechanism it does not attack.
#[test]
fn mia_on_the_dp_checkpoint_concludes_from_its_ledger_and_comparisons() {
    let v = report_json(&["mia", "--checkpoint", "models/digits-rapid.toml", "--null-test"]);
    check_conclusion("mia digits-rapid", &v);
    let g = v["conclusion"]["guarantee"].as_str().unwrap();
    let ledger = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["accountant"] == "pld" && r["mechanism"] == "checkpoint")
        .expect("the ledger's pld ε is a result");
    assert!(close(num_after(g, "(ε = ").unwrap(), f(&ledger["epsilon"])), "{g}");
    assert!(v["conclusion"]["verdict"].as_str().unwrap().contains("comparisons"));
    for p in v["plots"].as_array().unwrap() {
        let names: Vec<&str> = p["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        if p["id"] == "roc" || p["id"] == "roc-loglog" {
            assert!(!names.iter().any(|n| n.starts_with("empirical")), "{names:?}");
        }
        if p["id"] == "roc-sampler" || p["id"] == "roc-sampler-loglog" {
            assert!(!names.iter().any(|n| n.contains("checkpoint")), "{names:?}");
        }
    }
    // The ROC also on log-log axes (TPR at low FPR), with the checkpoint's limit.
    let ll = v["plots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "roc-loglog")
        .expect("a log-log ROC");
    assert_eq!(
        (ll["x"]["scale"].as_str(), ll["y"]["scale"].as_str()),
        (Some("log"), Some("log"))
    );
    assert!(ll["series"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"].as_str().unwrap().contains("TPR limit")));
}

/// `report` renders a report, and refuses a command's detail file (exit 2) pointing to the
/// report.json beside it.
#[test]
fn report_points_from_a_detail_file_to_report_json() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("sweep");
    let o = dpaudit(&[
        "sweep",
        "fixtures/samplers/edm-cifar10-subsampled.toml",
        "--samples",
        "1,2",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = dpaudit(&["report", out.join("sweep.json").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("report.json"), "{}", stderr(&o));
    let o = dpaudit(&["report", out.join("report.json").to_str().unwrap(), "--format", "md"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// The layering, checked on the sources (code only: comments and `#[cfg(test)]` modules are
/// left out): the library never names clap or the command line; a report is created only in
/// the application layer (`src/audit.rs`, `src/audit/`); the process exit code is decided in one
/// function, `cli::exit_code` (the only other `process::exit` is the output fault hook, a
/// simulated kill for the transaction tests).
#[test]
fn application_layer_boundaries_hold_in_the_sources() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    assert!(files.len() > 50, "{} source files", files.len());
    let mut checked_exit_fn = false;
    for p in files {
        let rel = p.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&p).unwrap();
        let text = match text.find("#[cfg(test)]") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let code: String = text
            .lines()
            .map(|l| match l.find("//") {
                Some(i) => &l[..i],
                None => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let binary = rel == "main.rs" || rel.starts_with("cli/");
        if !binary {
            assert!(!code.contains("clap"), "{rel}: the library names clap");
            assert!(
                !code.contains("crate::cli"),
                "{rel}: the library names the command line"
            );
        }
        // `Report::new(`, not `SensitivityReport::new(`.
        let creates_report = code.match_indices("Report::new(").any(|(i, _)| {
            !code[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        });
        if creates_report {
            assert!(
                rel == "audit.rs" || rel.starts_with("audit/"),
                "{rel}: a report is created outside the application layer"
            );
        }
        if code.contains("process::exit(") {
            assert!(
                ["main.rs", "cli/mod.rs", "report/output.rs"].contains(&rel.as_str()),
                "{rel}: ends the process"
            );
        }
        if rel.starts_with("cli/") && rel != "cli/mod.rs" {
            assert!(!code.contains("Result<i32>"), "{rel}: returns an exit code");
            assert!(!code.contains("EXIT_"), "{rel}: names an exit code");
        }
        if rel == "cli/mod.rs" {
            checked_exit_fn = code.contains("pub fn exit_code(status: Status) -> i32");
        }
    }
    assert!(checked_exit_fn, "cli::exit_code maps a status to the exit code");
}
