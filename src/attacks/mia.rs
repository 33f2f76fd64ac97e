//! Membership-inference attacks on ε-prediction denoisers. Every score is "higher = member".
//!
//! * **Loss** at step t (Carlini et al. 2023; Matsumoto et al. 2023): −‖ε − ε_θ(x_t, t)‖²,
//!   averaged over seeded noise draws.
//! * **SecMI** t-error (Duan et al. 2023, "Are diffusion models vulnerable to membership
//!   inference attacks?", Alg. 1): deterministic DDIM inversion of x₀ to x̃_{t−k} (steps of k),
//!   one deterministic step forward to t and one back; −‖x̂_{t−k} − x̃_{t−k}‖².
//! * **PIA** (Kong et al. 2024, "An efficient membership inference attack for the diffusion model
//!   by proximal initialization"): ε₀ = ε_θ(x₀, 0), x_t = √ᾱ_t x₀ + √(1−ᾱ_t) ε₀;
//!   −‖ε₀ − ε_θ(x_t, t)‖² (squared ℓ₂).
//! * **Empirical**: the loss attack against the empirical denoiser over the trained-on rows
//!   (the private sampler of diffusion-sampling-privacy §3), optionally on Poisson subsamples.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::empirical::{poisson_mask, EmpiricalDenoiser};
use super::metrics::{self, EpsLower, HeldOut, Interval, Roc};
use super::theory::Guarantee;
use crate::error::{Error, Result};
use crate::models::train::{noisy, normals};
use crate::models::{Net, Schedule, PIXELS};

/// Which attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AttackKind {
    /// Denoising loss at step t.
    Loss,
    /// SecMI's t-error (Duan et al. 2023).
    Secmi,
    /// PIA (Kong et al. 2024).
    Pia,
    /// Loss attack on the empirical denoiser over the trained-on rows.
    Empirical,
}

impl AttackKind {
    /// The CLI spelling (`loss`, `secmi`, `pia`, `empirical`).
    pub fn as_str(self) -> &'static str {
        match self {
            AttackKind::Loss => "loss",
            AttackKind::Secmi => "secmi",
            AttackKind::Pia => "pia",
            AttackKind::Empirical => "empirical",
        }
    }
}

/// Attack knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoreOpts {
    /// Noise draws averaged by the loss and empirical attacks.
    pub noise_draws: usize,
    /// SecMI's step k.
    pub secmi_k: usize,
    /// Poisson rate of the empirical denoiser's data (1 = full batch).
    pub empirical_rate: f64,
    /// Seed of the noise draws.
    pub seed: u64,
}

impl Default for ScoreOpts {
    fn default() -> Self {
        ScoreOpts {
            noise_draws: 4,
            secmi_k: 10,
            empirical_rate: 1.0,
            seed: 0,
        }
    }
}

/// Deterministic DDIM step of all rows from step `s` to step `t` (either direction):
/// ε = ε_θ(x_s, s), x̂₀ = (x_s − √(1−ᾱ_s) ε)/√ᾱ_s, x_t = √ᾱ_t x̂₀ + √(1−ᾱ_t) ε (Song et al. 2021,
/// Eq. 12 with σ = 0).
pub fn ddim_step(net: &Net, schedule: &Schedule, x: &[f32], s: usize, t: usize) -> Result<Vec<f32>> {
    let n = x.len() / PIXELS;
    let eps = net.predict(x, &vec![s; n])?;
    let (as_, at) = (schedule.alpha_bars[s], schedule.alpha_bars[t]);
    let (ss, sn) = (as_.sqrt(), (1.0 - as_).sqrt());
    let (ts, tn) = (at.sqrt(), (1.0 - at).sqrt());
    Ok(x.iter()
        .zip(&eps)
        .map(|(&xv, &e)| {
            let x0 = (xv as f64 - sn * e as f64) / ss;
            (ts * x0 + tn * e as f64) as f32
        })
        .collect())
}

fn row_sq_err(a: &[f32], b: &[f32]) -> Vec<f64> {
    a.chunks_exact(PIXELS)
        .zip(b.chunks_exact(PIXELS))
        .map(|(x, y)| x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum::<f64>() / PIXELS as f64)
        .collect()
}

