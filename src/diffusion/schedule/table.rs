//! The ᾱ table of a trained denoiser (the DDPM forward process it was trained on), for training
//! and attacks; the noise levels of *sampling* are the parent module's [`super::TrainingSchedule`].
//!
//! Timesteps are 0-indexed as in common DDPM code: step `t ∈ {0, …, T−1}` has
//! ᾱ_t = ∏_{τ ≤ t} (1 − β_τ) with β linear from `beta_start` to `beta_end` (Ho et al. 2020, §4),
//! and x_t = √ᾱ_t x₀ + √(1 − ᾱ_t) ε. Clean data sits "at −1" (ᾱ = 1).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Linear β schedule parameters (stored in checkpoint cards).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingScheduleConfig {
    /// Number of diffusion steps T.
    pub timesteps: usize,
    /// β at the first step.
    pub beta_start: f64,
    /// β at the last step.
    pub beta_end: f64,
}

impl Default for TrainingScheduleConfig {
    fn default() -> Self {
        TrainingScheduleConfig {
            timesteps: 1000,
            beta_start: 1e-4,
            beta_end: 0.02,
        }
    }
}

/// ᾱ_t = Π_{s ≤ t} (1 − β_s) as a running product in f64 (Ho et al. 2020, §2: the table the
/// model was trained on; the sampler's [`super::alpha_bar_from_betas`] sums logarithms instead).
fn cumprod(betas: &[f64]) -> Vec<f64> {
    let mut alpha_bars = Vec::with_capacity(betas.len());
    let mut acc = 1.0f64;
    for b in betas {
        acc *= 1.0 - b;
        alpha_bars.push(acc);
    }
    alpha_bars
}

/// A materialised schedule: β_t and ᾱ_t for every step.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingSchedule {
    /// The parameters.
    pub config: TrainingScheduleConfig,
    /// β_t for t = 0..T.
    pub betas: Vec<f64>,
    /// ᾱ_t = Π(1 − β_s) for t = 0..T.
    pub alpha_bars: Vec<f64>,
}

impl TrainingSchedule {
    /// Materialises β_t and ᾱ_t; errors on invalid parameters.
    pub fn new(config: TrainingScheduleConfig) -> Result<Self> {
        let TrainingScheduleConfig {
            timesteps,
            beta_start,
            beta_end,
        } = config;
        if timesteps < 2 {
            return Err(Error::field(
                "schedule.timesteps",
                format!("must be ≥ 2, got {timesteps}"),
            ));
        }
        crate::limits::check_count("schedule.timesteps", timesteps as u64, crate::limits::SCHEDULE_TIMESTEP)?;
        if !(beta_start > 0.0 && beta_start <= beta_end && beta_end < 1.0) {
            return Err(Error::field(
                "schedule.beta_start",
                format!("need 0 < beta_start ≤ beta_end < 1, got {beta_start} and {beta_end}"),
            ));
        }
        let betas = super::linear_betas(beta_start, beta_end, timesteps);
        let alpha_bars = cumprod(&betas);
        Ok(TrainingSchedule {
            config,
            betas,
            alpha_bars,
        })
    }

    /// T, the number of steps.
    pub fn len(&self) -> usize {
        self.betas.len()
    }

    /// True when T = 0 (never after `new`).
    pub fn is_empty(&self) -> bool {
        self.betas.is_empty()
    }

    /// ᾱ at step `t`; `None` means clean data (ᾱ = 1).
    pub fn alpha_bar(&self, t: Option<usize>) -> f64 {
        t.map_or(1.0, |t| self.alpha_bars[t])
    }

    /// The variance-exploding noise level σ_t = √((1 − ᾱ_t)/ᾱ_t) of the same marginal
    /// (x_t/√ᾱ_t = x₀ + σ_t ε), used to place DDPM steps on the EDM time axis t = σ.
    pub fn sigma(&self, t: usize) -> f64 {
        super::ve_sigma(self.alpha_bars[t])
    }

    /// Parses a timestep given as an integer or as a fraction of T ("T", "3T/4", "T/2", "0.25T").
    pub fn parse_timestep(&self, s: &str) -> Result<usize> {
        let t = self.len();
        let s = s.trim();
        let bad = || {
            Error::field(
                "--timesteps",
                format!("`{s}` is not a timestep (use 0..{}, or T, 3T/4, T/2, T/4)", t - 1),
            )
        };
        let v = if let Some(rest) = s.strip_suffix('T').or_else(|| s.strip_suffix('t')) {
            // "T", "0.25T"
            let f = if rest.is_empty() {
                1.0
            } else {
                rest.parse::<f64>().map_err(|_| bad())?
            };
            // A fraction of T is at most T itself (the last step, below).
            if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
                return Err(bad());
            }
            (f * t as f64).round() as i64
        } else if let Some((num, den)) = s.split_once('/') {
            let num = num.trim();
            let f_num = if num == "T" || num == "t" {
                1.0
            } else if let Some(n) = num.strip_suffix('T').or_else(|| num.strip_suffix('t')) {
                n.parse::<f64>().map_err(|_| bad())?
            } else {
                return Err(bad());
            };
            let d: f64 = den.trim().parse().map_err(|_| bad())?;
            // NaN and infinities are not steps (NaN would otherwise round to step 0).
            if !(d.is_finite() && d > 0.0 && f_num.is_finite() && f_num >= 0.0 && f_num <= d) {
                return Err(bad());
            }
            (f_num * t as f64 / d).round() as i64
        } else {
            let v = s.parse::<i64>().map_err(|_| bad())?;
            if v >= t as i64 {
                return Err(bad());
            }
            v
        };
        // "T" (a fraction of at most 1) means the last step T−1; an integer ≥ T was refused.
        let v = v.min(t as i64 - 1);
        if v < 0 {
            return Err(bad());
        }
        Ok(v as usize)
    }
}

