//! The white-box one-run audit of a DP-SGD training (threat model: every noisy update is seen,
//! Nasr et al. 2023, "Tight Auditing of Differentially Private Machine Learning", §4; Steinke,
//! Nasr & Jagielski 2023, §6 "white-box"). The trainer inserts Dirac gradient canaries
//! ([`crate::models::canary::GradientCanaries`]) and records x_{t,i}, the projection of every
//! noisy update on canary i's coordinate in units of C. Under the ledger's mechanism
//! (Poisson rate q, noise multiplier σ) a canary's x_t is N(0, σ²) when it is out and the
//! mixture (1 − q)N(0, σ²) + qN(1, σ²) when it is in (up to the data's share of the update).
//!
//! The score of canary i is the log-likelihood ratio of those two hypotheses over the run,
//! Σ_t ln(1 − q + q·e^{(x_t − ½)/σ²}) (for q = 1: Σ_t (x_t − ½)/σ²): the Neyman–Pearson
//! statistic of the ledger's own mechanism, so the audit is as strong as the mechanism allows.
//! Any score is valid (both theorems hold for every function of the run's output); this one
//! gives the power. Two estimators read the same scores, each at confidence 1 − β/2 so the
//! verdict that takes the larger of the two stays at family-wise confidence 1 − β:
//!
//! * Steinke et al. 2023 Thm 3.3 ([`super::one_run`]): an (ε, δ) lower bound with no assumption
//!   on the mechanism.
//! * Mahloujifar et al. 2025 ([`super::fdp`]) against the ledger's mechanism family with the
//!   noise multiplier free: the largest family member the run is shown not to satisfy, read as ε
//!   at δ through a *lower* bound of that member's ε (exact GDP for full batch; the sound lower
//!   witnesses for Poisson sampling). It is a lower bound on the run's ε when the run is a
//!   DP-SGD of the ledger's q and T (the family assumption, stated in the report); the ledger's
//!   own curve being rejected means the run does not deliver its ledger, without assumption.

use serde::{Deserialize, Serialize};

use super::fdp::{self, Curve, Guesses};
use super::one_run::{self, CanaryScores, OneRunAudit};
use crate::accountants::pld::PldAccountant;
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};

/// The mechanism the ledger says ran, per step (the run's own steps only).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LedgerMechanism {
    /// σ.
    pub noise_multiplier: f64,
    /// q (1 for full batch).
    pub sample_rate: f64,
    /// T.
    pub steps: u64,
}

impl LedgerMechanism {
    /// The event of this mechanism with noise multiplier `sigma`.
    pub fn event(&self, sigma: f64) -> DpEvent {
        DpEvent::dpsgd(sigma, self.sample_rate, self.steps)
    }
    fn full_batch(&self) -> bool {
        self.sample_rate >= 1.0
    }
}

/// The f-DP estimator's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FdpBound {
    /// The family audited.
    pub family: String,
    /// Smallest noise multiplier σ̂ the run is shown not to be as private as (∞-free: None when
    /// nothing is rejected).
    pub sigma_rejected: Option<f64>,
    /// μ of that member (full batch only: √T/σ̂).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mu_lower: Option<f64>,
    /// Lower bound of that member's ε at δ: the run's ε lower bound under the family assumption.
    pub epsilon_lower: f64,
    /// Whether the ledger's own curve (σ of the ledger) is rejected.
    pub ledger_rejected: bool,
    /// Confidence of this estimator.
    pub confidence: f64,
    /// Candidates (Bonferroni).
    pub candidates: Vec<Guesses>,
}

/// The white-box audit of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhiteBoxAudit {
    /// Always `white-box`.
    pub threat_model: String,
    /// Canaries (m) and included ones.
    pub canaries: usize,
    /// Included canaries.
    pub included: usize,
    /// Noisy updates observed.
    pub steps: usize,
    /// The ledger's mechanism the scores and the family come from.
    pub mechanism: LedgerMechanism,
    /// δ.
    pub delta: f64,
    /// Family-wise confidence of the verdict (each of the four estimators runs at 1 − β/4).
    pub confidence: f64,
    /// Steinke et al. on the white-box scores.
    pub steinke: OneRunAudit,
    /// Mahloujifar et al. against the ledger's family.
    pub fdp: FdpBound,
    /// The canaries read as independent trials (threshold from the ledger, Clopper–Pearson).
    pub trials: super::audit::AuditOutcome,
    /// The Gaussian-shift (GDP) reading of the same observations.
    pub gaussian: GaussianShift,
    /// The largest lower bound (estimates excluded): the verdict's number.
    pub epsilon_lower: f64,
}

