//! DPAgg-TI (paper: ../shared/seeds/dpagg-ti.md): a noisy centroid of m embeddings sampled
//! without replacement from n normalised ones,
//! u* = (1/m) Σ_{i ∈ D_sub} u⁽ⁱ⁾ + N(0, σ² I)   (eq. 7),
//! with σ from the classic Gaussian calibration σ = (Δ/m)·√(2 ln(1.25/δ))/ε (eq. 6 with the
//! centroid over m; Δ = sup‖u⁽ⁱ⁾ − u⁽ʲ⁾‖ = 2 for unit vectors, replace-one adjacency, Def. 1) and
//! the subsampling amplification ε' = ln(1 + (m/n)(e^ε − 1)), δ' = (m/n)·δ (eq. 3, Steinke 2022
//! Thm 29; Balle, Barthe & Gaboardi 2018 for sampling without replacement under substitution).
//!
//! Accounting (at the **claimed** δ, never only at δ' = (m/n)δ): the released centroid is one
//! Gaussian on a subsample of m of n drawn without replacement, replace-one neighbours. Sound
//! upper bounds: the exact Gaussian ε ignoring the sampling; eq. (3) with the best split of δ
//! (below); RDP of the sampled Gaussian (Wang, Balle & Kasiviswanathan 2019, via the RDP
//! accountant). Lower bound (violations): the exact δ of the worst-case pair — all other records
//! equal u', the differing record u = −u', so the output is (1 − m/n)N(0, σ²) + (m/n)N(2/m, σ²)
//! against N(0, σ²) ([`crate::accountants::sound`]).
//!
//! σ readings when the claim does not state σ:
//! - `eq6_sigma` (stated): σ = (2/m)·√(2 ln(1.25/δ))/ε, eq. (6) with the centroid over m;
//! - `calibrated_at_rate`: σ computed numerically for the target (ε, δ) at rate m/n (l. 170):
//!   the smallest σ whose eq. (3) amplification at the best δ split meets the target.
//!
//! This module maps a claim to events and verdicts; the executable mechanism is in
//! [`crate::pipelines::mechanisms`].

use crate::accountants::sound::{Evidence, SoundEpsilon};
use crate::accountants::{gdp, AccountantKind, BoundKind};
use crate::config::claims::DpaggTiClaim;
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};
use crate::numeric::{self, tol};
use crate::pipelines::verdict::{Calibration, Check, ClaimResult, InterpretationSpec};

/// Sensitivity of the *sum* of unit vectors under replace-one: ‖u − u'‖ ≤ 2 (paper §3, l. 157).
pub const UNIT_SUM_SENSITIVITY: f64 = 2.0;

/// The classic Gaussian noise multiplier √(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm A.1; stated
/// for ε < 1). DPAgg-TI eq. (6) uses it.
pub fn classic_noise_multiplier(epsilon: f64, delta: f64) -> f64 {
    (2.0 * (1.25 / delta).ln()).sqrt() / epsilon
}

/// σ of eq. (6) for a centroid over m with sum sensitivity `sum_sensitivity`.
pub fn classic_sigma(sum_sensitivity: f64, m: u64, epsilon: f64, delta: f64) -> f64 {
    sum_sensitivity / m as f64 * classic_noise_multiplier(epsilon, delta)
}

/// The exact ε at δ of a Gaussian mechanism with noise multiplier z: the analytic Gaussian
/// mechanism (Balle & Wang 2018, Thm 8), identical to μ-GDP with μ = 1/z (Dong, Roth & Su 2022,
/// Cor. 2.13). Rounded up by the GDP root finder.
pub fn exact_epsilon(noise_multiplier: f64, delta: f64) -> Result<f64> {
    gdp::epsilon_for_delta(1.0 / noise_multiplier, delta)
}

/// Amplification by sampling m of n without replacement, eq. (3): (ε, δ) → (ε', δ') with
/// ε' = ln(1 + (m/n)(e^ε − 1)) and δ' = (m/n)·δ. Computed with ln_1p/exp_m1 so small ε keep
/// their digits; the result is nudged up by one ulp-scale step so rounding cannot lower it.
pub fn amplify_without_replacement(epsilon: f64, delta: f64, m: u64, n: u64) -> (f64, f64) {
    let r = m as f64 / n as f64;
    let e = (r * epsilon.exp_m1()).ln_1p();
    (e * (1.0 + 4.0 * f64::EPSILON), r * delta)
}

