//! DDPM training of ε-prediction denoisers (Ho et al. 2020, Algorithm 1): draw x₀, t ~ U{lo..hi},
//! ε ~ N(0, I), minimise ‖ε − ε_θ(√ᾱ_t x₀ + √(1−ᾱ_t) ε, t)‖² with Adam, and keep an exponential
//! moving average (EMA) of the weights, which is what checkpoints store.
//!
//! All randomness comes from seeded ChaCha streams on the host, so a run is reproducible from its
//! seed whatever the device.

use candle_core::{Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use indicatif::ProgressBar;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::{Net, Schedule, PIXELS};

/// Optimisation settings of a (non-DP) training run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimiser steps.
    pub steps: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// EMA decay per step (0 disables the average: the raw weights are kept).
    pub ema_decay: f64,
    /// Seed of initialisation, batches and noise.
    pub seed: u64,
    /// Train only on timesteps `t_min..=t_max` (RAPID fine-tunes the later sampling steps).
    pub t_min: usize,
    /// Largest diffusion step trained on.
    pub t_max: usize,
}

impl TrainConfig {
    /// Checks the settings against the schedule; errors name the flag.
    pub fn validate(&self, schedule: &Schedule) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::field("--batch-size", "must be ≥ 1"));
        }
        crate::limits::check_count("--batch-size", self.batch_size as u64, crate::limits::BATCH_ROW)?;
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(Error::field("--lr", format!("must be > 0, got {}", self.lr)));
        }
        if !(0.0..1.0).contains(&self.ema_decay) {
            return Err(Error::field(
                "--ema",
                format!("must be in [0, 1), got {}", self.ema_decay),
            ));
        }
        if self.t_min > self.t_max || self.t_max >= schedule.len() {
            return Err(Error::field(
                "--t-max",
                format!(
                    "need t_min ≤ t_max < T = {}, got {}..={}",
                    schedule.len(),
                    self.t_min,
                    self.t_max
                ),
            ));
        }
        Ok(())
    }
}

/// Adam as in RAPID's Algorithm 2 (AdamW with zero weight decay).
pub fn adam(net: &Net, lr: f64) -> Result<AdamW> {
    Ok(AdamW::new(
        net.params.all_vars(),
        ParamsAdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    )?)
}

/// Exponential moving average of the parameters, updated every [`Ema::EVERY`] steps with decay
/// d^EVERY (the same time constant, a tenth of the cost), with the usual warm-up
/// min(d, (1 + n)/(10 + n)) so short runs are not dominated by the initial weights.
pub struct Ema {
    decay: f64,
    shadow: Vec<Tensor>,
    step: usize,
}

impl Ema {
    /// An EMA starting from `net`'s current weights.
    pub fn new(net: &Net, decay: f64) -> Result<Self> {
        let shadow = net
            .params
            .vars
            .values()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Ema { decay, shadow, step: 0 })
    }

    /// Update the average every this many steps.
    pub const EVERY: usize = 10;

    /// Call once per optimiser step.
    pub fn update(&mut self, net: &Net) -> Result<()> {
        self.step += 1;
        if self.decay == 0.0 || !self.step.is_multiple_of(Self::EVERY) {
            return Ok(());
        }
        let n = self.step as f64;
        let d = self.decay.min((1.0 + n) / (10.0 + n)).powi(Self::EVERY as i32);
        for (s, v) in self.shadow.iter_mut().zip(net.params.vars.values()) {
            *s = ((&*s * d)? + (v.as_tensor().detach() * (1.0 - d))?)?;
        }
        Ok(())
    }

    /// Writes the averaged weights into `net`.
    pub fn apply(&self, net: &Net) -> Result<()> {
        if self.decay == 0.0 {
            return Ok(());
        }
        for (s, v) in self.shadow.iter().zip(net.params.vars.values()) {
            v.set(s)?;
        }
        Ok(())
    }
}

pub use super::data::normals;

