//! The one interface every attack needs: a batched ε-prediction denoiser on a DDPM-style
//! (variance-preserving) schedule, x_t = √ᾱ_t x₀ + √(1 − ᾱ_t) ε.
//!
//! Attacks (`mia`, `empirical`, the audits) only call [`Denoiser`], so any model that predicts
//! ε for a batch of flattened inputs plugs in: dpaudit's own small nets ([`NetDenoiser`]), a
//! loaded 8×8 checkpoint, or a diffusers UNet ([`DiffusersDenoiser`]). It is the one
//! ε-prediction trait of the crate.

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use crate::diffusion::schedule::table::TrainingSchedule;
use crate::error::{Error, Result};
use crate::models::diffusers::DiffusersDenoiser;
use crate::models::toy::{Checkpoint, Net};

/// A batched ε-prediction denoiser with its noise schedule.
pub trait Denoiser {
    /// Values per example (64 for the 8×8 digits nets).
    fn dim(&self) -> usize;
    /// ᾱ_t for t = 0, …, T − 1 (decreasing, in (0, 1)).
    fn alpha_bars(&self) -> &[f64];
    /// ε̂ = ε_θ(x_t, t) for `x` row-major [n, dim] and one integer step per row (`t.len() == n`);
    /// returns [n, dim] row-major.
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>>;
    /// T, the number of steps.
    fn steps(&self) -> usize {
        self.alpha_bars().len()
    }
    /// The device-resident interface, for a model on a GPU: the attacks then keep their batch on
    /// the device between steps (no host copies inside SecMI's DDIM loop). `None` (the default,
    /// and every CPU model) keeps the host path.
    fn on_device(&self) -> Option<&dyn DeviceEps> {
        None
    }
    /// The same model computing in fp32, when it computes in another arithmetic (`--precision
    /// tf32|bf16` on a GPU); `None` (the default) when it already computes in fp32.
    fn fp32(&self) -> Option<Box<dyn Denoiser + '_>> {
        None
    }
}

/// ε-prediction on device tensors (see [`Denoiser::on_device`]).
pub trait DeviceEps {
    /// The device the model and the batch live on.
    fn device(&self) -> &candle_core::Device;
    /// ε̂ = ε_θ(x, t) for `x` of shape [n, dim] (f32, on [`DeviceEps::device`]) at step `t` for
    /// every row; returns [n, dim] f32 on the same device.
    fn predict_eps_tensor(&self, x: &candle_core::Tensor, t: usize) -> Result<candle_core::Tensor>;
    /// x_t = √ᾱ x₀ + √(1 − ᾱ) ε on the device, with [`noisy`]'s f32 rounding.
    fn noisy_tensor(&self, x0: &Tensor, eps: &Tensor, abar: f64) -> Result<Tensor> {
        candle_noisy(x0, eps, abar)
    }
    /// A deterministic DDIM step's arithmetic on the device given ε = ε_θ(x, s), from ᾱ_s to ᾱ_t
    /// in f64 (`attacks::mia::ddim_step`).
    fn ddim_tensor(&self, x: &Tensor, eps: &Tensor, abar_s: f64, abar_t: f64) -> Result<Tensor> {
        candle_ddim(x, eps, abar_s, abar_t)
    }
    /// Mean over each row of |a − b|^p (in f64, on the device), copied to the host.
    fn row_lp_tensor(&self, a: &Tensor, b: &Tensor, p: f64) -> Result<Vec<f64>> {
        candle_row_lp(a, b, p)
    }
}

/// [`DeviceEps::noisy_tensor`] in candle's operations.
pub fn candle_noisy(x0: &Tensor, eps: &Tensor, abar: f64) -> Result<Tensor> {
    let (sa, sb) = noisy_factors(abar);
    Ok(((x0 * sa as f64)? + (eps * sb as f64)?)?)
}

/// The coefficients (√ᾱ_s, √(1 − ᾱ_s), √ᾱ_t, √(1 − ᾱ_t)) of a DDIM step from s to t.
pub fn ddim_coefficients(abar_s: f64, abar_t: f64) -> [f64; 4] {
    [
        abar_s.sqrt(),
        (1.0 - abar_s).sqrt(),
        abar_t.sqrt(),
        (1.0 - abar_t).sqrt(),
    ]
}

/// [`DeviceEps::ddim_tensor`] in candle's operations.
pub fn candle_ddim(x: &Tensor, eps: &Tensor, abar_s: f64, abar_t: f64) -> Result<Tensor> {
    let [ss, sn, ts, tn] = ddim_coefficients(abar_s, abar_t);
    let eps = eps.to_dtype(DType::F64)?;
    let x0 = ((x.to_dtype(DType::F64)? - (&eps * sn)?)? / ss)?;
    Ok(((x0 * ts)? + (eps * tn)?)?.to_dtype(DType::F32)?)
}

/// [`DeviceEps::row_lp_tensor`] in candle's operations.
pub fn candle_row_lp(a: &Tensor, b: &Tensor, p: f64) -> Result<Vec<f64>> {
    let diff = (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?.abs()?;
    let pow = if p == 2.0 {
        diff.sqr()?
    } else if p == 4.0 {
        diff.sqr()?.sqr()?
    } else {
        diff.powf(p)?
    };
    Ok(pow.mean(1)?.to_vec1::<f64>()?)
}

/// A dpaudit net with its schedule.
pub struct NetDenoiser<'a> {
    /// The network.
    pub net: &'a Net,
    /// Its DDPM schedule.
    pub schedule: &'a TrainingSchedule,
}

