//! Gaussian differential privacy (Dong, Roth & Su 2022, "Gaussian differential privacy").
//!
//! A Gaussian mechanism with noise multiplier σ is μ-GDP with μ = 1/σ (Thm 2.7), and μᵢ-GDP
//! mechanisms compose to √(Σμᵢ²)-GDP exactly (Cor. 3.3). μ-GDP is (ε, δ(ε))-DP for all ε ≥ 0 with
//! δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Cor. 2.13), and this is tight.

use super::{check_delta, check_epsilon, Accountant, AccountantKind, BoundKind, Evidence};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric::{self, log_ndtr, log_sub_exp};

/// Exact accountant for compositions of full-batch Gaussian mechanisms.
#[derive(Debug, Clone, Copy, Default)]
pub struct GdpAccountant;

/// ln δ(ε) for μ-GDP (DRS Cor. 2.13), computed in log space so it stays finite for any μ
/// and for δ far below 1e-300.
pub fn log_delta_for_epsilon(mu: f64, epsilon: f64) -> f64 {
    if mu <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if mu.is_infinite() {
        return 0.0;
    }
    let a = log_ndtr(-epsilon / mu + mu / 2.0);
    let b = epsilon + log_ndtr(-epsilon / mu - mu / 2.0);
    if b >= a {
        // Only reachable through rounding when δ is below ~1e-308 relative to the terms.
        return f64::NEG_INFINITY;
    }
    log_sub_exp(a, b)
}

/// δ(ε) for μ-GDP (DRS Cor. 2.13).
pub fn delta_for_epsilon(mu: f64, epsilon: f64) -> f64 {
    log_delta_for_epsilon(mu, epsilon).exp()
}

/// The smallest ε with δ(ε) ≤ δ for μ-GDP, rounded up (the returned ε satisfies δ(ε) ≤ δ).
/// No fixed search interval: the bracket grows until it contains the root, so μ = 1e4 works.
pub fn epsilon_for_delta(mu: f64, delta: f64) -> Result<f64> {
    if mu <= 0.0 {
        return Ok(0.0);
    }
    if !mu.is_finite() {
        return Ok(f64::INFINITY);
    }
    let target = delta.ln();
    if log_delta_for_epsilon(mu, 0.0) <= target {
        return Ok(0.0);
    }
    // ln δ(ε) is decreasing in ε: find the root of g(ε) = −ln δ(ε) increasing.
    let start = (mu * mu / 2.0 + mu * 2.0).max(1.0);
    let e = numeric::find_increasing_root(|e| -log_delta_for_epsilon(mu, e), -target, 0.0, start)?;
    Ok(e + root_margin(mu, e))
}

/// How far the computed root of ln δ(ε) = ln δ can sit below the true one: the rounding error of
/// ln δ(ε) = a + ln(1 − e^{b−a}) (a, b the two log-Φ terms of Cor. 2.13, each within a relative
/// `LOG_NDTR_REL` of the truth: `erfc` and `ln` are each within an ulp, so 2e-15 leaves a factor
/// of four; the difference is amplified by K = e^{b−a}/(1 − e^{b−a}) when the terms nearly
/// cancel, as they do for small μ) divided by the slope |d ln δ/dε| = e^{b − ln δ}. Added to the
/// root so that "exact" stays on the safe side (at μ = 0.001, 7 × 10⁻¹² of ε against a found
/// error of 2 × 10⁻¹³; for μ ≳ 0.1 a few ulps).
fn root_margin(mu: f64, epsilon: f64) -> f64 {
    const LOG_NDTR_REL: f64 = 2e-15;
    let a = log_ndtr(-epsilon / mu + mu / 2.0);
    let b = epsilon + log_ndtr(-epsilon / mu - mu / 2.0);
    if !(a.is_finite() && b.is_finite() && b < a) {
        return 4.0 * f64::EPSILON * epsilon.abs();
    }
    let d = b - a;
    let k = d.exp() / -d.exp_m1();
    let ld = log_sub_exp(a, b);
    let err = LOG_NDTR_REL * (a.abs() + k * (a.abs() + b.abs()) + ld.abs() + 1.0);
    let slope = (b - ld).exp();
    let m = err / slope;
    (if m.is_finite() { m } else { 0.0 }) + 4.0 * f64::EPSILON * epsilon.abs()
}

/// The GDP trade-off function G_μ(α) = Φ(Φ⁻¹(1 − α) − μ): the smallest type II error of any
/// test at type I error α (DRS Def. 2.5).
pub fn tradeoff(mu: f64, alpha: f64) -> f64 {
    numeric::ndtr(numeric::ndtri_sf(alpha) - mu)
}

