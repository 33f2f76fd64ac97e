//! Integration tests: the CLT accountant against fixtures/reference (careful scipy quadrature
//! and dp_accounting PLD, versions in fixtures/reference/versions.txt).

use super::common::{read_csv, rel};
use dpaudit::accountants::clt::{clt_summary, CltAccountant};
use dpaudit::accountants::{gdp, Accountant, BoundKind};
use dpaudit::events::{DpEvent, EventBuilder, Neighbouring};

const DELTA: f64 = 1e-5;
const TOL: f64 = 1e-6;

fn num(row: &std::collections::HashMap<String, String>, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|_| panic!("column {col}: {}", row[col]))
}

/// Per-step μ of the EDM/Karras schedule as in fixtures/reference/SOURCE.md (σ_max 80, ρ 7,
/// 50 levels, |D| = 50000, β = 1): μ_t = 2C/(β|D|)·sqrt(2Δt/t³), conventions A, B, C.
fn edm_steps(sigma_min: f64, c_label: &str, convention: &str) -> Vec<f64> {
    let (smax, rho, n) = (80.0f64, 7.0f64, 50usize);
    let t: Vec<f64> = (0..n)
        .map(|i| {
            (smax.powf(1.0 / rho) + i as f64 / (n - 1) as f64 * (sigma_min.powf(1.0 / rho) - smax.powf(1.0 / rho)))
                .powf(rho)
        })
        .collect();
    let factor = match c_label {
        "1" => 2.0 / 50000.0,
        "sqrt3072" => 2.0 * 3072f64.sqrt() / 50000.0,
        "unit_2C_over_betaD_eq_1" => 1.0,
        other => panic!("unknown C label {other}"),
    };
    let mu = |tt: f64, dt: f64| factor * (2.0 * dt / (tt * tt * tt)).sqrt();
    let mut out = Vec::new();
    for i in 0..n - 1 {
        let dt = t[i] - t[i + 1];
        match convention {
            "A_t_i" | "C_t_i_plus_last_to_0" => out.push(mu(t[i], dt)),
            "B_t_next" => out.push(mu(t[i + 1], dt)),
            other => panic!("unknown convention {other}"),
        }
    }
    if convention == "C_t_i_plus_last_to_0" {
        out.push(mu(sigma_min, sigma_min));
    }
    out
}

fn event_of(steps: &[(f64, f64, u64)]) -> DpEvent {
    let mut b = EventBuilder::new();
    for &(p, mu, c) in steps {
        b.push_n(DpEvent::poisson(p, DpEvent::gdp(mu)), c);
    }
    b.build()
}

fn check_eps(got: f64, want: f64) -> bool {
    if want == 0.0 {
        got == 0.0
    } else {
        rel(got, want) < TOL
    }
}

/// clt_const.csv: every row, K = T·kl, s² = T·κ₂, the DRS Thm 3.5 μ and its ε at δ = 1e-5.
#[test]
fn clt_const_reference_rows() {
    let rows = read_csv("fixtures/reference/clt_const.csv");
    assert_eq!(rows.len(), 60);
    for r in &rows {
        let (mu, t, p) = (num(r, "mu_step"), num(r, "T") as u64, num(r, "p"));
        let s = clt_summary(&[(p, mu, t)]).unwrap();
        let tag = format!("mu={mu} T={t} p={p}");
        assert!(rel(s.k, t as f64 * num(r, "kl")) < TOL, "{tag}: K {}", s.k);
        assert!(rel(s.s2, t as f64 * num(r, "kappa2")) < TOL, "{tag}: s2 {}", s.s2);
        assert!(rel(s.mu, num(r, "drs_clt_mu")) < TOL, "{tag}: mu {}", s.mu);
        let eps = s.epsilon(DELTA).unwrap();
        assert!(
            check_eps(eps, num(r, "drs_clt_eps")),
            "{tag}: eps {eps} vs {}",
            r["drs_clt_eps"]
        );
        // The accountant agrees with the summary and labels it an estimate.
        let res = CltAccountant
            .epsilon(&event_of(&[(p, mu, t)]), Neighbouring::AddRemove, DELTA)
            .unwrap();
        assert_eq!(res.kind, BoundKind::Estimate);
        assert!(check_eps(res.epsilon, num(r, "drs_clt_eps")), "{tag}");
    }
}

