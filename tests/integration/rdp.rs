//! Integration tests: the RDP accountant and its conversions, against reference numbers.

use super::common::{read_csv, rel, root};
use dpaudit::accountants::convert::{self, Conversion};
use dpaudit::accountants::rdp::{
    self, dp_accounting_orders, rapid_thm1_epsilon, rdp_poisson_gaussian, rdp_wor_gaussian, RapidOrders, RdpAccountant,
};
use dpaudit::accountants::{Accountant, BoundKind};
use dpaudit::error::ErrorKind;
use dpaudit::events::{DpEvent, Neighbouring};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn f(row: &std::collections::HashMap<String, String>, k: &str) -> f64 {
    row[k].parse().unwrap_or_else(|e| panic!("{k}={}: {e}", row[k]))
}

/// Reads a CSV whose leading `#` lines are provenance comments.
fn read_commented(rel_path: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut rdr = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .from_path(root().join(rel_path))
        .unwrap();
    let h = rdr.headers().unwrap().clone();
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            h.iter()
                .zip(r.iter())
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        })
        .collect()
}

/// fixtures/rdp/rdp_reference.csv: mpmath (60 digits) values, from the binomial sum for integer
/// orders and from numerical integration of the definition for fractional orders
/// (scripts/gen_rdp_reference.py). Our values are upper bounds: never below the truth, and tight.
#[test]
fn poisson_rdp_matches_high_precision_reference() {
    let rows = read_commented("fixtures/rdp/rdp_reference.csv");
    let mut n = 0;
    for r in rows.iter().filter(|r| r["kind"].starts_with("poisson")) {
        let (q, s, a, want) = (f(r, "q_or_gamma"), f(r, "sigma"), f(r, "alpha"), f(r, "mp_rdp"));
        let ours = rdp_poisson_gaussian(q, s, a);
        assert!(
            ours >= want * (1.0 - 1e-15),
            "unsound: q={q} σ={s} α={a}: {ours} < {want}"
        );
        // Integer orders: tight to 1e-9 relative. Fractional orders: 1e-7 relative (the series
        // is cut after ~2000 terms when it converges slowly, q = 0.5 and α ≈ 1, and the rigorous
        // tail bound is added) and ~1e-11 absolute where ln A_α is near the series' ~1e-14
        // rounding allowance (q ≤ 1e-6: 1e-4 in ε after 10⁷ steps).
        let slack = if r["kind"] == "poisson_int" {
            1e-9 * want + 1e-300
        } else {
            1e-7 * want + 1e-11
        };
        assert!(ours - want <= slack, "loose: q={q} σ={s} α={a}: {ours} vs {want}");
        // dp_accounting 0.6.0 sums |terms| of the fractional series (so it is ≥ the truth); we
        // must never be above it by more than rounding.
        let d = f(r, "dpacc_rdp");
        if d.is_finite() && want > 1e-10 {
            assert!(
                ours <= d * (1.0 + 1e-7) + 1e-11,
                "q={q} σ={s} α={a}: {ours} > dp_accounting {d}"
            );
        }
        n += 1;
    }
    // Every poisson_int (108) and poisson_frac (80) row of the file.
    assert_eq!(n, 188);
}

/// WBK 2019 Thm 9 summed in mpmath (integer orders): ours is the minimum of Thm 9, the
/// joint-convexity bound and the Gaussian bound.
#[test]
fn wor_rdp_matches_thm9_reference() {
    let rows = read_commented("fixtures/rdp/rdp_reference.csv");
    let mut n = 0;
    for r in rows.iter().filter(|r| r["kind"] == "wor_int") {
        let (g, s, a, thm9) = (f(r, "q_or_gamma"), f(r, "sigma"), f(r, "alpha"), f(r, "mp_rdp"));
        let x = (a - 1.0) * a / (2.0 * s * s);
        let convexity = (1.0 + g * x.exp_m1()).ln() / (a - 1.0);
        let want = thm9.min(convexity).min(a / (2.0 * s * s));
        // n = 1000·γ·… : γ = m/n exactly representable through m = γ·1e6, n = 1e6.
        let n_rec = 1_000_000u64;
        let m = (g * n_rec as f64).round() as u64;
        let ours = rdp_wor_gaussian(n_rec, m, s, a);
        assert!(ours >= want * (1.0 - 1e-12), "γ={g} σ={s} α={a}: {ours} < {want}");
        assert!(ours <= want * (1.0 + 1e-9), "γ={g} σ={s} α={a}: {ours} > {want}");
        n += 1;
    }
    assert_eq!(n, 28);
}

