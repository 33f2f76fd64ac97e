//! Integration tests: the PLD accountant against reference tables (fixtures/reference, produced
//! with dp-accounting 0.6.0 PLD grid 1e-4, prv-accountant 0.2.0 and scipy; see SOURCE.md),
//! exact GDP, its own δ(ε) inverse, monotonicity, hostile inputs and nearly blatant steps.

use super::common::read_csv;
use dpaudit::accountants::gdp;
use dpaudit::accountants::pld::{single_step_delta_exact, PldAccountant, PldStep};
use dpaudit::accountants::{Accountant, AccountantKind, BoundKind};
use dpaudit::events::{DpEvent, Neighbouring};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

type Row = std::collections::HashMap<String, String>;

fn f(row: &std::collections::HashMap<String, String>, k: &str) -> f64 {
    row[k].parse().unwrap_or_else(|_| panic!("column {k}: {}", row[k]))
}

fn eps(steps: &[PldStep], delta: f64) -> f64 {
    PldAccountant::default().compose_steps(steps).unwrap().epsilon(delta)
}

/// Our ε must sit in [lower, reference · 1.01]: never below a lower reference (PRV's lower
/// bound, the exact GDP ε), never more than 1% above dp_accounting's PLD ε.
fn assert_within_1pct_above(ours: f64, reference: f64, lower: f64, what: &str) {
    assert!(ours >= lower, "{what}: ε = {ours} is below the lower reference {lower}");
    assert!(
        ours <= reference * 1.01,
        "{what}: ε = {ours} is more than 1% above dp_accounting's {reference}"
    );
}

/// Our ε must sit in [certified floor, reference · 1.01], the reference being the table's PLD
/// column (dp_accounting's pessimistic PLD at grid 1e-4, an upper bound: at tiny ε the refined
/// grid lands below it, docs/pld.md "Tiny ε"), the floor the larger of the lower-bound PLD of the
/// same steps and the exact ε of its leakiest step (where the lower-bound PLD certifies nothing).
fn assert_within_floor_and_1pct(ours: f64, reference: f64, steps: &[PldStep], what: &str) {
    let pairs: Vec<(f64, f64, u64)> = steps.iter().map(|s| (s.q, 1.0 / s.noise_multiplier, s.count)).collect();
    let one = steps
        .iter()
        .map(|s| single_step_eps(s.q, s.noise_multiplier, 1e-5))
        .fold(0.0, f64::max);
    let floor = super::common::certified_floor(&pairs, 1e-5, ours).max(one);
    assert_within_1pct_above(ours, reference, floor, what);
}

#[test]
fn dpsgd_table_between_prv_lower_and_dp_accounting_plus_1pct() {
    // fixtures/reference/dpsgd.csv: RAPID DP-SGD rows (prv_accountant 0.2.0 lower bound,
    // dp_accounting 0.6.0 PLD grid 1e-4).
    let rows = read_csv("fixtures/reference/dpsgd.csv");
    assert!(rows.len() >= 16);
    for r in &rows {
        let (q, sigma, t, d) = (
            f(r, "q"),
            f(r, "noise_multiplier"),
            f(r, "steps_T") as u64,
            f(r, "delta"),
        );
        let e = eps(
            &[PldStep {
                q,
                noise_multiplier: sigma,
                count: t,
            }],
            d,
        );
        let what = format!("dpsgd σ={sigma} T={t}");
        assert_within_1pct_above(e, f(r, "eps_dpacc_pld"), f(r, "eps_prv_low"), &what);
    }
}

#[test]
fn dp_rdm_table_between_prv_lower_and_dp_accounting_plus_1pct() {
    // fixtures/reference/dp_rdm.csv: DP-RDM CIFAR-10 queries, noise multiplier column, δ = 1/n.
    for r in &read_csv("fixtures/reference/dp_rdm.csv") {
        let (q, z, t, d) = (f(r, "q"), f(r, "noise_multiplier"), f(r, "T") as u64, f(r, "delta"));
        let e = eps(
            &[PldStep {
                q,
                noise_multiplier: z,
                count: t,
            }],
            d,
        );
        let what = format!("dp_rdm z={z} T={t}");
        assert_within_1pct_above(e, f(r, "eps_dpacc_pld"), f(r, "eps_prv_low"), &what);
    }
}

#[test]
fn gdp_table_pld_column_and_never_below_exact() {
    // fixtures/reference/gdp_conv.csv: exact μ-GDP ε and dp_accounting's PLD (σ = 1/μ, grid 1e-4).
    for r in &read_csv("fixtures/reference/gdp_conv.csv") {
        let (mu, d) = (f(r, "mu"), f(r, "delta"));
        let e = eps(&[PldStep::gdp(mu, 1.0, 1)], d);
        let exact = f(r, "eps_closed_form_brentq_logspace");
        let what = format!("gdp μ={mu} δ={d}");
        assert_within_1pct_above(e, f(r, "eps_dp_accounting_PLD_gaussian(1e-4 grid)"), exact, &what);
    }
}

/// fixtures/reference/clt_const.csv: T × Poisson(p) ∘ Gaussian(1/μ), δ = 1e-5. Rows with an
/// `exact_pld_eps` (dp_accounting 0.6.0 PLD, grid 1e-4, pessimistic) must land in
/// [exact, exact · 1.01]; the "skipped(clt mu>12)" rows have no reference and must be at least
/// one step's exact ε. Returns (rows with a reference, rows without).
fn check_clt_const(select: impl Fn(&Row) -> bool) -> (usize, usize) {
    let (mut with_ref, mut without) = (0, 0);
    for r in read_csv("fixtures/reference/clt_const.csv")
        .iter()
        .filter(|r| select(r))
    {
        let (mu, t, p) = (f(r, "mu_step"), f(r, "T") as u64, f(r, "p"));
        let e = eps(&[PldStep::gdp(mu, p, t)], 1e-5);
        let what = format!("clt_const μ={mu} T={t} p={p}");
        match r["exact_pld_eps"].parse::<f64>() {
            Ok(exact) => {
                assert_within_floor_and_1pct(e, exact, &[PldStep::gdp(mu, p, t)], &what);
                with_ref += 1;
            }
            Err(_) => {
                let one = single_step_eps(p, 1.0 / mu, 1e-5);
                assert!(e >= one, "{what}: ε = {e} below one step's exact ε {one}");
                without += 1;
            }
        }
    }
    (with_ref, without)
}

/// The T = 1000 rows of clt_const.csv (18 with a reference, 2 "skipped(clt mu>12)"); every row is checked
/// by the ignored `clt_const_table_full` in release mode (.ci/run).
#[test]
fn clt_const_table_exact_pld_column() {
    assert_eq!(check_clt_const(|r| r["T"] == "1000"), (18, 2));
}

/// Every row of clt_const.csv: 55 with dp_accounting's PLD ε, 5 without (CLT μ > 12).
#[test]
#[ignore = "full reference table; run in release: cargo test --release -- --ignored"]
fn clt_const_table_full() {
    assert_eq!(check_clt_const(|_| true), (55, 5));
}

