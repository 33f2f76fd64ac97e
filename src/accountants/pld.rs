//! Privacy-loss-distribution (PLD) accountant: the tight reference bound.
//!
//! Construction (details and the soundness argument step by step: `docs/pld.md`):
//! 1. Every leaf (Poisson-subsampled or full-batch Gaussian, (ε, δ)-DP) becomes a discrete PLD on
//!    the grid {i·h} in each direction (remove and add), by the pessimistic *connect-the-dots*
//!    discretisation (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, "Connect the dots:
//!    tighter discrete approximations of privacy loss distributions", Thm 3.2/Alg. 1), with every
//!    floating-point choice rounded so that privacy-loss mass only moves *up*.
//! 2. All leaves are composed at once in the Fourier domain: each PLD is aliased onto one common
//!    cyclic grid of N points, transformed, raised to its count and multiplied; one inverse FFT
//!    gives the composition modulo N. N covers a window [L, U] whose outside mass is bounded by
//!    a Chernoff bound; that mass and a rigorous round-off bound are added to δ.
//! 3. δ(ε) = ι + Σ_{ℓ>ε} p(ℓ)(1 − e^{ε−ℓ}) + slack (Koskela, Jälkö & Honkela 2020, eq. (5);
//!    Sommer, Meiser & Mohammadi 2019, Thm 1), and ε(δ) is its exact inverse, rounded up. The
//!    accountant reports the worse of the two directions (as dp_accounting does).
//!
//! Every discretisation, truncation and round-off step can only raise δ(ε), so the results are
//! upper bounds by construction ([`BoundKind::UpperBound`]).

use std::sync::Arc;

use rayon::prelude::*;
use rustfft::num_complex::Complex64;
use rustfft::{Fft, FftPlanner};

use super::{check_delta, check_epsilon, Accountant, AccountantKind, BoundKind, Evidence};
use crate::error::{Error, Result};
use crate::events::{Component, DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric;
use crate::numeric::dd::{self, feature_dispatch, Cdd, Dd};
use crate::numeric::pool::{Pool, Pooled};

/// Unit round-off of f64.
pub(super) const U: f64 = f64::EPSILON / 2.0;
/// Relative error allowed for one normal tail value Φ(z) or Φ̄(z) from
/// [`numeric::normal_tail::upper_tail`] at an exact argument, plus the arithmetic around it:
/// measured ≤ 3.43u against 50-digit mpmath on 10⁶ points of [0, 37) (a priori ≤ 9u with the
/// platform `exp` within 1 ulp; see that module); 8u leaves a margin over the measurement.
/// The rounding of the argument x/σ adds ≈ u·z² (d ln Φ̄(z)/d ln z ≈ −z² in the tail):
/// see [`tail_rel_err`].
const TAIL_REL_ERR: f64 = 8.0 * U;

/// Relative error bound of a tail value at z, including the rounding of its argument:
/// [`TAIL_REL_ERR`] + 3u·z².
fn tail_rel_err(z: f64) -> f64 {
    TAIL_REL_ERR + 3.0 * U * z * z
}
/// Componentwise FFT round-off constant: |fl(FFT x)_k − (FFT x)_k| ≤ FFT_ERR_PER_LEVEL · ⌈log₂N⌉ ·
/// ‖x‖₁ (each of the ⌈log₂N⌉ butterfly levels adds at most a few units of round-off relative to
/// the sum of the absolute inputs; Higham 2002, "Accuracy and stability of numerical
/// algorithms", §24.1, gives 4.3u per radix-2 level; 10u covers rustfft's radix-4/8 butterflies).
const FFT_ERR_PER_LEVEL: f64 = 10.0 * U;

static FFT_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Largest cost (directions × distinct leaves × transform length) of the double-word precise mode
/// (≈ 0.1 µs per point and level: 2²³ points of length 2²⁰ take a few seconds).
pub(super) const PRECISE_BUDGET: usize = 1 << 23;

/// Largest privacy loss (nats) one step's grid holds; P-mass above goes to +∞ (counted in δ).
const MAX_STEP_LOSS: f64 = 200.0;

/// Leaves composed at least this many times get their transform values at the live frequencies
/// on double words ([`dd_transform_values`]) and their powers on double words, so the certified
/// round-off no longer grows like T·κ (κ ≈ 10u·log₂N, the double FFT's componentwise bound) but
/// like T·u²·(support): 10⁷ steps certify δ = 1e-5 in one composition instead of composing again
/// on double words. Below it the double-precision transform is cheaper and accurate enough.
const HYBRID_MIN_COUNT: u64 = 1 << 20;

/// Most Horner steps (live frequencies × support points) spent on one leaf's double-word
/// transform values (≈ 30 ns each); beyond it the leaf keeps its double-precision values.
const HYBRID_MAX_WORK: usize = 1 << 25;

/// Widest composition window (grid points) at the requested grid interval: beyond it the grid
/// interval is doubled until the window fits (a coarser grid is still a dominating
/// discretisation, so only tightness changes; over a window this wide the composed loss has a
/// standard deviation of tens of nats, and connect-the-dots adds at most h²/4 of variance per step).
pub(super) const REGRID_WIDTH: i64 = 1 << 21;

/// A composition window narrower than half this many grid points at the requested grid interval
/// is composed again on a grid h/2^k, k chosen so that the window becomes about this wide (the
/// grid adapts to the ε scale: issue 47, item 3). Connect-the-dots overstates ε by about one grid
/// interval over the whole composition (and each step's loss spread below h is smeared over a
/// whole interval), which is most of an ε of a few intervals: q = 1e-3, σ = 5, T = 100, δ = 1e-5
/// gave 0.0046549 at h = 1e-4 against 0.0045541 converged (dp_accounting 0.6.0). The grids
/// h/2^k contain the grid h, so the connect-the-dots pair on the coarse grid is a garbling of the
/// one on the fine grid (each coarse split is a mean-preserving spread of the fine one in e^{−ℓ});
/// refining only tightens, and every soundness step of docs/pld.md holds on any grid.
const REFINE_WIDTH: i64 = 1 << 14;

/// Finest grid interval the refinement of [`REFINE_WIDTH`] goes to (nats).
const MIN_GRID_INTERVAL: f64 = 1e-15;

/// Most grid points, summed over a direction's distinct leaves, that a refinement may create
/// (≈ 65 ns each to discretise: about 0.3 s of one core at the limit).
const REFINE_POINTS: usize = 1 << 22;

/// A composition window wider than this many grid points is composed in two stages
/// ([`PldAccountant::compose_staged`]): the grid a long horizon needs is far coarser than the
/// grid one step needs (issue 47, item 1).
const STAGE_WIDTH: i64 = 1 << 16;

/// Largest share of the composed loss's variance that a grid sized for precision
/// ([`precision_grid`]) may add: connect-the-dots adds at most g²/4 per step on the grid g
/// (Doroshenko et al. 2022, §4), and ε ≈ m + z·s for a near-Gaussian composed loss of mean m and
/// standard deviation s (Dong, Roth & Su 2022, Thm 3.5/§5.2), so a variance share ρ moves ε by at
/// most about ρ/2 relative (≈ 0.05 %, half the 0.1 % the grid comparison of docs/pld.md asks for).
const GRID_VARIANCE_SHARE: f64 = 1e-3;

/// Fewest points the composition window keeps on a grid sized for precision (about 15 standard
/// deviations of the composed loss: the Chernoff window at τ/4 per side).
const SIZED_MIN_WIDTH: f64 = (1 << 14) as f64;

/// Above this many distinct leaves the grid is not sized (the variance quadrature per leaf would
/// start to count).
const SIZED_MAX_LEAVES: usize = 1024;

/// Width (grid points) the second stage's window is aimed at.
const STAGE_TARGET: f64 = (1 << 14) as f64;

/// Fewest copies of the block a staged composition composes (below it, one stage).
const STAGE_MIN_BLOCKS: u64 = 4;

/// How a staged composition splits its leaves: `blocks` = T₂ copies of the block, and the
/// second stage's grid is `factor` = 2^k times the first's.
#[derive(Debug, Clone, Copy)]
struct StagePlan {
    blocks: u64,
    factor: i64,
}

/// The plan for a direction whose one-stage window is `width` points wide: 2^k ≈ width /
/// [`STAGE_TARGET`] and T₂ = ⌊c_min / 4^k⌋, so that the second stage's connect-the-dots variance
/// (≤ H²/4 per copy of the block and per remaining step, H = 2^k·h; Doroshenko et al. 2022, §4)
/// stays at about the first stage's (≤ h²/4 per step): T₂·4^k·h² ≤ c_min·h². `None` when fewer
/// than [`STAGE_MIN_BLOCKS`] copies would remain at k = 1.
fn stage_plan(merged: &[(Leaf, u64)], width: i64) -> Option<StagePlan> {
    let c_min = merged.iter().map(|(_, c)| *c).min()?;
    let mut k = (width as f64 / STAGE_TARGET).log2().ceil().clamp(1.0, 20.0) as u32;
    while k >= 1 {
        let blocks = c_min >> (2 * k);
        if blocks >= STAGE_MIN_BLOCKS {
            return Some(StagePlan {
                blocks: fewest_remainders(merged, blocks, c_min),
                factor: 1 << k,
            });
        }
        k -= 1;
    }
    None
}

/// The number of copies of the block T₂ within 1/8 of `ideal` (and ≤ `c_min`, so every leaf is in
/// the block) that leaves the fewest leaves with a remainder c_j mod T₂, nearest `ideal` among
/// equals. A remainder costs its leaf a second discretisation on the coarse grid and one more
/// transform in the second stage (50 distinct leaves × 10⁴ steps: T₂ = 39 left 16 steps of every
/// leaf, ≈ 10 % of the whole computation; T₂ = 40 leaves none). The second stage's
/// connect-the-dots variance moves with T₂, by at most 1/8 of it (stage_plan's balance is a
/// choice of precision, not of soundness). At most 2²¹ remainders c_j mod T₂ are computed.
fn fewest_remainders(merged: &[(Leaf, u64)], ideal: u64, c_min: u64) -> u64 {
    let lo = (ideal - ideal / 8).max(STAGE_MIN_BLOCKS);
    let hi = (ideal + ideal / 8).min(c_min);
    let remainders = |b: u64| merged.iter().filter(|(_, c)| c % b != 0).count();
    let (mut best, mut best_count) = (ideal, remainders(ideal));
    let tries = ((1usize << 20) / merged.len().max(1)) as u64;
    for d in 1..=tries {
        if best_count == 0 || (ideal.saturating_sub(d) < lo && ideal + d > hi) {
            break;
        }
        for b in [ideal + d, ideal.saturating_sub(d)] {
            if (lo..=hi).contains(&b) {
                let n = remainders(b);
                if n < best_count {
                    (best, best_count) = (b, n);
                }
            }
        }
    }
    best
}

/// Variance of the privacy loss of Poisson(q) ∘ Gaussian(σ) under P in direction `dir`
/// (remove: P = (1−q)N(0,σ²) + qN(1,σ²), loss ℓ(x) = ln(1 − q + q e^{(2x−1)/2σ²}); add: P = N(0,σ²),
/// loss −ℓ(x)), by the trapezoid rule on 257 points over ±12σ of each component (spectrally
/// accurate for these smooth, Gaussian-weighted integrands). Used only to size the grid
/// ([`precision_grid`]): any value keeps the bound sound.
fn sampled_gaussian_loss_variance(q: f64, sigma: f64, dir: Direction) -> f64 {
    let s2 = sigma * sigma;
    let (lo, hi) = (-12.0 * sigma, 1.0 + 12.0 * sigma);
    let n = 256;
    let dx = (hi - lo) / n as f64;
    let (mut w_sum, mut m1, mut m2) = (0.0, 0.0, 0.0);
    for i in 0..=n {
        let x = lo + i as f64 * dx;
        let g0 = (-x * x / (2.0 * s2)).exp();
        let w = match dir {
            Direction::Remove => (1.0 - q) * g0 + q * (-(x - 1.0) * (x - 1.0) / (2.0 * s2)).exp(),
            Direction::Add => g0,
        } * if i == 0 || i == n { 0.5 } else { 1.0 };
        let l = log_mix(q, (2.0 * x - 1.0) / (2.0 * s2));
        w_sum += w;
        m1 += w * l;
        m2 += w * l * l;
    }
    let mean = m1 / w_sum;
    (m2 / w_sum - mean * mean).max(0.0)
}

/// The grid interval for a composition of `merged` in direction `dir` whose finest grid is `h`:
/// h·2^k for the largest k ≥ 0 at which connect-the-dots adds at most [`GRID_VARIANCE_SHARE`] of
/// the composed loss's variance V = Σ_j T_j v_j (T_j·g²/4 per leaf on the grid g) and the window
/// keeps about [`SIZED_MIN_WIDTH`] points or more (≈ 15√V/g). Only subsampled-Gaussian leaves are
/// sized (any other leaf, or more than [`SIZED_MAX_LEAVES`], keeps h). A coarser connect-the-dots
/// grid still dominates (docs/pld.md, Construction step 2): only tightness changes, by about
/// GRID_VARIANCE_SHARE/2 of ε at most.
fn precision_grid(merged: &[(Leaf, u64)], dir: Direction, h: f64) -> f64 {
    if merged.is_empty() || merged.len() > SIZED_MAX_LEAVES {
        return h;
    }
    let (mut v, mut t) = (0.0, 0.0);
    for &(l, c) in merged {
        match l {
            Leaf::SampledGaussian { q, sigma } => {
                let d = if l.symmetric() { Direction::Remove } else { dir };
                v += c as f64 * sampled_gaussian_loss_variance(q.min(1.0), sigma, d);
                t += c as f64;
            }
            _ => return h,
        }
    }
    if !(v > 0.0 && v.is_finite() && t > 0.0) {
        return h;
    }
    let by_variance = (4.0 * GRID_VARIANCE_SHARE * v / t).sqrt();
    let by_width = 15.0 * v.sqrt() / SIZED_MIN_WIDTH;
    let k = (by_variance.min(by_width) / h).log2().floor();
    if k.is_finite() && k >= 1.0 {
        h * 2f64.powi(k.min(20.0) as i32)
    } else {
        h
    }
}

/// A discrete PLD that dominates the block composed in `c` (a super-measure of one, which
/// composition treats alike: every convolution below is of non-negative measures). With the
/// computed window masses p̂_k, the exactly composed grid PLD μ has μ(k) ≤ (1 + r)(p̂_k + |e_k|)
/// (r = `rel_inflation`, Σ|e_k| ≤ R = `roundoff`; aliasing only added mass), mass ≤ τ outside the
/// window (`window_tail_mass`) and ι at +∞. So ν = (1 + r)p̂ on the window, an atom
/// ι + (1 + r)R + τ at +∞, and whatever is missing to a total of 1 at the window's lowest point,
/// has ν(ℓ > x) ≥ μ(ℓ > x) for every x: the distribution with tails min(1, ν(ℓ > x)) lies below ν
/// and is stochastically larger than μ, hence dominates it (its δ(ε) is larger at every ε and its
/// implied Q-mass Σ ν e^{−ℓ} smaller; docs/pld.md, Soundness step 1).
fn dominating_block(c: &ComposedDirection) -> DiscretePld {
    let infl = c.rel_inflation * (1.0 + 4.0 * U);
    let inf_mass = ((c.inf_mass + (c.roundoff + c.window_tail_mass) * infl) * (1.0 + 1e-12)).min(1.0);
    let mut probs: Vec<f64> = c.probs.iter().map(|&p| p * infl).collect();
    if let Some(first) = probs.first_mut() {
        let total: f64 = inf_mass + c.probs.iter().sum::<f64>() * infl;
        // The computed sum is within n·u of the exact one: ask for that much more.
        let missing = 1.0 - total + (c.probs.len() as f64 + 4.0) * U * total;
        if missing > 0.0 {
            *first += missing;
        }
    }
    DiscretePld {
        lo: c.lo,
        probs,
        inf_mass,
    }
}

/// Connect-the-dots on the grid H = `factor`·h of a PLD on the grid h (Doroshenko, Ghazi,
/// Kamath, Kumar & Manurangsi 2022, Alg. 1, applied to atoms): an atom of P-mass p at loss ℓ
/// between grid points A < ℓ < B = A + H puts p(1 − e^{A−ℓ})/(1 − e^{−H}) at B and the rest at A,
/// which keeps its P-mass and its Q-mass p e^{−ℓ}; splitting one atom of the pair into two can only
/// raise δ(ε) = Σ (p_i − e^ε q_i)₊ (subadditivity of (·)₊), for every ε. The share at B is rounded
/// up and the one at A computed from it and rounded up (P-mass moved up, or added).
fn regrid(d: &DiscretePld, h: f64, factor: i64) -> DiscretePld {
    if d.probs.is_empty() || factor == 1 {
        return d.clone();
    }
    let lo = d.lo.div_euclid(factor);
    let hi = (d.lo + d.probs.len() as i64 - 1).div_euclid(factor) + 1;
    let mut out = vec![0.0f64; (hi - lo + 1) as usize];
    // Upper share of an atom r fine intervals above A: (1 − e^{−rh})/(1 − e^{−H}), rounded up
    // (expm1 within an ulp or two, one division).
    let big = -(-(factor as f64) * h).exp_m1();
    let shares: Vec<f64> = (0..factor)
        .map(|r| (-(-(r as f64) * h).exp_m1() / big * (1.0 + 8.0 * U)).min(1.0))
        .collect();
    for (i, &p) in d.probs.iter().enumerate() {
        if p == 0.0 {
            continue;
        }
        let k = d.lo + i as i64;
        let idx = (k.div_euclid(factor) - lo) as usize;
        let r = k.rem_euclid(factor) as usize;
        if r == 0 {
            out[idx] += p;
            continue;
        }
        let up = (p * shares[r] * (1.0 + 2.0 * U)).min(p);
        out[idx + 1] += up;
        out[idx] += (p - up) * (1.0 + 2.0 * U);
    }
    // Each output point sums at most 2·factor positive terms (≤ u relative per addition).
    let fix = 1.0 + 2.0 * (2.0 * factor as f64 + 2.0) * U;
    out.iter_mut().for_each(|x| *x *= fix);
    trim(DiscretePld {
        lo,
        probs: out,
        inf_mass: d.inf_mass,
    })
}

/// The PLD accountant. Defaults follow dp_accounting's `PLDAccountant` (grid 1e-4, pessimistic).
#[derive(Debug, Clone)]
pub struct PldAccountant {
    /// Grid interval h of privacy losses (nats).
    pub value_discretization_interval: f64,
    /// Total probability mass that truncation may move to "infinity" (added to δ): per-step
    /// upper tails, plus the two tails outside the composition window.
    pub tail_mass_truncation: f64,
    /// Largest number of grid points of one step's PLD and of the composition window; mass
    /// beyond is treated as infinite loss (sound, counted against δ).
    pub max_grid_points: usize,
}

impl Default for PldAccountant {
    fn default() -> Self {
        PldAccountant {
            value_discretization_interval: 1e-4,
            tail_mass_truncation: 1e-13,
            max_grid_points: 1 << 22,
        }
    }
}

/// One Poisson-subsampled Gaussian step run `count` times (`q = 1`: full batch). The Gaussian
/// has noise standard deviation `noise_multiplier` × sensitivity (μ = 1/noise_multiplier).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PldStep {
    /// Poisson sampling rate in (0, 1] (1 = full batch).
    pub q: f64,
    /// Noise multiplier σ (noise std / sensitivity).
    pub noise_multiplier: f64,
    /// How many times the step runs.
    pub count: u64,
}

impl PldStep {
    /// `count` × Poisson(p) ∘ Gaussian(1/μ): the per-step shape of subsampled diffusion sampling.
    pub fn gdp(mu: f64, p: f64, count: u64) -> Self {
        PldStep {
            q: p,
            noise_multiplier: 1.0 / mu,
            count,
        }
    }
}

/// A privacy-costing leaf the PLD accountant can discretise.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaf {
    /// Poisson(q) ∘ Gaussian(σ) under add/remove; q = 1 is the plain Gaussian (any relation).
    SampledGaussian { q: f64, sigma: f64 },
    /// An (ε, δ)-DP mechanism (its dominating pair; Kairouz, Oh & Viswanath 2015, Thm 2.1).
    EpsilonDelta { epsilon: f64, delta: f64 },
    /// Poisson(q) ∘ Gaussian(σ) under replace-one (q < 1), σ relative to the replace-one
    /// sensitivity: the symmetric pair (1−q)N(0,σ²) + qN(½,σ²) vs (1−q)N(0,σ²) + qN(−½,σ²).
    ReplaceGaussian { q: f64, sigma: f64 },
    /// Poisson(q) ∘ Laplace(b) under add/remove (q = 1: the plain Laplace mechanism, any
    /// relation), scale b per unit L1 sensitivity: the exact Laplace pair Lap(0, b) vs Lap(1, b)
    /// (dp_accounting's `LaplacePrivacyLoss`), mixed as for the Gaussian.
    Laplace { q: f64, b: f64 },
}

impl Leaf {
    /// The variant and the bit patterns of its parameters: equal keys, equal leaves.
    fn key(&self) -> (u8, u64, u64) {
        match *self {
            Leaf::SampledGaussian { q, sigma } => (0, q.to_bits(), sigma.to_bits()),
            Leaf::EpsilonDelta { epsilon, delta } => (1, epsilon.to_bits(), delta.to_bits()),
            Leaf::ReplaceGaussian { q, sigma } => (2, q.to_bits(), sigma.to_bits()),
            Leaf::Laplace { q, b } => (3, q.to_bits(), b.to_bits()),
        }
    }

    /// True when the PLD is the same in both directions (only one needs computing).
    fn symmetric(self) -> bool {
        match self {
            Leaf::SampledGaussian { q, .. } | Leaf::Laplace { q, .. } => q >= 1.0,
            Leaf::EpsilonDelta { .. } | Leaf::ReplaceGaussian { .. } => true,
        }
    }
}

/// Which neighbouring direction a PLD describes (dp_accounting's `pmf_remove` / `pmf_add`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// P: the mechanism on the larger dataset (the mixture), Q: on the smaller one.
    Remove,
    /// P: the mechanism on the smaller dataset, Q: on the larger one (the mixture).
    Add,
}

impl Direction {
    /// The name used in output (`add` or `remove`).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Remove => "remove",
            Direction::Add => "add",
        }
    }
}

/// A discrete PLD: P-mass `probs[k]` at privacy loss (lo + k)·h, plus mass at +∞.
#[derive(Debug, Clone)]
pub(super) struct DiscretePld {
    pub(super) lo: i64,
    pub(super) probs: Vec<f64>,
    pub(super) inf_mass: f64,
}

impl DiscretePld {
    fn hi(&self) -> i64 {
        self.lo + self.probs.len() as i64 - 1
    }
}

/// Standard normal tails at a point: (Φ(z), Φ̄(z)), the smaller one computed directly
/// ([`numeric::normal_tail::upper_tail`], full relative accuracy), the larger one as 1 − the
/// smaller.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tails {
    z: f64,
    lower: f64,
    upper: f64,
    /// Relative error bound of the smaller of the two tails ([`tail_rel_err`]).
    rel: f64,
}

impl Tails {
    pub(super) fn at(z: f64) -> Tails {
        if z == f64::NEG_INFINITY {
            return Tails {
                z,
                lower: 0.0,
                upper: 1.0,
                rel: 0.0,
            };
        }
        if z == f64::INFINITY {
            return Tails {
                z,
                lower: 1.0,
                upper: 0.0,
                rel: 0.0,
            };
        }
        Tails::from_small(z, numeric::normal_tail::upper_tail(z.abs()))
    }

