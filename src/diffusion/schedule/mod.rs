//! Noise schedules, all mapped to the variance-exploding form x_t = x₀ + t·ε that the
//! per-step analysis uses (diffusion-sampling-privacy.md §2.1: "our framework is adoptable to any
//! diffusion processes such as DDPM or Flow Matching").
//!
//! - EDM / Karras et al. (2022) eq. (5): t_i = (σ_max^{1/ρ} + i/(N−1)(σ_min^{1/ρ} − σ_max^{1/ρ}))^ρ.
//! - DDPM (Ho et al. 2020): x_k = √ᾱ_k x₀ + √(1−ᾱ_k) ε, so x_k/√ᾱ_k = x₀ + t ε with
//!   t = √((1−ᾱ_k)/ᾱ_k). Linear β (Ho et al. §4) and cosine ᾱ (Nichol & Dhariwal 2021 eq. 17,
//!   β clipped at `max_beta`). DDIM (Song et al. 2021) runs a sub-sequence of the timesteps.
//! - Flow matching / rectified flow: x_s = (1−s)x₀ + s ε, so x_s/(1−s) = x₀ + t ε, t = s/(1−s).
//!
//! A schedule yields decreasing noise levels t_0 > t_1 > … > t_{N−1}; a [`Convention`] turns
//! them into steps (t, Δt).
//!
//! This is the one schedule module: [`table`] holds the ᾱ table a denoiser was trained on (the
//! 8×8 toys' linear β, or a diffusers scheduler's β) for training and attacks, and [`diffusers`]
//! reads diffusers' `scheduler_config.json` into both.

use serde::{Deserialize, Serialize};
use std::f64::consts::FRAC_PI_2;

use crate::error::{Error, Result};
use crate::limits;

pub mod diffusers;
pub mod table;

/// How the DDIM sub-sequence of timesteps is chosen (names as in `diffusers`' `timestep_spacing`
/// and the DDIM paper's "quadratic" choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Spacing {
    /// τ_i = i·⌊T/S⌋, i = 0..S (diffusers "leading").
    #[default]
    Leading,
    /// τ_i = round(T − i·T/S) − 1 (diffusers "trailing"; includes the last timestep T−1).
    Trailing,
    /// τ_i = round(i·(T−1)/(S−1)) (diffusers "linspace").
    Linspace,
    /// τ_i = ⌊(i·√(0.8T)/(S−1))²⌋ (DDIM paper, "quadratic" for CIFAR-10).
    Quadratic,
}

