//! The CPU forward of [`super::Unet2dModel`] on plain `f32` buffers (what `model eval` and the
//! attacks run when the device is the CPU); candle's kernels stay the path for CUDA and the
//! reference in tests.
//!
//! Why not candle's CPU ops: at 2 threads candle spends most of a UNet forward in its thread
//! barrier's spin-wait, and at 1 thread in a scalar im2col and unfused element-wise passes. Here:
//!
//! * **Batch-parallel**: the batch is cut into chunks of images, one rayon task each; a chunk runs
//!   the whole network on its thread (single-threaded GEMMs), so no thread ever waits on another
//!   inside a layer.
//! * **Channel-major layout** (C, N, H, W) inside a chunk: a convolution is one GEMM
//!   W[cout, cin·k²] × col[cin·k², N·H·W] whose output is already the next layer's input, 1×1
//!   convolutions and the attention projections need no im2col at all, and a channel concat is
//!   an append.
//! * **Direct 3 × 3 convolutions** for the "same" convolutions narrower than Winograd takes
//!   (all of models/mnist-ddpm's): per image, the input planes are copied once into three
//!   zero-guarded copies, and a vector tile keeps 8 output channels × 48 pixels in registers over
//!   all cin · 9 taps ([`super::kernels::conv3x3`]); no column matrix is written, nor
//!   packed by a GEMM. On models/mnist-ddpm (1 thread) this took 14–21 % off whole PIA and SecMI
//!   runs, against im2col + GEMM.
//! * **im2col by shifted planes** for the other convolutions (strided, and all of them on a CPU
//!   without AVX2 + FMA): one contiguous copy per plane and tap, wrapped edges zeroed, in tiles
//!   of whole images or of output rows whose column matrix stays in L2 (512 KB), in one buffer
//!   reused for the whole forward.
//! * **Winograd F(4×4, 3×3)** for the 3 × 3 "same" convolutions with ≥ 128 input channels (most
//!   of a CIFAR-sized UNet's arithmetic): 36 GEMMs of depth cin on transformed 6 × 6 tiles
//!   instead of one of depth 9·cin, 4× fewer multiplications (Lavin & Gray 2016, §4.2). The
//!   transforms run on a channel's whole group of tile rows at once (long vectors); the
//!   transformed weights take 4× the memory of the kernels.
//! * **Fused epilogues**: the bias (plus the time embedding, for `default` time conditioning) is
//!   the GEMM's initial value; the residual (or its 1×1 shortcut) is the second convolution's
//!   initial value; group norm, the scale/shift of `scale_shift` conditioning and the activation
//!   are one affine-plus-activation pass per channel; [`super::kernels::exp`] vectorises.
//! * **Attention** per (image, head) on strided views of the projected q/k/v: for head dimensions
//!   ≤ 16 one vectorised kernel over blocks of queries ([`super::kernels::attend_small`]:
//!   no L × L matrix at all), for wider heads two GEMMs with one L × L score matrix per task.
//! * **Buffers kept per thread** across forwards (feature maps, column matrix, kernel scratch), and
//!   tasks sized so that their feature maps stay in L2 when the weights stay in cache
//!   ([`CHUNK_BUDGET`]).
//!
//! Arithmetic follows the diffusers modules layer by layer (`resnet.py`, `attention_processor.py`,
//! `unet_2d.py`); group-norm statistics are accumulated in f64.

use std::cell::RefCell;

use rayon::prelude::*;

use super::super::candle::{AttnBlock, Gn, Node, ResnetBlock};
use super::super::graph::Updown;
use super::super::{Act, Unet2dModel};
use super::kernels::{
    affine, attend_small, conv3x3, conv3x3_scratch, exp, exp_rows, sgemm, silu_inplace, sq_dev, sum, wino4_input,
    wino4_output, wino4_scratch, wino4_weights, zeroed_huge, Direct3x3, Head, Isa, Mat, SMALL_HEAD_MAX,
};
use crate::error::{Error, Result};
use candle_core::Tensor;
use candle_nn::{Conv2d, Linear};

/// Column-matrix budget of one GEMM, in floats (512 KB: the panel stays in L2).
const COL_BUDGET: usize = 1 << 17;
/// Activation budget of one task's widest feature map, in floats: sets how many images a task
/// takes. Every task reads all the weights, so a model with large weights takes 4 MB (32×32×128:
/// 8 images; with 512 KB, one image a task, PIA on the DDPM-CIFAR10 architecture took 12 % more
/// time), and one whose weights stay in cache takes 512 KB, so that a task's feature maps stay in
/// L2 between layers (models/mnist-ddpm: 10 images of 28×28×16 a task; SecMI took 12 % less time
/// than with whole batches of 64).
const CHUNK_BUDGET: usize = 1 << 20;
/// [`CHUNK_BUDGET`] for models with at most [`CACHED_WEIGHTS`] parameters.
const CACHED_CHUNK_BUDGET: usize = 1 << 17;
/// Parameters (floats) of a model whose weights every task can re-read from cache (4 MB).
const CACHED_WEIGHTS: usize = 1 << 20;
/// Budget of one Winograd tile group's transformed input or output, in floats
/// (8 MB: 36 × max(cin, cout) × tiles). Each group's 36 GEMMs re-read all 36 transformed weight
/// matrices, so a larger group reads them less often and gives the GEMMs more columns: on the
/// DDPM-CIFAR10 architecture (1 thread, 16 images) a forward took 1.05 s with this budget,
/// 1.07 s with 4 MB and 1.13 s with 16 MB (the fastest of 3–6 runs each, on a shared 2-core
/// machine; F(2×2, 3×3) with a 1 MB budget, before: 1.30 s).
const WINO_BUDGET: usize = 1 << 21;
/// Fewest input channels for which a 3 × 3 "same" convolution runs as Winograd F(4×4, 3×3):
/// with fewer, its 36 GEMMs of depth cin are too shallow to gain from doing 4× fewer
/// multiplications (models/mnist-ddpm, 16–32 channels, was 10–20 % slower with them).
const WINO_MIN_CIN: usize = 128;

fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// `f` of a tensor's values: borrowed from its storage when it is a contiguous f32 tensor in
/// host memory (no copy: the Winograd weights are built from the checkpoint's own buffers),
/// else a copy ([`host`]).
fn with_host<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (st, l) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) =
            (&*st, l.contiguous_offsets())
        {
            return Ok(f(&v[a..b]));
        }
    }
    Ok(f(&host(t)?))
}

struct Conv {
    /// [cout, cin·k²] (empty when `wino` holds the transformed weights instead).
    w: Vec<f32>,
    /// The Winograd F(4×4, 3×3) weights [36][cout][cin] of a stride-1, padding-1 3 × 3 kernel.
    wino: Option<Vec<f32>>,
    /// The same kind of kernel packed for the direct convolution ([`conv3x3`]), when it has
    /// fewer input channels than Winograd takes.
    direct: Option<Direct3x3>,
    b: Vec<f32>,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad_lo: usize,
    pad_hi: usize,
}

/// Which forms the 3 × 3 "same" convolutions take.
#[derive(Clone, Copy)]
struct Forms {
    /// The fewest input channels for the Winograd form (see [`WINO_MIN_CIN`]).
    wino_min_cin: usize,
    /// The others run as the direct convolution ([`conv3x3`]) rather than im2col + GEMM.
    direct: bool,
}

impl Forms {
    /// Winograd from [`WINO_MIN_CIN`] input channels, the direct convolution below it where
    /// the CPU has its vector tiles (AVX-512F or AVX2 + FMA; elsewhere im2col + GEMM, since
    /// the plain-loop copy's fused multiply-adds are software there).
    fn default_for_this_cpu() -> Forms {
        Forms {
            wino_min_cin: WINO_MIN_CIN,
            direct: Isa::best() != Isa::Scalar,
        }
    }
}

impl Conv {
    fn new(c: &Conv2d, pad_hi_extra: usize, forms: Forms) -> Result<Self> {
        let (cout, cin, k, k2) = c.weight().dims4()?;
        if k != k2 {
            return Err(Error::model("non-square convolution kernel"));
        }
        let cfg = c.config();
        let (pad_lo, pad_hi) = (cfg.padding, cfg.padding + pad_hi_extra);
        let same3 = k == 3 && cfg.stride == 1 && pad_lo == 1 && pad_hi == 1;
        let (w, wino, direct) = if same3 && cin >= forms.wino_min_cin {
            (
                Vec::new(),
                Some(with_host(c.weight(), |w| wino4_weights(w, cout, cin))?),
                None,
            )
        } else if same3 && forms.direct {
            (
                Vec::new(),
                None,
                Some(with_host(c.weight(), |w| Direct3x3::new(w, cout, cin))?),
            )
        } else {
            (host(c.weight())?, None, None)
        };
        Ok(Conv {
            w,
            wino,
            direct,
            b: match c.bias() {
                Some(b) => host(b)?,
                None => vec![0.0; cout],
            },
            cin,
            cout,
            k,
            stride: cfg.stride,
            pad_lo: cfg.padding,
            pad_hi: cfg.padding + pad_hi_extra,
        })
    }
}

struct Lin {
    w: Vec<f32>,
    b: Vec<f32>,
    cin: usize,
    cout: usize,
}

impl Lin {
    fn new(l: &Linear) -> Result<Self> {
        let (cout, cin) = l.weight().dims2()?;
        Ok(Lin {
            w: host(l.weight())?,
            b: match l.bias() {
                Some(b) => host(b)?,
                None => vec![0.0; cout],
            },
            cin,
            cout,
        })
    }

    /// Several projections of the same input stacked into one ([Σ cout, cin]): one GEMM.
    fn stack(ls: &[&Linear]) -> Result<Self> {
        let parts = ls.iter().map(|l| Lin::new(l)).collect::<Result<Vec<_>>>()?;
        let cin = parts.first().map_or(0, |p| p.cin);
        if parts.iter().any(|p| p.cin != cin || p.cout != parts[0].cout) {
            return Err(Error::model("attention projections of different shapes"));
        }
        Ok(Lin {
            w: parts.iter().flat_map(|p| p.w.iter().copied()).collect(),
            b: parts.iter().flat_map(|p| p.b.iter().copied()).collect(),
            cin,
            cout: parts.iter().map(|p| p.cout).sum(),
        })
    }

    /// Rows `x` [n, cin] → [n, cout].
    fn rows(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut out: Vec<f32> = (0..n).flat_map(|_| self.b.iter().copied()).collect();
        sgemm(
            n,
            self.cout,
            self.cin,
            &mut out,
            self.cout,
            true,
            Mat::rows(x, self.cin),
            Mat::cols(&self.w, self.cin),
            1.0,
        );
        out
    }

    /// Channel-major features `x` [cin, m] → [cout, m]; `init` (same shape as the output) is
    /// added to the result.
    fn channels(&self, ctx: &mut Ctx, x: &[f32], m: usize, init: Option<Vec<f32>>) -> Vec<f32> {
        let mut out = match init {
            Some(mut i) => {
                for (row, &b) in i.chunks_exact_mut(m).zip(&self.b) {
                    for v in row {
                        *v += b;
                    }
                }
                i
            }
            None => {
                let mut o = ctx.take(self.cout * m);
                for (row, &b) in o.chunks_exact_mut(m).zip(&self.b) {
                    row.fill(b);
                }
                o
            }
        };
        sgemm(
            self.cout,
            m,
            self.cin,
            &mut out,
            m,
            true,
            Mat::rows(&self.w, self.cin),
            Mat::rows(x, m),
            1.0,
        );
        out
    }
}

struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
    groups: usize,
    eps: f64,
}

impl Norm {
    fn new(n: &Gn) -> Result<Self> {
        Ok(Norm {
            g: host(&n.weight)?,
            b: host(&n.bias)?,
            groups: n.groups,
            eps: n.eps,
        })
    }
}

