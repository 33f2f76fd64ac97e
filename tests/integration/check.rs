//! Integration tests: `dpaudit check` through the real binary (exit codes 0/1/2, the verdict
//! line, the JSON verdict's margin, JUnit output) against reference numbers.

use super::common::{dpaudit, read_csv, rel, root, stderr, stdout};
use std::path::Path;

const EDM: &str = "fixtures/events/edm-fullbatch-sigmamin0.002.toml";

/// The exact ε of the EDM full-batch fixture: fixtures/reference/edm_fullbatch.csv
/// (σ_min 0.002, C = √3072, convention A_t_i, scipy closed form, checked by dp_accounting).
fn edm_reference_eps() -> f64 {
    let rows = read_csv("fixtures/reference/edm_fullbatch.csv");
    let row = rows
        .iter()
        .find(|r| r["sigma_min"] == "0.002" && r["C_label"] == "sqrt3072" && r["convention"] == "A_t_i")
        .expect("reference row");
    row["eps_delta_1e-5"].parse().unwrap()
}

fn json_report(args: &[&str]) -> (i32, serde_json::Value) {
    let o = dpaudit(args);
    let code = o.status.code().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stderr(&o)));
    (code, v)
}

#[test]
fn within_budget_exits_0_with_one_verdict_line_and_its_attacker_line() {
    let o = dpaudit(&["check", EDM, "--max-epsilon", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(out.starts_with("PASS "), "{out}");
    assert!(out.contains("sound ε = 3.23818 (gdp exact)"), "{out}");
    // The scale of that ε (issue 49): what it allows a membership attacker, at its δ.
    let attacker = out.lines().nth(1).unwrap();
    let shown: f64 = attacker
        .strip_prefix("  What it allows an attacker: membership accuracy ≤ ")
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("{out}"))
        .parse()
        .unwrap();
    let asr = dpaudit::accountants::tradeoff::asr_limit_eps_delta(3.23818, 1e-5);
    assert!((shown - asr).abs() < 1e-5, "{shown} vs {asr}");
}

#[test]
fn over_budget_exits_1() {
    let o = dpaudit(&["check", EDM, "--max-epsilon", "3"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("FAIL "), "{}", stdout(&o));
}

#[test]
fn json_verdict_carries_margin_against_reference_epsilon() {
    let (code, v) = json_report(&["check", EDM, "--max-epsilon", "8", "--format", "json", "--no-plots"]);
    assert_eq!(code, 0);
    let verdict = &v["verdicts"][0];
    let eps = verdict["epsilon"].as_f64().unwrap();
    assert!(
        rel(eps, edm_reference_eps()) < 1e-9,
        "ε {eps} vs {}",
        edm_reference_eps()
    );
    let margin = verdict["margin"].as_f64().unwrap();
    assert!((margin - (8.0 - eps)).abs() < 1e-12, "margin {margin}");
    assert_eq!(verdict["status"], "pass");
    assert_eq!(verdict["bound"], "exact");
    assert_eq!(v["delta"].as_f64(), Some(1e-5));
    // Inputs are hashed.
    let sha = v["inputs"][0]["sha256"].as_str().unwrap();
    let expected = dpaudit::report::sha256_hex(&std::fs::read(root().join(EDM)).unwrap());
    assert_eq!(sha, expected);
}

#[test]
fn delta_flag_overrides_file() {
    let (_, a) = json_report(&["check", EDM, "--max-epsilon", "8", "--format", "json", "--no-plots"]);
    let (_, b) = json_report(&[
        "check",
        EDM,
        "--max-epsilon",
        "8",
        "--delta",
        "1e-6",
        "--format",
        "json",
        "--no-plots",
    ]);
    let (ea, eb) = (
        a["verdicts"][0]["epsilon"].as_f64().unwrap(),
        b["verdicts"][0]["epsilon"].as_f64().unwrap(),
    );
    assert_eq!(b["delta"].as_f64(), Some(1e-6));
    assert!(eb > ea, "smaller δ must give larger ε: {eb} vs {ea}");
}

/// Regression guard for the core rule: the budget is checked against the sound bound. 50 steps
/// of Poisson(q = 0.01) ∘ Gaussian(σ = 1), δ = 1e-5: fixtures/reference/clt_const.csv gives the
/// Dong–Roth–Su CLT estimate ε = 0.4089 and the exact PLD ε = 0.5829. A budget of 0.5 passes the
/// estimate and fails the bound: exit 1.
#[test]
fn clt_estimate_within_budget_but_sound_bound_over_exits_1() {
    let o = dpaudit(&[
        "check",
        "fixtures/events/clt-understates.toml",
        "--max-epsilon",
        "0.5",
        "--format",
        "json",
        "--no-plots",
    ]);
    let code = o.status.code().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("exit {code}, stdout not JSON ({e}); stderr: {}", stderr(&o)));
    let results = v["results"].as_array().unwrap();
    let clt = results
        .iter()
        .find(|r| r["accountant"] == "clt")
        .unwrap_or_else(|| panic!("no CLT result: {}", stderr(&o)));
    assert_eq!(clt["kind"], "estimate");
    let clt_eps = clt["epsilon"].as_f64().unwrap();
    assert!(
        clt_eps < 0.5,
        "the CLT estimate should be within the budget here: {clt_eps}"
    );
    let verdict = &v["verdicts"][0];
    assert_eq!(verdict["status"], "fail", "{verdict}");
    assert_ne!(verdict["accountant"], "clt");
    assert_ne!(verdict["bound"], "estimate");
    let sound = verdict["epsilon"].as_f64().unwrap();
    let pld_ref = 0.5828824123607061;
    assert!(
        sound >= pld_ref * (1.0 - 1e-3),
        "sound ε {sound} below the PLD reference {pld_ref}"
    );
    assert!(verdict["margin"].as_f64().unwrap() < 0.0);
    assert_eq!(code, 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("estimate"),
        "a warning should name the estimate: {}",
        stderr(&o)
    );
}

fn write_tmp(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.display().to_string()
}

#[test]
fn bad_input_exits_2_with_clear_messages() {
    let d = tempfile::tempdir().unwrap();
    // Missing file.
    let o = dpaudit(&["check", "fixtures/events/nope.toml", "--max-epsilon", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nope.toml"), "{}", stderr(&o));
    // TOML syntax error: file and line.
    let bad = write_tmp(d.path(), "bad.toml", "schema_version = 1\n\n[event\n");
    let o = dpaudit(&["check", &bad, "--max-epsilon", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("bad.toml:3"), "{}", stderr(&o));
    // A bad field value names its path.
    let badq = write_tmp(
        d.path(),
        "q.toml",
        "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"poisson_sampled\"\nq = 1.5\n[event.event]\ntype = \"gaussian\"\nnoise_multiplier = 1.0\n",
    );
    let o = dpaudit(&["check", &badq, "--max-epsilon", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("event.q"), "{}", stderr(&o));
    // Neither an event file nor a sampler config.
    let other = write_tmp(d.path(), "other.toml", "title = \"x\"\n");
    let o = dpaudit(&["check", &other, "--max-epsilon", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cannot tell what this file describes"),
        "{}",
        stderr(&o)
    );
    // No δ anywhere.
    let nodelta = write_tmp(
        d.path(),
        "nodelta.toml",
        "schema_version = 1\n[event]\ntype = \"gaussian\"\nnoise_multiplier = 1.0\n",
    );
    let o = dpaudit(&["check", &nodelta, "--max-epsilon", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no δ given"), "{}", stderr(&o));
    // Bad flags.
    for (flag, val) in [("--max-epsilon", "-1"), ("--delta", "2")] {
        let mut args = vec!["check", EDM, "--max-epsilon", "1"];
        if flag == "--max-epsilon" {
            args[3] = val;
        } else {
            args.extend([flag, val]);
        }
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{flag} {val}");
        assert!(stderr(&o).contains(flag), "{}", stderr(&o));
    }
}

#[test]
fn no_sound_accountant_is_exit_2_not_a_pass() {
    // Sampling around a composition is outside every accountant's support.
    let d = tempfile::tempdir().unwrap();
    let f = write_tmp(
        d.path(),
        "nested.toml",
        "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"poisson_sampled\"\nq = 0.1\n[event.event]\ntype = \"composed\"\n[[event.event.events]]\ntype = \"gaussian\"\nnoise_multiplier = 1.0\n",
    );
    let o = dpaudit(&["check", &f, "--max-epsilon", "100"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("INCONCLUSIVE"), "{}", stdout(&o));
    assert!(stderr(&o).contains("no sound accountant"), "{}", stderr(&o));
}

/// Parses a JUnit file and checks the structure CI systems rely on (the common JUnit XSD:
/// testsuites > testsuite > testcase > failure|error, integer counts that add up).
fn check_junit(path: &Path) -> (usize, usize, Vec<(String, Option<String>)>) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("invalid XML ({e}):\n{text}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let int = |n: roxmltree::Node, a: &str| -> usize {
        n.attribute(a)
            .unwrap_or_else(|| panic!("<{}> lacks {a}", n.tag_name().name()))
            .parse()
            .unwrap()
    };
    let suites: Vec<_> = root.children().filter(|n| n.is_element()).collect();
    assert!(!suites.is_empty());
    let (mut tests, mut failures, mut errors) = (0, 0, 0);
    let mut cases = Vec::new();
    for s in &suites {
        assert_eq!(s.tag_name().name(), "testsuite");
        assert!(s.attribute("name").is_some());
        let _: f64 = s.attribute("time").unwrap().parse().unwrap();
        let mut n = (0, 0, 0);
        for c in s.children().filter(|n| n.is_element()) {
            match c.tag_name().name() {
                "properties" => {
                    for p in c.children().filter(|n| n.is_element()) {
                        assert_eq!(p.tag_name().name(), "property");
                        assert!(p.attribute("name").is_some() && p.attribute("value").is_some());
                    }
                }
                "system-out" | "system-err" => {}
                "testcase" => {
                    n.0 += 1;
                    assert!(c.attribute("name").is_some() && c.attribute("classname").is_some());
                    let _: f64 = c.attribute("time").unwrap().parse().unwrap();
                    let mut outcome = None;
                    for k in c.children().filter(|n| n.is_element()) {
                        let tag = k.tag_name().name();
                        assert!(
                            ["failure", "error", "skipped", "system-out", "system-err"].contains(&tag),
                            "{tag}"
                        );
                        if tag == "failure" || tag == "error" {
                            assert!(k.attribute("message").is_some() && k.attribute("type").is_some());
                            if tag == "failure" {
                                n.1 += 1;
                            } else {
                                n.2 += 1;
                            }
                            outcome = Some(tag.to_string());
                        }
                    }
                    cases.push((c.attribute("name").unwrap().to_string(), outcome));
                }
                other => panic!("unexpected <{other}> in <testsuite>"),
            }
        }
        assert_eq!((int(*s, "tests"), int(*s, "failures"), int(*s, "errors")), n);
        tests += n.0;
        failures += n.1;
        errors += n.2;
    }
    assert_eq!(int(root, "tests"), tests);
    assert_eq!(int(root, "failures"), failures);
    assert_eq!(int(root, "errors"), errors);
    (failures, errors, cases)
}

#[test]
fn junit_output_for_pass_fail_and_bad_input() {
    let d = tempfile::tempdir().unwrap();
    let j = d.path().join("pass.xml");
    let o = dpaudit(&["check", EDM, "--max-epsilon", "8", "--junit", j.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let (f, e, cases) = check_junit(&j);
    assert_eq!((f, e, cases.len()), (0, 0, 1));
    assert!(cases[0].0.contains(EDM));

    let j = d.path().join("fail.xml");
    let o = dpaudit(&["check", EDM, "--max-epsilon", "3", "--junit", j.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let (f, e, cases) = check_junit(&j);
    assert_eq!((f, e), (1, 0));
    assert_eq!(cases[0].1.as_deref(), Some("failure"));
    let text = std::fs::read_to_string(&j).unwrap();
    assert!(text.contains("type=\"BudgetExceeded\""), "{text}");

    let j = d.path().join("error.xml");
    let o = dpaudit(&[
        "check",
        "fixtures/events/nope.toml",
        "--max-epsilon",
        "3",
        "--junit",
        j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let (f, e, _) = check_junit(&j);
    assert_eq!((f, e), (0, 1));

    // An existing JUnit file is replaced on a re-run (as CI tools do), and the budget is checked.
    let o = dpaudit(&["check", EDM, "--max-epsilon", "8", "--junit", j.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(check_junit(&j).1, 0);
}

#[test]
fn help_shows_a_worked_example() {
    let o = dpaudit(&["check", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let h = stdout(&o);
    assert!(
        h.contains("Examples:") && h.contains("dpaudit check fixtures/events/"),
        "{h}"
    );
    assert!(h.contains("Exit codes: 0 within budget, 1 over budget, 2"), "{h}");
}

/// `check` accounts sampler configurations too: the paper's full-batch EDM setting (μ ≈ 787.6)
/// is far over any modest budget (exit 1); the subsampled fixture passes a budget of 5 (exit 0),
/// judged by a sound bound, never the CLT estimate.
#[test]
fn sampler_configs_are_checked_against_sound_bounds() {
    let o = dpaudit(&[
        "check",
        "fixtures/samplers/edm-cifar10-paper.toml",
        "--max-epsilon",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("FAIL"), "{}", stdout(&o));
    let o = dpaudit(&[
        "check",
        "fixtures/samplers/edm-cifar10-subsampled.toml",
        "--max-epsilon",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("PASS") && !out.contains("(clt"), "{out}");
}