    /// [`Tails::at`] at every z of `zs` into `out` (the same values: [`numeric::normal_tail::upper_tails`]
    /// computes the small tails as [`numeric::normal_tail::upper_tail`] does, in two passes).
    fn at_all(zs: &[f64], abs: &mut Vec<f64>, args: &mut Vec<f64>, small: &mut Vec<f64>, out: &mut Vec<Tails>) {
        abs.clear();
        abs.extend(zs.iter().map(|z| z.abs()));
        numeric::normal_tail::upper_tails(abs, args, small);
        out.clear();
        out.extend(zs.iter().zip(small.iter()).map(|(&z, &s)| {
            if z.is_infinite() {
                Tails::at(z)
            } else {
                Tails::from_small(z, s)
            }
        }));
    }

    /// The tails at a finite z (or NaN) from the smaller one, `small` = Φ̄(|z|).
    #[inline]
    fn from_small(z: f64, small: f64) -> Tails {
        // Beyond the table the tail is only bounded (≤ 1e-299): relative error 1 covers [0, 2·bound].
        let rel = if z.abs() < numeric::normal_tail::Z_MAX {
            tail_rel_err(z)
        } else {
            1.0
        };
        if z >= 0.0 {
            Tails {
                z,
                lower: 1.0 - small,
                upper: small,
                rel,
            }
        } else {
            Tails {
                z,
                lower: small,
                upper: 1.0 - small,
                rel,
            }
        }
    }
}

impl Tails {
    /// Relative error bound of `upper` (computed directly when z ≥ 0, else as 1 − lower).
    fn upper_rel(&self) -> f64 {
        if self.z >= 0.0 {
            self.rel.max(TAIL_REL_ERR)
        } else {
            (self.lower * self.rel + U) / self.upper + TAIL_REL_ERR
        }
    }
    /// Relative error bound of `lower`.
    fn lower_rel(&self) -> f64 {
        if self.z < 0.0 {
            self.rel.max(TAIL_REL_ERR)
        } else {
            (self.upper * self.rel + U) / self.lower + TAIL_REL_ERR
        }
    }
}

/// Standard normal mass of (a, b] with an absolute error bound, from the side where the tail
/// values are small (so narrow intervals in either tail keep their relative accuracy).
pub(super) fn nmass(a: &Tails, b: &Tails) -> (f64, f64) {
    // Both ends in the upper tail: difference of upper tails. Otherwise (both in the lower
    // tail, or a < 0 < b) the difference of lower tails. Each tail value carries its own
    // relative error bound (the directly computed small tail, or 1 − it).
    let (m, err) = if a.z >= 0.0 {
        (a.upper - b.upper, a.upper_rel() * a.upper + b.upper_rel() * b.upper)
    } else {
        (b.lower - a.lower, a.lower_rel() * a.lower + b.lower_rel() * b.lower)
    };
    let m = m.max(0.0);
    (m, err + U * m)
}

/// ln(1 − q + q·e^y): the remove-direction privacy loss of Poisson(q) ∘ Gaussian at
/// y = (2x − 1)/(2σ²) (Mironov, Talwar & Zhang 2019, §3; Koskela et al. 2020, §6.2).
pub(super) fn log_mix(q: f64, y: f64) -> f64 {
    if q >= 1.0 {
        return y;
    }
    if y > 0.0 {
        y + (q + (1.0 - q) * (-y).exp()).ln()
    } else {
        (q * y.exp_m1()).ln_1p()
    }
}

/// ln((e^ε − 1 + q)/q), the inverse of [`log_mix`] in y; −∞ where e^ε ≤ 1 − q.
fn inv_log_mix(q: f64, eps: f64) -> f64 {
    if q >= 1.0 {
        return eps;
    }
    if eps > 0.0 {
        // As in `gaussian_pld`'s x_b: non-negative terms only, accurate for tiny ε and q.
        eps + ((1.0 - q) * -(-eps).exp_m1() / q).ln_1p()
    } else {
        let t = eps.exp_m1() / q;
        if t <= -1.0 {
            f64::NEG_INFINITY
        } else {
            t.ln_1p()
        }
    }
}

/// Where the add direction's grid of a subsampled Gaussian starts: at the loss below which the
/// P-mass is ADD_LOW_CUT × the per-step truncation τ (at most 1e-9, at least max(τ, 1e-16)),
/// that mass put at the first grid point ([`gaussian_range`]).
const ADD_LOW_CUT: f64 = 1e7;

/// Grid points [`gaussian_pld`] handles at a time (its per-point buffers stay in the L2 cache).
const DISCRETISE_CHUNK: usize = 2048;

/// Per-thread buffers of [`gaussian_pld`].
#[derive(Default)]
struct DiscretiseScratch {
    xs: Vec<f64>,
    t0: Vec<Tails>,
    t1: Vec<Tails>,
    surv: Vec<f64>,
    probs: Vec<f64>,
    /// Arguments and intermediate values of [`Tails::at_all`].
    zs: Vec<f64>,
    za: Vec<f64>,
    zb: Vec<f64>,
    zc: Vec<f64>,
}

thread_local! {
    static DISCRETISE_SCRATCH: std::cell::Cell<DiscretiseScratch> = std::cell::Cell::new(DiscretiseScratch::default());
}

/// Grid of [`gaussian_pld`]: first index and number of points (all but `tau` of the P-mass on
/// each side, losses up to [`MAX_STEP_LOSS`], at most `max_points`).
fn gaussian_range(q: f64, sigma: f64, dir: Direction, h: f64, tau: f64, max_points: usize) -> Result<(i64, usize)> {
    let s2 = sigma * sigma;
    let q = q.min(1.0);
    // Range of x holding all but `tau` of the P-mass on each side.
    let z_tau = numeric::ndtri_sf(tau);
    let loss_x = |x: f64| -> f64 {
        let y = (2.0 * x - 1.0) / (2.0 * s2);
        match dir {
            Direction::Remove => log_mix(q, y),
            Direction::Add => -log_mix(q, y),
        }
    };
    let (eps_lo, eps_hi) = match dir {
        Direction::Remove => (loss_x(-sigma * z_tau), loss_x(1.0 + sigma * z_tau)),
        // Add: the loss rises as x falls, towards −ln(1 − q). Above x = σ·Φ̄⁻¹(τ) it goes to +∞
        // (P-mass ≤ τ, as in the remove direction) rather than filling a grid up to −ln(1 − q)
        // with masses that only rounding tells apart from 0. Low losses are high x; where
        // Φ̄(x/σ) < 1e-16 the survival S = 1 − Φ̄ rounded up by its error bound (≥ 8u) is 1, so
        // grid points there would carry no mass (the mass below lands on the first point anyway).
        // Further up, the P-mass m below the grid's first point ε_lo ≤ 0 is put *at* ε_lo (moved up
        // in loss: sound); in a composition of T steps that raises δ(ε) by at most
        // m·δ_rest(ε − ε_lo) ≤ m·δ(ε) per step (δ_rest(ε') falls in ε', and composing more
        // steps never lowers the hockey-stick divergence), so by at most T·m relative in all. With
        // m = ADD_LOW_CUT·τ (τ = the per-step truncation τ_total/(2T)) that is ≤ ADD_LOW_CUT·τ_total/2
        // = 5e-7 relative at the default τ_total 1e-13, and it drops the grid points of the
        // Gaussian tail beyond Φ̄ = m (≈ 40–60 % of this direction's points at 10⁴–10⁶ steps).
        Direction::Add => {
            let cut = (tau * ADD_LOW_CUT).min(1e-9).max(tau).max(1e-16);
            let lo = loss_x(sigma * numeric::ndtri_sf(cut));
            let lo = if lo <= 0.0 {
                lo
            } else {
                loss_x(sigma * numeric::ndtri_sf(tau.max(1e-16)))
            };
            (lo, loss_x(-sigma * z_tau))
        }
    };
    if !(eps_lo.is_finite() && eps_hi.is_finite()) {
        return Err(Error::numeric(format!(
            "pld: privacy-loss range not finite for q = {q}, σ = {sigma} ({eps_lo}, {eps_hi})"
        )));
    }
    let i_lo = (eps_lo / h).floor() as i64;
    // Losses above MAX_STEP_LOSS in one step go to +∞ (sound; only matters for nearly blatant
    // steps, where ε at any useful δ is far beyond meaningful values anyway).
    let eps_hi = eps_hi.min(MAX_STEP_LOSS.max(eps_lo + h));
    let mut i_hi = ((eps_hi / h).ceil() as i64).max(i_lo + 1);
    if (i_hi - i_lo + 1) as usize > max_points {
        i_hi = i_lo + max_points as i64 - 1;
    }
    Ok((i_lo, (i_hi - i_lo + 1) as usize))
}

/// e^{ε_i}, e^{ε_i} − 1, e^{−ε_i} and e^{−ε_i} − 1 at the grid values ε_i = i·h of an index
/// range, shared by every leaf of a composition (the same calls a leaf would make, so the
/// discretisation is bit-for-bit the same with or without the table; outside the range the
/// values are computed on the spot).
struct GridExp {
    h: f64,
    i0: i64,
    v: Vec<[f64; 4]>,
}

impl GridExp {
    /// Largest table (entries of 32 bytes).
    const MAX_LEN: usize = 1 << 20;

    fn values(eps: f64) -> [f64; 4] {
        [eps.exp(), eps.exp_m1(), (-eps).exp(), (-eps).exp_m1()]
    }

    fn new(h: f64, i_lo: i64, n: usize) -> GridExp {
        let n = if n > Self::MAX_LEN { 0 } else { n };
        GridExp {
            h,
            i0: i_lo,
            v: (0..n).map(|k| Self::values((i_lo + k as i64) as f64 * h)).collect(),
        }
    }

    fn empty(h: f64) -> GridExp {
        GridExp {
            h,
            i0: 0,
            v: Vec::new(),
        }
    }

    /// Entry `which` of [`Self::values`] at ε_i = i·h (0: e^{ε_i}, 1: e^{ε_i} − 1, 2: e^{−ε_i},
    /// 3: e^{−ε_i} − 1): from the table, or outside it by the one call that entry needs (the same
    /// call on the same argument, so the same value; computing all four there cost a leaf without
    /// a table, e.g. a calibration's one leaf, two `expm1` and two `exp` calls per grid point
    /// that nothing read).
    #[inline]
    fn get(&self, i: i64, which: usize) -> f64 {
        match usize::try_from(i - self.i0) {
            Ok(k) if k < self.v.len() => self.v[k][which],
            _ => {
                let eps = i as f64 * self.h;
                match which {
                    0 => eps.exp(),
                    1 => eps.exp_m1(),
                    2 => (-eps).exp(),
                    _ => (-eps).exp_m1(),
                }
            }
        }
    }
}

/// Grid points between two survivals computed in the sparse top of [`gaussian_pld`].
const SPARSE_STRIDE: usize = 16;

/// Where the sparse top of [`gaussian_pld`]'s grid starts (an index k_s = n − 1 − j·SPARSE_STRIDE
/// ≥ 1), or `None` for no sparse top (the add direction, whose losses are bounded by −ln(1 − q),
/// or fewer than two sparse intervals).
///
/// Above the loss where the remove direction's P-mass per step falls to s = 2τ/(F·h)
/// (F = [`SPARSE_STRIDE`], τ the per-step truncation), the survival S(ε_k) is computed at every F-th
/// grid point only and each interval's P-mass goes to its upper end: rounding losses up, which
/// dominates (docs/pld.md, Soundness step 1). What it costs: raising one step's loss by at most
/// g = F·h on an event of P-mass ≤ s raises the composed δ(ε) = E[(1 − e^{ε−L})₊] by at most
/// s·(1 − e^{−g}) ≤ s·F·h = 2τ, so over the composition's T steps (τ = τ_total/(2T)) by at most the
/// truncation budget τ_total (1e-13 by default) in all. Where the losses grow fastest (small σ, long
/// horizons, where τ is tiny and the grid runs to z ≈ 9 standard deviations) this skips 30–50 % of
/// the grid's survival evaluations. The boundary is where each of the two terms of
/// S(x) = (1 − q)Φ̄(x/σ) + qΦ̄((x − 1)/σ) is at most s/2; its precision only moves where the sparse
/// part starts, never the soundness.
fn sparse_top(q: f64, sigma: f64, dir: Direction, h: f64, tau: f64, i_lo: i64, n: usize) -> Option<usize> {
    #[cfg(test)]
    if tests::DENSE_ONLY.with(|c| c.get()) {
        return None;
    }
    if dir != Direction::Remove || n < 4 * SPARSE_STRIDE {
        return None;
    }
    let s = 2.0 * tau / (SPARSE_STRIDE as f64 * h);
    if !(s > 0.0 && s < 1e-3) {
        return None;
    }
    // S(x) = (1 − q)Φ̄(x/σ) + qΦ̄((x − 1)/σ) ≤ s where both terms are ≤ s/2.
    let q = q.min(1.0);
    let x = (1.0 + sigma * numeric::ndtri_sf((s / (2.0 * q)).min(0.5))).max(sigma * numeric::ndtri_sf(s / 2.0));
    let loss = log_mix(q, (2.0 * x - 1.0) / (2.0 * sigma * sigma));
    if !loss.is_finite() {
        return None;
    }
    let k_thr = ((loss / h).ceil() as i64 - i_lo).max(1);
    let top = n as i64 - 1;
    let intervals = (top - k_thr) / SPARSE_STRIDE as i64;
    (intervals >= 2).then(|| (top - intervals * SPARSE_STRIDE as i64) as usize)
}

feature_dispatch! { "avx2";
    /// Pessimistic connect-the-dots PLD of Poisson(q) ∘ Gaussian(σ) (sensitivity 1) in one
    /// direction, on the grid i·h.
    ///
    /// Remove: P = (1−q)N(0,σ²) + qN(1,σ²), Q = N(0,σ²), loss ℓ(x) = ln(1−q+q e^{(2x−1)/2σ²}),
    /// increasing in x. Add: P = N(0,σ²), Q = the mixture, loss −ℓ(x), decreasing in x.
    /// (Zhu, Dong & Wang 2022, "Optimal accounting of differential privacy via characteristic
    /// function", Prop. 8: these pairs dominate the subsampled Gaussian under add/remove.)
    ///
    /// Each interval (ε_i, ε_{i+1}] of true losses is split between its two grid ends so that both
    /// its P- and Q-mass are kept (Doroshenko et al. 2022, Alg. 1): the upper end gets P-mass
    /// num/(1 − e^{−h}) with num = P(I) − e^{ε_i}Q(I) ≥ 0. We round num up by its error bound and the
    /// tail mass above every grid boundary up by its error bound ([`tail_rel_err`]), so mass only moves to higher
    /// losses (see docs/pld.md, "Soundness"). In the far upper tail ([`sparse_top`]) the boundaries
    /// are every [`SPARSE_STRIDE`]-th grid point and each interval's P-mass goes to its upper end.
    ///
    /// Compiled a second time with AVX2 (no FMA: the same operations and roundings, so the same
    /// PLD bit for bit), run where the CPU has it: the per-point passes use wider vectors.
    fn gaussian_pld(q: f64, sigma: f64, dir: Direction, h: f64, tau: f64, max_points: usize, grid: &GridExp) -> Result<DiscretePld> {
        gaussian_pld_body(q, sigma, dir, h, tau, max_points, grid)
    }
}

/// The body of [`gaussian_pld`] (compiled twice: plain and with AVX2).
#[inline(always)]
fn gaussian_pld_body(
    q: f64,
    sigma: f64,
    dir: Direction,
    h: f64,
    tau: f64,
    max_points: usize,
    grid: &GridExp,
) -> Result<DiscretePld> {
    debug_assert_eq!(grid.h, h);
    let (i_lo, n) = gaussian_range(q, sigma, dir, h, tau, max_points)?;
    let s2 = sigma * sigma;
    let q = q.min(1.0);
    // x_b(ε_i): for Remove the loss exceeds ε_i iff x > x_b, for Add iff x < x_b; x_b = σ²·y + ½
    // with y = `inv_log_mix`(q, ±ε_i), its exponentials taken from the shared table.
    let x_bound = |i: i64| -> f64 {
        if q >= 1.0 {
            let e = match dir {
                Direction::Remove => i as f64 * h,
                Direction::Add => -(i as f64 * h),
            };
            return s2 * e + 0.5;
        }
        let eps = i as f64 * h;
        // e = ±ε_i; e^{−e} − 1 and e^e − 1 are the table's entries 3 and 1 (remove) or 1 and 3
        // (add), only the one used being looked up.
        let (e, neg_e_entry, e_entry) = match dir {
            Direction::Remove => (eps, 3, 1),
            Direction::Add => (-eps, 1, 3),
        };
        let y = if e > 0.0 {
            let expm1_neg_e = grid.get(i, neg_e_entry);
            // y = ln((e^e − 1 + q)/q) = e + ln(1 + (1 − q)(1 − e^{−e})/q) (Mironov, Talwar &
            // Zhang 2019, §3, solved for y): a sum of non-negative terms, so y keeps its relative
            // accuracy for tiny e and q, where the form e + ln(1 − (1 − q)e^{−e}) − ln q cancels
            // (relative error u/(q + e) in its last logarithm; a refined grid meets such e).
            e + ((1.0 - q) * -expm1_neg_e / q).ln_1p()
        } else {
            let expm1_e = grid.get(i, e_entry);
            let t = expm1_e / q;
            if t <= -1.0 {
                f64::NEG_INFINITY
            } else {
                t.ln_1p()
            }
        };
        s2 * y + 0.5
    };

    // Tails of N(0,σ²) and N(1,σ²) at every boundary x_b(ε_i), in per-thread buffers reused
    // from leaf to leaf (large short-lived allocations cost page faults and TLB flushes). The
    // grid is walked in chunks of DISCRETISE_CHUNK points from the top down, so the per-point
    // buffers stay in cache and only `probs` spans the leaf: every value is computed exactly as
    // over the whole grid at once (the running maximum from the top carries the value above the
    // chunk, the top interval of a chunk reads the point above it, and each entry of `probs`
    // receives at most two non-negative terms added to 0, in either order the same sum).
    let mut scratch = DISCRETISE_SCRATCH.with(|c| c.take());
    let (xs, t0, t1, surv, probs) = (
        &mut scratch.xs,
        &mut scratch.t0,
        &mut scratch.t1,
        &mut scratch.surv,
        &mut scratch.probs,
    );
    let (zs, za, zb, zc) = (&mut scratch.zs, &mut scratch.za, &mut scratch.zb, &mut scratch.zc);
    // (A reused buffer: a fresh zeroed one is read before it is written, and every such page
    // costs a copy-on-write fault with a TLB shootdown across the worker threads.)
    probs.clear();
    probs.resize(n, 0.0);
    let one_minus_e_neg_h = -(-h).exp_m1();
    // S_k = P(loss > ε_k) from the tails at x_b(ε_k), rounded up by its error bound.
    let survival = |a0: &Tails, a1: &Tails| -> f64 {
        let v = match dir {
            Direction::Remove => (1.0 - q) * a0.upper + q * a1.upper,
            Direction::Add => a0.lower,
        };
        let rel = match dir {
            Direction::Remove => a0.upper_rel().max(a1.upper_rel()),
            Direction::Add => a0.lower_rel(),
        };
        (v * (1.0 + rel)).min(1.0)
    };
    // (t0, t1, S) at the point just above the current chunk.
    let mut above: Option<(Tails, Tails, f64)> = None;
    let mut inf_mass = 0.0;
    let mut end = n;
    // The sparse top ([`sparse_top`]): survivals at every SPARSE_STRIDE-th point only, each
    // interval's P-mass rounded up to its upper end.
    if let Some(k_s) = sparse_top(q, sigma, dir, h, tau, i_lo, n) {
        xs.clear();
        xs.extend((k_s..n).step_by(SPARSE_STRIDE).map(|k| x_bound(i_lo + k as i64)));
        zs.clear();
        zs.extend(xs.iter().map(|&x| x / sigma));
        t0.clear();
        Tails::at_all(zs, za, zb, zc, t0);
        zs.clear();
        zs.extend(xs.iter().map(|&x| (x - 1.0) / sigma));
        t1.clear();
        Tails::at_all(zs, za, zb, zc, t1);
        surv.clear();
        surv.extend(t0.iter().zip(t1.iter()).map(|(a0, a1)| survival(a0, a1)));
        let m = surv.len();
        for j in (0..m - 1).rev() {
            if surv[j] < surv[j + 1] {
                surv[j] = surv[j + 1];
            }
        }
        inf_mass = surv[m - 1];
        for j in 0..m - 1 {
            probs[k_s + (j + 1) * SPARSE_STRIDE] += (surv[j] - surv[j + 1]).max(0.0);
        }
        above = Some((t0[0], t1[0], surv[0]));
        end = k_s;
    }
    while end > 0 {
        let start = end.saturating_sub(DISCRETISE_CHUNK);
        xs.clear();
        t0.clear();
        t1.clear();
        surv.clear();
        // Separate passes (each a tight loop of one kind of call) run faster than one fused loop.
        xs.extend((start..end).map(|k| x_bound(i_lo + k as i64)));
        zs.clear();
        zs.extend(xs.iter().map(|&x| x / sigma));
        Tails::at_all(zs, za, zb, zc, t0);
        zs.clear();
        zs.extend(xs.iter().map(|&x| (x - 1.0) / sigma));
        Tails::at_all(zs, za, zb, zc, t1);
        let m = end - start;

        // S_k = P(loss > ε_k), each rounded up, then made non-increasing from the top (raising only).
        surv.extend((0..m).map(|j| survival(&t0[j], &t1[j])));
        if end == n {
            inf_mass = surv[m - 1];
        }
        for j in (0..m).rev() {
            let next = if j + 1 < m {
                surv[j + 1]
            } else {
                match above {
                    Some((_, _, s)) => s,
                    None => continue,
                }
            };
            if surv[j] < next {
                surv[j] = next;
            }
        }

        for j in 0..m {
            let k = start + j;
            // The point above k: in this chunk, or the one above it (none above the grid's top).
            let (u0, u1, s_up) = if j + 1 < m {
                (&t0[j + 1], &t1[j + 1], surv[j + 1])
            } else {
                match &above {
                    Some((a0, a1, s)) => (a0, a1, *s),
                    None => continue,
                }
            };
            let p_int = (surv[j] - s_up).max(0.0);
            if p_int == 0.0 {
                continue;
            }
            let expm1_k = grid.get(i_lo + k as i64, 1);
            // Interval masses of N(0,σ²) and N(1,σ²) over the x-interval of (ε_k, ε_{k+1}].
            let (m0, e0, m1, e1) = match dir {
                Direction::Remove => {
                    let (m0, e0) = nmass(&t0[j], u0);
                    let (m1, e1) = nmass(&t1[j], u1);
                    (m0, e0, m1, e1)
                }
                Direction::Add => {
                    let (m0, e0) = nmass(u0, &t0[j]);
                    let (m1, e1) = nmass(u1, &t1[j]);
                    (m0, e0, m1, e1)
                }
            };
            // num = P(I) − e^{ε_k} Q(I), written without the (1 − q) terms that cancel.
            let (num, err) = match dir {
                Direction::Remove => {
                    let c = expm1_k + q;
                    let num = q * m1 - c * m0;
                    (num, q * e1 + c.abs() * e0 + 4.0 * U * (q * m1 + c.abs() * m0))
                }
                Direction::Add => {
                    let d = q - (1.0 - q) * expm1_k;
                    let g = q * grid.get(i_lo + k as i64, 0);
                    let num = d * m0 - g * m1;
                    (num, d.abs() * e0 + g * e1 + 4.0 * U * (d.abs() * m0 + g * m1))
                }
            };
            let up = ((num + err).max(0.0) / one_minus_e_neg_h * (1.0 + 4.0 * U)).min(p_int);
            probs[k + 1] += up;
            probs[k] += p_int - up;
        }
        if start == 0 {
            // Lower tail (loss ≤ ε_lo): all of it at ε_lo (rounding up).
            probs[0] += 1.0 - surv[0];
        }
        above = Some((t0[0], t1[0], surv[0]));
        end = start;
    }
    // The result holds only the support (no zeros at either end), copied out of the buffer.
    let d = match probs.iter().position(|&p| p > 0.0) {
        None => DiscretePld {
            lo: 0,
            probs: Vec::new(),
            inf_mass,
        },
        Some(f) => {
            let last = probs.iter().rposition(|&p| p > 0.0).unwrap();
            DiscretePld {
                lo: i_lo + f as i64,
                probs: probs[f..=last].to_vec(),
                inf_mass,
            }
        }
    };
    DISCRETISE_SCRATCH.with(|c| c.set(scratch));
    Ok(d)
}

