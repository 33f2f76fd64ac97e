//! Inference with candle's kernels: [`Unet2dModel`] walks the [`Graph`]'s ops with candle-nn's
//! `Conv2d`, `GroupNorm` and `Linear` (the reference the other executors are tested against),
//! and dispatches a batch to the CPU forward ([`super::cpu`]) on the host or to the CUDA forward
//! (`super::cuda`, feature `cudnn`) on a GPU.
//!
//! Every tensor is looked up by the graph's name with the exact shape the configuration implies;
//! a missing, extra or mis-shaped tensor is an input error naming the file and the tensor.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Conv2d, Conv2dConfig, GroupNorm, Linear, Module};

use super::config::{Act, TimeEmbedding, Unet2dConfig};
#[cfg(feature = "cudnn")]
use super::cuda;
use super::graph::{AttnSpec, ConvSpec, Graph, LinearSpec, NormSpec, Op, ResnetSpec, Updown};
use super::precision::{self, conv2d, linear, Precision};
use super::weights::WeightStore;
use super::{cpu, Unsupported};
use crate::error::{Error, Result};

impl Act {
    fn apply(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Act::Silu => candle_nn::ops::silu(x)?,
            Act::Mish => (x * (x.exp()? + 1.0)?.log()?.tanh()?)?,
            Act::Gelu => x.gelu_erf()?,
            Act::Relu => x.relu()?,
        })
    }
}

/// The convolution `s` with its weights from `w`.
fn load_conv(w: &WeightStore, s: &ConvSpec) -> Result<Conv2d> {
    let wt = w.get(&s.weight(), &s.weight_shape())?;
    let b = w.get(&s.bias(), &[s.cout])?;
    Ok(Conv2d::new(
        wt,
        Some(b),
        Conv2dConfig {
            padding: s.pad,
            stride: s.stride,
            dilation: 1,
            groups: 1,
            cudnn_fwd_algo: None,
        },
    ))
}

/// The linear layer `s` with its weights from `w`.
fn load_linear(w: &WeightStore, s: &LinearSpec) -> Result<Linear> {
    let wt = w.get(&s.weight(), &[s.cout, s.cin])?;
    let b = w.get(&s.bias(), &[s.cout])?;
    Ok(Linear::new(wt, Some(b)))
}

/// The group norm `s` with its weights from `w`.
fn load_norm(w: &WeightStore, s: &NormSpec) -> Result<Gn> {
    if s.groups == 0 || !s.ch.is_multiple_of(s.groups) {
        return Err(Error::input(format!(
            "`{}`: {} groups do not divide {} channels (check norm_num_groups)",
            s.name, s.groups, s.ch
        ))
        .with_file(w.file()));
    }
    let wt = w.get(&s.weight(), &[s.ch])?;
    let b = w.get(&s.bias(), &[s.ch])?;
    Ok(Gn {
        m: GroupNorm::new(wt.clone(), b.clone(), s.ch, s.groups, s.eps)?,
        weight: wt,
        bias: b,
        groups: s.groups,
        eps: s.eps,
    })
}

/// candle-nn's `GroupNorm` with its parameters kept readable (for the CPU forward).
pub(super) struct Gn {
    pub(super) m: GroupNorm,
    pub(super) weight: Tensor,
    pub(super) bias: Tensor,
    pub(super) groups: usize,
    pub(super) eps: f64,
}

