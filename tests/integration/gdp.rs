//! Integration tests: exact GDP against fixtures/reference/gdp_conv.csv (five independent
//! methods agree to 3e-13: closed form with log-space Brent, scipy bisection, dp_accounting's
//! analytic Gaussian, Opacus, autodp; versions in fixtures/reference/versions.txt).

use super::common::{read_csv, rel};
use dpaudit::accountants::gdp::{self, GdpAccountant};
use dpaudit::accountants::{Accountant, BoundKind};
use dpaudit::events::{DpEvent, Neighbouring};

#[test]
fn gdp_conv_reference_rows() {
    let rows = read_csv("fixtures/reference/gdp_conv.csv");
    assert_eq!(rows.len(), 12);
    for r in &rows {
        let mu: f64 = r["mu"].parse().unwrap();
        let delta: f64 = r["delta"].parse().unwrap();
        let want: f64 = r["eps_closed_form_brentq_logspace"].parse().unwrap();
        let eps = gdp::epsilon_for_delta(mu, delta).unwrap();
        assert!(rel(eps, want) < 1e-9, "mu={mu} delta={delta}: {eps} vs {want}");
        // The other independent methods agree as well.
        for col in [
            "eps_dp_accounting_get_epsilon_gaussian(sigma=1/mu)",
            "eps_autodp_get_eps_ana_gaussian(sigma=1/mu)",
        ] {
            let v: f64 = r[col].parse().unwrap();
            assert!(rel(eps, v) < 1e-9, "{col}: {eps} vs {v}");
        }
        // Through the accountant: μ-GDP as σ = 1/μ, split over 4 steps of μ/2 each.
        let ev = DpEvent::repeat(DpEvent::gaussian(2.0 / mu), 4);
        let res = GdpAccountant.epsilon(&ev, Neighbouring::AddRemove, delta).unwrap();
        assert_eq!(res.kind, BoundKind::Exact);
        assert!(rel(res.epsilon, want) < 1e-9);
        // δ(ε) at the reference ε is δ.
        let d = gdp::delta_for_epsilon(mu, want);
        assert!(rel(d, delta) < 1e-9, "{d}");
        // Safe side: δ at our ε never exceeds the target.
        assert!(gdp::delta_for_epsilon(mu, eps) <= delta * (1.0 + 1e-12));
    }
}

#[test]
fn gdp_hostile_inputs() {
    // μ = 1e4 and δ = 1e-300: finite ε with δ(ε) ≤ δ, and monotone in δ.
    let mut last = 0.0;
    for &d in &[1e-5, 1e-100, 1e-300] {
        let e = gdp::epsilon_for_delta(1e4, d).unwrap();
        assert!(e.is_finite() && e > last, "{d}: {e}");
        let back = gdp::log_delta_for_epsilon(1e4, e);
        assert!(back <= d.ln() + 1e-9, "{d}: ln δ(ε) = {back}");
        last = e;
    }
    // ε for μ = 1e4 is about μ²/2 + μ·Φ⁻¹(1 − δ).
    let e = gdp::epsilon_for_delta(1e4, 1e-300).unwrap();
    assert!(e > 5e7 && e < 5.1e7, "{e}");
    let res = GdpAccountant
        .epsilon(&DpEvent::gaussian(1e-4), Neighbouring::AddRemove, 1e-300)
        .unwrap();
    assert!(rel(res.epsilon, e) < 1e-12);
    // Tiny μ with tiny δ: ε small but positive and still safe.
    let e = gdp::epsilon_for_delta(1e-6, 1e-300).unwrap();
    assert!(e >= 0.0 && gdp::delta_for_epsilon(1e-6, e) <= 1e-300 * (1.0 + 1e-9));
    // δ out of range is an error, not a panic.
    for d in [0.0, 1.0, f64::NAN, -1.0] {
        assert!(GdpAccountant
            .epsilon(&DpEvent::gaussian(1.0), Neighbouring::AddRemove, d)
            .is_err());
    }
}