/// The schedule part of a sampler configuration (`[schedule]`, tagged by `kind`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Schedule {
    /// EDM / Karras: `levels` = N noise levels from σ_max down to σ_min.
    Edm {
        /// Smallest noise level σ_min.
        sigma_min: f64,
        /// Largest noise level σ_max.
        sigma_max: f64,
        /// Karras ρ.
        rho: f64,
        /// Number of noise levels N.
        levels: usize,
    },
    /// DDPM with a linear β schedule over `timesteps` training steps; `levels` (default all)
    /// picks a DDIM sub-sequence with `spacing`.
    DdpmLinear {
        /// β of the first training step.
        beta_start: f64,
        /// β of the last training step.
        beta_end: f64,
        /// Number of training steps.
        timesteps: usize,
        #[serde(default)]
        /// Sampler levels (default: all training steps).
        levels: Option<usize>,
        #[serde(default)]
        /// How the DDIM sub-sequence is spaced.
        spacing: Spacing,
        #[serde(default, skip_serializing_if = "is_zero")]
        /// diffusers' `steps_offset`: added to every `leading` timestep (default 0).
        steps_offset: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        /// ᾱ as diffusers computes it (float32 β and 1 − β, cumulative product rounded to float32
        /// at every step, then promoted: [`diffusers_alphas_cumprod`]) instead of in f64; set for
        /// schedules read from a diffusers `scheduler_config.json` (default false).
        diffusers_float32: bool,
    },
    /// DDPM with Stable Diffusion's `scaled_linear` β: √β linear from √`beta_start` to
    /// √`beta_end` over `timesteps`, squared (diffusers `DDPMScheduler`); `levels` and `spacing`
    /// as for `ddpm_linear`.
    DdpmScaledLinear {
        /// β of the first training step.
        beta_start: f64,
        /// β of the last training step.
        beta_end: f64,
        /// Number of training steps.
        timesteps: usize,
        #[serde(default)]
        /// Sampler levels (default: all training steps).
        levels: Option<usize>,
        #[serde(default)]
        /// How the DDIM sub-sequence is spaced.
        spacing: Spacing,
        #[serde(default, skip_serializing_if = "is_zero")]
        /// diffusers' `steps_offset`: added to every `leading` timestep (default 0).
        steps_offset: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        /// ᾱ as diffusers computes it (float32 β and 1 − β, cumulative product rounded to float32
        /// at every step, then promoted: [`diffusers_alphas_cumprod`]) instead of in f64; set for
        /// schedules read from a diffusers `scheduler_config.json` (default false).
        diffusers_float32: bool,
    },
    /// DDPM with the cosine ᾱ schedule (offset `s`, β clipped at `max_beta`).
    DdpmCosine {
        #[serde(default = "default_cosine_s")]
        /// Offset s of the cosine schedule.
        s: f64,
        #[serde(default = "default_max_beta")]
        /// Largest β after clipping.
        max_beta: f64,
        /// Number of training steps.
        timesteps: usize,
        #[serde(default)]
        /// Sampler levels (default: all training steps).
        levels: Option<usize>,
        #[serde(default)]
        /// How the DDIM sub-sequence is spaced.
        spacing: Spacing,
        #[serde(default, skip_serializing_if = "is_zero")]
        /// diffusers' `steps_offset`: added to every `leading` timestep (default 0).
        steps_offset: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        /// ᾱ as diffusers computes it (float32 β and 1 − β, cumulative product rounded to float32
        /// at every step, then promoted: [`diffusers_alphas_cumprod`]) instead of in f64; set for
        /// schedules read from a diffusers `scheduler_config.json` (default false).
        diffusers_float32: bool,
    },
    /// Rectified flow / flow matching: `levels` equally spaced noise fractions from `s_max`
    /// down to `s_min` (both in (0, 1)).
    FlowMatching {
        /// Smallest noise fraction.
        s_min: f64,
        /// Largest noise fraction.
        s_max: f64,
        /// Number of levels.
        levels: usize,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_cosine_s() -> f64 {
    0.008
}
fn default_max_beta() -> f64 {
    0.999
}

/// Step conventions (../shared/reference/README.md). Levels t_0 > … > t_{N−1}.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Convention {
    /// A step from t_i to t_{i+1} uses t = t_i and Δt = t_i − t_{i+1} (N−1 steps).
    A,
    /// The same Δt with t = t_{i+1} (N−1 steps).
    B,
    /// Like A, plus the final step from t_{N−1} to 0 (Δt = t_{N−1}; N steps). The paper's
    /// §3.2 indexing Δt_i = t_i − t_{i−1} with t_{−1} = 0; gives its Figure 6 μ ≈ 787.6.
    C,
}

impl Convention {
    /// The convention's letter (`A`, `B` or `C`).
    pub fn as_str(self) -> &'static str {
        match self {
            Convention::A => "A",
            Convention::B => "B",
            Convention::C => "C",
        }
    }
    /// One line that every output prints.
    pub fn describe(self) -> &'static str {
        match self {
            Convention::A => "A: a step t_i → t_{i+1} uses t = t_i, Δt = t_i − t_{i+1} (N−1 steps)",
            Convention::B => "B: a step t_i → t_{i+1} uses t = t_{i+1}, Δt = t_i − t_{i+1} (N−1 steps)",
            Convention::C => {
                "C: a step t_i → t_{i+1} uses t = t_i, Δt = t_i − t_{i+1}, plus the final step t_{N−1} → 0 (N steps; paper §3.2)"
            }
        }
    }
}

/// One sampling step in generation order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Index in generation order (0 = the noisiest step).
    pub index: usize,
    /// Noise level the step starts from.
    pub t_from: f64,
    /// Noise level the step ends at.
    pub t_to: f64,
    /// The t used in the sensitivity formula (depends on the convention).
    pub t: f64,
    /// Step size Δt = t_from − t_to.
    pub dt: f64,
}

fn offset_note(steps_offset: usize) -> String {
    if steps_offset == 0 {
        String::new()
    } else {
        format!(", steps_offset {steps_offset}")
    }
}

/// ", ᾱ in float32 as diffusers computes it" where the schedule says so.
fn float32_note(diffusers_float32: bool) -> &'static str {
    if diffusers_float32 {
        ", ᾱ in float32 as diffusers computes it"
    } else {
        ""
    }
}

