//! Calibration: the noise multiplier, sampling rate or number of steps that meets a target ε
//! at a given δ, for any [`Accountant`], landing on the safe side.
//!
//! ε is monotone in each parameter (decreasing in σ, increasing in q and in the number of
//! steps), so a bracketing search is enough: exponential expansion until the target is
//! bracketed, then Brent's method ([`crate::numeric::brent`]) on ln σ / ln q, or bisection on
//! the integer steps. The end of the final bracket on the safe side is taken, then *re-checked*
//! with the accountant; if rounding or a non-smooth accountant (PLD discretisation) put it on
//! the wrong side, it is moved further to the safe side until the accountant agrees.

use super::{check_delta, AccountResult, Accountant, BoundKind};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};
use crate::numeric::{brent, tol};

/// Which parameter is solved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SolveFor {
    /// Solve for σ, the Gaussian noise multiplier.
    NoiseMultiplier,
    /// Solve for q, the Poisson sampling rate.
    SampleRate,
    /// Solve for the number of steps.
    Steps,
}

impl SolveFor {
    /// The CLI spelling (`noise-multiplier`, `sample-rate`, `steps`).
    pub fn as_str(self) -> &'static str {
        match self {
            SolveFor::NoiseMultiplier => "noise-multiplier",
            SolveFor::SampleRate => "sample-rate",
            SolveFor::Steps => "steps",
        }
    }
}

/// The DP-SGD shape `steps × Poisson(q) ∘ Gaussian(σ)`; the parameter being solved for is
/// ignored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpSgd {
    /// Noise multiplier σ of each Gaussian step.
    pub noise_multiplier: f64,
    /// Poisson sampling rate q in (0, 1].
    pub sample_rate: f64,
    /// Number of steps.
    pub steps: u64,
}

impl DpSgd {
    fn event(&self) -> DpEvent {
        DpEvent::dpsgd(self.noise_multiplier, self.sample_rate, self.steps)
    }
}

/// The answer of a calibration.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Which parameter was solved for.
    pub solve_for: SolveFor,
    /// The value found (σ, q, or steps as f64), on the safe side of the target.
    pub value: f64,
    /// The accountant's answer at `value` (ε ≤ target).
    pub result: AccountResult,
    /// The event that was accounted at `value`.
    pub event: DpEvent,
    /// Accountant calls made.
    pub evaluations: usize,
}

/// Search limits.
const SIGMA_MIN: f64 = 1e-4;
const SIGMA_MAX: f64 = 1e6;
const Q_MIN: f64 = 1e-12;
const STEPS_MAX: u64 = 1 << 50;
/// Most accountant evaluations one calibration may make (the bracketing expansion needs ≤ 60,
/// the root search ≤ 60, the safe-side re-check ≤ 60): a search that has not converged by then
/// stops with a "no solution in range" error instead of running on (each PLD evaluation can
/// take a second).
pub const MAX_EVALUATIONS: usize = 240;

fn estimate_note(acc: &dyn Accountant, kind: Option<BoundKind>) -> String {
    match kind {
        Some(BoundKind::Estimate) => format!(
            " (note: the {} accountant gives an estimate, not a bound: the calibrated value is not a guarantee)",
            acc.kind().as_str()
        ),
        _ => String::new(),
    }
}

/// Finds the parameter `solve_for` of a DP-SGD-style event so that `acc` reports ε ≤ `target`
/// at `delta`; the other parameters come from `fixed`.
pub fn calibrate_dpsgd(
    acc: &dyn Accountant,
    neighbouring: Neighbouring,
    delta: f64,
    target: f64,
    fixed: DpSgd,
    solve_for: SolveFor,
) -> Result<Calibration> {
    let make: Box<dyn Fn(f64) -> DpEvent> = match solve_for {
        SolveFor::NoiseMultiplier => Box::new(move |s| {
            DpSgd {
                noise_multiplier: s,
                ..fixed
            }
            .event()
        }),
        SolveFor::SampleRate => Box::new(move |q| {
            DpSgd {
                sample_rate: q,
                ..fixed
            }
            .event()
        }),
        SolveFor::Steps => Box::new(move |n| {
            DpSgd {
                steps: n as u64,
                ..fixed
            }
            .event()
        }),
    };
    calibrate(acc, neighbouring, delta, target, solve_for, &*make)
}

