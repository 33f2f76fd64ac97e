//! Verdicts an auditor can sign: holds / violated / not_demonstrated, each with its evidence,
//! and labels that name the accountant and kind that really computed every number.

use serde_json::Value;

use super::common::{dpaudit, rel, stderr, stdout};
use dpaudit::accountants::pld::PldAccountant;
use dpaudit::accountants::rdp::RdpAccountant;
use dpaudit::accountants::sound::{self, Verdict};
use dpaudit::accountants::{clt::CltAccountant, gdp, Accountant, BoundKind};
use dpaudit::config::claims::{ClaimsFile, DpRdmClaim, DpaggTiClaim};
use dpaudit::events::{DpEvent, Neighbouring};
use dpaudit::pipelines::{self, dp_rdm, dpagg_ti};

const SHIPPED_CLAIMS: [&str; 6] = [
    "fixtures/claims/rapid.toml",
    "fixtures/claims/rapid-scenarios.toml",
    "fixtures/claims/dp-rdm.toml",
    "fixtures/claims/dp-rdm-cifar10.toml",
    "fixtures/claims/dpagg-ti.toml",
    "fixtures/claims/diffusion-sampling.toml",
];

fn verify_json(file: &str) -> (i32, Value) {
    // The detailed record verify.json (in --out DIR); stdout's JSON is the shared report.
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&["verify", file, "--out", dir.path().to_str().unwrap(), "-q"]);
    let code = o.status.code().unwrap();
    assert!(code == 0 || code == 1, "{file}: exit {code}: {}", stderr(&o));
    let detail = std::fs::read_to_string(dir.path().join("verify.json")).unwrap();
    (
        code,
        serde_json::from_str(&detail).unwrap_or_else(|e| panic!("{file}: {e}")),
    )
}

/// Every shipped claims file through the real binary: each `violated` (claim or interpretation)
/// carries a sound lower bound above the claim as its evidence; each `holds` an upper bound at or
/// below it; and `verify` exits 1 exactly when some claim is not `holds`.
#[test]
fn every_violated_verdict_in_shipped_claims_has_a_lower_bound_witness() {
    let mut violated = 0;
    for file in SHIPPED_CLAIMS {
        let (code, v) = verify_json(file);
        let claims = v["claims"].as_array().unwrap();
        let mut all_hold = true;
        for c in claims {
            let claimed = c["claimed_epsilon"].as_f64().unwrap();
            let mut decisions: Vec<(&Value, &Value)> = vec![(&c["verdict"], &c["evidence"])];
            for i in c["interpretations"].as_array().unwrap() {
                decisions.push((&i["decision"]["verdict"], &i["decision"]["evidence"]));
            }
            for (verdict, ev) in decisions {
                match verdict.as_str().unwrap() {
                    "violated" => {
                        violated += 1;
                        let kind = ev["kind"].as_str().unwrap_or("");
                        assert!(
                            kind == "lower_bound" || kind == "exact",
                            "{file} {}: violated with evidence kind `{kind}`",
                            c["id"]
                        );
                        assert!(ev["epsilon"].as_f64().unwrap_or(f64::INFINITY) > claimed, "{}", c["id"]);
                    }
                    "holds" => {
                        let kind = ev["kind"].as_str().unwrap_or("");
                        assert!(kind == "upper_bound" || kind == "exact", "{file} {}: {kind}", c["id"]);
                        assert!(ev["epsilon"].as_f64().unwrap() <= claimed, "{}", c["id"]);
                    }
                    "not_demonstrated" => {}
                    other => panic!("{file}: unknown verdict {other}"),
                }
            }
            all_hold &= c["verdict"] == "holds";
        }
        assert_eq!(code == 0, all_hold, "{file}: exit {code}");
    }
    // The diffusion-sampling file alone has dozens of violated claims.
    assert!(violated > 40, "{violated}");
}

fn dp_rdm_claims() -> Vec<DpRdmClaim> {
    ClaimsFile::load(&super::common::root().join("fixtures/claims/dp-rdm.toml"))
        .unwrap()
        .dp_rdm
}