/// Per-canary log-likelihood-ratio scores of observations `obs` ([steps, m], row-major) under
/// the ledger's (q, σ) (module docs).
pub fn lr_scores(obs: &[f32], steps: usize, m: usize, mech: &LedgerMechanism) -> Vec<f64> {
    let (q, s2) = (mech.sample_rate.min(1.0), mech.noise_multiplier * mech.noise_multiplier);
    let mut out = vec![0.0f64; m];
    for t in 0..steps {
        let row = &obs[t * m..(t + 1) * m];
        for (o, &x) in out.iter_mut().zip(row) {
            let z = (x as f64 - 0.5) / s2;
            *o += if q >= 1.0 {
                z
            } else {
                // ln(1 − q + q e^z), stable for large z.
                let a = (1.0 - q).ln();
                let b = q.ln() + z;
                let (hi, lo) = if a > b { (a, b) } else { (b, a) };
                hi + (lo - hi).exp().ln_1p()
            };
        }
    }
    out
}

/// Runs both estimators on the observations of a run with the ledger mechanism `mech`.
pub fn audit(
    obs: &[f32],
    steps: usize,
    included: &[bool],
    mech: &LedgerMechanism,
    delta: f64,
    confidence: f64,
) -> Result<WhiteBoxAudit> {
    let m = included.len();
    if m < 2 {
        return Err(Error::input("the white-box audit needs at least 2 canaries"));
    }
    if obs.len() != steps * m {
        return Err(Error::input(format!(
            "{} observations for {steps} steps × {m} canaries",
            obs.len()
        )));
    }
    if let Some(k) = obs.iter().position(|x| !x.is_finite()) {
        return Err(Error::numeric(format!(
            "observation at step {} of canary {} is not finite",
            k / m,
            k % m
        )));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(Error::field("--confidence", "must be in (0, 1)"));
    }
    let beta = 1.0 - confidence;
    let scores = lr_scores(obs, steps, m, mech);
    let mut steinke = one_run::audit(
        &[CanaryScores {
            attack: "white-box likelihood ratio".into(),
            t: steps,
            scores: scores.clone(),
            included: included.to_vec(),
        }],
        // The guess counts of the f-DP candidates up to a tenth of the canaries (Steinke et
        // al.'s p-value costs O(k) per ε probe; larger k only add δ's 2mδ term).
        &fdp::candidate_ks(m)
            .into_iter()
            .map(|k| k.0)
            .filter(|&k| k <= (m / 10).max(1))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>(),
        delta,
        1.0 - beta / 4.0,
    )?;
    steinke.threat_model = "white-box".into();
    let cands = fdp::guesses(&scores, included, &fdp::candidate_ks(m));
    let fdp = family_audit(m as u64, &cands, mech, delta, beta / 4.0)?;
    let trials = independent_trials(&scores, included, mech, steps, delta, beta / 4.0)?;
    let gaussian = gaussian_shift(obs, steps, included, mech, delta, beta / 4.0)?;
    let mut epsilon_lower = steinke.epsilon_lower.max(fdp.epsilon_lower).max(trials.epsilon_lower);
    if gaussian.kind == crate::accountants::BoundKind::LowerBound {
        epsilon_lower = epsilon_lower.max(gaussian.epsilon_lower);
    }
    Ok(WhiteBoxAudit {
        threat_model: "white-box".into(),
        canaries: m,
        included: included.iter().filter(|&&b| b).count(),
        steps,
        mechanism: *mech,
        delta,
        confidence,
        steinke,
        fdp,
        trials,
        gaussian,
        epsilon_lower,
    })
}

