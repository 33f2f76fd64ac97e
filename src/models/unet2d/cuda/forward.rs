//! The diffusers `UNet2DModel` forward on a CUDA GPU without candle's element-wise kernels
//! (feature `cudnn`): the same computation as [`super::Unet2dModel::forward_candle`], with
//!
//! * convolutions through cuDNN (`cudnn_conv::CudnnConv2d::launch_raw`, math type of
//!   `--precision`), their biases and the residual additions folded into cuDNN's
//!   `y = α·conv + β·y` (the output buffer is first filled with bias + residual);
//! * group norm, the time-embedding addition or `scale_shift`, and SiLU in one kernel per
//!   (image, group) (`kernels.cu`, `group_norm`);
//! * attention as three strided-batched cuBLAS GEMMs on the NCHW layout (q/k/v in one GEMM with
//!   stacked weights, qᵀk, v·pᵀ) and a row softmax, the output projection accumulating onto the
//!   residual; no transposes;
//! * every buffer allocated from the stream-ordered pool and nothing copied back to the host.
//!
//! It covers the architectures the attacks meet in practice: SiLU activation, sinusoidal time
//! embedding, `default` or `scale_shift` time conditioning, convolutional down/upsampling (any
//! padding), attention with any number of heads. Others (Mish/GELU/ReLU, Fourier embedding,
//! ResNet resampling) and `--precision bf16` use candle's kernels ([`super::super::cuda_unsupported`], a typed reason `dpaudit model info` prints).
//! `DPAUDIT_UNET_CUDA=candle` forces candle's path (for comparisons).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use candle_core::cuda::cudarc;
use candle_core::cuda::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use cudarc::cublas::{sys as blas, CudaBlas};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::super::candle::{AttnBlock, Gn, Node, ResnetBlock};
use super::super::graph::Updown;
use super::super::{Unet2dModel, Unsupported};
use super::cudnn_conv::{CudnnConv2d, Math};
use crate::error::{Error, Result};

/// The kernels, compiled to PTX by build.rs (nvcc) from `kernels.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/unet2d_cuda.ptx"));

fn derr<E: std::fmt::Debug>(e: E) -> Error {
    Error::model(format!("CUDA UNet forward: {e:?}"))
}

/// `DPAUDIT_UNET_CUDA=candle` turns this forward off.
pub(in super::super) fn disabled() -> bool {
    crate::diagnostics::unet_cuda_off()
}

/// A device tensor kept alive with its raw address.
struct W {
    t: Tensor,
    p: u64,
}

fn dptr(t: &Tensor) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    match &*st {
        Storage::Cuda(cs) => {
            let s = cs.as_cuda_slice::<f32>()?;
            let (p, _g) = s.device_ptr(s.stream());
            Ok(p + 4 * l.start_offset() as u64)
        }
        _ => Err(Error::model("CUDA UNet forward: a tensor is not on the GPU")),
    }
}

fn w(t: &Tensor) -> Result<W> {
    let t = t.to_dtype(DType::F32)?.contiguous()?;
    let p = dptr(&t)?;
    Ok(W { t, p })
}

/// A layer's bias, which every layer of a diffusers UNet has (`what` names the layer kind).
fn bias_of(b: Option<&Tensor>, what: &str) -> Result<Tensor> {
    b.cloned()
        .ok_or_else(|| Error::model(format!("CUDA UNet forward: {what} without bias")))
}

struct Conv {
    w: W,
    bias: W,
    cout: usize,
    cin: usize,
    k: usize,
    stride: usize,
    pad: usize,
}

fn conv(c: &candle_nn::Conv2d) -> Result<Conv> {
    let (cout, cin, k, _) = c.weight().dims4()?;
    Ok(Conv {
        w: w(c.weight())?,
        bias: w(&bias_of(c.bias(), "a convolution")?)?,
        cout,
        cin,
        k,
        stride: c.config().stride,
        pad: c.config().padding,
    })
}

struct Norm {
    gamma: W,
    beta: W,
    groups: usize,
    eps: f32,
}

fn norm(g: &Gn) -> Result<Norm> {
    Ok(Norm {
        gamma: w(&g.weight)?,
        beta: w(&g.bias)?,
        groups: g.groups,
        eps: g.eps as f32,
    })
}

struct Res {
    norm1: Norm,
    conv1: Conv,
    /// `default`: time projection bias + conv1 bias; `scale_shift`: the time projection bias.
    tbias: W,
    tw: W,
    norm2: Norm,
    conv2: Conv,
    shortcut: Option<Conv>,
    /// conv2's bias (+ the shortcut's).
    obias: W,
    scale_shift: bool,
    inv_scale: f32,
}

fn res(r: &ResnetBlock) -> Result<Res> {
    let conv1 = conv(&r.conv1)?;
    let conv2 = conv(&r.conv2)?;
    let shortcut = r.shortcut.as_ref().map(conv).transpose()?;
    let tb = bias_of(r.time_emb_proj.bias(), "a time projection")?;
    let tbias = if r.scale_shift { tb } else { (&tb + &conv1.bias.t)? };
    let obias = match &shortcut {
        Some(s) => (&conv2.bias.t + &s.bias.t)?,
        None => conv2.bias.t.clone(),
    };
    Ok(Res {
        norm1: norm(&r.norm1)?,
        tbias: w(&tbias)?,
        tw: w(r.time_emb_proj.weight())?,
        conv1,
        norm2: norm(&r.norm2)?,
        conv2,
        shortcut,
        obias: w(&obias)?,
        scale_shift: r.scale_shift,
        inv_scale: (1.0 / r.output_scale) as f32,
    })
}

struct Attn {
    norm: Option<Norm>,
    wqkv: W,
    bqkv: W,
    wo: W,
    bo: W,
    heads: usize,
    head_dim: usize,
    inv_rescale: f32,
}