/// EDM/Karras levels (fixtures/reference/SOURCE.md, "Step conventions"): σ_max 80, ρ 7, 50 levels.
fn edm_mus(sigma_min: f64, factor: f64, convention: &str) -> Vec<f64> {
    let (smax, rho, n) = (80.0f64, 7.0f64, 50usize);
    let t: Vec<f64> = (0..n)
        .map(|i| {
            (smax.powf(1.0 / rho) + i as f64 / (n - 1) as f64 * (sigma_min.powf(1.0 / rho) - smax.powf(1.0 / rho)))
                .powf(rho)
        })
        .collect();
    let mu = |tt: f64, dt: f64| factor * (2.0 * dt / (tt * tt * tt)).sqrt();
    let mut out: Vec<f64> = (0..n - 1)
        .map(|i| {
            let dt = t[i] - t[i + 1];
            match convention {
                "A_t_i" | "C_t_i_plus_last_to_0" => mu(t[i], dt),
                "B_t_next" => mu(t[i + 1], dt),
                other => panic!("convention {other}"),
            }
        })
        .collect();
    if convention == "C_t_i_plus_last_to_0" {
        out.push(mu(sigma_min, sigma_min));
    }
    out
}

/// fixtures/reference/clt_edm.csv: 49–50 distinct per-step μ, each Poisson(p)-subsampled once.
/// Rows with `exact_pld_eps_delta_1e-5` (dp_accounting 0.6.0 PLD) must land in
/// [exact, exact · 1.01]; the nearly blatant rows without one ("skipped(max mu>3)", μ up to
/// ~700) must be sound: at least one step's exact ε, and ∞ only below the PLD's δ floor.
/// Returns (rows with a reference, rows without).
fn check_clt_edm(select: impl Fn(&Row) -> bool) -> (usize, usize) {
    let (mut with_ref, mut without) = (0, 0);
    for r in read_csv("fixtures/reference/clt_edm.csv").iter().filter(|r| select(r)) {
        let sigma_min = f(r, "sigma_min");
        let factor = match r["C_label"].as_str() {
            "1" => 2.0 / 50000.0,
            "sqrt3072" => 2.0 * 3072f64.sqrt() / 50000.0,
            _ => 1.0,
        };
        let mus = edm_mus(sigma_min, factor, &r["convention"]);
        assert_eq!(mus.len() as f64, f(r, "n_steps"));
        let max_mu = mus.iter().cloned().fold(0.0, f64::max);
        assert!(
            (max_mu / f(r, "max_step_mu") - 1.0).abs() < 1e-9,
            "schedule mismatch {max_mu}"
        );
        let p = f(r, "p");
        let steps: Vec<PldStep> = mus.iter().map(|&m| PldStep::gdp(m, p, 1)).collect();
        let pld = PldAccountant::default().compose_steps(&steps).unwrap();
        let e = pld.epsilon(1e-5);
        let one = single_step_eps(p, 1.0 / max_mu, 1e-5);
        let what = format!("clt_edm σmin={sigma_min} C={} {} p={p}", r["C_label"], r["convention"]);
        match r["exact_pld_eps_delta_1e-5"].parse::<f64>() {
            Ok(exact) => {
                assert_within_floor_and_1pct(e, exact, &steps, &what);
                with_ref += 1;
            }
            Err(_) => {
                without += 1;
                // Nearly blatant steps (μ up to ~700): a sound answer, never below one step's ε;
                // ε = ∞ only when δ is below the mass the PLD had to put at infinite loss.
                assert!(e >= one, "{what}: ε = {e} below one step's exact ε {one}");
                if e.is_infinite() {
                    assert!(
                        pld.delta_floor() >= 1e-5,
                        "{what}: ε = ∞ but floor {}",
                        pld.delta_floor()
                    );
                }
            }
        }
    }
    (with_ref, without)
}

/// Convention C at p ∈ {0.5, 0.001}, every σ_min and C: 18 rows of clt_edm.csv, 14 with a
/// reference (the nearly blatant "unit" rows included). Every row: `clt_edm_table_full`.
#[test]
fn clt_edm_table_exact_pld_column_heterogeneous_steps() {
    let sel = |r: &Row| r["convention"] == "C_t_i_plus_last_to_0" && (r["p"] == "0.5" || r["p"] == "0.001");
    assert_eq!(check_clt_edm(sel), (14, 4));
}

/// Every row of clt_edm.csv: 105 with dp_accounting's PLD ε, 30 nearly blatant without.
#[test]
#[ignore = "full reference table; run in release: cargo test --release -- --ignored"]
fn clt_edm_table_full() {
    assert_eq!(check_clt_edm(|_| true), (105, 30));
}