/// The curve of the ledger's mechanism with noise multiplier `sigma` (low side).
fn curve(mech: &LedgerMechanism, sigma: f64) -> Result<Curve> {
    if mech.full_batch() {
        return Ok(Curve::Gaussian {
            mu: (mech.steps as f64).sqrt() / sigma,
        });
    }
    let pld = PldAccountant::default().compose_event(&mech.event(sigma), Neighbouring::AddRemove)?;
    // ε grid: to where δ(ε) is negligible next to any β the game can reach.
    let mut top = 1.0f64;
    while pld.delta(top) > 1e-12 && top < 200.0 {
        top *= 1.5;
    }
    Ok(Curve::from_profile(top, 240, |e| pld.delta(e)))
}

/// Mahloujifar et al. over the family {ledger mechanism with noise multiplier σ′}.
fn family_audit(m: u64, cands: &[Guesses], mech: &LedgerMechanism, delta: f64, beta: f64) -> Result<FdpBound> {
    // θ = 1/σ′ grows as privacy weakens; search θ ∈ [θ_min, θ_max].
    let sigma = mech.noise_multiplier;
    let theta_ledger = 1.0 / sigma;
    let (theta_min, theta_max) = (theta_ledger / 1e3, theta_ledger * 1e3);
    let err = std::cell::RefCell::new(None);
    let hat = fdp::family_bound(m, cands, beta, theta_min, theta_max, |theta| {
        match curve(mech, 1.0 / theta) {
            Ok(c) => c,
            Err(e) => {
                err.borrow_mut().get_or_insert(e);
                // A curve claiming nothing (f = 0) is never rejected: a failure only weakens the bound.
                Curve::Profile {
                    points: vec![(0.0, 1.0)],
                }
            }
        }
    });
    if let Some(e) = err.into_inner() {
        return Err(e);
    }
    let ledger_rejected = hat.is_some_and(|h| h >= theta_ledger);
    let sigma_rejected = hat.map(|h| 1.0 / h);
    let (mu_lower, epsilon_lower) = match sigma_rejected {
        None => (None, 0.0),
        Some(s) => {
            let ev = mech.event(s);
            let lower = crate::accountants::sound::sound_epsilon(&ev, Neighbouring::AddRemove, delta)
                .lower
                .map_or(0.0, |l| l.epsilon);
            let mu = mech.full_batch().then(|| (mech.steps as f64).sqrt() / s);
            (mu, lower)
        }
    };
    Ok(FdpBound {
        family: if mech.full_batch() {
            format!("μ-GDP: {} full-batch Gaussian steps, noise multiplier free", mech.steps)
        } else {
            format!(
                "{} Poisson-subsampled (q = {}) Gaussian steps, noise multiplier free",
                mech.steps, mech.sample_rate
            )
        },
        sigma_rejected,
        mu_lower,
        epsilon_lower,
        ledger_rejected,
        confidence: 1.0 - beta,
        candidates: cands.to_vec(),
    })
}

