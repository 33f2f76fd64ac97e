//! Per-step sensitivity of diffusion sampling with the empirical denoiser.
//!
//! diffusion-sampling-privacy.md §3.1, eq. (5) and the display after it: one denoising step with
//! the clipped empirical denoiser is a Gaussian mechanism whose sum has sensitivity 2C/|D| and
//! whose noise has standard deviation p_t(x_t)·√(t³/(2Δt)), hence it is μ_t-GDP with
//!
//!   μ_t = 2C / (p_t(x_t)·|D|) · √(2Δt / t³).
//!
//! §3.2: the steps compose as √(Σ μ_{t_i}²) (Dong–Roth–Su Cor. 3.3).

use serde::{Deserialize, Serialize};

use super::sampler::PrivacyConfig;
use super::schedule::Step;

/// √(2Δt/t³), the schedule part of μ_t (§3.1).
pub(crate) fn schedule_factor(t: f64, dt: f64) -> f64 {
    (2.0 * dt / (t * t * t)).sqrt()
}

/// μ_t = 2C/(β|D|)·√(2Δt/t³) for a constant density p_t ≡ β (§3.1, §6 "we fix p(x_t) to a
/// constant β = 1").
pub fn mu_constant(clip_norm: f64, beta: f64, dataset_size: f64, t: f64, dt: f64) -> f64 {
    2.0 * clip_norm / (beta * dataset_size) * schedule_factor(t, dt)
}

/// ln μ_t = ln 2 + ln C − ln p_t(x_t) − ln|D| + ½ ln(2Δt/t³), all in log space so that
/// densities far outside f64 range (d = 64 and t = 80 give ln p ≈ −340) stay usable (§3.1).
pub(crate) fn log_mu(log_clip: f64, log_density: f64, dataset_size: f64, t: f64, dt: f64) -> f64 {
    std::f64::consts::LN_2 + log_clip - log_density - dataset_size.ln() + 0.5 * (2.0 * dt / (t * t * t)).ln()
}

/// Which of the steps that run use the private empirical denoiser, and which run at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepRole {
    /// Run by the public (non-private) denoiser before the switch: costs nothing.
    Public,
    /// Run by the empirical denoiser over the private data.
    Private,
    /// Not run (after the private window, or after the early stop).
    Skipped,
}

/// Index of the first private step: ⌊switch_at·n⌉ (round half up) — "switch after x % of the
/// generation" (Appendix D).
pub(crate) fn switch_index(n_steps: usize, switch_at: f64) -> usize {
    ((switch_at * n_steps as f64).round() as usize).min(n_steps)
}

/// Roles of `steps` under the hybrid/early-stop settings of `privacy`:
/// - steps whose start level is ≤ `stop_at` do not run (sampling stops at the first level
///   ≤ `stop_at`);
/// - steps with index ≥ `stop_step` do not run;
/// - the first `switch_step` (else ⌊switch_at·n⌉) steps are public;
/// - then `private_steps` (default: all the rest) run the empirical denoiser; with a limited
///   count the remaining steps are public again (the paper's single-step variant, App. D).
pub fn roles(steps: &[Step], privacy: &PrivacyConfig) -> Vec<StepRole> {
    let k0 = privacy
        .switch_step
        .map(|k| k.min(steps.len()))
        .unwrap_or_else(|| switch_index(steps.len(), privacy.switch_at));
    let k1 = match privacy.private_steps {
        Some(k) => k0.saturating_add(k).min(steps.len()),
        None => steps.len(),
    };
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if privacy.stop_at.is_some_and(|stop| s.t_from <= stop) || privacy.stop_step.is_some_and(|k| i >= k) {
                StepRole::Skipped
            } else if i >= k0 && i < k1 {
                StepRole::Private
            } else {
                StepRole::Public
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::schedule::{edm_levels, steps, Convention};

    fn privacy() -> PrivacyConfig {
        PrivacyConfig {
            clip_norm: 1.0,
            clip_scale: Default::default(),
            dataset_size: Some(50_000),
            subsample_rate: 1.0,
            samples: 1,
            switch_at: 0.0,
            switch_step: None,
            stop_step: None,
            private_steps: None,
            stop_at: None,
        }
    }

    #[test]
    fn paper_figure6_mu() {
        // Reference README: convention C with 2C/(β|D|) = 1, σ_min = 0.002 → μ ≈ 787.6.
        let st = steps(&edm_levels(0.002, 80.0, 7.0, 50), Convention::C);
        let mu: f64 = st
            .iter()
            .map(|s| schedule_factor(s.t, s.dt).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((mu - 787.6).abs() < 0.1, "{mu}");
    }

    #[test]
    fn log_mu_matches_direct() {
        let (c, p, n, t, dt) = (3.0, 0.25, 1000.0, 0.7, 0.1);
        let a = mu_constant(c, p, n, t, dt);
        let b = log_mu(c.ln(), p.ln(), n, t, dt).exp();
        assert!((a - b).abs() / a < 1e-14);
    }

    #[test]
    fn hybrid_roles() {
        let st = steps(&edm_levels(0.002, 80.0, 7.0, 11), Convention::A);
        let mut p = privacy();
        p.switch_at = 0.5;
        p.private_steps = Some(2);
        let r = roles(&st, &p);
        assert_eq!(r.iter().filter(|x| **x == StepRole::Private).count(), 2);
        assert_eq!(r[5], StepRole::Private);
        assert_eq!(r[4], StepRole::Public);
        assert_eq!(r[7], StepRole::Public);
        p.private_steps = None;
        p.stop_at = Some(st[8].t_from);
        let r = roles(&st, &p);
        assert_eq!(r[7], StepRole::Private);
        assert_eq!(r[8], StepRole::Skipped);
        // The integer forms: first private step 5, stop after 7 steps.
        p.stop_at = None;
        p.switch_at = 0.0;
        p.switch_step = Some(5);
        p.stop_step = Some(7);
        let r = roles(&st, &p);
        assert_eq!(
            (r[4], r[5], r[6], r[7]),
            (
                StepRole::Public,
                StepRole::Private,
                StepRole::Private,
                StepRole::Skipped
            )
        );
    }
}
