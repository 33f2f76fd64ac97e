//! Theoretical limits on membership inference implied by an accounted guarantee.
//!
//! * (ε, δ)-DP: every test has TPR ≤ e^ε·FPR + δ and 1 − FPR ≤ e^ε(1 − TPR) + δ (Kairouz, Oh &
//!   Viswanath 2015, Thm 2.1), so the balanced accuracy is ASR ≤ (e^ε + δ)/(1 + e^ε)
//!   (diffusion-sampling-privacy App. G after Triastcyn & Faltings 2020, with δ added) and
//!   TPR ≤ min(e^ε·FPR + δ, 1 − e^{−ε}(1 − δ − FPR)).
//! * μ-GDP: TPR ≤ 1 − G_μ(FPR) = Φ(Φ⁻¹(FPR) + μ) and ASR ≤ Φ(μ/2) (Dong, Roth & Su 2022,
//!   Def. 2.5 and the symmetric point of G_μ).
//!
//! [`guarantees`] asks every sound accountant for ε(δ) of a ledger event, and adds the exact GDP μ
//! of the same steps *without* subsampling amplification (a Poisson-subsampled Gaussian is
//! dominated by the full-batch one: C_q(G_μ) ≥ G_μ, DRS Thm 4.2 / §4), which is sound but loose.