/// [`calibrate_dpsgd`] with `primary`; when it finds no value in range (or the target is
/// unreachable for it), the other sound accountants (gdp, rdp, pld) are tried and the best value
/// any of them certifies is returned (smallest σ, largest q, most steps), its result labelled
/// with the accountant that certified it. The second element says why the fallback ran. Every
/// accountant's answer is a sound bound, so the value found meets the target whichever
/// certified it; an estimate (clt) is never a fallback.
pub(crate) fn calibrate_dpsgd_any(
    primary: super::AccountantKind,
    neighbouring: Neighbouring,
    delta: f64,
    target: f64,
    fixed: DpSgd,
    solve_for: SolveFor,
) -> Result<(Calibration, Option<String>)> {
    use super::AccountantKind as K;
    let first = match calibrate_dpsgd(&*primary.build(), neighbouring, delta, target, fixed, solve_for) {
        Ok(c) => return Ok((c, None)),
        Err(e) => e,
    };
    if primary == K::Clt || !matches!(first.kind, crate::error::ErrorKind::Numeric) {
        return Err(first);
    }
    let better = |a: &Calibration, b: &Calibration| match solve_for {
        SolveFor::NoiseMultiplier => a.value < b.value,
        SolveFor::SampleRate | SolveFor::Steps => a.value > b.value,
    };
    let mut best: Option<Calibration> = None;
    for kind in [K::Gdp, K::Rdp, K::Pld] {
        if kind == primary {
            continue;
        }
        let acc = kind.build();
        if let Ok(c) = calibrate_dpsgd(&*acc, neighbouring, delta, target, fixed, solve_for) {
            if c.result.kind.is_sound() && best.as_ref().is_none_or(|b| better(&c, b)) {
                best = Some(c);
            }
        }
    }
    match best {
        Some(c) => {
            let why = format!(
                "the {} accountant certifies no {} in range ({}); the {} accountant's upper bound does",
                primary.as_str(),
                solve_for.as_str(),
                first.message,
                c.result.accountant.as_str()
            );
            Ok((c, Some(why)))
        }
        None => Err(first),
    }
}