fn dpsgd_event(r: &std::collections::HashMap<String, String>) -> DpEvent {
    DpEvent::dpsgd(f(r, "noise_multiplier"), f(r, "q"), f(r, "steps_T") as u64)
}

/// Opacus 1.6's default orders (1.1, …, 10.9, 12, …, 63).
fn opacus_orders() -> Vec<f64> {
    let mut v: Vec<f64> = (1..100).map(|x| 1.0 + x as f64 / 10.0).collect();
    v.extend((12..64).map(|x| x as f64));
    v
}

/// fixtures/reference/dpsgd.csv (dp_accounting 0.6.0 RDP, default orders, improved conversion;
/// Opacus 1.6 RDP). With dp_accounting's grid and no refinement we reproduce its ε and order to
/// 1e-6, and Opacus' to 1e-7 with Opacus' grid. The default accountant (every integer order to
/// 256, continuous refinement of α) can only come out *lower*: within 1% on 11 of the 16 rows;
/// 1.8–4.8% lower on five rows, where dp_accounting's optimum sits at 63 or 128 (its grid has
/// nothing in between: we pick α ≈ 75–171) or where the RDP curve bends sharply (σ = 1,
/// T = 7812: ε(12.542) = 0.84931 by mpmath quadrature vs ε(12) = 0.87135; the reference CSV
/// fixtures/rdp/rdp_reference.csv checks the RDP at these chosen orders). Never below PRV's lower
/// bound.
#[test]
fn dpsgd_matches_dp_accounting_rdp() {
    let compat = RdpAccountant::dp_accounting_compatible();
    let classic_compat = RdpAccountant::dp_accounting_compatible().with_conversion(Conversion::Classic);
    let ours = RdpAccountant::default();
    let ours_classic = RdpAccountant::default().with_conversion(Conversion::Classic);
    let rows = read_csv("fixtures/reference/dpsgd.csv");
    assert_eq!(rows.len(), 16);
    let mut within_1pct = 0;
    for r in &rows {
        let ev = dpsgd_event(r);
        let d = f(r, "delta");
        let want = f(r, "eps_dpacc_rdp");
        let c = compat.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(rel(c.epsilon, want) < 1e-6, "{r:?}: {} vs {want}", c.epsilon);
        assert_eq!(c.details["rdp_order"], f(r, "rdp_order"));
        assert_eq!(c.kind, BoundKind::UpperBound);
        let op = RdpAccountant::dp_accounting_compatible().with_orders(opacus_orders());
        let op = op.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(
            rel(op.epsilon, f(r, "eps_opacus_rdp")) < 1e-7,
            "opacus {} vs {}",
            op.epsilon,
            f(r, "eps_opacus_rdp")
        );
        let o = ours.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(
            o.epsilon <= want * (1.0 + 1e-9) && o.epsilon >= want * 0.95,
            "{} vs {want}",
            o.epsilon
        );
        if o.epsilon >= want * 0.99 {
            within_1pct += 1;
        }
        assert!(o.epsilon >= f(r, "eps_prv_low"), "below PRV's lower bound");
        let wc = f(r, "eps_rdp_classic_conversion");
        let cc = classic_compat.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(rel(cc.epsilon, wc) < 1e-6, "classic {} vs {wc}", cc.epsilon);
        let oc = ours_classic.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(
            oc.epsilon <= wc * (1.0 + 1e-9) && oc.epsilon >= wc * 0.95,
            "{} vs {wc}",
            oc.epsilon
        );
        assert!(oc.epsilon > o.epsilon);
    }
    assert!(within_1pct >= 11, "{within_1pct}");
}