fn attn(a: &AttnBlock) -> Result<Attn> {
    let bias = |l: &candle_nn::Linear| bias_of(l.bias(), "an attention projection");
    let wqkv = Tensor::cat(&[a.q.weight(), a.k.weight(), a.v.weight()], 0)?;
    let bqkv = Tensor::cat(&[&bias(&a.q)?, &bias(&a.k)?, &bias(&a.v)?], 0)?;
    Ok(Attn {
        norm: a.norm.as_ref().map(norm).transpose()?,
        wqkv: w(&wqkv)?,
        bqkv: w(&bqkv)?,
        wo: w(a.out.weight())?,
        bo: w(&bias(&a.out)?)?,
        heads: a.heads,
        head_dim: a.head_dim,
        inv_rescale: (1.0 / a.rescale) as f32,
    })
}

struct Lin {
    w: W,
    b: W,
    out: usize,
    inp: usize,
}

fn lin(l: &candle_nn::Linear) -> Result<Lin> {
    let (out, inp) = l.weight().dims2()?;
    let b = bias_of(l.bias(), "a linear layer")?;
    Ok(Lin {
        w: w(l.weight())?,
        b: w(&b)?,
        out,
        inp,
    })
}

enum Step {
    Res(Box<Res>),
    Attn(Box<Attn>),
    /// Push the current activation as a skip connection.
    Push,
    /// Concatenate the last skip connection after the current activation's channels.
    Pop,
    /// Strided convolution (padding 0: pad right and bottom by one first).
    Down(Conv),
    /// Nearest ×2, then the convolution.
    Up(Conv),
}

struct Kernels {
    fill_bcast: CudaFunction,
    add_bcast: CudaFunction,
    silu: CudaFunction,
    affine: CudaFunction,
    upsample2: CudaFunction,
    pad_rb: CudaFunction,
    concat2: CudaFunction,
    group_norm: CudaFunction,
    softmax: CudaFunction,
    noisy: CudaFunction,
    ddim: CudaFunction,
    row_lp: CudaFunction,
    /// Attention in one kernel for head dimensions 8, 16, 32, 64 ([`SMALL_HEADS`]).
    attn_small: [CudaFunction; 4],
}

/// The head dimensions `attn_small_d*` covers; others take the GEMM path.
const SMALL_HEADS: [usize; 4] = [8, 16, 32, 64];
/// Queries per block of `attn_small_d*` (`ATT_TQ` in the .cu).
const ATT_TQ: usize = 128;

/// `DPAUDIT_UNET_ATTENTION=gemm` keeps attention on the GEMM path for every head dimension
/// (for comparisons).
fn gemm_attention() -> bool {
    crate::diagnostics::unet_gemm_attention()
}

/// The UNet laid out for this forward: weights on the GPU (q/k/v stacked, biases combined),
/// the layers as a flat list of steps.
pub(in super::super) struct CudaUnet {
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    t1: Lin,
    t2: Lin,
    conv_in: Conv,
    steps: Vec<Step>,
    norm_out: Norm,
    conv_out: Conv,
    center: bool,
    in_channels: usize,
    out_channels: usize,
    /// The last activated time embedding with its time features and math: the attacks score
    /// every batch of a call at one step, so each forward after the first reuses it.
    temb: Mutex<Option<Temb>>,
    /// `DPAUDIT_TIMING=kernels`: this forward's events so far.
    marks: Mutex<Vec<(&'static str, cudarc::driver::CudaEvent)>>,
    /// `DPAUDIT_CUDA_GRAPH=1`: the captured forwards.
    graphs: Mutex<Vec<Graph>>,
    /// True while a forward is being captured (no timing events then).
    capturing: std::sync::atomic::AtomicBool,
}

/// A computed time embedding: (time features, math, silu(embedding)).
type Temb = (Vec<f32>, Math, Arc<Buf>);

/// A buffer of f32 on the stream's pool.
struct Buf {
    s: CudaSlice<f32>,
    p: u64,
}

impl CudaUnet {
    pub(in super::super) fn new(m: &Unet2dModel) -> Result<Self> {
        let dev = match &m.device {
            Device::Cuda(d) => d.clone(),
            _ => return Err(Error::model("CUDA UNet forward: the weights are not on a GPU")),
        };
        let stream = dev.cuda_stream();
        let module = stream.context().load_module(Ptx::from_src(PTX)).map_err(derr)?;
        let f = |n: &str| module.load_function(n).map_err(derr);
        let k = Kernels {
            fill_bcast: f("fill_bcast")?,
            add_bcast: f("add_bcast")?,
            silu: f("silu_inplace")?,
            affine: f("affine")?,
            upsample2: f("upsample2")?,
            pad_rb: f("pad_rb")?,
            concat2: f("concat2")?,
            group_norm: f("group_norm")?,
            softmax: f("softmax_rows")?,
            noisy: f("noisy_f32")?,
            ddim: f("ddim_f64")?,
            row_lp: f("row_lp")?,
            attn_small: [
                f("attn_small_d8")?,
                f("attn_small_d16")?,
                f("attn_small_d32")?,
                f("attn_small_d64")?,
            ],
        };
        // Library start-up (cuDNN's sub-libraries, cuBLAS) belongs to loading the model.
        super::cudnn_conv::handle(&dev)?;
        let blas = CudaBlas::new(stream.clone()).map_err(derr)?;
        // SAFETY: a valid handle; no TF32 unless a call asks for it through its compute type.
        let st = unsafe { blas::cublasSetMathMode(*blas.handle(), blas::cublasMath_t::CUBLAS_DEFAULT_MATH) };
        if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(derr(st));
        }
        // The graph's ops in order: the time embedding, `conv_in`, the steps between them and
        // the output norm, `conv_out` (an upsampling conv is the op after `Upsample`).
        let (mut time, mut conv_in, mut norm_out, mut conv_out) = (None, None, None, None);
        let mut steps = Vec::new();
        let mut upsample = false;
        for node in &m.nodes {
            match node {
                Node::Time(l1, l2) => time = Some((lin(l1)?, lin(l2)?)),
                Node::Conv(c, extra) if conv_in.is_none() => {
                    debug_assert_eq!(*extra, 0);
                    conv_in = Some(conv(c)?);
                }
                Node::Conv(c, _) if norm_out.is_some() => conv_out = Some(conv(c)?),
                Node::Conv(c, _) if upsample => {
                    upsample = false;
                    steps.push(Step::Up(conv(c)?));
                }
                Node::Conv(c, extra) => {
                    let mut c = conv(c)?;
                    // Padding 0 here means "pad right and bottom by one first" (Step::Down).
                    if *extra > 0 {
                        c.pad = 0;
                    }
                    steps.push(Step::Down(c));
                }
                Node::Resnet(r) if r.updown != Updown::None => {
                    return Err(Error::model(format!(
                        "CUDA UNet forward: {}",
                        Unsupported::ResnetResampling
                    )))
                }
                Node::Resnet(r) => steps.push(Step::Res(Box::new(res(r)?))),
                Node::Attention(a) => steps.push(Step::Attn(Box::new(attn(a)?))),
                Node::Upsample => upsample = true,
                Node::SkipPush => steps.push(Step::Push),
                Node::SkipPopConcat => steps.push(Step::Pop),
                Node::NormAct(n, _) => norm_out = Some(norm(n)?),
            }
        }
        let missing = || Error::model("CUDA UNet forward: the graph lacks an op it needs");
        let (t1, t2) = time.ok_or_else(missing)?;
        let (conv_in, conv_out, norm_out) = (
            conv_in.ok_or_else(missing)?,
            conv_out.ok_or_else(missing)?,
            norm_out.ok_or_else(missing)?,
        );
        let unet = CudaUnet {
            t1,
            t2,
            conv_in,
            conv_out,
            steps,
            norm_out,
            center: m.config.center_input_sample,
            in_channels: m.config.in_channels,
            out_channels: m.config.out_channels,
            dev,
            stream,
            blas,
            k,
            temb: Mutex::new(None),
            marks: Mutex::new(Vec::new()),
            graphs: Mutex::new(Vec::new()),
            capturing: std::sync::atomic::AtomicBool::new(false),
        };
        unet.start_libraries()?;
        Ok(unet)
    }