/// Scores of `rows` ([n, 64]) at step `t`. `train_rows` are the empirical denoiser's data.
pub fn scores(
    kind: AttackKind,
    net: &Net,
    schedule: &Schedule,
    train_rows: &[f32],
    rows: &[f32],
    t: usize,
    o: &ScoreOpts,
) -> Result<Vec<f64>> {
    let n = rows.len() / PIXELS;
    if t >= schedule.len() {
        return Err(Error::field(
            "--timesteps",
            format!("step {t} ≥ T = {}", schedule.len()),
        ));
    }
    let seed = o.seed ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (kind as u64) << 56;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    match kind {
        AttackKind::Loss => {
            let mut acc = vec![0.0; n];
            let tt = vec![t; n];
            for _ in 0..o.noise_draws.max(1) {
                let eps = normals(&mut rng, n * PIXELS);
                let pred = net.predict(&noisy(schedule, rows, &tt, &eps), &tt)?;
                for (a, e) in acc.iter_mut().zip(row_sq_err(&eps, &pred)) {
                    *a -= e;
                }
            }
            Ok(acc.iter().map(|a| a / o.noise_draws.max(1) as f64).collect())
        }
        AttackKind::Pia => {
            let eps0 = net.predict(rows, &vec![0; n])?;
            let tt = vec![t; n];
            let pred = net.predict(&noisy(schedule, rows, &tt, &eps0), &tt)?;
            Ok(row_sq_err(&eps0, &pred).into_iter().map(|e| -e).collect())
        }
        AttackKind::Secmi => {
            let k = o.secmi_k.max(1);
            if t < k {
                return Err(Error::field(
                    "--secmi-k",
                    format!("SecMI at step {t} needs k ≤ t, got k = {k}"),
                ));
            }
            let target = t - k;
            // Inversion 0 → k → 2k … → t−k (the clean image is taken as x at step 0).
            let mut x = rows.to_vec();
            let mut s = 0usize;
            while s < target {
                let next = (s + k).min(target);
                x = ddim_step(net, schedule, &x, s, next)?;
                s = next;
            }
            let fwd = ddim_step(net, schedule, &x, target, t)?;
            let back = ddim_step(net, schedule, &fwd, t, target)?;
            Ok(row_sq_err(&x, &back).into_iter().map(|e| -e).collect())
        }
        AttackKind::Empirical => {
            let emp = EmpiricalDenoiser::new(train_rows);
            let m = train_rows.len() / PIXELS;
            let abar = schedule.alpha_bars[t];
            let mut acc = vec![0.0; n];
            let tt = vec![t; n];
            for _ in 0..o.noise_draws.max(1) {
                let eps = normals(&mut rng, n * PIXELS);
                let xt = noisy(schedule, rows, &tt, &eps);
                for i in 0..n {
                    let mask = (o.empirical_rate < 1.0).then(|| poisson_mask(m, o.empirical_rate, &mut rng));
                    let e = emp.eps(&xt[i * PIXELS..(i + 1) * PIXELS], abar, mask.as_deref());
                    let err: f64 = e
                        .iter()
                        .zip(&eps[i * PIXELS..(i + 1) * PIXELS])
                        .map(|(a, &b)| (a - b as f64).powi(2))
                        .sum::<f64>()
                        / PIXELS as f64;
                    acc[i] -= err;
                }
            }
            Ok(acc.iter().map(|a| a / o.noise_draws.max(1) as f64).collect())
        }
    }
}

/// Theoretical limits beside an attack's numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Upper limit on the attack success rate (balanced accuracy).
    pub asr: f64,
    /// Which guarantee the ASR limit comes from.
    pub asr_source: String,
    /// Upper limit on the TPR at 1% FPR.
    pub tpr_at_1pct: f64,
    /// Upper limit on the TPR at 0.1% FPR.
    pub tpr_at_01pct: f64,
}