impl Schedule {
    /// Short human description.
    pub fn describe(&self) -> String {
        match self {
            Schedule::Edm {
                sigma_min,
                sigma_max,
                rho,
                levels,
            } => format!("EDM/Karras σ_min = {sigma_min}, σ_max = {sigma_max}, ρ = {rho}, N = {levels}"),
            Schedule::DdpmLinear {
                beta_start,
                beta_end,
                timesteps,
                levels,
                spacing,
                steps_offset,
                diffusers_float32,
            } => format!(
                "DDPM linear β {beta_start}..{beta_end}, T = {timesteps}, {} levels ({spacing:?} spacing{}), as t = √((1−ᾱ)/ᾱ){}",
                levels.unwrap_or(*timesteps),
                offset_note(*steps_offset),
                float32_note(*diffusers_float32)
            ),
            Schedule::DdpmScaledLinear {
                beta_start,
                beta_end,
                timesteps,
                levels,
                spacing,
                steps_offset,
                diffusers_float32,
            } => format!(
                "DDPM scaled-linear β ({beta_start}..{beta_end}, √β linear), T = {timesteps}, {} levels ({spacing:?} spacing{}), as t = √((1−ᾱ)/ᾱ){}",
                levels.unwrap_or(*timesteps),
                offset_note(*steps_offset),
                float32_note(*diffusers_float32)
            ),
            Schedule::DdpmCosine {
                s,
                max_beta,
                timesteps,
                levels,
                spacing,
                steps_offset,
                diffusers_float32,
            } => format!(
                "DDPM cosine (s = {s}, β ≤ {max_beta}), T = {timesteps}, {} levels ({spacing:?} spacing{}), as t = √((1−ᾱ)/ᾱ){}",
                levels.unwrap_or(*timesteps),
                offset_note(*steps_offset),
                float32_note(*diffusers_float32)
            ),
            Schedule::FlowMatching { s_min, s_max, levels } => {
                format!("flow matching s = {s_max}..{s_min}, N = {levels}, as t = s/(1−s)")
            }
        }
    }

    /// Number of noise levels N.
    pub fn n_levels(&self) -> usize {
        match self {
            Schedule::Edm { levels, .. } | Schedule::FlowMatching { levels, .. } => *levels,
            Schedule::DdpmLinear { levels, timesteps, .. }
            | Schedule::DdpmScaledLinear { levels, timesteps, .. }
            | Schedule::DdpmCosine { levels, timesteps, .. } => levels.unwrap_or(*timesteps),
        }
    }

