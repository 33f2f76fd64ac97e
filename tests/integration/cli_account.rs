//! Integration tests: `dpaudit account` and `dpaudit calibrate` through the real binary.

use super::common::{dpaudit, read_csv, rel, stderr, stdout};
use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let o = dpaudit(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}\nstdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)))
}

fn result<'a>(v: &'a Value, acc: &str) -> Option<&'a Value> {
    v["results"].as_array().unwrap().iter().find(|r| r["accountant"] == acc)
}

#[test]
fn account_json_contract() {
    let v = json(&[
        "account",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.004",
        "--steps",
        "14062",
        "--delta",
        "1e-5",
        "--format",
        "json",
    ]);
    // The one report (schema_version 2).
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["audit"], "account");
    assert_eq!(v["delta"], 1e-5);
    assert_eq!(v["assumptions"]["neighbouring"], "add_remove");
    // The event round-trips into the library type.
    let ev: dpaudit::events::DpEvent = serde_json::from_value(v["event"].clone()).unwrap();
    assert_eq!(ev, dpaudit::events::DpEvent::dpsgd(1.1, 0.004, 14062));
    // Every accountant appears exactly once, as a result or as unsupported with a reason.
    let mut seen: Vec<String> = Vec::new();
    for r in v["results"].as_array().unwrap() {
        let kind = r["kind"].as_str().unwrap();
        assert!(["upper_bound", "estimate", "exact"].contains(&kind), "{kind}");
        assert!(r["epsilon"].as_f64().unwrap() >= 0.0);
        seen.push(r["accountant"].as_str().unwrap().into());
    }
    for u in v["skipped"].as_array().unwrap() {
        assert!(!u["reason"].as_str().unwrap().is_empty());
        seen.push(u["accountant"].as_str().unwrap().into());
    }
    seen.sort();
    assert_eq!(seen, ["clt", "gdp", "pld", "rdp"]);
    // GDP cannot do subsampled events; CLT is an estimate and never the guarantee.
    assert!(v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["accountant"] == "gdp"));
    let clt = result(&v, "clt").expect("clt result");
    assert_eq!(clt["kind"], "estimate");
    let guarantee = v["conclusion"]["guarantee"].as_str().unwrap();
    assert!(!guarantee.contains("clt"), "{guarantee}");
}

/// The CLI's CLT number is the reference one (clt_const.csv, μ = 1, T = 1000, p = 0.01).
#[test]
fn account_clt_matches_reference() {
    let row = read_csv("fixtures/reference/clt_const.csv")
        .into_iter()
        .find(|r| r["mu_step"] == "1.0" && r["T"] == "1000" && r["p"] == "0.01")
        .unwrap();
    let v = json(&[
        "account",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.01",
        "--steps",
        "1000",
        "--delta",
        "1e-5",
        "--accountant",
        "clt",
        "--format",
        "json",
    ]);
    let e = result(&v, "clt").unwrap()["epsilon"].as_f64().unwrap();
    assert!(rel(e, row["drs_clt_eps"].parse().unwrap()) < 1e-6, "{e}");
    let c = &v["conclusion"];
    assert!(
        c["guarantee"].as_str().unwrap().starts_with("No guarantee"),
        "an estimate must never be the guarantee: {c}"
    );
    assert!(c["estimates"].as_str().unwrap().contains("clt"), "{c}");
}

#[test]
fn account_text_shows_ledger_kinds_and_sound_headline() {
    let o = dpaudit(&["account", "--event", "fixtures/events/full_batch.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("repeat 5 times:"), "{s}");
    assert!(s.contains("Gaussian(noise_multiplier = 4"), "{s}");
    assert!(s.contains("gdp  ε = 2.548"), "{s}");
    assert!(s.contains("exact"), "{s}");
    assert!(s.contains("Headline (smallest sound ε)"), "{s}");
    // Subsampled: the CLT line says ESTIMATE.
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/dpsgd.toml",
        "--accountant",
        "clt",
    ]);
    let s = stdout(&o);
    assert!(s.contains("clt") && s.contains("ESTIMATE"), "{s}");
    assert!(s.contains("no sound bound"), "{s}");
}