/// x where the replace-one privacy loss ℓ(x) (see [`replace_one_pld`]) equals ε: with
/// u = e^{x/(2σ²)} and c = e^{−1/(8σ²)}, ℓ(x) = ε is the quadratic qc·u² + (1−q)(1−e^ε)·u − qc·e^ε = 0,
/// whose positive root is taken in the cancellation-free form for each sign of ε.
fn replace_one_x_bound(q: f64, sigma: f64, eps: f64) -> f64 {
    let s2 = sigma * sigma;
    let c = (-1.0 / (8.0 * s2)).exp();
    let beta = -(1.0 - q) * eps.exp_m1() / (q * c);
    let root = beta.hypot(2.0 * (0.5 * eps).exp());
    let ln_u = if beta <= 0.0 {
        ((-beta + root) / 2.0).ln()
    } else {
        std::f64::consts::LN_2 + eps - (beta + root).ln()
    };
    2.0 * s2 * ln_u
}

/// Pessimistic connect-the-dots PLD of Poisson(q) ∘ Gaussian(σ) under *replace-one*, σ relative
/// to the replace-one sensitivity Δ, on the grid i·h.
///
/// The record's contribution is a vector of norm ≤ Δ/2 added to the sampled sum (a clipped sum
/// with clip norm C has Δ = 2C); couple the two Poisson samples by position: with probability
/// 1 − q the record is absent and both outputs are N(0, σ²), otherwise they are N(v, σ²) and
/// N(v′, σ²) with ‖v‖, ‖v′‖ ≤ ½. The pair P = (1−q)N(0,σ²) + qN(½,σ²), Q = (1−q)N(0,σ²) + qN(−½,σ²)
/// is the one dp_accounting 0.6 uses for REPLACE_ONE (`privacy_loss_mechanism`, "REPLACE
/// adjacency type" with sensitivity C and std σ·2C/2 after rescaling; Zhu, Dong & Wang 2022,
/// §5). It is symmetric (x ↦ −x swaps P and Q), so one direction describes both.
/// Loss: ℓ(x) = ln(1−q + q e^{(4x−1)/(8σ²)}) − ln(1−q + q e^{(−4x−1)/(8σ²)}), increasing in x.
/// Discretised exactly as [`gaussian_pld`] (Doroshenko et al. 2022, Alg. 1), with every
/// floating-point choice rounded towards larger losses.
fn replace_one_pld(q: f64, sigma: f64, h: f64, tau: f64, max_points: usize) -> Result<DiscretePld> {
    let s2 = sigma * sigma;
    let z_tau = numeric::ndtri_sf(tau);
    let loss_x =
        |x: f64| -> f64 { log_mix(q, (4.0 * x - 1.0) / (8.0 * s2)) - log_mix(q, (-4.0 * x - 1.0) / (8.0 * s2)) };
    let eps_lo = loss_x(-sigma * z_tau);
    let eps_hi = loss_x(0.5 + sigma * z_tau);
    if !(eps_lo.is_finite() && eps_hi.is_finite()) {
        return Err(Error::numeric(format!(
            "pld: privacy-loss range not finite for replace-one q = {q}, σ = {sigma} ({eps_lo}, {eps_hi})"
        )));
    }
    let i_lo = (eps_lo / h).floor() as i64;
    let eps_hi = eps_hi.min(MAX_STEP_LOSS.max(eps_lo + h));
    let mut i_hi = ((eps_hi / h).ceil() as i64).max(i_lo + 1);
    if (i_hi - i_lo + 1) as usize > max_points {
        i_hi = i_lo + max_points as i64 - 1;
    }
    let n = (i_hi - i_lo + 1) as usize;
    let xs: Vec<f64> = (0..n)
        .map(|k| replace_one_x_bound(q, sigma, (i_lo + k as i64) as f64 * h))
        .collect();
    let t0: Vec<Tails> = xs.iter().map(|&x| Tails::at(x / sigma)).collect();
    let tp: Vec<Tails> = xs.iter().map(|&x| Tails::at((x - 0.5) / sigma)).collect();
    let tm: Vec<Tails> = xs.iter().map(|&x| Tails::at((x + 0.5) / sigma)).collect();
    let mut surv: Vec<f64> = (0..n)
        .map(|k| {
            let rel = t0[k].upper_rel().max(tp[k].upper_rel());
            (((1.0 - q) * t0[k].upper + q * tp[k].upper) * (1.0 + rel)).min(1.0)
        })
        .collect();
    for k in (0..n - 1).rev() {
        if surv[k] < surv[k + 1] {
            surv[k] = surv[k + 1];
        }
    }
    let mut probs = vec![0.0f64; n];
    probs[0] += 1.0 - surv[0];
    let one_minus_e_neg_h = -(-h).exp_m1();
    for k in 0..n - 1 {
        let p_int = (surv[k] - surv[k + 1]).max(0.0);
        if p_int == 0.0 {
            continue;
        }
        let eps_k = (i_lo + k as i64) as f64 * h;
        let (m0, e0) = nmass(&t0[k], &t0[k + 1]);
        let (mp, ep) = nmass(&tp[k], &tp[k + 1]);
        let (mm, em) = nmass(&tm[k], &tm[k + 1]);
        // num = P(I) − e^{ε_k} Q(I) = −(1−q)(e^{ε_k} − 1)m₀ + q·m₊ − q e^{ε_k} m₋.
        let c0 = -(1.0 - q) * eps_k.exp_m1();
        let g = q * eps_k.exp();
        let num = c0 * m0 + q * mp - g * mm;
        let err = c0.abs() * e0 + q * ep + g * em + 4.0 * U * (c0.abs() * m0 + q * mp + g * mm);
        let up = ((num + err).max(0.0) / one_minus_e_neg_h * (1.0 + 4.0 * U)).min(p_int);
        probs[k + 1] += up;
        probs[k] += p_int - up;
    }
    let inf_mass = surv[n - 1];
    Ok(trim(DiscretePld {
        lo: i_lo,
        probs,
        inf_mass,
    }))
}

/// The dominating pair of an (ε, δ)-DP mechanism as a PLD (Kairouz et al. 2015, Thm 2.1):
/// loss +ε with P-mass (1−δ)e^ε/(1+e^ε), −ε with (1−δ)/(1+e^ε), +∞ with δ; losses rounded up
/// onto the grid.
///
/// A grid holds losses up to `cap` = min([`MAX_STEP_LOSS`], (max_points − 1)·h/2) only (2ε/h
/// points would be 1.6 TB at ε = 10⁷ and overflow the index at ε ≥ 1e300): for ε above `cap`
/// the +ε mass goes to +∞ and the −ε mass is rounded up to −cap. Both only raise losses, so the
/// result still dominates the mechanism (sound; as for the Gaussian leaves above
/// [`MAX_STEP_LOSS`]); such a leaf has δ(ε') ≥ 1 − δ − e^{−ε}(1−δ) for every ε' < ε anyway.
fn epsilon_delta_pld(eps: f64, delta: f64, h: f64, max_points: usize) -> DiscretePld {
    let w = 1.0 - delta;
    let p_hi = w / (1.0 + (-eps).exp());
    let p_lo = w - p_hi;
    let cap = MAX_STEP_LOSS.min((max_points.max(2) - 1) as f64 * h / 2.0);
    if eps.is_nan() || eps > cap {
        return trim(DiscretePld {
            lo: (-cap / h).ceil() as i64,
            probs: vec![p_lo],
            // Rounded up: the +∞ mass may only grow.
            inf_mass: ((delta + p_hi) * (1.0 + 4.0 * U)).min(1.0),
        });
    }
    let hi = (eps / h).ceil() as i64;
    let lo = (-eps / h).ceil() as i64;
    let mut probs = vec![0.0; (hi - lo + 1) as usize];
    probs[0] += p_lo;
    *probs.last_mut().unwrap() += p_hi;
    DiscretePld {
        lo,
        probs,
        inf_mass: delta,
    }
}

/// The Laplace mechanism's PLD (scale b per unit sensitivity, Poisson rate q, q = 1 full batch)
/// by pessimistic connect-the-dots (Doroshenko et al. 2022, Alg. 1), as dp_accounting's
/// `LaplacePrivacyLoss` (Koskela, Jälkö, Prediger & Honkela 2021, §5 for the pair):
/// with r(x) = (|x| − |x − 1|)/b ∈ [−1/b, 1/b] the likelihood ratio Lap(1, b)/Lap(0, b) is e^r,
/// so the pairs are remove: P = (1−q)Lap(0) + qLap(1), Q = Lap(0), loss ln(1 − q + q e^r);
/// add: the reverse, loss −ln(1 − q + q e^r). Two atoms: x ≤ 0 (r = −1/b; Lap(0)-mass ½,
/// Lap(1)-mass ½e^{−1/b}) and x ≥ 1 (r = 1/b; the mirror), and a continuous part on (0, 1) with
/// Lap(0)-mass ½e^{−x₁/b}(1 − e^{−(x₂−x₁)/b}) and Lap(1)-mass ½e^{−(1−x₂)/b}(1 − e^{−(x₂−x₁)/b})
/// on (x₁, x₂]. Each loss interval (ε_i, ε_{i+1}] (and each atom, its loss rounded up) is split
/// between its ends keeping its P- and Q-mass; the interval's P-mass and the upper share are
/// rounded up by their error bounds, so every tail sum of the result is ≥ the exact
/// connect-the-dots one (the argument of docs/pld.md, Soundness step 2). Losses beyond the
/// grid cap fall back to the (ε, 0) pair of the pure-DP guarantee (sound, looser).
fn laplace_pld(q: f64, b: f64, dir: Direction, h: f64, max_points: usize) -> DiscretePld {
    let q = q.min(1.0);
    let r_max = 1.0 / b;
    let loss_r = |r: f64| match dir {
        Direction::Remove => log_mix(q, r),
        Direction::Add => -log_mix(q, r),
    };
    let (la, lb) = (loss_r(-r_max), loss_r(r_max));
    let (l_lo, l_hi) = (la.min(lb), la.max(lb));
    let lo = (l_lo / h).floor() as i64 - 1;
    let hi = (l_hi / h).ceil() as i64 + 1;
    if !(l_hi.is_finite() && l_lo.is_finite()) || l_hi > MAX_STEP_LOSS || (hi - lo) as usize + 1 > max_points {
        let eps = if q >= 1.0 {
            laplace_pure_epsilon(b)
        } else {
            amplified_epsilon(q, laplace_pure_epsilon(b))
        };
        return epsilon_delta_pld(eps, 0.0, h, max_points);
    }
    // Relative error bound of one Laplace mass: exp, expm1 and two products (a few u), plus the
    // rounding of the arguments x/b (≈ u·x/b ≤ u/b relative in the value).
    let rel = (32.0 + 4.0 * r_max) * U;
    let one_m_eh = -(-h).exp_m1() * (1.0 - 4.0 * U);
    let mut probs = vec![0.0; (hi - lo + 1) as usize];
    // (P, Q) of Lap(0)/Lap(1) masses (A, B) in this direction.
    let pq = |a: f64, bm: f64| -> (f64, f64) {
        match dir {
            Direction::Remove => ((1.0 - q) * a + q * bm, a),
            Direction::Add => (a, (1.0 - q) * a + q * bm),
        }
    };
    // One interval i with masses (P, Q): P rounded up, upper share rounded up and capped.
    let mut put = |i: i64, p: f64, qm: f64, eps_i: f64| {
        if p <= 0.0 {
            return;
        }
        let p_up = p * (1.0 + rel + 4.0 * U);
        let e = eps_i.exp();
        let num = p - e * qm;
        let err = (rel + 8.0 * U) * (p + e * qm);
        let upper = (((num + err).max(0.0) / one_m_eh) * (1.0 + 4.0 * U)).min(p_up);
        let k = (i - lo) as usize;
        probs[k] += p_up - upper;
        probs[k + 1] += upper;
    };
    // x of a loss value ε (clipped to [0, 1]); the loss is increasing in x for remove and
    // decreasing for add.
    let x_of = |eps: f64| -> f64 {
        let r = match dir {
            Direction::Remove => inv_log_mix(q, eps),
            Direction::Add => inv_log_mix(q, -eps),
        };
        (0.5 * (1.0 + b * r)).clamp(0.0, 1.0)
    };
    for i in lo..hi {
        let (e0, e1) = (i as f64 * h, (i + 1) as f64 * h);
        let (xa, xb) = {
            let (u0, u1) = (x_of(e0), x_of(e1));
            (u0.min(u1), u0.max(u1))
        };
        if xb > xa {
            let w = -(-(xb - xa) / b).exp_m1();
            let a = 0.5 * (-xa / b).exp() * w;
            let bm = 0.5 * (-(1.0 - xb) / b).exp() * w;
            let (p, qm) = pq(a, bm);
            put(i, p, qm, e0);
        }
    }
    // The atoms, each at its loss rounded up, split over the interval holding it.
    let far = (-r_max).exp();
    for (r, a, bm) in [(-r_max, 0.5, 0.5 * far), (r_max, 0.5 * far, 0.5)] {
        let (p, _) = pq(a, bm);
        let l = loss_r(r);
        let l = l + 1e-12 * (1.0 + l.abs());
        let i = (l / h).ceil() as i64 - 1;
        let e0 = i as f64 * h;
        // Q-mass p·e^{−ℓ} with ℓ the rounded-up loss: the split's upper share only grows.
        put(i, p, p * (-l).exp(), e0);
    }
    trim(DiscretePld {
        lo,
        probs,
        inf_mass: 0.0,
    })
}

/// Drops exact zeros at both ends.
fn trim(mut d: DiscretePld) -> DiscretePld {
    let first = d.probs.iter().position(|&p| p > 0.0);
    match first {
        None => DiscretePld {
            lo: 0,
            probs: Vec::new(),
            inf_mass: d.inf_mass,
        },
        Some(f) => {
            let last = d.probs.iter().rposition(|&p| p > 0.0).unwrap();
            d.probs.truncate(last + 1);
            d.probs.drain(..f);
            d.lo += f as i64;
            d
        }
    }
}

/// One direction's composed PLD, ready for ε(δ) and δ(ε) queries.
#[derive(Debug, Clone)]
pub struct ComposedDirection {
    /// Which neighbouring direction this PLD describes.
    pub direction: Direction,
    h: f64,
    /// Window start (grid index of `probs[0]`).
    lo: i64,
    probs: Vec<f64>,
    /// Mass at +∞: 1 − Π(1 − ι_j)^{T_j}, rounded up.
    pub inf_mass: f64,
    /// Chernoff bound on the composed mass outside the window (both sides).
    pub window_tail_mass: f64,
    /// L1 bound on the FFT round-off of the composed vector.
    pub roundoff: f64,
    /// Relative inflation covering the round-off of the per-point masses (≈ 4u per step).
    rel_inflation: f64,
    /// FFT length.
    pub fft_len: usize,
    /// The part of `inf_mass` that a staged composition's first stage carried to +∞ (its window
    /// tails and certified round-off, once per copy of the block): what the precise mode can
    /// shrink there, though it sits in the ∞ atom ([`ComposedPld::precision_limited`]).
    staged_slack: f64,
}

impl ComposedDirection {
    /// Everything added to δ regardless of ε (∞-mass, window tails, round-off).
    pub fn slack(&self) -> f64 {
        self.inf_mass + self.window_tail_mass + self.roundoff
    }

    /// Number of grid points in the composed window.
    pub fn grid_points(&self) -> usize {
        self.probs.len()
    }

    /// Upper bound on δ(ε) = ι + Σ_{ℓ>ε} p(ℓ)(1 − e^{ε−ℓ}) (+ slack).
    pub fn delta(&self, eps: f64) -> f64 {
        let mut sum = 0.0;
        for (k, &p) in self.probs.iter().enumerate().rev() {
            let l = (self.lo + k as i64) as f64 * self.h;
            if l <= eps {
                break;
            }
            sum += p * -(eps - l).exp_m1();
        }
        (sum * self.rel_inflation + self.slack()).min(1.0)
    }

    /// Smallest ε ≥ 0 with δ(ε) ≤ `delta` (∞ if even ε → ∞ leaves more than `delta`).
    pub fn epsilon(&self, delta: f64) -> f64 {
        let slack = self.slack();
        if slack >= delta {
            return f64::INFINITY;
        }
        // Target for the finite part Σ_{ℓ>ε} p(ℓ)(1 − e^{ε−ℓ}).
        let target = (delta - slack) / self.rel_inflation;
        // ε = 0 when the direct sum δ(0) meets δ. That sum (an `expm1` per point above 0) is
        // skipped where the mass at ℓ ≥ 1 alone puts δ(0) above δ: Σ_{ℓ>0} p(1 − e^{−ℓ}) ≥
        // (1 − e^{−1}) Σ_{ℓ≥1} p, with 0.632 < 1 − e^{−1} and a 1e-6 margin on either side for the
        // rounding of both sums (≤ n·u relative), so the direct sum would exceed δ there too.
        let first_at_one = ((1.0 / self.h).ceil() as i64 - self.lo).max(0) as usize;
        let mass_from_one: f64 = self.probs.get(first_at_one..).map_or(0.0, |t| t.iter().sum());
        let clearly_above = 0.632 * mass_from_one * (1.0 - 1e-6) > target * (1.0 + 1e-6);
        if !clearly_above && self.delta(0.0) <= delta {
            return 0.0;
        }
        // Scan down: A = Σ_{j≥k} p_j, B = Σ_{j≥k} p_j e^{ℓ_k − ℓ_j}; on [ℓ_{k−1}, ℓ_k] the finite
        // part is A − e^{ε−ℓ_k} B.
        let decay = (-self.h).exp();
        let (mut a, mut b) = (0.0f64, 0.0f64);
        for k in (0..self.probs.len()).rev() {
            let p = self.probs[k];
            a += p;
            b = p + b * decay;
            let lk = (self.lo + k as i64) as f64 * self.h;
            let at_prev = a - decay * b; // value at ε = ℓ_{k−1}
            if at_prev > target || k == 0 {
                if b <= 0.0 {
                    continue;
                }
                let r = (a - target) / b;
                let eps = if r > 0.0 { lk + r.ln() } else { f64::NEG_INFINITY };
                // Move to the safe side of the rounding of this closed form.
                let eps = eps + 1e-12 * (1.0 + eps.abs());
                return eps.max(0.0);
            }
        }
        0.0
    }
}

impl ComposedDirection {
    /// Relative deflation of a lower-bound sum: the leaves' own rounding is already in their
    /// (rounded-down) masses; this covers the composed masses' summation (≤ n·u relative over
    /// n positive terms) and the factors 1 − e^{ε−ℓ} (a few u each).
    fn lower_deflation(&self) -> f64 {
        1.0 - 4.0 * U * (self.probs.len() as f64 + 16.0) - 1e-12
    }

    /// For a composition of **dominated** leaves (every leaf's mass a lower bound on a garbling
    /// of the true pair, [`super::pld_lower`]): a certified lower bound on the true δ(ε),
    /// Σ_{ℓ>ε} p̂(ℓ)(1 − e^{ε−ℓ}) deflated for summation round-off, minus everything the cyclic
    /// composition may have added (the Chernoff bound on the mass outside the window, which is
    /// what aliasing folds into it) and the certified FFT round-off (an L1 bound on |p̂ − p|).
    /// Clamped at 0.
    pub(super) fn delta_lower(&self, eps: f64) -> f64 {
        let mut sum = 0.0;
        for (k, &p) in self.probs.iter().enumerate().rev() {
            let l = (self.lo + k as i64) as f64 * self.h;
            if l <= eps {
                break;
            }
            sum += p * -(eps - l).exp_m1();
        }
        (sum * self.lower_deflation() - self.window_tail_mass - self.roundoff).max(0.0)
    }

    /// The largest ε (found by the exact inverse of the piecewise form, then checked directly)
    /// with [`Self::delta_lower`](ε) > `delta`: the true ε(δ) is at least it. `None` when even
    /// ε = 0 is not certified.
    pub(super) fn epsilon_lower(&self, delta: f64) -> Option<f64> {
        if self.delta_lower(0.0) <= delta {
            return None;
        }
        let target = (delta + self.window_tail_mass + self.roundoff) / self.lower_deflation();
        let decay = (-self.h).exp();
        let (mut a, mut b) = (0.0f64, 0.0f64);
        let mut guess = 0.0;
        for k in (0..self.probs.len()).rev() {
            let p = self.probs[k];
            a += p;
            b = p + b * decay;
            let lk = (self.lo + k as i64) as f64 * self.h;
            let at_prev = a - decay * b;
            if at_prev > target || k == 0 {
                if b > 0.0 && a > target {
                    guess = lk + ((a - target) / b).ln();
                }
                break;
            }
        }
        // Step down until the direct evaluation certifies it (rounding of the closed form).
        let mut step = 1e-12 * (1.0 + guess.abs());
        let mut eps = guess - step;
        for _ in 0..200 {
            if eps <= 0.0 {
                return Some(0.0);
            }
            if self.delta_lower(eps) > delta {
                return Some(eps);
            }
            step *= 2.0;
            eps = guess - step;
        }
        None
    }
}

/// A composed PLD in both directions (add and remove).
#[derive(Debug, Clone)]
pub struct ComposedPld {
    /// The composed PLD of each direction; ε(δ) and δ(ε) take the worse one.
    pub directions: Vec<ComposedDirection>,
    /// Grid interval of the privacy-loss discretisation (nats).
    pub value_discretization_interval: f64,
    /// Ratio r of the ladder the leaves were grouped on (0: not grouped): every Gaussian leaf's
    /// σ was rounded down and its q up to a power of 1 + r ([`group_leaves`]).
    pub leaf_ladder: f64,
}

impl ComposedPld {
    /// ε(δ): the worse direction.
    pub fn epsilon(&self, delta: f64) -> f64 {
        self.directions.iter().map(|d| d.epsilon(delta)).fold(0.0, f64::max)
    }
    /// δ(ε): the worse direction.
    pub fn delta(&self, eps: f64) -> f64 {
        self.directions.iter().map(|d| d.delta(eps)).fold(0.0, f64::max)
    }
    /// True when what the precise mode can shrink is large in some direction (certified round-off
    /// and window tails above 1 % of `target`, or what a staged composition's blocks carried to
    /// +∞ above 10 %: recomposing a staged composition on double words costs several times the
    /// first, and 1.2e-7 of such slack at 10⁸ steps and δ = 1e-5 moved ε by 5e-8 relative) while
    /// the rest of the infinite-loss mass, which it cannot shrink, leaves room below `target`.
    fn precision_limited(&self, target: f64) -> bool {
        self.directions.iter().any(|d| {
            (d.roundoff + d.window_tail_mass > 0.01 * target || d.staged_slack > 0.1 * target)
                && d.inf_mass - d.staged_slack < 0.5 * target
        })
    }

