//! Pipelines: `verify` on the shipped claims against fixtures/reference (dp_rdm.csv, dpsgd.csv,
//! dpagg_ti*.csv; dp-accounting 0.6.0 / scipy 1.17.1, see fixtures/reference/versions.txt), the
//! executable mechanisms (noise distribution, ledgers, refusal past budget), the audits, and bad
//! claims files.

use super::common::{dpaudit, read_csv, rel, root, stderr, stdout};
use dpaudit::accountants::{gdp, AccountantKind};
use dpaudit::events::{DpEvent, EventFile, Neighbouring};
use dpaudit::pipelines::audit;
use dpaudit::pipelines::dpagg_ti;
use dpaudit::pipelines::embeddings::Embeddings;
use dpaudit::pipelines::mechanisms::{self, DpRdm, DpaggTi, Fault, SigmaRule};
use serde_json::Value;

fn f(row: &std::collections::HashMap<String, String>, k: &str) -> f64 {
    row[k].parse().unwrap_or_else(|_| panic!("{k}: {}", row[k]))
}

/// The detailed verify record (`verify.json`, written into `--out DIR`; `--format json` is the
/// shared report).
fn verify_json(file: &str) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&["verify", file, "--out", dir.path().to_str().unwrap(), "-q"]);
    let code = o.status.code().unwrap();
    assert!(code == 0 || code == 1, "{}", stderr(&o));
    let detail = std::fs::read_to_string(dir.path().join("verify.json")).expect("verify.json");
    (code, serde_json::from_str(&detail).expect("json"))
}

fn claim<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("claim {id}"))
}

fn analysis(c: &Value, interp: &str, method: &str) -> Option<f64> {
    c["interpretations"].as_array()?.iter().find(|i| i["id"] == interp)?["sound"]["analyses"]
        .as_array()?
        .iter()
        .find(|a| a["method"] == method)
        .and_then(|a| a["epsilon"].as_f64())
}

fn calibration(c: &Value, what: &str) -> Option<f64> {
    c["calibrations"]
        .as_array()?
        .iter()
        .find(|k| k["what"] == what)
        .and_then(|k| k["value"].as_f64())
}

fn embeddings(name: &str) -> Embeddings {
    Embeddings::load_csv(&root().join("fixtures/embeddings").join(name)).unwrap()
}

// ------------------------------------------------------------------------------------------
// verify: reference numbers and verdicts

/// DP-RDM Figure 15 (dp_rdm.csv): every row holds under Theorem 3.1 (sensitivity 2/k) only with
/// the improved RDP conversion or PLD; the classic conversion exceeds ε = 10; PLD's k_min is
/// smaller than the published k. Add/remove has the same sensitivity 2/k (the reference's σk
/// rows, Δ = 1/k, are a what-if, not a sound analysis, and are not accounted).
#[test]
fn dp_rdm_cifar10_reproduces_reference() {
    let (code, v) = verify_json("fixtures/claims/dp-rdm-cifar10.toml");
    assert_eq!(code, 0);
    for row in read_csv("fixtures/reference/dp_rdm.csv") {
        let t = f(&row, "T") as u64;
        let c = claim(&v, &format!("cifar10-T{t}-eps10"));
        assert_eq!(c["verdict"], "holds", "{t}");
        if !row["sensitivity"].starts_with("2/k") {
            continue;
        }
        let interp = "theorem_3_1";
        assert_eq!(analysis(c, "add_remove", "pld"), analysis(c, interp, "pld"), "T={t}");
        // Our RDP refines dp_accounting's order grid: never above its ε, and close to it.
        let rdp = analysis(c, interp, "rdp").expect("rdp");
        let ref_rdp = f(&row, "eps_dpacc_rdp");
        assert!(
            rdp <= ref_rdp * (1.0 + 1e-9) && rdp >= ref_rdp * 0.97,
            "T={t} {interp}: rdp {rdp} vs {ref_rdp}"
        );
        let classic = analysis(c, interp, "rdp_classic_conversion").expect("classic");
        let ref_classic = f(&row, "eps_rdp_classic_conversion");
        assert!(
            classic <= ref_classic * (1.0 + 1e-9) && classic >= ref_classic * 0.97,
            "T={t} {interp}: classic {classic} vs {ref_classic}"
        );
        let pld = analysis(c, interp, "pld").expect("pld");
        let ref_pld = f(&row, "eps_dpacc_pld");
        assert!(rel(pld, ref_pld) < 2e-3, "T={t} {interp}: pld {pld} vs {ref_pld}");
        if interp == "theorem_3_1" {
            // The classic conversion misses ε = 10 exactly where dp_accounting's does (every T
            // but 100); then the claim needs the improved conversion (or PLD).
            assert_eq!(classic > 10.0, ref_classic > 10.0, "T={t}: classic {classic}");
            let findings = c["findings"].to_string();
            assert_eq!(findings.contains("improved RDP"), ref_classic > 10.0, "{findings}");
            assert_eq!(
                calibration(c, "k_min_pld"),
                Some(f(&row, "k_min_meeting_claim_pld")),
                "T={t}"
            );
            assert_eq!(
                calibration(c, "k_min_rdp"),
                Some(f(&row, "k_min_meeting_claim_rdp")),
                "T={t}"
            );
        }
    }
}