    /// Checks every parameter; errors name the field (relative to `[schedule]`).
    pub fn validate(&self) -> Result<()> {
        let pos = |name: &str, v: f64| -> Result<()> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::field(name, format!("must be a finite number > 0, got {v}")))
            }
        };
        // Sizes are checked against the resource limits before anything is allocated.
        let levels_ok = |n: usize| -> Result<()> {
            if n < 2 {
                Err(Error::field("levels", format!("N must be ≥ 2 noise levels, got {n}")))
            } else {
                limits::check_count("levels", n as u64, limits::SCHEDULE_LEVEL)
            }
        };
        match self {
            Schedule::Edm {
                sigma_min,
                sigma_max,
                rho,
                levels,
            } => {
                pos("sigma_min", *sigma_min)?;
                pos("sigma_max", *sigma_max)?;
                pos("rho", *rho)?;
                if sigma_min >= sigma_max {
                    return Err(Error::field(
                        "sigma_min",
                        format!("σ_min must be < σ_max, got σ_min = {sigma_min} ≥ σ_max = {sigma_max}"),
                    ));
                }
                levels_ok(*levels)
            }
            Schedule::DdpmLinear {
                beta_start,
                beta_end,
                timesteps,
                levels,
                ..
            }
            | Schedule::DdpmScaledLinear {
                beta_start,
                beta_end,
                timesteps,
                levels,
                ..
            } => {
                for (n, v) in [("beta_start", beta_start), ("beta_end", beta_end)] {
                    if !(v.is_finite() && *v > 0.0 && *v < 1.0) {
                        return Err(Error::field(n, format!("β must be in (0, 1), got {v}")));
                    }
                }
                if *timesteps < 2 {
                    return Err(Error::field("timesteps", format!("must be ≥ 2, got {timesteps}")));
                }
                limits::check_count("timesteps", *timesteps as u64, limits::SCHEDULE_TIMESTEP)?;
                let n = levels.unwrap_or(*timesteps);
                levels_ok(n)?;
                if n > *timesteps {
                    return Err(Error::field(
                        "levels",
                        format!("a DDIM sub-sequence has at most T = {timesteps} levels, got {n}"),
                    ));
                }
                Ok(())
            }
            Schedule::DdpmCosine {
                s,
                max_beta,
                timesteps,
                levels,
                ..
            } => {
                if !(s.is_finite() && *s >= 0.0) {
                    return Err(Error::field("s", format!("must be finite and ≥ 0, got {s}")));
                }
                if !(*max_beta > 0.0 && *max_beta < 1.0) {
                    return Err(Error::field("max_beta", format!("must be in (0, 1), got {max_beta}")));
                }
                if *timesteps < 2 {
                    return Err(Error::field("timesteps", format!("must be ≥ 2, got {timesteps}")));
                }
                limits::check_count("timesteps", *timesteps as u64, limits::SCHEDULE_TIMESTEP)?;
                let n = levels.unwrap_or(*timesteps);
                levels_ok(n)?;
                if n > *timesteps {
                    return Err(Error::field(
                        "levels",
                        format!("a DDIM sub-sequence has at most T = {timesteps} levels, got {n}"),
                    ));
                }
                Ok(())
            }
            Schedule::FlowMatching { s_min, s_max, levels } => {
                for (n, v) in [("s_min", s_min), ("s_max", s_max)] {
                    if !(*v > 0.0 && *v < 1.0) {
                        return Err(Error::field(n, format!("must be in (0, 1), got {v}")));
                    }
                }
                if s_min >= s_max {
                    return Err(Error::field(
                        "s_min",
                        format!("s_min must be < s_max, got {s_min} ≥ {s_max}"),
                    ));
                }
                levels_ok(*levels)
            }
        }
    }

    /// ᾱ_k at every training step k = 0..T−1 of a DDPM schedule (`None` for the others): in f64
    /// from the f64 β (Ho et al. 2020 §4; Nichol & Dhariwal 2021 eq. 17), or, where
    /// `diffusers_float32`, as diffusers computes `alphas_cumprod` ([`diffusers_alphas_cumprod`]
    /// of its float32 β: [`torch_linspace_f32`] for linear, its square in float32 for
    /// scaled_linear, the f64 cosine β rounded to float32 for squaredcos_cap_v2).
    pub fn alpha_bar(&self) -> Option<Vec<f64>> {
        Some(match self {
            Schedule::DdpmLinear {
                beta_start,
                beta_end,
                timesteps,
                diffusers_float32,
                ..
            } => {
                if *diffusers_float32 {
                    diffusers_alphas_cumprod(&torch_linspace_f32(*beta_start, *beta_end, *timesteps))
                } else {
                    alpha_bar_from_betas(&linear_betas(*beta_start, *beta_end, *timesteps))
                }
            }
            Schedule::DdpmScaledLinear {
                beta_start,
                beta_end,
                timesteps,
                diffusers_float32,
                ..
            } => {
                if *diffusers_float32 {
                    // torch.linspace(√start, √end, T, dtype=float32) ** 2, squared in float32.
                    let roots = torch_linspace_f32(beta_start.sqrt(), beta_end.sqrt(), *timesteps);
                    diffusers_alphas_cumprod(&roots.iter().map(|r| r * r).collect::<Vec<f32>>())
                } else {
                    let betas: Vec<f64> = linear_betas(beta_start.sqrt(), beta_end.sqrt(), *timesteps)
                        .into_iter()
                        .map(|b| b * b)
                        .collect();
                    alpha_bar_from_betas(&betas)
                }
            }
            Schedule::DdpmCosine {
                s,
                max_beta,
                timesteps,
                diffusers_float32,
                ..
            } => {
                let betas = cosine_betas(*s, *max_beta, *timesteps);
                if *diffusers_float32 {
                    // diffusers' betas_for_alpha_bar works in Python floats, then torch.tensor(…, float32).
                    diffusers_alphas_cumprod(&betas.iter().map(|&b| b as f32).collect::<Vec<f32>>())
                } else {
                    alpha_bar_from_betas(&betas)
                }
            }
            Schedule::Edm { .. } | Schedule::FlowMatching { .. } => return None,
        })
    }

    /// Decreasing noise levels t_0 > … > t_{N−1} in the variance-exploding form.
    pub fn levels(&self) -> Result<Vec<f64>> {
        self.validate()?;
        let t = match self {
            Schedule::Edm {
                sigma_min,
                sigma_max,
                rho,
                levels,
            } => edm_levels(*sigma_min, *sigma_max, *rho, *levels),
            Schedule::DdpmLinear {
                timesteps,
                levels,
                spacing,
                steps_offset,
                ..
            }
            | Schedule::DdpmScaledLinear {
                timesteps,
                levels,
                spacing,
                steps_offset,
                ..
            }
            | Schedule::DdpmCosine {
                timesteps,
                levels,
                spacing,
                steps_offset,
                ..
            } => {
                let ab = self.alpha_bar().unwrap_or_default();
                let idx = ddim_timesteps(*timesteps, levels.unwrap_or(*timesteps), *spacing, *steps_offset)?;
                idx.iter().rev().map(|&k| ve_sigma(ab[k])).collect()
            }
            Schedule::FlowMatching { s_min, s_max, levels } => (0..*levels)
                .map(|i| {
                    let s = s_max + (i as f64) / ((*levels - 1) as f64) * (s_min - s_max);
                    s / (1.0 - s)
                })
                .collect(),
        };
        for w in t.windows(2) {
            if !(w[0] > w[1] && w[1] > 0.0 && w[0].is_finite()) {
                return Err(Error::field(
                    "levels",
                    format!(
                        "the schedule does not give strictly decreasing positive finite noise levels (… {} → {} …); \
                         choose fewer levels or another spacing",
                        w[0], w[1]
                    ),
                ));
            }
        }
        Ok(t)
    }
}