    /// Largest slack (∞-mass + truncation + round-off) over directions: no δ below it can be
    /// certified with a finite ε.
    pub fn delta_floor(&self) -> f64 {
        self.directions.iter().map(|d| d.slack()).fold(0.0, f64::max)
    }
    fn max_of(&self, f: impl Fn(&ComposedDirection) -> f64) -> f64 {
        self.directions.iter().map(f).fold(0.0, f64::max)
    }
    fn annotate(&self, mut r: Evidence, delta_target: Option<f64>) -> Evidence {
        r = r
            .with_detail("grid_interval", self.value_discretization_interval)
            .with_detail("inf_mass", self.max_of(|d| d.inf_mass))
            .with_detail("truncated_mass", self.max_of(|d| d.inf_mass + d.window_tail_mass))
            .with_detail("window_tail_mass", self.max_of(|d| d.window_tail_mass))
            .with_detail("fft_roundoff_bound", self.max_of(|d| d.roundoff))
            .with_detail("grid_points", self.max_of(|d| d.grid_points() as f64))
            .with_detail("fft_len", self.max_of(|d| d.fft_len as f64));
        if self.leaf_ladder > 0.0 {
            r = r.with_detail("leaf_ladder_ratio", self.leaf_ladder).with_diagnostic(
                "pld_leaves_grouped",
                format!(
                    "more than {GROUP_ABOVE} distinct steps: each Gaussian step's noise multiplier was rounded \
                     down and its sampling rate up to a power of 1 + {:.3e} (a step that dominates it), so \
                     steps on one rung compose as one (sound; looser by about that ratio at most)",
                    self.leaf_ladder
                ),
                false,
            );
        }
        if let Some(delta) = delta_target {
            let floor = self.delta_floor();
            if floor >= delta {
                let inf = self.max_of(|d| d.inf_mass);
                r = r.with_diagnostic(
                    "pld_delta_below_floor",
                    format!(
                        "δ = {delta:e} is at or below the mass the PLD cannot bound ({floor:e}: infinite-loss \
                         mass {inf:e} from nearly blatant steps or truncation, window tails and FFT round-off); \
                         no finite ε is certified, so ε = ∞. Raise δ, or lower tail_mass_truncation / raise \
                         max_grid_points if the infinite-loss mass comes from truncation"
                    ),
                    true,
                );
            }
        }
        r
    }
}

/// Plans one leaf in one direction.
fn leaf_pld(leaf: Leaf, dir: Direction, h: f64, tau: f64, max_points: usize, grid: &GridExp) -> Result<DiscretePld> {
    match leaf {
        Leaf::SampledGaussian { q, sigma } => gaussian_pld(q, sigma, dir, h, tau, max_points, grid),
        Leaf::EpsilonDelta { epsilon, delta } => Ok(epsilon_delta_pld(epsilon, delta, h, max_points)),
        Leaf::ReplaceGaussian { q, sigma } => replace_one_pld(q, sigma, h, tau, max_points),
        Leaf::Laplace { q, b } => Ok(laplace_pld(q, b, dir, h, max_points)),
    }
}

/// ln Σ_i p_i e^{t·i} over a discrete PLD's finite part (t in grid units), by Horner from the
/// top so nothing overflows.
#[cfg(test)]
fn log_mgf(d: &DiscretePld, t: f64) -> f64 {
    if d.probs.is_empty() {
        return f64::NEG_INFINITY;
    }
    if t >= 0.0 {
        // Σ p_i e^{−t(hi−i)}: Horner from the bottom ends with the top term at power 0.
        let f = (-t).exp();
        let s = d.probs.iter().fold(0.0, |s, &p| s * f + p);
        t * d.hi() as f64 + s.ln()
    } else {
        // Σ p_i e^{t(i−lo)} (t < 0): Horner from the top ends with the bottom term at power 0.
        let f = t.exp();
        let s = d.probs.iter().rev().fold(0.0, |s, &p| s * f + p);
        t * d.lo as f64 + s.ln()
    }
}

/// [`log_mgf`] at up to [`MGF_BATCH`] positive exponents `tp` and as many negative ones `tn` in
/// one pass over the PLD: the positive chains run Horner's rule from the bottom, the negative
/// ones from the top, side by side (each chain is a sequence of dependent roundings, so more
/// chains fill the pipeline; each computes exactly what it would alone). Unused lanes are
/// computed and dropped. On x86-64 with AVX2 the same operations run on 256-bit vectors (a
/// multiplication, then an addition: no fused multiply-add, so the same roundings, bit for bit).
fn log_mgf_dual(d: &DiscretePld, tp: &[f64], tn: &[f64], out_p: &mut [f64], out_n: &mut [f64]) {
    debug_assert!(tp.len() <= MGF_BATCH && tn.len() <= MGF_BATCH);
    debug_assert!(tp.iter().all(|&t| t >= 0.0) && tn.iter().all(|&t| t < 0.0));
    if d.probs.is_empty() {
        out_p.iter_mut().for_each(|o| *o = f64::NEG_INFINITY);
        out_n.iter_mut().for_each(|o| *o = f64::NEG_INFINITY);
        return;
    }
    let mut fp = [0.0f64; MGF_BATCH];
    let mut fn_ = [0.0f64; MGF_BATCH];
    for (fi, &t) in fp.iter_mut().zip(tp) {
        *fi = (-t).exp();
    }
    for (fi, &t) in fn_.iter_mut().zip(tn) {
        *fi = t.exp();
    }
    feature_dispatch! { "avx2";
        /// The 2·MGF_BATCH Horner chains over `probs` (compiled a second time with AVX2, no FMA:
        /// the same roundings).
        fn chains(probs: &[f64], fp: &[f64; MGF_BATCH], fn_: &[f64; MGF_BATCH]) -> ([f64; MGF_BATCH], [f64; MGF_BATCH]) {
            let mut sp = [0.0f64; MGF_BATCH];
            let mut sn = [0.0f64; MGF_BATCH];
            for (&a, &b) in probs.iter().zip(probs.iter().rev()) {
                for j in 0..MGF_BATCH {
                    sp[j] = sp[j] * fp[j] + a;
                    sn[j] = sn[j] * fn_[j] + b;
                }
            }
            (sp, sn)
        }
    }
    let (sp, sn) = chains(&d.probs, &fp, &fn_);
    for (j, (o, &t)) in out_p.iter_mut().zip(tp).enumerate() {
        // Σ p_i e^{−t(hi−i)}: Horner from the bottom ends with the top term at power 0.
        *o = t * d.hi() as f64 + sp[j].ln();
    }
    for (j, (o, &t)) in out_n.iter_mut().zip(tn).enumerate() {
        // Σ p_i e^{t(i−lo)} (t < 0): Horner from the top ends with the bottom term at power 0.
        *o = t * d.lo as f64 + sn[j].ln();
    }
}

/// Exponents of one sign evaluated together by [`log_mgf_dual`].
const MGF_BATCH: usize = 16;

/// The coarse Chernoff exponents of [`chernoff_window_div`] (grid units): a geometric grid from
/// 1e-7 to 1e-7·10^8.7.
fn coarse_exponents() -> [f64; MGF_BATCH] {
    std::array::from_fn(|i| 1e-7 * 10f64.powf(i as f64 * 8.7 / 15.0))
}

/// Each leaf's ln E[e^{tK_j}] at the coarse exponents t = +t_c (`[0]`) and t = −t_c (`[1]`),
/// for the leaves of a window's composition in order. They do not depend on the counts, so a
/// staged composition's block window (counts divided) reuses those of the one-stage window.
pub(super) struct CoarseMgf(Vec<[[f64; MGF_BATCH]; 2]>);

/// [`CoarseMgf`] of every leaf with ⌊count/`div`⌋ > 0, one pass per leaf, leaves in parallel.
fn coarse_mgfs(parts: &[(DiscretePld, u64)], div: u64) -> CoarseMgf {
    let tp = coarse_exponents();
    let tn: [f64; MGF_BATCH] = std::array::from_fn(|i| -tp[i]);
    CoarseMgf(
        parts
            .par_iter()
            .filter(|(_, c)| c / div > 0)
            .map(|(d, _)| {
                let mut v = [[0.0f64; MGF_BATCH]; 2];
                let [vp, vn] = &mut v;
                log_mgf_dual(d, &tp, &tn, vp, vn);
                v
            })
            .collect(),
    )
}

/// Λ(t) = Σ_j T_j ln E[e^{t·K_j}] of the composition at every t of `tp` (positive) and `tn`
/// (negative), at most [`MGF_BATCH`] each, one pass over each PLD, leaves in parallel;
/// T_j = ⌊count_j/`div`⌋ (a staged composition's block, without copying its leaves), leaves with
/// T_j = 0 left out.
fn cumulants_dual(parts: &[(DiscretePld, u64)], div: u64, tp: &[f64], tn: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (np, nn) = (tp.len(), tn.len());
    let sums = parts
        .par_iter()
        .fold(
            || vec![0.0f64; np + nn],
            |mut acc, (d, c)| {
                let c = c / div;
                if c == 0 {
                    return acc;
                }
                let mut vp = [0.0f64; MGF_BATCH];
                let mut vn = [0.0f64; MGF_BATCH];
                log_mgf_dual(d, tp, tn, &mut vp[..np], &mut vn[..nn]);
                for (a, x) in acc.iter_mut().zip(vp[..np].iter().chain(&vn[..nn])) {
                    *a += c as f64 * x;
                }
                acc
            },
        )
        .reduce(
            || vec![0.0f64; np + nn],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    (sums[..np].to_vec(), sums[np..].to_vec())
}

/// Smallest FFT-friendly length ≥ n: f·2^k with f ∈ {1, 3, 5, 7} (rustfft has vectorised
/// butterflies for each; the window rarely sits just above a power of two).
fn fft_len(n: usize) -> usize {
    [1usize, 3, 5, 7]
        .iter()
        .map(|&f| n.div_ceil(f).next_power_of_two() * f)
        .min()
        .unwrap_or(2)
        .max(2)
}

/// The forward FFT of length `n`, planned once per process and length (rustfft's planner
/// caches its plans; planning computes every twiddle factor, ≈ n sine/cosine pairs and n complex
/// values of memory, which at 10⁴ steps was ≈ 10 % of the whole process's CPU time).
fn forward_plan(n: usize) -> Arc<dyn Fft<f64>> {
    static PLANNER: std::sync::Mutex<Option<FftPlanner<f64>>> = std::sync::Mutex::new(None);
    let mut guard = PLANNER.lock().unwrap_or_else(|e| e.into_inner());
    guard.get_or_insert_with(FftPlanner::new).plan_fft_forward(n)
}

/// Transform buffers and running products of [`compose_in_window`], kept for the process's next
/// composition (a calibration's probes, the stages and directions of one account): their pages
/// stay mapped ([`numeric::pool`]).
static COMPLEX_POOL: Pool<Complex64> = Pool::new();
/// The running products' per-frequency bounds, kept likewise.
static REAL_POOL: Pool<f64> = Pool::new();

/// A frequency whose product bound P(ω) falls below this is set to 0 ("dead"); what it can still
/// hold is at most DEAD · G (G bounds every later factor) and is added to the round-off bound.
const DEAD: f64 = 1e-280;
/// Relative error of one complex multiplication with the textbook formula: √5·u (Brent, Percival
/// & Zimmermann 2007, "Error bounds on complex floating-point multiplication", Thm 1), plus a
/// margin for an underflowing component (every product formed is ≥ 1e-300 in modulus, so the
/// absolute underflow error, ≤ 4·2⁻¹⁰⁷⁴, is below 1e-20 of it).
const CMUL_ERR: f64 = 2.236_067_977_499_79 * U + 1e-20;

/// Per-leaf constants for raising a transform value to the leaf's count T.
struct LeafPower {
    t: u64,
    tf: f64,
    /// Componentwise bound on the error of the transform values Â (e_a).
    ea: f64,
    /// Below this |Â|² the power |Â|^T < e^{−690} is replaced by 0 (its error is then ≤ m^T).
    thr_r2: f64,
    /// ρ_T ≥ (1 + CMUL_ERR)^{T−1} − 1: relative error of Â^T by repeated squaring (each product
    /// of two computed powers a^i(1+θ_i), a^j(1+θ_j) rounds once, so by induction a^T carries
    /// (1 + CMUL_ERR)^{T−1}).
    rho: f64,
    /// ≥ (1 − u)^{−(T−1)}: makes the computed m^T (repeated squaring, one rounding per product)
    /// an upper bound, including the rounding of this multiplication.
    infl_m: f64,
    /// m ≤ this (and P(ω) ≤ 2 before the factor) already makes the updated bound P(ω)·m^T fall
    /// below [`DEAD`], so [`FourierProduct::apply`] kills the frequency without forming m^T (the
    /// same outcome as forming it: see there).
    m_dead: f64,
}

impl LeafPower {
    fn new(t: u64, ea: f64) -> Self {
        let tf = t as f64;
        LeafPower {
            t,
            tf,
            ea,
            thr_r2: if t <= 1 { 0.0 } else { (-1380.0 / tf).exp() },
            rho: ((tf - 1.0).max(0.0) * CMUL_ERR).exp_m1() * (1.0 + 1e-6),
            infl_m: 1.0 + (2.0 * tf * U).exp_m1() * (1.0 + 1e-6) + 4.0 * U,
            // (0, i.e. never, past 2⁵⁰: the argument in `apply` needs e^{4uT} < 8e.)
            m_dead: if t <= 1 << 50 {
                (((DEAD / 16.0).ln() - 1.0) / tf).exp()
            } else {
                0.0
            },
        }
    }
}

/// Â^e by repeated squaring (relative error ≤ (1 + CMUL_ERR)^{e−1} − 1).
#[inline]
fn powc(base: Complex64, e: u64) -> Complex64 {
    numeric::pow_by_squaring(base, e, Complex64::new(1.0, 0.0))
}

/// m^e by repeated squaring (relative error ≤ (1 + u)^{e−1} − 1).
#[inline]
fn powr(base: f64, e: u64) -> f64 {
    numeric::pow_by_squaring(base, e, 1.0)
}

/// A running product of transforms raised to their counts, on the half spectrum, with a
/// per-frequency error bound.
///
/// Invariant at every live frequency ω (P(ω) > 0): P(ω) ≥ Π_j m_j(ω)^{T_j} ≥ |Y(ω)| for the exact
/// product Y = Π_j A_j^{T_j} of the factors folded in so far, and |Ŷ(ω) − Y(ω)| ≤ P(ω)(e^{S(ω)} − 1).
/// Proof by induction over the factors: a factor F̂ (= Â^T, computed) with |F̂ − F| ≤ s·M and
/// |F| ≤ M, multiplied in with one rounding (1 + θ), |θ| ≤ CMUL_ERR, gives
/// |Ŷ F̂(1+θ) − Y F| ≤ P(e^S − 1)·M(1+s)(1+θ) + P·M((1+s)(1+θ) − 1) ≤ P·M(e^{S + s + CMUL_ERR} − 1).
/// For F = A^T with |Â − A| ≤ e_a and m = |Â| + e_a: |Â^T(1+ρ) − A^T| ≤ m^T(ρ + T e_a/m) (mean value
/// theorem), so s = ρ + T e_a/m, M = m^T. A dead frequency (P < [`DEAD`]) is set to 0.
struct FourierProduct {
    y: Pooled<Complex64>,
    p: Pooled<f64>,
    s: Pooled<f64>,
    /// Every frequency at or above this index is dead.
    live_end: usize,
    /// Σ_j T_j over the leaves folded in.
    total_t: f64,
    /// Σ_j T_j e_a,j over the leaves folded in.
    total_t_ea: f64,
}

impl FourierProduct {
    fn new(half: usize) -> Self {
        FourierProduct {
            y: COMPLEX_POOL.take(half, Complex64::new(1.0, 0.0)),
            p: REAL_POOL.take(half, 1.0),
            s: REAL_POOL.take(half, 0.0),
            live_end: half,
            total_t: 0.0,
            total_t_ea: 0.0,
        }
    }

    fn kill(&mut self, k: usize) {
        self.p[k] = 0.0;
        self.y[k] = Complex64::new(0.0, 0.0);
    }

    /// Multiplies Â^T into frequency k; false when the frequency dies.
    #[inline]
    fn apply(&mut self, k: usize, a: Complex64, lp: &LeafPower) -> bool {
        let r2 = a.norm_sqr();
        // m ≥ |Â| + e_a despite the rounding of |Â|² and √ (and an underflowing |Â|²).
        let m = (r2.sqrt() + lp.ea + 1e-150) * (1.0 + 4.0 * U);
        // Most frequencies die at their first factor; there m ≤ m_dead = e^{(ln(DEAD/16) − 1)/T}
        // (computed with relative error ≤ 3u in the exponent, ≤ 1 ulp in exp: m_dead^T ≤
        // DEAD/16 · e^{−1 + 2e-12 + 2uT}) decides it without the ≈ 2 log₂T products of m^T: the
        // bound below would be ≤ 2 · m^T(1 + u)^{128} · infl_m · (1 + 4u)² < DEAD (infl_m ≤
        // e^{2uT} + 5u; the argument holds for T ≤ 2⁵⁰, and m_dead is 0 beyond), so it would
        // kill the frequency too. Same result, bit for bit.
        if m <= lp.m_dead && self.p[k] <= 2.0 {
            self.kill(k);
            return false;
        }
        let p = self.p[k] * (powr(m, lp.t) * lp.infl_m) * (1.0 + 4.0 * U);
        if p.is_nan() || p < DEAD {
            self.kill(k);
            return false;
        }
        let (b, s) = if lp.t == 1 {
            (a, lp.ea / m * (1.0 + 4.0 * U))
        } else if r2 < lp.thr_r2 {
            (Complex64::new(0.0, 0.0), 1.0)
        } else {
            (powc(a, lp.t), lp.rho + lp.tf * lp.ea / m * (1.0 + 4.0 * U))
        };
        self.y[k] *= b;
        self.s[k] += s + CMUL_ERR;
        self.p[k] = p;
        true
    }

    /// Multiplies A^T into frequency k from a double-word transform value `a` with
    /// |a − A| ≤ `e` (see [`dd_transform_values`]): the power is taken on double words (relative
    /// error ρ = (1 + c)^{T−1} − 1, c = dd::CMUL_ERR + 1e-20 for low words near underflow) and
    /// rounded to a double (≤ u relative), so |F̂ − A^T| ≤ M(u(1 + ρ) + ρ + T·e/m) with m = |a| + e,
    /// M ≥ m^T (mean value theorem, as in [`FourierProduct::apply`]). False when the frequency dies.
    fn apply_dd(&mut self, k: usize, a: Cdd, e: f64, t: u64) -> bool {
        let tf = t as f64;
        let m = (a.norm_upper() + e + 1e-150) * (1.0 + 4.0 * U);
        let infl_m = 1.0 + (2.0 * tf * U).exp_m1() * (1.0 + 1e-6) + 4.0 * U;
        let big_m = powr(m, t) * infl_m * (1.0 + 4.0 * U);
        let p = self.p[k] * big_m * (1.0 + 4.0 * U);
        if p.is_nan() || p < DEAD {
            self.kill(k);
            return false;
        }
        let rho = ((tf - 1.0).max(0.0) * (dd::CMUL_ERR + 1e-20)).exp_m1() * (1.0 + 1e-6);
        let r = a.norm_f64() * (1.0 - 8.0 * U);
        // |a|^T < e^{−690}: replaced by 0 (error ≤ M); every power formed stays above 1e-300.
        let thr = if t <= 1 { 0.0 } else { (-1380.0 / tf).exp() };
        let (b, s) = if r * r < thr {
            (Complex64::new(0.0, 0.0), 1.0)
        } else {
            let bd = a.powu(t);
            (
                Complex64::new(bd.re.to_f64(), bd.im.to_f64()),
                (1.5 * U * (1.0 + rho) + rho + tf * e / m) * (1.0 + 4.0 * U),
            )
        };
        self.y[k] *= b;
        self.s[k] += s + CMUL_ERR;
        self.p[k] = p;
        true
    }

    /// The product of two running products (the same induction step with F = the other product).
    fn combine(mut self, other: FourierProduct) -> FourierProduct {
        let end = self.live_end.min(other.live_end);
        for k in 0..end {
            if self.p[k] == 0.0 {
                continue;
            }
            let p = self.p[k] * other.p[k] * (1.0 + 4.0 * U);
            if p.is_nan() || p < DEAD {
                self.kill(k);
                continue;
            }
            self.y[k] *= other.y[k];
            self.s[k] += other.s[k] + CMUL_ERR;
            self.p[k] = p;
        }
        for k in end..self.live_end {
            self.kill(k);
        }
        self.live_end = end;
        self.total_t += other.total_t;
        self.total_t_ea += other.total_t_ea;
        self
    }

    /// G ≥ Π_j max_ω m_j(ω)^{T_j}: m_j ≤ (|A_j| + 2e_a + 1e-150)(1 + 4u) with |A_j| ≤ ‖a_j‖₁ ≤ 1 + 1e-12.
    fn growth(&self) -> f64 {
        (3.0 * self.total_t_ea + self.total_t * (1e-12 + 10.0 * U)).exp()
    }
}

/// Frequencies of the double-word product whose bound P falls below this are set to 0; every
/// power and product formed stays above it, so no double-word part underflows.
const DEAD_DD: f64 = 1e-250;

/// The Fourier-domain product and inverse transform of [`compose`] on double words (precise
/// mode): the same per-frequency bookkeeping as [`FourierProduct`], with the error constants of
/// [`dd`] (≈ u² instead of u), so the certified round-off drops from ≈ T·κ‖a‖₁ (κ ≈ 10u·log₂N)
/// to ≈ 1e-26 and δ down to 1e-12 and below can be certified. One leaf per transform; N is a
/// power of two.
#[allow(clippy::too_many_arguments)]
fn fourier_precise(
    parts: &[(DiscretePld, u64)],
    dir: Direction,
    h: f64,
    lower: i64,
    upper: i64,
    inf_mass: f64,
    window_tail_mass: f64,
    rel_inflation: f64,
) -> ComposedDirection {
    let width = (upper - lower + 1) as usize;
    let n = width.next_power_of_two().max(8);
    let tw = dd::twiddles(n);
    let kappa = dd::fft_err(n);
    let half = n / 2 + 1;
    struct Prod {
        y: Vec<Cdd>,
        p: Vec<f64>,
        s: Vec<f64>,
        live_end: usize,
        total_t: f64,
        total_t_ea: f64,
    }
    let new = || Prod {
        y: vec![Cdd::ONE; half],
        p: vec![1.0; half],
        s: vec![0.0; half],
        live_end: half,
        total_t: 0.0,
        total_t_ea: 0.0,
    };
    // Per-multiplication error: dd::CMUL_ERR plus a margin for underflowing low words when the
    // running product itself is tiny (absolute ≤ 1e-320 against P ≥ DEAD_DD).
    let cmul = dd::CMUL_ERR + 1e-60;
    let per_thread = parts.len().div_ceil(rayon::current_num_threads()).max(1);
    let prod = parts
        .par_iter()
        .with_min_len(per_thread)
        .fold(
            || (new(), vec![Cdd::ZERO; n]),
            |(mut pr, mut buf), (d, count)| {
                buf.iter_mut().for_each(|c| *c = Cdd::ZERO);
                let nn = n as i64;
                let mut l1 = 0.0;
                for (k, &p) in d.probs.iter().enumerate() {
                    let c = &mut buf[(d.lo + k as i64).rem_euclid(nn) as usize];
                    c.re = c.re + Dd::from_f64(p);
                    l1 += p;
                }
                // The loaded values are exact unless two grid points alias onto one slot (then
                // one double-word addition each, inside the FFT's first-level budget).
                dd::fft(&mut buf, &tw, false);
                let ea = kappa * l1 * (1.0 + 1e-9);
                let lp = LeafPower::new(*count, ea);
                let t = *count;
                let tf = t as f64;
                let rho = ((tf - 1.0).max(0.0) * cmul).exp_m1() * (1.0 + 1e-6);
                // |Â|^T ≥ e^{−575} (≈ 1e-250) wherever the power is formed.
                let thr = if t <= 1 {
                    0.0
                } else {
                    (-1150.0 / tf).exp() * (1.0 + 1e-6)
                };
                pr.total_t += tf;
                pr.total_t_ea += tf * ea;
                let mut live_end = 0;
                for (k, &a) in buf.iter().enumerate().take(pr.live_end) {
                    if pr.p[k] == 0.0 {
                        continue;
                    }
                    let m = (a.norm_upper() + ea + 1e-150) * (1.0 + 4.0 * U);
                    let p = pr.p[k] * (powr(m, t) * lp.infl_m) * (1.0 + 4.0 * U);
                    if p.is_nan() || p < DEAD_DD {
                        pr.p[k] = 0.0;
                        pr.y[k] = Cdd::ZERO;
                        continue;
                    }
                    let r = a.norm_f64() * (1.0 - 8.0 * U);
                    let (b, s) = if t == 1 {
                        (a, ea / m * (1.0 + 4.0 * U))
                    } else if r * r < thr {
                        (Cdd::ZERO, 1.0)
                    } else {
                        (a.powu(t), rho + tf * ea / m * (1.0 + 4.0 * U))
                    };
                    pr.y[k] = pr.y[k] * b;
                    pr.s[k] += s + cmul;
                    pr.p[k] = p;
                    live_end = k + 1;
                }
                pr.live_end = live_end;
                (pr, buf)
            },
        )
        .map(|(pr, _)| pr)
        .reduce(new, |mut a, b| {
            let end = a.live_end.min(b.live_end);
            for k in 0..end {
                if a.p[k] == 0.0 {
                    continue;
                }
                let p = a.p[k] * b.p[k] * (1.0 + 4.0 * U);
                if p.is_nan() || p < DEAD_DD {
                    a.p[k] = 0.0;
                    a.y[k] = Cdd::ZERO;
                    continue;
                }
                a.y[k] = a.y[k] * b.y[k];
                a.s[k] += b.s[k] + cmul;
                a.p[k] = p;
            }
            for k in end..a.live_end {
                a.p[k] = 0.0;
                a.y[k] = Cdd::ZERO;
            }
            a.live_end = end;
            a.total_t += b.total_t;
            a.total_t_ea += b.total_t_ea;
            a
        });
    let growth = (3.0 * prod.total_t_ea + prod.total_t * (1e-12 + 10.0 * U))
        .exp()
        .min(f64::MAX);
    let mut err2 = 0.0f64;
    let mut y_l1 = 0.0f64;
    let mut buf = vec![Cdd::ZERO; n];
    for k in 0..prod.live_end.min(half) {
        let mult = if k == 0 || 2 * k == n { 1.0 } else { 2.0 };
        if prod.p[k] > 0.0 {
            let e = prod.p[k] * (prod.s[k] * (1.0 + 1e-9)).exp_m1();
            err2 += mult * e * e;
        }
        let y = prod.y[k];
        y_l1 += mult * y.norm_upper();
        buf[k] = y;
        if k != 0 && 2 * k != n {
            buf[n - k] = y.conj();
        }
    }
    let err_l2 = err2.sqrt() * (1.0 + 1e-9) + (n as f64).sqrt() * 2.0 * DEAD_DD * growth;
    dd::fft(&mut buf, &tw, true);
    // c = Z/N: ‖Δc‖₁ ≤ ‖ΔY‖₂ (the inverse transform is √N × unitary) + κ‖Ŷ‖₁ (componentwise
    // bound of the double-word inverse transform, summed over N outputs and divided by N).
    let roundoff = (err_l2 + kappa * y_l1) * (1.0 + 1e-9) + 1e-300;
    let scale = 1.0 / n as f64;
    let nn = n as i64;
    let probs: Vec<f64> = (lower..=upper)
        .map(|kk| (buf[kk.rem_euclid(nn) as usize].re.scale(scale).to_f64()).max(0.0))
        .collect();
    ComposedDirection {
        direction: dir,
        h,
        lo: lower,
        probs,
        inf_mass,
        window_tail_mass,
        roundoff,
        // The rounding of each composed mass to a double (≤ u relative).
        rel_inflation: rel_inflation + 2.0 * U,
        fft_len: n,
        staged_slack: 0.0,
    }
}

/// The length-N DFT of a discrete PLD at frequency k, A_k = Σ_i p_i w^{(lo+i)k} with
/// w = e^{−2πi/N} (aliasing included: w^N = 1), on double words: Horner in z = w^k over the S
/// support points, times w^{lo·k}. Returns the value and a bound e ≥ |value − A_k|: each Horner
/// step s ← s·ẑ + p_i adds at most ‖p‖₁(|ẑ − z| + dd::CMUL_ERR(1 + |ẑ − z|) + dd::ADD_ERR) + ADD_ERR·p_i
/// (|s| ≤ ‖p‖₁ up to these errors, |z| = 1), and the final product one more such term, so
/// e ≤ (S + 2)·‖p‖₁·(TWIDDLE_ANY_ERR + CMUL_ERR + 2·ADD_ERR)·(1 + 1e-6) (≈ 1e-27 for S = 10⁴).
/// At every frequency of `ks`, eight at a time, each exactly as alone ([`dd::horner_many`]).
fn dd_transform_values(d: &DiscretePld, ks: &[usize], n: usize) -> Vec<(Cdd, f64)> {
    dd_transform_values_of(d.lo, &d.probs, ks, n)
}

/// [`dd_transform_values`] of the points `probs` at grid indices lo, lo + 1, ….
fn dd_transform_values_of(lo: i64, probs: &[f64], ks: &[usize], n: usize) -> Vec<(Cdd, f64)> {
    let nn = n as u64;
    let z: Vec<Cdd> = ks.iter().map(|&k| dd::twiddle(k as u64, nn)).collect();
    let mut acc = vec![Cdd::ZERO; ks.len()];
    dd::horner_many(probs, &z, &mut acc);
    let l1: f64 = probs.iter().sum::<f64>() * (1.0 + 1e-9);
    let e = (probs.len() as f64 + 2.0) * l1 * (dd::TWIDDLE_ANY_ERR + dd::CMUL_ERR + 2.0 * dd::ADD_ERR) * (1.0 + 1e-6)
        + 1e-300;
    ks.iter()
        .zip(acc)
        .map(|(&k, a)| {
            let shift = ((lo.rem_euclid(n as i64) as u128 * k as u128) % nn as u128) as u64;
            (a * dd::twiddle(shift, nn), e)
        })
        .collect()
}

/// P-mass each end of a leaf may leave outside the core whose double-word transform values are
/// computed point by point ([`core_range`]): the ends' values come from a double-precision
/// transform, whose componentwise error κ·(their mass) ≤ 2e-10·κ ≈ 7e-24 enters the factor's
/// error as T·7e-24 (≈ 1e-19 at T = 16,393), far below the round-off floors that matter.
const HYBRID_END_MASS: f64 = 1e-10;

/// The index range [c0, c1] left after dropping from each end of `probs` the points whose
/// running sum stays ≤ [`HYBRID_END_MASS`].
fn core_range(probs: &[f64]) -> (usize, usize) {
    let (mut c0, mut acc) = (0, 0.0);
    while c0 + 1 < probs.len() && acc + probs[c0] <= HYBRID_END_MASS {
        acc += probs[c0];
        c0 += 1;
    }
    let (mut c1, mut acc) = (probs.len().saturating_sub(1), 0.0);
    while c1 > c0 && acc + probs[c1] <= HYBRID_END_MASS {
        acc += probs[c1];
        c1 -= 1;
    }
    (c0, c1)
}

/// [`dd_transform_values`] at one frequency.
#[cfg(test)]
fn dd_transform_at(d: &DiscretePld, k: usize, n: usize) -> (Cdd, f64) {
    dd_transform_values(d, &[k], n)[0]
}

/// One leaf's discrete PLD with its count.
type Part = (DiscretePld, u64);

/// How the Fourier product of [`compose`] is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arith {
    /// Double-precision transforms; leaves composed at least [`HYBRID_MIN_COUNT`] times take
    /// double-word transform values at the live frequencies ([`dd_transform_values`]).
    Double,
    /// As `Double`, but every leaf composed more than once takes double-word transform values
    /// at the live frequencies (a staged composition's first stage past `HYBRID_MIN_COUNT`
    /// steps in all: the block's round-off reaches δ once per copy). The error analysis of
    /// [`FourierProduct::apply_dd`] holds for any count.
    Hybrid,
    /// The whole product and inverse transform on double words ([`fourier_precise`]).
    Precise,
}