/// The canaries as independent trials (the many-runs estimator of Jagielski et al. 2020 and
/// Nasr et al. 2023, read over the canaries of one run). The threshold is fixed before the data
/// is looked at: it maximises the bound on a seeded simulation of the *ledger's* mechanism with
/// the same canary counts, so all canaries measure. Clopper–Pearson bounds on its false-positive
/// and false-negative rates then give ε ≥ ln((1 − δ − FNR_up)/FPR_up) (or the mirrored form) at
/// confidence 1 − β. Valid when the canaries' observations are independent given their bits:
/// white-box Dirac canaries sit on distinct coordinates with independent noise, so they are, up to
/// the data's gradient share at those coordinates (which couples them only through the model's
/// trajectory). The assumption is stated beside the number.
fn independent_trials(
    scores: &[f64],
    included: &[bool],
    mech: &LedgerMechanism,
    steps: usize,
    delta: f64,
    beta: f64,
) -> Result<super::audit::AuditOutcome> {
    let split = |s: &[f64], inc: &[bool]| -> (Vec<f64>, Vec<f64>) {
        let pos = s.iter().zip(inc).filter(|(_, &b)| b).map(|(x, _)| *x).collect();
        let neg = s.iter().zip(inc).filter(|(_, &b)| !b).map(|(x, _)| *x).collect();
        (pos, neg)
    };
    let (pos, neg) = split(scores, included);
    if pos.is_empty() || neg.is_empty() {
        return Err(Error::input(
            "the independent-trials audit needs included and left-out canaries",
        ));
    }
    // The ledger's mechanism, simulated with the same counts (seeded: the threshold depends on
    // the ledger alone, never on this run's observations).
    let (sim_obs, sim_inc) = simulate_ledger(mech, included, steps, 0x5eed_a0d1);
    let sim = lr_scores(&sim_obs, steps, included.len(), mech);
    let (sp, sn) = split(&sim, &sim_inc);
    let chosen = super::audit::audit_scores(
        &super::audit::AuditScores {
            heldout_out: sn.clone(),
            heldout_in: sp.clone(),
            test_out: sn,
            test_in: sp,
        },
        delta,
        beta,
    )?;
    super::audit::audit_at(chosen.threshold, &neg, &pos, delta, beta)
}

/// Observations of the ledger's mechanism with no data share: x = s + N(0, σ²), s = 1 when the
/// canary is included and sampled (probability q); the inclusion bits of `included` are kept
/// (only their count matters).
fn simulate_ledger(mech: &LedgerMechanism, included: &[bool], steps: usize, seed: u64) -> (Vec<f32>, Vec<bool>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let m = included.len();
    let mut obs = Vec::with_capacity(steps * m);
    for _ in 0..steps {
        let z = crate::numeric::normals(&mut rng, m);
        for (i, &b) in included.iter().enumerate() {
            let s = if b && rng.random::<f64>() < mech.sample_rate {
                1.0
            } else {
                0.0
            };
            obs.push((s + mech.noise_multiplier * z[i] as f64) as f32);
        }
    }
    (obs, included.to_vec())
}

/// The Gaussian-shift estimator (the GDP reading of Agrawal et al. 2026 and Andrew et al. 2024):
/// each canary's summed observation S_i = Σ_t x_{t,i}/σ is, for a full-batch Gaussian mechanism,
/// N(μ·b_i, 1) exactly (plus the data's share, the same for in and out, which only widens both
/// and so lowers μ̂), with μ = T/(σ√T)·(effective signal). μ is estimated as the difference of
/// the in and out means over the out canaries' standard deviation, with a one-sided (1 − β)
/// normal confidence bound (delta method, both means and the deviation estimated), and read
/// as ε at δ through the exact GDP formula (Dong, Roth & Su 2022, Cor. 2.13), rounded down. For
/// a Poisson-subsampled ledger the statistic is only asymptotically Gaussian (their Thm 3.5), so
/// the number is an estimate there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GaussianShift {
    /// μ̂.
    pub mu_hat: f64,
    /// Its lower confidence bound.
    pub mu_lower: f64,
    /// ε of μ_lower-GDP at δ (rounded down).
    pub epsilon_lower: f64,
    /// `lower_bound` (full batch) or `estimate` (Poisson sampling).
    pub kind: crate::accountants::BoundKind,
    /// Confidence of the bound.
    pub confidence: f64,
}