/// EDM / Karras et al. (2022) eq. (5) noise levels, i = 0..N−1 (decreasing).
pub(crate) fn edm_levels(sigma_min: f64, sigma_max: f64, rho: f64, n: usize) -> Vec<f64> {
    let a = sigma_max.powf(1.0 / rho);
    let b = sigma_min.powf(1.0 / rho);
    (0..n)
        .map(|i| (a + (i as f64) / ((n - 1) as f64) * (b - a)).powf(rho))
        .collect()
}

/// Ho et al. (2020) §4: β_k linear from `start` to `end` over `t` steps (k = 0..T−1).
pub(crate) fn linear_betas(start: f64, end: f64, t: usize) -> Vec<f64> {
    (0..t)
        .map(|k| start + (end - start) * (k as f64) / ((t - 1) as f64))
        .collect()
}

/// Nichol & Dhariwal (2021) eq. (17): ᾱ(u) = f(u)/f(0), f(u) = cos²((u/T + s)/(1 + s)·π/2),
/// β_k = min(1 − ᾱ((k+1)/T)/ᾱ(k/T), max_beta) for k = 0..T−1.
pub(crate) fn cosine_betas(s: f64, max_beta: f64, t: usize) -> Vec<f64> {
    let f = |u: f64| (((u + s) / (1.0 + s)) * FRAC_PI_2).cos().powi(2);
    (0..t)
        .map(|k| {
            let u1 = k as f64 / t as f64;
            let u2 = (k + 1) as f64 / t as f64;
            (1.0 - f(u2) / f(u1)).min(max_beta)
        })
        .collect()
}

/// ᾱ_k = Π_{j ≤ k} (1 − β_j), accumulated in log space.
pub fn alpha_bar_from_betas(betas: &[f64]) -> Vec<f64> {
    let mut acc = 0.0f64;
    betas
        .iter()
        .map(|b| {
            acc += (-b).ln_1p();
            acc.exp()
        })
        .collect()
}

/// torch.linspace(a, b, n, dtype=float32) as torch computes it on the CPU: a and b rounded to
/// float32, step = (b − a)/(n − 1) in float32, the first ⌊n/2⌋ values a + step·i and the others
/// b − step·(n − 1 − i), each one fused multiply-add (one rounding; checked bit for bit against
/// torch 2.15 by scripts/gen_diffusers_schedules.py's table, tests/integration/diffusers.rs).
pub fn torch_linspace_f32(a: f64, b: f64, n: usize) -> Vec<f32> {
    let (a, b) = (a as f32, b as f32);
    if n == 1 {
        return vec![a];
    }
    let step = (b - a) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, a)
            } else {
                (-step).mul_add((n - 1 - i) as f32, b)
            }
        })
        .collect()
}

/// ᾱ_t as diffusers' DDPMScheduler/DDIMScheduler compute `alphas_cumprod` from float32 β
/// (diffusers 0.42, torch 2.x on the CPU): α = 1 − β in float32, then torch.cumprod, which
/// accumulates in double and rounds every output to float32; promoted to f64 here. These are the
/// ᾱ the sampler actually uses (the f64 schedule differs by up to ≈ 7e-5 relative in μ for a
/// cosine schedule with T = 250).
pub fn diffusers_alphas_cumprod(betas: &[f32]) -> Vec<f64> {
    let mut acc = 1.0f64;
    betas
        .iter()
        .map(|&b| {
            acc *= (1.0f32 - b) as f64;
            acc as f32 as f64
        })
        .collect()
}

