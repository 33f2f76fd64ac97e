//! The denoiser networks: ε_θ(x_t, t) for flattened 8×8 images.
//!
//! Parameters live in a [`Params`] store with names (the safetensors keys) and are initialised
//! from a seeded ChaCha stream (PyTorch's default uniform ±1/√fan_in), so a training run is
//! reproducible from its seed on any device.
//!
//! For DP-SGD the MLP supports per-sample gradient norms in one backward pass through a
//! [`Probe`]: each linear layer adds a zero variable to its output, and the per-sample gradient
//! of a layer y = a Wᵀ + b is gᵢ aᵢᵀ (weight) and gᵢ (bias) with gᵢ = ∂ℓᵢ/∂yᵢ, so
//! ‖∇ᵢ‖² = Σ_layers ‖gᵢ‖² (‖aᵢ‖² + 1) and the clipped sum is Σᵢ cᵢ gᵢ aᵢᵀ (Goodfellow 2015,
//! "Efficient per-example gradient computations"; the "ghost norm" trick).

use std::cell::RefCell;
use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::{PIXELS, SIDE};

/// Network architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// MLP with sinusoidal time embedding (supports one-pass per-sample gradients).
    Mlp,
    /// A small UNet (two resolutions, residual blocks, group norm).
    Unet,
}

/// Architecture hyper-parameters (stored in the checkpoint card).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Architecture (MLP or UNet).
    pub arch: Arch,
    /// MLP width.
    pub hidden: usize,
    /// MLP hidden layers.
    pub depth: usize,
    /// Size of the sinusoidal time embedding.
    pub time_dim: usize,
    /// UNet base channels.
    pub channels: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            arch: Arch::Mlp,
            hidden: 256,
            depth: 3,
            time_dim: 64,
            channels: 16,
        }
    }
}

impl ModelConfig {
    /// Checks the hyper-parameters; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |f: &str, m: &str| Err(Error::field(format!("model.{f}"), m.to_string()));
        if self.hidden == 0 || self.hidden > 8192 {
            return bad("hidden", "must be in 1..=8192");
        }
        if self.depth > 64 {
            return bad("depth", "must be ≤ 64");
        }
        if self.time_dim < 2 || !self.time_dim.is_multiple_of(2) || self.time_dim > 4096 {
            return bad("time_dim", "must be even, 2..=4096");
        }
        if self.arch == Arch::Unet && (self.channels < 4 || !self.channels.is_multiple_of(4) || self.channels > 512) {
            return bad(
                "channels",
                "must be a multiple of 4 in 4..=512 (group norm uses 4 groups)",
            );
        }
        // The parameter budget: weights, gradients and two optimiser moments must fit the
        // memory cap (see crate::limits).
        let (field, shape) = match self.arch {
            Arch::Mlp => ("hidden", format!("hidden = {}, depth = {}", self.hidden, self.depth)),
            Arch::Unet => ("channels", format!("channels = {}", self.channels)),
        };
        crate::limits::check("parameters", self.parameter_bound(), crate::limits::TRAINED_PARAMETER).map_err(|e| {
            Error::field(
                format!("model.{field}"),
                format!(
                    "{shape}, time_dim = {}: the parameter count {}",
                    self.time_dim, e.message
                ),
            )
        })
    }

    /// An upper bound on the number of parameters of this architecture (computed in floating
    /// point, so a hostile card cannot overflow it), checked against the parameter budget.
    pub fn parameter_bound(&self) -> f64 {
        let (h, d, t) = (self.hidden as f64, self.depth as f64, self.time_dim as f64);
        let px = PIXELS as f64;
        match self.arch {
            Arch::Mlp => (t + 1.0) * h + (h + 1.0) * h + (px + 1.0) * h + d * (h + 1.0) * h + (h + 1.0) * px,
            Arch::Unet => {
                let (c, td) = (self.channels as f64, 2.0 * t);
                // Time MLP, then at most 16 convolutions of 3×3 kernels between ≤ 2c channels
                // and 4 time projections, each with biases and norms.
                (t + 1.0) * td + (td + 1.0) * td + 16.0 * (9.0 * 4.0 * c * c + 4.0 * c) + 4.0 * (td + 1.0) * 2.0 * c
            }
        }
    }
}