/// Exact ε of one step (bisection on the closed-form δ; the upper end of the final bracket).
fn single_step_eps(q: f64, sigma: f64, delta: f64) -> f64 {
    if single_step_delta_exact(q, sigma, 0.0) <= delta {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while single_step_delta_exact(q, sigma, hi) > delta {
        hi *= 2.0;
        if hi > 1e7 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if single_step_delta_exact(q, sigma, mid) > delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // The lower end: a lower reference must not be rounded up.
    lo
}

#[test]
fn full_batch_equals_exact_gdp_within_discretisation_never_below() {
    // q = 1: T Gaussian steps are exactly √T/σ-GDP (Dong, Roth & Su 2022, Cor. 3.3).
    for &(sigma, t) in &[(1.0, 1u64), (2.0, 10), (5.0, 100), (20.0, 1000), (0.7, 3)] {
        let pld = PldAccountant::default()
            .compose_steps(&[PldStep {
                q: 1.0,
                noise_multiplier: sigma,
                count: t,
            }])
            .unwrap();
        let mu = (t as f64).sqrt() / sigma;
        for &d in &[1e-3, 1e-5, 1e-9] {
            let exact = gdp::epsilon_for_delta(mu, d).unwrap();
            let e = pld.epsilon(d);
            assert!(e >= exact, "σ={sigma} T={t} δ={d}: {e} < exact {exact}");
            assert!(e <= exact * 1.002 + 2e-4, "σ={sigma} T={t} δ={d}: {e} vs exact {exact}");
            // δ side: never below the exact GDP δ at any ε.
            for &x in &[0.0, 0.5 * exact, exact, 2.0 * exact] {
                assert!(pld.delta(x) >= gdp::delta_for_epsilon(mu, x) * (1.0 - 1e-12));
            }
        }
    }
}

#[test]
fn accountant_trait_reports_upper_bound_with_details() {
    let acc = AccountantKind::Pld.build();
    let ev = DpEvent::dpsgd(1.0, 0.01, 1000);
    acc.supports(&ev, Neighbouring::AddRemove).unwrap();
    let r = acc.epsilon(&ev, Neighbouring::AddRemove, 1e-5).unwrap();
    assert_eq!(r.kind, BoundKind::UpperBound);
    for k in ["grid_interval", "truncated_mass", "grid_points", "fft_roundoff_bound"] {
        assert!(r.details.contains_key(k), "missing detail {k}");
    }
    // The requested grid 1e-4, sized for precision by a power of two (docs/pld.md, Construction 3).
    let ratio = r.details["grid_interval"] / 1e-4;
    assert!(
        ratio >= 1.0 && ratio.log2().fract() == 0.0,
        "grid_interval {}",
        r.details["grid_interval"]
    );
    let back = acc.delta(&ev, Neighbouring::AddRemove, r.epsilon).unwrap();
    assert!(back.delta <= 1e-5 * (1.0 + 1e-9), "δ(ε(δ)) = {}", back.delta);
    // Zero events: ε = 0.
    let r0 = acc.epsilon(&DpEvent::NoOp, Neighbouring::AddRemove, 1e-5).unwrap();
    assert_eq!(r0.epsilon, 0.0);
}

#[test]
fn unsupported_shapes_are_named() {
    let acc = PldAccountant::default();
    let wor = DpEvent::SampledWithoutReplacement {
        n: 100,
        m: 10,
        event: Box::new(DpEvent::gaussian(1.0)),
    };
    let e = acc.supports(&wor, Neighbouring::ReplaceOne).unwrap_err().to_string();
    assert!(e.contains("without replacement"), "{e}");
    // Poisson sampling under replace-one has its own (symmetric) dominating pair.
    let pois = DpEvent::poisson(0.1, DpEvent::gaussian(1.0));
    acc.supports(&pois, Neighbouring::ReplaceOne).unwrap();
    // Full-batch Gaussian under replace-one is fine (sensitivity is stated per relation).
    acc.supports(&DpEvent::gaussian(1.0), Neighbouring::ReplaceOne).unwrap();
}

#[test]
fn epsilon_delta_leaf_is_supported_and_composes_like_its_dominating_pair() {
    // One (ε, δ)-DP event: the PLD must reproduce (ε, δ) itself up to the grid.
    let acc = PldAccountant::default();
    let r = acc
        .epsilon(
            &DpEvent::EpsilonDelta {
                epsilon: 1.0,
                delta: 1e-6,
            },
            Neighbouring::AddRemove,
            2e-6,
        )
        .unwrap();
    assert!(r.epsilon <= 1.0 + 1e-4 && r.epsilon > 0.9, "{}", r.epsilon);
    // δ below the event's own δ cannot be certified: ε = ∞, flagged.
    let r = acc
        .epsilon(
            &DpEvent::EpsilonDelta {
                epsilon: 1.0,
                delta: 1e-6,
            },
            Neighbouring::AddRemove,
            1e-7,
        )
        .unwrap();
    assert!(r.epsilon.is_infinite());
    assert!(r
        .diagnostics
        .iter()
        .any(|d| d.code == "pld_delta_below_floor" && d.severe));
}

#[test]
fn epsilon_delta_leaves_compose_at_any_delta_below_one() {
    // dp_accounting 0.6.0's own test value (pld_privacy_accountant_test.py): (1, 0.1) ∘ (2, 0.2)
    // has δ(ε = 3) = 1 − 0.9·0.8 = 0.28 exactly (no finite loss exceeds 1 + 2 = 3). A PLD that
    // gives up once the composed δ is large (δ = 1, ε = ∞) fails this.
    let acc = PldAccountant::default();
    let ev = DpEvent::Composed {
        events: vec![
            DpEvent::EpsilonDelta {
                epsilon: 1.0,
                delta: 0.1,
            },
            DpEvent::EpsilonDelta {
                epsilon: 2.0,
                delta: 0.2,
            },
        ],
    };
    let d3 = acc.delta(&ev, Neighbouring::AddRemove, 3.0).unwrap().delta;
    assert!((0.28..=0.28 + 1e-3).contains(&d3), "δ(3) = {d3}");
    // Below ε = 3 the finite part counts: the loss 1 + 2 = 3 has P-mass
    // 0.9·e/(1+e) · 0.8·e²/(1+e²) (Kairouz et al. 2015 dominating pairs), so
    // δ(2) = 0.28 + that mass · (1 − e^{−1}) exactly (≈ 0.5731).
    let e1 = std::f64::consts::E;
    let exact2 = 0.28 + 0.9 * e1 / (1.0 + e1) * 0.8 * e1 * e1 / (1.0 + e1 * e1) * (1.0 - (-1.0f64).exp());
    let d2 = acc.delta(&ev, Neighbouring::AddRemove, 2.0).unwrap().delta;
    assert!(d2 >= exact2 && d2 <= exact2 + 1e-3, "δ(2) = {d2} vs exact {exact2}");
    // ε at δ = 0.3 is finite and certified (≤ 3 + one grid step).
    let e = acc.epsilon(&ev, Neighbouring::AddRemove, 0.3).unwrap();
    assert!(
        e.epsilon.is_finite() && e.epsilon <= 3.0 + 1e-4,
        "ε(0.3) = {}",
        e.epsilon
    );
    assert!(!e.diagnostics.iter().any(|d| d.code == "pld_fallback_rdp"));
}

#[test]
fn replace_one_poisson_gaussian_within_1pct_of_dp_accounting() {
    // fixtures/reference/pld_dpsgd.csv (scripts/gen_pld_reference.py, dp_accounting 0.6.0
    // PLDAccountant(REPLACE_ONE), grid 1e-4, δ = 1e-5). dp_accounting's noise multiplier is
    // relative to the clip norm C; dpaudit's is relative to the replace-one sensitivity 2C, so
    // the same mechanism is Gaussian{noise_multiplier: σ/2} here.
    let rows = read_csv("fixtures/reference/pld_dpsgd.csv");
    assert!(rows.len() >= 16);
    let acc = PldAccountant::default();
    for r in &rows {
        let (q, sigma, t) = (f(r, "q"), f(r, "noise_multiplier"), f(r, "steps_T") as u64);
        let ev = DpEvent::dpsgd(sigma / 2.0, q, t);
        let res = acc.epsilon(&ev, Neighbouring::ReplaceOne, 1e-5).unwrap();
        let reference = f(r, "eps_dpacc_pld_replace_one_delta_1e-05");
        assert!(
            !res.diagnostics.iter().any(|d| d.code == "pld_fallback_rdp"),
            "σ={sigma} T={t}: fell back to RDP"
        );
        assert!(
            (res.epsilon - reference).abs() <= 0.01 * reference,
            "σ={sigma} T={t}: ε = {} vs dp_accounting {reference}",
            res.epsilon
        );
        // Far tighter than the joint-convexity RDP bound that was the only answer before.
        let rdp = dpaudit::accountants::rdp::RdpAccountant::default()
            .epsilon(&ev, Neighbouring::ReplaceOne, 1e-5)
            .unwrap();
        assert!(res.epsilon < rdp.epsilon, "{} vs rdp {}", res.epsilon, rdp.epsilon);
    }
}

#[test]
fn hostile_inputs_give_sound_answers() {
    // q = 1e-9, σ = 0.3, 10⁷ steps. Lower reference: one step's exact ε, and (for δ = 1e-5)
    // dp_accounting 0.6.0 PLD (grid 1e-4) gives ε = 0.0 here (scripts/compare_pld.py hostile).
    let pld = PldAccountant::default()
        .compose_steps(&[PldStep {
            q: 1e-9,
            noise_multiplier: 0.3,
            count: 10_000_000,
        }])
        .unwrap();
    // With 10⁷ compositions the certified FFT round-off bound (∝ T·u) may exceed δ = 1e-5: then
    // ε = ∞ is the honest answer; a finite ε must satisfy δ(ε) ≤ δ and sit above one step's ε.
    let e5 = pld.epsilon(1e-5);
    if e5.is_finite() {
        assert!(e5 >= single_step_eps(1e-9, 0.3, 1e-5), "{e5}");
        assert!(pld.delta(e5) <= 1e-5);
    } else {
        assert!(pld.delta_floor() >= 1e-5, "ε = ∞ but floor {}", pld.delta_floor());
    }
    // At δ = 1e-3 the answer is finite and sound.
    let e3 = pld.epsilon(1e-3);
    assert!(e3.is_finite() && pld.delta(e3) <= 1e-3, "{e3}");
    // δ = 1e-300 is below what the accountant can certify: ε = ∞ (never a small wrong ε).
    let e = pld.epsilon(1e-300);
    assert!(e.is_infinite() || pld.delta(e) <= 1e-300, "{e}");
    let acc = PldAccountant::default();
    let ev = DpEvent::dpsgd(0.3, 1e-9, 10_000_000);
    // Through the accountant, δ = 1e-300 is below the PLD's floor: it says so and falls back to
    // the (sound) RDP bound of the same event rather than report ε = ∞.
    let r = acc.epsilon(&ev, Neighbouring::AddRemove, 1e-300).unwrap();
    assert!(r.diagnostics.iter().any(|d| d.code == "pld_delta_below_floor"));
    assert!(r.diagnostics.iter().any(|d| d.code == "pld_fallback_rdp"));
    // The fallback number is the RDP bound, and it is labelled as such (never on the pld row).
    assert_eq!(r.accountant, Some(dpaudit::accountants::AccountantKind::Rdp));
    assert!(r.details.contains_key("pld_delta_floor"));
    let rdp = dpaudit::accountants::rdp::RdpAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-300)
        .unwrap();
    assert!(
        r.epsilon.is_finite() && r.epsilon == rdp.epsilon,
        "{} vs {}",
        r.epsilon,
        rdp.epsilon
    );
    // Bad configuration: a clear error naming the field.
    let bad = PldAccountant {
        value_discretization_interval: -1.0,
        ..PldAccountant::default()
    };
    let msg = bad.compose_steps(&[PldStep::gdp(1.0, 1.0, 1)]).unwrap_err().to_string();
    assert!(msg.contains("value_discretization_interval"), "{msg}");
    let msg = PldAccountant::default()
        .compose_steps(&[PldStep::gdp(1.0, 1.5, 1)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("steps[0].q"), "{msg}");
}

#[test]
fn nearly_blatant_full_batch_step_is_infinite_and_flagged() {
    // μ = 300 full batch: δ(ε) ≈ 1 for every ε the grid can hold; ε = ∞ with the reason.
    let acc = PldAccountant::default();
    let r = acc
        .epsilon(&DpEvent::gdp(300.0), Neighbouring::AddRemove, 1e-5)
        .unwrap();
    let exact = gdp::epsilon_for_delta(300.0, 1e-5).unwrap();
    assert!(r.epsilon >= exact, "{} < {exact}", r.epsilon);
    if r.epsilon.is_infinite() {
        assert!(r.diagnostics.iter().any(|d| d.code == "pld_delta_below_floor"));
    }
}

proptest! {
    // 256 seeded cases: the same inputs every run (a failure prints them).
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: RngSeed::Fixed(0x504c_4401), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn monotone_in_delta_steps_q_and_sigma(
        sigma in 0.6f64..3.0,
        q in 0.001f64..0.2,
        t in 1u64..400,
        d in 1e-9f64..1e-3,
    ) {
        let base = PldAccountant::default()
            .compose_steps(&[PldStep { q, noise_multiplier: sigma, count: t }])
            .unwrap();
        let e = base.epsilon(d);
        prop_assert!(e.is_finite());
        // δ(ε(δ)) ≤ δ.
        prop_assert!(base.delta(e) <= d * (1.0 + 1e-9));
        // Larger δ → smaller ε.
        prop_assert!(base.epsilon(d * 10.0) <= e);
        // More steps, larger q, smaller σ → larger ε.
        let more = eps(&[PldStep { q, noise_multiplier: sigma, count: t * 2 }], d);
        prop_assert!(more >= e, "T: {more} < {e}");
        let larger_q = eps(&[PldStep { q: (q * 1.5).min(1.0), noise_multiplier: sigma, count: t }], d);
        prop_assert!(larger_q >= e, "q: {larger_q} < {e}");
        let smaller_sigma = eps(&[PldStep { q, noise_multiplier: sigma * 0.8, count: t }], d);
        prop_assert!(smaller_sigma >= e, "σ: {smaller_sigma} < {e}");
        // Never below one step's exact ε.
        prop_assert!(e >= single_step_eps(q, sigma, d));
    }
}

#[test]
fn tiny_delta_is_certified_by_the_pld_within_1pct_of_dp_accounting() {
    // fixtures/reference/pld_dpsgd.csv: dp_accounting 0.6.0 PLDAccountant (grid 1e-4,
    // pessimistic, add/remove) and prv_accountant 0.2.0's lower bound, at δ = 1e-10 and 1e-12.
    // In double precision the certified FFT round-off (≈ 1e-9 here) is above these δ, so the PLD
    // recomputes its Fourier product on double words. Every answer is a PLD number (no RDP
    // fallback), never below PRV's lower bound, and at most 1% above dp_accounting's, or where
    // dp_accounting's own number lies below PRV's lower bound (it counts no round-off), at most
    // 1% above that lower bound.
    let rows = read_csv("fixtures/reference/pld_dpsgd.csv");
    assert!(rows.len() >= 16);
    let acc = PldAccountant::default();
    let mut below_lower = 0;
    for r in &rows {
        let (q, sigma, t) = (f(r, "q"), f(r, "noise_multiplier"), f(r, "steps_T") as u64);
        let ev = DpEvent::dpsgd(sigma, q, t);
        for d in ["1e-10", "1e-12"] {
            let delta: f64 = d.parse().unwrap();
            let res = acc.epsilon(&ev, Neighbouring::AddRemove, delta).unwrap();
            assert_eq!(
                res.accountant,
                Some(AccountantKind::Pld),
                "σ={sigma} T={t} δ={d}: {:?}",
                res.diagnostics
            );
            let dp = f(r, &format!("eps_dpacc_pld_add_remove_delta_{d}"));
            let low = f(r, &format!("eps_prv_low_delta_{d}"));
            assert!(
                res.epsilon >= low,
                "σ={sigma} T={t} δ={d}: ε = {} below PRV's lower bound {low}",
                res.epsilon
            );
            if dp >= low {
                assert!(
                    res.epsilon <= 1.01 * dp,
                    "σ={sigma} T={t} δ={d}: ε = {} vs dp_accounting {dp}",
                    res.epsilon
                );
            } else {
                // dp_accounting below a proven lower bound: the best any sound accountant can
                // do is the lower bound itself; hold ours within 1% of it.
                below_lower += 1;
                assert!(
                    res.epsilon <= 1.01 * low,
                    "σ={sigma} T={t} δ={d}: ε = {} vs PRV's lower bound {low}",
                    res.epsilon
                );
            }
            // The slack is a small share of δ.
            let floor = res.details["inf_mass"] + res.details["window_tail_mass"] + res.details["fft_roundoff_bound"];
            assert!(floor <= 0.01 * delta, "σ={sigma} T={t} δ={d}: floor {floor}");
        }
    }
    // dp_accounting's δ = 1e-12 value lies below PRV's lower bound on two rows (σ = 0.8,
    // T = 9375 and σ = 1, T = 46875). On the first, 1.01 × dp_accounting (2.978) is below that
    // lower bound (2.9959), so no sound accountant can be within 1% of it; ours (3.0076) is
    // within 0.4% of the lower bound, and finer grids converge to it (3.00760 at h = 5e-5,
    // 3.00758 at 2e-5). On the second ours (2.1096) is also within 1% of dp_accounting.
    assert_eq!(below_lower, 2);
}

#[test]
fn calibration_at_tiny_delta_is_within_1pct_of_dp_accounting_and_above_prv_lower() {
    // fixtures/reference/pld_calibration.csv (scripts/gen_calibration_reference.py):
    // dp_accounting 0.6.0's calibrate_dp_mechanism with its pessimistic PLD (grid 1e-4) and the
    // noise multiplier at which prv_accountant 0.2.0's *lower* ε bound meets the target (no
    // sound calibration may go below it), for DP-SGD settings of dpsgd.csv at δ = 1e-10 and 1e-12.
    use dpaudit::accountants::calibrate::{calibrate_dpsgd, DpSgd, SolveFor};
    let rows = read_csv("fixtures/reference/pld_calibration.csv");
    assert!(rows.len() >= 6);
    let acc = PldAccountant::default();
    for r in &rows {
        let (q, t) = (f(r, "q"), f(r, "steps_T") as u64);
        let (target, delta) = (f(r, "target_epsilon"), f(r, "delta"));
        let fixed = DpSgd {
            noise_multiplier: 1.0,
            sample_rate: q,
            steps: t,
        };
        let c = calibrate_dpsgd(
            &acc,
            Neighbouring::AddRemove,
            delta,
            target,
            fixed,
            SolveFor::NoiseMultiplier,
        )
        .unwrap();
        let (dp, low) = (f(r, "sigma_dpacc_pld"), f(r, "sigma_prv_low"));
        assert_eq!(c.result.accountant, Some(AccountantKind::Pld), "q={q} T={t} δ={delta}");
        assert!(c.result.epsilon <= target);
        assert!(
            c.value > low,
            "q={q} T={t} ε={target} δ={delta}: σ = {} at or below PRV's lower-bound σ {low}",
            c.value
        );
        assert!(
            c.value <= 1.01 * dp,
            "q={q} T={t} ε={target} δ={delta}: σ = {} vs dp_accounting {dp}",
            c.value
        );
    }
}

/// fixtures/reference/calibrate_dpsgd.csv (scripts/gen_calibrate_reference.py): dp_accounting
/// 0.6.0's `calibrate_dp_mechanism` with its pessimistic PLD at grid 1e-4 for σ, q and the steps
/// at ε = 8, δ = 1e-5. The one calibration search with the default PLD lands within 0.1 % of each
/// (both are pessimistic PLDs on the same grid; the answers differ by the two discretisations and
/// dpaudit's six-digit grid), on the safe side of the target when re-accounted.
#[test]
fn calibrate_agrees_with_dp_accounting_within_0_1_percent() {
    use dpaudit::accountants::calibrate::{calibrate_dpsgd, DpSgd, SolveFor};
    let rows = read_csv("fixtures/reference/calibrate_dpsgd.csv");
    assert_eq!(rows.len(), 3);
    let acc = PldAccountant::default();
    let given =
        |r: &std::collections::HashMap<String, String>, k: &str, default: f64| r[k].parse::<f64>().unwrap_or(default);
    for r in &rows {
        let solve_for = match r["solve_for"].as_str() {
            "noise-multiplier" => SolveFor::NoiseMultiplier,
            "sample-rate" => SolveFor::SampleRate,
            _ => SolveFor::Steps,
        };
        let fixed = DpSgd {
            noise_multiplier: given(r, "noise_multiplier", 1.0),
            sample_rate: given(r, "sample_rate", 1.0),
            steps: given(r, "steps", 1.0) as u64,
        };
        let (target, delta) = (f(r, "target_epsilon"), f(r, "delta"));
        let c = calibrate_dpsgd(&acc, Neighbouring::AddRemove, delta, target, fixed, solve_for).unwrap();
        let theirs = f(r, "answer");
        assert!(
            (c.value / theirs - 1.0).abs() <= 1e-3,
            "{solve_for:?}: {} vs dp_accounting {theirs}",
            c.value
        );
        let again = acc.epsilon(&c.event, Neighbouring::AddRemove, delta).unwrap();
        assert!(again.epsilon <= target, "{solve_for:?}: ε {}", again.epsilon);
    }
}

/// dpaudit's ε for q = 0.004, σ = 1.1, T = 10⁷, δ = 1e-5 at 72b70bf, where it composed twice (double
/// precision, then the Fourier product on double words at h = 1e-4): the value long-horizon
/// accounting must stay within 0.1 % of.
const EPS_1E7_PRECISE_72B70BF: f64 = 162.43247308304717;

fn long_horizon_row(case: &str) -> Row {
    read_csv("fixtures/reference/pld_long_horizon.csv")
        .into_iter()
        .find(|r| r["case"] == case)
        .unwrap_or_else(|| panic!("no row {case} in pld_long_horizon.csv"))
}

/// 10⁶ steps: between prv_accountant's lower bound and dp_accounting's PLD (grid 1e-4) + 0.1 %.
#[test]
fn long_horizon_1e6_steps_between_prv_lower_and_dp_accounting() {
    let ev = DpEvent::dpsgd(1.1, 0.004, 1_000_000);
    let r = PldAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert_eq!(r.accountant, Some(AccountantKind::Pld));
    let row = long_horizon_row("dpsgd_q0.004_s1.1_T1000000");
    assert!(
        r.epsilon >= f(&row, "eps_prv_low"),
        "{} < PRV lower {}",
        r.epsilon,
        row["eps_prv_low"]
    );
    let dp = f(&row, "eps_dpacc_pld");
    assert!(r.epsilon <= dp * 1.001, "{} vs dp_accounting {dp}", r.epsilon);
}

/// 10⁷ steps: one composition (no double-word recomposition), a PLD bound within 0.1 % of the
/// precise value it used to take two compositions for, never below prv_accountant's lower bound.
#[test]
fn long_horizon_1e7_steps_in_one_composition_within_0_1pct_and_above_prv_lower() {
    let ev = DpEvent::dpsgd(1.1, 0.004, 10_000_000);
    let r = PldAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert_eq!(r.accountant, Some(AccountantKind::Pld));
    assert!(!r.details.contains_key("double_word_fft"), "{:?}", r.details);
    assert!(
        super::common::rel(r.epsilon, EPS_1E7_PRECISE_72B70BF) <= 1e-3,
        "ε = {} vs {EPS_1E7_PRECISE_72B70BF}",
        r.epsilon
    );
    let row = long_horizon_row("dpsgd_q0.004_s1.1_T10000000");
    assert!(
        r.epsilon >= f(&row, "eps_prv_low"),
        "{} < PRV lower {}",
        r.epsilon,
        row["eps_prv_low"]
    );
    if let Ok(dp) = row["eps_dpacc_pld"].parse::<f64>() {
        // dp_accounting at a coarser grid (1e-3; 1e-4 does not fit the machine): ours, at a
        // finer one, is not above it by more than 1 %.
        assert!(r.epsilon <= dp * 1.01, "{} vs dp_accounting {dp}", r.epsilon);
    }
}

fn gauss_moments_eps(case: &str) -> f64 {
    let row = read_csv("fixtures/reference/pld_long_horizon_gauss.csv")
        .into_iter()
        .find(|r| r["case"] == case)
        .unwrap_or_else(|| panic!("no row {case} in pld_long_horizon_gauss.csv"));
    f(&row, "eps_gauss_moments")
}

/// 10⁸ steps: a PLD upper bound (not the RDP fallback: the old PLD's floor was 0.516 here), below
/// the RDP bound, within 1 % above the Gaussian with the composed loss's exact mean and variance
/// (scipy; an independent estimate, the true PLD being slightly right-skewed). prv_accountant
/// could not be run here with a mesh fine enough to trust (fixtures/reference/SOURCE.md).
#[test]
fn long_horizon_1e8_steps_is_a_pld_bound_within_1pct_of_the_gaussian_moments_estimate() {
    let ev = DpEvent::dpsgd(1.1, 0.004, 100_000_000);
    let r = PldAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert_eq!(r.accountant, Some(AccountantKind::Pld), "{:?}", r.diagnostics);
    assert_eq!(r.kind, BoundKind::UpperBound);
    let rdp = dpaudit::accountants::rdp::RdpAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert!(r.epsilon < rdp.epsilon, "{} vs RDP {}", r.epsilon, rdp.epsilon);
    let g = gauss_moments_eps("dpsgd_q0.004_s1.1_T100000000");
    assert!(
        r.epsilon >= g && r.epsilon <= g * 1.01,
        "{} vs Gaussian-moments estimate {g}",
        r.epsilon
    );
    // The same check at 10⁷ steps, where the PRV estimate we could afford is 3.6 % lower.
    let r7 = PldAccountant::default()
        .epsilon(&DpEvent::dpsgd(1.1, 0.004, 10_000_000), Neighbouring::AddRemove, 1e-5)
        .unwrap();
    let g7 = gauss_moments_eps("dpsgd_q0.004_s1.1_T10000000");
    assert!(r7.epsilon >= g7 && r7.epsilon <= g7 * 1.01, "{} vs {g7}", r7.epsilon);
}

fn certified_lower_eps(case: &str) -> f64 {
    let row = read_csv("fixtures/reference/pld_long_horizon_lower.csv")
        .into_iter()
        .find(|r| r["case"] == case)
        .unwrap_or_else(|| panic!("no row {case} in pld_long_horizon_lower.csv"));
    f(&row, "eps_certified_lower")
}

/// The long-horizon bounds against a *certified lower bound* on the true ε (exponential tilting
/// plus Berry–Esseen, scripts/long_horizon_lower_bound.py, docs/pld.md § Known limits): never below
/// it, and at 10⁸ steps within 1 % above it. The same lower bound puts prv_accountant's 10⁸-step
/// estimate (1153.47 at eps_error 1) 4 % below the truth, so no sound bound can be within 1 % of it.
#[test]
fn long_horizon_bounds_lie_above_the_certified_lower_bound_and_within_1pct_at_1e8() {
    for (t, within) in [(1_000_000u64, None), (10_000_000, None), (100_000_000, Some(1.01))] {
        let r = PldAccountant::default()
            .epsilon(&DpEvent::dpsgd(1.1, 0.004, t), Neighbouring::AddRemove, 1e-5)
            .unwrap();
        assert_eq!(r.accountant, Some(AccountantKind::Pld), "T = {t}: {:?}", r.diagnostics);
        let low = certified_lower_eps(&format!("dpsgd_q0.004_s1.1_T{t}"));
        assert!(
            r.epsilon >= low,
            "T = {t}: ε = {} below the certified lower bound {low}",
            r.epsilon
        );
        if let Some(k) = within {
            assert!(
                r.epsilon <= k * low,
                "T = {t}: ε = {} vs certified lower bound {low}",
                r.epsilon
            );
        }
    }
    // The PRV estimate at 10⁸ steps (eps_error 1; docs/pld.md) cannot be met within 1 % by any sound bound.
    let prv_1e8_estimate = 1153.47;
    assert!(1.01 * prv_1e8_estimate < certified_lower_eps("dpsgd_q0.004_s1.1_T100000000"));
}

/// `account --format json` reads every point of its ε-versus-δ plot from the composition of the
/// headline ε: each point equals `account --delta δ` run alone (GDP, CLT: closed forms; PLD:
/// wherever that δ alone needs no precise composition of its own), and is never below it (RDP:
/// grid orders without the refinement; PLD: the double-precision bound where δ alone would
/// recompose on double words).
#[test]
fn json_profile_points_equal_single_delta_runs() {
    use super::common::{dpaudit, stdout};
    let base = [
        "account",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.004",
        "--steps",
        "10000",
    ];
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        let o = dpaudit(&args);
        assert!(o.status.success(), "{args:?}: {}", super::common::stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let full = run(&["--delta", "1e-5", "--accountant", "all", "--format", "json"]);
    let plot = full["plots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "ε versus δ")
        .expect("ε-versus-δ plot");
    let mut checked = 0;
    for series in plot["series"].as_array().unwrap() {
        if series["bound"].is_null() {
            continue; // not an accountant's curve (the results at the δ in use, marked)
        }
        let name = series["name"].as_str().unwrap();
        let acc = name.split_whitespace().next().unwrap();
        let xs = series["x"].as_array().unwrap();
        let ys = series["y"].as_array().unwrap();
        assert!(!xs.is_empty(), "{name}");
        for (x, y) in xs.iter().zip(ys) {
            let (d, e) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            let one = run(&["--delta", &format!("{d:e}"), "--accountant", acc, "--format", "json"]);
            let r = &one["results"][0];
            let single = r["epsilon"].as_f64().unwrap();
            let recomposed = r["details"].get("double_word_fft").is_some() || r["accountant"] != acc;
            if acc == "rdp" || (acc == "pld" && recomposed) {
                assert!(
                    e >= single * (1.0 - 1e-12),
                    "{acc} δ = {d}: plot {e} below the single run {single}"
                );
            } else {
                assert!(
                    super::common::rel(e, single) <= 1e-12,
                    "{acc} δ = {d}: plot {e} vs single run {single}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "only {checked} points compared for equality");
}

/// The near-truth claims (fixtures/claims/dp-sgd-near-truth.toml, truth from dp_accounting
/// 0.6.0 at grid 1e-5): every claim 0.5 % below the truth is `violated` and every claim 0.5 %
/// above it `holds`, at T = 100, 1,000 and 10,000.
#[test]
fn near_truth_claims_are_decided() {
    use super::common::{dpaudit, stderr};
    let dir = tempfile::tempdir().unwrap();
    let o = dpaudit(&[
        "verify",
        "fixtures/claims/dp-sgd-near-truth.toml",
        "--out",
        dir.path().to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("verify.json")).unwrap()).unwrap();
    let claims = v["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 18);
    for c in claims {
        let id = c["id"].as_str().unwrap();
        let want = if id.ends_with("-low") { "violated" } else { "holds" };
        assert_eq!(c["verdict"], want, "{id}: {c}");
    }
}

/// The lower-bound PLD against dp_accounting 0.6.0 (fixtures/reference/pld_near_truth.csv):
/// never above its pessimistic (upper) PLD at either grid nor above our own upper bound, within
/// 0.5 % of the truth (so claims 0.5 % below it are violated), and tighter than dp_accounting's
/// optimistic privacy-buckets value at grid 1e-5 (which rounds every loss down, T·h/2 too low).
#[test]
fn lower_pld_lies_between_the_optimistic_buckets_and_the_pessimistic_pld() {
    use dpaudit::accountants::pld_lower::epsilon_lower;
    use dpaudit::accountants::sound::PairStep;
    for row in read_csv("fixtures/reference/pld_near_truth.csv") {
        let (q, s, t) = (f(&row, "q"), f(&row, "noise_multiplier"), f(&row, "steps") as u64);
        let what = format!("q {q} σ {s} T {t}");
        let lower = epsilon_lower(
            &[PairStep {
                p: q,
                mu: 1.0 / s,
                count: t,
            }],
            1e-5,
            1e-4,
        )
        .unwrap()
        .epsilon;
        let upper = eps(
            &[PldStep {
                q,
                noise_multiplier: s,
                count: t,
            }],
            1e-5,
        );
        let (p4, p5, o5) = (f(&row, "pess_1e-4"), f(&row, "pess_1e-5"), f(&row, "opt_1e-5"));
        assert!(
            lower <= p5 && lower <= p4 && lower <= upper,
            "{what}: {lower} vs {p5} / {upper}"
        );
        assert!(lower > 0.995 * p5, "{what}: {lower} not within 0.5 % of {p5}");
        assert!(lower >= o5, "{what}: {lower} below the buckets' {o5}");
        assert!(upper < 1.005 * p5, "{what}: upper {upper} not within 0.5 % of {p5}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, rng_seed: RngSeed::Fixed(47), ..ProptestConfig::default() })]
    /// Full batch: lower-bound PLD ≤ exact GDP ε ≤ upper PLD, for any μ, T and δ.
    #[test]
    fn full_batch_lower_pld_exact_gdp_upper_pld_in_order(
        sigma in 0.5f64..20.0,
        t in 1u64..2000,
        log_delta in -9.0f64..-3.0,
    ) {
        use dpaudit::accountants::pld_lower::epsilon_lower;
        use dpaudit::accountants::sound::PairStep;
        let delta = 10f64.powf(log_delta);
        let exact = gdp::epsilon_for_delta((t as f64).sqrt() / sigma, delta).unwrap();
        let upper = eps(&[PldStep { q: 1.0, noise_multiplier: sigma, count: t }], delta);
        let lower = epsilon_lower(&[PairStep { p: 1.0, mu: 1.0 / sigma, count: t }], delta, 1e-4)
            .map_or(0.0, |l| l.epsilon);
        prop_assert!(lower <= exact && exact <= upper, "{lower} ≤ {exact} ≤ {upper}");
        prop_assert!(lower >= exact * 0.999 - 2e-4, "{lower} vs {exact}");
    }
}

/// The exact Laplace PLD against dp_accounting 0.6.0's `LaplacePrivacyLoss` (pessimistic
/// connect-the-dots, fixtures/reference/pld_laplace.csv, grid 1e-5): within 1.01× above it at
/// our grid 1e-5, never below its finer value by more than its own grid error (both are upper
/// bounds of the same curve; ours adds its certified slack), and far below the (1/b, 0) pair's
/// value that the accountant used before.
#[test]
fn laplace_pld_is_within_1pct_of_dp_accounting() {
    let acc = PldAccountant {
        value_discretization_interval: 1e-5,
        ..PldAccountant::default()
    };
    for row in read_csv("fixtures/reference/pld_laplace.csv") {
        let (b, q, t, delta) = (f(&row, "b"), f(&row, "q"), f(&row, "steps") as u64, f(&row, "delta"));
        let lap = DpEvent::Laplace { noise_multiplier: b };
        let step = if q >= 1.0 { lap } else { DpEvent::poisson(q, lap) };
        let ev = DpEvent::repeat(step, t);
        let r = acc.epsilon(&ev, Neighbouring::AddRemove, delta).unwrap();
        let reference = f(&row, "eps_1e-5");
        let what = format!("b {b} q {q} T {t} δ {delta}");
        assert_eq!(r.kind, BoundKind::UpperBound, "{what}");
        assert!(r.epsilon <= 1.01 * reference, "{what}: {} vs {reference}", r.epsilon);
        assert!(
            r.epsilon >= reference * (1.0 - 1e-4),
            "{what}: {} below {reference}",
            r.epsilon
        );
    }
}

/// The steps of one case of fixtures/reference/pld_tiny_epsilon.csv (its generator
/// scripts/gen_tiny_epsilon_reference.py describes them).
fn tiny_epsilon_case(case: &str) -> Vec<PldStep> {
    let edm = |factor: f64, p: f64| -> Vec<PldStep> {
        edm_mus(0.002, factor, "A_t_i")
            .iter()
            .map(|&m| PldStep::gdp(m, p, 1))
            .collect()
    };
    match case {
        "dpsgd_q1e-3_s5_T100" => vec![PldStep {
            q: 1e-3,
            noise_multiplier: 5.0,
            count: 100,
        }],
        "edm_C1_p0.5" => edm(2.0 / 50000.0, 0.5),
        "edm_C1_p0.01" => edm(2.0 / 50000.0, 0.01),
        "edm_Csqrt3072_p0.001" => edm(2.0 * 3072f64.sqrt() / 50000.0, 0.001),
        other => panic!("case {other}"),
    }
}

/// Tiny ε (issue 47, item 3): the grid adapts to the ε scale (docs/pld.md, "Tiny ε"). On every
/// case of fixtures/reference/pld_tiny_epsilon.csv (dp_accounting 0.6.0, δ = 1e-5) the PLD lies
/// above dp_accounting's optimistic (privacy-buckets) value and our certified lower-bound PLD,
/// within 0.5 % of dp_accounting's pessimistic value at its fine grid (so within 1.05× of the
/// smallest sound bound), never above its grid-1e-4 value, and never above RDP.
#[test]
fn tiny_epsilon_pld_is_within_half_a_percent_of_the_converged_value() {
    let rows = read_csv("fixtures/reference/pld_tiny_epsilon.csv");
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let case = r["case"].as_str();
        let steps = tiny_epsilon_case(case);
        let (d, fine, opt) = (f(r, "delta"), f(r, "pess_fine"), f(r, "opt_fine"));
        let e = eps(&steps, d);
        let pairs: Vec<(f64, f64, u64)> = steps.iter().map(|s| (s.q, 1.0 / s.noise_multiplier, s.count)).collect();
        let floor = super::common::certified_floor(&pairs, d, e);
        let mut b = dpaudit::events::EventBuilder::new();
        for s in &steps {
            b.push(DpEvent::dpsgd(s.noise_multiplier, s.q, s.count));
        }
        let ev = b.build();
        let rdp = AccountantKind::Rdp
            .build()
            .epsilon(&ev, Neighbouring::AddRemove, d)
            .unwrap()
            .epsilon;
        assert!(
            e >= opt && e >= floor && floor > 0.99 * opt,
            "{case}: {e} vs optimistic {opt}, floor {floor}"
        );
        assert!(
            e <= 1.005 * fine,
            "{case}: {e} vs dp_accounting {fine} at its fine grid"
        );
        assert!(e <= f(r, "pess_1e-4"), "{case}: {e} above the grid-1e-4 value");
        assert!(e <= rdp, "{case}: PLD {e} above RDP {rdp}");
    }
}

/// q ≤ 1e-10: the grid follows the ε scale down (it printed ≈ 1e-4, its grid, before), and the
/// answer stays above one step's exact ε.
#[test]
fn tiny_sampling_rates_get_a_tiny_epsilon() {
    for &q in &[1e-13, 1e-10, 1e-7] {
        let e = eps(
            &[PldStep {
                q,
                noise_multiplier: 1.0,
                count: 1000,
            }],
            1e-9,
        );
        let one = single_step_eps(q, 1.0, 1e-9);
        assert!(e >= one && e <= 1e3 * q, "q = {q}: ε = {e} (one step {one})");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, rng_seed: RngSeed::Fixed(4703), ..ProptestConfig::default() })]
    /// Full batch at small ε (where the grid is refined): exact GDP ε ≤ PLD ≤ 1.01 × exact GDP,
    /// and δ(ε) never below the exact GDP δ.
    #[test]
    fn full_batch_tiny_epsilon_pld_above_exact_gdp_within_1pct(
        log_sigma in 1.0f64..4.0,
        t in 1u64..2000,
        log_delta in -10.0f64..-3.0,
    ) {
        let sigma = 10f64.powf(log_sigma);
        let delta = 10f64.powf(log_delta);
        let mu = (t as f64).sqrt() / sigma;
        let exact = gdp::epsilon_for_delta(mu, delta).unwrap();
        let pld = PldAccountant::default()
            .compose_steps(&[PldStep { q: 1.0, noise_multiplier: sigma, count: t }])
            .unwrap();
        let e = pld.epsilon(delta);
        prop_assert!(exact <= e && e <= 1.01 * exact + 1e-12, "σ {sigma} T {t} δ {delta}: {e} vs exact {exact}");
        for x in [0.5 * exact, exact, 2.0 * exact] {
            prop_assert!(pld.delta(x) >= gdp::delta_for_epsilon(mu, x) * (1.0 - 1e-12));
        }
    }
}

/// More than 4,096 distinct steps (issue 47, item 5): the leaves are grouped on a ladder that
/// rounds each σ down and each q up (a dominating step), so 10⁴ distinct steps whose μ differ by
/// at most 1e-4 relative get a PLD bound between the uniform compositions at the smallest and
/// (rounded) largest step, named by the `pld_leaves_grouped` diagnostic.
#[test]
fn ten_thousand_distinct_steps_are_grouped_soundly() {
    let (q, n) = (0.01, 10_000u64);
    let sigma = |i: u64| 1.0 / (1.0 + i as f64 * 1e-8);
    let mut b = dpaudit::events::EventBuilder::new();
    for i in 0..n {
        b.push(DpEvent::dpsgd(sigma(i), q, 1));
    }
    let ev = b.build();
    let r = PldAccountant::default()
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert_eq!(r.accountant, Some(AccountantKind::Pld), "{r:?}");
    assert!(r.diagnostics.iter().any(|d| d.code == "pld_leaves_grouped"), "{r:?}");
    let ladder = r.details["leaf_ladder_ratio"];
    assert!(ladder > 0.0 && ladder <= 1e-4, "{ladder}");
    let uniform = |s: f64, q: f64| {
        eps(
            &[PldStep {
                q,
                noise_multiplier: s,
                count: n,
            }],
            1e-5,
        )
    };
    let low = uniform(sigma(0), q);
    let high = uniform(sigma(n) / (1.0 + ladder).powi(2), q * (1.0 + ladder));
    assert!(low <= r.epsilon && r.epsilon <= high, "{low} ≤ {} ≤ {high}", r.epsilon);
    assert!(high <= low * 1.01, "{low} vs {high}");
}

/// 10⁵ distinct steps (a sampler with 10⁵ levels, μ log-spaced over two decades, p = 0.001):
/// a finite PLD bound, above the leakiest step's exact ε and below RDP.
#[test]
fn a_hundred_thousand_distinct_steps_get_a_pld_bound() {
    let n = 100_000usize;
    let steps: Vec<PldStep> = (0..n)
        .map(|i| PldStep::gdp(1e-2 * 10f64.powf(2.0 * i as f64 / n as f64), 1e-3, 1))
        .collect();
    let t = std::time::Instant::now();
    let e = eps(&steps, 1e-5);
    let took = t.elapsed();
    let one = single_step_eps(1e-3, 1.0, 1e-5);
    let mut b = dpaudit::events::EventBuilder::new();
    for s in &steps {
        b.push(DpEvent::dpsgd(s.noise_multiplier, s.q, s.count));
    }
    let rdp = AccountantKind::Rdp
        .build()
        .epsilon(&b.build(), Neighbouring::AddRemove, 1e-5)
        .unwrap()
        .epsilon;
    assert!(
        e.is_finite() && e >= one && e <= rdp,
        "ε = {e} (one step {one}, RDP {rdp})"
    );
    assert!(took.as_secs_f64() < 60.0, "{took:?}");
}