fn act_inplace(act: Act, v: &mut [f32]) {
    match act {
        Act::Silu => silu_inplace(v),
        Act::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
        Act::Gelu => v
            .iter_mut()
            .for_each(|x| *x = 0.5 * *x * (1.0 + libm::erff(*x * std::f32::consts::FRAC_1_SQRT_2))),
        Act::Mish => v.iter_mut().for_each(|x| *x *= (exp(*x) + 1.0).ln().tanh()),
    }
}

/// A chunk's feature map, channel-major: `d[(c·nb + b)·h·w + y·w + x]`.
struct Feat {
    d: Vec<f32>,
    c: usize,
    h: usize,
    w: usize,
}

impl Feat {
    fn hw(&self) -> usize {
        self.h * self.w
    }
}

/// Buffers a thread keeps from one forward to the next: the column matrix (or the Winograd
/// input matrix, or the direct convolution's guarded input copies), the Winograd products, the attention kernel's scratch and a pool of feature-map buffers.
/// Reusing them spares every forward of a DDIM loop the page faults and zero-filling of fresh
/// allocations (the allocator returns large blocks to the system when they are freed).
#[derive(Default)]
struct Scratch {
    col: Vec<f32>,
    acc: Vec<f32>,
    att: Vec<f32>,
    free: Vec<Vec<f32>>,
}

/// Makes the scratch matrix `v` at least `len` floats long; its contents are not kept (every
/// user writes the part it reads). A new one is on 2 MB pages ([`zeroed_huge`]): the
/// column and Winograd matrices are several MB, read and written in many strided rows.
fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        *v = Vec::new();
        *v = zeroed_huge(len);
    }
}

/// Most buffers a thread's pool keeps (more than one forward of any supported UNet holds at once).
const POOL_MAX: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Per-task state: the number of images and the thread's reused buffers.
struct Ctx {
    nb: usize,
    s: Scratch,
}

impl Ctx {
    /// Takes the calling thread's buffers (an empty set if they are in use higher up the stack).
    fn new(nb: usize) -> Self {
        Ctx {
            nb,
            s: SCRATCH.with(|c| {
                c.try_borrow_mut()
                    .map(|mut s| std::mem::take(&mut *s))
                    .unwrap_or_default()
            }),
        }
    }

    /// Gives the buffers back to the calling thread for its next forward.
    fn finish(self) {
        SCRATCH.with(|c| {
            if let Ok(mut s) = c.try_borrow_mut() {
                *s = self.s;
            }
        });
    }

    /// A buffer of `len` floats from the pool (the smallest that holds them) or a new one; its
    /// contents are unspecified: the caller writes every element.
    fn take(&mut self, len: usize) -> Vec<f32> {
        let mut v = self.pick(len);
        // A pooled buffer keeps its old length and contents: only what lies beyond is written.
        if v.len() >= len {
            v.truncate(len);
        } else {
            v.resize(len, 0.0);
        }
        v
    }

    /// An empty buffer with room for `cap` floats, from the pool when one fits.
    fn take_empty(&mut self, cap: usize) -> Vec<f32> {
        let mut v = self.pick(cap);
        v.clear();
        v
    }

    /// The smallest pooled buffer with room for `cap` floats (as it was given back), or a new
    /// empty one.
    fn pick(&mut self, cap: usize) -> Vec<f32> {
        let best = self
            .s
            .free
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= cap)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => self.s.free.swap_remove(i),
            None => Vec::with_capacity(cap),
        }
    }

    /// Returns a buffer to the pool.
    fn give(&mut self, v: Vec<f32>) {
        if v.capacity() == 0 {
            return;
        }
        if self.s.free.len() < POOL_MAX {
            self.s.free.push(v);
        } else if let Some((i, _)) = self.s.free.iter().enumerate().min_by_key(|(_, b)| b.capacity()) {
            if self.s.free[i].capacity() < v.capacity() {
                self.s.free[i] = v;
            }
        }
    }

    /// A pooled copy of `x`.
    fn copy(&mut self, x: &Feat) -> Feat {
        let mut d = self.take_empty(x.d.len());
        d.extend_from_slice(&x.d);
        Feat { d, ..*x }
    }

    fn conv(&mut self, cv: &Conv, x: &Feat, init: Option<Vec<f32>>, bias_nb: Option<&[f32]>) -> Feat {
        conv(self, cv, x, init, bias_nb)
    }
}

