//! The diffusers `UNet2DModel` as a trainable candle model, with per-sample gradients of every
//! parameter from one batched backward pass (the approach of Opacus' grad samplers, Yousefpour
//! et al. 2021, "Opacus: user-friendly differential privacy library in PyTorch", §3).
//!
//! The forward mirrors [`super::Unet2dModel::forward_candle`] (same wiring, same diffusers
//! tensor names; attention projections under the current `to_q/to_k/to_v/to_out.0` names), but
//! every parameter is a candle [`Var`] and every layer can be *recorded*: the layer's input (for
//! a group norm, its normalised input x̂) is kept and a zero "probe" variable is added to its
//! output, so that one backward pass of the summed loss Σᵢ Lᵢ leaves ∂L/∂yᵢ, the gradient of each
//! layer output, in the [`GradStore`](candle_core::backprop::GradStore). Because no layer mixes
//! the rows of a batch (group norm is per sample), row i of ∂L/∂y is ∂Lᵢ/∂yᵢ, and each layer's
//! per-sample weight gradient follows in closed form:
//!
//! * linear y = a Wᵀ + b over tokens (the time MLP: 1 token; attention: H·W tokens):
//!   ∇W Lᵢ = Σ_tokens gᵢᵀ aᵢ, ∇b Lᵢ = Σ_tokens gᵢ;
//! * 2-D convolution: ∇W Lᵢ = gᵢ · unfold(xᵢ)ᵀ (the im2col of the padded input, one column per
//!   output pixel), ∇b Lᵢ = Σ_pixels gᵢ;
//! * group norm y = γ x̂ + β: ∇γ Lᵢ = Σ_pixels x̂ᵢ gᵢ, ∇β Lᵢ = Σ_pixels gᵢ (per channel).
//!
//! [`TrainUnet::per_sample_grads_loop`] computes the same gradients with one backward pass per
//! sample: the reference the batched pass is tested against.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var, D};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use super::graph::{AttnSpec, ConvSpec, Graph, Init, LinearSpec, NormSpec, Op, ResnetSpec, Updown};
use super::{Act, TimeEmbedding, Unet2dConfig};
use crate::error::{Error, Result};

/// Where parameters come from while the model is built.
enum Source {
    /// PyTorch's default initialisation, seeded.
    Random(Box<ChaCha8Rng>),
    /// Tensors read from a weights file (removed as they are used).
    Weights(HashMap<String, Tensor>, PathBuf),
}

#[derive(Clone, Copy)]
enum LayerKind {
    Linear,
    Conv,
    Norm,
}

struct Layer {
    kind: LayerKind,
    /// The names of the layer's weight and bias.
    names: [String; 2],
    /// Linear: the input [B, …, in]; conv: the unfolded input [B, C·k², H_out·W_out]; norm: x̂
    /// [B, C, H, W].
    input: Tensor,
    probe: Var,
}

/// The layers of one recorded forward pass.
#[derive(Default)]
struct Recorder {
    layers: RefCell<Vec<Layer>>,
}

#[derive(Default)]
struct Params {
    names: Vec<String>,
    vars: HashMap<String, Var>,
}

/// A diffusers `UNet2DModel` whose parameters are trainable [`Var`]s.
pub struct TrainUnet {
    /// The architecture.
    pub config: Unet2dConfig,
    /// The graph the forward walks.
    pub graph: Graph,
    params: RefCell<Params>,
    fourier_w: Option<Vec<f32>>,
    device: Device,
    source: RefCell<Option<Source>>,
}

/// Per-sample gradients: for each parameter (in creation order), a tensor [B, …parameter shape].
pub type PerSampleGrads = Vec<(String, Tensor)>;

fn act(a: Act, x: &Tensor) -> Result<Tensor> {
    Ok(match a {
        Act::Silu => candle_nn::ops::silu(x)?,
        Act::Mish => (x * (x.exp()? + 1.0)?.log()?.tanh()?)?,
        Act::Gelu => x.gelu_erf()?,
        Act::Relu => x.relu()?,
    })
}

/// Nearest-neighbour ×2 upsampling by broadcasting (its backward sums each 2×2 block).
fn up2(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    Ok(x.reshape((b, c, h, 1, w, 1))?
        .broadcast_as((b, c, h, 2, w, 2))?
        .reshape((b, c, 2 * h, 2 * w))?)
}