pub use super::sound::Evidence;
pub use super::tradeoff::{asr_limit_eps_delta, tpr_limit_eps_delta};
use super::{gdp, AccountantKind, BoundKind};
use crate::error::Result;
use crate::events::{DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric;

/// ASR ≤ Φ(μ/2) for μ-GDP.
#[cfg_attr(not(feature = "models"), allow(dead_code))] // used by the attacks (feature `models`)
pub(crate) fn asr_limit_gdp(mu: f64) -> f64 {
    numeric::ndtr(mu / 2.0)
}

/// TPR ≤ Φ(Φ⁻¹(FPR) + μ) = 1 − G_μ(FPR) for μ-GDP.
pub(crate) fn tpr_limit_gdp(mu: f64, fpr: f64) -> f64 {
    1.0 - gdp::tradeoff(mu, fpr)
}

/// The attack limits of one sound guarantee (an [`Evidence`] whose kind is exact or upper bound).
impl Evidence {
    /// Upper limit on the attack success rate: (e^ε + δ)/(1 + e^ε), or Φ(μ/2) when μ is known and smaller.
    #[cfg_attr(not(feature = "models"), allow(dead_code))] // used by the attacks (feature `models`)
    pub(crate) fn asr_limit(&self) -> f64 {
        let a = asr_limit_eps_delta(self.epsilon, self.delta);
        match self.mu().filter(|_| self.is_upper()) {
            Some(mu) => a.min(asr_limit_gdp(mu)),
            None => a,
        }
    }
    /// Upper limit on the TPR at false-positive rate `fpr` (the smaller of the (ε, δ) and GDP limits).
    pub fn tpr_limit(&self, fpr: f64) -> f64 {
        let a = tpr_limit_eps_delta(self.epsilon, self.delta, fpr);
        match self.mu().filter(|_| self.is_upper()) {
            Some(mu) => a.min(tpr_limit_gdp(mu, fpr)),
            None => a,
        }
    }
}

/// μ of the Gaussian steps of `event` ignoring subsampling amplification (sound; see the module
/// docs). `None` when the event has non-Gaussian parts or sampling without replacement.
pub fn mu_without_amplification(event: &DpEvent) -> Option<f64> {
    let mut sq = 0.0;
    for c in event.components().ok()? {
        match (c.sampling, c.mechanism) {
            (Sampling::Full | Sampling::Poisson { .. }, Mechanism::Gaussian { noise_multiplier }) => {
                sq += c.count as f64 / (noise_multiplier * noise_multiplier)
            }
            _ => return None,
        }
    }
    Some(sq.sqrt())
}

/// Every sound guarantee available for `event` at `delta` under add/remove neighbours (DP-SGD
/// checkpoints are accounted that way); see [`guarantees_for`].
pub fn guarantees(event: &DpEvent, delta: f64) -> (Vec<Evidence>, Vec<String>) {
    guarantees_for(event, Neighbouring::AddRemove, delta)
}

/// As [`guarantees`], under the neighbouring relation `nb`, from the one sound-ε function
/// ([`crate::accountants::sound::sound_epsilon`]); accountants that do not support the event
/// are named in the second list.
pub fn guarantees_for(event: &DpEvent, nb: Neighbouring, delta: f64) -> (Vec<Evidence>, Vec<String>) {
    let s = super::sound::sound_epsilon(event, nb, delta);
    let mut out = Vec::new();
    let skipped = s.unavailable.clone();
    for a in s.analyses.iter().filter(|a| a.is_upper()) {
        let Some(kind) = a.accountant else { continue };
        let mut g = Evidence::of(kind, a.epsilon, a.delta, a.kind);
        if kind == AccountantKind::Gdp && nb == Neighbouring::AddRemove {
            g.set_mu(gdp::composed_mu(event).ok());
        }
        out.push(g);
    }
    if let Some(mu) = mu_without_amplification(event).filter(|_| nb == Neighbouring::AddRemove) {
        if !out.iter().any(|g| g.source() == "gdp") {
            if let Ok(eps) = gdp::epsilon_for_delta(mu, delta) {
                let mut g = Evidence::new(NO_AMPLIFICATION, eps, delta, BoundKind::UpperBound);
                g.set_mu(Some(mu));
                out.push(g);
            }
        }
    }
    (out, skipped)
}

/// The method of the full-batch GDP guarantee of a subsampled event ([`guarantees_for`]): sound
/// (C_q(G_μ) ≥ G_μ, DRS Thm 4.2) but loose, computed by no accountant.
pub(crate) const NO_AMPLIFICATION: &str = "gdp (no amplification)";

/// The tightest of several sound guarantees for a quantity (the minimum of upper limits).
pub fn tightest<F: Fn(&Evidence) -> f64>(gs: &[Evidence], f: F) -> Option<(f64, String)> {
    gs.iter()
        .map(|g| (f(g), g.source().to_string()))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// Theoretical ASR of the sampler stopped at `stop` when each step sees a Poisson subsample at
/// rate `p` (p = 1: exact GDP, Φ(μ/2)); `None` when no sound accountant supports the event yet.
#[cfg_attr(not(feature = "models"), allow(dead_code))] // used by the attacks (feature `models`)
pub(crate) fn sampler_asr(mus: &[f64], p: f64, delta: f64) -> Result<Option<(f64, String)>> {
    if p >= 1.0 {
        let mu = mus.iter().map(|m| m * m).sum::<f64>().sqrt();
        return Ok(Some((asr_limit_gdp(mu), "gdp".into())));
    }
    let event = DpEvent::Composed {
        events: mus
            .iter()
            .map(|&m| DpEvent::poisson(p, DpEvent::gaussian(1.0 / m.max(1e-300))))
            .collect(),
    };
    let (gs, _) = guarantees(&event, delta);
    let gs: Vec<Evidence> = gs.into_iter().filter(|g| g.source() != NO_AMPLIFICATION).collect();
    // The full-batch exact GDP limit also holds under subsampling (C_p(G_μ) ≥ G_μ); an
    // accountant's (ε, δ) limit can be looser, so keep the smaller of the two.
    let full = asr_limit_gdp(mus.iter().map(|m| m * m).sum::<f64>().sqrt());
    Ok(tightest(&gs, |g| g.asr_limit()).map(|(a, src)| {
        if full < a {
            (full, "gdp (full batch dominates)".to_string())
        } else {
            (a, src)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asr_limits_known_values() {
        // App. G: ε = 1 → 73.1%, ε = 5 → 99.33%, ε = 10 → 99.995% (δ = 0).
        assert!((asr_limit_eps_delta(1.0, 0.0) - 0.7311).abs() < 1e-4);
        assert!((asr_limit_eps_delta(5.0, 0.0) - 0.9933).abs() < 1e-4);
        assert!((asr_limit_eps_delta(10.0, 0.0) - 0.99995).abs() < 1e-5);
        assert_eq!(asr_limit_eps_delta(0.0, 0.0), 0.5);
        // μ = 1: Φ(0.5) = 0.691462461274013.
        assert!((asr_limit_gdp(1.0) - 0.691_462_461_274_013).abs() < 1e-12);
        // TPR bound at FPR = 0.01, μ = 1: Φ(Φ⁻¹(0.01) + 1) = Φ(−1.3263478740408408) = 0.0923681...
        let v = tpr_limit_gdp(1.0, 0.01);
        assert!((v - numeric::ndtr(-1.326_347_874_040_840_8)).abs() < 1e-12, "{v}");
        // The (ε, δ) TPR limit is a trade-off bound: at FPR = 0 it is δ.
        assert_eq!(tpr_limit_eps_delta(1.0, 1e-5, 0.0), 1e-5);
    }

    #[test]
    fn no_amplification_mu_is_sound_and_simple() {
        let ev = DpEvent::dpsgd(4.0, 0.1, 16);
        assert!((mu_without_amplification(&ev).unwrap() - 1.0).abs() < 1e-15);
        let (gs, _) = guarantees(&ev, 1e-5);
        assert!(gs.iter().any(|g| g.source() == NO_AMPLIFICATION));
        // Every guarantee's ASR limit is at most the no-amplification one (amplification helps).
        let loose = asr_limit_gdp(1.0);
        for g in &gs {
            assert!(g.asr_limit() <= loose + 1e-12, "{g:?}");
        }
    }
}
