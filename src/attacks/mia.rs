//! Membership-inference attacks on ε-prediction denoisers. Every score is "higher = member".
//!
//! Every attack talks to the model only through [`Denoiser`] (batched ε-prediction on a
//! variance-preserving schedule), so any model family plugs in.
//!
//! * **Loss** at step t (Carlini et al. 2023; Matsumoto et al. 2023): −‖ε − ε_θ(x_t, t)‖²/d,
//!   averaged over seeded noise draws.
//! * **SecMI** t-error (Duan et al. 2023, "Are diffusion models vulnerable to membership
//!   inference attacks?", Alg. 1): deterministic DDIM inversion of x₀ to x̃_{t−k} (steps of k),
//!   one deterministic step forward to t and one back; score −‖x̂_{t−k} − x̃_{t−k}‖²/d.
//! * **PIA** (Kong et al. 2024, "An efficient membership inference attack for the diffusion model
//!   by proximal initialization", Eq. 10–11): ε₀ = ε_θ(x₀, 0), x_t = √ᾱ_t x₀ + √(1−ᾱ_t) ε₀;
//!   score −Σ|ε₀ − ε_θ(x_t, t)|^p/d with p = 4 by default (the ℓ₄ distance of the authors' code;
//!   any p ≥ 1 through [`ScoreOpts::pia_norm`]; the p-th power is monotone in the ℓ_p norm).
//! * **Empirical**: the loss attack against the empirical denoiser over the trained-on rows
//!   (the private sampler's denoiser, diffusion-sampling-privacy §3), optionally on Poisson
//!   subsamples. It attacks the *sampler's* denoiser, not a trained checkpoint.

use std::str::FromStr;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use candle_core::Tensor;

use super::denoiser::{noisy, Denoiser, DeviceEps};
use super::empirical::{poisson_mask, EmpiricalDenoiser};
use super::metrics::{self, HeldOut, Interval, Roc};
use super::theory::Evidence;
use crate::error::{Error, Result};
use crate::numeric::normals;

/// Which attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttackKind {
    /// Denoising loss at step t.
    Loss,
    /// SecMI's t-error.
    Secmi,
    /// PIA's proximal-initialisation distance.
    Pia,
    /// The loss attack on the empirical denoiser (the sampler's denoiser).
    Empirical,
}

impl AttackKind {
    /// The name as written on the command line and in score files.
    pub fn as_str(self) -> &'static str {
        match self {
            AttackKind::Loss => "loss",
            AttackKind::Secmi => "secmi",
            AttackKind::Pia => "pia",
            AttackKind::Empirical => "empirical",
        }
    }

    /// What the attack targets: `"checkpoint"` (the trained network) or `"sampler"` (the
    /// empirical-denoiser sampler over the private rows).
    pub fn target(self) -> Target {
        match self {
            AttackKind::Empirical => Target::Sampler,
            _ => Target::Checkpoint,
        }
    }
}

impl FromStr for AttackKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "loss" => Ok(AttackKind::Loss),
            "secmi" => Ok(AttackKind::Secmi),
            "pia" => Ok(AttackKind::Pia),
            "empirical" => Ok(AttackKind::Empirical),
            other => Err(Error::field(
                "attack",
                format!("unknown attack `{other}` (loss, secmi, pia, empirical)"),
            )),
        }
    }
}

/// The mechanism an attack targets; it decides which guarantee the attack is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The trained checkpoint: compared with its training ledger.
    Checkpoint,
    /// The empirical-denoiser sampler: compared with the sampler's accounting.
    Sampler,
}

/// Attack knobs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoreOpts {
    /// Noise draws averaged by the loss and empirical attacks.
    pub noise_draws: usize,
    /// SecMI's step k.
    pub secmi_k: usize,
    /// PIA's norm p (the authors' default is 4).
    pub pia_norm: f64,
    /// Poisson rate of the empirical denoiser's data (1 = full batch).
    pub empirical_rate: f64,
    /// Seed of the attack's own noise draws.
    pub seed: u64,
}

impl Default for ScoreOpts {
    fn default() -> Self {
        ScoreOpts {
            noise_draws: 4,
            secmi_k: 10,
            pia_norm: 4.0,
            empirical_rate: 1.0,
            seed: 0,
        }
    }
}