/// im2col of `x` [B, C, H, W] for a k×k convolution with `stride` and zero `pad`:
/// [B, C·k·k, H_out·W_out], row c·k² + i·k + j holding input pixel (c, s·y + i − p, s·x + j − p).
fn unfold(x: &Tensor, k: usize, stride: usize, pad: usize) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let xp = if pad > 0 {
        x.pad_with_zeros(2, pad, pad)?.pad_with_zeros(3, pad, pad)?
    } else {
        x.clone()
    };
    let ho = (h + 2 * pad - k) / stride + 1;
    let wo = (w + 2 * pad - k) / stride + 1;
    let idx = |n: usize| -> Result<Tensor> {
        let v: Vec<u32> = (0..n).map(|i| (i * stride) as u32).collect();
        Ok(Tensor::from_vec(v, n, x.device())?)
    };
    let (ih, iw) = (idx(ho)?, idx(wo)?);
    let mut cols = Vec::with_capacity(k * k);
    for i in 0..k {
        for j in 0..k {
            let s = xp
                .narrow(2, i, (ho - 1) * stride + 1)?
                .narrow(3, j, (wo - 1) * stride + 1)?;
            let s = if stride > 1 {
                s.contiguous()?.index_select(&ih, 2)?.index_select(&iw, 3)?
            } else {
                s
            };
            cols.push(s.contiguous()?);
        }
    }
    Ok(Tensor::stack(&cols, 2)?.reshape((b, c * k * k, ho * wo))?)
}