/// The target ε above which the classic formula's σ no longer achieves the target (exact ε of
/// σ > target) for this δ. Returns the *lower* end of the root bracket: the formula is sound
/// for every target ≤ the returned value.
pub fn classic_crossover(delta: f64) -> Result<f64> {
    let gap = |e: f64| exact_epsilon(classic_noise_multiplier(e, delta), delta).map(|x| x - e);
    let lo = 0.5;
    let mut hi = 8.0;
    while gap(hi)? <= 0.0 {
        hi *= 2.0;
        if hi > 1e6 {
            return Err(Error::numeric("classic crossover: no sign change up to ε = 1e6"));
        }
    }
    if gap(lo)? > 0.0 {
        return Err(Error::numeric(format!(
            "classic crossover: formula already unsound at ε = {lo}"
        )));
    }
    let (l, _) = numeric::roots::brent(|e| gap(e).unwrap_or(f64::NAN), lo, hi, tol::ROOT_REL, tol::ROOT_ABS)?;
    Ok(l)
}

/// eq. (3) at the claimed δ with the best split: for every δ₀ with (m/n)·δ₀ ≤ δ the amplified
/// mechanism is (ln(1 + (m/n)(e^{ε₀(δ₀)} − 1)), (m/n)·δ₀)-DP, where ε₀(δ₀) is the exact Gaussian ε;
/// ε₀ falls as δ₀ grows, so the best split spends all of δ: δ₀ = min(δ·n/m, 1⁻). Returns (ε', δ₀),
/// an upper bound at δ. `None` when δ₀ would reach 1 (then the bound says nothing).
pub fn eq3_best_split(noise_multiplier: f64, delta: f64, m: u64, n: u64) -> Result<Option<(f64, f64)>> {
    let r = m as f64 / n as f64;
    let d0 = delta / r;
    if d0 >= 1.0 {
        return Ok(None);
    }
    let e0 = exact_epsilon(noise_multiplier, d0)?;
    let (e, _) = amplify_without_replacement(e0, d0, m, n);
    Ok(Some((e, d0)))
}

/// The smallest noise multiplier whose [`eq3_best_split`] bound at δ meets `target` (the
/// `calibrated_at_rate` reading; six significant digits on the safe side, by the one
/// calibration search, [`crate::accountants::calibrate::search`]). `None` when no σ in
/// [1e-3, 1e6] does.
pub fn calibrate_at_rate(target: f64, delta: f64, m: u64, n: u64) -> Result<Option<f64>> {
    use crate::accountants::calibrate::{search, Domain, Finish, Spec, Trend};
    let spec = Spec {
        name: "noise multiplier".into(),
        target,
        delta,
        trend: Trend::Decreasing,
        domain: Domain::Real { lo: 1e-3, hi: 1e6 },
        start: 1.0,
        finish: Finish::Predicted,
        note: String::new(),
    };
    // Where δ₀ = δ·n/m would reach 1 the bound says nothing: ε = ∞ there.
    let eps =
        |z: f64| -> Result<(f64, ())> { Ok((eq3_best_split(z, delta, m, n)?.map_or(f64::INFINITY, |(e, _)| e), ())) };
    if eps(1e6)?.0 > target {
        return Ok(None);
    }
    Ok(Some(search(&spec, &mut [], &mut |z| eps(z))?.meets.value))
}

/// The bound that makes a claim with δ ≥ m/n trivially true: under replace-one, couple the two
/// samples of m of n by position; the differing record is in the sample with probability m/n,
/// and otherwise both samples, hence both outputs, are equal. So the total variation between the
/// outputs is ≤ m/n and P(S) − Q(S) ≤ m/n for every event S: the release is (0, m/n)-DP whatever
/// σ is (Balle, Barthe & Gaboardi 2018, §5, the coupling of sampling without replacement), and
/// (ε, δ)-DP for every ε ≥ 0 and δ ≥ m/n. Such a claim holds and says nothing: the mechanism
/// may publish the sampled records in the clear.
pub fn trivial_delta_bound(delta: f64, m: u64, n: u64) -> Option<Evidence> {
    let rate = m as f64 / n as f64;
    (delta >= rate).then(|| {
        Evidence::new("trivial_delta", 0.0, delta, BoundKind::UpperBound).with_note(format!(
            "δ = {delta:.4e} ≥ m/n = {rate:.4e}: the differing record is sampled with probability m/n, so the \
             outputs differ in total variation by at most m/n and the release is (0, m/n)-DP whatever σ \
             (coupling of sampling without replacement): the claim is trivially true and guarantees nothing \
             (releasing the sampled records in the clear would meet it)"
        ))
    })
}