/// RAPID (dpsgd.csv): Theorem 1 without amplification gives ε in the tens of thousands; the
/// Poisson add/remove analysis gives the reference RDP/PLD ε. With claimed ε = 1 the verdict is
/// "holds only under poisson_add_remove" exactly when the PLD ε ≤ 1, "violated" otherwise.
#[test]
fn rapid_scenarios_show_both_analyses() {
    let (code, v) = verify_json("fixtures/claims/rapid-scenarios.toml");
    assert_eq!(code, 1, "σ = 0.8 and 1 over 50 epochs violate ε = 1");
    for row in read_csv("fixtures/reference/dpsgd.csv") {
        let ds = if row["N"] == "60000" { "mnist" } else { "cifar10" };
        let epochs = row["epochs"].as_str();
        let sigma = f(&row, "noise_multiplier");
        let c = claim(&v, &format!("rapid-{ds}-sigma{sigma}-epochs{epochs}"));
        let thm1 = analysis(c, "theorem_1", "rapid_theorem_1").unwrap();
        assert!(rel(thm1, f(&row, "rapid_thm1_eps_continuous_alpha")) < 1e-12, "{thm1}");
        let gdp = analysis(c, "theorem_1", "gdp").unwrap();
        assert!(
            gdp > 500.0 && gdp <= thm1,
            "exact GDP of the unamplified mechanism {gdp}"
        );
        let rdp = analysis(c, "poisson_add_remove", "rdp").unwrap();
        let ref_rdp = f(&row, "eps_dpacc_rdp");
        // Our RDP optimises the order continuously, so it may sit below dp_accounting's grid
        // optimum (up to ~5% on rows where its grid jumps, e.g. 63 → 128); it must never be above
        // it, nor below the PRV lower bound on the true ε.
        assert!(
            rdp <= ref_rdp * (1.0 + 1e-9) && rdp >= f(&row, "eps_prv_low"),
            "{rdp} vs {ref_rdp}"
        );
        let pld = analysis(c, "poisson_add_remove", "pld").unwrap();
        let ref_pld = f(&row, "eps_dpacc_pld");
        // Within 0.2 % above dp_accounting's grid-1e-4 value; below it by more only where the
        // grid was refined for a small ε (docs/pld.md, "Tiny ε"), never below PRV's lower bound.
        assert!(
            pld <= ref_pld * (1.0 + 2e-3) && (rel(pld, ref_pld) < 2e-3 || pld < 0.2) && pld >= f(&row, "eps_prv_low"),
            "{pld} vs {ref_pld}"
        );
        // The paper's numbers come from the Poisson analysis (§5): it decides the verdict.
        let best = pld.min(rdp);
        if best <= 1.0 {
            assert_eq!(c["verdict"], "holds", "{}", c["id"]);
        } else {
            assert_ne!(c["verdict"], "holds", "{}", c["id"]);
        }
        // Theorem 1 (no amplification) never supports ε = 1.
        let th = c["interpretations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == "theorem_1")
            .unwrap();
        assert_ne!(th["decision"]["verdict"], "holds");
    }
}

/// RAPID as published: σ and epochs are not stated → not demonstrated (exit 1); the calibration
/// shows the σ a Poisson analysis needs and that Theorem 1 at that σ gives an ε orders of
/// magnitude larger.
#[test]
fn rapid_paper_claims_are_undecidable_with_calibration() {
    let (code, v) = verify_json("fixtures/claims/rapid.toml");
    assert_eq!(code, 1);
    let claims = v["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 9);
    for c in claims {
        assert_eq!(c["verdict"], "not_demonstrated", "{}", c["id"]);
        let missing = c["reason"].to_string();
        assert!(
            missing.contains("noise multiplier") && missing.contains("epochs"),
            "{missing}"
        );
        let eps = c["claimed_epsilon"].as_f64().unwrap();
        for ep in ["10", "50"] {
            let s = calibration(c, &format!("sigma_poisson_rdp_epochs{ep}")).expect("calibrated σ");
            assert!(s > 0.3 && s < 50.0, "{s}");
            let t1 = calibration(c, &format!("theorem1_epsilon_at_calibrated_sigma_epochs{ep}")).unwrap();
            assert!(t1 > 100.0 * eps, "{} epochs {ep}: Theorem 1 ε {t1}", c["id"]);
        }
    }
    // The MNIST ε = 1 row over 10 epochs needs σ ≈ 0.8–1 (dpsgd.csv: σ = 1 gives RDP ε 0.80).
    let c = claim(&v, "rapid-mnist-eps1");
    let s = calibration(c, "sigma_poisson_rdp_epochs10").unwrap();
    assert!(s > 0.8 && s < 1.0, "{s}");
}

/// DPAgg-TI (dpagg_ti.csv, n = 158): σ of eq. (6), exact ε (analytic Gaussian), eq. (3) on the
/// target, eq. (3) at the claimed δ with the best split (never above eq. (3) at δ' on the exact
/// ε), RDP without replacement at the claimed δ; every claim holds.
#[test]
fn dpagg_ti_reproduces_reference() {
    let (code, v) = verify_json("fixtures/claims/dpagg-ti.toml");
    assert_eq!(code, 0);
    for row in read_csv("fixtures/reference/dpagg_ti.csv") {
        let m = row["m"].as_str();
        let eps: f64 = f(&row, "eps_target");
        let c = claim(&v, &format!("eve-m{m}-eps{eps}"));
        assert_eq!(c["verdict"], "holds");
        let i = "eq6_sigma";
        let exact = analysis(c, i, "exact_gaussian_no_amplification").unwrap();
        assert!(rel(exact, f(&row, "eps_exact_gaussian_at_delta(analytic_BalleWang)")) < 1e-9);
        let best = analysis(c, i, "eq3_best_split").unwrap();
        assert!(
            best <= f(&row, "eps_amplified_using_exact_eps") * (1.0 + 1e-9),
            "{best}"
        );
        let amp_t = analysis(c, i, "eq3_amplified_target").unwrap();
        assert!(rel(amp_t, f(&row, "eps_amplified_classic=log(1+(m/n)(e^eps-1))")) < 1e-9);
        // RDP for sampling without replacement (WBK 2019 Thm 9), now at the claimed δ.
        let rdp = analysis(c, i, "rdp").unwrap();
        // ε = 0 is a valid answer at these large δ (= 1/n): for m = 4 the amplified δ(0) is
        // already below the claimed δ.
        assert!(rdp.is_finite() && rdp >= 0.0, "m={m} ε={eps}: {rdp}");
        // Validity range: ε ≥ 1 is outside the classic formula's stated range, yet sound here.
        let checks = c["checks"].as_array().unwrap();
        let range = checks.iter().find(|k| k["code"] == "classic_formula_range").unwrap();
        assert_eq!(
            range["ok"].as_bool().unwrap(),
            row["classic_formula_valid(eps<1)"] == "True"
        );
        let sound = checks.iter().find(|k| k["code"] == "classic_formula_sound").unwrap();
        assert_eq!(
            sound["ok"].as_bool().unwrap(),
            row["classic_sound(exact<=target)"] == "True"
        );
    }
    // Paris (n = 47) claims hold too.
    assert!(v["claims"].as_array().unwrap().iter().all(|c| c["verdict"] == "holds"));
}

/// dpagg_ti_classic_validity.csv: exact ε of the classic σ and the crossover target ε beyond
/// which the classic formula is unsound, for four δ.
#[test]
fn classic_gaussian_validity_and_crossover() {
    for row in read_csv("fixtures/reference/dpagg_ti_classic_validity.csv") {
        let (d, e) = (f(&row, "delta"), f(&row, "eps_target"));
        let z = dpagg_ti::classic_noise_multiplier(e, d);
        assert!(rel(z, f(&row, "noise_multiplier")) < 1e-12);
        let exact = dpagg_ti::exact_epsilon(z, d).unwrap();
        let want = f(&row, "eps_exact");
        if want == 0.0 {
            assert!(exact < 1e-9, "{exact}");
        } else {
            assert!(rel(exact, want) < 1e-8, "δ={d} ε={e}: {exact} vs {want}");
        }
        assert_eq!(exact <= e, row["sound"] == "True");
        let cross = dpagg_ti::classic_crossover(d).unwrap();
        let want = f(&row, "crossover_eps_where_exact_equals_target");
        assert!(
            rel(cross, want) < 1e-9 && cross <= want * (1.0 + 1e-12),
            "{cross} vs {want}"
        );
    }
}

#[test]
fn dp_rdm_all_published_rows_get_a_verdict() {
    let o = dpaudit(&["verify", "fixtures/claims/dp-rdm.toml", "--format", "csv"]);
    let code = o.status.code().unwrap();
    assert!(code == 0 || code == 1, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("claim,pipeline,dataset"), "{out}");
    // 41 claims × 2 interpretations × (gdp is n/a; rdp, pld, rdp classic) rows.
    let lines = out.lines().count();
    assert!(lines > 41 * 2 * 3, "{lines}");
    let not_all_hold = out.lines().skip(1).any(|l| l.split(',').nth(5) != Some("holds"));
    assert_eq!(code == 1, not_all_hold);
}

#[test]
fn verify_formats_and_help() {
    for fmt in ["text", "md", "html", "json", "csv"] {
        let o = dpaudit(&["verify", "fixtures/claims/dpagg-ti.toml", "--format", fmt]);
        assert_eq!(o.status.code(), Some(0), "{fmt}: {}", stderr(&o));
        assert!(!o.stdout.is_empty());
    }
    let md = stdout(&dpaudit(&[
        "verify",
        "fixtures/claims/dp-rdm-cifar10.toml",
        "--format",
        "md",
    ]));
    assert!(md.contains("cifar10-T1-eps10 (dp_rdm)") && md.contains("PASS"), "{md}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = dpaudit(&["verify", "fixtures/claims/dpagg-ti.toml", "--out", d]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for f in [
        "report.json",
        "report.md",
        "report.html",
        "verify.json",
        "report-claims.csv",
        "report-analyses.csv",
    ] {
        assert!(dir.path().join(f).exists(), "{f}");
    }
    let rep = dpaudit::report::from_json(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(rep.verdicts.len(), 32);
    assert!(rep
        .verdicts
        .iter()
        .all(|v| v.status == dpaudit::accountants::sound::Verdict::Holds));
    // A second run refuses to overwrite without --force.
    let o = dpaudit(&["verify", "fixtures/claims/dpagg-ti.toml", "--out", d]);
    assert_eq!(o.status.code(), Some(2));
    let o = dpaudit(&["verify", "fixtures/claims/dpagg-ti.toml", "--out", d, "--force"]);
    assert_eq!(o.status.code(), Some(0));
    let h = stdout(&dpaudit(&["verify", "--help"]));
    assert!(h.contains("dpaudit verify fixtures/claims/dp-rdm.toml"), "{h}");
    let h = stdout(&dpaudit(&["run", "dpagg-ti", "--help"]));
    assert!(
        h.contains("dpaudit run dpagg-ti fixtures/runs/dpagg-ti-digits.toml"),
        "{h}"
    );
}

// ------------------------------------------------------------------------------------------
// bad claims files → exit 2 with file:line and field

const GOOD: &str = r#"schema_version = 1

[[dp_rdm]]
id = "x"
source = "test"
dataset = "CIFAR-10"
n = 50000
queries = 10
q = 0.01
sigma = 0.05
k = 16
epsilon = 10.0
delta = 2e-5
"#;

fn bad(src: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("claims.toml");
    std::fs::write(&p, src).unwrap();
    let o = dpaudit(&["verify", p.to_str().unwrap()]);
    (o.status.code().unwrap(), stderr(&o))
}

#[test]
fn bad_claims_exit_2_with_file_line_field() {
    let cases = [
        (GOOD.replace("sigma = 0.05", "sigma = -0.05"), ":10:", "dp_rdm[0].sigma"),
        (GOOD.replace("q = 0.01", "q = 1.5"), ":9:", "dp_rdm[0].q"),
        (GOOD.replace("k = 16", "k = 0"), ":11:", "dp_rdm[0].k"),
        (GOOD.replace("delta = 2e-5", "delta = 1.0"), ":13:", "dp_rdm[0].delta"),
        (GOOD.replace("delta = 2e-5", "delta = 3.5"), ":13:", "dp_rdm[0].delta"),
        (GOOD.replace("epsilon = 10.0\n", ""), ":", "dp_rdm[0].epsilon"),
        (
            GOOD.replace("k = 16", "k = 16\nneighbors = 3"),
            ":12:",
            "dp_rdm[0].neighbors",
        ),
        (
            GOOD.replace("schema_version = 1", "schema_version = 2"),
            ":1:",
            "schema_version",
        ),
    ];
    for (src, line, field) in cases {
        let (code, err) = bad(&src);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("claims.toml"), "{err}");
        assert!(err.contains(line), "{line}: {err}");
        assert!(err.contains(&format!("field `{field}`")), "{field}: {err}");
    }
    let (code, err) = bad("schema_version = 1\n");
    assert_eq!(code, 2, "{err}");
    let o = dpaudit(&["verify", "fixtures/claims/does-not-exist.toml"]);
    assert_eq!(o.status.code(), Some(2));
}

// ------------------------------------------------------------------------------------------
// mechanisms: noise distribution, ledgers, refusal past budget

/// Mean and variance of the DPAgg-TI noise (output − centroid of the drawn subsample) match σ:
/// N·d = 4000·16 draws; |mean| < 4 s.e., |var/σ² − 1| < 4·√(2/(N·d)).
#[test]
fn dpagg_ti_noise_matches_sigma() {
    let raw = embeddings("digits-proj16-label3.csv");
    let mech = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Classic, None, Fault::None).unwrap();
    let want = 2.0 / 16.0 * dpagg_ti::classic_noise_multiplier(1.0, 1.0 / 183.0);
    assert!(rel(mech.sigma, want) < 1e-12);
    let mut r = mechanisms::rng(11);
    let (mut s1, mut s2, mut cnt) = (0.0, 0.0, 0.0);
    for _ in 0..4000 {
        let (idx, out) = mech.release_on(&mech.data.rows, &mut r);
        assert_eq!(idx.len(), 16);
        let c = mech.centroid(&mech.data.rows, &idx);
        for (o, c) in out.iter().zip(&c) {
            let e = o - c;
            s1 += e;
            s2 += e * e;
            cnt += 1.0;
        }
    }
    let mean = s1 / cnt;
    let var = s2 / cnt - mean * mean;
    let sig2 = mech.sigma * mech.sigma;
    assert!(mean.abs() < 4.0 * mech.sigma / cnt.sqrt(), "mean {mean}");
    assert!(
        (var / sig2 - 1.0).abs() < 4.0 * (2.0 / cnt).sqrt(),
        "var {var} vs {sig2}"
    );
    // The exact calibration gives a smaller σ with exact ε equal to the target.
    let ex = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Exact, None, Fault::None).unwrap();
    assert!(ex.sigma < mech.sigma);
    let e = dpagg_ti::exact_epsilon(ex.noise_multiplier, 1.0 / 183.0).unwrap();
    assert!(e <= 1.0 && e > 1.0 - 1e-9, "{e}");
}