/// Variance-exploding noise level of a DDPM ᾱ: t = √((1 − ᾱ)/ᾱ).
pub(crate) fn ve_sigma(alpha_bar: f64) -> f64 {
    ((1.0 - alpha_bar) / alpha_bar).sqrt()
}

/// The timesteps diffusers' `DDIMScheduler`/`DDPMScheduler.set_timesteps(s)` (0.42.1) returns for
/// `num_train_timesteps = t`, in its (decreasing) order, with numpy's float arithmetic reproduced
/// operation by operation, so every value, ties included, is the one diffusers runs:
/// - `leading`: i·⌊t/s⌋ + `steps_offset`, i = s − 1, …, 0;
/// - `trailing`: `np.round(np.arange(t, 0, -t/s)) − 1`. numpy's float `arange` has
///   ⌈t/(t/s)⌉ elements (one more than s when t/(t/s) rounds above s, e.g. t = 1000, s = 61, whose
///   last element rounds to 0 and gives timestep −1) and fills them as t + i·d with
///   d = (t − t/s) − t (numpy's `DOUBLE_fill`);
/// - `linspace`: `np.linspace(0, t − 1, s).round()`, i.e. i·((t − 1)/(s − 1)) with the last value
///   set to t − 1 (0 alone when s = 1).
///
/// `np.round` rounds half to even ([`f64::round_ties_even`]). `steps_offset` shifts only `leading`
/// (as in diffusers). `quadratic` (not a diffusers spacing) is the DDIM paper's
/// ⌊(i·√(0.8t)/(s − 1))²⌋. Checked against diffusers on every row of
/// fixtures/reference/diffusers_timesteps.csv (scripts/gen_diffusers_timesteps.py).
pub fn diffusers_timesteps(t: usize, s: usize, spacing: Spacing, steps_offset: usize) -> Vec<i64> {
    if s == 0 || t == 0 {
        return Vec::new();
    }
    let (tf, sf) = (t as f64, s as f64);
    let mut v: Vec<i64> = match spacing {
        Spacing::Leading => {
            let c = (t / s) as i64;
            (0..s as i64).map(|i| i * c + steps_offset as i64).collect()
        }
        Spacing::Trailing => {
            let step = -(tf / sf);
            // numpy `_calc_length`: ceil((stop − start)/step); then buffer[0] = start,
            // buffer[1] = start + step, buffer[i] = start + i·(buffer[1] − buffer[0]).
            let n = ((0.0 - tf) / step).ceil().max(0.0) as usize;
            let next = tf + step;
            let d = next - tf;
            let vals = (0..n).map(|i| match i {
                0 => tf,
                1 => next,
                _ => tf + i as f64 * d,
            });
            let mut out: Vec<i64> = vals.map(|x| x.round_ties_even() as i64 - 1).collect();
            out.reverse();
            out
        }
        Spacing::Linspace => {
            if s == 1 {
                vec![0]
            } else {
                let step = (tf - 1.0) / (sf - 1.0);
                (0..s)
                    .map(|i| {
                        let x = if i == s - 1 { tf - 1.0 } else { i as f64 * step };
                        x.round_ties_even() as i64
                    })
                    .collect()
            }
        }
        Spacing::Quadratic => {
            let top = (0.8 * tf).sqrt();
            (0..s)
                .map(|i| {
                    let x = if s == 1 { 0.0 } else { i as f64 * top / (sf - 1.0) };
                    (x * x).floor() as i64
                })
                .collect()
        }
    };
    v.reverse();
    v
}