/// The sound analyses of one reading: σ (noise std on the centroid) → event and SoundEpsilon.
fn account_reading(
    spec: InterpretationSpec,
    sigma: f64,
    sens: f64,
    c: &DpaggTiClaim,
    paper_eq3_target: Option<f64>,
) -> Result<crate::pipelines::verdict::Interpretation> {
    let (n, m) = (c.n.get(), c.m.get());
    let (eps, delta) = (c.epsilon.get(), c.delta.get());
    let z = sigma / sens;
    let base = DpEvent::gaussian(z);
    let event = DpEvent::SampledWithoutReplacement {
        n,
        m,
        event: Box::new(base.clone()),
    };
    let nb = Neighbouring::ReplaceOne;
    let eps_exact = exact_epsilon(z, delta)?;
    let mut extra: Vec<Evidence> =
        vec![
            Evidence::new("exact_gaussian_no_amplification", eps_exact, delta, BoundKind::Exact)
                .with_accountant(AccountantKind::Gdp)
                .with_note(format!(
        "analytic Gaussian (= GDP μ = 1/z = {:.6}) of the centroid alone: an upper bound for the sampled mechanism",
        1.0 / z
    )),
        ];
    // The exact value of the Gaussian alone is an upper bound for the sampled mechanism, not its
    // exact value: relabel it.
    extra[0].kind = BoundKind::UpperBound;
    if let Some((e3, d0)) = eq3_best_split(z, delta, m, n)? {
        extra.push(
            Evidence::new("eq3_best_split", e3, delta, BoundKind::UpperBound).with_note(format!(
                "eq. (3) on the exact Gaussian ε at δ₀ = δ·n/m = {d0:.4e}, giving δ' = (m/n)δ₀ = δ (the best split)"
            )),
        );
    }
    if let Some(e) = trivial_delta_bound(delta, m, n) {
        extra.push(e);
    }
    if let Some(e) = paper_eq3_target {
        extra.push(
            Evidence::new(
                "eq3_amplified_target",
                e,
                (m as f64 / n as f64) * delta,
                BoundKind::UpperBound,
            )
            .with_note(
                "the paper's reading: eq. (3) on the target ε at δ' = (m/n)δ (sound here: σ achieves the target)",
            ),
        );
    }
    Ok(spec.account(event, nb, delta, eps, |s: &mut SoundEpsilon| {
        for e in extra {
            s.push(e);
        }
    }))
}