/// DP-RDM: for every shipped row that holds at its published k, a claim with k one below the
/// smallest k that the tightest sound analysis (Δ = 2/k) supports holds under no interpretation.
#[test]
fn dp_rdm_k_one_below_the_sound_minimum_never_holds() {
    let mut tried = 0;
    for c in dp_rdm_claims() {
        if c.lambda.is_some_and(|l| l.get() == 0.0) {
            continue;
        }
        let kmin = dp_rdm::k_min_sound(&c, c.k.get()).unwrap();
        let Some(kmin) = kmin else { continue };
        if kmin < 2 {
            continue;
        }
        let mut below = c.clone();
        below.k = dpaudit::config::claims::Count(kmin - 1);
        let r = dp_rdm::verify(&below).unwrap();
        assert_ne!(r.verdict, Verdict::Holds, "{}", c.id);
        for i in &r.interpretations {
            assert_ne!(i.decision.verdict, Verdict::Holds, "{} under {}", c.id, i.id);
            assert!(i.upper_epsilon().unwrap() > c.epsilon.get(), "{} {}", c.id, i.id);
        }
        // And at k_min itself the tightest sound bound meets the claim.
        let ev = dp_rdm::event(c.sigma.get(), kmin, c.q.get(), c.queries.get(), 2.0);
        let s = sound::sound_epsilon(&ev, Neighbouring::AddRemove, c.delta.get());
        assert!(s.upper.unwrap().epsilon <= c.epsilon.get(), "{}", c.id);
        tried += 1;
    }
    assert!(tried >= 30, "{tried}");
}

/// DP-RDM on the shipped digits embeddings: the measured change when a record is added, removed
/// or replaced stays within every analysed Δ = 2/k, and the add/remove change exceeds 1/k (so
/// 1/k is not a bound).
#[test]
fn dp_rdm_digits_measured_sensitivity_within_analysed_delta() {
    use dpaudit::pipelines::embeddings::Embeddings;
    use dpaudit::pipelines::mechanisms::DpRdm;
    let load = |n: &str| Embeddings::load_csv(&super::common::root().join("fixtures/embeddings").join(n)).unwrap();
    let private = load("digits-proj16-private.csv").normalised().unwrap();
    let public = load("digits-proj16-public.csv").normalised().unwrap();
    let queries = load("digits-proj16-queries.csv").normalised().unwrap();
    let k = 8;
    let mech = DpRdm {
        private,
        public,
        k,
        q: 0.5,
        sigma: 0.05,
        lambda: 0.5,
    };
    let r = dpaudit::pipelines::audit::dp_rdm_sensitivity(&mech, &queries.rows, 200, 7);
    assert_eq!(r.comparisons.len(), 3);
    for c in r.comparisons.iter().filter(|c| c.analysed == 2.0 / k as f64) {
        assert!(c.ok, "{c:?}");
    }
    let ar = r.max_change_add_remove.unwrap();
    assert!(ar > 1.0 / k as f64 && ar <= 2.0 / k as f64 * (1.0 + 1e-9), "{ar}");
    assert!(
        !r.comparisons[2].ok,
        "the 1/k what-if must fail: {:?}",
        r.comparisons[2]
    );
}

/// DPAgg-TI: a claim whose σ meets the target at the claimed δ (eq. 3 with the best δ split) but
/// not at δ' = (m/n)δ holds.
#[test]
fn dpagg_ti_holds_at_the_claimed_delta_not_only_at_delta_prime() {
    let (n, m, eps, delta) = (158u64, 16u64, 1.0, 1.0 / 158.0);
    let z = dpagg_ti::calibrate_at_rate(eps, delta, m, n).unwrap().unwrap();
    // At δ' (the old accounting): eq. (3) on the exact ε at δ' misses the target.
    let (e_at_dprime, _) =
        dpagg_ti::amplify_without_replacement(dpagg_ti::exact_epsilon(z, delta).unwrap(), delta, m, n);
    assert!(e_at_dprime > eps, "{e_at_dprime}");
    let claim = DpaggTiClaim {
        id: "t".into(),
        source: "test".into(),
        dataset: "test".into(),
        n: dpaudit::config::claims::Count(n),
        m: dpaudit::config::claims::Count(m),
        epsilon: dpaudit::config::claims::Epsilon(eps),
        delta: dpaudit::config::claims::Delta(delta),
        sigma: Some(dpaudit::config::claims::Positive(z * 2.0 / m as f64)),
        sum_sensitivity: None,
        notes: None,
    };
    let r = dpagg_ti::verify(&claim).unwrap();
    assert_eq!(r.verdict, Verdict::Holds, "{}", r.describe());
    let ev = r.evidence.unwrap();
    assert!(ev.epsilon <= eps && ev.delta <= delta);
}