/// Convolution of `x`; the output starts from the bias, plus `bias_nb[b·cout + c]` per image
/// when given, plus `init` (same shape as the output) when given, and the GEMM accumulates on it.
fn conv(ctx: &mut Ctx, cv: &Conv, x: &Feat, init: Option<Vec<f32>>, bias_nb: Option<&[f32]>) -> Feat {
    let nb = ctx.nb;
    let (k, s) = (cv.k, cv.stride);
    let ho = (x.h + cv.pad_lo + cv.pad_hi - k) / s + 1;
    let wo = (x.w + cv.pad_lo + cv.pad_hi - k) / s + 1;
    let (hwo, hwi) = (ho * wo, x.hw());
    let mut out = match init {
        Some(mut out) => {
            debug_assert_eq!(out.len(), cv.cout * nb * hwo);
            for c in 0..cv.cout {
                for b in 0..nb {
                    let add = cv.b[c] + bias_nb.map_or(0.0, |t| t[b * cv.cout + c]);
                    for v in &mut out[(c * nb + b) * hwo..(c * nb + b + 1) * hwo] {
                        *v += add;
                    }
                }
            }
            out
        }
        // Started from the bias directly (no zeroing pass).
        None => {
            let mut out = ctx.take(cv.cout * nb * hwo);
            for (p, plane) in out.chunks_exact_mut(hwo).enumerate() {
                let (c, b) = (p / nb, p % nb);
                plane.fill(cv.b[c] + bias_nb.map_or(0.0, |t| t[b * cv.cout + c]));
            }
            out
        }
    };
    if let Some(u) = &cv.wino {
        wino_conv(ctx, cv, u, x, &mut out);
        return Feat {
            d: out,
            c: cv.cout,
            h: ho,
            w: wo,
        };
    }
    if let Some(d) = &cv.direct {
        grow(&mut ctx.s.col, conv3x3_scratch(cv.cin, x.h, x.w));
        conv3x3(d, &x.d, nb, x.h, x.w, &mut out, &mut ctx.s.col);
        return Feat {
            d: out,
            c: cv.cout,
            h: ho,
            w: wo,
        };
    }
    let kk = cv.cin * k * k;
    if k == 1 && s == 1 && cv.pad_lo == 0 && cv.pad_hi == 0 {
        sgemm(
            cv.cout,
            nb * hwo,
            cv.cin,
            &mut out,
            nb * hwo,
            true,
            Mat::rows(&cv.w, kk),
            Mat::rows(&x.d, nb * hwi),
            1.0,
        );
        return Feat {
            d: out,
            c: cv.cout,
            h: ho,
            w: wo,
        };
    }
    // A stride-1 "same" convolution: each column-matrix plane is the input plane shifted.
    let same = s == 1 && ho == x.h && wo == x.w;
    // Tiles of whole images, or of output rows of one image, whose column matrix fits the
    // budget (an L2-sized panel the GEMM streams through).
    let mut tiles = Vec::new();
    if kk * hwo <= COL_BUDGET {
        let sub = (COL_BUDGET / (kk * hwo)).clamp(1, nb);
        for b0 in (0..nb).step_by(sub) {
            tiles.push((b0, sub.min(nb - b0), 0, ho));
        }
    } else {
        let rows = (COL_BUDGET / (kk * wo).max(1)).clamp(1, ho);
        for b0 in 0..nb {
            for y0 in (0..ho).step_by(rows) {
                tiles.push((b0, 1, y0, (y0 + rows).min(ho)));
            }
        }
    }
    for (b0, sb, y0, y1) in tiles {
        let per = (y1 - y0) * wo;
        let ncol = sb * per;
        grow(&mut ctx.s.col, kk * ncol);
        let col = &mut ctx.s.col[..kk * ncol];
        for ci in 0..cv.cin {
            for dy in 0..k {
                for dx in 0..k {
                    let row = &mut col[((ci * k + dy) * k + dx) * ncol..][..ncol];
                    for bi in 0..sb {
                        let src = &x.d[(ci * nb + b0 + bi) * hwi..][..hwi];
                        let dst = &mut row[bi * per..][..per];
                        if same {
                            let (oy, ox) = (dy as isize - cv.pad_lo as isize, dx as isize - cv.pad_lo as isize);
                            shifted_plane(src, dst, x.w, (y0 as isize + oy) * x.w as isize + ox, ox);
                        } else {
                            im2col_plane(src, dst, x.h, x.w, y0..y1, wo, dy, dx, s, cv.pad_lo);
                        }
                    }
                }
            }
        }
        sgemm(
            cv.cout,
            ncol,
            kk,
            &mut out[b0 * hwo + y0 * wo..],
            nb * hwo,
            true,
            Mat::rows(&cv.w, kk),
            Mat::rows(col, ncol),
            1.0,
        );
    }
    Feat {
        d: out,
        c: cv.cout,
        h: ho,
        w: wo,
    }
}

/// A stride-1, padding-1 3 × 3 convolution as Winograd F(4×4, 3×3) (Lavin & Gray 2016, §4.2):
/// per group of tile rows (4 output rows × all columns, over the chunk's images), the input
/// transform V [36][cin][tiles], 36 GEMMs M[ξ] = U[ξ] V[ξ] ([cout][tiles]), and the output
/// transform added into `out`: 4× fewer multiplications than the direct convolution.
fn wino_conv(ctx: &mut Ctx, cv: &Conv, u: &[f32], x: &Feat, out: &mut [f32]) {
    let nb = ctx.nb;
    let Scratch { col, acc, .. } = &mut ctx.s;
    let (h, w, hw) = (x.h, x.w, x.hw());
    let (th, tw) = (h.div_ceil(4), w.div_ceil(4));
    let rows = nb * th;
    let per = (WINO_BUDGET / (36 * cv.cin.max(cv.cout) * tw)).clamp(1, rows);
    let mut tmp = vec![0f32; wino4_scratch(per, w)];
    for r0 in (0..rows).step_by(per) {
        let r1 = (r0 + per).min(rows);
        let nt = (r1 - r0) * tw;
        grow(col, 36 * cv.cin * nt);
        grow(acc, 36 * cv.cout * nt);
        let v = &mut col[..36 * cv.cin * nt];
        for ci in 0..cv.cin {
            let chan = &x.d[ci * nb * hw..(ci + 1) * nb * hw];
            wino4_input(chan, h, w, r0..r1, &mut v[ci * nt..], cv.cin * nt, &mut tmp);
        }
        let m = &mut acc[..36 * cv.cout * nt];
        for xi in 0..36 {
            sgemm(
                cv.cout,
                nt,
                cv.cin,
                &mut m[xi * cv.cout * nt..],
                nt,
                false,
                Mat::rows(&u[xi * cv.cout * cv.cin..], cv.cin),
                Mat::rows(&v[xi * cv.cin * nt..], nt),
                1.0,
            );
        }
        for co in 0..cv.cout {
            let chan = &mut out[co * nb * hw..(co + 1) * nb * hw];
            wino4_output(&m[co * nt..], cv.cout * nt, chan, h, w, r0..r1, &mut tmp);
        }
    }
}