/// Deterministic DDIM step of all rows from step `s` to step `t` (either direction):
/// ε = ε_θ(x_s, s), x̂₀ = (x_s − √(1−ᾱ_s) ε)/√ᾱ_s, x_t = √ᾱ_t x̂₀ + √(1−ᾱ_t) ε (Song et al. 2021,
/// Eq. 12 with σ = 0).
pub fn ddim_step(d: &dyn Denoiser, x: &[f32], s: usize, t: usize) -> Result<Vec<f32>> {
    let n = x.len() / d.dim();
    let eps = d.predict_eps(x, &vec![s; n])?;
    let ab = d.alpha_bars();
    let (as_, at) = (ab[s], ab[t]);
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

/// Mean over the `dim` values of each row of |a − b|^p.
fn row_lp(a: &[f32], b: &[f32], dim: usize, p: f64) -> Vec<f64> {
    a.par_chunks_exact(dim.max(1))
        .zip(b.par_chunks_exact(dim.max(1)))
        .map(|(x, y)| {
            x.iter()
                .zip(y)
                .map(|(u, v)| {
                    let d = (*u as f64 - *v as f64).abs();
                    if p == 2.0 {
                        d * d
                    } else {
                        d.powf(p)
                    }
                })
                .sum::<f64>()
                / dim as f64
        })
        .collect()
}

fn check_step(d: &dyn Denoiser, t: usize) -> Result<()> {
    if t >= d.steps() {
        return Err(Error::field("--timesteps", format!("step {t} ≥ T = {}", d.steps())));
    }
    Ok(())
}

/// SecMI's t-error of each row (Duan et al. 2023, Alg. 1, Eq. 9): x̃_{t−k} by deterministic
/// DDIM inversion 0 → k → … → t − k (the clean row is x at step 0), then x̂_{t−k} by one
/// deterministic step t − k → t and one back; returns ‖x̂_{t−k} − x̃_{t−k}‖²/d per row.
pub fn secmi_errors(d: &dyn Denoiser, rows: &[f32], t: usize, k: usize) -> Result<Vec<f64>> {
    check_step(d, t)?;
    let k = k.max(1);
    if t < k {
        return Err(Error::field(
            "--secmi-k",
            format!("SecMI at step {t} needs k ≤ t, got k = {k}"),
        ));
    }
    let target = t - k;
    if let Some(dev) = d.on_device() {
        return secmi_errors_on_device(d, dev, rows, t, k);
    }
    let mut x = rows.to_vec();
    let mut s = 0usize;
    while s < target {
        let next = (s + k).min(target);
        x = ddim_step(d, &x, s, next)?;
        s = next;
    }
    let fwd = ddim_step(d, &x, target, t)?;
    let back = ddim_step(d, &fwd, t, target)?;
    Ok(row_lp(&x, &back, d.dim(), 2.0))
}

/// [`ddim_step`] on a device-resident batch: the same f64 arithmetic, on the device.
fn ddim_step_on_device(d: &dyn Denoiser, dev: &dyn DeviceEps, x: &Tensor, s: usize, t: usize) -> Result<Tensor> {
    let eps = dev.predict_eps_tensor(x, s)?;
    let ab = d.alpha_bars();
    dev.ddim_tensor(x, &eps, ab[s], ab[t])
}

/// [`secmi_errors`] with the batch kept on the model's device from the first step to the
/// errors (one copy in, one copy of n errors out).
fn secmi_errors_on_device(d: &dyn Denoiser, dev: &dyn DeviceEps, rows: &[f32], t: usize, k: usize) -> Result<Vec<f64>> {
    let dim = d.dim();
    let n = rows.len() / dim;
    let target = t - k;
    let mut x = Tensor::from_slice(rows, (n, dim), dev.device())?;
    let mut s = 0usize;
    while s < target {
        let next = (s + k).min(target);
        x = ddim_step_on_device(d, dev, &x, s, next)?;
        s = next;
    }
    let fwd = ddim_step_on_device(d, dev, &x, target, t)?;
    let back = ddim_step_on_device(d, dev, &fwd, t, target)?;
    dev.row_lp_tensor(&x, &back, 2.0)
}

/// [`pia_distances`] with the batch kept on the model's device.
fn pia_distances_on_device(d: &dyn Denoiser, dev: &dyn DeviceEps, rows: &[f32], t: usize, p: f64) -> Result<Vec<f64>> {
    let dim = d.dim();
    let n = rows.len() / dim;
    let x0 = Tensor::from_slice(rows, (n, dim), dev.device())?;
    let eps0 = dev.predict_eps_tensor(&x0, 0)?;
    let xt = dev.noisy_tensor(&x0, &eps0, d.alpha_bars()[t])?;
    let pred = dev.predict_eps_tensor(&xt, t)?;
    dev.row_lp_tensor(&eps0, &pred, p)
}

/// PIA's distance of each row (Kong et al. 2024, Eq. 10–11): ε₀ = ε_θ(x₀, 0),
/// x_t = √ᾱ_t x₀ + √(1−ᾱ_t) ε₀, returns Σ_j |ε₀ − ε_θ(x_t, t)|_j^p / d per row.
pub fn pia_distances(d: &dyn Denoiser, rows: &[f32], t: usize, p: f64) -> Result<Vec<f64>> {
    check_step(d, t)?;
    if !(p >= 1.0 && p.is_finite()) {
        return Err(Error::field("--pia-norm", format!("must be a finite p ≥ 1, got {p}")));
    }
    if let Some(dev) = d.on_device() {
        return pia_distances_on_device(d, dev, rows, t, p);
    }
    let n = rows.len() / d.dim();
    let eps0 = d.predict_eps(rows, &vec![0; n])?;
    let tt = vec![t; n];
    let pred = d.predict_eps(&noisy(d.alpha_bars(), d.dim(), rows, &tt, &eps0), &tt)?;
    Ok(row_lp(&eps0, &pred, d.dim(), p))
}

/// Scores of `rows` ([n, dim]) at step `t`. `train_rows` are the empirical denoiser's data.
/// Row i's noise is keyed by its position i (see [`scores_keyed`]).
pub fn scores(
    kind: AttackKind,
    d: &dyn Denoiser,
    train_rows: &[f32],
    rows: &[f32],
    t: usize,
    o: &ScoreOpts,
) -> Result<Vec<f64>> {
    let keys: Vec<u64> = (0..(rows.len() / d.dim().max(1)) as u64).collect();
    scores_keyed(kind, d, train_rows, rows, &keys, t, o)
}

/// The noise stream of one scored record: seeded by the attack, the step, the seed and the
/// record's key alone, so a record's score does not depend on which other records are scored
/// with it (what makes `mia --shard i/n` + `merge` equal to one unsharded run).
fn record_rng(seed: u64, key: u64) -> ChaCha8Rng {
    // splitmix64 finaliser: neighbouring keys give unrelated seeds.
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ChaCha8Rng::seed_from_u64(seed ^ z ^ (z >> 31))
}

/// [`scores`] with an explicit key per row (e.g. its data row index): the loss and empirical
/// attacks draw each row's noise from a stream keyed by (seed, attack, t, key).
pub fn scores_keyed(
    kind: AttackKind,
    d: &dyn Denoiser,
    train_rows: &[f32],
    rows: &[f32],
    keys: &[u64],
    t: usize,
    o: &ScoreOpts,
) -> Result<Vec<f64>> {
    check_step(d, t)?;
    let dim = d.dim();
    let n = rows.len() / dim;
    if keys.len() != n {
        return Err(Error::input(format!("{} record keys for {n} rows", keys.len())));
    }
    let seed = o.seed ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ (kind as u64) << 56;
    let mut rngs: Vec<ChaCha8Rng> = keys.iter().map(|&k| record_rng(seed, k)).collect();
    // Each record's noise comes from its own stream, so records are drawn in parallel.
    let draw_noise = |rngs: &mut [ChaCha8Rng]| -> Vec<f32> {
        let mut eps = vec![0.0f32; n * dim];
        eps.par_chunks_mut(dim.max(1))
            .zip(rngs.par_iter_mut())
            .for_each(|(c, r)| c.copy_from_slice(&normals(r, c.len())));
        eps
    };
    let draws = o.noise_draws.max(1);
    match kind {
        AttackKind::Loss => {
            let mut acc = vec![0.0; n];
            let tt = vec![t; n];
            // On a GPU the rows stay there: each draw's noise is copied in, and only the n
            // errors come back.
            let on_device = match d.on_device() {
                Some(dev) => Some((dev, Tensor::from_slice(rows, (n, dim), dev.device())?)),
                None => None,
            };
            for _ in 0..draws {
                let t0 = std::time::Instant::now();
                let eps = draw_noise(&mut rngs);
                let errors = match &on_device {
                    Some((dev, x0)) => {
                        let e = Tensor::from_slice(&eps, (n, dim), dev.device())?;
                        crate::timing::add_within_time("loss: noise drawn and copied in", t0);
                        let xt = dev.noisy_tensor(x0, &e, d.alpha_bars()[t])?;
                        let pred = dev.predict_eps_tensor(&xt, t)?;
                        dev.row_lp_tensor(&e, &pred, 2.0)?
                    }
                    None => {
                        crate::timing::add_within_time("loss: noise drawn", t0);
                        let pred = d.predict_eps(&noisy(d.alpha_bars(), dim, rows, &tt, &eps), &tt)?;
                        row_lp(&eps, &pred, dim, 2.0)
                    }
                };
                for (a, e) in acc.iter_mut().zip(errors) {
                    *a -= e;
                }
            }
            Ok(acc.iter().map(|a| a / draws as f64).collect())
        }
        AttackKind::Pia => Ok(pia_distances(d, rows, t, o.pia_norm)?.into_iter().map(|e| -e).collect()),
        AttackKind::Secmi => Ok(secmi_errors(d, rows, t, o.secmi_k)?.into_iter().map(|e| -e).collect()),
        AttackKind::Empirical => {
            let emp = EmpiricalDenoiser::with_dim(train_rows, dim);
            let m = train_rows.len() / dim;
            let abar = d.alpha_bars()[t];
            let mut acc = vec![0.0; n];
            let tt = vec![t; n];
            for _ in 0..draws {
                let eps = draw_noise(&mut rngs);
                let xt = noisy(d.alpha_bars(), dim, rows, &tt, &eps);
                for i in 0..n {
                    let mask = (o.empirical_rate < 1.0).then(|| poisson_mask(m, o.empirical_rate, &mut rngs[i]));
                    let e = emp.eps(&xt[i * dim..(i + 1) * dim], abar, mask.as_deref());
                    let err: f64 = e
                        .iter()
                        .zip(&eps[i * dim..(i + 1) * dim])
                        .map(|(a, &b)| (a - b as f64).powi(2))
                        .sum::<f64>()
                        / dim as f64;
                    acc[i] -= err;
                }
            }
            Ok(acc.iter().map(|a| a / draws as f64).collect())
        }
    }
}

/// Theoretical limits beside an attack's numbers, and the guarantee they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// ASR limit (balanced accuracy).
    pub asr: f64,
    /// Which guarantee gave the ASR limit.
    pub asr_source: String,
    /// TPR limit at FPR = 1%.
    pub tpr_at_1pct: f64,
    /// TPR limit at FPR = 0.1%.
    pub tpr_at_01pct: f64,
}