/// fixtures/reference/dp_rdm.csv: DP-RDM's CIFAR-10 rows (both noise multipliers in the file),
/// dp_accounting 0.6.0 RDP improved and classic conversion. At the small fractional orders chosen
/// here (α ≈ 2.2) dp_accounting sums the *absolute values* of the alternating fractional series,
/// so its RDP is slightly high: we match it to 5e-3 (2.1e-3 at worst) from below, and Opacus 1.6 (which keeps the
/// signs) to 1e-7.
#[test]
fn dp_rdm_matches_dp_accounting_rdp() {
    let compat = RdpAccountant::dp_accounting_compatible();
    let ours = RdpAccountant::default();
    let rows = read_csv("fixtures/reference/dp_rdm.csv");
    assert_eq!(rows.len(), 10);
    for r in &rows {
        let ev = DpEvent::dpsgd(f(r, "noise_multiplier"), f(r, "q"), f(r, "T") as u64);
        let d = f(r, "delta");
        for (conv, col) in [
            (Conversion::Improved, "eps_dpacc_rdp"),
            (Conversion::Classic, "eps_rdp_classic_conversion"),
        ] {
            let want = f(r, col);
            let c = compat
                .clone()
                .with_conversion(conv)
                .epsilon(&ev, Neighbouring::AddRemove, d)
                .unwrap();
            assert!(rel(c.epsilon, want) < 5e-3, "{col} {r:?}: {} vs {want}", c.epsilon);
            assert!(c.epsilon <= want * (1.0 + 1e-9), "{col} {r:?}: {} vs {want}", c.epsilon);
            if conv == Conversion::Improved {
                let op = compat.clone().with_orders(opacus_orders());
                let op = op.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
                assert!(rel(op.epsilon, f(r, "eps_opacus_rdp")) < 1e-7, "opacus {}", op.epsilon);
            }
            let o = ours
                .clone()
                .with_conversion(conv)
                .epsilon(&ev, Neighbouring::AddRemove, d)
                .unwrap();
            assert!(
                o.epsilon <= want * (1.0 + 1e-9) && o.epsilon >= want * 0.99,
                "{col}: {} vs {want}",
                o.epsilon
            );
            assert!(o.epsilon >= f(r, "eps_prv_low"));
        }
        assert_eq!(
            compat.epsilon(&ev, Neighbouring::AddRemove, d).unwrap().details["rdp_order"],
            f(r, "rdp_order")
        );
    }
}

/// RAPID Theorem 1 without amplification: (α, 2α/σ²) per step, T steps, classic conversion,
/// over the three order sets of dpsgd.csv.
#[test]
fn rapid_theorem1_columns() {
    for r in &read_csv("fixtures/reference/dpsgd.csv") {
        let (s, t, d) = (f(r, "noise_multiplier"), f(r, "steps_T") as u64, f(r, "delta"));
        let (e, a) = rapid_thm1_epsilon(s, t, d, &RapidOrders::Continuous, Conversion::Classic).unwrap();
        assert!(rel(e, f(r, "rapid_thm1_eps_continuous_alpha")) < 1e-9, "{e}");
        assert!(rel(a, f(r, "rapid_alpha_opt")) < 1e-9, "{a}");
        let g = RapidOrders::Grid(dp_accounting_orders());
        let (e, _) = rapid_thm1_epsilon(s, t, d, &g, Conversion::Classic).unwrap();
        assert!(rel(e, f(r, "rapid_thm1_eps_default_orders")) < 1e-9, "{e}");
        let ints = RapidOrders::Integers { lo: 2, hi: 1_000_000 };
        let (e, a) = rapid_thm1_epsilon(s, t, d, &ints, Conversion::Classic).unwrap();
        assert!(rel(e, f(r, "rapid_thm1_eps_integer_orders_2_to_1e6")) < 1e-9, "{e}");
        assert_eq!(a, 2.0);
        // Theorem 1 is the Gaussian RDP at noise multiplier σ/2: the accountant agrees.
        let ev = DpEvent::repeat(DpEvent::gaussian(s / 2.0), t);
        let acc = RdpAccountant::default()
            .with_conversion(Conversion::Classic)
            .with_orders(dp_accounting_orders());
        let mut acc = acc;
        acc.optimize = false;
        let res = acc.epsilon(&ev, Neighbouring::ReplaceOne, d).unwrap();
        assert!(rel(res.epsilon, f(r, "rapid_thm1_eps_default_orders")) < 1e-9);
    }
}

