//! The optimiser and the weight average every training run uses, whichever model family: Adam
//! (AdamW with zero weight decay, as RAPID's Algorithm 2 and Opacus' examples run it) and the
//! exponential moving average of the weights that a run releases.

use candle_core::{Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};

use crate::error::Result;

/// Adam with β = (0.9, 0.999), ε = 10⁻⁸ and no weight decay over `vars`.
pub fn adam(vars: Vec<Var>, lr: f64) -> Result<AdamW> {
    Ok(AdamW::new(
        vars,
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
/// d^EVERY (the same time constant, a tenth of the cost) and the usual warm-up
/// min(d, (1 + n)/(10 + n)), so that short runs are not dominated by the initial weights. The
/// steps since the last update are folded in when the average is read ([`Ema::snapshot`]) or
/// written back ([`Ema::apply`]): a run of fewer than 10 steps releases its trained weights'
/// average, not its initial weights.
pub struct Ema {
    decay: f64,
    vars: Vec<Var>,
    shadow: Vec<Tensor>,
    step: usize,
}

impl Ema {
    /// Update the average every this many steps.
    pub const EVERY: usize = 10;

    /// An average of `vars` starting from their current values (`decay` 0: no average, the
    /// raw weights are released).
    pub fn new(vars: Vec<Var>, decay: f64) -> Result<Self> {
        let shadow = vars
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect::<candle_core::Result<_>>()?;
        Ok(Ema {
            decay,
            vars,
            shadow,
            step: 0,
        })
    }

    /// Call once per optimiser step.
    pub fn update(&mut self) -> Result<()> {
        self.step += 1;
        if self.decay == 0.0 || !self.step.is_multiple_of(Self::EVERY) {
            return Ok(());
        }
        self.shadow = self.folded(Self::EVERY)?;
        Ok(())
    }

    /// The average with the current weights folded in for the last `k` steps, the average
    /// itself unchanged.
    fn folded(&self, k: usize) -> Result<Vec<Tensor>> {
        let n = self.step as f64;
        let d = self.decay.min((1.0 + n) / (10.0 + n)).powi(k as i32);
        self.shadow
            .iter()
            .zip(&self.vars)
            .map(|(s, v)| Ok(((s * d)? + (v.as_tensor().detach() * (1.0 - d))?)?))
            .collect()
    }

    /// The average as [`Ema::apply`] would write it now, without changing the average or the
    /// weights.
    pub fn snapshot(&self) -> Result<Vec<Tensor>> {
        if self.decay == 0.0 {
            return self.vars.iter().map(|v| Ok(v.as_tensor().copy()?)).collect();
        }
        match self.step % Self::EVERY {
            0 => Ok(self.shadow.clone()),
            pending => self.folded(pending),
        }
    }

    /// Writes the average into the weights, first folding in the steps since the last update.
    pub fn apply(&mut self) -> Result<()> {
        if self.decay == 0.0 {
            return Ok(());
        }
        let pending = self.step % Self::EVERY;
        if pending > 0 {
            self.shadow = self.folded(pending)?;
        }
        for (s, v) in self.shadow.iter().zip(&self.vars) {
            v.set(s)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A run shorter than [`Ema::EVERY`] steps releases the average with its steps folded in,
    /// not its initial weights; [`Ema::snapshot`] is what [`Ema::apply`] writes and leaves the
    /// weights as they are.
    #[test]
    fn short_runs_release_their_average_not_the_initial_weights() {
        let dev = Device::Cpu;
        let v = Var::new(&[0f32, 0.0], &dev).unwrap();
        let mut ema = Ema::new(vec![v.clone()], 0.999).unwrap();
        for k in 1..=3 {
            v.set(&Tensor::new(&[k as f32, k as f32], &dev).unwrap()).unwrap();
            ema.update().unwrap();
        }
        let snap: Vec<f32> = ema.snapshot().unwrap()[0].to_vec1().unwrap();
        assert_eq!(v.as_tensor().to_vec1::<f32>().unwrap(), vec![3.0, 3.0]);
        ema.apply().unwrap();
        let w: Vec<f32> = v.as_tensor().to_vec1().unwrap();
        assert_eq!(w, snap);
        assert!(w[0] > 0.0 && w[0] < 3.0, "{w:?}");
        // Decay 0 releases the raw weights.
        let mut raw = Ema::new(vec![v.clone()], 0.0).unwrap();
        raw.update().unwrap();
        raw.apply().unwrap();
        assert_eq!(v.as_tensor().to_vec1::<f32>().unwrap(), w);
    }
}