/// Named parameters with a deterministic order.
#[derive(Debug, Clone)]
pub struct Params {
    /// The variables by name.
    pub vars: BTreeMap<String, Var>,
    /// Device they live on.
    pub device: Device,
}

impl Params {
    fn new(device: &Device) -> Self {
        Params {
            vars: BTreeMap::new(),
            device: device.clone(),
        }
    }

    /// Uniform(−bound, bound) init from the seeded stream.
    fn uniform(&mut self, name: &str, shape: &[usize], bound: f64, rng: &mut ChaCha8Rng) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-bound..bound) as f32).collect();
        self.insert(name, Tensor::from_vec(v, shape, &self.device)?)
    }

    fn constant(&mut self, name: &str, shape: &[usize], value: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        self.insert(name, Tensor::from_vec(vec![value; n], shape, &self.device)?)
    }

    fn insert(&mut self, name: &str, t: Tensor) -> Result<Tensor> {
        let var = Var::from_tensor(&t)?;
        let t = var.as_tensor().clone();
        self.vars.insert(name.to_string(), var);
        Ok(t)
    }

    /// Every variable, in name order.
    pub fn all_vars(&self) -> Vec<Var> {
        self.vars.values().cloned().collect()
    }

    /// Total number of scalars.
    pub fn count(&self) -> usize {
        self.vars.values().map(|v| v.elem_count()).sum()
    }

    /// Copies `tensors` into the parameters; every name and shape must match exactly.
    pub fn assign(&self, tensors: &std::collections::HashMap<String, Tensor>) -> Result<()> {
        for (name, var) in &self.vars {
            let t = tensors.get(name).ok_or_else(|| {
                Error::model(format!(
                    "checkpoint has no tensor `{name}` that the configured model needs (checkpoint and config do not match)"
                ))
            })?;
            if t.dims() != var.dims() {
                return Err(Error::model(format!(
                    "tensor `{name}`: checkpoint shape {:?}, configured model expects {:?} (checkpoint and config do not match)",
                    t.dims(),
                    var.dims()
                )));
            }
            var.set(&t.to_dtype(DType::F32)?.to_device(&self.device)?)?;
        }
        if let Some(extra) = tensors.keys().find(|k| !self.vars.contains_key(*k)) {
            return Err(Error::model(format!(
                "checkpoint tensor `{extra}` is not part of the configured model (checkpoint and config do not match)"
            )));
        }
        Ok(())
    }

    /// Current values, by name.
    pub fn tensors(&self) -> std::collections::HashMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect()
    }
}

/// Records each linear layer's input and a zero "probe" added to its output, so that one
/// backward pass yields per-sample output gradients (see the module docs).
#[derive(Default)]
pub struct Probe {
    pub(crate) layers: RefCell<Vec<ProbeEntry>>,
}

pub(crate) struct ProbeEntry {
    /// Layer input aᵢ, [B, in] (detached).
    pub input: Tensor,
    /// Zero variable added to the output, [B, out]; its gradient is gᵢ.
    pub probe: Var,
    /// Names of the layer's weight and bias.
    pub weight: String,
    pub bias: String,
}

/// y = x Wᵀ + b.
#[derive(Debug, Clone)]
struct Lin {
    w: Tensor,
    b: Tensor,
    name: String,
}

impl Lin {
    fn new(p: &mut Params, name: &str, inp: usize, out: usize, rng: &mut ChaCha8Rng) -> Result<Self> {
        let bound = 1.0 / (inp as f64).sqrt();
        let w = p.uniform(&format!("{name}.weight"), &[out, inp], bound, rng)?;
        let b = p.uniform(&format!("{name}.bias"), &[out], bound, rng)?;
        Ok(Lin {
            w,
            b,
            name: name.to_string(),
        })
    }