#[test]
fn full_batch_gaussian_same_under_both_relations_and_exact() {
    let ev = DpEvent::repeat(DpEvent::gaussian(2.0), 10);
    let acc = RdpAccountant::default();
    let a = acc.epsilon(&ev, Neighbouring::AddRemove, 1e-6).unwrap();
    let b = acc.epsilon(&ev, Neighbouring::ReplaceOne, 1e-6).unwrap();
    assert_eq!(a.epsilon, b.epsilon);
    // Gaussian RDP is α·10/8; the best ε over continuous α is a closed-form-free check: it must
    // be ≥ the exact (GDP) ε and not much above it.
    let exact = dpaudit::accountants::gdp::epsilon_for_delta((10.0f64).sqrt() / 2.0, 1e-6).unwrap();
    assert!(a.epsilon >= exact && a.epsilon < exact * 1.3, "{} {exact}", a.epsilon);
}

#[test]
fn delta_round_trip_and_composition() {
    let acc = RdpAccountant::default();
    let ev = DpEvent::Composed {
        events: vec![
            DpEvent::dpsgd(1.1, 0.01, 1000),
            DpEvent::NoOp,
            DpEvent::dpsgd(2.0, 0.05, 500),
        ],
    };
    let e = acc.epsilon(&ev, Neighbouring::AddRemove, 1e-6).unwrap();
    let d = acc.delta(&ev, Neighbouring::AddRemove, e.epsilon).unwrap();
    assert!(d.delta <= 1e-6 * (1.0 + 1e-6), "{}", d.delta);
    assert!(d.delta >= 1e-6 * 0.5, "{}", d.delta);
    // Composition adds RDP curves: the composed ε exceeds each part's.
    let e1 = acc
        .epsilon(&DpEvent::dpsgd(1.1, 0.01, 1000), Neighbouring::AddRemove, 1e-6)
        .unwrap();
    assert!(e.epsilon > e1.epsilon);
    let comps = ev.components().unwrap();
    let orders = [2.0, 8.5, 32.0];
    let curve = rdp::rdp_curve(&comps, Neighbouring::AddRemove, &orders).unwrap();
    for (i, &a) in orders.iter().enumerate() {
        let want = 1000.0 * rdp_poisson_gaussian(0.01, 1.1, a) + 500.0 * rdp_poisson_gaussian(0.05, 2.0, a);
        assert!(rel(curve[i], want) < 1e-12);
    }
    let (e2, _) = convert::epsilon_from_rdp(&orders, &curve, 1e-6, Conversion::Improved).unwrap();
    assert!(e2 >= e.epsilon);
    // Nothing private: ε = 0.
    assert_eq!(
        acc.epsilon(&DpEvent::NoOp, Neighbouring::AddRemove, 1e-5)
            .unwrap()
            .epsilon,
        0.0
    );
}

#[test]
fn unsupported_shapes_are_named_by_path() {
    let acc = RdpAccountant::default();
    let ev = DpEvent::Composed {
        events: vec![
            DpEvent::dpsgd(1.0, 0.01, 10),
            DpEvent::EpsilonDelta {
                epsilon: 1.0,
                delta: 1e-6,
            },
        ],
    };
    let e = acc.epsilon(&ev, Neighbouring::AddRemove, 1e-5).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.message.contains("event.events[1]"), "{}", e.message);
    assert!(acc.supports(&ev, Neighbouring::AddRemove).is_err());
    let wor = DpEvent::SampledWithoutReplacement {
        n: 100,
        m: 10,
        event: Box::new(DpEvent::gaussian(1.0)),
    };
    let e = acc.supports(&wor, Neighbouring::AddRemove).unwrap_err();
    assert!(e.message.contains("replace_one"), "{}", e.message);
    assert!(acc.epsilon(&wor, Neighbouring::ReplaceOne, 1e-5).is_ok());
    // Poisson under replace-one: accounted with the joint-convexity bound, and said so.
    let p = acc
        .epsilon(&DpEvent::dpsgd(1.0, 0.01, 100), Neighbouring::ReplaceOne, 1e-5)
        .unwrap();
    assert!(p.diagnostics.iter().any(|d| d.code == "rdp_poisson_replace_one"));
    let ar = acc
        .epsilon(&DpEvent::dpsgd(1.0, 0.01, 100), Neighbouring::AddRemove, 1e-5)
        .unwrap();
    assert!(p.epsilon > ar.epsilon);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let acc = RdpAccountant::default();
    let ev = DpEvent::dpsgd(1.0, 0.01, 10);
    for d in [0.0, 1.0, -1.0, f64::NAN] {
        assert!(acc.epsilon(&ev, Neighbouring::AddRemove, d).is_err(), "δ={d}");
    }
    assert!(acc.delta(&ev, Neighbouring::AddRemove, f64::INFINITY).is_err());
    assert!(acc
        .epsilon(&DpEvent::dpsgd(f64::NAN, 0.01, 10), Neighbouring::AddRemove, 1e-5)
        .is_err());
    let bad_q = DpEvent::repeat(DpEvent::poisson(1.5, DpEvent::gaussian(1.0)), 10);
    let e = acc.epsilon(&bad_q, Neighbouring::AddRemove, 1e-5).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("event.event.q"));
    let bad_orders = RdpAccountant::default().with_orders(vec![0.5, 2.0]);
    assert!(bad_orders.epsilon(&ev, Neighbouring::AddRemove, 1e-5).is_err());
    assert!(RdpAccountant::default()
        .with_orders(vec![])
        .epsilon(&ev, Neighbouring::AddRemove, 1e-5)
        .is_err());
}