/// Output rows of one plane of a stride-1 "same" convolution's column matrix: with `dst` the
/// rows y0.. of the output and `off` = (y0 + oy)·w + ox, dst[i] = src[i + off] inside the image
/// and 0 outside: one contiguous copy of the overlapping range, then the columns that wrapped
/// around a row edge (x + ox outside [0, w)) are zeroed.
fn shifted_plane(src: &[f32], dst: &mut [f32], w: usize, off: isize, ox: isize) {
    let n = src.len() as isize;
    let m = dst.len() as isize;
    // dst[i] = src[i + off] for 0 ≤ i + off < n.
    let lo = (-off).clamp(0, m) as usize;
    let hi = (n - off).clamp(0, m) as usize;
    dst[..lo].fill(0.0);
    dst[hi.max(lo)..].fill(0.0);
    if hi > lo {
        let s0 = (lo as isize + off) as usize;
        dst[lo..hi].copy_from_slice(&src[s0..s0 + (hi - lo)]);
    }
    // Columns x with x + ox outside [0, w) read a neighbouring row: zero them.
    let (c0, c1) = if ox < 0 {
        (0, (-ox) as usize)
    } else {
        (w - (ox as usize).min(w), w)
    };
    if c1 > c0 {
        for row in dst.chunks_exact_mut(w) {
            row[c0..c1].fill(0.0);
        }
    }
}

/// One (channel, image, tap) plane of the column matrix: dst[y·wo + x] = src[iy·w + ix] with
/// iy = y·s + dy − pad, ix = x·s + dx − pad, and 0 outside the image.
#[allow(clippy::too_many_arguments)]
pub(crate) fn im2col_plane(
    src: &[f32],
    dst: &mut [f32],
    h: usize,
    w: usize,
    rows: std::ops::Range<usize>,
    wo: usize,
    dy: usize,
    dx: usize,
    s: usize,
    pad: usize,
) {
    let y0 = rows.start;
    for y in rows {
        let drow = &mut dst[(y - y0) * wo..(y - y0 + 1) * wo];
        let iy = (y * s + dy) as isize - pad as isize;
        if iy < 0 || iy >= h as isize {
            drow.fill(0.0);
            continue;
        }
        let srow = &src[iy as usize * w..(iy as usize + 1) * w];
        if s == 1 {
            // ix = x + dx − pad ∈ [0, w) ⇔ x ∈ [pad − dx, w + pad − dx).
            let lo = pad.saturating_sub(dx).min(wo);
            let hi = (w + pad).saturating_sub(dx).min(wo).max(lo);
            drow[..lo].fill(0.0);
            drow[hi..].fill(0.0);
            let off = lo + dx - pad;
            drow[lo..hi].copy_from_slice(&srow[off..off + (hi - lo)]);
        } else {
            for (x, d) in drow.iter_mut().enumerate() {
                let ix = (x * s + dx) as isize - pad as isize;
                *d = if ix < 0 || ix >= w as isize {
                    0.0
                } else {
                    srow[ix as usize]
                };
            }
        }
    }
}

/// Group norm of `x` (statistics per image and group, in f64), then per channel
/// y·(1 + scale) + shift when `scale_shift` ([nb, c] each) is given, then `act`.
fn norm_act(ctx: &mut Ctx, n: &Norm, x: &Feat, scale_shift: Option<(&[f32], usize)>, act: Option<Act>) -> Vec<f32> {
    let nb = ctx.nb;
    let hw = x.hw();
    let cpg = x.c / n.groups;
    let mut out = ctx.take(x.d.len());
    for b in 0..nb {
        for g in 0..n.groups {
            let slab = |c: usize| (c * nb + b) * hw..(c * nb + b + 1) * hw;
            let cnt = (cpg * hw) as f64;
            let total: f64 = (g * cpg..(g + 1) * cpg).map(|c| sum(&x.d[slab(c)])).sum();
            let mean = total / cnt;
            let ss: f64 = (g * cpg..(g + 1) * cpg)
                .map(|c| sq_dev(&x.d[slab(c)], mean as f32))
                .sum();
            let rstd = 1.0 / (ss / cnt + n.eps).sqrt();
            for c in g * cpg..(g + 1) * cpg {
                let mut a = (rstd * n.g[c] as f64) as f32;
                let mut sh = (n.b[c] as f64 - mean * rstd * n.g[c] as f64) as f32;
                if let Some((t, width)) = scale_shift {
                    let (sc, sf) = (t[b * width + c], t[b * width + x.c + c]);
                    a *= 1.0 + sc;
                    sh = sh * (1.0 + sc) + sf;
                }
                let o = &mut out[slab(c)];
                match act {
                    None => affine(o, &x.d[slab(c)], a, sh, false),
                    Some(Act::Silu) => affine(o, &x.d[slab(c)], a, sh, true),
                    Some(act) => {
                        affine(o, &x.d[slab(c)], a, sh, false);
                        act_inplace(act, o);
                    }
                }
            }
        }
    }
    out
}

fn upsample2(ctx: &mut Ctx, x: &Feat) -> Feat {
    let nb = ctx.nb;
    let (h, w) = (x.h, x.w);
    let mut out = ctx.take(x.d.len() * 4);
    for p in 0..x.c * nb {
        let src = &x.d[p * h * w..(p + 1) * h * w];
        let dst = &mut out[p * 4 * h * w..(p + 1) * 4 * h * w];
        for y in 0..2 * h {
            let sr = &src[(y / 2) * w..(y / 2 + 1) * w];
            for (xx, d) in dst[y * 2 * w..(y + 1) * 2 * w].iter_mut().enumerate() {
                *d = sr[xx / 2];
            }
        }
    }
    Feat {
        d: out,
        c: x.c,
        h: 2 * h,
        w: 2 * w,
    }
}

fn avgpool2(ctx: &mut Ctx, x: &Feat) -> Feat {
    let nb = ctx.nb;
    let (h, w, ho, wo) = (x.h, x.w, x.h / 2, x.w / 2);
    let mut out = ctx.take(x.c * nb * ho * wo);
    for p in 0..x.c * nb {
        let src = &x.d[p * h * w..(p + 1) * h * w];
        for y in 0..ho {
            for xx in 0..wo {
                let s = src[2 * y * w + 2 * xx]
                    + src[2 * y * w + 2 * xx + 1]
                    + src[(2 * y + 1) * w + 2 * xx]
                    + src[(2 * y + 1) * w + 2 * xx + 1];
                out[p * ho * wo + y * wo + xx] = s / 4.0;
            }
        }
    }
    Feat {
        d: out,
        c: x.c,
        h: ho,
        w: wo,
    }
}