fn gaussian_shift(
    obs: &[f32],
    steps: usize,
    included: &[bool],
    mech: &LedgerMechanism,
    delta: f64,
    beta: f64,
) -> Result<GaussianShift> {
    let m = included.len();
    let mut sums = vec![0.0f64; m];
    for t in 0..steps {
        for (s, &x) in sums.iter_mut().zip(&obs[t * m..(t + 1) * m]) {
            *s += x as f64;
        }
    }
    let stats = |want: bool| {
        let v: Vec<f64> = sums
            .iter()
            .zip(included)
            .filter(|(_, &b)| b == want)
            .map(|(x, _)| *x)
            .collect();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0).max(1.0);
        (n, mean, var)
    };
    let (n1, m1, v1) = stats(true);
    let (n0, m0, v0) = stats(false);
    if n1 < 2.0 || n0 < 2.0 {
        return Err(Error::input(
            "the Gaussian-shift audit needs at least 2 included and 2 left-out canaries",
        ));
    }
    let sd = v0.sqrt();
    let mu_hat = if sd > 0.0 { (m1 - m0) / sd } else { f64::INFINITY };
    let se = ((v1 / n1 + v0 / n0) / v0 + mu_hat * mu_hat / (2.0 * n0)).sqrt();
    let z = crate::numeric::ndtri(1.0 - beta);
    let mu_lower = (mu_hat - z * se).max(0.0);
    let epsilon_lower = if mu_lower <= 0.0 {
        0.0
    } else if mu_lower.is_infinite() {
        f64::INFINITY
    } else {
        let e = crate::accountants::gdp::epsilon_for_delta(mu_lower, delta)?;
        (e * (1.0 - 1e-9) - 1e-12).max(0.0)
    };
    Ok(GaussianShift {
        mu_hat,
        mu_lower,
        epsilon_lower,
        kind: if mech.full_batch() {
            crate::accountants::BoundKind::LowerBound
        } else {
            crate::accountants::BoundKind::Estimate
        },
        confidence: 1.0 - beta,
    })
}

/// Observations of an ideal run of `mech` (no data share): x = s + N(0, σ²), with `m` canaries
/// each included with probability ½. For validity tests and power studies.
pub fn simulate(mech: &LedgerMechanism, m: usize, seed: u64) -> (Vec<f32>, Vec<bool>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let inc: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
    simulate_ledger(mech, &inc, mech.steps as usize, seed ^ 0x9e37_79b9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn true_epsilon(mech: &LedgerMechanism, delta: f64) -> f64 {
        crate::accountants::sound::sound_epsilon(&mech.event(mech.noise_multiplier), Neighbouring::AddRemove, delta)
            .upper
            .unwrap()
            .epsilon
    }

    /// Full batch, ε ≈ 4 at δ = 1e-5: a correct run's bound is below the truth and at least half
    /// of it; σ/2 in the run (the ledger still says σ) is caught.
    #[test]
    fn full_batch_audit_is_valid_tight_and_catches_halved_noise() {
        let mech = LedgerMechanism {
            noise_multiplier: 4.3247,
            sample_rate: 1.0,
            steps: 16,
        };
        let eps = true_epsilon(&mech, 1e-5);
        let (obs, inc) = simulate(&mech, 20_000, 1);
        let a = audit(&obs, 16, &inc, &mech, 1e-5, 0.95).unwrap();
        assert!(a.epsilon_lower <= eps, "{} > {eps}", a.epsilon_lower);
        assert!(a.epsilon_lower >= 0.5 * eps, "{} < ½·{eps}", a.epsilon_lower);
        let run = LedgerMechanism {
            noise_multiplier: 4.3247 / 2.0,
            ..mech
        };
        let (obs, inc) = simulate(&run, 2000, 2);
        let a = audit(&obs, 16, &inc, &mech, 1e-5, 0.95).unwrap();
        assert!(a.epsilon_lower > eps, "{} vs {eps}", a.epsilon_lower);
    }

    /// Poisson-subsampled: a correct run stays below its ledger; the Gaussian reading is labelled
    /// an estimate and never decides.
    #[test]
    fn subsampled_audit_is_valid_and_labels_the_gaussian_reading_an_estimate() {
        let mech = LedgerMechanism {
            noise_multiplier: 2.396,
            sample_rate: 0.5,
            steps: 16,
        };
        let eps = true_epsilon(&mech, 1e-5);
        let (obs, inc) = simulate(&mech, 5000, 3);
        let a = audit(&obs, 16, &inc, &mech, 1e-5, 0.95).unwrap();
        assert!(a.epsilon_lower <= eps, "{} vs {eps}", a.epsilon_lower);
        assert_eq!(a.gaussian.kind, crate::accountants::BoundKind::Estimate);
        assert!(a.epsilon_lower >= a.steinke.epsilon_lower.max(a.trials.epsilon_lower));
    }
}