    /// One 1×1 convolution and one 1×1 product on scratch values: cuDNN and cuBLAS load their
    /// sub-libraries on their first call, which belongs to starting CUDA (as the model's weights
    /// do), not to the first batch an attack scores. Model shapes are not touched.
    fn start_libraries(&self) -> Result<()> {
        let one = self.alloc(3)?;
        self.fill(one.p, self.conv_in.bias.p, 3, 1, 1, 0.0)?;
        let (x, w, y) = (one.p, one.p + 4, one.p + 8);
        let op = CudnnConv2d {
            padding: 0,
            stride: 1,
            precision: Math::Fp32,
        };
        // SAFETY: three values, one each for x, w and y.
        unsafe { op.launch_raw(&self.dev, x, [1, 1, 1, 1], w, [1, 1, 1, 1], (1.0, 0.0), y) }?;
        self.gemm(
            (false, false),
            (1, 1, 1),
            1.0,
            (x, 1, 0),
            (w, 1, 0),
            0.0,
            (y, 1, 0),
            1,
            Math::Fp32,
        )?;
        self.stream.synchronize().map_err(derr)
    }

    fn alloc(&self, n: usize) -> Result<Buf> {
        // SAFETY: every buffer is written in full before it is read (each kernel and GEMM below
        // writes all of its output, or the output was filled first).
        let s = unsafe { self.stream.alloc::<f32>(n.max(1)) }.map_err(derr)?;
        let p = s.device_ptr(&self.stream).0;
        Ok(Buf { s, p })
    }

    fn cfg(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, 1 << 20) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `out[i] = v[(i / inner) % len]·scale`.
    fn fill(&self, out: u64, v: u64, n: usize, inner: usize, len: usize, scale: f32) -> Result<()> {
        let (n64, inner, len) = (n as i64, inner as i32, len as i32);
        let mut b = self.stream.launch_builder(&self.k.fill_bcast);
        b.arg(&out).arg(&v).arg(&n64).arg(&inner).arg(&len).arg(&scale);
        // SAFETY: `out` holds n values, `v` at least len.
        unsafe { b.launch(Self::cfg(n)) }.map_err(derr)?;
        self.mark("fill")?;
        Ok(())
    }

    /// `out[i] = (x[i] + v[(i / inner) % len])·scale`.
    #[allow(clippy::too_many_arguments)]
    fn add(&self, out: u64, x: u64, v: u64, n: usize, inner: usize, len: usize, scale: f32) -> Result<()> {
        let (n64, inner, len) = (n as i64, inner as i32, len as i32);
        let mut b = self.stream.launch_builder(&self.k.add_bcast);
        b.arg(&out).arg(&x).arg(&v).arg(&n64).arg(&inner).arg(&len).arg(&scale);
        // SAFETY: `out` and `x` hold n values, `v` at least len.
        unsafe { b.launch(Self::cfg(n)) }.map_err(derr)?;
        self.mark("add")?;
        Ok(())
    }