impl Gn {
    /// Group norm on a GPU in three kernels instead of candle-nn's dozen element-wise passes:
    /// candle's fused layer-norm kernel over each (image, group) row of C/G·H·W values (f32
    /// statistics), then the per-channel scale and shift. Same definition as diffusers'
    /// `GroupNorm`: (x − mean)/√(var + eps)·γ + β with the biased variance of the group (the
    /// kernel accumulates Σx and Σx² in f32, a one-pass variance; on an H200 `model eval` stayed
    /// within 1.1e-6 relative L2 of diffusers on every fixture). Any device; used on CUDA.
    fn forward_fused(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dt = x.dtype();
        let (b, c) = (x.dim(0)?, x.dim(1)?);
        let n = x.elem_count() / (b * self.groups);
        let rows = x.to_dtype(DType::F32)?.contiguous()?.reshape((b, self.groups, n))?;
        let ones = Tensor::ones(n, DType::F32, x.device())?;
        let zeros = Tensor::zeros(n, DType::F32, x.device())?;
        let y = candle_nn::ops::layer_norm(&rows, &ones, &zeros, self.eps as f32)?;
        let mut per_channel = vec![1usize; x.rank()];
        per_channel[1] = c;
        y.reshape(x.shape())?
            .broadcast_mul(&self.weight.reshape(per_channel.clone())?)?
            .broadcast_add(&self.bias.reshape(per_channel)?)?
            .to_dtype(dt)
    }
}

impl Module for Gn {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if x.device().is_cuda() {
            return self.forward_fused(x);
        }
        // Group statistics in f32 whatever the activations' dtype (bf16 forwards).
        if x.dtype() != DType::F32 {
            return self.m.forward(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype());
        }
        self.m.forward(x)
    }
}

pub(super) struct ResnetBlock {
    pub(super) norm1: Gn,
    pub(super) conv1: Conv2d,
    pub(super) time_emb_proj: Linear,
    pub(super) norm2: Gn,
    pub(super) conv2: Conv2d,
    pub(super) shortcut: Option<Conv2d>,
    pub(super) scale_shift: bool,
    pub(super) act: Act,
    pub(super) output_scale: f64,
    pub(super) updown: Updown,
}

impl ResnetBlock {
    fn new(w: &WeightStore, s: &ResnetSpec) -> Result<Self> {
        Ok(ResnetBlock {
            norm1: load_norm(w, &s.norm1)?,
            conv1: load_conv(w, &s.conv1)?,
            time_emb_proj: load_linear(w, &s.time_emb_proj)?,
            norm2: load_norm(w, &s.norm2)?,
            conv2: load_conv(w, &s.conv2)?,
            shortcut: s.shortcut.as_ref().map(|c| load_conv(w, c)).transpose()?,
            scale_shift: s.scale_shift,
            act: s.act,
            output_scale: s.output_scale,
            updown: s.updown,
        })
    }

    fn forward(&self, x: &Tensor, temb: &Tensor, p: Precision) -> Result<Tensor> {
        let mut input = x.clone();
        let mut h = self.act.apply(&self.norm1.forward(x)?)?;
        match self.updown {
            Updown::None => {}
            Updown::Down => {
                input = input.avg_pool2d(2)?;
                h = h.avg_pool2d(2)?;
            }
            Updown::Up => {
                let (_, _, hh, ww) = h.dims4()?;
                input = input.upsample_nearest2d(hh * 2, ww * 2)?;
                h = h.upsample_nearest2d(hh * 2, ww * 2)?;
            }
        }
        let h = conv2d(&self.conv1, &h, p)?;
        let t = linear(&self.time_emb_proj, &self.act.apply(temb)?)?
            .unsqueeze(2)?
            .unsqueeze(3)?;
        let h = if self.scale_shift {
            let ch = h.dim(1)?;
            let scale = t.narrow(1, 0, ch)?;
            let shift = t.narrow(1, ch, ch)?;
            self.norm2
                .forward(&h)?
                .broadcast_mul(&(scale + 1.0)?)?
                .broadcast_add(&shift)?
        } else {
            self.norm2.forward(&h.broadcast_add(&t)?)?
        };
        let h = conv2d(&self.conv2, &self.act.apply(&h)?, p)?;
        let input = match &self.shortcut {
            Some(s) => conv2d(s, &input, p)?,
            None => input,
        };
        let out = (input + h)?;
        Ok(if self.output_scale != 1.0 {
            (out / self.output_scale)?
        } else {
            out
        })
    }
}