/// DPAgg-TI paper claims: both σ readings are accounted; a violation needs the worst-case-pair
/// witness; the calibrated reading holds everywhere it exists.
#[test]
fn dpagg_ti_both_sigma_readings() {
    let f = ClaimsFile::load(&super::common::root().join("fixtures/claims/dpagg-ti.toml")).unwrap();
    for c in &f.dpagg_ti {
        let r = dpagg_ti::verify(c).unwrap();
        assert!(r.interpretation("eq6_sigma").is_some_and(|i| i.stated), "{}", c.id);
        if let Some(i) = r.interpretation("calibrated_at_rate") {
            assert_eq!(i.decision.verdict, Verdict::Holds, "{}", c.id);
        }
        if r.verdict == Verdict::Violated {
            let e = r.evidence.as_ref().unwrap();
            assert!(
                e.kind == BoundKind::LowerBound && e.epsilon > c.epsilon.get(),
                "{}",
                c.id
            );
        }
    }
}

/// The diffusion-sampling claims file: all 48 Table 4 cells (and Table 1) reproduced within the
/// paper's three decimals as CLT estimates; Figure 6's μ ≈ 787.6; the p = 2e-5 rows violated
/// with the δ ≥ 1 − (1 − p)^T ≈ 0.18 witness.
#[test]
fn diffusion_sampling_tables_reproduced_and_judged() {
    let f = ClaimsFile::load(&super::common::root().join("fixtures/claims/diffusion-sampling.toml")).unwrap();
    let t4: Vec<_> = f
        .diffusion_sampling
        .iter()
        .filter(|c| c.id.starts_with("table4-") || c.id == "table1-ours")
        .collect();
    assert_eq!(t4.len(), 49);
    for c in t4 {
        let r = pipelines::diffusion_sampling::verify(c).unwrap();
        let rep = r.reproduction.as_ref().unwrap();
        assert_eq!(rep.kind, BoundKind::Estimate);
        assert!(rep.within_rounding, "{}: paper {} vs {}", c.id, rep.paper, rep.computed);
        if c.p.get() == 2e-5 && c.switch_at.unwrap().get() >= 0.83 {
            assert_eq!(r.verdict, Verdict::Violated, "{}: {}", c.id, r.describe());
            let e = r.evidence.as_ref().unwrap();
            assert_eq!(e.kind, BoundKind::LowerBound);
            assert!(e.note.contains("0.181"), "{}", e.note);
            // The proven δ floor at the claimed ε is ≥ 0.18.
            let ev = pipelines::diffusion_sampling::event(c);
            let floor = sound::delta_floor(
                &sound::pair_steps(&ev, Neighbouring::AddRemove),
                c.epsilon.unwrap().get(),
            );
            assert!(floor >= 0.18, "{}: {floor}", c.id);
        }
    }
    let fig6 = f
        .diffusion_sampling
        .iter()
        .find(|c| c.id == "figure6-fullbatch-mu")
        .unwrap();
    let mu = pipelines::diffusion_sampling::full_batch_mu(fig6);
    assert!((mu - 787.6).abs() < 0.05, "{mu}");
    let r = pipelines::diffusion_sampling::verify(fig6).unwrap();
    assert!(r.reproduction.unwrap().within_rounding);
    assert_eq!(r.verdict, Verdict::Holds);
}

/// The number an accountant computes for `event`, recomputed independently of any fallback.
fn oracle(accountant: &str, event: &DpEvent, nb: Neighbouring, delta: f64) -> Option<f64> {
    match accountant {
        "pld" => Some(PldAccountant::default().compose_event(event, nb).ok()?.epsilon(delta)),
        "rdp" => RdpAccountant::default()
            .epsilon(event, nb, delta)
            .ok()
            .map(|r| r.epsilon),
        "gdp" => GdpOracle::eps(event, delta),
        "clt" => CltAccountant.epsilon(event, nb, delta).ok().map(|r| r.epsilon),
        _ => None,
    }
}

struct GdpOracle;
impl GdpOracle {
    /// Exact GDP for full-batch events; for subsampled ones the full-batch μ (an upper bound).
    fn eps(event: &DpEvent, delta: f64) -> Option<f64> {
        let mu = gdp::composed_mu(event)
            .ok()
            .or_else(|| dpaudit::attacks::theory::mu_without_amplification(event))?;
        gdp::epsilon_for_delta(mu, delta).ok()
    }
}

/// Walks `v`, calling `f` on every object with `accountant`, `kind`, `epsilon` and `delta`,
/// together with the nearest enclosing `event` and `neighbouring`.
fn walk<'a>(v: &'a Value, event: Option<&'a Value>, nb: Option<&'a Value>, f: &mut dyn FnMut(&Value, &Value, &Value)) {
    match v {
        Value::Object(m) => {
            let event = m.get("event").filter(|e| e.is_object()).or(event);
            let nb = m.get("neighbouring").filter(|n| n.is_string()).or(nb);
            if m.contains_key("accountant")
                && m.contains_key("kind")
                && m.contains_key("epsilon")
                && m.contains_key("delta")
            {
                if let (Some(e), Some(n)) = (event, nb) {
                    f(v, e, n);
                }
            }
            for x in m.values() {
                walk(x, event, nb, f);
            }
        }
        Value::Array(a) => {
            for x in a {
                walk(x, event, nb, f);
            }
        }
        _ => {}
    }
}