    fn silu(&self, x: u64, n: usize) -> Result<()> {
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&self.k.silu);
        b.arg(&x).arg(&n64);
        // SAFETY: `x` holds n values.
        unsafe { b.launch(Self::cfg(n)) }.map_err(derr)?;
        self.mark("silu")?;
        Ok(())
    }

    /// Group norm of `x` (+ `add`), optional `scale_shift` and SiLU into `y`: [b, c, hw].
    #[allow(clippy::too_many_arguments)]
    fn group_norm(
        &self,
        nm: &Norm,
        x: u64,
        y: u64,
        (b, c, hw): (usize, usize, usize),
        add: Option<(u64, usize)>,
        ss: Option<u64>,
        act: bool,
    ) -> Result<()> {
        let g = nm.groups;
        let per = c / g * hw;
        let cache = per * 4 <= 40 * 1024;
        let (add_p, add_ld) = add.map(|(p, ld)| (p, ld as i32)).unwrap_or((0, 0));
        let ss_p = ss.unwrap_or(0);
        let (ci, gi, hwi, acti, cachei) = (c as i32, g as i32, hw as i32, act as i32, cache as i32);
        let mut bld = self.stream.launch_builder(&self.k.group_norm);
        bld.arg(&x)
            .arg(&y)
            .arg(&nm.gamma.p)
            .arg(&nm.beta.p)
            .arg(&add_p)
            .arg(&add_ld)
            .arg(&ss_p)
            .arg(&ci)
            .arg(&gi)
            .arg(&hwi)
            .arg(&nm.eps)
            .arg(&acti)
            .arg(&cachei);
        let cfg = LaunchConfig {
            grid_dim: ((b * g) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: if cache { (per * 4) as u32 } else { 0 },
        };
        // SAFETY: x and y hold b·c·hw values; gamma, beta c; add b·add_ld + c; ss b·2c.
        unsafe { bld.launch(cfg) }.map_err(derr)?;
        self.mark("group norm")?;
        Ok(())
    }

    /// Column-major strided-batched GEMM `C = α·op(A)·op(B) + β·C` (cuBLAS conventions).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        (a, lda, sa): (u64, usize, usize),
        (b, ldb, sb): (u64, usize, usize),
        beta: f32,
        (c, ldc, sc): (u64, usize, usize),
        batch: usize,
        math: Math,
    ) -> Result<()> {
        let op = |t: bool| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let compute = match math {
            Math::Tf32 => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let f32t = blas::cudaDataType::CUDA_R_32F;
        // SAFETY: the buffers hold the described matrices (see the callers' layouts).
        let st = unsafe {
            blas::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                f32t,
                lda as i32,
                sa as i64,
                b as *const c_void,
                f32t,
                ldb as i32,
                sb as i64,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                f32t,
                ldc as i32,
                sc as i64,
                batch as i32,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(derr(st));
        }
        self.mark("gemm")
    }

    /// `y = α·conv(x) + β·y` with x [b, cin, h, w].
    #[allow(clippy::too_many_arguments)]
    fn conv(
        &self,
        c: &Conv,
        x: u64,
        (b, h, wd): (usize, usize, usize),
        pad: usize,
        alpha: f32,
        beta: f32,
        y: u64,
        math: Math,
    ) -> Result<()> {
        let op = CudnnConv2d {
            padding: pad,
            stride: c.stride,
            precision: math,
        };
        let xd = [b as i32, c.cin as i32, h as i32, wd as i32];
        let wdims = [c.cout as i32, c.cin as i32, c.k as i32, c.k as i32];
        // SAFETY: x holds b·cin·h·w values, the weights cout·cin·k·k, y the output.
        unsafe { op.launch_raw(&self.dev, x, xd, c.w.p, wdims, (alpha, beta), y) }.map_err(Error::from)?;
        self.mark(if c.k == 1 { "conv 1x1" } else { "conv" })
    }

    /// `DPAUDIT_TIMING=kernels`: an event after the work queued so far, labelled with what that
    /// work was (the time from the previous event is charged to `what`).
    fn mark(&self, what: &'static str) -> Result<()> {
        // Not with CUDA graphs: a replayed forward has no launches of its own to time.
        if !crate::timing::kernels() || graphs_on() || self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let e = self
            .stream
            .context()
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(derr)?;
        e.record(&self.stream).map_err(derr)?;
        self.marks.lock().unwrap_or_else(|p| p.into_inner()).push((what, e));
        Ok(())
    }

    /// `DPAUDIT_TIMING=kernels`: waits for the forward and adds the GPU time between its events
    /// to [`crate::timing::add_kernel_time`].
    fn charge_marks(&self) -> Result<()> {
        if !crate::timing::kernels() {
            return Ok(());
        }
        self.stream.synchronize().map_err(derr)?;
        let marks = std::mem::take(&mut *self.marks.lock().unwrap_or_else(|p| p.into_inner()));
        for w in marks.windows(2) {
            let ms = w[0].1.elapsed_ms(&w[1].1).map_err(derr)?;
            crate::timing::add_kernel_time(w[1].0, ms as f64);
        }
        Ok(())
    }

    fn out_hw(c: &Conv, h: usize, wd: usize, pad: usize) -> (usize, usize) {
        ((h + 2 * pad - c.k) / c.stride + 1, (wd + 2 * pad - c.k) / c.stride + 1)
    }

    /// A ResNet block on x [b, cin, h, w]; `semb` is silu(temb) [b, temb].
    fn resnet(
        &self,
        r: &Res,
        x: &Buf,
        (b, h, wd): (usize, usize, usize),
        semb: u64,
        temb: usize,
        math: Math,
    ) -> Result<Buf> {
        let hw = h * wd;
        let (cin, cout) = (r.conv1.cin, r.conv1.cout);
        let a = self.alloc(b * cin * hw)?;
        self.group_norm(&r.norm1, x.p, a.p, (b, cin, hw), None, None, true)?;
        let h1 = self.alloc(b * cout * hw)?;
        self.conv(&r.conv1, a.p, (b, h, wd), r.conv1.pad, 1.0, 0.0, h1.p, math)?;
        drop(a);
        let tw = if r.scale_shift { 2 * cout } else { cout };
        let tp = self.alloc(b * tw)?;
        self.fill(tp.p, r.tbias.p, b * tw, 1, tw, 1.0)?;
        // tp[b, o] += Σ_i W[o, i]·semb[b, i]
        self.gemm(
            (true, false),
            (tw, b, temb),
            1.0,
            (r.tw.p, temb, 0),
            (semb, temb, 0),
            1.0,
            (tp.p, tw, 0),
            1,
            math,
        )?;
        let a2 = self.alloc(b * cout * hw)?;
        if r.scale_shift {
            self.group_norm(
                &r.norm2,
                h1.p,
                a2.p,
                (b, cout, hw),
                Some((r.conv1.bias.p, 0)),
                Some(tp.p),
                true,
            )?;
        } else {
            self.group_norm(&r.norm2, h1.p, a2.p, (b, cout, hw), Some((tp.p, cout)), None, true)?;
        }
        drop(h1);
        drop(tp);
        let out = self.alloc(b * cout * hw)?;
        let s = r.inv_scale;
        match &r.shortcut {
            Some(sc) => {
                self.fill(out.p, r.obias.p, b * cout * hw, hw, cout, s)?;
                self.conv(sc, x.p, (b, h, wd), sc.pad, s, 1.0, out.p, math)?;
            }
            None => self.add(out.p, x.p, r.obias.p, b * cout * hw, hw, cout, s)?,
        }
        self.conv(&r.conv2, a2.p, (b, h, wd), r.conv2.pad, s, 1.0, out.p, math)?;
        Ok(out)
    }

    /// Spatial self-attention with residual on x [b, c, h, w].
    fn attention(&self, at: &Attn, x: &Buf, (b, c, l): (usize, usize, usize), math: Math) -> Result<Buf> {
        let normed;
        let a = match &at.norm {
            Some(nm) => {
                normed = self.alloc(b * c * l)?;
                self.group_norm(nm, x.p, normed.p, (b, c, l), None, None, false)?;
                normed.p
            }
            None => x.p,
        };
        let (heads, d) = (at.heads, at.head_dim);
        let inner = heads * d;
        // qkv[b] = Wqkv [3i, c]·a[b] [c, l] + bias: column-major (l × 3i) = a (l × c)·Wqkvᵀ.
        let qkv = self.alloc(b * 3 * inner * l)?;
        self.fill(qkv.p, at.bqkv.p, b * 3 * inner * l, l, 3 * inner, 1.0)?;
        self.gemm(
            (false, false),
            (l, 3 * inner, c),
            1.0,
            (a, l, c * l),
            (at.wqkv.p, c, 0),
            1.0,
            (qkv.p, l, 3 * inner * l),
            b,
            math,
        )?;
        let scale = 1.0 / (d as f32).sqrt();
        let small = SMALL_HEADS.iter().position(|&h| h == d);
        let tiles = l.div_ceil(ATT_TQ);
        if let (Some(i), false, true) = (small, gemm_attention(), tiles <= 65_535) {
            // One kernel: scores, softmax and the weighted values, no l × l matrix.
            let o = self.alloc(b * inner * l)?;
            let (h32, l32) = (heads as i32, l as i32);
            let mut bl = self.stream.launch_builder(&self.k.attn_small[i]);
            bl.arg(&o.p).arg(&qkv.p).arg(&h32).arg(&l32).arg(&scale);
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(b * heads).map_err(derr)?, tiles as u32, 1),
                block_dim: (ATT_TQ as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: qkv holds b·3·inner·l values, o b·inner·l; the kernel reads and writes
            // within them (queries past l only load tiles).
            unsafe { bl.launch(cfg) }.map_err(derr)?;
            self.mark("attention")?;
            drop(qkv);
            return self.attention_out(at, x, o, (b, c, l), math);
        }
        // S[p, q] = Σ_k Q[k, p]·K[k, q]/√d, stored row-major per (image, head): column-major
        // (l × l) X = Kc·Qcᵀ with Kc, Qc the (l × d) column-major views of K and Q.
        let s = self.alloc(b * heads * l * l)?;
        for hd in 0..heads {
            let q = qkv.p + 4 * (hd * d * l) as u64;
            let k = qkv.p + 4 * ((inner + hd * d) * l) as u64;
            self.gemm(
                (false, true),
                (l, l, d),
                scale,
                (k, l, 3 * inner * l),
                (q, l, 3 * inner * l),
                0.0,
                (s.p + 4 * (hd * l * l) as u64, l, heads * l * l),
                b,
                math,
            )?;
        }
        let rows = b * heads * l;
        let (rows64, len) = (rows as i64, l as i32);
        let mut sm = self.stream.launch_builder(&self.k.softmax);
        sm.arg(&s.p).arg(&rows64).arg(&len);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: s holds rows·l values.
        unsafe { sm.launch(cfg) }.map_err(derr)?;
        self.mark("softmax")?;
        // O[k, p] = Σ_q P[p, q]·V[k, q]: column-major (l × d) Oc = Pcᵀ·Vc.
        let o = self.alloc(b * inner * l)?;
        for hd in 0..heads {
            let v = qkv.p + 4 * ((2 * inner + hd * d) * l) as u64;
            self.gemm(
                (true, false),
                (l, d, l),
                1.0,
                (s.p + 4 * (hd * l * l) as u64, l, heads * l * l),
                (v, l, 3 * inner * l),
                0.0,
                (o.p + 4 * (hd * d * l) as u64, l, inner * l),
                b,
                math,
            )?;
        }
        drop(s);
        drop(qkv);
        self.attention_out(at, x, o, (b, c, l), math)
    }

    /// The attention block's output from the heads' values O [b, inner, l]: out = (x + bo +
    /// Wo·O)/rescale, as column-major (l × c) += O (l × i)·Woᵀ.
    fn attention_out(&self, at: &Attn, x: &Buf, o: Buf, (b, c, l): (usize, usize, usize), math: Math) -> Result<Buf> {
        let inner = at.heads * at.head_dim;
        let out = self.alloc(b * c * l)?;
        self.add(out.p, x.p, at.bo.p, b * c * l, l, c, at.inv_rescale)?;
        self.gemm(
            (false, false),
            (l, c, inner),
            at.inv_rescale,
            (o.p, l, inner * l),
            (at.wo.p, inner, 0),
            1.0,
            (out.p, l, c * l),
            b,
            math,
        )?;
        Ok(out)
    }

    /// silu(W·x + b) for `b` rows x of `l.inp` values at `x` (row-major): [b, l.out].
    fn linear_silu(&self, l: &Lin, x: u64, b: usize, math: Math) -> Result<Buf> {
        let y = self.alloc(b * l.out)?;
        self.fill(y.p, l.b.p, b * l.out, 1, l.out, 1.0)?;
        // y[b, o] += Σ_i W[o, i]·x[b, i]
        self.gemm(
            (true, false),
            (l.out, b, l.inp),
            1.0,
            (l.w.p, l.inp, 0),
            (x, l.inp, 0),
            1.0,
            (y.p, l.out, 0),
            1,
            math,
        )?;
        self.silu(y.p, b * l.out)?;
        Ok(y)
    }

    /// silu(W2·silu(W1·tf + b1) + b2): the activated time embedding every ResNet block takes,
    /// reused while `tf` and `math` repeat (a held `Arc` keeps it alive for the forward).
    fn time_embedding(&self, tf: &[f32], b: usize, math: Math) -> Result<Arc<Buf>> {
        let mut last = self.temb.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((f, m, e)) = &*last {
            if f.as_slice() == tf && *m == math {
                return Ok(e.clone());
            }
        }
        let tfd = self.stream.clone_htod(tf).map_err(derr)?;
        let (tfp, _g) = tfd.device_ptr(&self.stream);
        let e1 = self.linear_silu(&self.t1, tfp, b, math)?;
        let e = Arc::new(self.linear_silu(&self.t2, e1.p, b, math)?);
        *last = Some((tf.to_vec(), math, e.clone()));
        Ok(e)
    }

    /// The model output for x (B, C, H, W) on this GPU; `tf` are the time features before the
    /// embedding MLP, [B, width] row-major. Shape checks are the caller's.
    pub(in super::super) fn forward(&self, x: &Tensor, tf: &[f32], math: Math) -> Result<Tensor> {
        let (b, c, h0, w0) = x.dims4()?;
        if c != self.in_channels {
            return Err(Error::model(
                "CUDA UNet forward: input channels differ from the model's",
            ));
        }
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let xp = dptr(&x)?;
        let semb = self.time_embedding(tf, b, math)?;
        if graphs_on() {
            if let Some(y) = self.forward_graph(xp, (b, c, h0, w0), tf, &semb, math)? {
                return Ok(y);
            }
        }
        self.mark("start")?;
        let y = self.alloc(b * self.out_channels * h0 * w0)?;
        self.forward_core(xp, (b, c, h0, w0), &semb, math, y.p)?;
        self.charge_marks()?;
        Ok(self.wrap(y, &[b, self.out_channels, h0, w0]))
    }

    /// The forward of x (at `xp`, [b, c, h0, w0]) into `y` ([b, out_channels, h0, w0]), every
    /// intermediate buffer allocated and freed in stream order (so it can be captured).
    fn forward_core(
        &self,
        xp: u64,
        (b, c, h0, w0): (usize, usize, usize, usize),
        semb: &Buf,
        math: Math,
        y: u64,
    ) -> Result<()> {
        let centred;
        let xin = if self.center {
            centred = self.alloc(b * c * h0 * w0)?;
            let n = (b * c * h0 * w0) as i64;
            let (a2, m1) = (2.0f32, -1.0f32);
            let mut bl = self.stream.launch_builder(&self.k.affine);
            bl.arg(&centred.p).arg(&xp).arg(&n).arg(&a2).arg(&m1);
            // SAFETY: both hold n values.
            unsafe { bl.launch(Self::cfg(n as usize)) }.map_err(derr)?;
            self.mark("affine")?;
            centred.p
        } else {
            xp
        };
        let temb = self.t2.out;
        let c0 = self.conv_in.cout;
        let first = self.alloc(b * c0 * h0 * w0)?;
        self.fill(first.p, self.conv_in.bias.p, b * c0 * h0 * w0, h0 * w0, c0, 1.0)?;
        self.conv(
            &self.conv_in,
            xin,
            (b, h0, w0),
            self.conv_in.pad,
            1.0,
            1.0,
            first.p,
            math,
        )?;
        let (mut ch, mut h, mut wd) = (c0, h0, w0);
        // Skips share their buffer with the activation they were pushed from.
        let mut skips: Vec<(Rc<Buf>, usize, usize, usize)> = Vec::new();
        let mut cur = Rc::new(first);
        for step in &self.steps {
            match step {
                Step::Push => skips.push((cur.clone(), ch, h, wd)),
                Step::Res(r) => {
                    cur = Rc::new(self.resnet(r, &cur, (b, h, wd), semb.p, temb, math)?);
                    ch = r.conv1.cout;
                }
                Step::Attn(at) => {
                    cur = Rc::new(self.attention(at, &cur, (b, ch, h * wd), math)?);
                }
                Step::Pop => {
                    let (s, sc, sh, sw) = skips
                        .pop()
                        .ok_or_else(|| Error::model("UNet skip connections exhausted (config inconsistent)"))?;
                    if (sh, sw) != (h, wd) {
                        return Err(Error::model("CUDA UNet forward: a skip connection of another size"));
                    }
                    let n = b * (ch + sc) * h * wd;
                    let out = self.alloc(n)?;
                    let (n64, ca, cb, hw) = (n as i64, ch as i32, sc as i32, (h * wd) as i32);
                    let mut bl = self.stream.launch_builder(&self.k.concat2);
                    bl.arg(&out.p)
                        .arg(&cur.p)
                        .arg(&s.p)
                        .arg(&n64)
                        .arg(&ca)
                        .arg(&cb)
                        .arg(&hw);
                    // SAFETY: out holds n values, the sources b·ch·hw and b·sc·hw.
                    unsafe { bl.launch(Self::cfg(n)) }.map_err(derr)?;
                    self.mark("concat")?;
                    ch += sc;
                    cur = Rc::new(out);
                }
                Step::Down(cv) => {
                    let (src, pad, sh, sw, padded);
                    if cv.pad == 0 {
                        let n = b * ch * (h + 1) * (wd + 1);
                        padded = self.alloc(n)?;
                        let (n64, hi, wi) = (n as i64, h as i32, wd as i32);
                        let mut bl = self.stream.launch_builder(&self.k.pad_rb);
                        bl.arg(&padded.p).arg(&cur.p).arg(&n64).arg(&hi).arg(&wi);
                        // SAFETY: padded holds n values, the source b·ch·h·w.
                        unsafe { bl.launch(Self::cfg(n)) }.map_err(derr)?;
                        self.mark("pad")?;
                        (src, pad, sh, sw) = (padded.p, 0, h + 1, wd + 1);
                    } else {
                        (src, pad, sh, sw) = (cur.p, cv.pad, h, wd);
                    }
                    let (ho, wo) = Self::out_hw(cv, sh, sw, pad);
                    let out = self.alloc(b * cv.cout * ho * wo)?;
                    self.fill(out.p, cv.bias.p, b * cv.cout * ho * wo, ho * wo, cv.cout, 1.0)?;
                    self.conv(cv, src, (b, sh, sw), pad, 1.0, 1.0, out.p, math)?;
                    (ch, h, wd) = (cv.cout, ho, wo);
                    cur = Rc::new(out);
                }
                Step::Up(cv) => {
                    let n = b * ch * 4 * h * wd;
                    let up = self.alloc(n)?;
                    let (n64, hi, wi) = (n as i64, h as i32, wd as i32);
                    let mut bl = self.stream.launch_builder(&self.k.upsample2);
                    bl.arg(&up.p).arg(&cur.p).arg(&n64).arg(&hi).arg(&wi);
                    // SAFETY: up holds n values, the source b·ch·h·w.
                    unsafe { bl.launch(Self::cfg(n)) }.map_err(derr)?;
                    self.mark("upsample")?;
                    (h, wd) = (2 * h, 2 * wd);
                    let (ho, wo) = Self::out_hw(cv, h, wd, cv.pad);
                    let out = self.alloc(b * cv.cout * ho * wo)?;
                    self.fill(out.p, cv.bias.p, b * cv.cout * ho * wo, ho * wo, cv.cout, 1.0)?;
                    self.conv(cv, up.p, (b, h, wd), cv.pad, 1.0, 1.0, out.p, math)?;
                    (ch, h, wd) = (cv.cout, ho, wo);
                    cur = Rc::new(out);
                }
            }
        }
        drop(skips);
        if (h, wd) != (h0, w0) {
            return Err(Error::model(
                "CUDA UNet forward: the output size differs from the input's",
            ));
        }
        let hw = h * wd;
        let a = self.alloc(b * ch * hw)?;
        self.group_norm(&self.norm_out, cur.p, a.p, (b, ch, hw), None, None, true)?;
        let co = self.out_channels;
        self.fill(y, self.conv_out.bias.p, b * co * hw, hw, co, 1.0)?;
        self.conv(&self.conv_out, a.p, (b, h, wd), self.conv_out.pad, 1.0, 1.0, y, math)?;
        Ok(())
    }

    /// `DPAUDIT_CUDA_GRAPH=1`: the forward replayed from a CUDA graph, one per (shape, math,
    /// time features). A key's first call runs the plain forward (which also builds its cuDNN
    /// plans, grows the workspace and loads the kernels) and then captures the same forward on
    /// static input and output buffers; later calls copy x in, launch the graph (one launch
    /// instead of each kernel's and cuDNN's and cuBLAS's host work), and copy the output out.
    /// A capture that fails leaves that key on the plain forward. `None`: use the plain forward.
    fn forward_graph(
        &self,
        xp: u64,
        (b, c, h0, w0): (usize, usize, usize, usize),
        tf: &[f32],
        semb: &Arc<Buf>,
        math: Math,
    ) -> Result<Option<Tensor>> {
        let co = self.out_channels;
        let (nin, nout) = (b * c * h0 * w0, b * co * h0 * w0);
        let mut graphs = self.graphs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = graphs
            .iter()
            .find(|g| g.shape == (b, c, h0, w0) && g.math == math && g.tf == tf)
        {
            let Some((exec, xin, yout)) = &g.captured else {
                return Ok(None);
            };
            let y = self.alloc(nout)?;
            // SAFETY: x and the graph's input hold nin values, its output and y nout.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(xin.p, xp, nin * 4, self.stream.cu_stream()).map_err(derr)?;
                exec.0.launch().map_err(derr)?;
                cudarc::driver::result::memcpy_dtod_async(y.p, yout.p, nout * 4, self.stream.cu_stream())
                    .map_err(derr)?;
            }
            return Ok(Some(self.wrap(y, &[b, co, h0, w0])));
        }
        if graphs.len() >= MAX_GRAPHS {
            return Ok(None);
        }
        // The plain forward first: this call's result, and every first-use cost out of the way.
        let y = self.alloc(nout)?;
        self.forward_core(xp, (b, c, h0, w0), semb, math, y.p)?;
        let (xin, yout) = (self.alloc(nin)?, self.alloc(nout)?);
        self.capturing.store(true, std::sync::atomic::Ordering::Relaxed);
        let began = self
            .stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        let recorded = began.is_ok() && self.forward_core(xin.p, (b, c, h0, w0), semb, math, yout.p).is_ok();
        // Always leave capture mode, whatever happened inside.
        let ended = if began.is_ok() {
            self.stream
                .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        } else {
            Ok(None)
        };
        self.capturing.store(false, std::sync::atomic::Ordering::Relaxed);
        let captured = match (recorded, ended) {
            (true, Ok(Some(g))) => Some((SendGraph(g), xin, yout)),
            _ => {
                // Frees inside a broken capture record their errors on the context; they belong
                // to the discarded capture, not to later work.
                let _ = self.stream.context().check_err();
                eprintln!(
                    "warning: DPAUDIT_CUDA_GRAPH: capturing the forward of a batch of {b} failed; it runs uncaptured"
                );
                None
            }
        };
        graphs.push(Graph {
            shape: (b, c, h0, w0),
            math,
            tf: tf.to_vec(),
            captured,
            _semb: semb.clone(),
        });
        Ok(Some(self.wrap(y, &[b, co, h0, w0])))
    }
}