/// Hostile inputs: q = 1e-9, σ = 0.3, 10⁷ steps, δ = 1e-300 give finite, sound answers.
#[test]
fn hostile_inputs_give_finite_sound_answers() {
    let acc = RdpAccountant::default();
    for (s, q, t, d) in [
        (0.3, 1e-9, 10_000_000u64, 1e-300),
        (0.3, 1e-9, 10_000_000, 1e-5),
        (0.3, 1.0, 10_000_000, 1e-300),
        (100.0, 1e-9, 1, 1e-300),
        (0.3, 0.5, 10_000_000, 1e-300),
        (50.0, 0.5, 1, 1e-300),
    ] {
        let ev = DpEvent::dpsgd(s, q, t);
        let e = acc.epsilon(&ev, Neighbouring::AddRemove, d).unwrap();
        assert!(e.epsilon.is_finite() && e.epsilon >= 0.0, "{s} {q} {t} {d}: {e:?}");
        let back = acc.delta(&ev, Neighbouring::AddRemove, e.epsilon).unwrap();
        assert!(back.delta <= d * (1.0 + 1e-6), "{s} {q} {t} {d}: δ(ε) = {}", back.delta);
        if q < 1.0 {
            // Never below the RDP of the same Poisson event at a tenth of the steps.
            let small = acc
                .epsilon(&DpEvent::dpsgd(s, q, (t / 10).max(1)), Neighbouring::AddRemove, d)
                .unwrap();
            assert!(e.epsilon >= small.epsilon);
        }
    }
    // A single step at q = 1e-9 is almost perfectly private, but ε is not 0 at δ = 1e-300.
    let e = acc
        .epsilon(&DpEvent::dpsgd(0.3, 1e-9, 1), Neighbouring::AddRemove, 1e-300)
        .unwrap();
    assert!(e.epsilon > 0.0);
}

proptest! {
    // 256 seeded cases: the same inputs every run (a failure prints them).
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: RngSeed::Fixed(0x5244_5001), failure_persistence: None, ..ProptestConfig::default() })]

    /// ε is nondecreasing in the number of steps and in q, nonincreasing in σ.
    #[test]
    fn epsilon_is_monotone(
        q in 1e-4f64..0.5,
        s in 0.5f64..5.0,
        t in 1u64..20_000,
        dq in 1.0f64..3.0,
        ds in 1.0f64..2.0,
        dt in 1u64..5_000,
    ) {
        let acc = RdpAccountant::default();
        let e = |s: f64, q: f64, t: u64| {
            acc.epsilon(&DpEvent::dpsgd(s, q.min(1.0), t), Neighbouring::AddRemove, 1e-5).unwrap().epsilon
        };
        let base = e(s, q, t);
        let tol = 1e-9 * base + 1e-12;
        prop_assert!(e(s, q, t + dt) >= base - tol);
        prop_assert!(e(s, q * dq, t) >= base - tol);
        prop_assert!(e(s * ds, q, t) <= base + tol);
    }
}