struct Res {
    norm1: Norm,
    conv1: Conv,
    temb: Lin,
    norm2: Norm,
    conv2: Conv,
    shortcut: Option<Conv>,
    scale_shift: bool,
    act: Act,
    output_scale: f32,
    updown: Updown,
}

impl Res {
    fn new(r: &ResnetBlock, wm: Forms) -> Result<Self> {
        Ok(Res {
            norm1: Norm::new(&r.norm1)?,
            conv1: Conv::new(&r.conv1, 0, wm)?,
            temb: Lin::new(&r.time_emb_proj)?,
            norm2: Norm::new(&r.norm2)?,
            conv2: Conv::new(&r.conv2, 0, wm)?,
            shortcut: r.shortcut.as_ref().map(|s| Conv::new(s, 0, wm)).transpose()?,
            scale_shift: r.scale_shift,
            act: r.act,
            output_scale: r.output_scale as f32,
            updown: r.updown,
        })
    }

    /// `act_emb`: the activation of the time embedding, [nb, temb].
    fn forward(&self, ctx: &mut Ctx, x: Feat, act_emb: &[f32]) -> Feat {
        let nb = ctx.nb;
        let h = norm_act(ctx, &self.norm1, &x, None, Some(self.act));
        let mut h = Feat {
            d: h,
            c: x.c,
            h: x.h,
            w: x.w,
        };
        let mut input = x;
        match self.updown {
            Updown::None => {}
            Updown::Down | Updown::Up => {
                let resample = if self.updown == Updown::Down {
                    avgpool2
                } else {
                    upsample2
                };
                let i2 = resample(ctx, &input);
                ctx.give(std::mem::replace(&mut input, i2).d);
                let h2 = resample(ctx, &h);
                ctx.give(std::mem::replace(&mut h, h2).d);
            }
        }
        let t = self.temb.rows(act_emb, nb);
        let h1 = if self.scale_shift {
            ctx.conv(&self.conv1, &h, None, None)
        } else {
            ctx.conv(&self.conv1, &h, None, Some(&t))
        };
        ctx.give(h.d);
        let ss = self.scale_shift.then_some((&t[..], self.temb.cout));
        let d = norm_act(ctx, &self.norm2, &h1, ss, Some(self.act));
        let h2 = Feat { d, ..h1 };
        ctx.give(h1.d);
        let residual = match &self.shortcut {
            Some(s) => {
                let r = ctx.conv(s, &input, None, None).d;
                ctx.give(input.d);
                r
            }
            None => input.d,
        };
        let mut out = ctx.conv(&self.conv2, &h2, Some(residual), None);
        ctx.give(h2.d);
        if self.output_scale != 1.0 {
            out.d.iter_mut().for_each(|v| *v /= self.output_scale);
        }
        out
    }
}

struct Attn {
    norm: Option<Norm>,
    /// The q, k and v projections stacked ([3·C, C]): one GEMM gives q, k, v one after another.
    qkv: Lin,
    out: Lin,
    heads: usize,
    head_dim: usize,
    rescale: f32,
}

impl Attn {
    fn new(a: &AttnBlock) -> Result<Self> {
        Ok(Attn {
            norm: a.norm.as_ref().map(Norm::new).transpose()?,
            qkv: Lin::stack(&[&a.q, &a.k, &a.v])?,
            out: Lin::new(&a.out)?,
            heads: a.heads,
            head_dim: a.head_dim,
            rescale: a.rescale as f32,
        })
    }

    fn forward(&self, ctx: &mut Ctx, x: Feat) -> Feat {
        let nb = ctx.nb;
        let l = x.hw();
        let m = nb * l;
        let qkv = match &self.norm {
            Some(n) => {
                let normed = norm_act(ctx, n, &x, None, None);
                let qkv = self.qkv.channels(ctx, &normed, m, None);
                ctx.give(normed);
                qkv
            }
            None => self.qkv.channels(ctx, &x.d, m, None),
        };
        let inner = self.qkv.cout / 3;
        let (q, kv) = qkv.split_at(inner * m);
        let (k, v) = kv.split_at(inner * m);
        let hd = self.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        // Every element is written: by the small-head kernel or by the GEMMs (read_dst = false).
        let mut o = ctx.take(self.heads * hd * m);
        if hd <= SMALL_HEAD_MAX {
            for b in 0..nb {
                for hh in 0..self.heads {
                    let off = hh * hd * m + b * l;
                    let head = Head {
                        q: &q[off..],
                        k: &k[off..],
                        v: &v[off..],
                        stride: m,
                        hd,
                        l,
                    };
                    attend_small(&head, &mut o[off..], scale, &mut ctx.s.att);
                }
            }
        } else {
            let mut p = vec![0f32; l * l];
            let mut inv = vec![0f32; l];
            for b in 0..nb {
                for hh in 0..self.heads {
                    let off = hh * hd * m + b * l;
                    // scores[i, j] = scale · Σ_d q[d, i] k[d, j]
                    sgemm(
                        l,
                        l,
                        hd,
                        &mut p,
                        l,
                        false,
                        Mat::cols(&q[off..], m),
                        Mat::rows(&k[off..], m),
                        scale,
                    );
                    exp_rows(&mut p, l, &mut inv);
                    // o[d, i] = Σ_j v[d, j] p[i, j] / Σ_j p[i, j] (the softmax's normalisation on
                    // the hd outputs of row i instead of its L scores)
                    sgemm(
                        hd,
                        l,
                        l,
                        &mut o[off..],
                        m,
                        false,
                        Mat::rows(&v[off..], m),
                        Mat::cols(&p, l),
                        1.0,
                    );
                    for d in 0..hd {
                        let row = &mut o[off + d * m..][..l];
                        row.iter_mut().zip(&inv).for_each(|(x, &s)| *x *= s);
                    }
                }
            }
        }
        ctx.give(qkv);
        let (c, h, w) = (x.c, x.h, x.w);
        let mut out = self.out.channels(ctx, &o, m, Some(x.d));
        ctx.give(o);
        if self.rescale != 1.0 {
            out.iter_mut().for_each(|v| *v /= self.rescale);
        }
        Feat { d: out, c, h, w }
    }
}