/// `DPAUDIT_CUDA_GRAPH=1` turns on [`CudaUnet::forward_graph`] (off by default).
fn graphs_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(crate::diagnostics::cuda_graphs)
}

/// At most this many captured forwards per model (each keeps its own memory).
const MAX_GRAPHS: usize = 32;

/// A CUDA graph used only under [`CudaUnet`]'s mutex (CUDA requires graph calls to be
/// serialised, which the mutex does).
struct SendGraph(cudarc::driver::CudaGraph);
// SAFETY: every use of the graph is under `CudaUnet::graphs`' mutex.
unsafe impl Send for SendGraph {}

/// One captured forward: its key, and the graph with its static input and output buffers (or
/// `None` when capturing failed). The time embedding it reads is kept alive with it.
struct Graph {
    shape: (usize, usize, usize, usize),
    math: Math,
    tf: Vec<f32>,
    captured: Option<(SendGraph, Buf, Buf)>,
    _semb: Arc<Buf>,
}

/// The attacks' arithmetic on device-resident batches (`attacks::mia`), in this module's
/// kernels (`kernels.cu`: the host's rounding, no fused multiply-add), so that an attack on
/// a GPU loads none of candle's kernel modules and keeps no f64 copies of its batch.
impl CudaUnet {
    /// A contiguous f32 tensor on this GPU with its address and element count.
    fn input(&self, t: &Tensor) -> Result<(Tensor, u64, usize)> {
        if t.dtype() != DType::F32 || !t.device().same_device(&Device::Cuda(self.dev.clone())) {
            return Err(Error::model(
                "CUDA attack kernels: the batch is not f32 on the model's GPU",
            ));
        }
        let t = t.contiguous()?;
        let p = dptr(&t)?;
        let n = t.elem_count();
        Ok((t, p, n))
    }