#[test]
fn account_delta_query_and_csv() {
    let v = json(&[
        "account",
        "--event",
        "fixtures/events/full_batch.toml",
        "--epsilon",
        "2.548698",
        "--accountant",
        "gdp",
        "--format",
        "json",
    ]);
    assert!(v["delta"].is_null(), "δ at ε: no single δ for the report");
    let d = result(&v, "gdp").unwrap()["delta"].as_f64().unwrap();
    assert!(rel(d, 1e-6) < 1e-4, "{d}");
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/heterogeneous.toml",
        "--format",
        "csv",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    let mut rdr = csv::Reader::from_reader(s.as_bytes());
    assert_eq!(
        rdr.headers().unwrap().iter().collect::<Vec<_>>(),
        [
            "accountant",
            "status",
            "epsilon",
            "delta",
            "kind",
            "sound",
            "headline",
            "reason"
        ]
    );
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 4);
    assert!(rows
        .iter()
        .any(|r| &r[0] == "clt" && &r[4] == "estimate" && &r[5] == "false"));
}

#[test]
fn account_replace_one_and_neighbouring_flag() {
    // Full batch: GDP and CLT (exact) both work under replace-one; the flag overrides the file.
    let v = json(&[
        "account",
        "--event",
        "fixtures/events/full_batch.toml",
        "--neighbouring",
        "replace-one",
        "--format",
        "json",
    ]);
    assert_eq!(v["assumptions"]["neighbouring"], "replace_one");
    assert_eq!(result(&v, "gdp").unwrap()["kind"], "exact");
    // Poisson under replace-one: RDP accounts it (joint-convexity bound, flagged), so the
    // command succeeds; CLT, PLD and GDP refuse it and each says why.
    let v = json(&[
        "account",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--delta",
        "1e-5",
        "--neighbouring",
        "replace-one",
        "--format",
        "json",
    ]);
    assert_eq!(v["assumptions"]["neighbouring"], "replace_one");
    let rdp = result(&v, "rdp").expect("rdp accounts replace-one Poisson");
    assert_eq!(rdp["kind"], "upper_bound");
    assert!(rdp.to_string().contains("rdp_poisson_replace_one"), "{rdp}");
    let u = v["skipped"].as_array().unwrap();
    let mut refused: Vec<&str> = u.iter().map(|u| u["accountant"].as_str().unwrap()).collect();
    refused.sort();
    // PLD accounts replace-one Poisson (the dominating pair of dp_accounting's REPLACE_ONE).
    assert_eq!(refused, ["clt", "gdp"], "{u:?}");
    assert_eq!(
        result(&v, "pld").expect("pld accounts replace-one Poisson")["kind"],
        "upper_bound"
    );
    let r = u.iter().find(|u| u["accountant"] == "clt").unwrap()["reason"]
        .as_str()
        .unwrap();
    assert!(r.contains("replace-one"), "clt: {r}");
}