/// All metrics of one attack at one step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttackResult {
    /// The attack.
    pub attack: AttackKind,
    /// The step attacked.
    pub t: usize,
    /// What the attack targets (decides the guarantee it is compared with).
    pub target: Target,
    /// True for the null test (labels shuffled at random).
    pub shuffled_labels: bool,
    /// Member scores.
    pub members: usize,
    /// Non-member scores.
    pub nonmembers: usize,
    /// Area under the exact ROC.
    pub auc: f64,
    /// Bootstrap interval of the AUC.
    pub auc_ci: Interval,
    /// Largest TPR with FPR ≤ 1%.
    pub tpr_at_1pct_fpr: f64,
    /// Largest TPR with FPR ≤ 0.1%.
    pub tpr_at_01pct_fpr: f64,
    /// Empirical ASR at the held-out threshold: the threshold is chosen on the calibration half,
    /// the balanced accuracy measured on the test half. A property of this one model and split,
    /// not a bound on ε.
    pub asr_heldout: f64,
    /// Bootstrap interval of the held-out ASR (test half resampled, threshold fixed).
    pub asr_heldout_ci: Interval,
    /// The held-out threshold.
    pub threshold: f64,
    /// Best balanced accuracy over all thresholds (optimistic).
    pub asr_oracle: f64,
    /// Bootstrap interval of the oracle ASR.
    pub asr_oracle_ci: Interval,
    /// Limits from the guarantee of the attacked mechanism (None: no guarantee applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// The exact ROC (not serialised).
    #[serde(skip)]
    /// The ROC points, when requested.
    pub roc: Option<Roc>,
}