    fn wrap(&self, b: Buf, shape: &[usize]) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(b.s, self.dev.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }

    /// √ᾱ·x₀ + √(1 − ᾱ)·ε with the two factors `sa`, `sb` given in f32.
    pub(in super::super) fn noisy(&self, x0: &Tensor, e: &Tensor, sa: f32, sb: f32) -> Result<Tensor> {
        let ((_x, xp, n), (_e, ep, ne)) = (self.input(x0)?, self.input(e)?);
        if n != ne {
            return Err(Error::model("CUDA attack kernels: x₀ and ε differ in size"));
        }
        let out = self.alloc(n)?;
        let n64 = n as i64;
        let mut b = self.stream.launch_builder(&self.k.noisy);
        b.arg(&out.p).arg(&xp).arg(&ep).arg(&n64).arg(&sa).arg(&sb);
        // SAFETY: out, x₀ and ε hold n values.
        unsafe { b.launch(Self::cfg(n)) }.map_err(derr)?;
        Ok(self.wrap(out, x0.dims()))
    }

    /// The DDIM step's arithmetic given ε: f32((x − sn·ε)/ss·ts + tn·ε) in f64, `c` = (ss, sn,
    /// ts, tn).
    pub(in super::super) fn ddim(&self, x: &Tensor, e: &Tensor, c: [f64; 4]) -> Result<Tensor> {
        let ((_x, xp, n), (_e, ep, ne)) = (self.input(x)?, self.input(e)?);
        if n != ne {
            return Err(Error::model("CUDA attack kernels: x and ε differ in size"));
        }
        let out = self.alloc(n)?;
        let n64 = n as i64;
        let [ss, sn, ts, tn] = c;
        let mut b = self.stream.launch_builder(&self.k.ddim);
        b.arg(&out.p)
            .arg(&xp)
            .arg(&ep)
            .arg(&n64)
            .arg(&ss)
            .arg(&sn)
            .arg(&ts)
            .arg(&tn);
        // SAFETY: out, x and ε hold n values.
        unsafe { b.launch(Self::cfg(n)) }.map_err(derr)?;
        Ok(self.wrap(out, x.dims()))
    }