/// The composition window [L, U] of [`compose`]: Chernoff bounds on the mass outside, and the
/// width the window would need before the `max_points` cap.
#[derive(Clone)]
pub(super) struct Window {
    lower: i64,
    upper: i64,
    window_tail_mass: f64,
    pub(super) uncapped_width: i64,
    /// The leaves' coarse log-MGFs (those with count/div > 0, in order), for a later window of
    /// the same leaves with counts divided.
    coarse: Option<std::sync::Arc<CoarseMgf>>,
}

/// Composes discrete PLDs with counts (Fourier domain, one common cyclic grid). See the module
/// doc and docs/pld.md for the bounds added to δ.
pub(super) fn compose(
    parts: &[(DiscretePld, u64)],
    dir: Direction,
    h: f64,
    tau_window: f64,
    max_points: usize,
    arith: Arith,
    window: Option<Window>,
) -> Result<ComposedDirection> {
    let total_steps: f64 = parts.iter().map(|(_, c)| *c as f64).sum();
    // ∞-mass: 1 − Π(1 − ι_j)^{T_j}, rounded up.
    let log_keep: f64 = parts.iter().map(|(d, c)| *c as f64 * (-d.inf_mass).ln_1p()).sum();
    let inf_mass = ((-log_keep.exp_m1()) * (1.0 + 1e-12) + 1e-300).min(1.0);
    let rel_inflation = 1.0 + 4.0 * U * (total_steps + 16.0) + 1e-12;
    let empty = |inf_mass: f64| ComposedDirection {
        direction: dir,
        h,
        lo: 0,
        probs: Vec::new(),
        inf_mass,
        window_tail_mass: 0.0,
        roundoff: 0.0,
        rel_inflation,
        fft_len: 0,
        staged_slack: 0.0,
    };
    if parts.iter().any(|(d, _)| d.probs.is_empty()) {
        return Ok(empty(1.0));
    }
    if parts.is_empty() {
        let mut e = empty(0.0);
        e.lo = 0;
        e.probs = vec![1.0];
        return Ok(e);
    }
    let window = match window {
        Some(w) => w,
        None => chernoff_window(parts, tau_window, max_points),
    };
    compose_in_window(parts, dir, h, window, inf_mass, rel_inflation, arith)
}

/// The Chernoff window of a composition: P(K ≥ U) ≤ exp(Λ(t) − tU), P(K ≤ L) ≤ exp(Λ(−t) + tL),
/// minimised over t, with at most `tau_window`/2 outside on each side (at most `max_points` wide).
pub(super) fn chernoff_window(parts: &[(DiscretePld, u64)], tau_window: f64, max_points: usize) -> Window {
    chernoff_window_div(parts, 1, tau_window, max_points, None)
}

/// [`chernoff_window`] of the composition with counts ⌊count_j/`div`⌋ (leaves with 0 left out);
/// `coarse`: the leaves' log-MGFs at the coarse exponents when already computed (a one-stage
/// window's, [`Window::coarse`], for its leaves with count ≥ `div`, in order).
fn chernoff_window_div(
    parts: &[(DiscretePld, u64)],
    div: u64,
    tau_window: f64,
    max_points: usize,
    coarse_done: Option<&CoarseMgf>,
) -> Window {
    // Trivial support of the composition.
    let triv_lo: i64 = parts.iter().map(|(d, c)| d.lo * (*c / div) as i64).sum();
    let triv_hi: i64 = parts.iter().map(|(d, c)| d.hi() * (*c / div) as i64).sum();
    // Chernoff window: P(K ≥ U) ≤ exp(Λ(t) − tU), P(K ≤ L) ≤ exp(Λ(−t) + tL).
    let timing = std::env::var_os("DPAUDIT_PLD_TIMING").is_some();
    let t_start = std::time::Instant::now();
    let ln_tau = (tau_window / 2.0).ln();
    // Chernoff exponents: a coarse geometric grid of t (grid units), then a finer grid between
    // the neighbours of the best coarse point. Every evaluated t gives a valid bound.
    let coarse = coarse_exponents();
    // The leaves' coarse log-MGFs (given, or computed here), kept for a later window of the
    // same leaves with counts divided: those with count/div > 0, in order.
    let leaf_coarse: Vec<[[f64; MGF_BATCH]; 2]> = match coarse_done {
        Some(c) => parts
            .iter()
            .filter(|(_, n)| *n > 0)
            .zip(&c.0)
            .filter(|((_, n), _)| n / div > 0)
            .map(|(_, v)| *v)
            .collect(),
        None => coarse_mgfs(parts, div).0,
    };
    debug_assert_eq!(leaf_coarse.len(), parts.iter().filter(|(_, c)| c / div > 0).count());
    // Λ(±t) at the coarse exponents: Σ_j T_j λ_j(±t).
    let mut lam = [[0.0f64; MGF_BATCH]; 2];
    for ((_, c), v) in parts.iter().filter(|(_, c)| c / div > 0).zip(&leaf_coarse) {
        let c = (c / div) as f64;
        for s in 0..2 {
            for j in 0..MGF_BATCH {
                lam[s][j] += c * v[s][j];
            }
        }
    }
    let score = |sign: f64, t: f64, l: f64| {
        if sign > 0.0 {
            (l - ln_tau) / t
        } else {
            -((ln_tau - l) / t)
        }
    };
    // The finer exponents between the neighbours of the best coarse point of each sign.
    let fine_of = |sign: f64, l: &[f64; MGF_BATCH]| -> Vec<f64> {
        let best = (0..MGF_BATCH)
            .min_by(|&a, &b| score(sign, coarse[a], l[a]).total_cmp(&score(sign, coarse[b], l[b])))
            .unwrap();
        let lo_t = coarse[best.saturating_sub(1)];
        let hi_t = coarse[(best + 1).min(MGF_BATCH - 1)];
        (1..9).map(|i| lo_t * (hi_t / lo_t).powf(i as f64 / 9.0)).collect()
    };
    let fine_p = fine_of(1.0, &lam[0]);
    let fine_n = fine_of(-1.0, &lam[1]);
    let signed_n: Vec<f64> = fine_n.iter().map(|&t| -t).collect();
    let (lp, ln) = cumulants_dual(parts, div, &fine_p, &signed_n);
    let mut pos: Vec<(f64, f64)> = coarse.iter().copied().zip(lam[0]).collect();
    pos.extend(fine_p.iter().copied().zip(lp));
    let mut neg: Vec<(f64, f64)> = coarse.iter().copied().zip(lam[1]).collect();
    neg.extend(fine_n.iter().copied().zip(ln));
    let mut upper = triv_hi;
    for &(t, l) in &pos {
        let u = ((l - ln_tau) / t).ceil();
        if u.is_finite() && u < upper as f64 {
            upper = u as i64;
        }
    }
    let mut lower = triv_lo;
    for &(t, l) in &neg {
        let v = ((ln_tau - l) / t).floor();
        if v.is_finite() && v > lower as f64 {
            lower = v as i64;
        }
    }
    if lower > upper {
        lower = upper;
    }
    let uncapped_width = upper - lower + 1;
    if (upper - lower + 1) as usize > max_points {
        upper = lower + max_points as i64 - 1;
    }
    // Bounds actually achieved (0 where the window reaches the trivial support).
    let bound_hi = |u: i64| -> f64 {
        if u >= triv_hi {
            return 0.0;
        }
        pos.iter()
            .map(|&(t, l)| (l - t * (u as f64 + 1.0)).exp())
            .fold(1.0, f64::min)
    };
    let bound_lo = |v: i64| -> f64 {
        if v <= triv_lo {
            return 0.0;
        }
        neg.iter()
            .map(|&(t, l)| (l + t * (v as f64 - 1.0)).exp())
            .fold(1.0, f64::min)
    };
    // Mass strictly above `upper` / strictly below `lower`.
    let window_tail_mass = (bound_hi(upper) + bound_lo(lower)) * (1.0 + 1e-9);
    if timing {
        eprintln!(
            "pld timing: window [{lower}, {upper}] width {} (uncapped {uncapped_width}) (trivial [{triv_lo}, {triv_hi}]) in {:?}",
            upper - lower + 1,
            t_start.elapsed()
        );
    }
    Window {
        lower,
        upper,
        window_tail_mass,
        uncapped_width,
        coarse: Some(std::sync::Arc::new(CoarseMgf(leaf_coarse))),
    }
}