/// clt_edm.csv: every row, including per-step μ in the hundreds (σ_min = 0.002 with
/// 2C/(β|D|) = 1) where a careless quadrature returns 0.
#[test]
fn clt_edm_reference_rows() {
    let rows = read_csv("fixtures/reference/clt_edm.csv");
    assert_eq!(rows.len(), 135);
    let mut large_mu_rows = 0;
    for r in &rows {
        let mus = edm_steps(num(r, "sigma_min"), &r["C_label"], &r["convention"]);
        assert_eq!(mus.len() as f64, num(r, "n_steps"));
        let max_mu = mus.iter().cloned().fold(0.0, f64::max);
        assert!(rel(max_mu, num(r, "max_step_mu")) < 1e-9);
        let p = num(r, "p");
        let steps: Vec<(f64, f64, u64)> = mus.iter().map(|&m| (p, m, 1)).collect();
        let s = clt_summary(&steps).unwrap();
        let tag = format!("{} {} {} p={p}", r["sigma_min"], r["C_label"], r["convention"]);
        assert!(
            rel(s.k, num(r, "K_sum_kl")) < TOL,
            "{tag}: K {} vs {}",
            s.k,
            r["K_sum_kl"]
        );
        assert!(rel(s.s2, num(r, "s2_sum_kappa2")) < TOL, "{tag}: s2 {}", s.s2);
        assert!(
            rel(s.mu, num(r, "clt_mu")) < TOL,
            "{tag}: mu {} vs {}",
            s.mu,
            r["clt_mu"]
        );
        let eps = s.epsilon(DELTA).unwrap();
        assert!(
            check_eps(eps, num(r, "clt_eps_delta_1e-5")),
            "{tag}: eps {eps} vs {}",
            r["clt_eps_delta_1e-5"]
        );
        if max_mu > 100.0 {
            large_mu_rows += 1;
        }
    }
    assert_eq!(large_mu_rows, 15, "rows with per-step μ in the hundreds");
}

/// The CLT is an estimate: rows where dp_accounting's PLD ε (pessimistic, 1e-4 grid) exceeds
/// the CLT ε at δ = 1e-5 exist in both tables, and the accountant labels every such answer
/// `Estimate` (never a bound).
#[test]
fn clt_below_exact_pld_is_labelled_estimate() {
    let mut below = Vec::new();
    for r in read_csv("fixtures/reference/clt_const.csv") {
        let Ok(pld) = r["exact_pld_eps"].parse::<f64>() else {
            continue;
        };
        let clt = num(&r, "drs_clt_eps");
        if pld > clt * (1.0 + 1e-3) {
            let ev = event_of(&[(num(&r, "p"), num(&r, "mu_step"), num(&r, "T") as u64)]);
            let res = CltAccountant.epsilon(&ev, Neighbouring::AddRemove, DELTA).unwrap();
            assert_eq!(res.kind, BoundKind::Estimate);
            assert!(!res.kind.is_sound());
            assert!(res.epsilon < pld);
            below.push(format!("const mu={} T={} p={}", r["mu_step"], r["T"], r["p"]));
        }
    }
    for r in read_csv("fixtures/reference/clt_edm.csv") {
        let Ok(pld) = r["exact_pld_eps_delta_1e-5"].parse::<f64>() else {
            continue;
        };
        let clt = num(&r, "clt_eps_delta_1e-5");
        if pld > clt * (1.0 + 1e-3) {
            let p = num(&r, "p");
            let mus = edm_steps(num(&r, "sigma_min"), &r["C_label"], &r["convention"]);
            let steps: Vec<_> = mus.iter().map(|&m| (p, m, 1)).collect();
            let res = CltAccountant
                .epsilon(&event_of(&steps), Neighbouring::AddRemove, DELTA)
                .unwrap();
            assert_eq!(res.kind, BoundKind::Estimate);
            assert!(res.epsilon < pld);
            below.push(format!(
                "edm {} {} {} p={p}",
                r["sigma_min"], r["C_label"], r["convention"]
            ));
        }
    }
    // e.g. const mu=2 T=50 p=0.5: CLT 49.98 vs PLD 84.43; mu=1 T=50 p=0.01: 0.409 vs 0.583.
    assert!(below.iter().any(|b| b == "const mu=2.0 T=50 p=0.5"), "{below:?}");
    assert!(below.len() >= 40, "{} rows: {below:?}", below.len());
    eprintln!(
        "{} reference rows with the CLT ε below the PLD ε:\n{}",
        below.len(),
        below.join("\n")
    );
}

