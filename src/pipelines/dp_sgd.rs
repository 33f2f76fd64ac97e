//! Plain DP-SGD claims (`[[dp_sgd]]`), written as papers and Opacus users state them: epochs (or
//! steps), batch size B, dataset size N, how batches are drawn, noise multiplier σ, clipping
//! norm C, and the claimed (ε, δ).
//!
//! Steps and the sampling rate come from [`crate::config::dpsgd::TrainingRun::derive`], the
//! derivation `dpaudit account --epochs --batch-size --dataset-size --sampling` uses, so a claim
//! and `account` on the same job account the same event:
//! - `poisson`: T = ⌊E·N/B⌋ steps of Poisson(q = B/N) ∘ Gaussian(σ) under add/remove (Opacus'
//!   `get_noise_multiplier`; Abadi et al. 2016, Algorithm 1);
//! - `poisson-loader`: Opacus' `PrivacyEngine` over a `DataLoader`: q = 1/⌈N/B⌉, E·⌈N/B⌉ steps;
//! - `shuffle`: fixed-size batches of a shuffled permutation: each record is in one batch per
//!   epoch, so E Gaussian steps compose with no amplification. Opacus accounts these as Poisson
//!   at q = 1/⌈N/B⌉, which is not a guarantee (Chua et al., "How Private are DP-SGD
//!   Implementations?", ICML 2024): shown as a second reading, never the verdict.
//!
//! The noise is σ·C on the sum of gradients clipped to norm C, so ε does not depend on C.

use crate::accountants::AccountantKind;
use crate::config::claims::DpSgdClaim;
use crate::config::dpsgd::{BatchSampling, TrainingRun};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};
use crate::pipelines::verdict::{Calibration, Check, ClaimResult, InterpretationSpec};

/// The steps a claim's run takes and how they are accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Optimiser steps T.
    pub steps: u64,
    /// Poisson rate q of each accounted step (1 for shuffled batches: no amplification).
    pub sample_rate: f64,
    /// Gaussian steps that touch one record, as accounted.
    pub accounted_steps: u64,
    /// Batches per epoch L = ⌈N/B⌉ (for the shuffle-as-Poisson reading).
    pub batches_per_epoch: u64,
    /// How T and q were derived, one line each.
    pub derivation: Vec<String>,
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a / b + u64::from(!a.is_multiple_of(b))
}

/// Steps and q of a claim: from epochs exactly as `dpaudit account --epochs` derives them; from
/// stated steps, T = steps at q = B/N (Poisson), q = 1/⌈N/B⌉ (Poisson over a loader), or
/// ⌈T/L⌉ Gaussian steps per record (shuffle: a partial epoch can touch a record once more).
pub fn schedule(c: &DpSgdClaim) -> Result<Schedule> {
    let (n, b) = (c.dataset_size.get(), c.batch_size.get());
    let loader = ceil_div(n, b);
    if let Some(e) = c.epochs {
        let d = TrainingRun {
            epochs: e.get(),
            batch_size: b,
            dataset_size: n,
            sampling: c.sampling,
        }
        .derive()
        .map_err(|err| Error::input(format!("claim `{}`: {}", c.id, err.message)).with_field("epochs"))?;
        return Ok(Schedule {
            steps: d.steps,
            sample_rate: d.sample_rate,
            accounted_steps: d.accounted_steps,
            batches_per_epoch: loader,
            derivation: d.derivation,
        });
    }
    let t = c.steps.map_or(1, |s| s.get());
    let s = match c.sampling {
        BatchSampling::Poisson => {
            let q = b as f64 / n as f64;
            Schedule {
                steps: t,
                sample_rate: q,
                accounted_steps: t,
                batches_per_epoch: loader,
                derivation: vec![format!(
                    "Poisson sampling: q = B/N = {b}/{n} = {q}; T = {t} steps as stated"
                )],
            }
        }
        BatchSampling::PoissonLoader => {
            let q = 1.0 / loader as f64;
            Schedule {
                steps: t,
                sample_rate: q,
                accounted_steps: t,
                batches_per_epoch: loader,
                derivation: vec![format!(
                    "Poisson sampling over a DataLoader: q = 1/⌈N/B⌉ = 1/{loader} = {q}; T = {t} steps as stated"
                )],
            }
        }
        BatchSampling::Shuffle => {
            let per_record = ceil_div(t, loader);
            Schedule {
                steps: t,
                sample_rate: 1.0,
                accounted_steps: per_record,
                batches_per_epoch: loader,
                derivation: vec![
                    format!(
                        "shuffled fixed-size batches: L = ⌈N/B⌉ = ⌈{n}/{b}⌉ = {loader} batches per epoch; T = {t} steps \
                         touch a record at most ⌈T/L⌉ = {per_record} times"
                    ),
                    format!(
                        "accounted without amplification: {per_record} Gaussian steps per record; shuffling is not \
                         Poisson sampling"
                    ),
                ],
            }
        }
    };
    Ok(s)
}