/// The Fourier-domain composition of `parts` over a window (see [`compose`]).
fn compose_in_window(
    parts: &[(DiscretePld, u64)],
    dir: Direction,
    h: f64,
    window: Window,
    inf_mass: f64,
    rel_inflation: f64,
    arith: Arith,
) -> Result<ComposedDirection> {
    let Window {
        lower,
        upper,
        window_tail_mass,
        ..
    } = window;
    let timing = std::env::var_os("DPAUDIT_PLD_TIMING").is_some();
    let width = (upper - lower + 1) as usize;
    if arith == Arith::Precise {
        return Ok(fourier_precise(
            parts,
            dir,
            h,
            lower,
            upper,
            inf_mass,
            window_tail_mass,
            rel_inflation,
        ));
    }
    let n = fft_len(width);
    if timing {
        eprintln!("pld timing: fft length {n}");
    }
    let levels = (n as f64).log2().ceil();
    let kappa = FFT_ERR_PER_LEVEL * levels;
    // One forward plan serves the forward transforms and the inverse (below), and is shared
    // with every later composition of the process of the same length (the two directions, a
    // staged composition's stages, a calibration's probes).
    let fwd: Arc<dyn Fft<f64>> = forward_plan(n);

    // Fourier-domain product Y = Π_j (FFT a_j)^{T_j}, kept on the half spectrum k ∈ [0, n/2]
    // (every a_j is real, so Y is Hermitian). Two leaves share one complex FFT (a in the real
    // part, b in the imaginary part). Per frequency the product carries P(ω) ≥ Π_j m_j(ω)^{T_j}
    // (m_j = |Â_j| + e_a ≥ |A_j|) and S(ω) with |Ŷ − Y| ≤ P(e^S − 1): see [`FourierProduct`].
    let t_fft = std::time::Instant::now();
    let half = n / 2 + 1;
    let scratch_len = fwd.get_inplace_scratch_len();
    // Leaves with a large count go through the double-word transform values below; the others
    // share complex transforms two by two.
    let hybrid_min = if arith == Arith::Hybrid { 2 } else { HYBRID_MIN_COUNT };
    let (mut hybrid, plain): (Vec<&Part>, Vec<&Part>) = parts.iter().partition(|(_, c)| *c >= hybrid_min);
    // Largest count first: its power kills the most frequencies, and the next leaves' double-word
    // values are computed at the frequencies still live.
    hybrid.sort_by_key(|(_, c)| std::cmp::Reverse(*c));
    let pairs: Vec<&[&Part]> = plain.chunks(2).collect();
    let per_thread = pairs.len().div_ceil(rayon::current_num_threads()).max(1);
    let product = pairs
        .par_iter()
        .with_min_len(per_thread)
        .fold(
            || {
                (
                    FourierProduct::new(half),
                    COMPLEX_POOL.take(n, Complex64::new(0.0, 0.0)),
                    COMPLEX_POOL.take(scratch_len, Complex64::new(0.0, 0.0)),
                )
            },
            |(mut prod, mut buf, mut scratch), pair| {
                buf.iter_mut().for_each(|c| *c = Complex64::new(0.0, 0.0));
                let nn = n as i64;
                let mut l1 = 0.0;
                for (slot, part) in pair.iter().enumerate() {
                    let d = &part.0;
                    for (k, &p) in d.probs.iter().enumerate() {
                        let c = &mut buf[(d.lo + k as i64).rem_euclid(nn) as usize];
                        if slot == 0 {
                            c.re += p;
                        } else {
                            c.im += p;
                        }
                        l1 += p;
                    }
                }
                let t_f = std::time::Instant::now();
                fwd.process_with_scratch(&mut buf, &mut scratch);
                FFT_NS.fetch_add(t_f.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
                // Componentwise forward error |ΔZ_k| ≤ κ‖z‖₁ ≤ κ(‖a‖₁ + ‖b‖₁) (Higham 2002, §24.1);
                // separating A_k = (Z_k + conj Z_{−k})/2 and B_k = (Z_k − conj Z_{−k})/(2i) averages two
                // such errors and rounds one complex addition (≤ u(|Z_k| + |Z_{−k}|)/2 ≤ u‖z‖₁).
                let ea = (kappa + U) * l1 * (1.0 + 1e-9);
                let leaves: Vec<LeafPower> = pair.iter().map(|part| LeafPower::new(part.1, ea)).collect();
                prod.total_t_ea += pair.iter().map(|part| part.1 as f64 * ea).sum::<f64>();
                prod.total_t += pair.iter().map(|part| part.1 as f64).sum::<f64>();
                let mut live_end = 0;
                for k in 0..prod.live_end {
                    if prod.p[k] == 0.0 {
                        continue;
                    }
                    let zk = buf[k];
                    let zm = buf[(n - k) % n].conj();
                    let sum = zk + zm;
                    let a = Complex64::new(0.5 * sum.re, 0.5 * sum.im);
                    if !prod.apply(k, a, &leaves[0]) {
                        continue;
                    }
                    if let Some(lb) = leaves.get(1) {
                        let dif = zk - zm;
                        // (Z_k − conj Z_{−k})/(2i): exact swap and halving of the difference.
                        let b = Complex64::new(0.5 * dif.im, -0.5 * dif.re);
                        if !prod.apply(k, b, lb) {
                            continue;
                        }
                    }
                    live_end = k + 1;
                }
                prod.live_end = live_end;
                (prod, buf, scratch)
            },
        )
        // One transform buffer and scratch are kept for the inverse transform (their pages are
        // already mapped: a fresh zeroed vector costs a page fault per 4 KiB on first write).
        .map(|(prod, buf, scratch)| (prod, Some((buf, scratch))))
        .reduce_with(|(a, ba), (b, bb)| (a.combine(b), ba.or(bb)))
        .unwrap_or_else(|| (FourierProduct::new(half), None));
    let (product, kept) = product;
    // Large-count leaves: a double-precision transform screens every frequency (m = |Â| + e_a ≥ |A|
    // with e_a = κ‖a‖₁, so a frequency whose bound falls below DEAD is dead for good); at the
    // live ones the transform value is recomputed on double words and raised to T there.
    let mut product = product;
    let mut kept = kept;
    if !hybrid.is_empty() {
        let (mut buf, mut scratch) = kept.take().unwrap_or_else(|| {
            (
                COMPLEX_POOL.take(n, Complex64::new(0.0, 0.0)),
                COMPLEX_POOL.take(scratch_len, Complex64::new(0.0, 0.0)),
            )
        });
        let nn = n as i64;
        for part in &hybrid {
            let (d, count) = (&part.0, part.1);
            buf.iter_mut().for_each(|c| *c = Complex64::new(0.0, 0.0));
            let mut l1 = 0.0;
            for (k, &p) in d.probs.iter().enumerate() {
                buf[(d.lo + k as i64).rem_euclid(nn) as usize].re += p;
                l1 += p;
            }
            fwd.process_with_scratch(&mut buf, &mut scratch);
            // One real leaf per transform: Z_k = A_k, componentwise error ≤ κ‖a‖₁.
            let ea = kappa * l1 * (1.0 + 1e-9);
            let lp = LeafPower::new(count, ea);
            product.total_t += count as f64;
            product.total_t_ea += count as f64 * ea;
            let mut live = Vec::new();
            for (k, z) in buf.iter().enumerate().take(product.live_end) {
                if product.p[k] == 0.0 {
                    continue;
                }
                let m = (z.norm_sqr().sqrt() + ea + 1e-150) * (1.0 + 4.0 * U);
                // The fast kill of `FourierProduct::apply` (same bound, same outcome, without
                // forming m^T): most frequencies die here.
                if m <= lp.m_dead && product.p[k] <= 2.0 {
                    product.kill(k);
                    continue;
                }
                let p = product.p[k] * (powr(m, count) * lp.infl_m) * (1.0 + 4.0 * U);
                if p.is_nan() || p < DEAD {
                    product.kill(k);
                } else {
                    live.push(k);
                }
            }
            let mut live_end = 0;
            let (c0, c1) = core_range(&d.probs);
            let core_len = c1 + 1 - c0;
            // In a staged block, Horner's rule only where it is cheaper than the whole product on
            // double words (≈ 2·N log₂N double-word butterflies for a transform and its inverse).
            let max_work = if arith == Arith::Hybrid {
                let np = width.next_power_of_two().max(8);
                HYBRID_MAX_WORK.min(2 * np * np.trailing_zeros() as usize)
            } else {
                HYBRID_MAX_WORK
            };
            if live.len().saturating_mul(core_len) <= max_work {
                let values: Vec<(Cdd, f64)> = if 5 * core_len < 4 * d.probs.len() {
                    // A_k = C_k + E_k: the core C on double words at the live frequencies, the
                    // ends E (mass ≤ 2·HYBRID_END_MASS) by a double-precision transform with
                    // |Ê_k − E_k| ≤ κ‖e‖₁ (Higham 2002, §24.1), added on double words (one
                    // addition per part, ≤ ADD_ERR relative to |C_k + Ê_k| ≤ ‖a‖₁ each).
                    buf.iter_mut().for_each(|c| *c = Complex64::new(0.0, 0.0));
                    let mut ends_l1 = 0.0;
                    for (i, &p) in d.probs.iter().enumerate() {
                        if i < c0 || i > c1 {
                            buf[(d.lo + i as i64).rem_euclid(nn) as usize].re += p;
                            ends_l1 += p;
                        }
                    }
                    fwd.process_with_scratch(&mut buf, &mut scratch);
                    let e_ends = kappa * ends_l1 * (1.0 + 1e-9) + 2.0 * dd::ADD_ERR * l1 * (1.0 + 1e-6);
                    let core = &d.probs[c0..=c1];
                    let lo = d.lo + c0 as i64;
                    let values: Vec<(Cdd, f64)> = live
                        .par_chunks(16)
                        .flat_map_iter(|ks| dd_transform_values_of(lo, core, ks, n))
                        .collect();
                    live.iter()
                        .zip(values)
                        .map(|(&k, (c, e))| {
                            let t = Cdd {
                                re: Dd::from_f64(buf[k].re),
                                im: Dd::from_f64(buf[k].im),
                            };
                            (c + t, (e + e_ends) * (1.0 + 1e-9))
                        })
                        .collect()
                } else {
                    live.par_chunks(16)
                        .flat_map_iter(|ks| dd_transform_values(d, ks, n))
                        .collect()
                };
                for (&k, &(a, e)) in live.iter().zip(&values) {
                    if product.apply_dd(k, a, e, count) {
                        live_end = k + 1;
                    }
                }
            } else if arith == Arith::Hybrid {
                // Too many live frequencies for a block whose round-off is paid once per copy
                // (a short block: each leaf's power dies slowly): the whole product on double
                // words instead, as before the hybrid path.
                return Ok(fourier_precise(
                    parts,
                    dir,
                    h,
                    lower,
                    upper,
                    inf_mass,
                    window_tail_mass,
                    rel_inflation,
                ));
            } else {
                // Too many live frequencies (the composition stays concentrated, e.g. a tiny q):
                // the double-precision values, as for any other leaf.
                for &k in &live {
                    if product.apply(k, buf[k], &lp) {
                        live_end = k + 1;
                    }
                }
            }
            for k in live_end..product.live_end {
                product.kill(k);
            }
            product.live_end = live_end;
            if timing {
                eprintln!(
                    "pld timing: double-word transform values at {} live frequencies",
                    live.len()
                );
            }
        }
        kept = Some((buf, scratch));
    }
    if timing {
        eprintln!(
            "pld timing: fft+powers {:?} (forward FFTs {} ms CPU, {} live frequencies)",
            t_fft.elapsed(),
            FFT_NS.swap(0, std::sync::atomic::Ordering::Relaxed) / 1_000_000,
            product.live_end
        );
    }
    // Error of Ŷ in L2 over all n frequencies (k and n − k carry the same error), plus the
    // frequencies declared dead: there |Y| ≤ DEAD · G with G = Π_j max m_j^{T_j} ≤ e^{Σ T_j(2e_a + 5u)}.
    let growth = product.growth().min(f64::MAX);
    let mut err2 = 0.0f64;
    for k in 0..product.live_end {
        if product.p[k] == 0.0 {
            continue;
        }
        let e = product.p[k] * (product.s[k] * (1.0 + 1e-9)).exp_m1();
        let mult = if k == 0 || 2 * k == n { 1.0 } else { 2.0 };
        err2 += mult * e * e;
    }
    let err_l2 = err2.sqrt() * (1.0 + 1e-9) + (n as f64).sqrt() * 2.0 * DEAD * growth;
    // Full Hermitian spectrum for the inverse transform.
    let (mut buf, mut scratch) = match kept {
        Some((mut b, s)) => {
            b.fill(Complex64::new(0.0, 0.0));
            (b, s)
        }
        None => (
            COMPLEX_POOL.take(n, Complex64::new(0.0, 0.0)),
            COMPLEX_POOL.take(scratch_len, Complex64::new(0.0, 0.0)),
        ),
    };
    for k in 0..product.live_end.min(half) {
        let y = product.y[k];
        buf[k] = y;
        if k != 0 && 2 * k != n {
            buf[n - k] = y.conj();
        }
    }
    let norm_y: f64 = buf.iter().map(|c| c.norm_sqr()).sum::<f64>().sqrt();
    // The inverse transform by the forward plan: Y is Hermitian (Y_{n−k} = conj Y_k, set above),
    // so Σ_k Y_k e^{+2πijk/n} = Σ_k Y_{n−k} e^{−2πijk/n}, the forward transform of the sequence
    // k ↦ Y_{−k} = conj Y_k. Conjugation is exact and the forward algorithm carries the same
    // per-level error bound κ (Higham 2002, §24.1), so the round-off bound below is unchanged.
    buf.iter_mut().for_each(|c| c.im = -c.im);
    fwd.process_with_scratch(&mut buf, &mut scratch);
    let scale = 1.0 / n as f64;
    // ‖Δc‖₁ ≤ √N ‖Δc‖₂ = ‖ΔY‖₂ + κ‖Y‖₂ (inverse FFT is √N × unitary, then scaled by 1/N).
    let roundoff = (err_l2 + kappa * norm_y) * (1.0 + 1e-9) + 4.0 * U * width as f64 / n as f64;
    let nn = n as i64;
    let probs: Vec<f64> = (lower..=upper)
        .map(|kk| (buf[kk.rem_euclid(nn) as usize].re * scale).max(0.0))
        .collect();
    Ok(ComposedDirection {
        direction: dir,
        h,
        lo: lower,
        probs,
        inf_mass,
        window_tail_mass,
        roundoff,
        rel_inflation,
        fft_len: n,
        staged_slack: 0.0,
    })
}

/// Exact hockey-stick δ(ε) of ONE Poisson(q) ∘ Gaussian(σ) step (sensitivity 1), the worse of
/// the two directions, in closed form (remove: qΦ̄((x*−1)/σ) − (e^ε − 1 + q)Φ̄(x*/σ) with
/// x* = σ² ln((e^ε − 1 + q)/q) + ½; add: the mirror image; Balle & Wang 2018, Thm 8, for q = 1).
/// Not rounded either way: use it as a *lower* reference (a composition's ε is never below the ε of
/// one of its steps), never as a bound to certify with.
pub fn single_step_delta_exact(q: f64, sigma: f64, eps: f64) -> f64 {
    let s2 = sigma * sigma;
    let remove = {
        let w = inv_log_mix(q, eps);
        if w == f64::NEG_INFINITY {
            -eps.exp_m1()
        } else {
            let x = s2 * w + 0.5;
            q * numeric::ndtr_sf((x - 1.0) / sigma) - (eps.exp_m1() + q) * numeric::ndtr_sf(x / sigma)
        }
    };
    let add = {
        let w = inv_log_mix(q, -eps);
        if w == f64::NEG_INFINITY {
            0.0
        } else {
            let x = s2 * w + 0.5;
            (q - (1.0 - q) * eps.exp_m1()) * numeric::ndtr(x / sigma) - q * eps.exp() * numeric::ndtr((x - 1.0) / sigma)
        }
    };
    remove.max(add).max(0.0)
}

/// Turns an event's components into PLD leaves with counts, or an `Unsupported` error saying
/// which part and why.
/// ε of the pure-DP guarantee of a Laplace mechanism with scale b per unit L1 sensitivity: 1/b
/// (Dwork & Roth 2014, Thm 3.6), rounded up.
fn laplace_pure_epsilon(b: f64) -> f64 {
    (1.0 / b).next_up()
}

/// ε of a pure-ε step sampled at rate q: ln(1 + q(e^ε − 1)) (Balle, Barthe & Gaboardi 2018,
/// Thm 2), rounded up past the few ulps of `exp_m1`, the product and `ln_1p`, so it never
/// understates ε.
fn amplified_epsilon(q: f64, epsilon: f64) -> f64 {
    ((q * epsilon.exp_m1()).ln_1p() * (1.0 + 4.0 * U)).next_up()
}

fn leaves(components: &[Component], neighbouring: Neighbouring) -> Result<Vec<(Leaf, u64)>> {
    let mut out = Vec::new();
    for (i, c) in components.iter().enumerate() {
        let leaf = match (c.sampling, c.mechanism) {
            (Sampling::Full, Mechanism::Gaussian { noise_multiplier }) => Leaf::SampledGaussian {
                q: 1.0,
                sigma: noise_multiplier,
            },
            (Sampling::Full, Mechanism::EpsilonDelta { epsilon, delta }) => Leaf::EpsilonDelta { epsilon, delta },
            // The exact Laplace pair (laplace_pld).
            (Sampling::Full, Mechanism::Laplace { noise_multiplier }) => Leaf::Laplace {
                q: 1.0,
                b: noise_multiplier,
            },
            (Sampling::Poisson { q }, mech) => {
                if neighbouring == Neighbouring::ReplaceOne {
                    out.push((
                        match mech {
                            Mechanism::Gaussian { noise_multiplier } if q < 1.0 => Leaf::ReplaceGaussian {
                                q,
                                sigma: noise_multiplier,
                            },
                            Mechanism::Gaussian { noise_multiplier } => Leaf::SampledGaussian {
                                q: 1.0,
                                sigma: noise_multiplier,
                            },
                            // Couple the two samples by record position: with probability 1 − q
                            // the replaced record is not sampled and the outputs are equal,
                            // otherwise the inputs are replace-one neighbours; advanced joint
                            // convexity (Balle, Barthe & Gaboardi 2018, Thm 2) gives
                            // (ln(1 + q(e^ε − 1)), qδ).
                            Mechanism::EpsilonDelta { epsilon, delta } => Leaf::EpsilonDelta {
                                epsilon: amplified_epsilon(q, epsilon),
                                delta: q * delta,
                            },
                            Mechanism::Laplace { noise_multiplier } => Leaf::EpsilonDelta {
                                epsilon: amplified_epsilon(q, laplace_pure_epsilon(noise_multiplier)),
                                delta: 0.0,
                            },
                        },
                        c.count,
                    ));
                    continue;
                }
                match mech {
                    Mechanism::Gaussian { noise_multiplier } => Leaf::SampledGaussian {
                        q,
                        sigma: noise_multiplier,
                    },
                    // Amplification by Poisson subsampling (Li, Qardaji & Su 2012, Thm 1;
                    // Balle, Barthe & Gaboardi 2018, Thm 8): (ln(1 + q(e^ε − 1)), qδ).
                    Mechanism::EpsilonDelta { epsilon, delta } => Leaf::EpsilonDelta {
                        epsilon: amplified_epsilon(q, epsilon),
                        delta: q * delta,
                    },
                    // The exact subsampled Laplace pair (laplace_pld), as dp_accounting.
                    Mechanism::Laplace { noise_multiplier } => Leaf::Laplace { q, b: noise_multiplier },
                }
            }
            (Sampling::WithoutReplacement { n, m }, _) => {
                return Err(Error::unsupported(format!(
                    "pld: component {i} (sampling {m} of {n} without replacement): no dominating PLD for \
                     sampling without replacement is implemented (use the rdp accountant)"
                )));
            }
        };
        out.push((leaf, c.count));
    }
    Ok(out)
}

/// A lower bound on the +∞ mass every composition of `leaves` carries, known before any grid is
/// built: per leaf the P-mass of losses above [`MAX_STEP_LOSS`] (which the discretisation always
/// sends to +∞) or the leaf's δ, composed as 1 − Π(1 − ι_j)^{T_j}, rounded down. When it is at or
/// above a requested δ, the PLD cannot certify a finite ε there and is not built.
fn inf_mass_floor(leaves: &[(Leaf, u64)]) -> f64 {
    let log_keep: f64 = leaves
        .iter()
        .map(|&(l, c)| {
            let iota = match l {
                Leaf::SampledGaussian { q, sigma } => {
                    let x = sigma * sigma * inv_log_mix(q, MAX_STEP_LOSS) + 0.5;
                    (1.0 - q) * numeric::ndtr_sf(x / sigma) + q * numeric::ndtr_sf((x - 1.0) / sigma)
                }
                Leaf::ReplaceGaussian { q, sigma } => {
                    let x = replace_one_x_bound(q, sigma, MAX_STEP_LOSS);
                    (1.0 - q) * numeric::ndtr_sf(x / sigma) + q * numeric::ndtr_sf((x - 0.5) / sigma)
                }
                Leaf::EpsilonDelta { delta, .. } => delta,
                // Bounded losses (|ℓ| ≤ 1/b); nothing is sent to +∞ below the cap.
                Leaf::Laplace { .. } => 0.0,
            };
            c as f64 * (-(iota * (1.0 - 1e-6)).min(1.0)).ln_1p()
        })
        .sum();
    (-log_keep.exp_m1() * (1.0 - 1e-9)).max(0.0)
}

/// Above this many distinct leaves the composition groups them ([`group_leaves`]); at or below
/// it every leaf is composed as given (1,000 distinct leaves take ≈ 4 s of CPU).
const GROUP_ABOVE: usize = 4096;

/// At most this many distinct leaves after grouping ([`group_leaves`]).
const GROUP_TARGET: usize = 1024;

/// Equal leaves merged (counts added, zero counts dropped) in one pass over a hash map keyed by
/// the leaves' bit patterns, first-seen order kept. A total count beyond 2⁶⁴ − 1 is refused: a
/// saturated count would under-count the composition and understate ε.
fn merge_leaves(leaves: impl Iterator<Item = (Leaf, u64)>) -> Result<Vec<(Leaf, u64)>> {
    let mut index: std::collections::HashMap<(u8, u64, u64), usize> = std::collections::HashMap::new();
    let mut merged: Vec<(Leaf, u64)> = Vec::new();
    for (l, c) in leaves {
        if c == 0 {
            continue;
        }
        match index.entry(l.key()) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let m = &mut merged[*e.get()];
                m.1 = m.1.checked_add(c).ok_or_else(|| {
                    Error::field(
                        "count",
                        "the total count of one repeated step exceeds 2⁶⁴ − 1; no composition is certified",
                    )
                })?;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(merged.len());
                merged.push((l, c));
            }
        }
    }
    Ok(merged)
}

/// x rounded up to the ladder {(1 + r)^k : k ∈ ℤ} (the result is ≥ x, also after rounding).
fn ladder_up(x: f64, r: f64) -> f64 {
    let step = r.ln_1p();
    let mut y = ((x.ln() / step).ceil() * step).exp();
    while y < x {
        y *= 1.0 + r;
    }
    y
}

/// x rounded down to the ladder {(1 + r)^k : k ∈ ℤ} (the result is ≤ x, also after rounding).
fn ladder_down(x: f64, r: f64) -> f64 {
    let step = r.ln_1p();
    let mut y = ((x.ln() / step).floor() * step).exp();
    while y > x {
        y /= 1.0 + r;
    }
    y
}

/// Leaves grouped so that at most [`GROUP_TARGET`] distinct ones remain (issue 47, item 5): every
/// Poisson-subsampled Gaussian leaf (add/remove or replace-one) gets σ rounded *down* and q rounded
/// *up* to the ladder of powers of 1 + r, with r = 1e-4 doubled until the leaves fit. The rounded
/// leaf dominates the original one (Blackwell): adding independent N(0, σ² − σ'²) noise to both
/// outputs of the σ' pair gives the σ pair, and replacing the σ'-mixture's draw, with probability
/// 1 − q/q', by a fresh draw of the "absent" component N(0, σ²) gives the q mixture from the q'
/// one (the same map turns either side of either pair into the corresponding side), so a
/// composition of rounded leaves dominates the original composition (Dong, Roth & Su 2022, Lemma
/// 3.3 / Prop. 3.4): only tightness is lost, at most about a factor 1 + r on each step's μ and q.
/// Other leaves are kept as they are. Returns the grouped leaves and r; refuses (the limit of
/// distinct leaves names it) when even r = 1 leaves too many.
fn group_leaves(merged: &[(Leaf, u64)]) -> Result<(Vec<(Leaf, u64)>, f64)> {
    let mut r = 1e-4;
    loop {
        let rounded = merged.iter().map(|&(l, c)| {
            let l = match l {
                Leaf::SampledGaussian { q, sigma } => Leaf::SampledGaussian {
                    q: ladder_up(q, r).min(1.0),
                    sigma: ladder_down(sigma, r),
                },
                Leaf::ReplaceGaussian { q, sigma } => Leaf::ReplaceGaussian {
                    q: ladder_up(q, r).min(1.0),
                    sigma: ladder_down(sigma, r),
                },
                other => other,
            };
            (l, c)
        });
        let grouped = merge_leaves(rounded)?;
        if grouped.len() <= GROUP_TARGET || r >= 1.0 {
            return Ok((grouped, r));
        }
        r *= 2.0;
    }
}

impl PldAccountant {
    fn check(&self) -> Result<()> {
        let h = self.value_discretization_interval;
        if !(h.is_finite() && h > 0.0 && h <= 1.0) {
            return Err(Error::field(
                "value_discretization_interval",
                format!("must be in (0, 1], got {h}"),
            ));
        }
        let t = self.tail_mass_truncation;
        if !(t > 0.0 && t < 1e-3) {
            return Err(Error::field(
                "tail_mass_truncation",
                format!("must be in (0, 1e-3), got {t}"),
            ));
        }
        if self.max_grid_points < 16 {
            return Err(Error::field("max_grid_points", "must be ≥ 16"));
        }
        Ok(())
    }

    fn compose_leaves(&self, leaves: &[(Leaf, u64)]) -> Result<ComposedPld> {
        self.compose_leaves_with(leaves, false)
    }

    /// [`Self::compose_leaves`], the Fourier product on double words when `precise`.
    fn compose_leaves_with(&self, leaves: &[(Leaf, u64)], precise: bool) -> Result<ComposedPld> {
        self.check()?;
        // Merge equal leaves (drop zero counts), then, past GROUP_ABOVE distinct leaves, group
        // them on a ladder that rounds each one up to a leaf dominating it (`group_leaves`).
        let mut merged = merge_leaves(leaves.iter().copied())?;
        let mut ladder = 0.0;
        if merged.len() > GROUP_ABOVE {
            (merged, ladder) = group_leaves(&merged)?;
        }
        // Each distinct leaf is discretised and kept until the composition: bounded before any
        // grid is built.
        crate::limits::check_count("distinct PLD leaves", merged.len() as u64, crate::limits::PLD_LEAF)?;
        let h = self.value_discretization_interval;
        let total: f64 = merged.iter().map(|(_, c)| *c as f64).sum::<f64>().max(1.0);
        // Every construction carries at least this +∞ mass; when it is 1 up to 1e-9, δ(ε) = 1 for
        // every ε is reported without building grids (sound; it gives away at most 1e-9 of δ, and
        // the grids of such nearly blatant steps would be capped at max_grid_points anyway).
        if inf_mass_floor(&merged) >= 1.0 - 1e-9 {
            let dirs = if merged.iter().all(|(l, _)| l.symmetric()) {
                1
            } else {
                2
            };
            let blatant = |direction| ComposedDirection {
                direction,
                h,
                lo: 0,
                probs: Vec::new(),
                inf_mass: 1.0,
                window_tail_mass: 0.0,
                roundoff: 0.0,
                rel_inflation: 1.0,
                fft_len: 0,
                staged_slack: 0.0,
            };
            return Ok(ComposedPld {
                directions: [Direction::Remove, Direction::Add][..dirs]
                    .iter()
                    .map(|&d| blatant(d))
                    .collect(),
                value_discretization_interval: h,
                leaf_ladder: ladder,
            });
        }
        // Budget: half to per-step upper tails (→ ∞-mass), a quarter to each window tail.
        let tau_step = self.tail_mass_truncation / (2.0 * total);
        let tau_window = self.tail_mass_truncation / 2.0;
        let all_symmetric = merged.iter().all(|(l, _)| l.symmetric());
        let dirs: &[Direction] = if all_symmetric {
            &[Direction::Remove]
        } else {
            &[Direction::Remove, Direction::Add]
        };
        let one_direction = |dir: Direction| -> Result<ComposedDirection> {
            let arith = if precise { Arith::Precise } else { Arith::Double };
            self.compose_direction(&merged, dir, h, tau_step, tau_window, arith, true, None)
        };
        // With few leaves the two directions run side by side, so the serial end of one
        // (combining the per-thread products, the inverse transform) overlaps the other's
        // parallel work; with many, running both at once thrashes the caches (measured: 50
        // leaves 0.18 → 0.17 s, 1,000 leaves 2.47 → 2.74 s), so they run one after the other.
        let directions = if merged.len() <= 64 {
            dirs.par_iter().map(|&d| one_direction(d)).collect::<Result<Vec<_>>>()?
        } else {
            dirs.iter().map(|&d| one_direction(d)).collect::<Result<Vec<_>>>()?
        };
        // The coarsest grid any direction used (a direction may have refined or coarsened it).
        let h_used = directions.iter().map(|d| d.h).reduce(f64::max).unwrap_or(h);
        Ok(ComposedPld {
            directions,
            value_discretization_interval: h_used,
            leaf_ladder: ladder,
        })
    }