/// x_t = √ᾱ_t x₀ + √(1−ᾱ_t) ε, row by row (host); rows have `x0.len() / t.len()` values.
pub fn noisy(schedule: &Schedule, x0: &[f32], t: &[usize], eps: &[f32]) -> Vec<f32> {
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
    pub fn new(net: &Net, schedule: &Schedule, x0: &[f32], t: &[usize], eps: &[f32]) -> Result<Self> {
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

/// What a training run reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainLog {
    /// (step, mean training loss over the last logging window).
    pub losses: Vec<(usize, f64)>,
    /// Denoising loss on fixed draws before training.
    pub eval_loss_before: f64,
    /// The same loss after training.
    pub eval_loss_after: f64,
}

/// A fixed evaluation of the denoising loss: `draws` (t, ε) pairs per row, t over
/// `t_min..=t_max`, from `seed` (the same pairs before and after training).
pub fn eval_loss(
    net: &Net,
    schedule: &Schedule,
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

/// Non-DP training of `net` on rows `x0` (row-major [n, 64]); the EMA weights are written back.
pub fn train(
    net: &Net,
    schedule: &Schedule,
    x0: &[f32],
    cfg: &TrainConfig,
    bar: Option<&ProgressBar>,
) -> Result<TrainLog> {
    cfg.validate(schedule)?;
    let n = x0.len() / PIXELS;
    if n == 0 {
        return Err(Error::input("no training rows"));
    }
    let mut log = TrainLog {
        eval_loss_before: eval_loss(net, schedule, x0, cfg.t_min, cfg.t_max, cfg.seed, 4)?,
        ..Default::default()
    };
    let mut opt = adam(net, cfg.lr)?;
    let mut ema = Ema::new(net, cfg.ema_decay)?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let log_every = (cfg.steps / 50).max(1);
    let (mut acc, mut acc_n) = (0.0f64, 0usize);
    let mut xb = Vec::with_capacity(cfg.batch_size * PIXELS);
    for step in 1..=cfg.steps {
        xb.clear();
        let mut t = Vec::with_capacity(cfg.batch_size);
        for _ in 0..cfg.batch_size {
            let i = rng.random_range(0..n);
            xb.extend_from_slice(&x0[i * PIXELS..(i + 1) * PIXELS]);
            t.push(rng.random_range(cfg.t_min..=cfg.t_max));
        }
        let eps = normals(&mut rng, cfg.batch_size * PIXELS);
        let b = Batch::new(net, schedule, &xb, &t, &eps)?;
        let loss = batch_loss(net, &b)?;
        opt.backward_step(&loss)?;
        ema.update(net)?;
        acc += loss.to_scalar::<f32>()? as f64;
        acc_n += 1;
        if step % log_every == 0 || step == cfg.steps {
            log.losses.push((step, acc / acc_n as f64));
            if let Some(bar) = bar {
                bar.set_message(format!("loss {:.4}", acc / acc_n as f64));
            }
            acc = 0.0;
            acc_n = 0;
        }
        if let Some(bar) = bar {
            bar.inc(1);
        }
    }
    ema.apply(net)?;
    log.eval_loss_after = eval_loss(net, schedule, x0, cfg.t_min, cfg.t_max, cfg.seed, 4)?;
    Ok(log)
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
    use crate::models::{schedule::ScheduleConfig, Arch, ModelConfig};
    use candle_core::Device;

    #[test]
    fn short_run_reduces_loss_on_synthetic_data() {
        let sched = Schedule::new(ScheduleConfig::default()).unwrap();
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
        let tc = TrainConfig {
            steps: 150,
            batch_size: 32,
            lr: 2e-3,
            ema_decay: 0.0,
            seed: 5,
            t_min: 0,
            t_max: 999,
        };
        let log = train(&net, &sched, &x0, &tc, None).unwrap();
        assert!(
            log.eval_loss_after < 0.8 * log.eval_loss_before,
            "{} -> {}",
            log.eval_loss_before,
            log.eval_loss_after
        );
    }
}