/// Generic calibration: `make(x)` builds the event for parameter value x (σ > 0, q ∈ (0, 1],
/// or an integer number of steps ≥ 1, according to `solve_for`). ε must be monotone in x
/// (decreasing for σ, increasing for q and steps).
pub fn calibrate(
    acc: &dyn Accountant,
    neighbouring: Neighbouring,
    delta: f64,
    target: f64,
    solve_for: SolveFor,
    make: &dyn Fn(f64) -> DpEvent,
) -> Result<Calibration> {
    check_delta(delta)?;
    if !(target > 0.0 && target.is_finite()) {
        return Err(Error::field(
            "target-epsilon",
            format!("target ε must be finite and > 0, got {target}"),
        ));
    }
    // ε = ∞ whatever the parameter when the event holds a non-private part: no search.
    if let Some(path) = make(1.0).non_private_path() {
        return Err(Error::unsupported(format!(
            "nothing to calibrate: {path} is non-private (no guarantee), so ε = ∞ at δ = {delta} for every {}",
            solve_for.as_str()
        )));
    }
    let mut evals = 0usize;
    let mut last_kind = None;
    let mut eps_at = |x: f64| -> Result<AccountResult> {
        evals += 1;
        if evals > MAX_EVALUATIONS {
            return Err(Error::numeric(format!(
                "no solution in range: calibrating {} for ε = {target} at δ = {delta} did not converge within \
                 {MAX_EVALUATIONS} accountant evaluations (the accountant's ε is not monotone enough here); \
                 try another accountant",
                solve_for.as_str()
            )));
        }
        let r = acc.epsilon(&make(x), neighbouring, delta)?;
        last_kind = Some(r.kind);
        Ok(r)
    };
    let value = match solve_for {
        SolveFor::NoiseMultiplier => {
            // ε decreasing in σ: search ln σ. Bracket [lo, hi] with ε(lo) > target ≥ ε(hi).
            let mut hi = 1.0f64;
            let mut e_hi = eps_at(hi)?.epsilon;
            let mut lo;
            if e_hi > target {
                loop {
                    lo = hi;
                    hi *= 2.0;
                    if hi > SIGMA_MAX {
                        return Err(Error::numeric(format!(
                            "no solution in range σ ≤ {SIGMA_MAX:e}: target ε = {target} at δ = {delta} is unreachable: even σ = {SIGMA_MAX:e} gives ε = {e_hi}{}",
                            estimate_note(acc, last_kind)
                        )));
                    }
                    e_hi = eps_at(hi)?.epsilon;
                    if e_hi <= target {
                        break;
                    }
                }
            } else {
                lo = hi;
                loop {
                    lo /= 2.0;
                    if lo < SIGMA_MIN {
                        // Any σ ≥ SIGMA_MIN meets the target: report the smallest searched.
                        lo = SIGMA_MIN;
                        break;
                    }
                    let e = eps_at(lo)?.epsilon;
                    if e > target {
                        break;
                    }
                    hi = lo;
                }
            }
            if lo == SIGMA_MIN && eps_at(lo)?.epsilon <= target {
                lo
            } else {
                let (_, up) = brent(
                    |l| match eps_at(l.exp()) {
                        Ok(r) => r.epsilon - target,
                        Err(_) => f64::NAN,
                    },
                    lo.ln(),
                    hi.ln(),
                    tol::CALIBRATE_REL,
                    tol::CALIBRATE_REL,
                )?;
                up.exp().max(lo).min(hi)
            }
        }
        SolveFor::SampleRate => {
            // ε increasing in q: search ln q on [Q_MIN, 1].
            let e1 = eps_at(1.0)?.epsilon;
            if e1 <= target {
                1.0
            } else {
                let e_min = eps_at(Q_MIN)?.epsilon;
                if e_min > target {
                    return Err(Error::numeric(format!(
                        "no solution in range q ≥ {Q_MIN:e}: target ε = {target} at δ = {delta} is unreachable: even q = {Q_MIN:e} gives ε = {e_min}{}",
                        estimate_note(acc, last_kind)
                    )));
                }
                let (down, _) = brent(
                    |l| match eps_at(l.exp()) {
                        Ok(r) => r.epsilon - target,
                        Err(_) => f64::NAN,
                    },
                    Q_MIN.ln(),
                    0.0,
                    tol::CALIBRATE_REL,
                    tol::CALIBRATE_REL,
                )?;
                down.exp().clamp(Q_MIN, 1.0)
            }
        }
        SolveFor::Steps => {
            // ε increasing in steps: largest n with ε(n) ≤ target.
            let e1 = eps_at(1.0)?.epsilon;
            if e1 > target {
                return Err(Error::numeric(format!(
                    "target ε = {target} at δ = {delta} is unreachable: a single step already gives ε = {e1}{}",
                    estimate_note(acc, last_kind)
                )));
            }
            let mut lo = 1u64;
            let mut hi = 2u64;
            // PLD evaluations at large step counts are expensive: start the expansion from the
            // answer of the (cheap) RDP accountant when PLD confirms it, which saves the ~log₂ n
            // doublings. The search itself is unchanged, so the answer is too.
            if acc.kind() == super::AccountantKind::Pld {
                if let Some(seed) = rdp_steps_seed(make, neighbouring, delta, target) {
                    if seed > lo && eps_at(seed as f64)?.epsilon <= target {
                        lo = seed;
                        hi = seed.saturating_mul(2);
                    }
                }
            }
            loop {
                if eps_at(hi as f64)?.epsilon > target {
                    break;
                }
                lo = hi;
                hi = hi.saturating_mul(2);
                if hi > STEPS_MAX {
                    return Err(Error::numeric(format!(
                        "no solution in range steps ≤ 2^50: the target ε = {target} is met for every number of steps up to {lo}: no finite answer{}",
                        estimate_note(acc, last_kind)
                    )));
                }
            }
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if eps_at(mid as f64)?.epsilon <= target {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo as f64
        }
    };
    // Re-check with the accountant and step to the safe side if needed.
    let mut x = value;
    let mut r = eps_at(x)?;
    let mut factor = 1e-9;
    let mut step_down = 1.0f64;
    for _ in 0..60 {
        if r.epsilon <= target {
            break;
        }
        x = match solve_for {
            SolveFor::NoiseMultiplier => x * (1.0 + factor),
            SolveFor::SampleRate => x * (1.0 - factor.min(0.5)),
            SolveFor::Steps => {
                if x <= 1.0 {
                    return Err(Error::numeric(format!(
                        "target ε = {target} is unreachable: a single step gives ε = {}{}",
                        r.epsilon,
                        estimate_note(acc, last_kind)
                    )));
                }
                // Geometric steps: a non-smooth accountant (PLD discretisation) cannot make
                // this walk down one step at a time.
                let next = (x - step_down).max(1.0);
                step_down *= 2.0;
                next
            }
        };
        factor *= 4.0;
        r = eps_at(x)?;
    }
    if r.epsilon > target {
        return Err(Error::numeric(format!(
            "calibration could not reach the safe side of ε = {target} (last ε = {} at {} = {x}){}",
            r.epsilon,
            solve_for.as_str(),
            estimate_note(acc, last_kind)
        )));
    }
    Ok(Calibration {
        solve_for,
        value: x,
        event: make(x),
        result: r,
        evaluations: evals,
    })
}

/// The largest number of steps whose RDP ε is ≤ `target` (None when RDP cannot account the
/// event or no such number ≤ 2⁵⁰ exists). Only a starting point for another accountant's search.
fn rdp_steps_seed(make: &dyn Fn(f64) -> DpEvent, nb: Neighbouring, delta: f64, target: f64) -> Option<u64> {
    let rdp = super::rdp::RdpAccountant::default();
    let ok = |n: u64| -> Option<bool> {
        rdp.epsilon(&make(n as f64), nb, delta)
            .ok()
            .map(|r| r.epsilon <= target)
    };
    if !ok(1)? {
        return None;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while ok(hi)? {
        lo = hi;
        hi = hi.saturating_mul(2);
        if hi > STEPS_MAX {
            return None;
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::{clt::CltAccountant, gdp::GdpAccountant, AccountantKind};

    fn fixed() -> DpSgd {
        DpSgd {
            noise_multiplier: 1.1,
            sample_rate: 0.01,
            steps: 1000,
        }
    }

    #[test]
    fn gdp_noise_multiplier_lands_on_safe_side_and_is_tight() {
        let acc = GdpAccountant;
        for &target in &[0.5, 1.0, 3.0, 8.0, 50.0] {
            let f = DpSgd {
                sample_rate: 1.0,
                steps: 100,
                ..fixed()
            };
            let c = calibrate_dpsgd(
                &acc,
                Neighbouring::AddRemove,
                1e-5,
                target,
                f,
                SolveFor::NoiseMultiplier,
            )
            .unwrap();
            let again = acc.epsilon(&c.event, Neighbouring::AddRemove, 1e-5).unwrap();
            assert!(again.epsilon <= target, "{target}: {}", again.epsilon);
            // Tight: a slightly smaller σ exceeds the target.
            let f2 = DpSgd {
                noise_multiplier: c.value * (1.0 - 1e-5),
                ..f
            };
            let e2 = acc.epsilon(&f2.event(), Neighbouring::AddRemove, 1e-5).unwrap().epsilon;
            assert!(e2 > target, "{target}: not tight, {e2}");
        }
    }

    #[test]
    fn a_non_private_event_has_nothing_to_calibrate() {
        let make = |s: f64| DpEvent::Composed {
            events: vec![DpEvent::gaussian(s), DpEvent::NonPrivate],
        };
        let e = calibrate(
            &GdpAccountant,
            Neighbouring::AddRemove,
            1e-5,
            8.0,
            SolveFor::NoiseMultiplier,
            &make,
        )
        .unwrap_err();
        assert!(e.to_string().contains("nothing to calibrate"), "{e}");
        assert!(e.to_string().contains("event.events[1] is non-private"), "{e}");
    }

    #[test]
    fn steps_and_sample_rate_with_clt() {
        let acc = CltAccountant;
        let c = calibrate_dpsgd(&acc, Neighbouring::AddRemove, 1e-5, 2.0, fixed(), SolveFor::Steps).unwrap();
        assert!(c.result.epsilon <= 2.0);
        assert_eq!(c.result.kind, BoundKind::Estimate);
        let n = c.value as u64;
        let over = acc
            .epsilon(
                &DpSgd {
                    steps: n + 1,
                    ..fixed()
                }
                .event(),
                Neighbouring::AddRemove,
                1e-5,
            )
            .unwrap();
        assert!(over.epsilon > 2.0, "steps not maximal: {n}");

        let c = calibrate_dpsgd(&acc, Neighbouring::AddRemove, 1e-5, 1.0, fixed(), SolveFor::SampleRate).unwrap();
        let again = acc.epsilon(&c.event, Neighbouring::AddRemove, 1e-5).unwrap();
        assert!(again.epsilon <= 1.0);
        assert!(again.epsilon > 0.999, "{}", again.epsilon);
    }

    #[test]
    fn unreachable_targets_are_clear_errors() {
        let acc = CltAccountant;
        // One full-batch step at σ = 0.1 already exceeds ε = 0.01.
        let f = DpSgd {
            noise_multiplier: 0.1,
            sample_rate: 1.0,
            steps: 1,
        };
        let e = calibrate_dpsgd(&acc, Neighbouring::AddRemove, 1e-5, 0.01, f, SolveFor::Steps).unwrap_err();
        assert!(e.message.contains("unreachable"), "{}", e.message);
        // Subsampled: the error says the number is an estimate.
        let f = DpSgd {
            noise_multiplier: 0.05,
            sample_rate: 0.5,
            steps: 1,
        };
        let e = calibrate_dpsgd(&acc, Neighbouring::AddRemove, 1e-5, 1e-3, f, SolveFor::Steps).unwrap_err();
        assert!(e.message.contains("estimate"), "{}", e.message);
        // Bad target.
        assert!(calibrate_dpsgd(&acc, Neighbouring::AddRemove, 1e-5, f64::NAN, fixed(), SolveFor::Steps).is_err());
    }

    #[test]
    fn every_accountant_calibrates_to_safe_side_or_errors() {
        for k in AccountantKind::ALL {
            let acc = k.build();
            if let Ok(c) = calibrate_dpsgd(
                &*acc,
                Neighbouring::AddRemove,
                1e-5,
                3.0,
                fixed(),
                SolveFor::NoiseMultiplier,
            ) {
                let again = acc.epsilon(&c.event, Neighbouring::AddRemove, 1e-5).unwrap();
                assert!(again.epsilon <= 3.0, "{k:?}: {}", again.epsilon);
            }
        }
    }
}