    /// One direction's composition of `merged` on the grid `h`: the requested grid interval (at
    /// the top level, first sized for precision by [`precision_grid`]), doubled while the composition window would be wider than REGRID_WIDTH points, or halved
    /// (by powers of two) while it would be narrower than REFINE_WIDTH/2 points (only where
    /// `refine`, within REFINE_POINTS leaf points and MIN_GRID_INTERVAL, never after a
    /// doubling, so the two rules cannot alternate), or composed in two stages
    /// ([`Self::compose_staged`]) where the window is wider than [`STAGE_WIDTH`] points.
    /// `pre`: the leaves already discretised on the grid `h` (with this `tau_step`) and their
    /// window for `tau_window`, used as they are unless the grid changes.
    #[allow(clippy::too_many_arguments)]
    fn compose_direction(
        &self,
        merged: &[(Leaf, u64)],
        dir: Direction,
        h: f64,
        tau_step: f64,
        tau_window: f64,
        arith: Arith,
        refine: bool,
        pre: Option<(Vec<Part>, Option<Window>)>,
    ) -> Result<ComposedDirection> {
        // The top-level composition's grid is sized for the precision the answer needs
        // ([`precision_grid`]); a staged composition's first stage keeps the grid it is given.
        // A sized grid is not refined again (the two rules cannot alternate).
        let (mut h, sized) = if refine && pre.is_none() {
            let g = precision_grid(merged, dir, h);
            if g > h && std::env::var_os("DPAUDIT_PLD_TIMING").is_some() {
                eprintln!("pld timing: grid sized for precision: {h} → {g}");
            }
            (g, g > h)
        } else {
            (h, false)
        };
        let mut coarsened = false;
        let mut refinements = 0;
        let mut pre = pre;
        loop {
            let (parts, window) = match pre.take() {
                Some(done) => done,
                None => self.discretise_direction(merged, dir, h, tau_step, tau_window)?,
            };
            match &window {
                Some(w) if !coarsened && w.uncapped_width > STAGE_WIDTH => {
                    if let Some(plan) = stage_plan(merged, w.uncapped_width) {
                        // Only where it pays: the staged transforms (the block's window, its
                        // Chernoff window from the leaves already discretised, and the second
                        // stage's) must cost at most half the one-stage ones. Where the leaves'
                        // own supports are most of the window (e.g. 10⁴ steps), the block is nearly
                        // as wide as the whole; where the counts leave remainders (50 distinct
                        // leaves × 10⁴), the second stage has as many leaves as the first.
                        let block_len = parts.iter().filter(|(_, c)| c / plan.blocks > 0).count() as i64;
                        let inner = chernoff_window_div(
                            &parts,
                            plan.blocks,
                            tau_window / (2.0 * plan.blocks as f64),
                            self.max_grid_points,
                            w.coarse.as_deref(),
                        );
                        // Transforms cost ≈ leaves × window points: the block's leaves on its
                        // window, and the remaining leaves plus the block on the second stage's.
                        let rest = parts.iter().filter(|(_, c)| c % plan.blocks > 0).count() as i64;
                        // The block's leaves are the leaves already discretised (their PLDs do
                        // not depend on the counts), so the first stage discretises nothing again;
                        // the remaining leaves are discretised on the coarse grid, ≈ 1/factor of
                        // their points on this grid, each point costing about as much as a
                        // transform point does per leaf (erf and exp calls against log₂N
                        // butterflies), counted as such.
                        let rest_points: i64 = parts
                            .iter()
                            .filter(|(_, c)| c % plan.blocks > 0)
                            .map(|(d, _)| d.probs.len() as i64)
                            .sum::<i64>()
                            / plan.factor;
                        let staged = block_len * inner.uncapped_width
                            + (rest + 1) * (w.uncapped_width / plan.factor)
                            + rest_points;
                        if 2 * staged <= parts.len() as i64 * w.uncapped_width {
                            // The block's leaves are the leaves themselves (moved, not copied).
                            let block: Vec<Part> = parts
                                .into_iter()
                                .filter(|(_, c)| c / plan.blocks > 0)
                                .map(|(d, c)| (d, c / plan.blocks))
                                .collect();
                            return self.compose_staged(
                                merged,
                                dir,
                                h,
                                tau_step,
                                tau_window,
                                arith,
                                plan,
                                (block, inner),
                            );
                        }
                    }
                }
                _ => {}
            }
            match &window {
                Some(w) if w.uncapped_width > REGRID_WIDTH => {
                    let factor = (w.uncapped_width as f64 / REGRID_WIDTH as f64).log2().ceil().max(1.0);
                    h *= 2f64.powi(factor as i32);
                    coarsened = true;
                    if std::env::var_os("DPAUDIT_PLD_TIMING").is_some() {
                        eprintln!("pld timing: window {} points, grid interval → {h}", w.uncapped_width);
                    }
                    continue;
                }
                Some(w)
                    if refine && !coarsened && !sized && refinements < 8 && 2 * w.uncapped_width <= REFINE_WIDTH =>
                {
                    if let Some(k) = self.refinement(&parts, w.uncapped_width, h) {
                        h /= 2f64.powi(k);
                        refinements += 1;
                        if std::env::var_os("DPAUDIT_PLD_TIMING").is_some() {
                            eprintln!("pld timing: window {} points, grid interval → {h}", w.uncapped_width);
                        }
                        continue;
                    }
                }
                _ => {}
            }
            return compose(&parts, dir, h, tau_window, self.max_grid_points, arith, window);
        }
    }

    /// Two-stage composition (`plan` from [`stage_plan`]): with every leaf's count c_j written
    /// c_j = T₂·b_j + r_j, the block B = Π_j leaf_j^{b_j} is composed on the grid h, turned into a
    /// PLD that dominates it ([`dominating_block`]) and discretised again, connect-the-dots, on
    /// the grid H = 2^k·h; then B^{T₂} · Π_j leaf_j^{r_j} is composed on the grid H. Every step
    /// only raises δ(ε) for every ε (docs/pld.md, "Staged composition"), so the result is an upper
    /// bound as a one-stage composition is. The connect-the-dots spread of the second stage adds
    /// at most T₂·H²/4 of variance to the composed loss, which the plan keeps at about the first
    /// stage's ΣT·h²/4, while the windows shrink by about 2^k (the first stage's by √T₂).
    #[allow(clippy::too_many_arguments)]
    fn compose_staged(
        &self,
        merged: &[(Leaf, u64)],
        dir: Direction,
        h: f64,
        tau_step: f64,
        tau_window: f64,
        arith: Arith,
        plan: StagePlan,
        block_parts: (Vec<Part>, Window),
    ) -> Result<ComposedDirection> {
        let StagePlan { blocks, factor } = plan;
        // The first stage's certified round-off reaches δ once per copy of the block (≈ ΣT·κ in
        // all): past HYBRID_MIN_COUNT steps, where a one-stage composition would take double-word
        // transform values, the block's leaves take them too, at the block's live frequencies
        // (a few hundred: the block's loss is spread over thousands of grid points), instead of
        // a whole double-word transform and product; so do the T₂ copies of the block and the
        // remainders in the second stage (whose double-precision values would leave a round-off
        // of ≈ T₂·κ·‖Y‖, ≈ 1e-10 at 2·10⁶ steps).
        let total: u64 = merged.iter().map(|(_, c)| *c).sum();
        let inner_arith = if arith == Arith::Double && total >= HYBRID_MIN_COUNT {
            Arith::Hybrid
        } else {
            arith
        };
        let block: Vec<(Leaf, u64)> = merged
            .iter()
            .filter(|(_, c)| c / blocks > 0)
            .map(|&(l, c)| (l, c / blocks))
            .collect();
        let rest: Vec<(Leaf, u64)> = merged
            .iter()
            .filter(|(_, c)| c % blocks > 0)
            .map(|&(l, c)| (l, c % blocks))
            .collect();
        // Window budget: half to the T₂ first-stage windows (their tails go to +∞ in the block),
        // half to the second stage's window.
        let inner = self.compose_direction(
            &block,
            dir,
            h,
            tau_step,
            tau_window / (2.0 * blocks as f64),
            inner_arith,
            false,
            Some((block_parts.0, Some(block_parts.1))),
        )?;
        // The second stage's grid is H = factor·h; the first stage may have ended on a coarser
        // grid (its own staging or regridding), a power of two times h: no finer than that.
        let coarse_h = (h * factor as f64).max(inner.h);
        let ratio = (coarse_h / inner.h).round() as i64;
        if std::env::var_os("DPAUDIT_PLD_TIMING").is_some() {
            eprintln!(
                "pld timing: staged: block of {} steps (grid {}, {} points) × {blocks}, grid → {coarse_h}",
                block.iter().map(|(_, c)| c).sum::<u64>(),
                inner.h,
                inner.probs.len()
            );
        }
        let nu = regrid(&dominating_block(&inner), inner.h, ratio);
        let (mut parts, _) = self.discretise_direction(&rest, dir, coarse_h, tau_step, tau_window)?;
        parts.push((nu, blocks));
        let mut out = compose(
            &parts,
            dir,
            coarse_h,
            tau_window / 2.0,
            self.max_grid_points,
            inner_arith,
            None,
        )?;
        // What the T₂ copies of the block carried to +∞ beside their leaves' own ∞-mass (only
        // steers the choice of the precise mode).
        let per_copy = (inner.roundoff + inner.window_tail_mass) * inner.rel_inflation + inner.staged_slack;
        out.staged_slack = (blocks as f64 * per_copy).min(out.inf_mass);
        Ok(out)
    }

    /// How many halvings of the grid interval h ([`REFINE_WIDTH`]) a composition whose window is
    /// `width` points wide gets: enough to bring it to about REFINE_WIDTH points, at most what
    /// keeps the leaves' points within [`REFINE_POINTS`] (and each leaf within half of
    /// `max_grid_points`, so refining never truncates a leaf) and h at or above
    /// [`MIN_GRID_INTERVAL`]; `None` for none.
    fn refinement(&self, parts: &[Part], width: i64, h: f64) -> Option<i32> {
        // A leaf of n points spans at most n + 1 intervals, so about 2^k·(n + 1) points after k halvings.
        let points: usize = parts.iter().map(|(d, _)| d.probs.len() + 1).sum();
        let widest = parts.iter().map(|(d, _)| d.probs.len() + 1).max().unwrap_or(1);
        let budget = REFINE_POINTS.min(self.max_grid_points / 2);
        let by_width = (REFINE_WIDTH as f64 / width.max(1) as f64).log2().floor();
        let by_points = (REFINE_POINTS as f64 / points.max(1) as f64).log2().floor();
        let by_leaf = (budget as f64 / widest as f64).log2().floor();
        let by_floor = (h / MIN_GRID_INTERVAL).log2().floor();
        let k = by_width.min(by_points).min(by_leaf).min(by_floor);
        (k >= 1.0).then_some(k as i32)
    }

    /// Every leaf's PLD in one direction on the grid i·h, and the Chernoff window of their
    /// composition (`None` where [`compose`] needs none: no leaves, or an empty leaf).
    fn discretise_direction(
        &self,
        merged: &[(Leaf, u64)],
        dir: Direction,
        h: f64,
        tau_step: f64,
        tau_window: f64,
    ) -> Result<(Vec<Part>, Option<Window>)> {
        let t_disc = std::time::Instant::now();
        let leaf_dir = |l: Leaf| if l.symmetric() { Direction::Remove } else { dir };
        // One table of the grid's exponentials for all subsampled-Gaussian leaves, where it
        // pays: its 4 calls per entry against ≈ 2 saved per leaf grid point (leaves of one
        // training run overlap almost entirely; a diffusion sampler's steps do not).
        let grid = {
            let ranges: Vec<(i64, usize)> = merged
                .iter()
                .filter_map(|&(l, _)| match l {
                    Leaf::SampledGaussian { q, sigma } => {
                        gaussian_range(q, sigma, leaf_dir(l), h, tau_step, self.max_grid_points).ok()
                    }
                    _ => None,
                })
                .collect();
            let points: usize = ranges.iter().map(|r| r.1).sum();
            match (
                ranges.iter().map(|r| r.0).min(),
                ranges.iter().map(|r| r.0 + r.1 as i64).max(),
            ) {
                (Some(lo), Some(hi)) if points >= 4 * (hi - lo) as usize => GridExp::new(h, lo, (hi - lo) as usize),
                _ => GridExp::empty(h),
            }
        };
        let parts = merged
            .par_iter()
            .map(|&(l, c)| leaf_pld(l, leaf_dir(l), h, tau_step, self.max_grid_points, &grid).map(|p| (p, c)))
            .collect::<Result<Vec<_>>>()?;
        if std::env::var_os("DPAUDIT_PLD_TIMING").is_some() {
            let pts: usize = parts.iter().map(|(p, _)| p.probs.len()).sum();
            eprintln!(
                "pld timing: discretised {} leaves, {pts} points in {:?}",
                parts.len(),
                t_disc.elapsed()
            );
        }
        let window = if parts.is_empty() || parts.iter().any(|(d, _)| d.probs.is_empty()) {
            None
        } else {
            Some(chernoff_window(&parts, tau_window, self.max_grid_points))
        };
        Ok((parts, window))
    }

    /// The composition with the Fourier product on double words and a truncation budget of
    /// δ/1000 (precise mode), or `None` when its cost (directions × distinct leaves × transform
    /// length) would exceed [`PRECISE_BUDGET`]; `first` is the double-precision composition,
    /// used for the estimate.
    fn compose_precise(&self, leaves: &[(Leaf, u64)], delta: f64, first: &ComposedPld) -> Result<Option<ComposedPld>> {
        let distinct = {
            let merged = merge_leaves(leaves.iter().copied())?;
            if merged.len() > GROUP_ABOVE {
                group_leaves(&merged)?.0.len()
            } else {
                merged.len()
            }
        };
        let width = first.directions.iter().map(|d| d.grid_points()).max().unwrap_or(0);
        // The window widens a little with the smaller truncation budget.
        let n = (width + width / 4 + 16).next_power_of_two();
        let cost = first.directions.len() * distinct * n;
        if cost > PRECISE_BUDGET || width == 0 {
            return Ok(None);
        }
        let acc = PldAccountant {
            tail_mass_truncation: self.precise_truncation(delta),
            ..self.clone()
        };
        acc.compose_leaves_with(leaves, true).map(Some)
    }

    /// ε(δ) at each δ of `deltas` (see [`Accountant::epsilon_profile`]): the composition is
    /// built once, a precise one at most once per truncation budget and only for a δ flagged
    /// `true` (one flagged `false` reads the precise composition only if one with its budget was
    /// built), and every δ is read from them with the same bookkeeping as a single δ (precise
    /// mode, δ floor, labelled RDP fallback). The outer error is one that every δ alone would
    /// give (settings, event, unsupported leaves).
    fn epsilon_many(
        &self,
        event: &DpEvent,
        neighbouring: Neighbouring,
        deltas: &[(f64, bool)],
    ) -> Result<Vec<Result<Evidence>>> {
        self.check()?;
        event.validate()?;
        if super::non_private_epsilon(AccountantKind::Pld, event, 0.5).is_some() {
            return Ok(super::guarded_at_each(deltas.iter().map(|&(d, _)| d), |d| {
                super::non_private_epsilon(AccountantKind::Pld, event, d)
            }));
        }
        let ls = leaves(&event.components()?, neighbouring)?;
        // Degenerate-input guard: noise below the certified range is ε = ∞ (accountants::mod).
        if super::uncertified_epsilon(AccountantKind::Pld, event, 0.5).is_some() {
            return Ok(super::guarded_at_each(deltas.iter().map(|&(d, _)| d), |d| {
                super::uncertified_epsilon(AccountantKind::Pld, event, d)
            }));
        }
        // Decide before building any grid whether the PLD can certify anything at a δ.
        let known_floor = inf_mass_floor(&ls);
        let mut composed: Option<Result<ComposedPld>> = None;
        // Precise compositions by truncation budget (bits of the f64).
        let mut precise_by_tau: Vec<(u64, Option<ComposedPld>)> = Vec::new();
        // Per δ: a final answer, or a PLD result that needs the RDP fallback (with its floor).
        enum Step {
            Done(Result<Evidence>),
            Fallback(Evidence, f64),
        }
        let mut steps = Vec::with_capacity(deltas.len());
        for &(delta, may_build) in deltas {
            if let Err(e) = check_delta(delta) {
                steps.push(Step::Done(Err(e)));
                continue;
            }
            if known_floor >= delta {
                let r = Evidence::of(AccountantKind::Pld, f64::INFINITY, delta, BoundKind::UpperBound)
                    .with_detail("grid_interval", self.value_discretization_interval)
                    .with_detail("inf_mass", known_floor)
                    .with_diagnostic(
                        "pld_delta_below_floor",
                        format!(
                            "δ = {delta:e} is at or below the infinite-loss mass of nearly blatant steps \
                             ({known_floor:e}, losses above {MAX_STEP_LOSS} nats); no finite ε is certified by the \
                             PLD, so no grid was built"
                        ),
                        true,
                    );
                steps.push(Step::Fallback(r, known_floor));
                continue;
            }
            let pld = match composed.get_or_insert_with(|| self.compose_leaves(&ls)) {
                Ok(p) => p,
                Err(e) => {
                    steps.push(Step::Done(Err(e.clone())));
                    continue;
                }
            };
            let eps = pld.epsilon(delta);
            // Precise mode: where the double-precision floor (mostly the certified FFT
            // round-off) is more than 1% of δ, compose again on double words with the
            // truncation budget scaled to δ, when that costs at most PRECISE_BUDGET transform
            // points; keep whichever certified ε is smaller (both are upper bounds).
            if pld.precision_limited(delta) {
                let tau = self.precise_truncation(delta);
                let idx = match precise_by_tau.iter().position(|(b, _)| *b == tau.to_bits()) {
                    Some(i) => Some(i),
                    None if !may_build => None,
                    None => match self.compose_precise(&ls, delta, pld) {
                        Ok(p) => {
                            precise_by_tau.push((tau.to_bits(), p));
                            Some(precise_by_tau.len() - 1)
                        }
                        Err(e) => {
                            steps.push(Step::Done(Err(e)));
                            continue;
                        }
                    },
                };
                if let Some(precise) = idx.and_then(|i| precise_by_tau[i].1.as_ref()) {
                    let e2 = precise.epsilon(delta);
                    if e2 < eps && e2.is_finite() {
                        let r = Evidence::of(AccountantKind::Pld, e2, delta, BoundKind::UpperBound);
                        let r = precise
                            .annotate(r, Some(delta))
                            .with_detail("double_word_fft", 1.0)
                            .with_detail("double_precision_epsilon", eps)
                            .with_diagnostic(
                                "pld_double_word",
                                format!(
                                    "the double-precision PLD's floor ({:e}: certified FFT round-off, \
                                     window tails, infinite-loss mass) is more than 1% of δ = {delta:e}; \
                                     ε was recomputed with the Fourier product on double words (round-off \
                                     floor {:e}): ε = {e2} instead of {eps}",
                                    pld.delta_floor(),
                                    precise.delta_floor()
                                ),
                                false,
                            );
                        steps.push(Step::Done(Ok(r)));
                        continue;
                    }
                }
            }
            let r = Evidence::of(AccountantKind::Pld, eps, delta, BoundKind::UpperBound);
            let r = pld.annotate(r, Some(delta));
            if eps.is_finite() {
                steps.push(Step::Done(Ok(r)));
            } else {
                steps.push(Step::Fallback(r, pld.delta_floor()));
            }
        }
        // The PLD's own floor (infinite-loss mass from losses beyond the grid, window tails,
        // certified FFT round-off) is at or above δ, so the PLD alone certifies no finite ε.
        // The true δ(ε) curve lies below every sound curve, so the RDP bound of the same event
        // is still a sound answer: report it *as the RDP bound it is* (accountant `rdp`), say
        // why the PLD gave none, and keep the PLD diagnostics. One RDP curve serves every such δ.
        // The first such δ gets `epsilon`'s RDP answer, the others the RDP profile's.
        let fallback_deltas: Vec<f64> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Fallback(r, _) => Some(r.delta),
                Step::Done(_) => None,
            })
            .collect();
        let mut rdp_answers = match fallback_deltas.split_first() {
            None => Vec::new(),
            Some((&first, rest)) => {
                let (head, mut v) =
                    super::rdp::RdpAccountant::default().epsilon_profile(event, neighbouring, first, rest);
                v.insert(0, head);
                v
            }
        }
        .into_iter();
        Ok(steps
            .into_iter()
            .map(|s| match s {
                Step::Done(r) => r,
                Step::Fallback(r, floor) => match rdp_answers.next().expect("one RDP answer per fallback δ") {
                    Ok(rdp) if rdp.epsilon.is_finite() => {
                        let delta = r.delta;
                        let mut out = Evidence::of(AccountantKind::Rdp, rdp.epsilon, delta, rdp.kind);
                        out.details = r.details;
                        out.diagnostics = r.diagnostics;
                        if let Some(order) = rdp.details.get("rdp_order") {
                            out.details.insert("rdp_order".into(), *order);
                        }
                        out.details.insert("pld_delta_floor".into(), floor);
                        Ok(out.with_diagnostic(
                            "pld_fallback_rdp",
                            format!(
                                "the PLD certifies no finite ε at δ = {delta:e}: its δ floor is {} (infinite-loss \
                                 mass beyond its grid, window tails and round-off), so the ε shown is the RDP upper \
                                 bound of the same event, labelled rdp",
                                // Near 1, six significant digits of 1 − floor say more than of floor.
                                if floor > 0.999 && floor < 1.0 {
                                    format!("1 − {}", crate::numeric::format::sig6(1.0 - floor))
                                } else {
                                    crate::numeric::format::sig6(floor)
                                }
                            ),
                            false,
                        ))
                    }
                    _ => Ok(r),
                },
            })
            .collect())
    }

    /// Truncation budget of the precise mode at δ: min(`tail_mass_truncation`, δ/1000).
    fn precise_truncation(&self, delta: f64) -> f64 {
        self.tail_mass_truncation.min(delta * 1e-3)
    }

    /// Composes a list of (Poisson-subsampled) Gaussian steps (add/remove).
    pub fn compose_steps(&self, steps: &[PldStep]) -> Result<ComposedPld> {
        let mut ls = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            if !(s.q > 0.0 && s.q <= 1.0) {
                return Err(Error::field(
                    format!("steps[{i}].q"),
                    format!("must be in (0, 1], got {}", s.q),
                ));
            }
            if !(s.noise_multiplier.is_finite() && s.noise_multiplier > 0.0) {
                return Err(Error::field(
                    format!("steps[{i}].noise_multiplier"),
                    format!("must be finite and > 0, got {}", s.noise_multiplier),
                ));
            }
            ls.push((
                Leaf::SampledGaussian {
                    q: s.q,
                    sigma: s.noise_multiplier,
                },
                s.count,
            ));
        }
        self.compose_leaves(&ls)
    }

    /// Composes a validated event under a neighbouring relation.
    pub fn compose_event(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<ComposedPld> {
        event.validate()?;
        let comps = event.components()?;
        let ls = leaves(&comps, neighbouring)?;
        self.compose_leaves(&ls)
    }
}

/// ε(δ) upper bound for a list of Poisson-subsampled Gaussian steps with the default accountant
/// (e.g. a diffusion schedule: `PldStep::gdp(μ_i, p, S)` for each step i).
pub fn pld_epsilon(steps: &[PldStep], delta: f64) -> Result<f64> {
    check_delta(delta)?;
    Ok(PldAccountant::default().compose_steps(steps)?.epsilon(delta))
}

/// δ(ε) upper bound for a list of Poisson-subsampled Gaussian steps with the default accountant.
pub fn pld_delta(steps: &[PldStep], epsilon: f64) -> Result<f64> {
    check_epsilon(epsilon)?;
    Ok(PldAccountant::default().compose_steps(steps)?.delta(epsilon))
}