    /// Mean over each row of |a − b|^p (f64), copied to the host; `a`, `b` of shape [rows, dim].
    pub(in super::super) fn row_lp(&self, a: &Tensor, b: &Tensor, p: f64) -> Result<Vec<f64>> {
        let (rows, dim) = a.dims2()?;
        if b.dims2()? != (rows, dim) {
            return Err(Error::model("CUDA attack kernels: the two batches differ in shape"));
        }
        if rows == 0 || dim == 0 {
            return Ok(vec![0.0; rows]);
        }
        let ((_a, ap, _), (_b, bp, _)) = (self.input(a)?, self.input(b)?);
        // SAFETY: the kernel writes every row's value.
        let out = unsafe { self.stream.alloc::<f64>(rows) }.map_err(derr)?;
        let op = out.device_ptr(&self.stream).0;
        let (r64, d32) = (rows as i64, dim as i32);
        let mode: i32 = if p == 2.0 {
            2
        } else if p == 4.0 {
            4
        } else {
            0
        };
        let mut bl = self.stream.launch_builder(&self.k.row_lp);
        bl.arg(&op).arg(&ap).arg(&bp).arg(&r64).arg(&d32).arg(&p).arg(&mode);
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(rows).map_err(derr)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: out holds `rows` values, a and b rows × dim.
        unsafe { bl.launch(cfg) }.map_err(derr)?;
        self.stream.clone_dtoh(&out).map_err(derr)
    }

    /// The rows `skip..` of each part, one after another, in one new [Σ rows, d] tensor (device
    /// copies, no kernel).
    pub(in super::super) fn gather(&self, parts: &[(Tensor, usize)], d: usize) -> Result<Tensor> {
        let n: usize = parts
            .iter()
            .map(|(t, skip)| t.dim(0).unwrap_or(0).saturating_sub(*skip))
            .sum();
        let out = self.alloc(n * d)?;
        let mut at = 0usize;
        for (t, skip) in parts {
            let (t, p, len) = self.input(t)?;
            let rows = t.dim(0)?;
            if rows * d != len || *skip > rows {
                return Err(Error::model("CUDA attack kernels: a part of another width"));
            }
            let bytes = (rows - skip) * d * 4;
            // SAFETY: the source holds rows × d values from `skip`'s row on; the destination has
            // room for them at `at` (n counts every part's rows after its skip).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    out.p + (at * d * 4) as u64,
                    p + (skip * d * 4) as u64,
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(derr)?;
            at += rows - skip;
        }
        Ok(self.wrap(out, &[n, d]))
    }
}