/// σ_min = 0.002, 2C/(β|D|) = 1, convention C: one step has μ = 707 and p = 0.5, so δ ≥ ~0.5 at
/// every finite ε. The CLT still prints ε ≈ 8.4; the accountant must flag it as invalid.
#[test]
fn nearly_blatant_step_is_flagged_severe() {
    let mus = edm_steps(0.002, "unit_2C_over_betaD_eq_1", "C_t_i_plus_last_to_0");
    let steps: Vec<_> = mus.iter().map(|&m| (0.5, m, 1u64)).collect();
    let res = CltAccountant
        .epsilon(&event_of(&steps), Neighbouring::AddRemove, DELTA)
        .unwrap();
    assert_eq!(res.kind, BoundKind::Estimate);
    assert!(rel(res.epsilon, 8.391863846264876) < TOL);
    let d = res
        .diagnostics
        .iter()
        .find(|d| d.code == "clt_nearly_blatant")
        .expect("blatant diagnostic");
    assert!(d.severe);
    assert!(res.details["delta_lower_bound"] > 0.4, "{:?}", res.details);
    // One step dominates s² as well.
    assert!(res
        .diagnostics
        .iter()
        .any(|d| d.code == "clt_step_dominates" && d.severe));
    // A benign DP-SGD run has no severe diagnostic.
    let ok = CltAccountant
        .epsilon(&DpEvent::dpsgd(1.1, 0.004, 14062), Neighbouring::AddRemove, DELTA)
        .unwrap();
    assert!(ok.diagnostics.iter().all(|d| !d.severe), "{:?}", ok.diagnostics);
}

/// Full-batch components compose exactly in GDP (documented choice: all full batch → Exact).
#[test]
fn full_batch_reduces_to_gdp() {
    let ev = DpEvent::Composed {
        events: vec![DpEvent::repeat(DpEvent::gdp(0.3), 40), DpEvent::gdp(1.5)],
    };
    let res = CltAccountant.epsilon(&ev, Neighbouring::AddRemove, DELTA).unwrap();
    let mu = (40.0 * 0.09f64 + 2.25).sqrt();
    assert_eq!(res.kind, BoundKind::Exact);
    // The number is the exact GDP composition: it is labelled gdp, never "clt exact".
    assert_eq!(res.accountant, Some(dpaudit::accountants::AccountantKind::Gdp));
    assert!(rel(res.epsilon, gdp::epsilon_for_delta(mu, DELTA).unwrap()) < 1e-12);
    // Mixed: the full-batch part adds μ² to the CLT μ², and the answer is an estimate.
    let mixed = DpEvent::Composed {
        events: vec![ev.clone(), DpEvent::dpsgd(1.0, 0.01, 1000)],
    };
    let r = CltAccountant.epsilon(&mixed, Neighbouring::AddRemove, DELTA).unwrap();
    assert_eq!(r.kind, BoundKind::Estimate);
    let clt = clt_summary(&[(0.01, 1.0, 1000)]).unwrap().mu;
    assert!(rel(r.details["mu"], (clt * clt + mu * mu).sqrt()) < 1e-12);
}

#[test]
fn unsupported_shapes_name_the_sub_event() {
    let ev = DpEvent::Composed {
        events: vec![
            DpEvent::dpsgd(1.0, 0.01, 10),
            DpEvent::repeat(
                DpEvent::SampledWithoutReplacement {
                    n: 100,
                    m: 10,
                    event: Box::new(DpEvent::gaussian(1.0)),
                },
                3,
            ),
        ],
    };
    let e = CltAccountant.supports(&ev, Neighbouring::AddRemove).unwrap_err();
    assert!(e.message.contains("event.events[1].event"), "{}", e.message);
    let ev = DpEvent::Composed {
        events: vec![
            DpEvent::gaussian(1.0),
            DpEvent::EpsilonDelta {
                epsilon: 1.0,
                delta: 0.0,
            },
        ],
    };
    let e = CltAccountant.epsilon(&ev, Neighbouring::AddRemove, DELTA).unwrap_err();
    assert!(e.message.contains("event.events[1]"), "{}", e.message);
    let e = CltAccountant
        .supports(&DpEvent::dpsgd(1.0, 0.01, 10), Neighbouring::ReplaceOne)
        .unwrap_err();
    assert!(e.message.contains("replace-one"), "{}", e.message);
}