/// One op of the graph laid out for this forward.
enum CNode {
    /// The time embedding's two linear layers.
    Time(Lin, Lin),
    Conv(Conv),
    Res(Box<Res>),
    Attn(Box<Attn>),
    Upsample,
    SkipPush,
    SkipPopConcat,
    NormAct(Norm, Act),
}

/// The model's weights on the host, laid out for the CPU forward: the graph's ops in order.
pub(in super::super) struct CpuUnet {
    nodes: Vec<CNode>,
    /// The ResNet blocks' activation, applied to the time embedding once for all of them.
    act: Act,
    in_ch: usize,
    out_ch: usize,
    /// Width of the time features and of `conv_in`'s output.
    tin: usize,
    c0: usize,
    /// [`CHUNK_BUDGET`] or [`CACHED_CHUNK_BUDGET`], by the model's size.
    chunk_budget: usize,
}

impl CpuUnet {
    pub(in super::super) fn new(m: &Unet2dModel) -> Result<Self> {
        Self::build(m, Forms::default_for_this_cpu())
    }

    /// [`CpuUnet::new`] with the convolution forms `wm`.
    fn build(m: &Unet2dModel, wm: Forms) -> Result<Self> {
        // Ops built in parallel (the Winograd weight transforms are most of the work).
        let nodes: Vec<CNode> = m
            .nodes
            .par_iter()
            .map(|n| {
                Ok(match n {
                    Node::Time(l1, l2) => CNode::Time(Lin::new(l1)?, Lin::new(l2)?),
                    Node::Conv(c, extra) => CNode::Conv(Conv::new(c, *extra, wm)?),
                    Node::Resnet(r) => CNode::Res(Box::new(Res::new(r, wm)?)),
                    Node::Attention(a) => CNode::Attn(Box::new(Attn::new(a)?)),
                    Node::Upsample => CNode::Upsample,
                    Node::SkipPush => CNode::SkipPush,
                    Node::SkipPopConcat => CNode::SkipPopConcat,
                    Node::NormAct(n, a) => CNode::NormAct(Norm::new(n)?, *a),
                })
            })
            .collect::<Result<_>>()?;
        let tin = match nodes.first() {
            Some(CNode::Time(l1, _)) => l1.cin,
            _ => {
                return Err(Error::model(
                    "CPU UNet forward: the graph does not start with the time embedding",
                ))
            }
        };
        let c0 = m.config.block_out_channels[0];
        Ok(CpuUnet {
            act: m
                .nodes
                .iter()
                .find_map(|n| match n {
                    Node::Resnet(r) => Some(r.act),
                    _ => None,
                })
                .unwrap_or(Act::Silu),
            nodes,
            in_ch: m.config.in_channels,
            out_ch: m.config.out_channels,
            tin,
            c0,
            chunk_budget: if m.parameters <= CACHED_WEIGHTS {
                CACHED_CHUNK_BUDGET
            } else {
                CHUNK_BUDGET
            },
        })
    }

    /// The forward of a batch `x` (B, C, H, W) row-major, with the time features `tf` ([B, tin],
    /// from [`Unet2dModel`]'s embedding); `fourier_t` divides the output by t per image.
    pub(in super::super) fn forward(
        &self,
        x: &[f32],
        shape: [usize; 4],
        tf: &[f32],
        fourier_t: Option<&[f32]>,
        center: bool,
    ) -> Vec<f32> {
        let [b, c, h, w] = shape;
        let hw = h * w;
        let tin = self.tin;
        let widest = self.c0 * hw;
        let threads = rayon::current_num_threads().max(1);
        // At most the budget's images a task, in a number of tasks that is a multiple of the
        // threads (so that they finish together), as even as the batch allows.
        let most = b
            .div_ceil(threads)
            .min((self.chunk_budget / widest.max(1)).max(1))
            .max(1);
        let tasks = b.div_ceil(most).next_multiple_of(threads).min(b.max(1));
        let per_task = b.div_ceil(tasks.max(1)).max(1);
        let mut out = vec![0f32; b * self.out_ch * hw];
        out.par_chunks_mut(per_task * self.out_ch * hw)
            .enumerate()
            .for_each(|(i, dst)| {
                let b0 = i * per_task;
                let nb = dst.len() / (self.out_ch * hw);
                let mut ctx = Ctx::new(nb);
                // NCHW → CNHW for this chunk.
                let mut d = ctx.take(c * nb * hw);
                for bi in 0..nb {
                    for ci in 0..c {
                        let s = &x[((b0 + bi) * c + ci) * hw..][..hw];
                        let o = &mut d[(ci * nb + bi) * hw..][..hw];
                        if center {
                            o.iter_mut().zip(s).for_each(|(o, &v)| *o = v * 2.0 - 1.0);
                        } else {
                            o.copy_from_slice(s);
                        }
                    }
                }
                let y = self.chunk(&mut ctx, Feat { d, c, h, w }, &tf[b0 * tin..(b0 + nb) * tin]);
                for bi in 0..nb {
                    let div = fourier_t.map_or(1.0, |t| t[b0 + bi]);
                    for co in 0..self.out_ch {
                        let s = &y.d[(co * nb + bi) * hw..][..hw];
                        let o = &mut dst[(bi * self.out_ch + co) * hw..][..hw];
                        if fourier_t.is_some() {
                            o.iter_mut().zip(s).for_each(|(o, &v)| *o = v / div);
                        } else {
                            o.copy_from_slice(s);
                        }
                    }
                }
                ctx.give(y.d);
                ctx.finish();
            });
        out
    }

