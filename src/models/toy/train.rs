//! The DDPM loss of the 8×8 denoisers (Ho et al. 2020, Algorithm 1): batches of
//! (√ᾱ_t x₀ + √(1−ᾱ_t) ε, t, ε) and ‖ε − ε_θ(x_t, t)‖², and its fixed evaluation. The loops (Adam,
//! the weight average, DP-SGD) are the orchestrator's ([`crate::models::train`]).
//!
//! All randomness comes from seeded ChaCha streams on the host, so a run is reproducible from its
//! seed whatever the device.

use candle_core::{Tensor, Var};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::Result;

use super::{Net, PIXELS};
use crate::diffusion::schedule::table::{noisy, TrainingSchedule};
use crate::models::dp::normals;

/// A batch for the ε-prediction loss: (x_t, t as f32, ε) tensors on the net's device.
pub struct Batch {
    /// Noised inputs x_t.
    pub xt: Tensor,
    /// Timesteps as f32.
    pub t: Tensor,
    /// Noise targets ε.
    pub eps: Tensor,
}

impl Batch {
    /// A batch on the net's device from row-major slices.
    pub fn new(net: &Net, schedule: &TrainingSchedule, x0: &[f32], t: &[usize], eps: &[f32]) -> Result<Self> {
        let n = t.len();
        let dev = net.device();
        let xt = noisy(schedule, x0, t, eps);
        Ok(Batch {
            xt: Tensor::from_vec(xt, (n, PIXELS), dev)?,
            t: Tensor::from_vec(t.iter().map(|&v| v as f32).collect::<Vec<_>>(), n, dev)?,
            eps: Tensor::from_slice(eps, (n, PIXELS), dev)?,
        })
    }
}

/// Mean ε-prediction loss of a batch (a scalar tensor with a graph).
pub fn batch_loss(net: &Net, b: &Batch) -> Result<Tensor> {
    let pred = net.forward(&b.xt, &b.t)?;
    Ok((pred - &b.eps)?.sqr()?.mean_all()?)
}

/// A fixed evaluation of the denoising loss: `draws` (t, ε) pairs per row, t over
/// `t_min..=t_max`, from `seed` (the same pairs before and after training).
pub fn eval_loss(
    net: &Net,
    schedule: &TrainingSchedule,
    x0: &[f32],
    t_min: usize,
    t_max: usize,
    seed: u64,
    draws: usize,
) -> Result<f64> {
    let n = x0.len() / PIXELS;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_e7a1);
    let mut total = 0.0;
    let mut count = 0usize;
    for _ in 0..draws {
        let t: Vec<usize> = (0..n).map(|_| rng.random_range(t_min..=t_max)).collect();
        let eps = normals(&mut rng, n * PIXELS);
        let b = Batch::new(net, schedule, x0, &t, &eps)?;
        total += batch_loss(net, &b)?.to_scalar::<f32>()? as f64 * n as f64;
        count += n;
    }
    Ok(total / count as f64)
}

/// Copies parameter values from `src` into `dst` (same architecture).
pub fn copy_params(dst: &Net, src: &Net) -> Result<()> {
    dst.params.assign(&src.params.tensors())
}

/// The variables of a net, in store order (for optimisers and gradient stores).
pub fn vars(net: &Net) -> Vec<(String, Var)> {
    net.params.vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::schedule::table::TrainingScheduleConfig;
    use crate::models::toy::{Arch, ModelConfig};
    use crate::models::train;
    use candle_core::Device;

    #[test]
    fn short_run_reduces_loss_on_synthetic_data() {
        let sched = TrainingSchedule::new(TrainingScheduleConfig::default()).unwrap();
        let cfg = ModelConfig {
            arch: Arch::Mlp,
            hidden: 64,
            depth: 1,
            time_dim: 16,
            channels: 8,
        };
        let net = Net::new(&cfg, 1, &Device::Cpu).unwrap();
        // Two prototype images.
        let mut x0 = Vec::new();
        for i in 0..32 {
            for j in 0..PIXELS {
                x0.push(if (j + i % 2) % 2 == 0 { 0.8 } else { -0.8 });
            }
        }
        let before = eval_loss(&net, &sched, &x0, 0, 999, 5, 4).unwrap();
        let mut fam = crate::models::toy::run::ToyFamily::new(net.clone(), sched.clone(), Default::default(), None);
        let vars: Vec<Var> = net.params.all_vars();
        let mut opt = train::adam(vars.clone(), 2e-3).unwrap();
        let mut ema = train::Ema::new(vars, 0.0).unwrap();
        train::plain(
            &mut fam,
            &x0,
            150,
            32,
            (0, 999),
            5,
            &mut opt,
            &mut ema,
            None,
            |_, _, _| Ok(()),
        )
        .unwrap();
        let after = eval_loss(&net, &sched, &x0, 0, 999, 5, 4).unwrap();
        assert!(after < 0.8 * before, "{before} -> {after}");
    }
}