impl TrainUnet {
    /// A model with PyTorch's default initialisation (uniform ±1/√fan_in for convolutions and
    /// linear layers, γ = 1 and β = 0 for group norms; the fixed Fourier weights N(0, 16²)),
    /// drawn from a ChaCha8 stream seeded with `seed`.
    pub fn random(config: &Unet2dConfig, seed: u64, device: &Device) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0e7_1417);
        let c0 = config.block_out_channels[0];
        let fourier_w = matches!(config.time_embedding, TimeEmbedding::Fourier)
            .then(|| (0..c0).map(|_| rng.sample::<f32, _>(StandardNormal) * 16.0).collect());
        Self::build(config, Source::Random(Box::new(rng)), fourier_w, device)
    }

    /// A model holding `tensors` (diffusers names; the attention projections may use the old
    /// `query/key/value/proj_attn` names), read from `file`; a missing, mis-shaped or left-over
    /// tensor is an input error naming the file.
    pub fn from_tensors(
        config: &Unet2dConfig,
        tensors: HashMap<String, Tensor>,
        file: &Path,
        device: &Device,
    ) -> Result<Self> {
        let mut map = HashMap::with_capacity(tensors.len());
        for (k, v) in tensors {
            map.insert(
                super::graph::current_name(&k),
                v.to_dtype(DType::F32)?.to_device(device)?,
            );
        }
        let fourier_w = match &Graph::new(config).time().fourier {
            Some(p) => {
                let w = map.remove(&p.name).ok_or_else(|| {
                    Error::input(format!(
                        "tensor `{}` is missing (a Fourier time embedding needs it)",
                        p.name
                    ))
                    .with_file(file)
                })?;
                if w.dims() != p.shape.as_slice() {
                    return Err(Error::input(format!(
                        "tensor `{}` has shape {:?}, the config's architecture needs {:?} (shape mismatch)",
                        p.name,
                        w.dims(),
                        p.shape
                    ))
                    .with_file(file));
                }
                Some(w.flatten_all()?.to_vec1::<f32>()?)
            }
            None => None,
        };
        Self::build(config, Source::Weights(map, file.to_path_buf()), fourier_w, device)
    }

    fn build(config: &Unet2dConfig, source: Source, fourier_w: Option<Vec<f32>>, device: &Device) -> Result<Self> {
        let m = TrainUnet {
            config: config.clone(),
            graph: Graph::new(config),
            params: RefCell::new(Params::default()),
            fourier_w,
            device: device.clone(),
            source: RefCell::new(Some(source)),
        };
        // One forward pass on the smallest input creates every parameter in use order.
        let side = 1usize << config.downsamplings();
        let x = Tensor::zeros((1, config.in_channels, side, side), DType::F32, device)?;
        m.forward(&x, &[1.0])?;
        if let Some(Source::Weights(left, file)) = m.source.borrow_mut().take() {
            if !left.is_empty() {
                let mut names: Vec<&String> = left.keys().collect();
                names.sort();
                return Err(Error::input(format!(
                    "{} tensor(s) the config's architecture does not use, e.g. `{}` (config.json and the weights do not match)",
                    names.len(),
                    names[0]
                ))
                .with_file(&file));
            }
        }
        Ok(m)
    }

    /// The device the parameters live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Parameter names in creation order.
    pub fn names(&self) -> Vec<String> {
        self.params.borrow().names.clone()
    }

    /// The trainable variables in creation order.
    pub fn vars(&self) -> Vec<Var> {
        let p = self.params.borrow();
        p.names.iter().map(|n| p.vars[n].clone()).collect()
    }

    /// Number of scalar parameters (trainable ones; the fixed Fourier weights excluded).
    pub fn parameters(&self) -> usize {
        self.params.borrow().vars.values().map(|v| v.elem_count()).sum()
    }

    /// Every tensor diffusers saves, under its diffusers name (the fixed Fourier weights as
    /// `time_proj.weight`).
    pub fn tensors(&self) -> Result<HashMap<String, Tensor>> {
        let p = self.params.borrow();
        let mut out: HashMap<String, Tensor> = p
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
            .collect();
        if let (Some(w), Some(p)) = (&self.fourier_w, &self.graph.time().fourier) {
            out.insert(p.name.clone(), Tensor::from_slice(w, w.len(), &self.device)?);
        }
        Ok(out)
    }

    /// The safetensors bytes of [`TrainUnet::tensors`].
    pub fn safetensors_bytes(&self) -> Result<Vec<u8>> {
        let tensors = self.tensors()?;
        let tmp = tempfile::Builder::new()
            .prefix(".dpaudit-tmp-")
            .suffix(".safetensors")
            .tempfile()
            .map_err(|e| Error::io(&std::env::temp_dir(), &e))?;
        candle_core::safetensors::save(&tensors, tmp.path()).map_err(|e| Error::model(e.to_string()))?;
        std::fs::read(tmp.path()).map_err(|e| Error::io(tmp.path(), &e))
    }

    fn param(&self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        if let Some(v) = self.params.borrow().vars.get(name) {
            if v.dims() != shape {
                return Err(Error::model(format!(
                    "parameter `{name}` has shape {:?}, used with {shape:?}",
                    v.dims()
                )));
            }
            return Ok(v.as_tensor().clone());
        }
        let mut src = self.source.borrow_mut();
        let src = src
            .as_mut()
            .ok_or_else(|| Error::model(format!("parameter `{name}` was not created with the model")))?;
        let t = match src {
            Source::Random(rng) => {
                let n: usize = shape.iter().product();
                let v: Vec<f32> = match init {
                    Init::Uniform(fan_in) => {
                        let b = 1.0 / (fan_in as f64).sqrt();
                        (0..n).map(|_| rng.random_range(-b..b) as f32).collect()
                    }
                    Init::Ones => vec![1.0; n],
                    Init::Zeros => vec![0.0; n],
                    Init::FourierFixed => {
                        return Err(Error::model(format!("`{name}` is fixed, not a parameter")));
                    }
                };
                Tensor::from_vec(v, shape, &self.device)?
            }
            Source::Weights(map, file) => {
                let file: &Path = file;
                let t = map.remove(name).ok_or_else(|| {
                    Error::input(format!(
                        "tensor `{name}` is missing (the config's architecture needs it with shape {shape:?})"
                    ))
                    .with_file(file)
                })?;
                if t.dims() != shape {
                    return Err(Error::input(format!(
                        "tensor `{name}` has shape {:?}, the config's architecture needs {shape:?} (shape mismatch)",
                        t.dims()
                    ))
                    .with_file(file));
                }
                t
            }
        };
        let var = Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        let mut p = self.params.borrow_mut();
        p.names.push(name.to_string());
        p.vars.insert(name.to_string(), var);
        Ok(out)
    }

    fn record(
        &self,
        rec: Option<&Recorder>,
        kind: LayerKind,
        names: [String; 2],
        input: &Tensor,
        y: Tensor,
    ) -> Result<Tensor> {
        match rec {
            None => Ok(y),
            Some(r) => {
                let probe = Var::zeros(y.dims(), y.dtype(), y.device())?;
                let y = (y + probe.as_tensor())?;
                r.layers.borrow_mut().push(Layer {
                    kind,
                    names,
                    input: input.detach(),
                    probe,
                });
                Ok(y)
            }
        }
    }

    fn linear(&self, s: &LinearSpec, x: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let (inn, out) = (s.cin, s.cout);
        if dims.last() != Some(&inn) {
            return Err(Error::model(format!("`{}` takes {inn} features, got {dims:?}", s.name)));
        }
        let w = self.param(&s.weight(), &[out, inn], Init::Uniform(inn))?;
        let b = self.param(&s.bias(), &[out], Init::Uniform(inn))?;
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let y = x.reshape((rows, inn))?.matmul(&w.t()?)?.broadcast_add(&b)?;
        let mut oshape = dims;
        *oshape.last_mut().expect("non-empty") = out;
        let y = y.reshape(oshape)?;
        self.record(rec, LayerKind::Linear, [s.weight(), s.bias()], x, y)
    }

    /// A convolution; extra right/bottom zero padding (`pad_hi` > `pad`) is applied to the input
    /// first.
    fn conv(&self, s: &ConvSpec, x: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let extra = s.pad_hi - s.pad;
        let padded;
        let x = if extra > 0 {
            padded = x
                .pad_with_zeros(D::Minus1, 0, extra)?
                .pad_with_zeros(D::Minus2, 0, extra)?;
            &padded
        } else {
            x
        };
        let (cin, cout, k, stride, pad) = (s.cin, s.cout, s.k, s.stride, s.pad);
        if x.dim(1)? != cin {
            return Err(Error::model(format!(
                "`{}` takes {cin} channels, got {}",
                s.name,
                x.dim(1)?
            )));
        }
        let fan = cin * k * k;
        let w = self.param(&s.weight(), &s.weight_shape(), Init::Uniform(fan))?;
        let b_ = self.param(&s.bias(), &[cout], Init::Uniform(fan))?;
        // The convolution as im2col × weights: its backward is two GEMMs and the unfold's
        // copies (candle's CPU conv backward goes through a slow transposed convolution), and
        // the unfolded input is what the per-sample weight gradient needs.
        let (b, _, h, wd) = x.dims4()?;
        let ho = (h + 2 * pad - k) / stride + 1;
        let wo = (wd + 2 * pad - k) / stride + 1;
        let unf = if k == 1 && stride == 1 && pad == 0 {
            x.reshape((b, cin, h * wd))?
        } else {
            unfold(x, k, stride, pad)?
        };
        let y = w
            .reshape((cout, fan))?
            .broadcast_matmul(&unf)?
            .reshape((b, cout, ho, wo))?
            .broadcast_add(&b_.reshape((1, cout, 1, 1))?)?;
        self.record(rec, LayerKind::Conv, [s.weight(), s.bias()], &unf, y)
    }

    fn gn(&self, s: &NormSpec, x: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let groups = s.groups;
        if groups == 0 || c % groups != 0 || c != s.ch {
            return Err(Error::model(format!(
                "`{}`: {groups} groups do not divide {c} channels",
                s.name
            )));
        }
        let wt = self.param(&s.weight(), &[c], Init::Ones)?;
        let bias = self.param(&s.bias(), &[c], Init::Zeros)?;
        let xg = x.reshape((b, groups, (c / groups) * h * w))?;
        let mean = xg.mean_keepdim(2)?;
        let xc = xg.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(2)?;
        let xhat = xc.broadcast_div(&(var + s.eps)?.sqrt()?)?.reshape((b, c, h, w))?;
        let y = xhat
            .broadcast_mul(&wt.reshape((1, c, 1, 1))?)?
            .broadcast_add(&bias.reshape((1, c, 1, 1))?)?;
        self.record(rec, LayerKind::Norm, [s.weight(), s.bias()], &xhat, y)
    }

    fn resnet(&self, s: &ResnetSpec, x: &Tensor, temb: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let cout = s.cout();
        let mut input = x.clone();
        let mut h = act(s.act, &self.gn(&s.norm1, x, rec)?)?;
        match s.updown {
            Updown::None => {}
            Updown::Down => {
                input = input.avg_pool2d(2)?;
                h = h.avg_pool2d(2)?;
            }
            Updown::Up => {
                input = up2(&input)?;
                h = up2(&h)?;
            }
        }
        let h = self.conv(&s.conv1, &h, rec)?;
        let t = self
            .linear(&s.time_emb_proj, &act(s.act, temb)?, rec)?
            .unsqueeze(2)?
            .unsqueeze(3)?;
        let h = if s.scale_shift {
            let scale = t.narrow(1, 0, cout)?;
            let shift = t.narrow(1, cout, cout)?;
            self.gn(&s.norm2, &h, rec)?
                .broadcast_mul(&(scale + 1.0)?)?
                .broadcast_add(&shift)?
        } else {
            self.gn(&s.norm2, &h.broadcast_add(&t)?, rec)?
        };
        let h = self.conv(&s.conv2, &act(s.act, &h)?, rec)?;
        let input = match &s.shortcut {
            Some(sc) => self.conv(sc, &input, rec)?,
            None => input,
        };
        let out = (input + h)?;
        Ok(if s.output_scale != 1.0 {
            (out / s.output_scale)?
        } else {
            out
        })
    }

    fn attn(&self, s: &AttnSpec, x: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let l = h * w;
        let (heads, head_dim) = (s.heads, s.head_dim);
        let inner = heads * head_dim;
        let hs = match &s.norm {
            Some(n) => self.gn(n, x, rec)?,
            None => x.clone(),
        };
        let hs = hs.reshape((b, c, l))?.transpose(1, 2)?.contiguous()?;
        let split =
            |t: Tensor| -> Result<Tensor> { Ok(t.reshape((b, l, heads, head_dim))?.transpose(1, 2)?.contiguous()?) };
        let q = split(self.linear(&s.q, &hs, rec)?)?;
        let k = split(self.linear(&s.k, &hs, rec)?)?;
        let v = split(self.linear(&s.v, &hs, rec)?)?;
        let scale = 1.0 / (head_dim as f64).sqrt();
        let att = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? * scale)?;
        let att = candle_nn::ops::softmax(&att, D::Minus1)?;
        let o = att.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b, l, inner))?;
        let o = self.linear(&s.out, &o, rec)?.transpose(1, 2)?.reshape((b, c, h, w))?;
        let o = (o + x)?;
        Ok(if s.rescale != 1.0 { (o / s.rescale)? } else { o })
    }

    /// The model output for a batch `x` (B, C, H, W) at timesteps `t` (one per row), with a
    /// graph for backpropagation.
    pub fn forward(&self, x: &Tensor, t: &[f64]) -> Result<Tensor> {
        self.forward_rec(x, t, None)
    }

    fn forward_rec(&self, x: &Tensor, t: &[f64], rec: Option<&Recorder>) -> Result<Tensor> {
        let cfg = &self.config;
        let (b, c, h, w) = x.dims4()?;
        if c != cfg.in_channels {
            return Err(Error::input(format!(
                "input has {c} channels, the model takes {}",
                cfg.in_channels
            )));
        }
        if t.len() != b {
            return Err(Error::input(format!("{} timesteps for a batch of {b}", t.len())));
        }
        let f = 1usize << cfg.downsamplings();
        if h % f != 0 || w % f != 0 {
            return Err(Error::input(format!(
                "image size {h}×{w} is not divisible by {f} (the model downsamples {} times)",
                cfg.downsamplings()
            )));
        }
        let fourier = matches!(cfg.time_embedding, TimeEmbedding::Fourier);
        if fourier && t.iter().any(|&v| v <= 0.0) {
            return Err(Error::input(
                "a Fourier time embedding needs timesteps > 0 (it takes log t)",
            ));
        }
        let dev = x.device();
        let x = x.to_dtype(DType::F32)?;
        let x = if cfg.center_input_sample {
            ((x * 2.0)? - 1.0)?
        } else {
            x
        };
        let mut hcur = x;
        let mut emb: Option<Tensor> = None;
        let mut skips: Vec<Tensor> = Vec::new();
        let emb_of = |e: &Option<Tensor>| -> Result<Tensor> {
            e.clone()
                .ok_or_else(|| Error::model("UNet graph: a ResNet block before the time embedding"))
        };
        for op in &self.graph.ops {
            match op {
                Op::Time(ts) => {
                    let tf = super::time_features(cfg, self.fourier_w.as_deref(), t);
                    let width = tf.len() / b.max(1);
                    let tf = Tensor::from_vec(tf, (b, width), dev)?;
                    emb = Some(self.linear(
                        &ts.linear_2,
                        &candle_nn::ops::silu(&self.linear(&ts.linear_1, &tf, rec)?)?,
                        rec,
                    )?);
                }
                Op::Conv(c) => hcur = self.conv(c, &hcur, rec)?,
                Op::Resnet(r) => hcur = self.resnet(r, &hcur, &emb_of(&emb)?, rec)?,
                Op::Attention(a) => hcur = self.attn(a, &hcur, rec)?,
                Op::Upsample => hcur = up2(&hcur)?,
                Op::SkipPush => skips.push(hcur.clone()),
                Op::SkipPopConcat => {
                    let s = skips
                        .pop()
                        .ok_or_else(|| Error::model("UNet skip connections exhausted (config inconsistent)"))?;
                    hcur = Tensor::cat(&[&hcur, &s], 1)?;
                }
                Op::NormAct(n, a) => hcur = act(*a, &self.gn(n, &hcur, rec)?)?,
            }
        }
        if fourier {
            let tt: Vec<f32> = t.iter().map(|&v| v as f32).collect();
            let tt = Tensor::from_vec(tt, (b, 1, 1, 1), dev)?;
            return Ok(hcur.broadcast_div(&tt)?);
        }
        Ok(hcur)
    }

    /// Per-sample losses Lᵢ = mean over pixels of (ε_θ(x_tᵢ, tᵢ) − εᵢ)² (a [B] tensor with a
    /// graph).
    pub fn per_sample_loss(&self, xt: &Tensor, t: &[f64], eps: &Tensor) -> Result<Tensor> {
        self.loss_rec(xt, t, eps, None)
    }

    fn loss_rec(&self, xt: &Tensor, t: &[f64], eps: &Tensor, rec: Option<&Recorder>) -> Result<Tensor> {
        let pred = self.forward_rec(xt, t, rec)?;
        Ok((pred - eps)?.sqr()?.flatten_from(1)?.mean(1)?)
    }

    /// ∇θ Lᵢ for every sample i of the batch, from one forward and one backward pass (see the
    /// module docs for each layer's formula).
    pub fn per_sample_grads(&self, xt: &Tensor, t: &[f64], eps: &Tensor) -> Result<PerSampleGrads> {
        let b = xt.dim(0)?;
        let rec = Recorder::default();
        let loss = self.loss_rec(xt, t, eps, Some(&rec))?.sum_all()?;
        let grads = loss.backward()?;
        let mut acc: HashMap<String, Tensor> = HashMap::new();
        let mut add = |name: String, g: Tensor| -> Result<()> {
            let g = match acc.remove(&name) {
                Some(prev) => (prev + g)?,
                None => g,
            };
            acc.insert(name, g);
            Ok(())
        };
        for l in rec.layers.borrow().iter() {
            let g = match grads.get(l.probe.as_tensor()) {
                Some(g) => g.clone(),
                None => l.probe.as_tensor().zeros_like()?,
            };
            let (gw, gb) = match l.kind {
                LayerKind::Linear => {
                    let inn = l.input.dim(D::Minus1)?;
                    let out = g.dim(D::Minus1)?;
                    let a = l.input.reshape((b, (), inn))?;
                    let g3 = g.reshape((b, (), out))?;
                    (g3.transpose(1, 2)?.contiguous()?.matmul(&a.contiguous()?)?, g3.sum(1)?)
                }
                LayerKind::Conv => {
                    let (_, cout, ho, wo) = g.dims4()?;
                    let g3 = g.reshape((b, cout, ho * wo))?;
                    let gw = g3.matmul(&l.input.transpose(1, 2)?.contiguous()?)?;
                    (gw, g3.sum(2)?)
                }
                LayerKind::Norm => ((&l.input * &g)?.sum((2, 3))?, g.sum((2, 3))?),
            };
            add(l.names[0].clone(), gw)?;
            add(l.names[1].clone(), gb)?;
        }
        let p = self.params.borrow();
        p.names
            .iter()
            .map(|n| {
                let g = acc
                    .remove(n)
                    .ok_or_else(|| Error::model(format!("no per-sample gradient for `{n}`")))?;
                let mut shape = vec![b];
                shape.extend_from_slice(p.vars[n].dims());
                Ok((n.clone(), g.reshape(shape)?))
            })
            .collect()
    }

    /// The same gradients as [`TrainUnet::per_sample_grads`] with one backward pass per sample
    /// (the reference).
    pub fn per_sample_grads_loop(&self, xt: &Tensor, t: &[f64], eps: &Tensor) -> Result<PerSampleGrads> {
        let b = xt.dim(0)?;
        let vars = self.vars();
        let names = self.names();
        let mut per: Vec<Vec<Tensor>> = vec![Vec::with_capacity(b); vars.len()];
        for i in 0..b {
            let loss = self
                .per_sample_loss(&xt.narrow(0, i, 1)?, &t[i..i + 1], &eps.narrow(0, i, 1)?)?
                .sum_all()?;
            let grads = loss.backward()?;
            for (j, v) in vars.iter().enumerate() {
                let g = match grads.get(v.as_tensor()) {
                    Some(g) => g.clone(),
                    None => v.as_tensor().zeros_like()?,
                };
                per[j].push(g.unsqueeze(0)?);
            }
        }
        names
            .into_iter()
            .zip(per)
            .map(|(n, gs)| Ok((n, Tensor::cat(&gs, 0)?)))
            .collect()
    }
}