/// DP-RDM with q = 1 (so the aggregate is deterministic): z − (1/k)Σ top-k has mean 0 and
/// variance σ².
#[test]
fn dp_rdm_noise_matches_sigma() {
    let private = embeddings("digits-proj16-private.csv").normalised().unwrap();
    let public = embeddings("digits-proj16-public.csv").normalised().unwrap();
    let queries = embeddings("digits-proj16-queries.csv").normalised().unwrap();
    let mech = DpRdm {
        private,
        public,
        k: 8,
        q: 1.0,
        sigma: 0.05,
        lambda: 0.8,
    };
    let all: Vec<usize> = (0..mech.private.len()).collect();
    let mut r = mechanisms::rng(5);
    let (mut s1, mut s2, mut cnt) = (0.0, 0.0, 0.0);
    for rep in 0..10 {
        for y in &queries.rows {
            let a = mech.answer_on(&mech.private.rows, y, &mut r);
            assert_eq!(a.sampled, mech.private.len());
            assert_eq!(a.interpolated.len(), 8);
            let agg = mech.aggregate(&mech.private.rows, &all, y);
            if rep == 0 {
                // Interpolation: e = (1 − λ)·O + λ·z for the first public neighbour.
                let o = &mech.public.rows[mechanisms::top_k(&mech.public.rows, &(0..397).collect::<Vec<_>>(), y, 8)[0]];
                let e0: Vec<f64> = o.iter().zip(&a.z).map(|(o, z)| 0.2 * o + 0.8 * z).collect();
                assert!(e0.iter().zip(&a.interpolated[0]).all(|(x, y)| (x - y).abs() < 1e-12));
            }
            for (z, g) in a.z.iter().zip(&agg) {
                let e = z - g;
                s1 += e;
                s2 += e * e;
                cnt += 1.0;
            }
        }
    }
    let mean = s1 / cnt;
    let var = s2 / cnt - mean * mean;
    assert!(mean.abs() < 4.0 * 0.05 / cnt.sqrt(), "mean {mean}");
    assert!((var / 0.0025 - 1.0).abs() < 4.0 * (2.0 / cnt).sqrt(), "var {var}");
}