/// Verifies one DPAgg-TI claim.
pub fn verify(c: &DpaggTiClaim) -> Result<ClaimResult> {
    let (n, m) = (c.n.get(), c.m.get());
    let (eps, delta) = (c.epsilon.get(), c.delta.get());
    let sum_sens = c.sum_sensitivity.map_or(UNIT_SUM_SENSITIVITY, |s| s.get());
    let sens = sum_sens / m as f64;
    let sampling = format!(
        "{m} of n = {n} without replacement (rate m/n = {:.6})",
        m as f64 / n as f64
    );

    let mut checks = Vec::new();
    let mut findings = Vec::new();
    let mut calibrations = Vec::new();
    let mut interps = Vec::new();

    let describe = |sigma: f64| {
        format!(
            "replace-one neighbours (the paper's Def. 1), centroid of m = {m} sampled without replacement from n = {n}, \
             noise std σ = {sigma:.6} on a centroid of sensitivity {sum_sens}/m"
        )
    };
    let sens_text = format!("Δ = {sum_sens}/m = {sens:.6}");
    let classic = classic_sigma(sum_sens, m, eps, delta);
    let classic_sound = exact_epsilon(classic / sens, delta)? <= eps;
    match c.sigma {
        Some(s) => {
            interps.push(account_reading(
                InterpretationSpec::new(
                    "replace_one_wor",
                    describe(s.get()),
                    sens_text.clone(),
                    sampling.clone(),
                )
                .sigma_reading("σ as stated")
                .stated(),
                s.get(),
                sens,
                c,
                None,
            )?);
        }
        None => {
            let (eps_amp_target, _) = amplify_without_replacement(eps, delta, m, n);
            interps.push(account_reading(
                InterpretationSpec::new("eq6_sigma", describe(classic), sens_text.clone(), sampling.clone())
                    .sigma_reading(format!(
                        "σ = (Δ/m)·√(2 ln(1.25/δ))/ε = {classic:.6} (eq. 6 at the target ε)"
                    ))
                    .stated(),
                classic,
                sens,
                c,
                classic_sound.then_some(eps_amp_target),
            )?);
            if let Some(zb) = calibrate_at_rate(eps, delta, m, n)? {
                let sb = zb * sens;
                calibrations.push(Calibration {
                    what: "sigma_calibrated_at_rate".into(),
                    value: sb,
                    description: format!(
                        "σ for the target (ε = {eps}, δ = {delta:.4e}) at rate m/n by eq. (3) at the best δ split (l. 170)"
                    ),
                });
                interps.push(account_reading(
                    InterpretationSpec::new("calibrated_at_rate", describe(sb), sens_text.clone(), sampling.clone())
                        .sigma_reading(format!(
                            "σ = {sb:.6} calibrated numerically for the target ε at rate m/n (l. 170)"
                        )),
                    sb,
                    sens,
                    c,
                    None,
                )?);
            } else {
                findings.push(format!(
                    "no σ calibrated at rate m/n reaches ε = {eps} at δ = {delta:.4e} (δ·n/m ≥ 1: eq. (3) cannot spend δ)"
                ));
            }
        }
    }

    // Validity-range checks.
    if c.sigma.is_none() {
        let eps_exact = exact_epsilon(classic / sens, delta)?;
        checks.push(Check::new(
            "classic_formula_range",
            eps < 1.0,
            if eps < 1.0 {
                format!("σ from the classic formula (eq. 6) at ε = {eps} < 1: inside its stated range")
            } else {
                format!(
                    "σ from the classic formula (eq. 6) at ε = {eps} ≥ 1: outside the range ε < 1 of Dwork–Roth Thm A.1"
                )
            },
        ));
        let cross = classic_crossover(delta)?;
        checks.push(Check::new(
            "classic_formula_sound",
            classic_sound,
            format!(
                "the σ of eq. (6) gives exact ε = {eps_exact:.6} at δ = {delta:.4e} ({} the target {eps}); \
                 for this δ the formula is sound for targets up to ε ≈ {cross:.6} and unsound beyond",
                if classic_sound { "≤" } else { ">" }
            ),
        ));
        if !classic_sound {
            findings.push(format!(
                "eq. (6) is outside its validity range here: σ gives ε = {eps_exact:.4} > {eps} before amplification"
            ));
        }
    }
    let one_over_n = 1.0 / n as f64;
    checks.push(Check::new(
        "delta_vs_n",
        delta < one_over_n,
        format!(
            "δ = {delta:.4e} vs 1/n = {one_over_n:.4e}: {}",
            if delta < one_over_n {
                "δ < 1/n"
            } else {
                "δ ≥ 1/n permits mechanisms that publish a whole record with non-negligible probability; prefer δ ≪ 1/n"
            }
        ),
    ));
    let rate = m as f64 / n as f64;
    if delta >= rate {
        checks.push(Check::new(
            "delta_below_sampling_rate",
            false,
            format!(
                "δ = {delta:.4e} ≥ m/n = {rate:.4e}: every mechanism on a sample of m of n is (0, m/n)-DP, so the \
                 claim is trivially true (it holds whatever σ) and guarantees nothing"
            ),
        ));
        findings.push(format!(
            "the claim is trivially true: δ = {delta:.4e} ≥ m/n = {rate:.4e}, and sampling m of n without replacement \
             alone makes any release (0, m/n)-DP (it could publish the sampled records in the clear)"
        ));
    }
    checks.push(Check::new(
        "unit_norm_embeddings",
        c.sum_sensitivity.is_none() || sum_sens <= UNIT_SUM_SENSITIVITY,
        "Δ = 2 assumes every embedding is normalised to ‖u‖ = 1 before averaging (run `dpaudit run dpagg-ti` \
         with its sensitivity audit to check an implementation)",
    ));

    let mut r = ClaimResult::new(&c.id, "dpagg_ti", &c.source, &c.dataset, eps, delta, interps, vec![]);
    r.checks = checks;
    r.findings = findings;
    r.calibrations = calibrations;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_sigma_matches_reference_row() {
        // fixtures/reference/dpagg_ti.csv row n=158, m=4, ε=0.1: σ = 16.25690404772873.
        let s = classic_sigma(2.0, 4, 0.1, 1.0 / 158.0);
        assert!((s - 16.25690404772873).abs() / 16.25690404772873 < 1e-13, "{s}");
    }

    #[test]
    fn amplification_small_eps_keeps_digits() {
        let (e, d) = amplify_without_replacement(1e-12, 1e-5, 1, 2);
        assert!((e - 0.5e-12).abs() / 0.5e-12 < 1e-9);
        assert_eq!(d, 0.5e-5);
    }
}
