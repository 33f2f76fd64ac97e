//! Theoretical limits on membership inference: the limits implied by an accounted guarantee
//! ([`crate::accountants::attack_limits`], re-exported here) and the per-step μ of the
//! empirical-denoiser sampler on a model's DDPM schedule.

pub use crate::accountants::attack_limits::*;

/// Per-step μ of the empirical-denoiser sampler run from step T−1 down to `stop` on a DDPM
/// schedule, every `stride` steps: μ_i = 2C/(p_t·|D|)·√(2Δt_i/t_i³) with t = σ_t =
/// √((1−ᾱ)/ᾱ) the VE time of the step's marginal (diffusion-sampling-privacy §3.1–3.2, Eq. 5 and
/// the multi-step μ_{t_i}); at least one step runs.
pub fn sampler_step_mus(
    schedule: &crate::diffusion::schedule::table::TrainingSchedule,
    stop: usize,
    stride: usize,
    n: usize,
    clip: f64,
    p_t: f64,
) -> Vec<f64> {
    let stride = stride.max(1);
    let mut s = schedule.len() - 1;
    let mut mus = Vec::new();
    loop {
        let next = s.saturating_sub(stride);
        let (ti, tn) = (schedule.sigma(s), schedule.sigma(next));
        let dt = ti - tn;
        mus.push(2.0 * clip / (p_t * n as f64) * (2.0 * dt / (ti * ti * ti)).sqrt());
        s = next;
        if s <= stop || s == 0 {
            break;
        }
    }
    mus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_mu_grows_as_sampling_proceeds() {
        let s = crate::diffusion::schedule::table::TrainingSchedule::new(Default::default()).unwrap();
        let late = sampler_step_mus(&s, 250, 10, 400, 1.0, 1.0);
        let early = sampler_step_mus(&s, 750, 10, 400, 1.0, 1.0);
        let tot = |m: &[f64]| m.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(tot(&late) > tot(&early));
        assert_eq!(early.len(), 25);
        assert!(sampler_asr(&late, 1.0, 1e-5).unwrap().unwrap().0 >= 0.5);
    }
}