impl Denoiser for NetDenoiser<'_> {
    fn dim(&self) -> usize {
        crate::models::toy::PIXELS
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.schedule.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        self.net.predict(x, t)
    }
}

impl Denoiser for Checkpoint {
    fn dim(&self) -> usize {
        crate::models::toy::PIXELS
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.schedule.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        self.net.predict(x, t)
    }
}

/// A diffusers `UNet2DModel` (ε-, v- or x₀-prediction, converted to ε), on the host or, on a GPU,
/// through its device-resident interface.
impl Denoiser for DiffusersDenoiser<'_> {
    fn dim(&self) -> usize {
        DiffusersDenoiser::sample_shape(self).iter().product()
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.schedule.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        DiffusersDenoiser::predict_eps(self, x, t)
    }
    fn on_device(&self) -> Option<&dyn DeviceEps> {
        (!self.device().is_cpu()).then_some(self as &dyn DeviceEps)
    }
    fn fp32(&self) -> Option<Box<dyn Denoiser + '_>> {
        use crate::models::precision::Precision;
        (self.precision() != Precision::Fp32)
            .then(|| Box::new(self.at_precision(Precision::Fp32)) as Box<dyn Denoiser + '_>)
    }
}

impl DeviceEps for DiffusersDenoiser<'_> {
    fn device(&self) -> &candle_core::Device {
        DiffusersDenoiser::device(self)
    }
    fn predict_eps_tensor(&self, x: &candle_core::Tensor, t: usize) -> Result<candle_core::Tensor> {
        DiffusersDenoiser::predict_eps_tensor(self, x, t)
    }
    // Through the CUDA forward's kernels where the model has them (one launch each, none of
    // candle's modules), else candle's operations.
    fn noisy_tensor(&self, x0: &Tensor, eps: &Tensor, abar: f64) -> Result<Tensor> {
        let (sa, sb) = noisy_factors(abar);
        match self.model().fused_noisy(x0, eps, sa, sb)? {
            Some(t) => Ok(t),
            None => candle_noisy(x0, eps, abar),
        }
    }
    fn ddim_tensor(&self, x: &Tensor, eps: &Tensor, abar_s: f64, abar_t: f64) -> Result<Tensor> {
        let c = ddim_coefficients(abar_s, abar_t);
        match self.model().fused_ddim(x, eps, c)? {
            Some(t) => Ok(t),
            None => candle_ddim(x, eps, abar_s, abar_t),
        }
    }
    fn row_lp_tensor(&self, a: &Tensor, b: &Tensor, p: f64) -> Result<Vec<f64>> {
        match self.model().fused_row_lp(a, b, p)? {
            Some(v) => Ok(v),
            None => candle_row_lp(a, b, p),
        }
    }
}

/// A denoiser given by a function, for tests and hand-computed cases: ε̂ row by row.
pub struct FnDenoiser<F: Fn(&[f32], usize) -> Vec<f32>> {
    /// Values per example.
    pub dim: usize,
    /// ᾱ_t.
    pub alpha_bars: Vec<f64>,
    /// ε̂ of one row at one step.
    pub eps: F,
}

impl<F: Fn(&[f32], usize) -> Vec<f32>> Denoiser for FnDenoiser<F> {
    fn dim(&self) -> usize {
        self.dim
    }
    fn alpha_bars(&self) -> &[f64] {
        &self.alpha_bars
    }
    fn predict_eps(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        let d = self.dim;
        if x.len() != t.len() * d {
            return Err(Error::input(format!(
                "denoiser input has {} values for {} rows of {d}",
                x.len(),
                t.len()
            )));
        }
        Ok(x.chunks_exact(d)
            .zip(t)
            .flat_map(|(row, &s)| (self.eps)(row, s))
            .collect())
    }
}

/// (√ᾱ, √(1 − ᾱ)) in f32: the two factors of [`noisy`] (and of its device versions).
pub fn noisy_factors(abar: f64) -> (f32, f32) {
    (abar.sqrt() as f32, (1.0 - abar).sqrt() as f32)
}

/// x_t = √ᾱ_t x₀ + √(1 − ᾱ_t) ε row by row (host, rows in parallel), for rows of `dim` values.
pub fn noisy(alpha_bars: &[f64], dim: usize, x0: &[f32], t: &[usize], eps: &[f32]) -> Vec<f32> {
    debug_assert_eq!((x0.len(), eps.len()), (t.len() * dim, t.len() * dim));
    let d = dim.max(1);
    let mut out = vec![0.0f32; t.len() * dim];
    out.par_chunks_mut(d)
        .zip(x0.par_chunks(d).zip(eps.par_chunks(d)))
        .zip(t.par_iter())
        .for_each(|((o, (x, e)), &ti)| {
            let a = alpha_bars[ti];
            let (sa, sb) = noisy_factors(a);
            for ((o, &x), &e) in o.iter_mut().zip(x).zip(e) {
                *o = sa * x + sb * e;
            }
        });
    out
}