/// Verifies one `[[dp_sgd]]` claim.
pub fn verify(c: &DpSgdClaim) -> Result<ClaimResult> {
    let (eps, delta) = (c.epsilon.get(), c.delta.get());
    let n = c.dataset_size.get();
    let s = schedule(c)?;
    let (t, q, k) = (s.steps, s.sample_rate, s.accounted_steps);
    let sensitivity = match c.clip {
        Some(clip) => format!("Δ = C = {} on the sum of clipped gradients (noise std σ·C)", clip.get()),
        None => "Δ = C on the sum of clipped gradients (noise std σ·C)".to_string(),
    };
    let derivation = s.derivation.first().cloned().unwrap_or_default();
    let mut interps = Vec::new();
    let mut missing = Vec::new();
    let mut calibrations = Vec::new();
    let mut findings: Vec<String> = s
        .derivation
        .iter()
        .filter(|l| l.contains("floating point") || l.contains("not a whole number"))
        .cloned()
        .collect();
    match c.noise_multiplier.map(|s| s.get()) {
        Some(sigma) => {
            let stated = if c.sampling == BatchSampling::Shuffle {
                InterpretationSpec::new(
                    "shuffle",
                    format!(
                        "shuffled fixed-size batches, noise multiplier σ = {sigma}, add/remove one record: each record \
                         is in one batch per epoch, {k} Gaussian steps compose (no amplification)"
                    ),
                    sensitivity.clone(),
                    derivation.clone(),
                )
                .over_approximating(
                    "shuffled batches are accounted as full-batch steps with no amplification, which can only overstate ε",
                )
            } else {
                InterpretationSpec::new(
                    "poisson_add_remove",
                    format!(
                        "DP-SGD as Opacus accounts it: {t} steps, each a Poisson subsample at q = {} with noise \
                         multiplier σ = {sigma}, add/remove one record",
                        crate::report::num::sig6(q)
                    ),
                    sensitivity.clone(),
                    derivation.clone(),
                )
            };
            interps.push(stated.stated().account(
                DpEvent::dpsgd(sigma, q, k),
                Neighbouring::AddRemove,
                delta,
                eps,
                |_| {},
            ));
            if c.sampling == BatchSampling::Shuffle {
                let l = s.batches_per_epoch;
                let q_l = 1.0 / l as f64;
                interps.push(
                    InterpretationSpec::new(
                        "shuffle_as_poisson",
                        format!(
                            "shuffled batches accounted as if Poisson at q = 1/{l} for {t} steps (what Opacus reports \
                             with poisson_sampling=False); not a guarantee for shuffling (Chua et al., ICML 2024)"
                        ),
                        sensitivity,
                        format!("as if Poisson q = 1/{l}, T = {t}"),
                    )
                    .account(
                        DpEvent::dpsgd(sigma, q_l, t),
                        Neighbouring::AddRemove,
                        delta,
                        eps,
                        |_| {},
                    ),
                );
            }
        }
        None => {
            missing.push("the noise multiplier σ is not stated".to_string());
            for kind in [AccountantKind::Pld, AccountantKind::Rdp] {
                match super::rapid::calibrate_sigma(kind, q, k, delta, eps) {
                    Ok(sigma) => {
                        calibrations.push(Calibration {
                            what: format!("noise_multiplier_{}", kind.as_str()),
                            value: sigma,
                            description: format!(
                                "smallest σ (six significant digits, rounded up) for which {} bounds ε ≤ {eps} at δ = {delta:e} over \
                                 {k} steps at q = {}",
                                kind.as_str(),
                                crate::report::num::sig6(q)
                            ),
                        });
                        break;
                    }
                    Err(e) => findings.push(format!("calibration with {} unavailable: {}", kind.as_str(), e.message)),
                }
            }
        }
    }
    let checks = vec![Check::new(
        "delta_vs_n",
        delta < 1.0 / n as f64,
        format!("δ = {delta:.1e} vs 1/N = {:.3e}", 1.0 / n as f64),
    )];
    let mut r = ClaimResult::new(&c.id, "dp_sgd", &c.source, &c.dataset, eps, delta, interps, missing);
    r.checks = checks;
    r.findings = findings;
    r.calibrations = calibrations;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::claims::ClaimsFile;

    fn claim(extra: &str) -> DpSgdClaim {
        let src = format!(
            "schema_version = 1\n[[dp_sgd]]\nid = \"a\"\nsource = \"s\"\ndataset_size = 60000\nbatch_size = 256\n\
             epsilon = 10.0\ndelta = 1e-5\n{extra}"
        );
        ClaimsFile::parse(std::path::Path::new("c.toml"), &src)
            .unwrap()
            .dp_sgd
            .remove(0)
    }

    #[test]
    fn steps_match_the_account_derivation() {
        let s = schedule(&claim("epochs = 50\n")).unwrap();
        assert_eq!((s.steps, s.accounted_steps), (11718, 11718));
        assert_eq!(s.sample_rate, 256.0 / 60000.0);
        let s = schedule(&claim("steps = 1000\n")).unwrap();
        assert_eq!((s.steps, s.accounted_steps), (1000, 1000));
        // ⌈60000/256⌉ = 235 batches per epoch; 1000 steps touch a record at most 5 times.
        let s = schedule(&claim("steps = 1000\nsampling = \"shuffle\"\n")).unwrap();
        assert_eq!((s.accounted_steps, s.sample_rate), (5, 1.0));
        let s = schedule(&claim("epochs = 3\nsampling = \"shuffle\"\n")).unwrap();
        assert_eq!((s.steps, s.accounted_steps), (705, 3));
    }

    #[test]
    fn verdicts_follow_the_sound_bounds() {
        // ε ≈ 2.56 (PLD) for σ = 1, 50 epochs: 10 holds, 1 is violated (tilted-tail witness).
        let r = verify(&claim("epochs = 50\nnoise_multiplier = 1.0\n")).unwrap();
        assert_eq!(r.verdict, crate::pipelines::Verdict::Holds, "{}", r.describe());
        let mut c = claim("epochs = 50\nnoise_multiplier = 1.0\n");
        c.epsilon = crate::config::claims::Epsilon(1.0);
        let r = verify(&c).unwrap();
        assert_eq!(r.verdict, crate::pipelines::Verdict::Violated, "{}", r.describe());
        // No σ: not demonstrated, with the σ it would need.
        let r = verify(&claim("epochs = 50\n")).unwrap();
        assert_eq!(r.verdict, crate::pipelines::Verdict::NotDemonstrated);
        assert!(!r.calibrations.is_empty());
    }
}