impl Accountant for PldAccountant {
    fn kind(&self) -> AccountantKind {
        AccountantKind::Pld
    }
    fn supports(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<()> {
        self.check()?;
        event.validate()?;
        if event.non_private_path().is_some() {
            return Ok(());
        }
        leaves(&event.components()?, neighbouring).map(|_| ())
    }
    fn epsilon(&self, event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Result<Evidence> {
        self.epsilon_at(event, neighbouring, delta)
            .map(|r| replace_one_assumption(r, event, neighbouring))
    }
    fn delta(&self, event: &DpEvent, neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence> {
        self.delta_at(event, neighbouring, epsilon)
            .map(|r| replace_one_assumption(r, event, neighbouring))
    }
    fn epsilon_profile(
        &self,
        event: &DpEvent,
        neighbouring: Neighbouring,
        delta: f64,
        grid: &[f64],
    ) -> (Result<Evidence>, Vec<Result<Evidence>>) {
        let (head, rest) = self.profile_at(event, neighbouring, delta, grid);
        let note = |r: Result<Evidence>| r.map(|r| replace_one_assumption(r, event, neighbouring));
        (note(head), rest.into_iter().map(note).collect())
    }
}

/// Entry-point annotation: under replace-one, a Poisson-subsampled Gaussian is accounted with
/// the clipped-sum pair of [`replace_one_pld`] (the record's contribution has norm ≤ Δ/2), an
/// assumption the RDP bound does not make; every result says so, so that a headline taken from
/// it can restate it.
fn replace_one_assumption(r: Evidence, event: &DpEvent, neighbouring: Neighbouring) -> Evidence {
    let poisson = event.components().is_ok_and(|cs| {
        cs.iter()
            .any(|c| matches!(c.sampling, crate::events::Sampling::Poisson { .. }))
    });
    if neighbouring != Neighbouring::ReplaceOne || !poisson || !r.epsilon.is_finite() || !r.is_from(AccountantKind::Pld)
    {
        return r;
    }
    r.with_diagnostic(
        "assumption_replace_one_clipped_sum",
        "replace-one with Poisson sampling is accounted for a clipped sum: the replaced record adds a vector of \
         norm ≤ Δ/2 to the sampled sum, so the two outputs are (1 − q)N(0, σ²) + qN(½, σ²) against \
         (1 − q)N(0, σ²) + qN(−½, σ²) (as dp_accounting's REPLACE_ONE); a mechanism whose add/remove change can \
         reach Δ needs the rdp bound (joint convexity, no such assumption)",
        false,
    )
}

impl PldAccountant {
    fn epsilon_at(&self, event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Result<Evidence> {
        check_delta(delta)?;
        self.epsilon_many(event, neighbouring, &[(delta, true)])?
            .pop()
            .expect("one answer per δ")
    }

    /// ε at `delta` exactly as `epsilon`; every grid δ read from the compositions built for it
    /// (the double-precision one, and the precise one when `delta` needed it): equal to
    /// `epsilon` at that δ unless that δ alone would have needed a precise composition of its
    /// own, and then the larger double-precision bound (or the labelled RDP fallback).
    fn profile_at(
        &self,
        event: &DpEvent,
        neighbouring: Neighbouring,
        delta: f64,
        grid: &[f64],
    ) -> (Result<Evidence>, Vec<Result<Evidence>>) {
        if let Err(e) = check_delta(delta) {
            return (Err(e.clone()), grid.iter().map(|_| Err(e.clone())).collect());
        }
        let mut asks = vec![(delta, true)];
        asks.extend(grid.iter().map(|&d| (d, false)));
        match self.epsilon_many(event, neighbouring, &asks) {
            Ok(mut v) => {
                let head = v.remove(0);
                (head, v)
            }
            Err(e) => (Err(e.clone()), grid.iter().map(|_| Err(e.clone())).collect()),
        }
    }

    fn delta_at(&self, event: &DpEvent, neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence> {
        check_epsilon(epsilon)?;
        event.validate()?;
        if let Some(r) = super::non_private_delta(AccountantKind::Pld, event, epsilon) {
            return Ok(r);
        }
        let ls = leaves(&event.components()?, neighbouring)?;
        // Degenerate-input guard: noise below the certified range is δ = 1 (accountants::mod).
        if let Some(r) = super::uncertified_delta(AccountantKind::Pld, event, epsilon) {
            return Ok(r);
        }
        let pld = self.compose_leaves(&ls)?;
        let d = pld.delta(epsilon);
        // As in ε(δ): where the double-precision floor is more than 1% of the answer, the
        // double-word composition (truncation budget scaled to the answer) may certify less.
        if d < 1.0 && pld.precision_limited(d) {
            if let Some(precise) = self.compose_precise(&ls, d, &pld)? {
                let d2 = precise.delta(epsilon);
                if d2 < d {
                    let r = Evidence::of(AccountantKind::Pld, epsilon, d2, BoundKind::UpperBound);
                    return Ok(precise
                        .annotate(r, None)
                        .with_detail("double_word_fft", 1.0)
                        .with_detail("double_precision_delta", d));
                }
            }
        }
        let r = Evidence::of(AccountantKind::Pld, epsilon, d, BoundKind::UpperBound);
        Ok(pld.annotate(r, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::gdp;

    fn acc() -> PldAccountant {
        PldAccountant::default()
    }

    #[test]
    fn single_gaussian_matches_gdp_from_above() {
        for &sigma in &[0.5, 1.0, 3.0, 10.0] {
            let pld = acc().compose_steps(&[PldStep::gdp(1.0 / sigma, 1.0, 1)]).unwrap();
            for &d in &[1e-3, 1e-5, 1e-8] {
                let exact = gdp::epsilon_for_delta(1.0 / sigma, d).unwrap();
                let e = pld.epsilon(d);
                assert!(e >= exact, "σ={sigma} δ={d}: pld {e} < exact {exact}");
                assert!(
                    e - exact < 1e-3 * exact.max(1e-2),
                    "σ={sigma} δ={d}: pld {e} vs {exact}"
                );
            }
        }
    }

    /// ι + Σ p (1 − e^{ε−ℓ})₊ of a discrete PLD on the grid `h`.
    fn hockey_stick(d: &DiscretePld, h: f64, eps: f64) -> f64 {
        d.inf_mass
            + d.probs
                .iter()
                .enumerate()
                .map(|(k, &p)| p * (-(eps - (d.lo + k as i64) as f64 * h).exp_m1()).max(0.0))
                .sum::<f64>()
    }

    thread_local! {
        /// Turns [`sparse_top`] off on this thread (the dense discretisation, for comparison).
        pub(super) static DENSE_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The sparse top of the grid rounds losses up, so the leaf's δ(ε) is at or above the dense
    /// discretisation's at every ε, and by no more than 2τ (its documented cost per step); it keeps
    /// the P-mass and the +∞ atom, and skips evaluations where the grid runs far into the tail.
    #[test]
    fn sparse_top_dominates_the_dense_grid_by_at_most_two_tau() {
        let mut skipped_any = false;
        for (q, sigma, h, tau) in [
            (0.001, 0.8, 1e-4, 1e-19),
            (0.004, 1.1, 1e-4, 5e-18),
            (0.004, 0.61, 8e-4, 5e-18),
            (0.02, 2.0, 1e-3, 1e-16),
            (1.0, 1.5, 1e-4, 1e-15),
            (1e-5, 0.5, 1e-4, 1e-20),
        ] {
            let sparse = gaussian_pld(q, sigma, Direction::Remove, h, tau, 1 << 22, &GridExp::empty(h)).unwrap();
            DENSE_ONLY.with(|c| c.set(true));
            let dense = gaussian_pld(q, sigma, Direction::Remove, h, tau, 1 << 22, &GridExp::empty(h)).unwrap();
            DENSE_ONLY.with(|c| c.set(false));
            let nonzero = |d: &DiscretePld| d.probs.iter().filter(|&&p| p > 0.0).count();
            skipped_any |= nonzero(&sparse) < nonzero(&dense);
            assert_eq!(sparse.inf_mass, dense.inf_mass, "q {q} σ {sigma}");
            let (ps, pd) = (sparse.probs.iter().sum::<f64>(), dense.probs.iter().sum::<f64>());
            assert!((ps - pd).abs() <= 1e-13, "q {q} σ {sigma}: P-mass {ps} vs {pd}");
            // δ(ε) summed with Neumaier's compensation, so the two sums are each within a few
            // u of their exact values (plain sums over 10⁵ terms differ by ≈ 1e-12 relative).
            let delta = |d: &DiscretePld, eps: f64| -> f64 {
                let (mut sum, mut c) = (d.inf_mass, 0.0f64);
                for (k, &p) in d.probs.iter().enumerate() {
                    let x = p * (-(eps - (d.lo + k as i64) as f64 * h).exp_m1()).max(0.0);
                    let t = sum + x;
                    c += if sum.abs() >= x.abs() {
                        (sum - t) + x
                    } else {
                        (x - t) + sum
                    };
                    sum = t;
                }
                sum + c
            };
            let top = (sparse.lo + sparse.probs.len() as i64) as f64 * h;
            let mut eps = -0.01;
            while eps < top + 0.01 {
                let (a, b) = (delta(&sparse, eps), delta(&dense, eps));
                assert!(
                    a >= b * (1.0 - 1e-14),
                    "q {q} σ {sigma} ε {eps}: sparse δ {a} < dense {b}"
                );
                assert!(
                    a <= b + 2.0 * tau * (1.0 + 1e-9) + 1e-14 * b,
                    "q {q} σ {sigma} ε {eps}: {a} vs {b}"
                );
                eps += top / 199.0;
            }
        }
        assert!(skipped_any, "no case had a sparse top");
    }

    #[test]
    fn regrid_dominates_at_every_epsilon_and_keeps_the_q_mass() {
        let h = 1e-4;
        let d = leaf_pld(
            Leaf::SampledGaussian { q: 0.01, sigma: 0.7 },
            Direction::Remove,
            h,
            1e-15,
            1 << 22,
            &GridExp::empty(h),
        )
        .unwrap();
        let q_mass = |d: &DiscretePld, h: f64| -> f64 {
            d.probs
                .iter()
                .enumerate()
                .map(|(k, &p)| p * (-((d.lo + k as i64) as f64 * h)).exp())
                .sum()
        };
        for factor in [2i64, 7, 64, 1024] {
            let r = regrid(&d, h, factor);
            let hh = h * factor as f64;
            let mut eps = -3.0;
            while eps < 4.0 {
                // Exactly, the split keeps Σ (p − e^ε q)₊ where both ends lie above ε and raises it
                // elsewhere; the rounding margin (≈ 10u) is of the order of the test's own sums'
                // round-off, hence the 1e-13 relative allowance.
                let (a, b) = (hockey_stick(&r, hh, eps), hockey_stick(&d, h, eps));
                assert!(
                    a >= b * (1.0 - 1e-13),
                    "factor {factor}, ε {eps}: regridded δ {a} < {b}"
                );
                eps += 0.0137;
            }
            // Connect-the-dots keeps the P- and Q-masses (up to the upward rounding; the two sums
            // add their terms in different orders, hence the 1e-13 allowance below as above).
            let (pr, pd) = (r.probs.iter().sum::<f64>(), d.probs.iter().sum::<f64>());
            assert!(
                pr >= pd * (1.0 - 1e-13) && pr <= pd * (1.0 + 1e-12),
                "factor {factor}: P-mass {pr} vs {pd}"
            );
            let (qr, qd) = (q_mass(&r, hh), q_mass(&d, h));
            assert!((qr - qd).abs() <= 1e-12 * qd, "factor {factor}: Q-mass {qr} vs {qd}");
        }
    }

    /// Full batch: the composition is exactly √T·μ-GDP, so the staged composition (a window of
    /// ≈ 1.6 M points at h = 1e-4) is held between the closed form and 0.1 % above it, at 10⁶ steps
    /// (double-precision stages, floor ≈ 5e-8: δ down to 1e-5 here; the accountant composes
    /// again on double words for smaller δ) and past 2²⁰ (double-word stages).
    #[test]
    fn staged_composition_is_above_exact_gdp_and_within_a_tenth_of_a_percent() {
        for (mu_step, t) in [(0.01, 1_000_000u64), (0.005, 3_000_000)] {
            let c = acc().compose_steps(&[PldStep::gdp(mu_step, 1.0, t)]).unwrap();
            assert!(
                c.value_discretization_interval > 1e-4,
                "T = {t}: not staged (grid {})",
                c.value_discretization_interval
            );
            let mu = mu_step * (t as f64).sqrt();
            let deltas: &[f64] = if t < HYBRID_MIN_COUNT {
                &[1e-3, 1e-5]
            } else {
                &[1e-3, 1e-5, 1e-8]
            };
            for &d in deltas {
                let exact = gdp::epsilon_for_delta(mu, d).unwrap();
                let e = c.epsilon(d);
                assert!(e >= exact, "T = {t}, δ = {d}: staged {e} < exact {exact}");
                assert!(e <= exact * 1.001, "T = {t}, δ = {d}: staged {e} vs exact {exact}");
                assert!(c.delta(exact) >= d * (1.0 - 1e-9), "T = {t}: δ(ε_exact) below δ");
            }
        }
    }

    /// The grid sized for precision (`precision_grid`) is coarser than the requested 1e-4 at
    /// q 0.004, σ 1.1, stays 1e-4 for small-variance leaves, and its ε lies above the one on the
    /// requested grid (a coarser nested connect-the-dots grid dominates) and within 0.1 % of it.
    #[test]
    fn sized_grid_is_above_the_requested_grid_and_within_a_tenth_of_a_percent() {
        let acc = acc();
        let small = [(Leaf::SampledGaussian { q: 0.001, sigma: 0.8 }, 10_000)];
        assert_eq!(precision_grid(&small, Direction::Remove, 1e-4), 1e-4);
        for &t in &[10_000u64, 100_000] {
            let leaves = [(Leaf::SampledGaussian { q: 0.004, sigma: 1.1 }, t)];
            assert_eq!(precision_grid(&leaves, Direction::Remove, 1e-4), 2e-4);
            let sized = acc.compose_leaves(&leaves).unwrap();
            // (A staged composition reports its coarser second grid.)
            assert!(sized.value_discretization_interval >= 2e-4);
            let tau_step = acc.tail_mass_truncation / (2.0 * t as f64);
            let tau_window = acc.tail_mass_truncation / 2.0;
            let fine = ComposedPld {
                directions: [Direction::Remove, Direction::Add]
                    .iter()
                    .map(|&d| {
                        acc.compose_direction(&leaves, d, 1e-4, tau_step, tau_window, Arith::Double, false, None)
                            .unwrap()
                    })
                    .collect(),
                value_discretization_interval: 1e-4,
                leaf_ladder: 0.0,
            };
            // (Not δ = 1e-8: there the staged composition's double-precision floor, summed over its
            // copies of the block, can exceed δ; docs/pld.md, Speed, "Not reached".)
            for &d in &[1e-3, 1e-5] {
                let (a, b) = (sized.epsilon(d), fine.epsilon(d));
                assert!(
                    a >= b * (1.0 - 1e-9),
                    "T = {t}, δ = {d}: sized {a} < requested grid {b}"
                );
                assert!(a <= b * 1.001, "T = {t}, δ = {d}: sized {a} vs requested grid {b}");
            }
        }
    }

    /// T = 10⁵, δ = 1e-8 (q 0.004, σ 1.1): the staged composition's block (64 steps × 1,562
    /// copies) carries its certified round-off to +∞ once per copy, a floor above δ. The precise
    /// mode must still be tried there (the floor sits in the ∞ atom, not in `roundoff`), so the
    /// answer is a PLD bound, below the RDP bound, not the labelled RDP fallback.
    #[test]
    fn staged_round_off_in_the_infinity_atom_still_calls_the_precise_mode() {
        let ev = DpEvent::dpsgd(1.1, 0.004, 100_000);
        let r = acc().epsilon(&ev, Neighbouring::AddRemove, 1e-8).unwrap();
        assert_eq!(r.accountant, Some(AccountantKind::Pld), "{r:?}");
        let rdp = super::super::rdp::RdpAccountant::default()
            .epsilon(&ev, Neighbouring::AddRemove, 1e-8)
            .unwrap()
            .epsilon;
        assert!(r.epsilon.is_finite() && r.epsilon < rdp, "{} vs RDP {rdp}", r.epsilon);
        // Never below the same composition at δ = 1e-7 (ε falls with δ).
        let looser = acc().epsilon(&ev, Neighbouring::AddRemove, 1e-7).unwrap().epsilon;
        assert!(r.epsilon > looser, "{} vs {looser} at δ = 1e-7", r.epsilon);
    }

    #[test]
    fn batched_cumulants_equal_one_exponent_at_a_time() {
        let d = gaussian_pld(
            0.01,
            0.9,
            Direction::Remove,
            1e-3,
            1e-15,
            1 << 20,
            &GridExp::empty(1e-3),
        )
        .unwrap();
        // Both signs in one pass, full and partial batches (unused lanes dropped).
        for len in [MGF_BATCH, 8, 1] {
            let tp: Vec<f64> = (0..len).map(|i| 1e-5 * 2f64.powi(i as i32)).collect();
            let tn: Vec<f64> = (0..len).map(|i| -3e-5 * 2f64.powi(i as i32)).collect();
            let (mut op, mut on) = (vec![0.0; len], vec![0.0; len]);
            log_mgf_dual(&d, &tp, &tn, &mut op, &mut on);
            for (&t, &o) in tp.iter().zip(&op).chain(tn.iter().zip(&on)) {
                let one = log_mgf(&d, t);
                assert!((o - one).abs() <= 1e-12 * (1.0 + one.abs()), "t = {t}: {o} vs {one}");
            }
        }
        // The composition's Λ at the coarse exponents, from the leaves' stored values (counts
        // divided, a leaf dropped) and from a fresh pass, agree.
        let e = gaussian_pld(
            0.02,
            1.3,
            Direction::Remove,
            1e-3,
            1e-15,
            1 << 20,
            &GridExp::empty(1e-3),
        )
        .unwrap();
        let parts = vec![(d, 700u64), (e, 3u64)];
        let w = chernoff_window(&parts, 1e-13, 1 << 22);
        let shared = chernoff_window_div(&parts, 4, 1e-14, 1 << 22, w.coarse.as_deref());
        let fresh = chernoff_window_div(&parts, 4, 1e-14, 1 << 22, None);
        assert_eq!((shared.lower, shared.upper), (fresh.lower, fresh.upper));
        assert_eq!(shared.window_tail_mass, fresh.window_tail_mass);
    }

    /// The fast kill in `FourierProduct::apply` fires only where the full computation kills too:
    /// at m ≤ m_dead and P(ω) ≤ 2 the updated bound falls below DEAD, for counts up to 2⁵⁰.
    #[test]
    fn fast_kill_only_where_the_bound_falls_below_dead() {
        for &t in &[
            1u64,
            2,
            3,
            16,
            255,
            256,
            10_000,
            1 << 20,
            1 << 33,
            1 << 50,
            (1 << 50) + 1,
        ] {
            let lp = LeafPower::new(t, 0.0);
            if t > 1 << 50 {
                assert_eq!(lp.m_dead, 0.0);
                continue;
            }
            for &f in &[1.0, 1.0 - 1e-15, 0.999, 0.5, 1e-3] {
                let m = lp.m_dead * f;
                let p = 2.0 * (powr(m, t) * lp.infl_m) * (1.0 + 4.0 * U);
                assert!(p < DEAD, "t = {t}, m = {m}: {p}");
            }
            // Not far below the exact threshold (it only saves work where it fires).
            assert!(lp.m_dead >= (DEAD.ln() / t as f64).exp() * (-5.0 / t as f64).exp());
        }
    }

    #[test]
    fn powers_by_squaring_stay_within_their_bound() {
        // |a| = 1 − 1e-4 at an angle: the exact power is known in polar form.
        for &t in &[1u64, 2, 3, 17, 1000, 10_007, 1 << 20] {
            let (r, th) = (1.0 - 1e-4f64, 0.3f64);
            let a = Complex64::from_polar(r, th);
            let got = powc(a, t);
            let exact = Complex64::from_polar((t as f64 * r.ln()).exp(), (t as f64 * th) % std::f64::consts::TAU);
            let lp = LeafPower::new(t, 0.0);
            // The polar reference itself carries ≈ T·u of angle error; allow it on top of ρ_T.
            let allowed = (lp.rho + 8.0 * U * t as f64) * exact.norm() + 1e-300;
            assert!((got - exact).norm() <= allowed, "T = {t}: {got} vs {exact}");
            let m = powr(r, t) * lp.infl_m;
            assert!(m >= exact.norm(), "T = {t}: m^T {m} below |a|^T {}", exact.norm());
        }
    }

    #[test]
    fn connect_dots_keeps_mass_and_q_mass() {
        // The discretised PLD is a probability distribution and E_P[e^{−ℓ}] ≤ 1 (validity).
        for &(q, s) in &[(1.0, 1.0), (0.01, 0.8), (0.3, 2.0)] {
            for dir in [Direction::Remove, Direction::Add] {
                let d = gaussian_pld(q, s, dir, 1e-4, 1e-16, 1 << 22, &GridExp::empty(1e-4)).unwrap();
                let total: f64 = d.probs.iter().sum::<f64>() + d.inf_mass;
                assert!((total - 1.0).abs() < 1e-12, "q={q} σ={s} {dir:?}: total {total}");
                let qmass: f64 = d
                    .probs
                    .iter()
                    .enumerate()
                    .map(|(k, p)| p * (-((d.lo + k as i64) as f64 * 1e-4)).exp())
                    .sum();
                assert!(qmass <= 1.0 + 1e-12, "q={q} σ={s} {dir:?}: Q-mass {qmass}");
            }
        }
    }

    #[test]
    fn epsilon_delta_roundtrip_is_safe() {
        let pld = acc().compose_steps(&[PldStep::gdp(0.5, 0.01, 2000)]).unwrap();
        for &d in &[1e-4, 1e-6, 1e-9] {
            let e = pld.epsilon(d);
            assert!(e.is_finite() && e > 0.0);
            let back = pld.delta(e);
            assert!(back <= d * (1.0 + 1e-9), "δ={d}: δ(ε(δ)) = {back}");
            // And slightly smaller ε would violate (the answer is not loose by more than rounding).
            assert!(pld.delta(e * (1.0 - 1e-6) - 1e-9) > d * (1.0 - 1e-9));
        }
    }

    #[test]
    fn no_steps_is_zero() {
        let pld = acc().compose_steps(&[]).unwrap();
        assert_eq!(pld.epsilon(1e-5), 0.0);
    }

    /// The double-word transform value at a frequency agrees with the double-precision FFT to
    /// within the FFT's componentwise bound plus its own, and its own bound is tiny.
    #[test]
    fn double_word_transform_values_match_the_fft() {
        let grid = GridExp::empty(1e-4);
        for &(q, s, dir) in &[
            (0.004, 1.1, Direction::Remove),
            (0.004, 1.1, Direction::Add),
            (1.0, 3.0, Direction::Remove),
        ] {
            let d = gaussian_pld(q, s, dir, 1e-4, 1e-16, 1 << 22, &grid).unwrap();
            for &n in &[5 * (1usize << 14), 1 << 17] {
                let mut buf = vec![Complex64::new(0.0, 0.0); n];
                for (k, &p) in d.probs.iter().enumerate() {
                    buf[(d.lo + k as i64).rem_euclid(n as i64) as usize].re += p;
                }
                FftPlanner::<f64>::new().plan_fft_forward(n).process(&mut buf);
                let kappa = FFT_ERR_PER_LEVEL * (n as f64).log2().ceil();
                for k in [0usize, 1, 2, 17, 100, n / 3, n / 2] {
                    let (v, e) = dd_transform_at(&d, k, n);
                    assert!(e < 1e-24, "bound {e:e}");
                    let diff = (Complex64::new(v.re.to_f64(), v.im.to_f64()) - buf[k]).norm();
                    assert!(diff <= kappa + e, "q={q} σ={s} n={n} k={k}: {diff:e}");
                }
                // Four at a time (interleaved) is bit for bit one at a time.
                let ks = [0usize, 1, 2, 17, 100, n / 3, n / 2];
                for (&k, &(v, e)) in ks.iter().zip(&dd_transform_values(&d, &ks, n)) {
                    assert_eq!((v, e), dd_transform_at(&d, k, n), "k = {k}");
                }
                let (v0, _) = dd_transform_at(&d, 0, n);
                // The DC term is the total mass (the naive f64 sum rounds by ≤ S·u).
                assert!((v0.re.to_f64() - d.probs.iter().sum::<f64>()).abs() < 1e-12);
                assert!(v0.im.to_f64().abs() < 1e-30);
            }
        }
    }

    /// Long horizons: large-count leaves take the double-word transform values, so one
    /// composition certifies δ = 1e-5 (floor ≪ 1% of δ) where the double-precision product's
    /// round-off bound alone (≈ T·κ) was ≈ 5.7e-7.
    #[test]
    fn large_counts_have_a_tiny_roundoff_floor() {
        let steps = [PldStep {
            q: 0.004,
            noise_multiplier: 1.1,
            count: 2_000_000,
        }];
        let pld = acc().compose_steps(&steps).unwrap();
        for d in &pld.directions {
            assert!(d.roundoff < 1e-11, "{:?}: round-off {:e}", d.direction, d.roundoff);
        }
        assert!(!pld.precision_limited(1e-5));
        let eps = pld.epsilon(1e-5);
        assert!(eps.is_finite() && eps > 0.0);
        // Never below a single step's exact ε... nor below the composition of fewer steps.
        let fewer = acc()
            .compose_steps(&[PldStep {
                count: 1_000_000,
                ..steps[0]
            }])
            .unwrap()
            .epsilon(1e-5);
        assert!(eps > fewer, "{eps} vs {fewer}");
    }

    #[test]
    fn fft_len_is_at_least_n() {
        for n in [1usize, 2, 3, 5, 7, 100, 1000, 12289, 1 << 20] {
            let m = fft_len(n);
            assert!(m >= n && m <= 2 * n.max(2), "{n} -> {m}");
        }
    }
}