/// Each bad input: exit 2 and a message naming the flag, file, line or field. Never a panic.
#[test]
fn account_bad_inputs_exit_2_with_named_flag() {
    let base = ["account", "--sample-rate", "0.01", "--steps", "100", "--delta", "1e-5"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--noise-multiplier", "0"], "--noise-multiplier"),
        (vec!["--noise-multiplier", "-1"], "--noise-multiplier"),
        (vec!["--noise-multiplier", "NaN"], "--noise-multiplier"),
        (vec!["--noise-multiplier", "inf"], "--noise-multiplier"),
        (vec!["--noise-multiplier", "abc"], "--noise-multiplier"),
    ];
    for (extra, needle) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter());
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
    let sigma = ["account", "--noise-multiplier", "1", "--steps", "100"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--sample-rate", "0", "--delta", "1e-5"], "--sample-rate"),
        (vec!["--sample-rate", "1.5", "--delta", "1e-5"], "--sample-rate"),
        (vec!["--sample-rate", "NaN", "--delta", "1e-5"], "--sample-rate"),
        (vec!["--delta", "1"], "--delta"),
        (vec!["--delta", "0"], "--delta"),
        (vec!["--delta", "NaN"], "--delta"),
        (vec!["--delta", "2"], "--delta"),
        (vec![], "--delta"),
        (vec!["--epsilon", "-1"], "--epsilon"),
        (vec!["--epsilon", "NaN"], "--epsilon"),
        (vec!["--delta", "1e-5", "--accountant", "foo"], "--accountant"),
        (vec!["--delta", "1e-5", "--format", "pdf"], "--format"),
        (vec!["--delta", "1e-5", "--neighbouring", "sideways"], "--neighbouring"),
        (vec!["--delta", "1e-5", "--steps", "-3"], "--steps"),
    ];
    for (extra, needle) in cases {
        let mut args: Vec<&str> = sigma.to_vec();
        args.extend(extra.iter());
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    // Missing σ; event file and flags together.
    let o = dpaudit(&["account", "--steps", "10", "--delta", "1e-5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--noise-multiplier"));
    let o = dpaudit(&["account", "--event", "fixtures/events/dpsgd.toml", "--steps", "3"]);
    assert_eq!(o.status.code(), Some(2));
    // Files: missing, bad value (field path), unknown field (file and line).
    let o = dpaudit(&["account", "--event", "fixtures/events/nope.toml", "--delta", "1e-5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nope.toml"), "{}", stderr(&o));
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/bad/bad_q.toml",
        "--delta",
        "1e-5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("bad_q.toml") && stderr(&o).contains("event.q"),
        "{}",
        stderr(&o)
    );
    let o = dpaudit(&[
        "account",
        "--event",
        "fixtures/events/bad/unknown_field.toml",
        "--delta",
        "1e-5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("unknown_field.toml:") && e.contains("sigma"), "{e}");
}

#[test]
fn account_fails_only_when_no_accountant_works() {
    // GDP alone on a subsampled event: nothing works → exit 2 with the reason.
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "1",
        "--sample-rate",
        "0.01",
        "--steps",
        "10",
        "--delta",
        "1e-5",
        "--accountant",
        "gdp",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no accountant supports"), "{}", stderr(&o));
    assert!(stderr(&o).contains("gdp"), "{}", stderr(&o));
}

#[test]
fn calibrate_through_the_binary() {
    // GDP, full batch: σ for ε = 2 at δ = 1e-5 over 10 steps, re-accounted below the target.
    let v = json(&[
        "calibrate",
        "--target-epsilon",
        "2",
        "--delta",
        "1e-5",
        "--steps",
        "10",
        "--accountant",
        "gdp",
        "--format",
        "json",
    ]);
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["audit"], "calibrate");
    // The calibrated event is in the report: σ is its noise multiplier.
    let sigma = v["event"]["event"]["noise_multiplier"].as_f64().unwrap();
    let e = dpaudit::accountants::gdp::epsilon_for_delta(10f64.sqrt() / sigma, 1e-5).unwrap();
    assert!(e <= 2.0 && e > 2.0 - 1e-6, "{e}");
    // CLT: loud warning, still a safe-side answer for the estimate.
    let o = dpaudit(&[
        "calibrate",
        "--target-epsilon",
        "3",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.004",
        "--delta",
        "1e-5",
        "--solve-for",
        "steps",
        "--accountant",
        "clt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("WARNING") && stderr(&o).contains("ESTIMATE"));
    assert!(stdout(&o).contains("ESTIMATE"), "{}", stdout(&o));
    // Bad inputs.
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--target-epsilon", "0", "--delta", "1e-5", "--steps", "10"],
            "--target-epsilon",
        ),
        (
            vec!["--target-epsilon", "NaN", "--delta", "1e-5", "--steps", "10"],
            "--target-epsilon",
        ),
        (
            vec!["--target-epsilon", "1", "--delta", "1", "--steps", "10"],
            "--delta",
        ),
        (
            vec!["--target-epsilon", "1", "--delta", "1e-5", "--steps", "0"],
            "--steps",
        ),
        (
            vec![
                "--target-epsilon",
                "1",
                "--delta",
                "1e-5",
                "--steps",
                "10",
                "--sample-rate",
                "0",
            ],
            "--sample-rate",
        ),
        (
            vec![
                "--target-epsilon",
                "1",
                "--delta",
                "1e-5",
                "--noise-multiplier",
                "1",
                "--steps",
                "10",
            ],
            "--solve-for",
        ),
        (vec!["--target-epsilon", "1", "--delta", "1e-5"], "--solve-for"),
        (
            vec![
                "--target-epsilon",
                "1",
                "--delta",
                "1e-5",
                "--steps",
                "10",
                "--solve-for",
                "steps",
            ],
            "--steps",
        ),
        (
            vec![
                "--target-epsilon",
                "1",
                "--delta",
                "1e-5",
                "--steps",
                "10",
                "--accountant",
                "all",
            ],
            "--accountant",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["calibrate"];
        args.extend(extra.iter());
        let o = dpaudit(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    // Unreachable: one full-batch step with σ = 0.1 exceeds ε = 0.01.
    let o = dpaudit(&[
        "calibrate",
        "--target-epsilon",
        "0.01",
        "--delta",
        "1e-5",
        "--noise-multiplier",
        "0.1",
        "--solve-for",
        "steps",
        "--accountant",
        "gdp",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unreachable"), "{}", stderr(&o));
}

/// `calibrate --solve-for steps` at σ = 10⁶ (the step counts are huge: it took 525 s when the
/// search doubled the steps from 1 with a PLD evaluation each): the closed-form start puts the
/// search next to the answer, so it answers in seconds: the answer re-accounted meets the
/// target (q = 0.5), or no step count up to 2⁵⁰ exceeds it (q = 0.004), a clear error.
#[test]
fn calibrate_steps_at_huge_noise_finishes_in_seconds() {
    for (q, target) in [("0.5", "1"), ("0.004", "3")] {
        let started = std::time::Instant::now();
        let o = dpaudit(&[
            "calibrate",
            "--target-epsilon",
            target,
            "--noise-multiplier",
            "1e6",
            "--sample-rate",
            q,
            "--delta",
            "1e-5",
            "--solve-for",
            "steps",
            "--format",
            "json",
        ]);
        let took = started.elapsed().as_secs_f64();
        assert!(took < 30.0, "q = {q}: {took} s");
        if q == "0.5" {
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
            let steps = v["answers"]["steps"].as_f64().unwrap();
            assert!(steps > 1e9, "{steps}");
            assert!(v["results"][0]["epsilon"].as_f64().unwrap() <= 1.0, "{v}");
        } else {
            assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
            assert!(stderr(&o).contains("no finite answer"), "{}", stderr(&o));
        }
    }
}

#[test]
fn help_shows_worked_examples() {
    for cmd in ["account", "calibrate"] {
        let o = dpaudit(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        let s = stdout(&o);
        assert!(s.contains("Example") && s.contains(&format!("dpaudit {cmd} ")), "{s}");
    }
}

/// dp_accounting's `NonPrivateDpEvent`: an event file with a `non_private` part composed with a
/// Gaussian is accounted ε = ∞ by every accountant (JSON writes it as "inf", as every non-finite
/// number), `check` fails any finite budget naming the non-private part.
#[test]
fn non_private_event_is_infinite_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("non_private.toml");
    std::fs::write(
        &path,
        "schema_version = 1\ndelta = 1e-5\n[event]\ntype = \"composed\"\n\
         [[event.events]]\ntype = \"gaussian\"\nnoise_multiplier = 1.0\n\
         [[event.events]]\ntype = \"non_private\"\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let v = json(&["account", "--event", p, "--format", "json"]);
    for acc in ["gdp", "clt", "rdp", "pld"] {
        let r = result(&v, acc).unwrap_or_else(|| panic!("{acc} missing: {v}"));
        assert_eq!(r["epsilon"], "inf", "{acc}: {r}");
        assert_eq!(r["diagnostics"][0]["code"], "non_private", "{acc}: {r}");
    }
    assert!(v["skipped"].as_array().unwrap().is_empty(), "{v}");
    let guarantee = v["conclusion"]["guarantee"].as_str().unwrap();
    assert!(guarantee.contains("no differential-privacy guarantee"), "{guarantee}");
    assert!(guarantee.contains("event.events[1] is non-private"), "{guarantee}");

    let text = dpaudit(&["account", "--event", p]);
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    let out = stdout(&text);
    assert!(out.contains("non-private (no guarantee)"), "{out}");
    for acc in ["gdp", "clt", "rdp", "pld"] {
        assert!(out.contains(&format!("  {acc}  ε = ∞ ")), "{acc}: {out}");
    }
    assert!(out.contains("Headline (smallest sound ε): ε = ∞"), "{out}");
    assert!(!out.contains("NaN"), "{out}");

    for format in ["md", "html", "csv"] {
        let o = dpaudit(&["account", "--event", p, "--format", format]);
        assert_eq!(o.status.code(), Some(0), "{format}: {}", stderr(&o));
        assert!(!stdout(&o).contains("NaN"), "{format}");
    }

    // δ at a finite ε is 1 from every accountant.
    let d = json(&["account", "--event", p, "--epsilon", "1", "--format", "json"]);
    for acc in ["gdp", "clt", "rdp", "pld"] {
        assert_eq!(result(&d, acc).unwrap()["delta"], 1.0, "{acc}: {d}");
    }

    let check = dpaudit(&["check", p, "--max-epsilon", "8"]);
    assert_eq!(check.status.code(), Some(1), "{}", stderr(&check));
    let out = stdout(&check);
    assert!(out.starts_with("FAIL"), "{out}");
    assert!(out.contains("event.events[1] is non-private (no guarantee)"), "{out}");
    let check = dpaudit(&["check", p, "--max-epsilon", "8", "--format", "json"]);
    assert_eq!(check.status.code(), Some(1), "{}", stderr(&check));
    let v: Value = serde_json::from_str(&stdout(&check)).unwrap();
    assert_eq!(v["verdicts"][0]["status"], "fail", "{v}");
    assert_eq!(v["verdicts"][0]["epsilon"], "inf", "{v}");
    assert!(
        v["verdicts"][0]["message"].as_str().unwrap().contains("non-private"),
        "{v}"
    );
}