    /// The graph's ops in order on one chunk of images.
    fn chunk(&self, ctx: &mut Ctx, x: Feat, tf: &[f32]) -> Feat {
        debug_assert_eq!(x.c, self.in_ch);
        let nb = ctx.nb;
        let mut emb: Vec<f32> = Vec::new();
        let mut hcur = x;
        let mut skips: Vec<Feat> = Vec::new();
        for node in &self.nodes {
            hcur = match node {
                CNode::Time(lin1, lin2) => {
                    let mut e1 = lin1.rows(tf, nb);
                    silu_inplace(&mut e1);
                    emb = lin2.rows(&e1, nb);
                    // Every ResNet block applies its activation to the embedding before its
                    // projection.
                    act_inplace(self.act, &mut emb);
                    hcur
                }
                CNode::Conv(cv) => {
                    let y = ctx.conv(cv, &hcur, None, None);
                    ctx.give(hcur.d);
                    y
                }
                CNode::Res(r) => r.forward(ctx, hcur, &emb),
                CNode::Attn(a) => a.forward(ctx, hcur),
                CNode::Upsample => {
                    let up = upsample2(ctx, &hcur);
                    ctx.give(hcur.d);
                    up
                }
                CNode::SkipPush => {
                    skips.push(ctx.copy(&hcur));
                    hcur
                }
                CNode::SkipPopConcat => {
                    let s = skips
                        .pop()
                        .expect("skip connections balance (Graph::skips_balance, checked at build)");
                    // Channel concat: the skip's planes appended after the current ones.
                    let need = hcur.d.len() + s.d.len();
                    let mut d = hcur.d;
                    if d.capacity() < need {
                        let mut wider = ctx.take_empty(need);
                        wider.extend_from_slice(&d);
                        ctx.give(std::mem::replace(&mut d, wider));
                    }
                    d.extend_from_slice(&s.d);
                    ctx.give(s.d);
                    Feat {
                        d,
                        c: hcur.c + s.c,
                        h: hcur.h,
                        w: hcur.w,
                    }
                }
                CNode::NormAct(n, a) => {
                    let d = norm_act(ctx, n, &hcur, None, Some(*a));
                    ctx.give(hcur.d);
                    Feat { d, ..hcur }
                }
            };
        }
        hcur
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use candle_core::{Device, Tensor};

    use super::{CpuUnet, Forms};
    use crate::data::npy;
    use crate::models::diffusers::DiffusersCheckpoint;

    /// The CPU forward equals candle's forward on every diffusers fixture (attention with
    /// several heads, one head, no attention, `scale_shift` and `default` conditioning, Fourier
    /// and positional embeddings, conv and ResNet resampling, downsample padding 0), on batches
    /// that split into several tasks of unequal size.
    #[test]
    fn cpu_forward_equals_candle_forward_on_every_fixture() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/diffusers");
        for name in [
            "unet-28-c1-attn",
            "unet-32-c3-noattn",
            "unet-28-c1-fourier",
            "unet-32-c3-attn",
        ] {
            let dir = root.join(name);
            let ck = DiffusersCheckpoint::load(&dir, &Device::Cpu).unwrap();
            let input = npy::read(&dir.join("input.npy")).unwrap();
            let x0 = input.to_f32().unwrap();
            let s = &input.shape;
            let per = s[1] * s[2] * s[3];
            // 7 images: the fixture's rows repeated, scaled and shifted so no two are equal.
            let b = 7;
            let x: Vec<f32> = (0..b * per)
                .map(|i| x0[i % x0.len()] * (1.0 + 0.1 * (i / per) as f32) + 0.01 * (i / per) as f32)
                .collect();
            let t: Vec<f64> = (0..b).map(|i| 1.0 + 137.0 * i as f64).collect();
            let shape = [b, s[1], s[2], s[3]];
            let fast = ck.model.forward_host(&x, shape, &t).unwrap();
            let xt = Tensor::from_slice(&x, (b, s[1], s[2], s[3]), &Device::Cpu).unwrap();
            let slow: Vec<f32> = ck
                .model
                .forward_candle(&xt, &t)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(fast.len(), slow.len(), "{name}");
            let scale = slow.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = fast.iter().zip(&slow).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(
                worst <= 2e-5 * scale.max(1.0),
                "{name}: max abs difference {worst} (scale {scale})"
            );
            // Through the Tensor interface as well, and one image at a time.
            let via_tensor: Vec<f32> = ck
                .model
                .forward(&xt, &t)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(via_tensor, fast, "{name}");
            let one = ck
                .model
                .forward_host(&x[per..2 * per], [1, s[1], s[2], s[3]], &t[1..2])
                .unwrap();
            let o = s[1] * s[2] * s[3] / s[1] * ck.model.config.out_channels;
            let diff = one
                .iter()
                .zip(&fast[o..2 * o])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff <= 1e-5 * scale.max(1.0), "{name}: batch of one differs by {diff}");
            // Every 3 × 3 "same" convolution as Winograd F(4×4, 3×3) (the fixtures are narrower
            // than WINO_MIN_CIN, so the default build runs few or none of them that way), and
            // every one as im2col + GEMM (the default build runs them directly where the CPU has
            // the direct convolution's vector tiles).
            let tf = ck.model.time_features_host(&t).unwrap();
            let fourier: Option<Vec<f32>> = matches!(
                ck.model.config.time_embedding,
                super::super::super::TimeEmbedding::Fourier
            )
            .then(|| t.iter().map(|&v| v as f32).collect());
            for (form, forms) in [
                (
                    "Winograd",
                    Forms {
                        wino_min_cin: 1,
                        direct: false,
                    },
                ),
                (
                    "im2col",
                    Forms {
                        wino_min_cin: usize::MAX,
                        direct: false,
                    },
                ),
            ] {
                let net = CpuUnet::build(&ck.model, forms).unwrap();
                let w = net.forward(&x, shape, &tf, fourier.as_deref(), ck.model.config.center_input_sample);
                let worst = w.iter().zip(&slow).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(
                    worst <= 2e-5 * scale.max(1.0),
                    "{name}: {form} forward differs from candle's by {worst} (scale {scale})"
                );
                assert!(
                    w.iter().zip(&fast).any(|(a, b)| a != b),
                    "{name}: {form} path not taken"
                );
            }
        }
    }
}