    fn forward(&self, x: &Tensor, probe: Option<&Probe>) -> Result<Tensor> {
        let y = x.matmul(&self.w.t()?)?.broadcast_add(&self.b)?;
        match probe {
            None => Ok(y),
            Some(pr) => {
                let z = Var::zeros(y.dims(), y.dtype(), y.device())?;
                let y = (y + z.as_tensor())?;
                pr.layers.borrow_mut().push(ProbeEntry {
                    input: x.detach(),
                    probe: z,
                    weight: format!("{}.weight", self.name),
                    bias: format!("{}.bias", self.name),
                });
                Ok(y)
            }
        }
    }
}

/// Sinusoidal embedding of (float) timesteps `t` [B] → [B, dim] (Vaswani et al. 2017, as in DDPM).
pub fn timestep_embedding(t: &Tensor, dim: usize) -> Result<Tensor> {
    let half = dim / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| (-(10000f64.ln()) * i as f64 / half as f64).exp() as f32)
        .collect();
    let freqs = Tensor::from_vec(freqs, (1, half), t.device())?;
    let args = t.unsqueeze(1)?.to_dtype(DType::F32)?.broadcast_mul(&freqs)?;
    Ok(Tensor::cat(&[args.sin()?, args.cos()?], 1)?)
}

/// MLP denoiser: h₀ = silu(W_in x + e(t)); h_{l+1} = silu(W_l h_l + e(t)); ε̂ = W_out h.
#[derive(Debug, Clone)]
pub struct Mlp {
    time1: Lin,
    time2: Lin,
    inp: Lin,
    hidden: Vec<Lin>,
    out: Lin,
    time_dim: usize,
}

impl Mlp {
    fn new(cfg: &ModelConfig, p: &mut Params, rng: &mut ChaCha8Rng) -> Result<Self> {
        let h = cfg.hidden;
        Ok(Mlp {
            time1: Lin::new(p, "time.0", cfg.time_dim, h, rng)?,
            time2: Lin::new(p, "time.1", h, h, rng)?,
            inp: Lin::new(p, "input", PIXELS, h, rng)?,
            hidden: (0..cfg.depth)
                .map(|i| Lin::new(p, &format!("hidden.{i}"), h, h, rng))
                .collect::<Result<_>>()?,
            out: Lin::new(p, "output", h, PIXELS, rng)?,
            time_dim: cfg.time_dim,
        })
    }

    fn forward(&self, x: &Tensor, t: &Tensor, probe: Option<&Probe>) -> Result<Tensor> {
        let e = timestep_embedding(t, self.time_dim)?;
        let e = self.time2.forward(&self.time1.forward(&e, probe)?.silu()?, probe)?;
        let mut h = (self.inp.forward(x, probe)? + &e)?.silu()?;
        for l in &self.hidden {
            h = (l.forward(&h, probe)? + &e)?.silu()?;
        }
        self.out.forward(&h, probe)
    }
}

/// 3×3 convolution with padding 1.
#[derive(Debug, Clone)]
struct Conv {
    w: Tensor,
    b: Tensor,
    stride: usize,
}

impl Conv {
    fn new(p: &mut Params, name: &str, cin: usize, cout: usize, stride: usize, rng: &mut ChaCha8Rng) -> Result<Self> {
        let bound = 1.0 / ((cin * 9) as f64).sqrt();
        let w = p.uniform(&format!("{name}.weight"), &[cout, cin, 3, 3], bound, rng)?;
        let b = p.uniform(&format!("{name}.bias"), &[cout], bound, rng)?;
        Ok(Conv { w, b, stride })
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.conv2d(&self.w, 1, self.stride, 1, 1)?;
        Ok(y.broadcast_add(&self.b.reshape((1, (), 1, 1))?)?)
    }
}

/// Group normalisation with 4 groups and a learned affine map.
#[derive(Debug, Clone)]
struct GroupNorm {
    gamma: Tensor,
    beta: Tensor,
    groups: usize,
}