/// x_t = √ᾱ_t x₀ + √(1−ᾱ_t) ε, row by row (host); rows have `x0.len() / t.len()` values.
pub fn noisy(schedule: &TrainingSchedule, x0: &[f32], t: &[usize], eps: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x0.len());
    let d = x0.len() / t.len().max(1);
    for (i, &ti) in t.iter().enumerate() {
        let a = schedule.alpha_bars[ti];
        let (sa, sb) = (a.sqrt() as f32, (1.0 - a).sqrt() as f32);
        for j in 0..d {
            let k = i * d + j;
            out.push(sa * x0[k] + sb * eps[k]);
        }
    }
    out
}

/// The model-side ᾱ table of a diffusers scheduler (the scheduler file is read in
/// [`super::diffusers`]).
impl super::diffusers::SchedulerConfig {
    /// The ᾱ table for attacks (0-indexed steps, as [`TrainingSchedule`]).
    pub fn schedule(&self, path: &std::path::Path) -> Result<TrainingSchedule> {
        let betas = self.betas();
        if let Some((i, b)) = betas.iter().enumerate().find(|(_, b)| !(**b > 0.0 && **b < 1.0)) {
            return Err(Error::field("beta_schedule", format!("β at step {i} is {b}, outside (0, 1)")).with_file(path));
        }
        let alpha_bars = cumprod(&betas);
        Ok(TrainingSchedule {
            config: TrainingScheduleConfig {
                timesteps: self.num_train_timesteps,
                beta_start: betas[0],
                beta_end: betas[betas.len() - 1],
            },
            betas,
            alpha_bars,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_schedule_endpoints() {
        let s = TrainingSchedule::new(TrainingScheduleConfig::default()).unwrap();
        assert_eq!(s.len(), 1000);
        assert!((s.betas[0] - 1e-4).abs() < 1e-15);
        assert!((s.betas[999] - 0.02).abs() < 1e-15);
        // ᾱ_T for the standard schedule is ≈ 4.0e-5 (Ho et al. 2020 use it so x_T ≈ N(0, I)).
        assert!(
            s.alpha_bars[999] < 5e-5 && s.alpha_bars[999] > 3e-5,
            "{}",
            s.alpha_bars[999]
        );
        assert!(s.alpha_bars.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn timestep_parsing() {
        let s = TrainingSchedule::new(TrainingScheduleConfig::default()).unwrap();
        assert_eq!(s.parse_timestep("T").unwrap(), 999);
        assert_eq!(s.parse_timestep("3T/4").unwrap(), 750);
        assert_eq!(s.parse_timestep("T/2").unwrap(), 500);
        assert_eq!(s.parse_timestep("T/4").unwrap(), 250);
        assert_eq!(s.parse_timestep("0.1T").unwrap(), 100);
        assert_eq!(s.parse_timestep("42").unwrap(), 42);
        assert!(s.parse_timestep("x").is_err());
        assert!(s.parse_timestep("-3").is_err());
        assert!(s.parse_timestep("1000").is_err());
        // Fractions above T are refused like integers ≥ T, with the same message.
        assert_eq!(s.parse_timestep("1T").unwrap(), 999);
        assert_eq!(s.parse_timestep("4T/4").unwrap(), 999);
        for above in ["1.5T", "5T/4", "1.001T", "T/0.5"] {
            let e = s.parse_timestep(above).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("field `--timesteps`: `{above}` is not a timestep (use 0..999, or T, 3T/4, T/2, T/4)")
            );
        }
    }

    #[test]
    fn linear_betas_match_the_ddpm_schedule() {
        let sc = crate::diffusion::schedule::diffusers::SchedulerConfig::parse(
            r#"{"_class_name": "DDPMScheduler", "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear", "num_train_timesteps": 1000}"#,
            std::path::Path::new("s.json"),
        )
        .unwrap();
        let ours = TrainingSchedule::new(TrainingScheduleConfig::default()).unwrap();
        let theirs = sc.schedule(std::path::Path::new("s.json")).unwrap();
        for (a, b) in ours.alpha_bars.iter().zip(&theirs.alpha_bars) {
            assert!((a - b).abs() < 1e-15);
        }
    }
}