/// All metrics of one attack at one step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttackResult {
    /// The attack.
    pub attack: AttackKind,
    /// Diffusion step the scores were computed at.
    pub t: usize,
    /// True for the null test (labels shuffled at random).
    pub shuffled_labels: bool,
    /// Number of member rows scored.
    pub members: usize,
    /// Number of non-member rows scored.
    pub nonmembers: usize,
    /// Area under the exact ROC.
    pub auc: f64,
    /// Bootstrap interval of the AUC.
    pub auc_ci: Interval,
    /// Largest TPR at FPR ≤ 1%.
    pub tpr_at_1pct_fpr: f64,
    /// Largest TPR at FPR ≤ 0.1%.
    pub tpr_at_01pct_fpr: f64,
    /// Threshold chosen on the calibration half, measured on the test half.
    pub asr_heldout: f64,
    /// Bootstrap interval of the held-out ASR.
    pub asr_heldout_ci: Interval,
    /// Best balanced accuracy over all thresholds (optimistic).
    pub asr_oracle: f64,
    /// Bootstrap interval of the oracle ASR.
    pub asr_oracle_ci: Interval,
    /// Clopper–Pearson ε lower bound.
    pub eps_lower: EpsLower,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Limits from the accounted guarantee (DP checkpoints only).
    pub limits: Option<Limits>,
    #[serde(skip)]
    /// The ROC points, when requested.
    pub roc: Option<Roc>,
}

/// Metric settings.
#[derive(Debug, Clone, Copy)]
pub struct MetricOpts {
    /// Number of bootstrap resamples.
    pub bootstrap: usize,
    /// Confidence level of the intervals.
    pub level: f64,
    /// δ of the ε lower bound.
    pub delta: f64,
    /// ε lower bound confidence 1 − α.
    pub alpha: f64,
    /// Seed of the splits and resamples.
    pub seed: u64,
}

/// Computes every metric from member (`pos`) and non-member (`neg`) scores.
pub fn evaluate(
    attack: AttackKind,
    t: usize,
    pos: &[f64],
    neg: &[f64],
    m: &MetricOpts,
    guarantees: &[Guarantee],
) -> Result<AttackResult> {
    let r = metrics::roc(pos, neg)?;
    let h = HeldOut::split(pos, neg, m.seed)?;
    let (asr_h, th) = metrics::heldout_asr(&h)?;
    let auc_ci = metrics::bootstrap(pos, neg, m.bootstrap, m.level, m.seed, |p, n| {
        Ok(metrics::auc(&metrics::roc(p, n)?))
    })?;
    let oracle_ci = metrics::bootstrap(pos, neg, m.bootstrap, m.level, m.seed ^ 1, |p, n| {
        Ok(metrics::oracle_asr(&metrics::roc(p, n)?))
    })?;
    let heldout_ci = metrics::bootstrap(&h.test_pos, &h.test_neg, m.bootstrap, m.level, m.seed ^ 2, |p, n| {
        Ok(metrics::asr_at(p, n, th))
    })?;
    let limits = if guarantees.is_empty() {
        None
    } else {
        let (asr, src) = super::theory::tightest(guarantees, |g| g.asr_limit()).unwrap();
        Some(Limits {
            asr,
            asr_source: src,
            tpr_at_1pct: super::theory::tightest(guarantees, |g| g.tpr_limit(0.01)).unwrap().0,
            tpr_at_01pct: super::theory::tightest(guarantees, |g| g.tpr_limit(0.001)).unwrap().0,
        })
    };
    Ok(AttackResult {
        attack,
        t,
        shuffled_labels: false,
        members: pos.len(),
        nonmembers: neg.len(),
        auc: metrics::auc(&r),
        auc_ci,
        tpr_at_1pct_fpr: metrics::tpr_at_fpr(&r, 0.01),
        tpr_at_01pct_fpr: metrics::tpr_at_fpr(&r, 0.001),
        asr_heldout: asr_h,
        asr_heldout_ci: heldout_ci,
        asr_oracle: metrics::oracle_asr(&r),
        asr_oracle_ci: oracle_ci,
        eps_lower: metrics::epsilon_lower(&h, m.delta, m.alpha)?,
        limits,
        roc: Some(r),
    })
}

/// The null test: the same scores with member/non-member labels reassigned at random.
pub fn shuffled(pos: &[f64], neg: &[f64], seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut all: Vec<f64> = pos.iter().chain(neg).copied().collect();
    all.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x5bu64));
    let neg2 = all.split_off(pos.len());
    (all, neg2)
}