/// Opacus' clip factor min(1, C / (‖g‖ + 10⁻⁶)) (`DPOptimizer.clip_and_accumulate`): the
/// clipped gradient has norm < C, so the sum has L2 sensitivity C under add/remove-one.
pub fn clip_factor(norm: f64, clip: f64) -> f64 {
    (clip / (norm + 1e-6)).min(1.0)
}

/// Each sample's gradient norm ‖∇θ Lᵢ‖ over all parameters (summed in f64).
pub fn per_sample_norms(grads: &PerSampleGrads) -> Result<Vec<f64>> {
    let Some((_, first)) = grads.first() else {
        return Ok(Vec::new());
    };
    let b = first.dim(0)?;
    let mut sq = vec![0f64; b];
    for (_, g) in grads {
        let s: Vec<f32> = g.sqr()?.flatten_from(1)?.sum(1)?.to_vec1()?;
        for (a, v) in sq.iter_mut().zip(s) {
            *a += v as f64;
        }
    }
    Ok(sq.into_iter().map(f64::sqrt).collect())
}

/// Σᵢ clip_C(∇θ Lᵢ) by parameter name, and the norms ‖∇θ Lᵢ‖.
pub fn clip_and_sum(grads: &PerSampleGrads, clip: f64) -> Result<(HashMap<String, Tensor>, Vec<f64>)> {
    let norms = per_sample_norms(grads)?;
    let mut out = HashMap::with_capacity(grads.len());
    for (name, g) in grads {
        let b = g.dim(0)?;
        let c: Vec<f32> = norms.iter().map(|&n| clip_factor(n, clip) as f32).collect();
        let mut shape = vec![1usize; g.rank()];
        shape[0] = b;
        let c = Tensor::from_vec(c, shape, g.device())?;
        out.insert(name.clone(), g.broadcast_mul(&c)?.sum(0)?);
    }
    Ok((out, norms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(json: &str) -> Unet2dConfig {
        Unet2dConfig::parse(json, Path::new("config.json")).unwrap()
    }

    /// Attention down/up blocks, a mid block with attention, a 1×1 shortcut, positional time.
    pub(crate) const TINY: &str = r#"{"_class_name": "UNet2DModel", "in_channels": 1, "out_channels": 1,
        "block_out_channels": [8, 16], "down_block_types": ["DownBlock2D", "AttnDownBlock2D"],
        "up_block_types": ["AttnUpBlock2D", "UpBlock2D"], "layers_per_block": 1,
        "norm_num_groups": 4, "attention_head_dim": 4}"#;

    /// scale_shift conditioning, resnet down/upsampling, Fourier time, padding-0 downsampling,
    /// mish, no mid attention, 2 input channels.
    const ODD: &str = r#"{"_class_name": "UNet2DModel", "in_channels": 2, "out_channels": 2,
        "block_out_channels": [8, 8, 12], "down_block_types": ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D"],
        "up_block_types": ["UpBlock2D", "AttnUpBlock2D", "UpBlock2D"], "layers_per_block": 1,
        "norm_num_groups": 4, "attention_head_dim": null, "resnet_time_scale_shift": "scale_shift",
        "downsample_type": "resnet", "upsample_type": "resnet", "time_embedding_type": "fourier",
        "downsample_padding": 0, "act_fn": "mish", "add_attention": false, "mid_block_scale_factor": 1.4142}"#;

    fn batch(config: &Unet2dConfig, b: usize, side: usize, seed: u64) -> (Tensor, Vec<f64>, Tensor) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = b * config.in_channels * side * side;
        let x: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
        let e: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
        let t: Vec<f64> = (0..b).map(|i| 1.0 + (137 * i % 999) as f64).collect();
        let shape = (b, config.in_channels, side, side);
        (
            Tensor::from_vec(x, shape, &Device::Cpu).unwrap(),
            t,
            Tensor::from_vec(e, shape, &Device::Cpu).unwrap(),
        )
    }

    fn rel(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a - b)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let n = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
        (d / n.max(1e-30)).sqrt()
    }

    fn check_batched_equals_loop(json: &str, side: usize) {
        let config = cfg(json);
        let m = TrainUnet::random(&config, 3, &Device::Cpu).unwrap();
        let (x, t, e) = batch(&config, 5, side, 7);
        let fast = m.per_sample_grads(&x, &t, &e).unwrap();
        let slow = m.per_sample_grads_loop(&x, &t, &e).unwrap();
        assert_eq!(fast.len(), slow.len());
        assert_eq!(fast.len(), m.names().len());
        let norms = per_sample_norms(&slow).unwrap();
        let l2 = |t: &Tensor| t.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
        let mut worst = (0.0f64, String::new());
        for ((na, a), (nb, bb)) in fast.iter().zip(&slow) {
            assert_eq!(na, nb);
            assert_eq!(a.dims(), bb.dims(), "{na}");
            // Each sample's gradient of each parameter: relative L2 ≤ 1e-5. A gradient that is
            // zero in exact arithmetic (the key bias: softmax ignores a constant added to every
            // score) is f32 rounding noise in both; it is held to 1e-7 of the sample's norm.
            for (i, &gn) in norms.iter().enumerate() {
                let (ai, bi) = (a.get(i).unwrap(), bb.get(i).unwrap());
                let d = l2(&(&ai - &bi).unwrap()).sqrt();
                let nb = l2(&bi).sqrt();
                assert!(
                    d <= 1e-5 * nb + 1e-7 * gn,
                    "{na} sample {i}: error {d:e}, norm {nb:e} (sample norm {gn:e})"
                );
                if nb > 1e-4 * gn && d / nb > worst.0 {
                    worst = (d / nb, format!("{na} sample {i}"));
                }
            }
        }
        eprintln!(
            "largest relative error of a non-negligible per-sample gradient: {:e} ({})",
            worst.0, worst.1
        );
        let (na, nb) = (per_sample_norms(&fast).unwrap(), per_sample_norms(&slow).unwrap());
        for (a, b) in na.iter().zip(&nb) {
            assert!((a - b).abs() <= 1e-5 * b, "norm {a} vs {b}");
            assert!(*b > 0.0);
        }
    }

    /// The batched per-sample gradients of every parameter (convolutions, group norms,
    /// attention projections, linear layers) equal one backward pass per sample to 1e-5.
    #[test]
    fn batched_per_sample_grads_equal_the_per_sample_loop() {
        check_batched_equals_loop(TINY, 8);
    }

    /// The same on an architecture with every optional part (see `ODD`).
    #[test]
    fn batched_per_sample_grads_equal_the_loop_on_every_block_variant() {
        check_batched_equals_loop(ODD, 8);
    }

    /// The unfold of a strided, padded input reproduces candle's convolution.
    #[test]
    fn unfold_reproduces_the_convolution() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x: Vec<f32> = (0..2 * 3 * 7 * 6)
            .map(|_| rng.sample::<f32, _>(StandardNormal))
            .collect();
        let w: Vec<f32> = (0..4 * 3 * 9).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
        let x = Tensor::from_vec(x, (2, 3, 7, 6), &Device::Cpu).unwrap();
        let w = Tensor::from_vec(w, (4, 3, 3, 3), &Device::Cpu).unwrap();
        for (stride, pad) in [(1, 1), (2, 1), (2, 0), (1, 0)] {
            let want = x.conv2d(&w, pad, stride, 1, 1).unwrap();
            let (_, _, ho, wo) = want.dims4().unwrap();
            let unf = unfold(&x, 3, stride, pad).unwrap();
            let got = w
                .reshape((1, 4, 27))
                .unwrap()
                .broadcast_matmul(&unf)
                .unwrap()
                .reshape((2, 4, ho, wo))
                .unwrap();
            assert!(rel(&got, &want) < 1e-6, "stride {stride} pad {pad}");
        }
    }

    /// Clipping: unclipped samples keep their gradient, clipped ones get norm C (Opacus' factor),
    /// and the sum is Σ cᵢ gᵢ.
    #[test]
    fn clip_and_sum_scales_each_sample() {
        let config = cfg(TINY);
        let m = TrainUnet::random(&config, 4, &Device::Cpu).unwrap();
        let (x, t, e) = batch(&config, 4, 8, 2);
        let g = m.per_sample_grads(&x, &t, &e).unwrap();
        let norms = per_sample_norms(&g).unwrap();
        let mut sorted = norms.clone();
        sorted.sort_by(f64::total_cmp);
        let clip = (sorted[1] + sorted[2]) / 2.0;
        let (sum, n2) = clip_and_sum(&g, clip).unwrap();
        assert_eq!(norms, n2);
        for (name, gi) in &g {
            let mut want = gi.get(0).unwrap().zeros_like().unwrap();
            for (i, &n) in norms.iter().enumerate() {
                let c = if n > clip { clip / (n + 1e-6) } else { 1.0 };
                want = (want + (gi.get(i).unwrap() * c).unwrap()).unwrap();
            }
            assert!(
                rel(&sum[name], &want) < 1e-5
                    || want.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() < 1e-20,
                "{name}"
            );
        }
    }

    /// Weights written by the trainable model load into the inference UNet (the diffusers
    /// loader, which checks every name and shape) and give the same outputs.
    #[test]
    fn saved_weights_load_into_the_inference_unet_with_equal_outputs() {
        for json in [TINY, ODD] {
            let config = cfg(json);
            let m = TrainUnet::random(&config, 5, &Device::Cpu).unwrap();
            let store = super::super::WeightStore::new(m.tensors().unwrap(), Path::new("w.safetensors"));
            let inf = super::super::Unet2dModel::new(&config, &store).unwrap();
            assert_eq!(
                inf.parameters,
                m.parameters() + m.fourier_w.as_ref().map_or(0, Vec::len)
            );
            let (x, t, _) = batch(&config, 3, 8, 9);
            let a = m.forward(&x, &t).unwrap();
            let b = inf.forward_candle(&x, &t).unwrap();
            assert!(rel(&a, &b) < 1e-5, "{}", rel(&a, &b));
            // And back: the same tensors rebuild the trainable model exactly.
            let again = TrainUnet::from_tensors(&config, m.tensors().unwrap(), Path::new("w"), &Device::Cpu).unwrap();
            let c = again.forward(&x, &t).unwrap();
            assert_eq!(rel(&a, &c), 0.0);
        }
    }

    /// A left-over or missing tensor is an input error naming it.
    #[test]
    fn mismatched_tensors_are_named() {
        let config = cfg(TINY);
        let m = TrainUnet::random(&config, 5, &Device::Cpu).unwrap();
        let mut t = m.tensors().unwrap();
        t.insert(
            "extra.weight".into(),
            Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
        );
        let e = TrainUnet::from_tensors(&config, t, Path::new("w.safetensors"), &Device::Cpu)
            .err()
            .unwrap();
        assert!(e.to_string().contains("extra.weight"), "{e}");
        let mut t = m.tensors().unwrap();
        t.remove("conv_in.bias");
        let e = TrainUnet::from_tensors(&config, t, Path::new("w.safetensors"), &Device::Cpu)
            .err()
            .unwrap();
        assert!(e.to_string().contains("conv_in.bias"), "{e}");
    }
}