/// Metric settings.
#[derive(Debug, Clone, Copy)]
pub struct MetricOpts {
    /// Bootstrap resamples.
    pub bootstrap: usize,
    /// Bootstrap interval level.
    pub level: f64,
    /// δ of the accounted guarantees and of the audits.
    pub delta: f64,
    /// Seed of the held-out split and the bootstrap.
    pub seed: u64,
}

/// The limits implied by `guarantees` (the tightest of each), or None when there are none.
pub fn limits(guarantees: &[Evidence]) -> Option<Limits> {
    let (asr, src) = super::theory::tightest(guarantees, |g| g.asr_limit())?;
    Some(Limits {
        asr,
        asr_source: src,
        tpr_at_1pct: super::theory::tightest(guarantees, |g| g.tpr_limit(0.01))?.0,
        tpr_at_01pct: super::theory::tightest(guarantees, |g| g.tpr_limit(0.001))?.0,
    })
}

/// Computes every metric from member (`pos`) and non-member (`neg`) scores; `guarantees` are
/// those of the mechanism the attack targets.
pub fn evaluate(
    attack: AttackKind,
    t: usize,
    pos: &[f64],
    neg: &[f64],
    m: &MetricOpts,
    guarantees: &[Evidence],
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
    Ok(AttackResult {
        attack,
        t,
        target: attack.target(),
        shuffled_labels: false,
        members: pos.len(),
        nonmembers: neg.len(),
        auc: metrics::auc(&r),
        auc_ci,
        tpr_at_1pct_fpr: metrics::tpr_at_fpr(&r, 0.01),
        tpr_at_01pct_fpr: metrics::tpr_at_fpr(&r, 0.001),
        asr_heldout: asr_h,
        asr_heldout_ci: heldout_ci,
        threshold: th,
        asr_oracle: metrics::oracle_asr(&r),
        asr_oracle_ci: oracle_ci,
        limits: limits(guarantees),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attacks::denoiser::FnDenoiser;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-5 * b.abs().max(1e-3)
    }

    /// DDIM step by hand (python, float64): ᾱ = [0.9, 0.5, 0.2], ε_θ(x, t) = 0.5·x·(t + 1),
    /// x = (1, −2). 0 → 1: x̂₀ = (x − √0.1·ε)/√0.9, x₁ = √0.5·x̂₀ + √0.5·ε = (0.98105825, −1.96211651);
    /// 2 → 1 (upward in ᾱ): (0.52047866, −1.04095732).
    #[test]
    fn ddim_step_hand_computed() {
        let d = FnDenoiser {
            dim: 2,
            alpha_bars: vec![0.9, 0.5, 0.2],
            eps: |x: &[f32], t: usize| x.iter().map(|v| 0.5 * v * (t as f32 + 1.0)).collect(),
        };
        let y = ddim_step(&d, &[1.0, -2.0], 0, 1).unwrap();
        assert!(close(y[0] as f64, 0.981_058_252_895_445_9), "{y:?}");
        assert!(close(y[1] as f64, -1.962_116_505_790_891_8), "{y:?}");
        let y = ddim_step(&d, &[1.0, -2.0], 2, 1).unwrap();
        assert!(close(y[0] as f64, 0.520_478_658_304_368_3), "{y:?}");
        assert!(close(y[1] as f64, -1.040_957_316_608_736_7), "{y:?}");
        // Same step: identity.
        let y = ddim_step(&d, &[1.0, -2.0], 1, 1).unwrap();
        assert!(close(y[0] as f64, 1.0) && close(y[1] as f64, -2.0));
    }

    /// SecMI by hand (python): ᾱ = [0.9, 0.7, 0.5, 0.3], ε_θ(x, t) = 0.1·x·(t + 1), k = 1, t = 2,
    /// x = (1, −2): x̃₁ = (0.90880069, −1.81760138), forward to 2 and back gives an error of
    /// 0.00080173221552 (mean of squares over the 2 values).
    #[test]
    fn secmi_t_error_hand_computed() {
        let d = FnDenoiser {
            dim: 2,
            alpha_bars: vec![0.9, 0.7, 0.5, 0.3],
            eps: |x: &[f32], t: usize| x.iter().map(|v| 0.1 * v * (t as f32 + 1.0)).collect(),
        };
        let e = secmi_errors(&d, &[1.0, -2.0], 2, 1).unwrap();
        assert!((e[0] - 0.000_801_732_215_523_321_3).abs() < 1e-8, "{e:?}");
        // A denoiser whose ε depends on neither x nor t makes the DDIM round trip exact: error 0.
        let flat = FnDenoiser {
            dim: 2,
            alpha_bars: vec![0.9, 0.7, 0.5, 0.3],
            eps: |x: &[f32], _t: usize| x.iter().map(|_| 0.3).collect(),
        };
        let e = secmi_errors(&flat, &[1.0, -2.0], 2, 1).unwrap();
        assert!(e[0] < 1e-10, "{e:?}");
        // The score is minus the error.
        let s = scores(
            AttackKind::Secmi,
            &d,
            &[],
            &[1.0, -2.0],
            2,
            &ScoreOpts {
                secmi_k: 1,
                ..Default::default()
            },
        )
        .unwrap();
        assert!((s[0] + 0.000_801_732_215_523_321_3).abs() < 1e-8);
        assert!(secmi_errors(&d, &[1.0, -2.0], 0, 1).is_err(), "k > t is an error");
    }

    /// PIA by hand (python): ᾱ = [0.9, 0.7, 0.5, 0.3], ε_θ(x, t) = 0.1·x·(t + 1) + 0.05·t, t = 2,
    /// x = (1, −2): mean |ε₀ − ε_θ(x_t, t)|^p is 0.041117857325 for p = 2 and 0.0018684242193 for
    /// p = 4 (the default).
    #[test]
    fn pia_score_hand_computed() {
        let d = FnDenoiser {
            dim: 2,
            alpha_bars: vec![0.9, 0.7, 0.5, 0.3],
            eps: |x: &[f32], t: usize| x.iter().map(|v| 0.1 * v * (t as f32 + 1.0) + 0.05 * t as f32).collect(),
        };
        let l2 = pia_distances(&d, &[1.0, -2.0], 2, 2.0).unwrap();
        assert!(close(l2[0], 0.041_117_857_325_063_59), "{l2:?}");
        let l4 = pia_distances(&d, &[1.0, -2.0], 2, 4.0).unwrap();
        assert!(close(l4[0], 0.001_868_424_219_309_145_8), "{l4:?}");
        let s = scores(AttackKind::Pia, &d, &[], &[1.0, -2.0], 2, &ScoreOpts::default()).unwrap();
        assert!(close(-s[0], 0.001_868_424_219_309_145_8), "default norm is 4: {s:?}");
        assert!(pia_distances(&d, &[1.0, -2.0], 2, 0.5).is_err());
    }

    #[test]
    fn attack_names_round_trip() {
        for k in [
            AttackKind::Loss,
            AttackKind::Secmi,
            AttackKind::Pia,
            AttackKind::Empirical,
        ] {
            assert_eq!(k.as_str().parse::<AttackKind>().unwrap(), k);
        }
        assert!("lira".parse::<AttackKind>().is_err());
        assert_eq!(AttackKind::Empirical.target(), Target::Sampler);
        assert_eq!(AttackKind::Pia.target(), Target::Checkpoint);
    }
}