/// DDIM sub-sequence of `s` timesteps out of `t` (increasing, 0-based indices into ᾱ): exactly
/// the timesteps of [`diffusers_timesteps`], refused (naming `levels`) where diffusers would run
/// a timestep outside 0..t (−1 from numpy's `arange` length, or t from `steps_offset`), repeat
/// one, or run a count other than `s`.
pub fn ddim_timesteps(t: usize, s: usize, spacing: Spacing, steps_offset: usize) -> Result<Vec<usize>> {
    if s < 2 || s > t {
        return Err(Error::field("levels", format!("need 2 ≤ levels ≤ T = {t}, got {s}")));
    }
    let raw = diffusers_timesteps(t, s, spacing, steps_offset);
    if raw.len() != s || raw.iter().any(|&k| k < 0 || k >= t as i64) {
        let (lo, hi) = (
            raw.iter().min().copied().unwrap_or(0),
            raw.iter().max().copied().unwrap_or(0),
        );
        return Err(Error::field(
            "levels",
            format!(
                "{spacing:?} spacing of {s} out of {t} timesteps (steps_offset {steps_offset}) gives {} timesteps \
                 from {hi} down to {lo} in diffusers (numpy's float arange/rounding): outside 0..{} or not {s} \
                 steps; diffusers would index ᾱ out of range, so this schedule is refused; choose another \
                 number of steps",
                raw.len(),
                t - 1
            ),
        ));
    }
    let mut v: Vec<usize> = raw.iter().map(|&k| k as usize).collect();
    v.sort_unstable();
    let before = v.len();
    v.dedup();
    if v.len() != before {
        return Err(Error::field(
            "levels",
            format!("{spacing:?} spacing of {s} out of {t} timesteps repeats a timestep; use fewer levels"),
        ));
    }
    Ok(v)
}