/// `dpaudit run dpagg-ti` writes a ledger `account/check` can read, with the releases that ran
/// and the refusal past the budget (GDP exact, no amplification: r releases cost
/// ε(μ = √r/z) — the largest r within 1.2 is computed here independently).
#[test]
fn dpagg_ti_run_ledger_and_budget() {
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&[
        "run",
        "dpagg-ti",
        "fixtures/runs/dpagg-ti-digits.toml",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let z = dpagg_ti::classic_noise_multiplier(1.0, 1.0 / 183.0);
    let delta = 1.0 / 183.0;
    let allowed = (1..=5u64)
        .filter(|&r| gdp::epsilon_for_delta((r as f64).sqrt() / z, delta).unwrap() <= 1.2)
        .max()
        .unwrap();
    assert!(allowed < 5, "the shipped budget must refuse some releases ({allowed})");
    let ledger = EventFile::load(&dir.path().join("ledger.toml")).unwrap();
    assert_eq!(ledger.neighbouring, Neighbouring::ReplaceOne);
    assert!(rel(ledger.delta.unwrap(), delta) < 1e-15);
    let one = DpEvent::SampledWithoutReplacement {
        n: 183,
        m: 16,
        event: Box::new(DpEvent::gaussian(z)),
    };
    let want = if allowed == 1 {
        one
    } else {
        DpEvent::repeat(one, allowed)
    };
    match (&ledger.event, &want) {
        (DpEvent::SelfComposed { event: a, count: ca }, DpEvent::SelfComposed { event: b, count: cb }) => {
            assert_eq!(ca, cb);
            let (
                DpEvent::SampledWithoutReplacement { event: ga, .. },
                DpEvent::SampledWithoutReplacement { event: gb, .. },
            ) = (a.as_ref(), b.as_ref())
            else {
                panic!("{:?}", ledger.event)
            };
            let (DpEvent::Gaussian { noise_multiplier: za }, DpEvent::Gaussian { noise_multiplier: zb }) =
                (ga.as_ref(), gb.as_ref())
            else {
                panic!()
            };
            assert!(rel(*za, *zb) < 1e-12);
        }
        _ => panic!("{:?} vs {:?}", ledger.event, want),
    }
    let run: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(run["run"]["released"].as_u64(), Some(allowed));
    assert_eq!(run["run"]["refused"].as_u64(), Some(5 - allowed));
    let outputs = std::fs::read_to_string(dir.path().join("outputs.csv")).unwrap();
    assert_eq!(outputs.lines().count() as u64, allowed + 1);
    // The ledger is accountable: RDP on it (sampling without replacement) is below the charge.
    let rdp = AccountantKind::Rdp
        .build()
        .epsilon(&ledger.event, ledger.neighbouring, delta)
        .unwrap();
    assert!(rdp.epsilon <= run["run"]["budget_charge"].as_f64().unwrap() + 1e-9);
    // The run's one ε is the ledger's (only RDP accounts sampling without replacement).
    assert_eq!(run["epsilon"].as_f64(), Some(rdp.epsilon));
}

/// Issue 49: one ε for one run — the text, the ledger's header, run.json and the report all
/// state the number `dpaudit account --event ledger.toml` gives as its headline, at its δ.
#[test]
fn a_run_states_one_epsilon_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = dpaudit(&[
        "run",
        "dpagg-ti",
        "fixtures/runs/dpagg-ti-digits.toml",
        "--seed",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--format",
        "text",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let acc = dpaudit(&[
        "account",
        "--event",
        out.join("ledger.toml").to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(acc.status.code(), Some(0), "{}", stderr(&acc));
    let acc: Value = serde_json::from_slice(&acc.stdout).unwrap();
    let sound: Vec<(f64, f64)> = acc["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| matches!(r["kind"].as_str(), Some("exact" | "upper_bound")))
        .map(|r| (r["epsilon"].as_f64().unwrap(), r["delta"].as_f64().unwrap()))
        .collect();
    let (eps, delta) = sound
        .iter()
        .copied()
        .fold((f64::INFINITY, 0.0), |a, b| if b.0 < a.0 { b } else { a });
    assert!(eps.is_finite(), "{acc}");
    let line = format!(
        "epsilon of this run = {} at delta = {}",
        dpaudit::report::num::fmt_num(eps),
        dpaudit::report::num::fmt_num(delta)
    );
    let text = stdout(&o);
    assert!(text.contains(&line), "text: {text}");
    assert!(!text.contains("epsilon charged"), "a second ε in the text: {text}");
    let ledger = std::fs::read_to_string(out.join("ledger.toml")).unwrap();
    assert!(ledger.contains(&format!("# {line}")), "ledger: {ledger}");
    let run: Value = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["epsilon"].as_f64(), Some(eps));
    assert_eq!(run["delta"].as_f64(), Some(delta));
    let rep: Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let guarantee = rep["conclusion"]["guarantee"].as_str().unwrap();
    assert!(
        guarantee.contains(&format!("ε = {}", dpaudit::report::num::fmt_num(eps))),
        "{guarantee}"
    );
    assert!(!guarantee.contains("No guarantee"), "{guarantee}");
}

/// DP-RDM: queries are charged before they are answered; the first query that would take the
/// RDP ε past the budget and all after it are refused; the ledger holds exactly the answered ones.
#[test]
fn dp_rdm_run_refuses_past_budget() {
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&[
        "run",
        "dp-rdm",
        "fixtures/runs/dp-rdm-digits.toml",
        "--out",
        dir.path().to_str().unwrap(),
        "--audit",
        "--audit-trials",
        "100",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let run: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("run.json")).unwrap()).unwrap();
    let answered = run["run"]["answered"].as_u64().unwrap();
    let refused = run["run"]["refused"].as_u64().unwrap();
    assert_eq!(answered + refused, 200);
    assert!(answered > 0 && refused > 0, "answered {answered}, refused {refused}");
    // Independent check with the RDP accountant: T answered fit in 6, T + 1 do not.
    let delta = 1.0 / 1200.0;
    let step = DpEvent::poisson(0.1, DpEvent::gaussian(0.25 * 8.0 / 2.0));
    let acc = AccountantKind::Rdp.build();
    let eps = |t: u64| {
        acc.epsilon(&DpEvent::repeat(step.clone(), t), Neighbouring::AddRemove, delta)
            .unwrap()
            .epsilon
    };
    assert!(eps(answered) <= 6.0 && eps(answered + 1) > 6.0, "{answered}");
    // dp-accounting 0.6.0 RDP (default orders): 100 queries cost 5.751, 150 cost 7.147.
    assert!(answered > 100 && answered < 150, "{answered}");
    let ledger = EventFile::load(&dir.path().join("ledger.toml")).unwrap();
    assert_eq!(ledger.event, DpEvent::repeat(step, answered));
    assert!(run["sensitivity"]["ok"].as_bool().unwrap());
}

// ------------------------------------------------------------------------------------------
// audits

#[test]
fn sensitivity_audit_catches_unnormalised_embeddings() {
    let raw = embeddings("digits-proj16-label3.csv");
    let ok = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Classic, None, Fault::None).unwrap();
    let r = audit::dpagg_ti_sensitivity(&ok, 300, 1);
    assert!(r.ok && r.ratio > 0.99, "{r:?}");
    let broken = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Classic, None, Fault::SkipNormalisation).unwrap();
    let r = audit::dpagg_ti_sensitivity(&broken, 300, 1);
    assert!(!r.ok && r.ratio > 10.0, "{r:?}");
    // DP-RDM with unit vectors stays within 2/k.
    let mech = DpRdm {
        private: embeddings("digits-proj16-private.csv").normalised().unwrap(),
        public: embeddings("digits-proj16-public.csv").normalised().unwrap(),
        k: 8,
        q: 0.1,
        sigma: 0.05,
        lambda: 0.8,
    };
    let qs = embeddings("digits-proj16-queries.csv").normalised().unwrap();
    let r = audit::dp_rdm_sensitivity(&mech, &qs.rows, 200, 2);
    assert!(r.ok && r.ratio > 0.5, "{r:?}");
}

/// The distinguishing audit: ε_lower ≤ ε_upper for the correct mechanism (also at a large ε
/// where the lower bound is far from 0), and ε_lower > ε_upper for both injected faults.
#[test]
fn distinguishing_audit_bounds_and_catches_faults() {
    let raw = embeddings("digits-proj16-label3.csv");
    let delta = 1.0 / 183.0;
    let upper = |m: &DpaggTi| {
        AccountantKind::Gdp
            .build()
            .epsilon(&DpEvent::gaussian(m.noise_multiplier), Neighbouring::ReplaceOne, delta)
            .unwrap()
            .epsilon
    };
    for target in [1.0, 20.0] {
        let ok = DpaggTi::new(&raw, 16, target, None, SigmaRule::Classic, None, Fault::None).unwrap();
        let r = audit::dpagg_ti_distinguishing(&ok, 4000, upper(&ok), 0.05, 3).unwrap();
        assert!(!r.violation && r.outcome.epsilon_lower <= r.epsilon_upper, "{r:?}");
        if target == 20.0 {
            assert!(
                r.outcome.epsilon_lower > 3.0,
                "a weak mechanism must show a real lower bound: {r:?}"
            );
        }
    }
    for fault in [Fault::SkipNormalisation, Fault::NoiseForFullN] {
        let broken = DpaggTi::new(&raw, 16, 1.0, None, SigmaRule::Classic, None, fault).unwrap();
        let r = audit::dpagg_ti_distinguishing(&broken, 4000, upper(&broken), 0.05, 3).unwrap();
        assert!(
            r.violation && r.outcome.epsilon_lower > 2.0 * r.epsilon_upper,
            "{fault:?}: {r:?}"
        );
    }
    // Through the CLI: exit 1 when the audit fails.
    let o = dpaudit(&[
        "run",
        "dpagg-ti",
        "fixtures/runs/dpagg-ti-digits.toml",
        "--audit",
        "--audit-runs",
        "2000",
        "--inject-fault",
        "skip-normalisation",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("LEAKS MORE THAN ACCOUNTED"));
}

// ------------------------------------------------------------------------------------------
// [[dp_sgd]] claims: Opacus' vocabulary, judged as `account` accounts the same job

/// The smallest sound ε (`exact` or `upper_bound`) of `dpaudit account … --format json`.
fn account_headline(args: &[String]) -> f64 {
    let mut full: Vec<&str> = vec!["account"];
    full.extend(args.iter().map(String::as_str));
    full.extend(["--format", "json", "-q"]);
    let o = dpaudit(&full);
    assert_eq!(o.status.code(), Some(0), "{full:?}: {}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("account json");
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "exact" || r["kind"] == "upper_bound")
        .filter_map(|r| r["epsilon"].as_f64())
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn dp_sgd_claims_match_account_on_the_same_job() {
    use dpaudit::config::claims::ClaimsFile;
    use dpaudit::config::dpsgd::BatchSampling;
    let path = "fixtures/claims/dp-sgd.toml";
    let (code, v) = verify_json(path);
    let file = ClaimsFile::load(&root().join(path)).unwrap();
    assert!(file.dp_sgd.len() >= 5 && file.claim_count() == file.dp_sgd.len());
    let mut seen = std::collections::BTreeSet::new();
    for c in &file.dp_sgd {
        let r = claim(&v, &c.id);
        assert_eq!(r["pipeline"], "dp_sgd");
        let verdict = r["verdict"].as_str().unwrap().to_string();
        seen.insert(verdict.clone());
        let Some(sigma) = c.noise_multiplier else {
            assert_eq!(verdict, "not_demonstrated", "{}", c.id);
            assert!(r["calibrations"].as_array().is_some_and(|a| !a.is_empty()), "{}", c.id);
            continue;
        };
        let (b, n) = (c.batch_size.get(), c.dataset_size.get());
        let mut args: Vec<String> = vec![
            "--noise-multiplier".into(),
            sigma.get().to_string(),
            "--delta".into(),
            c.delta.get().to_string(),
        ];
        match (c.epochs, c.steps, c.sampling) {
            (Some(e), None, s) => args.extend([
                "--epochs".into(),
                e.get().to_string(),
                "--batch-size".into(),
                b.to_string(),
                "--dataset-size".into(),
                n.to_string(),
                "--sampling".into(),
                s.as_str().into(),
            ]),
            (None, Some(t), BatchSampling::Poisson) => args.extend([
                "--steps".into(),
                t.get().to_string(),
                "--sample-rate".into(),
                (b as f64 / n as f64).to_string(),
            ]),
            other => panic!("{}: no account flags for {other:?}", c.id),
        }
        let headline = account_headline(&args);
        let stated = r["interpretations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["stated"] == true)
            .unwrap_or_else(|| panic!("{}: no stated interpretation", c.id));
        let upper = stated["sound"]["upper"]["epsilon"].as_f64().unwrap();
        assert!(
            rel(upper, headline) < 1e-12,
            "{}: verify {upper} vs account {headline}",
            c.id
        );
        let claimed = c.epsilon.get();
        if headline <= claimed {
            assert_eq!(verdict, "holds", "{}: account ε = {headline} ≤ {claimed}", c.id);
            assert_eq!(r["evidence"]["epsilon"].as_f64(), Some(headline), "{}", c.id);
        } else {
            assert_ne!(verdict, "holds", "{}: account ε = {headline} > {claimed}", c.id);
            if verdict == "violated" {
                let lower = r["evidence"]["epsilon"].as_f64().unwrap();
                assert!(lower > claimed && lower <= headline, "{}: lower {lower}", c.id);
            }
        }
    }
    // The fixture shows every verdict, and the exit code says a claim failed.
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["holds", "not_demonstrated", "violated"]
    );
    assert_eq!(code, 1);
}

#[test]
fn dp_sgd_output_speaks_of_dp_sgd_only_and_help_lists_every_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = dpaudit(&["verify", "fixtures/claims/dp-sgd.toml", "--out", d, "-q"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let mut texts = vec![stdout(&o)];
    for f in ["report.md", "report.html", "report.json", "verify.json", "verify.csv"] {
        texts.push(std::fs::read_to_string(dir.path().join(f)).unwrap());
    }
    for t in &texts {
        for word in ["RAPID", "rapid", "Theorem 1", "Algorithm 2"] {
            assert!(!t.contains(word), "`{word}` in the output of a [[dp_sgd]] file:\n{t}");
        }
    }
    assert!(
        texts[0].contains("[dp_sgd]") && texts[0].contains("poisson_add_remove"),
        "{}",
        texts[0]
    );
    let h = stdout(&dpaudit(&["verify", "--help"]));
    for (t, _) in dpaudit::config::claims::TABLES {
        assert!(h.contains(&format!("[[{t}]]")), "verify --help lacks [[{t}]]:\n{h}");
    }
}