impl GroupNorm {
    fn new(p: &mut Params, name: &str, c: usize) -> Result<Self> {
        Ok(GroupNorm {
            gamma: p.constant(&format!("{name}.weight"), &[c], 1.0)?,
            beta: p.constant(&format!("{name}.bias"), &[c], 0.0)?,
            groups: 4,
        })
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let g = x.reshape((b, self.groups, (c / self.groups) * h * w))?;
        let mean = g.mean_keepdim(2)?;
        let centred = g.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(2)?;
        let normed = centred.broadcast_div(&(var + 1e-5)?.sqrt()?)?.reshape((b, c, h, w))?;
        Ok(normed
            .broadcast_mul(&self.gamma.reshape((1, c, 1, 1))?)?
            .broadcast_add(&self.beta.reshape((1, c, 1, 1))?)?)
    }
}

/// Residual block with a time-embedding shift.
#[derive(Debug, Clone)]
struct ResBlock {
    n1: GroupNorm,
    c1: Conv,
    temb: Lin,
    n2: GroupNorm,
    c2: Conv,
    skip: Option<Conv>,
}

impl ResBlock {
    fn new(p: &mut Params, name: &str, cin: usize, cout: usize, tdim: usize, rng: &mut ChaCha8Rng) -> Result<Self> {
        Ok(ResBlock {
            n1: GroupNorm::new(p, &format!("{name}.norm1"), cin)?,
            c1: Conv::new(p, &format!("{name}.conv1"), cin, cout, 1, rng)?,
            temb: Lin::new(p, &format!("{name}.temb"), tdim, cout, rng)?,
            n2: GroupNorm::new(p, &format!("{name}.norm2"), cout)?,
            c2: Conv::new(p, &format!("{name}.conv2"), cout, cout, 1, rng)?,
            skip: if cin != cout {
                Some(Conv::new(p, &format!("{name}.skip"), cin, cout, 1, rng)?)
            } else {
                None
            },
        })
    }
    fn forward(&self, x: &Tensor, e: &Tensor) -> Result<Tensor> {
        let h = self.c1.forward(&self.n1.forward(x)?.silu()?)?;
        let t = self.temb.forward(e, None)?.unsqueeze(2)?.unsqueeze(3)?;
        let h = h.broadcast_add(&t)?;
        let h = self.c2.forward(&self.n2.forward(&h)?.silu()?)?;
        let s = match &self.skip {
            Some(c) => c.forward(x)?,
            None => x.clone(),
        };
        Ok((s + h)?)
    }
}

/// Small UNet: 8×8 (c) → 4×4 (2c) → 8×8 with a skip connection.
#[derive(Debug, Clone)]
pub struct Unet {
    time1: Lin,
    time2: Lin,
    conv_in: Conv,
    down_block: ResBlock,
    down: Conv,
    mid: ResBlock,
    up_conv: Conv,
    up_block: ResBlock,
    norm_out: GroupNorm,
    conv_out: Conv,
    time_dim: usize,
}

impl Unet {
    fn new(cfg: &ModelConfig, p: &mut Params, rng: &mut ChaCha8Rng) -> Result<Self> {
        let c = cfg.channels;
        let td = cfg.time_dim * 2;
        Ok(Unet {
            time1: Lin::new(p, "time.0", cfg.time_dim, td, rng)?,
            time2: Lin::new(p, "time.1", td, td, rng)?,
            conv_in: Conv::new(p, "conv_in", 1, c, 1, rng)?,
            down_block: ResBlock::new(p, "down_block", c, c, td, rng)?,
            down: Conv::new(p, "down", c, 2 * c, 2, rng)?,
            mid: ResBlock::new(p, "mid", 2 * c, 2 * c, td, rng)?,
            up_conv: Conv::new(p, "up_conv", 2 * c, c, 1, rng)?,
            up_block: ResBlock::new(p, "up_block", 2 * c, c, td, rng)?,
            norm_out: GroupNorm::new(p, "norm_out", c)?,
            conv_out: Conv::new(p, "conv_out", c, 1, 1, rng)?,
            time_dim: cfg.time_dim,
        })
    }