/// Turns decreasing levels into steps under `convention`.
pub fn steps(levels: &[f64], convention: Convention) -> Vec<Step> {
    let mut out: Vec<Step> = levels
        .windows(2)
        .enumerate()
        .map(|(i, w)| Step {
            index: i,
            t_from: w[0],
            t_to: w[1],
            t: if convention == Convention::B { w[1] } else { w[0] },
            dt: w[0] - w[1],
        })
        .collect();
    if convention == Convention::C {
        if let Some(&last) = levels.last() {
            out.push(Step {
                index: out.len(),
                t_from: last,
                t_to: 0.0,
                t: last,
                dt: last,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    #[test]
    fn edm_endpoints_and_monotone() {
        let t = edm_levels(0.002, 80.0, 7.0, 50);
        assert!(rel(t[0], 80.0) < 1e-14 && rel(t[49], 0.002) < 1e-12);
        assert!(t.windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn ddpm_linear_alpha_bar_matches_product() {
        // Closed form: ᾱ_k = Π_{j≤k}(1 − β_j) with β_j = 1e-4 + (0.02 − 1e-4)·j/999.
        let b = linear_betas(1e-4, 0.02, 1000);
        let ab = alpha_bar_from_betas(&b);
        for &k in &[0usize, 1, 10, 499, 999] {
            let mut p = 1.0f64;
            for j in 0..=k {
                p *= 1.0 - (1e-4 + (0.02 - 1e-4) * j as f64 / 999.0);
            }
            assert!(rel(ab[k], p) < 1e-12, "k={k} {} {}", ab[k], p);
        }
        // The well-known values: ᾱ_0 = 0.9999, ᾱ_999 ≈ 4.04e-5 (Ho et al. schedule).
        assert!(rel(ab[0], 0.9999) < 1e-15);
        assert!(ab[999] > 4.0e-5 && ab[999] < 4.1e-5, "{}", ab[999]);
        assert!(rel(ve_sigma(ab[0]), (1e-4f64 / 0.9999).sqrt()) < 1e-12);
    }

    #[test]
    fn cosine_alpha_bar_matches_closed_form_where_unclipped() {
        let (s, t) = (0.008, 1000);
        let ab = alpha_bar_from_betas(&cosine_betas(s, 0.999, t));
        let f = |u: f64| (((u + s) / (1.0 + s)) * FRAC_PI_2).cos().powi(2);
        for k in [0usize, 10, 100, 500, 900, 990] {
            let closed = f((k + 1) as f64 / t as f64) / f(0.0);
            assert!(rel(ab[k], closed) < 1e-9, "k={k} {} {}", ab[k], closed);
        }
        // The last β is clipped at 0.999 (f(1) = 0), so ᾱ_{T−1} = ᾱ_{T−2}·0.001 > 0.
        assert!(rel(ab[t - 1], ab[t - 2] * 0.001) < 1e-9);
    }

    #[test]
    fn ddim_subsequences() {
        assert_eq!(ddim_timesteps(1000, 50, Spacing::Leading, 0).unwrap()[..3], [0, 20, 40]);
        assert_eq!(
            *ddim_timesteps(1000, 50, Spacing::Leading, 0).unwrap().last().unwrap(),
            980
        );
        let tr = ddim_timesteps(1000, 50, Spacing::Trailing, 0).unwrap();
        assert_eq!((tr[0], *tr.last().unwrap(), tr.len()), (19, 999, 50));
        let ls = ddim_timesteps(1000, 10, Spacing::Linspace, 0).unwrap();
        assert_eq!(ls, vec![0, 111, 222, 333, 444, 555, 666, 777, 888, 999]);
        // DDIM paper quadratic: ((linspace(0, √(0.8T), S))²).astype(int)
        let q = ddim_timesteps(1000, 5, Spacing::Quadratic, 0).unwrap();
        assert_eq!(q, vec![0, 50, 200, 450, 800]);
        assert!(ddim_timesteps(10, 11, Spacing::Leading, 0).is_err());
    }

    #[test]
    fn ddim_levels_are_the_full_schedule_subset() {
        let full = Schedule::DdpmLinear {
            beta_start: 1e-4,
            beta_end: 0.02,
            timesteps: 1000,
            levels: None,
            spacing: Spacing::Leading,
            steps_offset: 0,
            diffusers_float32: false,
        }
        .levels()
        .unwrap();
        let sub = Schedule::DdpmLinear {
            beta_start: 1e-4,
            beta_end: 0.02,
            timesteps: 1000,
            levels: Some(50),
            spacing: Spacing::Leading,
            steps_offset: 0,
            diffusers_float32: false,
        }
        .levels()
        .unwrap();
        assert_eq!(sub.len(), 50);
        // Decreasing order: sub[i] is timestep 980 − 20 i, full[i] is timestep 999 − i.
        for (i, v) in sub.iter().enumerate() {
            assert_eq!(*v, full[999 - (980 - 20 * i)]);
        }
    }

    #[test]
    fn flow_matching_mapping() {
        let t = Schedule::FlowMatching {
            s_min: 0.01,
            s_max: 0.99,
            levels: 3,
        }
        .levels()
        .unwrap();
        assert!(rel(t[0], 99.0) < 1e-12 && rel(t[1], 1.0) < 1e-12 && rel(t[2], 0.01 / 0.99) < 1e-12);
    }

    #[test]
    fn conventions() {
        let lv = [4.0, 2.0, 1.0];
        let a = steps(&lv, Convention::A);
        let b = steps(&lv, Convention::B);
        let c = steps(&lv, Convention::C);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].t, a[0].dt, b[0].t, b[0].dt), (4.0, 2.0, 2.0, 2.0));
        assert_eq!(c.len(), 3);
        assert_eq!((c[2].t, c[2].dt, c[2].t_to), (1.0, 1.0, 0.0));
    }

    #[test]
    fn ddpm_ancestral_step_lies_between_conventions_a_and_b() {
        // The ancestral step k → k−1 in the variance-exploding form x/√ᾱ: mean weight on the
        // denoiser w = 1 − (t_{k−1}/t_k)², posterior noise variance t_{k−1}²(t_k² − t_{k−1}²)/t_k²
        // (Ho et al. 2020 eq. 7 rewritten), so per unit sensitivity μ = √(t_k² − t_{k−1}²)/(t_k t_{k−1}).
        // Convention A (√(2Δt/t_k³)) is below it and B (√(2Δt/t_{k−1}³)) above it: B is the safe side.
        let lv = Schedule::DdpmLinear {
            beta_start: 1e-4,
            beta_end: 0.02,
            timesteps: 1000,
            levels: Some(50),
            spacing: Spacing::Leading,
            steps_offset: 0,
            diffusers_float32: false,
        }
        .levels()
        .unwrap();
        let a = steps(&lv, Convention::A);
        let b = steps(&lv, Convention::B);
        for (sa, sb) in a.iter().zip(&b) {
            let (hi, lo) = (sa.t_from, sa.t_to);
            let w = 1.0 - (lo / hi).powi(2);
            let sd = lo * (hi * hi - lo * lo).sqrt() / hi;
            let exact = w / sd;
            let ma = (2.0 * sa.dt / sa.t.powi(3)).sqrt();
            let mb = (2.0 * sb.dt / sb.t.powi(3)).sqrt();
            assert!(
                ma <= exact * (1.0 + 1e-12) && exact <= mb * (1.0 + 1e-12),
                "{hi} → {lo}: {ma} {exact} {mb}"
            );
        }
    }

    #[test]
    fn validation_names_fields() {
        let e = Schedule::Edm {
            sigma_min: 80.0,
            sigma_max: 80.0,
            rho: 7.0,
            levels: 50,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("sigma_min"));
        let e = Schedule::Edm {
            sigma_min: 0.002,
            sigma_max: 80.0,
            rho: 7.0,
            levels: 1,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("levels"));
    }
}