/// diffusers `Attention` as built from the deprecated attention block (spatial self-attention
/// with a residual connection): group norm, q/k/v projections, softmax(q kᵀ/√d) v, output
/// projection, + residual, ÷ rescale factor.
pub(super) struct AttnBlock {
    pub(super) norm: Option<Gn>,
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) out: Linear,
    pub(super) heads: usize,
    pub(super) head_dim: usize,
    pub(super) rescale: f64,
}

impl AttnBlock {
    fn new(w: &WeightStore, s: &AttnSpec) -> Result<Self> {
        Ok(AttnBlock {
            norm: s.norm.as_ref().map(|n| load_norm(w, n)).transpose()?,
            q: load_linear(w, &s.q)?,
            k: load_linear(w, &s.k)?,
            v: load_linear(w, &s.v)?,
            out: load_linear(w, &s.out)?,
            heads: s.heads,
            head_dim: s.head_dim,
            rescale: s.rescale,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, h, wd) = x.dims4()?;
        let l = h * wd;
        let hs = match &self.norm {
            Some(n) => n.forward(x)?,
            None => x.clone(),
        };
        let hs = hs.reshape((b, c, l))?.transpose(1, 2)?.contiguous()?;
        let split = |t: Tensor| -> Result<Tensor> {
            Ok(t.reshape((b, l, self.heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = split(linear(&self.q, &hs)?)?;
        let k = split(linear(&self.k, &hs)?)?;
        let v = split(linear(&self.v, &hs)?)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let att = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? * scale)?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let o = att
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, l, self.heads * self.head_dim))?;
        let o = linear(&self.out, &o)?.transpose(1, 2)?.reshape((b, c, h, wd))?;
        let o = (o + x)?;
        Ok(if self.rescale != 1.0 { (o / self.rescale)? } else { o })
    }
}

/// One op of the [`Graph`] with its candle layers.
pub(super) enum Node {
    /// The time embedding: linear_1, linear_2.
    Time(Linear, Linear),
    /// A convolution with its extra right/bottom zero padding.
    Conv(Conv2d, usize),
    Resnet(Box<ResnetBlock>),
    Attention(Box<AttnBlock>),
    Upsample,
    SkipPush,
    SkipPopConcat,
    NormAct(Gn, Act),
}

/// A diffusers `UNet2DModel` with its weights.
pub struct Unet2dModel {
    /// The architecture.
    pub config: Unet2dConfig,
    /// The graph the executors walk.
    pub graph: Graph,
    /// The graph's ops with their layers, one for one.
    pub(super) nodes: Vec<Node>,
    fourier_w: Option<Tensor>,
    pub(super) device: Device,
    /// Number of scalar parameters.
    pub parameters: usize,
    /// The weights laid out for the CPU forward (`None` when they live on another device).
    cpu: Option<cpu::CpuUnet>,
    /// The CUDA forward (`None` on the CPU or for architectures it does not cover).
    #[cfg(feature = "cudnn")]
    cuda: Option<cuda::CudaUnet>,
}

impl Unet2dModel {
    /// Builds the model from the config, taking every tensor of its [`Graph`] from `w` (which
    /// must then have no tensors left over).
    pub fn new(config: &Unet2dConfig, w: &WeightStore) -> Result<Self> {
        let graph = Graph::new(config);
        if !graph.skips_balance() {
            return Err(Error::model(
                "UNet skip connections do not balance (config inconsistent)",
            ));
        }
        let mut nodes = Vec::with_capacity(graph.ops.len());
        let mut fourier_w = None;
        for op in &graph.ops {
            nodes.push(match op {
                Op::Time(t) => {
                    fourier_w = t.fourier.as_ref().map(|p| w.get(&p.name, &p.shape)).transpose()?;
                    Node::Time(load_linear(w, &t.linear_1)?, load_linear(w, &t.linear_2)?)
                }
                Op::Conv(c) => Node::Conv(load_conv(w, c)?, c.pad_hi - c.pad),
                Op::Resnet(r) => Node::Resnet(Box::new(ResnetBlock::new(w, r)?)),
                Op::Attention(a) => Node::Attention(Box::new(AttnBlock::new(w, a)?)),
                Op::Upsample => Node::Upsample,
                Op::SkipPush => Node::SkipPush,
                Op::SkipPopConcat => Node::SkipPopConcat,
                Op::NormAct(n, a) => Node::NormAct(load_norm(w, n)?, *a),
            });
        }
        let unused = w.unused();
        if !unused.is_empty() {
            let shown: Vec<&str> = unused.iter().take(5).map(String::as_str).collect();
            return Err(Error::input(format!(
                "{} tensor(s) the config's architecture does not use, e.g. `{}` (config.json and the weights do not match)",
                unused.len(),
                shown.join("`, `")
            ))
            .with_file(w.file()));
        }
        let parameters = w.parameters();
        let device = match nodes.get(1) {
            Some(Node::Conv(c, _)) => c.weight().device().clone(),
            _ => Device::Cpu,
        };
        let mut model = Unet2dModel {
            config: config.clone(),
            graph,
            nodes,
            fourier_w,
            device,
            parameters,
            cpu: None,
            #[cfg(feature = "cudnn")]
            cuda: None,
        };
        if model.device.is_cpu() {
            model.cpu = Some(cpu::CpuUnet::new(&model)?);
        }
        #[cfg(feature = "cudnn")]
        if model.device.is_cuda() && super::cuda_coverage(&model.graph).is_none() {
            model.cuda = Some(cuda::CudaUnet::new(&model)?);
        }
        Ok(model)
    }

    /// The executor [`Unet2dModel::forward_at`] runs at precision `p` on this model's device
    /// (named as [`super::executors`] names it): the CPU forward when the weights are on the CPU,
    /// the CUDA forward where it covers the architecture at `p` (fp32 or tf32; feature `cudnn`,
    /// unless the diagnostics variable `DPAUDIT_UNET_CUDA=candle` turns it off), else candle's
    /// kernels. What a report records as the backend of a run.
    pub fn executor(&self, p: Precision) -> &'static str {
        if self.cpu.is_some() {
            return "CPU forward";
        }
        #[cfg(feature = "cudnn")]
        if self.cuda.is_some() && p != Precision::Bf16 && !cuda::disabled() {
            return "CUDA forward";
        }
        let _ = p;
        "candle inference"
    }

    /// What the CUDA forward does not cover on this model (`None`: it runs it).
    pub fn cuda_unsupported(&self) -> Option<Unsupported> {
        super::cuda_unsupported(&self.graph)
    }

    /// The CUDA forward's kernels, for the attacks' arithmetic on its GPU: `Some` when this
    /// model has that forward (feature `cudnn`, a covered architecture, not turned off by
    /// `DPAUDIT_UNET_CUDA=candle`) and every tensor of `on` is f32 on a GPU.
    #[cfg(feature = "cudnn")]
    fn attack_kernels(&self, on: &[&Tensor]) -> Option<&cuda::CudaUnet> {
        let f32_gpu = on.iter().all(|t| t.dtype() == DType::F32 && t.device().is_cuda());
        self.cuda.as_ref().filter(|_| f32_gpu && !cuda::disabled())
    }

    /// √ᾱ·x₀ + √(1 − ᾱ)·ε (factors `sa`, `sb` in f32) on the GPU in one kernel with the host's
    /// rounding; `None` where [`Self::attack_kernels`] is not available (use candle's ops).
    pub fn fused_noisy(&self, x0: &Tensor, e: &Tensor, sa: f32, sb: f32) -> Result<Option<Tensor>> {
        #[cfg(feature = "cudnn")]
        if let Some(cu) = self.attack_kernels(&[x0, e]) {
            return cu.noisy(x0, e, sa, sb).map(Some);
        }
        let _ = (x0, e, sa, sb);
        Ok(None)
    }

    /// A DDIM step's arithmetic given ε in one kernel (f64, the host's rounding), `c` = (√ᾱ_s,
    /// √(1 − ᾱ_s), √ᾱ_t, √(1 − ᾱ_t)); `None` as [`Self::fused_noisy`].
    pub fn fused_ddim(&self, x: &Tensor, e: &Tensor, c: [f64; 4]) -> Result<Option<Tensor>> {
        #[cfg(feature = "cudnn")]
        if let Some(cu) = self.attack_kernels(&[x, e]) {
            return cu.ddim(x, e, c).map(Some);
        }
        let _ = (x, e, c);
        Ok(None)
    }

    /// Each row's mean of |a − b|^p in f64 in one kernel, on the host; `None` as
    /// [`Self::fused_noisy`].
    pub fn fused_row_lp(&self, a: &Tensor, b: &Tensor, p: f64) -> Result<Option<Vec<f64>>> {
        #[cfg(feature = "cudnn")]
        if let Some(cu) = self.attack_kernels(&[a, b]) {
            return cu.row_lp(a, b, p).map(Some);
        }
        let _ = (a, b, p);
        Ok(None)
    }

    /// The rows `skip..` of each [rows, d] part in one [Σ, d] tensor by device copies; `None` as
    /// [`Self::fused_noisy`].
    pub fn fused_gather(&self, parts: &[(Tensor, usize)], d: usize) -> Result<Option<Tensor>> {
        #[cfg(feature = "cudnn")]
        {
            let ts: Vec<&Tensor> = parts.iter().map(|(t, _)| t).collect();
            if let Some(cu) = self.attack_kernels(&ts) {
                return cu.gather(parts, d).map(Some);
            }
        }
        let _ = (parts, d);
        Ok(None)
    }

    fn time_features(&self, t: &[f64], device: &Device) -> Result<Tensor> {
        let v = self.time_features_host(t)?;
        let width = v.len() / t.len().max(1);
        Ok(Tensor::from_vec(v, (t.len(), width), device)?)
    }

    /// The time features before the embedding MLP, [B, width] row-major ([`time_features`]).
    pub(super) fn time_features_host(&self, t: &[f64]) -> Result<Vec<f32>> {
        let w: Option<Vec<f32>> = self.fourier_w.as_ref().map(|w| w.to_vec1()).transpose()?;
        Ok(time_features(&self.config, w.as_deref(), t))
    }

    /// The model output for a batch `x` (B, C, H, W) at timesteps `t` (one per row): on the CPU
    /// through the batch-parallel forward of `cpu/forward.rs`; on a GPU at fp32 or tf32 through
    /// `cuda/forward.rs` (feature `cudnn`) where it covers the architecture; otherwise through
    /// candle's kernels. In fp32 (the reference arithmetic); [`Unet2dModel::forward_at`] takes
    /// the plan's precision.
    pub fn forward(&self, x: &Tensor, t: &[f64]) -> Result<Tensor> {
        self.forward_at(x, t, Precision::Fp32)
    }

    /// [`Unet2dModel::forward`] computing at precision `p` on a GPU (`--precision`; the CPU
    /// forward is fp32 only, which the plan checks with [`precision::check_device`]).
    pub fn forward_at(&self, x: &Tensor, t: &[f64], p: Precision) -> Result<Tensor> {
        precision::apply_gemm(p);
        if !crate::timing::forwards() {
            return self.forward_untimed(x, t, p);
        }
        let t0 = std::time::Instant::now();
        let y = self.forward_untimed(x, t, p)?;
        if x.device().is_cpu() {
            crate::timing::note(format_args!("UNet forward, batch {}", x.dim(0)?), t0);
        } else {
            // The host's share: when it has queued every kernel (a forward whose total is close
            // to this is bound by the host's launches, not by the GPU's work).
            let queued = t0.elapsed().as_secs_f64();
            x.device().synchronize()?;
            crate::timing::note(
                format_args!("UNet forward, batch {} (queued in {queued:.4} s)", x.dim(0)?),
                t0,
            );
        }
        Ok(y)
    }

    fn forward_untimed(&self, x: &Tensor, t: &[f64], p: Precision) -> Result<Tensor> {
        let (b, c, h, wd) = x.dims4()?;
        if self.cpu.is_some() && x.device().is_cpu() {
            let v: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            let y = self.forward_host_at(&v, [b, c, h, wd], t, p)?;
            return Ok(Tensor::from_vec(y, (b, self.config.out_channels, h, wd), x.device())?);
        }
        #[cfg(feature = "cudnn")]
        if let Some(cu) = &self.cuda {
            let math = match p {
                Precision::Fp32 => Some(super::cuda::cudnn_conv::Math::Fp32),
                Precision::Tf32 => Some(super::cuda::cudnn_conv::Math::Tf32),
                Precision::Bf16 => None,
            };
            if let (true, Some(math), false) = (x.device().is_cuda(), math, cuda::disabled()) {
                self.check_input([b, c, h, wd], t)?;
                let tf = self.time_features_host(t)?;
                return cu.forward(x, &tf, math);
            }
        }
        self.forward_candle_at(x, t, p)
    }

    fn check_input(&self, shape: [usize; 4], t: &[f64]) -> Result<()> {
        let [b, c, h, wd] = shape;
        if c != self.config.in_channels {
            return Err(Error::input(format!(
                "input has {c} channels, the model takes {}",
                self.config.in_channels
            )));
        }
        if t.len() != b {
            return Err(Error::input(format!("{} timesteps for a batch of {b}", t.len())));
        }
        let f = 1usize << self.config.downsamplings();
        if h % f != 0 || wd % f != 0 {
            return Err(Error::input(format!(
                "image size {h}×{wd} is not divisible by {f} (the model downsamples {} times)",
                self.config.downsamplings()
            )));
        }
        if matches!(self.config.time_embedding, TimeEmbedding::Fourier) && t.iter().any(|&v| v <= 0.0) {
            return Err(Error::input(
                "a Fourier time embedding needs timesteps > 0 (it takes log t)",
            ));
        }
        Ok(())
    }

    /// [`Unet2dModel::forward`] on host buffers: `x` is (B, C, H, W) row-major; returns
    /// (B, out_channels, H, W) row-major. Uses the CPU forward when the weights are on the CPU;
    /// on a GPU computes in fp32 ([`Unet2dModel::forward_host_at`] takes the plan's precision).
    pub fn forward_host(&self, x: &[f32], shape: [usize; 4], t: &[f64]) -> Result<Vec<f32>> {
        self.forward_host_at(x, shape, t, Precision::Fp32)
    }

    /// [`Unet2dModel::forward_host`] computing at precision `p` on a GPU.
    pub fn forward_host_at(&self, x: &[f32], shape: [usize; 4], t: &[f64], p: Precision) -> Result<Vec<f32>> {
        let [b, c, h, wd] = shape;
        if x.len() != b * c * h * wd {
            return Err(Error::input(format!(
                "batch of {b} images of {c}×{h}×{wd} needs {} values, got {}",
                b * c * h * wd,
                x.len()
            )));
        }
        match &self.cpu {
            Some(cpu) => {
                self.check_input(shape, t)?;
                let tf = self.time_features_host(t)?;
                let fourier: Option<Vec<f32>> = matches!(self.config.time_embedding, TimeEmbedding::Fourier)
                    .then(|| t.iter().map(|&v| v as f32).collect());
                let t0 = std::time::Instant::now();
                let y = cpu.forward(x, shape, &tf, fourier.as_deref(), self.config.center_input_sample);
                if crate::timing::forwards() {
                    crate::timing::note(format_args!("UNet forward, batch {b}"), t0);
                }
                Ok(y)
            }
            None => {
                let dev = &self.device;
                let xt = Tensor::from_slice(x, (b, c, h, wd), dev)?;
                Ok(self.forward_at(&xt, t, p)?.flatten_all()?.to_vec1()?)
            }
        }
    }

    /// The forward through candle's kernels (the path for CUDA; the reference in tests): the
    /// graph's ops in order.
    pub fn forward_candle(&self, x: &Tensor, t: &[f64]) -> Result<Tensor> {
        self.forward_candle_at(x, t, Precision::Fp32)
    }

    /// [`Unet2dModel::forward_candle`] at precision `p` on a GPU.
    pub fn forward_candle_at(&self, x: &Tensor, t: &[f64], prec: Precision) -> Result<Tensor> {
        let (b, c, h, wd) = x.dims4()?;
        self.check_input([b, c, h, wd], t)?;
        let dev = x.device();
        // The activations' dtype: bf16 with `--precision bf16` on a GPU, else f32.
        let dt = if dev.is_cpu() { DType::F32 } else { prec.dtype() };
        let x = x.to_dtype(dt)?;
        let mut hcur = if self.graph.center_input {
            ((x * 2.0)? - 1.0)?
        } else {
            x
        };
        let mut emb: Option<Tensor> = None;
        let emb_of = |e: &Option<Tensor>| -> Result<Tensor> {
            e.clone()
                .ok_or_else(|| Error::model("UNet graph: a ResNet block before the time embedding"))
        };
        let mut skips: Vec<Tensor> = Vec::new();
        for node in &self.nodes {
            match node {
                Node::Time(l1, l2) => {
                    let tf = self.time_features(t, dev)?.to_dtype(dt)?;
                    emb = Some(linear(l2, &candle_nn::ops::silu(&linear(l1, &tf)?)?)?);
                }
                Node::Conv(conv, extra) => {
                    hcur = if *extra > 0 {
                        let p = hcur
                            .pad_with_zeros(D::Minus1, 0, *extra)?
                            .pad_with_zeros(D::Minus2, 0, *extra)?;
                        conv2d(conv, &p, prec)?
                    } else {
                        conv2d(conv, &hcur, prec)?
                    };
                }
                Node::Resnet(r) => hcur = r.forward(&hcur, &emb_of(&emb)?, prec)?,
                Node::Attention(a) => hcur = a.forward(&hcur)?,
                Node::Upsample => {
                    let (_, _, hh, ww) = hcur.dims4()?;
                    hcur = hcur.upsample_nearest2d(hh * 2, ww * 2)?;
                }
                Node::SkipPush => skips.push(hcur.clone()),
                Node::SkipPopConcat => {
                    let s = skips
                        .pop()
                        .ok_or_else(|| Error::model("UNet skip connections exhausted (config inconsistent)"))?;
                    hcur = Tensor::cat(&[&hcur, &s], 1)?;
                }
                Node::NormAct(n, a) => hcur = a.apply(&n.forward(&hcur)?)?,
            }
        }
        let out = hcur.to_dtype(DType::F32)?;
        if self.graph.divide_by_t {
            let tt: Vec<f32> = t.iter().map(|&v| v as f32).collect();
            let tt = Tensor::from_vec(tt, (b, 1, 1, 1), dev)?;
            return Ok(out.broadcast_div(&tt)?);
        }
        Ok(out)
    }
}

/// The time features before the embedding MLP, [B, width] row-major, in f32 as diffusers
/// computes them: `get_timestep_embedding` (exponent_i = −ln(10000)·i/(half − shift),
/// arg = t·exp(exponent_i)), or `GaussianFourierProjection` of ln t with the weights `fourier_w`
/// (x·W·2·π in diffusers' order of operations). Shared by the inference and training UNets.
pub fn time_features(config: &Unet2dConfig, fourier_w: Option<&[f32]>, t: &[f64]) -> Vec<f32> {
    let c0 = config.block_out_channels[0];
    match config.time_embedding {
        TimeEmbedding::Positional {
            flip_sin_to_cos,
            freq_shift,
        } => {
            let half = c0 / 2;
            let ln = -(10000f32.ln());
            let freqs: Vec<f32> = (0..half)
                .map(|i| (ln * i as f32 / (half as f32 - freq_shift as f32)).exp())
                .collect();
            let mut out = vec![0f32; t.len() * c0];
            for (r, &tt) in t.iter().enumerate() {
                let row = &mut out[r * c0..(r + 1) * c0];
                for (i, &f) in freqs.iter().enumerate() {
                    let a = (tt as f32 * f) as f64;
                    let (s, co) = (a.sin() as f32, a.cos() as f32);
                    if flip_sin_to_cos {
                        row[i] = co;
                        row[half + i] = s;
                    } else {
                        row[i] = s;
                        row[half + i] = co;
                    }
                }
            }
            out
        }
        TimeEmbedding::Fourier => {
            let w = fourier_w.unwrap_or(&[]);
            let pi = std::f32::consts::PI;
            let mut out = vec![0f32; t.len() * 2 * c0];
            for (r, &tt) in t.iter().enumerate() {
                let lt = (tt as f32).ln();
                let row = &mut out[r * 2 * c0..(r + 1) * 2 * c0];
                for (i, &wi) in w.iter().enumerate() {
                    let a = (lt * wi * 2.0 * pi) as f64;
                    row[i] = a.sin() as f32;
                    row[c0 + i] = a.cos() as f32;
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod gn_tests {
    use super::*;

    /// The GPU group norm (layer norm per (image, group) row, then scale and shift) equals
    /// candle-nn's `GroupNorm` (run here on the CPU, where both exist).
    #[test]
    fn fused_group_norm_equals_candle_nn() {
        let dev = Device::Cpu;
        let (b, c, h, w, groups) = (2, 8, 5, 3, 4);
        let x = (Tensor::arange(0f32, (b * c * h * w) as f32, &dev)
            .unwrap()
            .sin()
            .unwrap()
            * 3.0)
            .unwrap()
            .reshape((b, c, h, w))
            .unwrap();
        let weight = (Tensor::arange(0f32, c as f32, &dev).unwrap() * 0.25).unwrap();
        let bias = (Tensor::arange(0f32, c as f32, &dev).unwrap() - 2.0).unwrap();
        let gn = Gn {
            m: GroupNorm::new(weight.clone(), bias.clone(), c, groups, 1e-6).unwrap(),
            weight,
            bias,
            groups,
            eps: 1e-6,
        };
        let a: Vec<f32> = gn.forward_fused(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let e: Vec<f32> = gn.m.forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let worst = a.iter().zip(&e).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-5, "largest difference {worst}");
    }
}

#[cfg(test)]
mod size_tests {
    use std::path::Path;

    use super::*;

    /// The parameter count from the config alone (what the size limit checks before building)
    /// is the loaded model's, on every fixture architecture (attention or not, Fourier time
    /// embedding, ResNet resampling) and the shipped MNIST models.
    #[test]
    fn parameter_count_from_the_config_is_the_built_models() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in [
            "fixtures/diffusers/unet-28-c1-attn",
            "fixtures/diffusers/unet-32-c3-noattn",
            "fixtures/diffusers/unet-28-c1-fourier",
            "fixtures/diffusers/unet-32-c3-attn",
            "models/mnist-ddpm",
        ] {
            let ck = crate::models::diffusers::DiffusersCheckpoint::load(&root.join(dir), &Device::Cpu).unwrap();
            assert_eq!(ck.model.config.parameter_count(), ck.model.parameters as f64, "{dir}");
        }
    }

    /// A config over the parameter limit, or deeper than [`MAX_LAYERS_PER_BLOCK`], is refused
    /// when parsed, naming the field; at the depth limit it parses.
    #[test]
    fn oversized_and_deep_configs_are_refused_when_parsed() {
        let base = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/mnist-ddpm/config.json"))
            .unwrap();
        let with = |k: &str, v: &str| {
            let mut j: serde_json::Value = serde_json::from_str(&base).unwrap();
            j[k] = serde_json::from_str(v).unwrap();
            j.to_string()
        };
        let p = Path::new("config.json");
        Unet2dConfig::parse(&with("layers_per_block", "64"), p).unwrap();
        let e = Unet2dConfig::parse(&with("layers_per_block", "65"), p).unwrap_err();
        assert!(e.to_string().contains("layers_per_block"), "{e}");
        let e = Unet2dConfig::parse(&with("block_out_channels", "[16384, 16384]"), p).unwrap_err();
        assert!(e.to_string().contains("parameters (from config.json)"), "{e}");
    }
}