/// Composed μ of the full-batch Gaussian components of `event` (Cor. 3.3); errors name
/// sub-events that are not full-batch Gaussians.
pub fn composed_mu(event: &DpEvent) -> Result<f64> {
    let mut sum_sq = 0.0f64;
    for c in event.components()? {
        match (c.sampling, c.mechanism) {
            (Sampling::Full, Mechanism::Gaussian { noise_multiplier }) => {
                sum_sq += c.count as f64 / (noise_multiplier * noise_multiplier);
            }
            (Sampling::Full, Mechanism::Laplace { .. }) => {
                let at = crate::events::find_path(event, "event", &|e| {
                    matches!(e, DpEvent::Laplace { .. }).then(String::new)
                });
                let path = at.map(|(p, _)| format!("{p}: ")).unwrap_or_default();
                return Err(Error::unsupported(format!(
                    "gdp: {path}a Laplace mechanism is not exactly GDP (its trade-off curve is not G_μ; it is only \
                     dominated by one): use the pld or rdp accountant"
                )));
            }
            (Sampling::Full, _) => {
                let at = crate::events::find_path(event, "event", &|e| {
                    matches!(e, DpEvent::EpsilonDelta { .. }).then(String::new)
                });
                let path = at.map(|(p, _)| format!("{p}: ")).unwrap_or_default();
                return Err(Error::unsupported(format!(
                    "gdp: {path}only Gaussian mechanisms are GDP; found an (ε, δ)-DP event"
                )));
            }
            (s, _) => {
                let at = crate::events::find_path(event, "event", &|e| {
                    let sampled = matches!(e, DpEvent::PoissonSampled { q, .. } if *q < 1.0)
                        || matches!(e, DpEvent::SampledWithoutReplacement { .. });
                    sampled.then(String::new)
                });
                let path = at.map(|(p, _)| format!("{p}: ")).unwrap_or_default();
                let how = match s {
                    crate::events::Sampling::Poisson { q } => {
                        format!("Poisson sampling, q = {}", crate::numeric::format::sig6(q))
                    }
                    crate::events::Sampling::WithoutReplacement { n, m } => {
                        format!("sampling without replacement, {m} of {n}")
                    }
                    crate::events::Sampling::Full => "full batch".to_string(),
                };
                return Err(Error::unsupported(format!(
                    "gdp: {path}subsampled events ({how}) are not exactly GDP; use the clt estimate or the pld/rdp bounds"
                )));
            }
        }
    }
    Ok(sum_sq.sqrt())
}

impl Accountant for GdpAccountant {
    fn kind(&self) -> AccountantKind {
        AccountantKind::Gdp
    }
    fn supports(&self, event: &DpEvent, _neighbouring: Neighbouring) -> Result<()> {
        if event.non_private_path().is_some() {
            return Ok(());
        }
        composed_mu(event).map(|_| ())
    }
    fn epsilon(&self, event: &DpEvent, _neighbouring: Neighbouring, delta: f64) -> Result<Evidence> {
        check_delta(delta)?;
        if let Some(r) = super::non_private_epsilon(AccountantKind::Gdp, event, delta) {
            return Ok(r);
        }
        let mu = composed_mu(event)?;
        if let Some(r) = super::uncertified_epsilon(AccountantKind::Gdp, event, delta) {
            return Ok(r);
        }
        let eps = epsilon_for_delta(mu, delta)?;
        Ok(Evidence::of(AccountantKind::Gdp, eps, delta, BoundKind::Exact).with_detail("mu", mu))
    }
    fn delta(&self, event: &DpEvent, _neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence> {
        check_epsilon(epsilon)?;
        if let Some(r) = super::non_private_delta(AccountantKind::Gdp, event, epsilon) {
            return Ok(r);
        }
        let mu = composed_mu(event)?;
        if let Some(r) = super::uncertified_delta(AccountantKind::Gdp, event, epsilon) {
            return Ok(r);
        }
        // A δ below the f64 range is not rounded to 0: it becomes the next double above it,
        // labelled an upper bound, with ln δ beside it.
        let ld = log_delta_for_epsilon(mu, epsilon);
        let (delta, underflow) = crate::numeric::exp_upper(ld);
        let mut res = Evidence::of(
            AccountantKind::Gdp,
            epsilon,
            delta,
            if underflow {
                BoundKind::UpperBound
            } else {
                BoundKind::Exact
            },
        )
        .with_detail("mu", mu);
        if underflow {
            res = res.with_detail("log_delta", ld).with_diagnostic(
                "delta_below_f64_range",
                format!("δ = e^{ld} is below the f64 range; reported as {delta:e}, an upper bound"),
                false,
            );
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdp_closed_form_roundtrip_large_mu() {
        for &mu in &[0.01, 0.5, 1.0, 40.0, 787.6, 1e4] {
            for &d in &[1e-5, 1e-12, 1e-300] {
                let e = epsilon_for_delta(mu, d).unwrap();
                assert!(e.is_finite() && e > 0.0, "mu={mu} d={d} e={e}");
                let back = delta_for_epsilon(mu, e);
                assert!(back <= d * (1.0 + 1e-9), "mu={mu} d={d} back={back}");
                assert!(back >= d * (1.0 - 1e-6), "mu={mu} d={d} back={back}");
            }
        }
    }

    /// ε of μ-GDP is never below the true root (the values checked against 50-digit mpmath:
    /// μ = 0.001 gives 0.00193872496986011 at δ = 1e-5, μ = 1/1.7 gives 2.39108233160104630; the
    /// unpadded root was 2 × 10⁻¹³ and 9 × 10⁻¹⁶ below them).
    #[test]
    fn epsilon_is_on_the_safe_side_of_the_true_root() {
        for (mu, want) in [(0.001, 0.00193872496986011), (1.0 / 1.7, 2.391_082_331_601_046)] {
            let e = epsilon_for_delta(mu, 1e-5).unwrap();
            assert!(e >= want, "μ = {mu}: {e} < {want}");
            assert!((e - want) / want < 1e-10, "μ = {mu}: {e} too far above {want}");
        }
    }

    #[test]
    fn tradeoff_endpoints() {
        assert!((tradeoff(1.0, 1.0)).abs() < 1e-15);
        assert!((tradeoff(0.0, 0.3) - 0.7).abs() < 1e-15);
    }
}
