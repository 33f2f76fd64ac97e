//! The empirical denoiser on a DDPM schedule and its comparison with a neural denoiser.
//!
//! Ê[x₀ | x_t; D] = Σᵢ wᵢ xᵢ with wᵢ ∝ exp(−‖x_t − √ᾱ_t xᵢ‖² / (2(1 − ᾱ_t))) — the posterior mean
//! of x₀ when x₀ is uniform on D (diffusion-sampling-privacy §3.1, written for the VP marginal
//! x_t = √ᾱ x₀ + √(1−ᾱ) ε). The weights are computed in log space (log-sum-exp), in f64.
//!
//! [`cosine_profile`] is the paper's Figure 1: the cosine between the denoising directions
//! x̃_t − Ê and x̃_t − D (x̃_t = x_t/√ᾱ_t, D the neural x̂₀), which on the VP scale is the cosine
//! between the two implied noise predictions.

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::denoiser::{noisy, Denoiser};
use crate::error::Result;
use crate::models::toy::PIXELS;
use crate::numeric::normals;

/// Empirical denoiser over the rows of `data` ([n, dim]).
pub struct EmpiricalDenoiser<'a> {
    /// The rows, row-major.
    pub data: &'a [f32],
    dim: usize,
    norms: Vec<f64>,
}

impl<'a> EmpiricalDenoiser<'a> {
    /// Over 8×8 rows (64 values each).
    pub fn new(data: &'a [f32]) -> Self {
        Self::with_dim(data, PIXELS)
    }

    /// Over rows of `dim` values.
    pub fn with_dim(data: &'a [f32], dim: usize) -> Self {
        let norms = data
            .chunks_exact(dim)
            .map(|r| r.iter().map(|&v| (v as f64) * (v as f64)).sum())
            .collect();
        EmpiricalDenoiser { data, dim, norms }
    }

    /// Ê[x₀ | x_t] for one query row at ᾱ, over the rows selected by `mask` (all when `None`).
    pub fn x0(&self, xt: &[f32], abar: f64, mask: Option<&[bool]>) -> Vec<f64> {
        let dim = self.dim;
        let (sa, var) = (abar.sqrt(), 1.0 - abar);
        // log wᵢ = (√ᾱ ⟨x_t, xᵢ⟩ − ᾱ‖xᵢ‖²/2)/(1 − ᾱ) + const
        let mut logw = Vec::with_capacity(self.norms.len());
        for (i, row) in self.data.chunks_exact(dim).enumerate() {
            if mask.is_some_and(|m| !m[i]) {
                logw.push(f64::NEG_INFINITY);
                continue;
            }
            let dot: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
            logw.push((sa * dot - abar * self.norms[i] / 2.0) / var);
        }
        let mut out = vec![0.0f64; dim];
        let m = logw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !m.is_finite() {
            return out; // empty subsample: the prior mean of an empty set is taken as 0
        }
        let mut z = 0.0;
        for (row, lw) in self.data.chunks_exact(dim).zip(&logw) {
            let w = (lw - m).exp();
            if w == 0.0 {
                continue;
            }
            z += w;
            for (o, &v) in out.iter_mut().zip(row) {
                *o += w * v as f64;
            }
        }
        for o in out.iter_mut() {
            *o /= z;
        }
        out
    }

    /// The noise prediction implied by Ê: ε̂ = (x_t − √ᾱ Ê)/√(1−ᾱ).
    pub fn eps(&self, xt: &[f32], abar: f64, mask: Option<&[bool]>) -> Vec<f64> {
        let x0 = self.x0(xt, abar, mask);
        let (sa, sb) = (abar.sqrt(), (1.0 - abar).sqrt());
        xt.iter().zip(&x0).map(|(&x, &m)| (x as f64 - sa * m) / sb).collect()
    }
}

/// One point of the Figure-1 profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CosinePoint {
    /// Diffusion step t.
    pub t: usize,
    /// log SNR = ln(ᾱ/(1−ᾱ)).
    pub log_snr: f64,
    /// Mean cosine similarity over the queries.
    pub cosine_mean: f64,
    /// Smallest cosine similarity over the queries.
    pub cosine_min: f64,
}

/// Mean cosine between empirical (over `data`) and neural denoising directions at each step in
/// `steps`, for x_t drawn from the `queries` rows with seeded noise.
pub fn cosine_profile(
    net: &dyn Denoiser,
    data: &[f32],
    queries: &[f32],
    steps: &[usize],
    seed: u64,
) -> Result<Vec<CosinePoint>> {
    let dim = net.dim();
    let emp = EmpiricalDenoiser::with_dim(data, dim);
    let nq = queries.len() / dim;
    let mut out = Vec::new();
    for &t in steps {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (t as u64).wrapping_mul(0x9e37_79b9));
        let eps = normals(&mut rng, nq * dim);
        let tt = vec![t; nq];
        let xt = noisy(net.alpha_bars(), dim, queries, &tt, &eps);
        let pred = net.predict_eps(&xt, &tt)?;
        let abar = net.alpha_bars()[t];
        let (mut sum, mut min) = (0.0, f64::INFINITY);
        for i in 0..nq {
            let row = &xt[i * dim..(i + 1) * dim];
            let e = emp.eps(row, abar, None);
            let p = &pred[i * dim..(i + 1) * dim];
            let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
            for j in 0..dim {
                dot += e[j] * p[j] as f64;
                na += e[j] * e[j];
                nb += p[j] as f64 * p[j] as f64;
            }
            let c = dot / (na.sqrt() * nb.sqrt()).max(1e-300);
            sum += c;
            min = min.min(c);
        }
        out.push(CosinePoint {
            t,
            log_snr: (abar / (1.0 - abar)).ln(),
            cosine_mean: sum / nq as f64,
            cosine_min: min,
        });
    }
    Ok(out)
}

/// A Poisson subsample mask of `n` rows at rate `p`.
pub fn poisson_mask(n: usize, p: f64, rng: &mut ChaCha8Rng) -> Vec<bool> {
    (0..n).map(|_| rng.random::<f64>() < p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empirical_denoiser_limits() {
        let data: Vec<f32> = (0..3 * PIXELS).map(|i| ((i / PIXELS) as f32 - 1.0) * 0.5).collect();
        let emp = EmpiricalDenoiser::new(&data);
        // Nearly clean query at row 2: returns row 2.
        let q: Vec<f32> = data[2 * PIXELS..].to_vec();
        let x0 = emp.x0(&q, 0.9999, None);
        assert!((x0[0] - 0.5).abs() < 1e-9);
        // Pure noise level: the mean of the rows (0).
        let x0 = emp.x0(&q, 1e-9, None);
        assert!(x0[0].abs() < 1e-3);
        // A mask keeps only the selected rows.
        let x0 = emp.x0(&q, 1e-9, Some(&[true, false, false]));
        assert!((x0[0] + 0.5).abs() < 1e-9);
    }
}