    fn forward(&self, x: &Tensor, t: &Tensor) -> Result<Tensor> {
        let b = x.dim(0)?;
        let e = timestep_embedding(t, self.time_dim)?;
        let e = self.time2.forward(&self.time1.forward(&e, None)?.silu()?, None)?;
        let x = x.reshape((b, 1, SIDE, SIDE))?;
        let h0 = self.conv_in.forward(&x)?;
        let h1 = self.down_block.forward(&h0, &e)?;
        let h2 = self.down.forward(&h1)?;
        let h2 = self.mid.forward(&h2, &e)?;
        let u = self.up_conv.forward(&h2.upsample_nearest2d(SIDE, SIDE)?)?;
        let u = self.up_block.forward(&Tensor::cat(&[&u, &h1], 1)?, &e)?;
        let y = self.conv_out.forward(&self.norm_out.forward(&u)?.silu()?)?;
        Ok(y.reshape((b, PIXELS))?)
    }
}

/// A denoiser with its parameters.
#[derive(Debug, Clone)]
pub struct Net {
    /// Architecture hyper-parameters.
    pub config: ModelConfig,
    /// The parameters.
    pub params: Params,
    body: Body,
}

// One body per network, never stored in bulk: boxing the larger variant would only add an
// indirection to every forward pass.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Body {
    Mlp(Mlp),
    Unet(Unet),
}

impl Net {
    /// A freshly initialised network (deterministic in `seed`).
    pub fn new(config: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = Params::new(device);
        let body = match config.arch {
            Arch::Mlp => Body::Mlp(Mlp::new(config, &mut params, &mut rng)?),
            Arch::Unet => Body::Unet(Unet::new(config, &mut params, &mut rng)?),
        };
        Ok(Net {
            config: *config,
            params,
            body,
        })
    }

    /// Device the parameters live on.
    pub fn device(&self) -> &Device {
        &self.params.device
    }

    /// ε̂ = ε_θ(x_t, t) for x_t [B, 64] and integer timesteps t [B] (as f32).
    pub fn forward(&self, x: &Tensor, t: &Tensor) -> Result<Tensor> {
        self.forward_probed(x, t, None)
    }

    /// As [`Net::forward`], recording linear layers in `probe` (MLP only).
    pub fn forward_probed(&self, x: &Tensor, t: &Tensor, probe: Option<&Probe>) -> Result<Tensor> {
        match &self.body {
            Body::Mlp(m) => m.forward(x, t, probe),
            Body::Unet(u) => {
                if probe.is_some() {
                    return Err(Error::unsupported(
                        "one-pass per-sample gradients need the MLP; use the per-sample loop for the UNet",
                    ));
                }
                u.forward(x, t)
            }
        }
    }

    /// True when [`Net::forward_probed`] gives per-sample gradients in one pass.
    pub fn supports_probe(&self) -> bool {
        matches!(self.body, Body::Mlp(_))
    }

    /// ε̂ for host data: `x` row-major [n, 64], one timestep per row.
    pub fn predict(&self, x: &[f32], t: &[usize]) -> Result<Vec<f32>> {
        let n = t.len();
        let xt = Tensor::from_slice(x, (n, PIXELS), self.device())?;
        let tt = Tensor::from_vec(t.iter().map(|&v| v as f32).collect::<Vec<_>>(), n, self.device())?;
        Ok(self.forward(&xt, &tt)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_init_and_shapes() {
        let dev = Device::Cpu;
        for arch in [Arch::Mlp, Arch::Unet] {
            let cfg = ModelConfig {
                arch,
                hidden: 32,
                depth: 1,
                time_dim: 16,
                channels: 8,
            };
            let a = Net::new(&cfg, 3, &dev).unwrap();
            let b = Net::new(&cfg, 3, &dev).unwrap();
            let x = vec![0.1f32; 2 * PIXELS];
            let ya = a.predict(&x, &[5, 900]).unwrap();
            let yb = b.predict(&x, &[5, 900]).unwrap();
            assert_eq!(ya.len(), 2 * PIXELS);
            assert_eq!(ya, yb);
            let c = Net::new(&cfg, 4, &dev).unwrap();
            assert_ne!(ya, c.predict(&x, &[5, 900]).unwrap());
        }
    }
}