/// The first value under `key` anywhere in `v` (depth first).
fn find_key<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(key).or_else(|| m.values().find_map(|x| find_key(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

/// Every command's `--format json` on shipped fixtures: each number labelled with an accountant
/// (gdp, rdp, pld, clt) and a method of the same name is what that accountant computes for the
/// event beside it, and its kind is that accountant's kind (a PLD fallback is labelled rdp, a
/// CLT number is an estimate, data-dependent numbers are labelled so).
#[test]
fn json_labels_name_the_accountant_that_computed_each_number() {
    let runs: Vec<Vec<&str>> = vec![
        vec![
            "account",
            "--noise-multiplier",
            "0.3",
            "--sample-rate",
            "1e-9",
            "--steps",
            "10000000",
            "--delta",
            "1e-300",
        ],
        vec![
            "account",
            "--noise-multiplier",
            "1.1",
            "--sample-rate",
            "0.004",
            "--steps",
            "1000",
            "--delta",
            "1e-5",
        ],
        vec![
            "check",
            "fixtures/events/dpsgd-mnist-sigma0.8.toml",
            "--max-epsilon",
            "8",
            "--no-plots",
        ],
        vec![
            "check",
            "fixtures/events/edm-fullbatch-sigmamin0.002.toml",
            "--max-epsilon",
            "8",
            "--no-plots",
        ],
        vec!["analyze", "fixtures/samplers/edm-cifar10-paper.toml"],
        vec!["analyze", "fixtures/samplers/edm-hybrid-single-step.toml"],
        vec!["analyze", "fixtures/samplers/digits-trajectories.toml"],
        vec!["verify", "fixtures/claims/rapid-scenarios.toml"],
        vec!["verify", "fixtures/claims/dpagg-ti.toml"],
    ];
    let mut checked = 0;
    for args in runs {
        let mut a = args.clone();
        a.extend(["--format", "json"]);
        let o = dpaudit(&a);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{args:?}: {}", stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let data_dependent = args.contains(&"fixtures/samplers/digits-trajectories.toml");
        // Outputs that keep the event and the relation apart from the numbers (reports) still
        // name them once: use the first found as the default.
        let ev0 = find_key(&v, "event").filter(|e| e.is_object());
        let nb0 = find_key(&v, "neighbouring").filter(|n| n.is_string());
        walk(&v, ev0, nb0, &mut |x, ev, nb| {
            let acc = x["accountant"].as_str().unwrap_or("");
            let kind = x["kind"].as_str().unwrap_or("");
            let method = x.get("method").and_then(Value::as_str).unwrap_or(acc);
            if method != acc {
                return;
            }
            let (Some(eps), Some(delta)) = (x["epsilon"].as_f64(), x["delta"].as_f64()) else {
                return;
            };
            let event: DpEvent = serde_json::from_value(ev.clone()).expect("event");
            let nb: Neighbouring = serde_json::from_value(nb.clone()).expect("neighbouring");
            if data_dependent {
                assert!(
                    kind == "data_dependent" || kind == "estimate",
                    "{args:?}: {acc} labelled {kind} on a data-dependent density"
                );
            }
            match acc {
                "clt" => assert_eq!(kind, "estimate", "{args:?}: clt labelled {kind}"),
                "pld" | "rdp" if !data_dependent => {
                    assert_eq!(kind, "upper_bound", "{args:?}: {acc} labelled {kind}")
                }
                _ => {}
            }
            if kind == "lower_bound" {
                return;
            }
            if let Some(want) = oracle(acc, &event, nb, delta) {
                assert!(
                    rel(eps, want) < 1e-9 || (eps.is_infinite() && want.is_infinite()),
                    "{args:?}: {acc} ({kind}) shows ε = {eps}, the {acc} accountant computes {want}"
                );
                checked += 1;
            }
        });
    }
    assert!(checked >= 12, "{checked}");
}

/// `check` fails whenever the sound upper bound exceeds the budget, even when a CLT estimate
/// is inside it (a CI guard errs on the safe side).
#[test]
fn check_fails_when_the_sound_bound_exceeds_the_budget() {
    let o = dpaudit(&[
        "check",
        "fixtures/events/clt-understates.toml",
        "--max-epsilon",
        "1",
        "--no-plots",
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let sound = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "upper_bound" || r["kind"] == "exact")
        .map(|r| r["epsilon"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    let budget = (sound * 0.99).max(1e-6);
    let b = budget.to_string();
    let o = dpaudit(&[
        "check",
        "fixtures/events/clt-understates.toml",
        "--max-epsilon",
        &b,
        "--no-plots",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
}

/// Shuffled batches are accounted as full-batch steps with no amplification, an event that only
/// over-approximates the run: its exact GDP ε is an upper bound on the run's, never a lower bound.
/// `verify` must not call the shuffled claim violated on it, and `account` labels it an upper
/// bound with a warning saying why.
#[test]
fn an_over_approximating_event_never_shows_a_violation() {
    let o = dpaudit(&["verify", "fixtures/claims/dp-sgd.toml", "--format", "json"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&o)));
    let shuffled = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| {
            d["subject"]
                .as_str()
                .unwrap()
                .starts_with("mnist-b256-e50-shuffle-eps10")
        })
        .expect("the shuffled claim");
    assert_eq!(shuffled["status"], "inconclusive", "{shuffled}");
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "1",
        "--epochs",
        "50",
        "--batch-size",
        "256",
        "--dataset-size",
        "60000",
        "--sampling",
        "shuffle",
        "--delta",
        "1e-5",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    for r in v["results"].as_array().unwrap() {
        assert_ne!(r["kind"], "exact", "{r}");
    }
    assert!(
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["code"] == "event_over_approximates"),
        "{}",
        v["warnings"]
    );
    assert!(
        v["conclusion"]["guarantee"]
            .as_str()
            .unwrap()
            .contains("an upper bound"),
        "{}",
        v["conclusion"]
    );
}

/// δ at ε = 3 of one Poisson step at q = 1e-10 (σ = 0.5): the true δ is about 2.9e-44 (the CLT
/// line's rigorous lower bound, confirmed with mpmath). Every sound δ stays at or above it; the
/// RDP total-variation bound once cancelled to δ = 0.
#[test]
fn sound_delta_at_a_tiny_rate_is_never_below_the_truth() {
    let o = dpaudit(&[
        "account",
        "--noise-multiplier",
        "0.5",
        "--sample-rate",
        "1e-10",
        "--steps",
        "1",
        "--epsilon",
        "3",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let results = v["results"].as_array().unwrap();
    let lower = results
        .iter()
        .find_map(|r| r["details"]["delta_lower_bound"].as_f64())
        .expect("the rigorous lower bound");
    assert!(lower > 2.9e-44 && lower < 3e-44, "{lower}");
    for r in results
        .iter()
        .filter(|r| r["kind"] == "upper_bound" || r["kind"] == "exact")
    {
        let d = r["delta"].as_f64().unwrap();
        assert!(d >= lower, "{} δ = {d} < {lower}", r["accountant"]);
    }
}

/// The one verdict's one mapping to the exit code is the documented one: every row of the table
/// in docs/reliability.md ("Exit codes") names a verdict, its exit code and its report word, and
/// `Verdict::exit_code` / `Verdict::status_word` answer the same for each; every verdict has a row.
#[test]
fn exit_codes_are_the_documented_ones() {
    let doc = std::fs::read_to_string("docs/reliability.md").unwrap();
    let mut seen = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let Some(v) = Verdict::ALL
            .into_iter()
            .find(|v| cells[0] == format!("`{}`", v.as_str()))
        else {
            continue;
        };
        let code: i32 = cells[1].parse().unwrap_or_else(|_| panic!("exit code of {v}: {line}"));
        assert_eq!(v.exit_code(), code, "{v}: docs say exit {code}");
        assert_eq!(cells[2], format!("`{}`", v.status_word()), "{v}: report word");
        seen.push(v);
    }
    assert_eq!(
        seen,
        Verdict::ALL,
        "docs/reliability.md lists every verdict once, best first"
    );
    // Through the binary: a budget that holds exits 0, one the sound bound exceeds exits 1
    // (violated), a bad flag exits 2 (unanswered).
    let ev = "fixtures/events/dpsgd.toml";
    for (budget, want) in [("100", Verdict::Holds), ("0.001", Verdict::Violated)] {
        let o = dpaudit(&["check", ev, "--max-epsilon", budget]);
        assert_eq!(o.status.code(), Some(want.exit_code()), "{budget}: {}", stderr(&o));
    }
    let o = dpaudit(&["check", ev, "--max-epsilon", "-1"]);
    assert_eq!(o.status.code(), Some(Verdict::Unanswered.exit_code()), "{}", stderr(&o));
}
