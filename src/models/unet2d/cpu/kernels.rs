//! CPU kernels for the diffusers UNet forward ([`super::unet2d`]): a bounds-checked strided
//! single-precision GEMM on the `gemm` crate (the matrix-multiply engine candle's CPU backend
//! uses; runtime AVX2/FMA/AVX-512 dispatch), a branch-free `exp` that vectorises, SiLU, the
//! softmax, attention for small head dimensions, the Winograd F(4×4, 3×3) transforms and the
//! direct 3 × 3 convolution; and for the per-sample gradient pass ([`super::unet2d::grad_cpu`])
//! the direct convolution's adjoint kernel ([`Direct3x3::adjoint`]), its column matrix
//! ([`conv3x3_columns`]), the group-norm, SiLU and softmax gradients, and attention of small heads
//! forward and backward ([`attn_train_forward`], [`attn_train_backward`]).
//!
//! The CPU forward's only `unsafe` code is here, in three forms. (1) `gemm::gemm` takes raw
//! pointers and strides: the safe wrapper [`sgemm`] checks, before the call, that every element
//! each matrix's shape and strides address lies inside its slice, and that distinct destination
//! elements are distinct memory (`dst_rs ≥ n`); the destination is a `&mut` slice, so it cannot
//! alias the inputs. (2) The element-wise kernels (SiLU, softmax, small-head attention, Winograd transforms,
//! group-norm sums, affine) and the direct convolution's tiles are safe code (bounds-checked
//! slices; vectors move to and from arrays through `bytemuck`) compiled once for AVX-512F and
//! once for AVX2 + FMA, besides the baseline; calling one of those copies is `unsafe` and happens
//! only after `is_x86_feature_detected!` found every feature it was compiled for. (3) [`zeroed_huge`]
//! allocates zeroed memory itself, so that it can advise 2 MB pages before any page is touched.

use gemm::Parallelism;

/// Index one past the last element a `rows × cols` matrix with row stride `rs` and column stride
/// `cs` addresses (both non-negative), or 0 for an empty matrix.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// A strided matrix operand: the slice it lives in, its row stride and its column stride.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    /// The elements (the matrix starts at index 0).
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with row stride `rs` and unit column stride.
    pub fn rows(data: &'a [f32], rs: usize) -> Self {
        Mat { data, rs, cs: 1 }
    }
    /// The transpose view of a row-major matrix with row stride `rs`.
    pub fn cols(data: &'a [f32], rs: usize) -> Self {
        Mat { data, rs: 1, cs: rs }
    }
}

/// `dst[m × n] = (read_dst ? dst : 0) + beta · lhs[m × k] · rhs[k × n]`, with `dst` row-major
/// with row stride `dst_rs` (unit column stride), on the calling thread only (callers
/// parallelise over images, so no thread ever waits on another inside a layer).
///
/// Panics if a matrix does not fit its slice (a programming error, never input-dependent: the
/// UNet's shapes are validated when it is built).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    read_dst: bool,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst_rs >= n || m == 1, "sgemm: destination rows overlap");
    assert!(dst.len() >= extent(m, n, dst_rs, 1), "sgemm: destination too small");
    if k == 0 {
        if !read_dst {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(0.0);
            }
        }
        return;
    }
    assert!(lhs.data.len() >= extent(m, k, lhs.rs, lhs.cs), "sgemm: lhs too small");
    assert!(rhs.data.len() >= extent(k, n, rhs.rs, rhs.cs), "sgemm: rhs too small");
    let (ds, ls, lc, rs, rc) = (
        dst_rs as isize,
        lhs.rs as isize,
        lhs.cs as isize,
        rhs.rs as isize,
        rhs.cs as isize,
    );
    // SAFETY: the asserts above bound every address gemm forms (row·rs + col·cs for rows < m|k,
    // cols < k|n) inside the three slices; `dst` is an exclusive borrow, so it does not overlap
    // `lhs` or `rhs`, and `dst_rs ≥ n` makes its elements distinct; the call is single-threaded
    // (`Parallelism::None`) and returns before the borrows end.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ds,
            read_dst,
            lhs.data.as_ptr(),
            lc,
            ls,
            rhs.data.as_ptr(),
            rc,
            rs,
            1.0,
            beta,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// `a·b + c`, fused (one rounding) in the copies compiled for FMA (`F = true`), else two roundings.
#[inline(always)]
fn madd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// e^x in single precision without a libm call, so that loops over it vectorise: x = n·ln 2 + r
/// with |r| ≤ ln 2 / 2 (Cody–Waite split of ln 2), e^r by its degree-7 Taylor polynomial
/// (truncation < 6e-9 relative), 2^n through the exponent bits. Inputs are clamped to
/// [−87.3, 88] (results ≥ 1.2e-38, no infinities); measured within 2 ulp of `f32::exp` on the
/// clamped range (unit test, both with and without fused multiply-adds).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_f::<false>(x)
}

/// ln 2 split for Cody–Waite reduction: LN2_HI has trailing zero bits, so n·LN2_HI is exact.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// 1.5 · 2^23: adding and subtracting it rounds to an integer.
const ROUND: f32 = 12_582_912.0;
/// The Taylor coefficients of e^r from degree 7 down to 0 (Horner order).
const EXP_POLY: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

#[inline(always)]
fn exp_f<const F: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let x = x.clamp(-87.3, 88.0);
    let shifted = madd::<F>(x, LOG2E, ROUND);
    let n = shifted - ROUND;
    let r = madd::<F>(-n, LN2_LO, madd::<F>(-n, LN2_HI, x));
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = madd::<F>(p, r, c);
    }
    // n sits in the low mantissa bits of `shifted` (|n| ≤ 127 ≪ 2^22): integer arithmetic on the
    // bits gives 2^n without a float → int conversion, so the loop vectorises.
    let scale = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    p * scale
}

/// SiLU x·σ(x) = x / (1 + e^{−x}).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    silu_f::<false>(x)
}

#[inline(always)]
fn silu_f<const F: bool>(x: f32) -> f32 {
    x / (1.0 + exp_f::<F>(-x))
}

/// Defines `pub fn $name(args)` that runs `$imp::<true>(args)` compiled for AVX-512F + FMA when
/// the CPU has them (element loops vectorised 16 wide), else for AVX2 + FMA (8 wide with fused
/// multiply-adds instead of SSE2's 4), else the baseline copy `$imp::<false>`: the same safe
/// code, compiled once per feature set.
macro_rules! avx2_dispatch {
    ($(#[$m:meta])* pub fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? => $imp:ident) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($($a: $t),*) $(-> $r)? {
                    $imp::<true>($($a),*)
                }
                // SAFETY: calling a `target_feature` function is sound when the CPU has the
                // features, which were detected just above.
                #[allow(unsafe_code)]
                return unsafe { avx512($($a),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($a: $t),*) $(-> $r)? {
                    $imp::<true>($($a),*)
                }
                // SAFETY: calling a `target_feature` function is sound when the CPU has the
                // features, which were detected just above.
                #[allow(unsafe_code)]
                return unsafe { avx2($($a),*) };
            }
            $imp::<false>($($a),*)
        }
    };
}

avx2_dispatch! {
    /// SiLU of every element, in place.
    pub fn silu_inplace(v: &mut [f32]) => silu_inplace_impl
}

#[inline(always)]
fn silu_inplace_impl<const F: bool>(v: &mut [f32]) {
    for x in v {
        *x = silu_f::<F>(*x);
    }
}

avx2_dispatch! {
    /// Sum of the elements in f64 (f32 partial sums over eight lanes per block of 256, widened).
    pub fn sum(v: &[f32]) -> f64 => sum_impl
}

#[inline(always)]
fn sum_impl<const F: bool>(v: &[f32]) -> f64 {
    lanes(v, |x| x)
}

avx2_dispatch! {
    /// Σ (v − mean)² in f64 (f32 partial sums, widened).
    pub fn sq_dev(v: &[f32], mean: f32) -> f64 => sq_dev_impl
}

#[inline(always)]
fn sq_dev_impl<const F: bool>(v: &[f32], mean: f32) -> f64 {
    lanes(v, |x| (x - mean) * (x - mean))
}

#[inline(always)]
fn lanes(v: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut total = 0f64;
    // Blocks of 256 keep the f32 partial sums short (relative error ≲ 32 ulp per block).
    for block in v.chunks(256) {
        let mut acc = [0f32; 8];
        let mut it = block.chunks_exact(8);
        for c in &mut it {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a += f(x);
            }
        }
        let mut s: f64 = acc.iter().map(|&a| a as f64).sum();
        s += it.remainder().iter().map(|&x| f(x) as f64).sum::<f64>();
        total += s;
    }
    total
}

/// Largest element (−∞ for an empty slice; NaNs are passed over, as by `f32::max`). Sixteen
/// independent lanes, compared with `>` so that each is one vector max without NaN fix-ups.
#[inline(always)]
fn max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut it = v.chunks_exact(16);
    for c in &mut it {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = if x > *a { x } else { *a };
        }
    }
    it.remainder()
        .iter()
        .chain(&acc)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// Σ of a row of non-negative values (exponentials) in f64: sixteen f32 lanes per block of 256,
/// widened per block (relative error ≲ 16 ulp per block, as [`sum`]'s).
#[inline(always)]
fn row_sum(v: &[f32]) -> f64 {
    let mut total = 0f64;
    for block in v.chunks(256) {
        let mut acc = [0f32; 16];
        let mut it = block.chunks_exact(16);
        for c in &mut it {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a += x;
            }
        }
        total += acc.iter().map(|&a| a as f64).sum::<f64>() + it.remainder().iter().map(|&x| x as f64).sum::<f64>();
    }
    total
}

avx2_dispatch! {
    /// Softmax of each row of `l` values, in place.
    pub fn softmax_rows(p: &mut [f32], l: usize) => softmax_rows_impl
}

#[inline(always)]
fn softmax_rows_impl<const F: bool>(p: &mut [f32], l: usize) {
    let mut inv = vec![0f32; p.len() / l.max(1)];
    exp_rows_impl::<F>(p, l, &mut inv);
    for (row, &iv) in p.chunks_exact_mut(l).zip(&inv) {
        for s in row.iter_mut() {
            *s *= iv;
        }
    }
}

avx2_dispatch! {
    /// The unnormalised softmax of each row of `l` values, in place: e^{s − max(row)}, with
    /// 1 / Σ row in `inv[row]` (the caller scales what it computes from the row instead of the
    /// row itself: for attention, the head-dim values of the output rather than the L scores).
    pub fn exp_rows(p: &mut [f32], l: usize, inv: &mut [f32]) => exp_rows_impl
}

#[inline(always)]
fn exp_rows_impl<const F: bool>(p: &mut [f32], l: usize, inv: &mut [f32]) {
    for (row, iv) in p.chunks_exact_mut(l).zip(inv.iter_mut()) {
        let mx = max(row);
        for s in row.iter_mut() {
            *s = exp_f::<F>(*s - mx);
        }
        *iv = (1.0 / row_sum(row)) as f32;
    }
}

/// One attention head of one image on channel-major planes: `q`, `k`, `v` (and the output) hold
/// `hd` planes of `l` positions each, plane `d` starting at `d·stride`.
pub struct Head<'a> {
    /// Queries.
    pub q: &'a [f32],
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Distance between consecutive planes (in the three inputs and the output).
    pub stride: usize,
    /// Head dimension (number of planes), at most [`SMALL_HEAD_MAX`].
    pub hd: usize,
    /// Positions per plane.
    pub l: usize,
}

/// Largest head dimension [`attend_small`] takes (beyond it two GEMMs per head cost less than
/// their packing, and the kernel's accumulators would not fit the registers).
pub const SMALL_HEAD_MAX: usize = 16;

/// Scaled dot-product attention of one head for a small head dimension (≤ [`SMALL_HEAD_MAX`]):
/// o[d·stride + i] = Σ_j softmax_j(scale · Σ_e q[e, i]·k[e, j]) · v[d·stride + j] for i < l,
/// d < hd; nothing else of `o` is written. With AVX-512 (AVX2 + FMA), 16 (8) query positions at
/// a time in vector registers (no L × L matrix, no GEMM packing, no horizontal sums): per block, one pass
/// over the keys computes the scores (kept in `scratch`) and their running maximum per query, a
/// second takes e^{s − max} ([`exp`]'s arithmetic, lane by lane), its sum and the weighted sum
/// of the values, then one division per output. Elsewhere, the same row by row
/// ([`attend_rows`]). Panics if `hd` exceeds [`SMALL_HEAD_MAX`] or a plane does not fit its
/// slice (a programming error).
pub fn attend_small(h: &Head<'_>, o: &mut [f32], scale: f32, scratch: &mut Vec<f32>) {
    assert!(
        h.hd <= SMALL_HEAD_MAX,
        "attend_small: head dimension {} > {SMALL_HEAD_MAX}",
        h.hd
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: calling a `target_feature` function is sound when the CPU has the features,
        // which were detected just above.
        #[allow(unsafe_code)]
        return unsafe { x86::attend512(h, o, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: calling a `target_feature` function is sound when the CPU has the features,
        // which were detected just above.
        #[allow(unsafe_code)]
        return unsafe { x86::attend(h, o, scale, scratch) };
    }
    attend_rows(h, o, scale, scratch);
}

/// [`attend_small`] one query row at a time in plain code (the path without AVX2 + FMA, and a
/// second implementation for the tests): the row's scores, their softmax, then one dot product
/// per output plane.
pub fn attend_rows(h: &Head<'_>, o: &mut [f32], scale: f32, scratch: &mut Vec<f32>) {
    let (l, st) = (h.l, h.stride);
    scratch.clear();
    scratch.resize(l, 0.0);
    let row = &mut scratch[..];
    for i in 0..l {
        row.fill(0.0);
        for d in 0..h.hd {
            let qd = h.q[d * st + i];
            for (s, &kv) in row.iter_mut().zip(&h.k[d * st..d * st + l]) {
                *s = qd.mul_add(kv, *s);
            }
        }
        row.iter_mut().for_each(|s| *s *= scale);
        let mx = max(row);
        for s in row.iter_mut() {
            *s = exp(*s - mx);
        }
        let inv = 1.0 / lanes(row, |x| x);
        for d in 0..h.hd {
            let dot: f64 = row
                .iter()
                .zip(&h.v[d * st..d * st + l])
                .map(|(&p, &v)| p as f64 * v as f64)
                .sum();
            o[d * st + i] = (dot * inv) as f32;
        }
    }
}

/// One attention head of one image for the per-sample gradient pass: `q`, `k`, `v` hold `hd`
/// contiguous planes of `l` positions each (plane `d` at `d·l`), as do the output and the
/// gradients of [`attn_train_forward`] and [`attn_train_backward`].
pub struct TrainHead<'a> {
    /// Queries.
    pub q: &'a [f32],
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Head dimension (number of planes).
    pub hd: usize,
    /// Positions per plane.
    pub l: usize,
}

/// Floats one head's probabilities take in [`attn_train_forward`]'s layout: `l` keys for each
/// query, the queries in blocks of 16 (the last padded with zeros).
pub fn attn_train_probs(l: usize) -> usize {
    l.div_ceil(16) * 16 * l
}

/// Whether [`attn_train_forward`] and [`attn_train_backward`] run on this CPU for head dimension
/// `hd`: AVX-512F and hd ≤ [`SMALL_HEAD_MAX`].
pub fn attn_train_available(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        hd <= SMALL_HEAD_MAX && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// Attention of one head for training (Vaswani et al. 2017, Eq. 1), small head dimensions in
/// AVX-512 registers: o[d·l + i] = Σ_j P[i, j] v[d·l + j] with P = softmax_j(scale · Σ_e
/// q[e·l + i] k[e·l + j]), and P kept in `pb` ([`attn_train_probs`] floats, P[i, j] at
/// `((i / 16)·l + j)·16 + i % 16`) for [`attn_train_backward`]. The exponential is [`exp`]'s
/// arithmetic; no l × l matrix is multiplied by a GEMM (for head dimensions ≤ 16 the GEMMs' packing
/// cost more than their arithmetic). Panics unless [`attn_train_available`] (a programming error).
pub fn attn_train_forward(h: &TrainHead<'_>, scale: f32, o: &mut [f32], pb: &mut [f32], scratch: &mut Vec<f32>) {
    assert!(
        attn_train_available(h.hd),
        "attn_train_forward: needs AVX-512F and hd ≤ 16"
    );
    assert!(pb.len() >= attn_train_probs(h.l) && o.len() >= h.hd * h.l);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: calling a `target_feature` function is sound when the CPU has the feature,
        // which `attn_train_available` detected just above.
        #[allow(unsafe_code)]
        unsafe {
            attn512::forward(h, scale, o, pb, scratch)
        }
    }
}

/// The gradients of [`attn_train_forward`] added into `dq`, `dk`, `dv` (each `hd` planes of `l`)
/// from the output gradient `dout`, the output `o` and the probabilities `pb` it kept:
/// ∂S = P ⊙ (∂P − r) with ∂P = ∂Oᵀ V and the row sums r_i = Σ_j P[i, j] ∂P[i, j] taken as
/// Σ_d ∂O[d, i]·O[d, i] (equal in exact arithmetic, as O = V Pᵀ); ∂Q = scale · K ∂Sᵀ,
/// ∂K = scale · Q ∂S, ∂V = ∂O P. Panics unless [`attn_train_available`] (a programming error).
#[allow(clippy::too_many_arguments)]
pub fn attn_train_backward(
    h: &TrainHead<'_>,
    o: &[f32],
    dout: &[f32],
    scale: f32,
    pb: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    assert!(
        attn_train_available(h.hd),
        "attn_train_backward: needs AVX-512F and hd ≤ 16"
    );
    assert!(pb.len() >= attn_train_probs(h.l));
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: calling a `target_feature` function is sound when the CPU has the feature,
        // which `attn_train_available` detected just above.
        #[allow(unsafe_code)]
        unsafe {
            attn512::backward(h, o, dout, scale, pb, dq, dk, dv, scratch)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod attn512;

/// The AVX2 + FMA kernels written with `std::arch` intrinsics (safe to call inside functions
/// compiled with the features they need; vectors move to and from arrays through `bytemuck`).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::attn512::{dot16, position_major};
    use super::{Direct3x3, DirectGeom, DirectOut, Head, EXP_POLY, LN2_HI, LN2_LO, ROUND};

    /// Query positions per block: one 256-bit register of f32 lanes.
    const QB: usize = 8;

    #[inline]
    fn load(s: &[f32]) -> __m256 {
        let a: [f32; QB] = s[..QB].try_into().expect("a slice of 8 floats");
        bytemuck::cast(a)
    }

    /// [`super::exp`] on eight lanes: the same operations in the same order (with fused
    /// multiply-adds, as its FMA copies), so each lane equals the scalar result.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp8(x: __m256) -> __m256 {
        // max/min with the bound first return x when x is NaN, as `f32::clamp` does.
        let x = _mm256_min_ps(_mm256_set1_ps(88.0), _mm256_max_ps(_mm256_set1_ps(-87.3), x));
        let round = _mm256_set1_ps(ROUND);
        let shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), round);
        let n = _mm256_sub_ps(shifted, round);
        let r = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(LN2_LO),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x),
        );
        let mut p = _mm256_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(ROUND.to_bits() as i32));
        let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(e, _mm256_set1_epi32(127)));
        _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn attend(h: &Head<'_>, o: &mut [f32], scale: f32, scratch: &mut Vec<f32>) {
        match h.hd {
            0 => {}
            1..=4 => fixed::<4>(h, o, scale, scratch),
            5..=8 => fixed::<8>(h, o, scale, scratch),
            _ => fixed::<16>(h, o, scale, scratch),
        }
    }

    /// The head dimension padded to `HD` (zero query, key and value planes beyond `hd`: the
    /// scores are unchanged and the extra outputs are dropped).
    #[target_feature(enable = "avx2,fma")]
    fn fixed<const HD: usize>(h: &Head<'_>, o: &mut [f32], scale: f32, scratch: &mut Vec<f32>) {
        let (l, st, hd) = (h.l, h.stride, h.hd);
        if l == 0 {
            return;
        }
        let blocks = l.div_ceil(QB);
        let lp = blocks * QB;
        // Keys and values position-major [l][HD] (a key's values are one contiguous run to
        // broadcast from), queries plane-major [HD][lp] zero-padded to whole blocks, scores [l][QB].
        scratch.clear();
        scratch.resize(2 * l * HD + HD * lp + l * QB, 0.0);
        let (kt, rest) = scratch.split_at_mut(l * HD);
        let (vt, rest) = rest.split_at_mut(l * HD);
        let (qp, s) = rest.split_at_mut(HD * lp);
        for d in 0..hd {
            let (kd, vd) = (&h.k[d * st..d * st + l], &h.v[d * st..d * st + l]);
            for (j, (&kv, &vv)) in kd.iter().zip(vd).enumerate() {
                kt[j * HD + d] = kv;
                vt[j * HD + d] = vv;
            }
            qp[d * lp..d * lp + l].copy_from_slice(&h.q[d * st..d * st + l]);
        }
        let vscale = _mm256_set1_ps(scale);
        for blk in 0..blocks {
            let i0 = blk * QB;
            let mut q = [_mm256_setzero_ps(); HD];
            for (d, qd) in q.iter_mut().enumerate() {
                *qd = load(&qp[d * lp + i0..]);
            }
            // Pass 1: the block's scores against every key, and their maxima.
            let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
            for (sj, kj) in s.chunks_exact_mut(QB).zip(kt.chunks_exact(HD)) {
                // Two chains (even and odd d) halve the dependent multiply-adds per key.
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for (qd, kd) in q.chunks_exact(2).zip(kj.chunks_exact(2)) {
                    a0 = _mm256_fmadd_ps(qd[0], _mm256_set1_ps(kd[0]), a0);
                    a1 = _mm256_fmadd_ps(qd[1], _mm256_set1_ps(kd[1]), a1);
                }
                let acc = _mm256_mul_ps(_mm256_add_ps(a0, a1), vscale);
                mx = _mm256_max_ps(acc, mx);
                let a: [f32; QB] = bytemuck::cast(acc);
                sj.copy_from_slice(&a);
            }
            // Pass 2: e^{s − max}, its sum, and the values weighted by it.
            let mut acc = [_mm256_setzero_ps(); HD];
            let mut tot = _mm256_setzero_ps();
            for (sj, vj) in s.chunks_exact(QB).zip(vt.chunks_exact(HD)) {
                let p = exp8(_mm256_sub_ps(load(sj), mx));
                tot = _mm256_add_ps(tot, p);
                for (ad, &vv) in acc.iter_mut().zip(vj) {
                    *ad = _mm256_fmadd_ps(p, _mm256_set1_ps(vv), *ad);
                }
            }
            let n = QB.min(l - i0);
            for (d, ad) in acc.iter().enumerate().take(hd) {
                let y: [f32; QB] = bytemuck::cast(_mm256_div_ps(*ad, tot));
                o[d * st + i0..d * st + i0 + n].copy_from_slice(&y[..n]);
            }
        }
    }

    /// [`exp8`] on sixteen lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(_mm512_set1_ps(88.0), _mm512_max_ps(_mm512_set1_ps(-87.3), x));
        let round = _mm512_set1_ps(ROUND);
        let shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), round);
        let n = _mm512_sub_ps(shifted, round);
        let r = _mm512_fnmadd_ps(
            n,
            _mm512_set1_ps(LN2_LO),
            _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
        );
        let mut p = _mm512_set1_ps(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let e = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(ROUND.to_bits() as i32));
        let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(e, _mm512_set1_epi32(127)));
        _mm512_mul_ps(p, _mm512_castsi512_ps(scale))
    }

    /// Sixteen floats from the start of `s` as a vector.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load16(s: &[f32]) -> __m512 {
        let a: [f32; 16] = s[..16].try_into().expect("a slice of 16 floats");
        let lo: [f32; 8] = a[..8].try_into().expect("8 floats");
        let hi: [f32; 8] = a[8..].try_into().expect("8 floats");
        let (lo, hi): (__m256, __m256) = (bytemuck::cast(lo), bytemuck::cast(hi));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
            _mm256_castps_pd(hi),
        ))
    }

    /// The sixteen lanes of `v`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn lanes16(v: __m512) -> [f32; 16] {
        let lo: [f32; 8] = bytemuck::cast(_mm512_castps512_ps256(v));
        let hi: [f32; 8] = bytemuck::cast(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
        let mut a = [0f32; 16];
        a[..8].copy_from_slice(&lo);
        a[8..].copy_from_slice(&hi);
        a
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn attend512(h: &Head<'_>, o: &mut [f32], scale: f32) {
        match h.hd {
            0 => {}
            1..=4 => fixed512::<4>(h, o, scale),
            5..=8 => fixed512::<8>(h, o, scale),
            _ => fixed512::<16>(h, o, scale),
        }
    }

    /// [`fixed`] with 16 query positions per block in 512-bit registers; the scores are kept as
    /// vectors, the keys and values as scalars that the multiply-adds broadcast.
    #[target_feature(enable = "avx512f")]
    fn fixed512<const HD: usize>(h: &Head<'_>, o: &mut [f32], scale: f32) {
        const QB: usize = 16;
        let (l, st, hd) = (h.l, h.stride, h.hd);
        if l == 0 {
            return;
        }
        let blocks = l.div_ceil(QB);
        let mut kt = vec![0f32; l * HD];
        let mut vt = vec![0f32; l * HD];
        position_major::<HD>(h.k, hd, l, st, &mut kt);
        position_major::<HD>(h.v, hd, l, st, &mut vt);
        let mut s = vec![_mm512_setzero_ps(); l];
        let mut qrow = [0f32; QB];
        let vscale = _mm512_set1_ps(scale);
        for blk in 0..blocks {
            let i0 = blk * QB;
            let n = QB.min(l - i0);
            let mut q = [_mm512_setzero_ps(); HD];
            for (d, qd) in q.iter_mut().enumerate().take(hd) {
                qrow[..n].copy_from_slice(&h.q[d * st + i0..d * st + i0 + n]);
                qrow[n..].fill(0.0);
                *qd = load16(&qrow);
            }
            // Pass 1: the block's scores against every key, and their maxima.
            let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
            for (sj, kj) in s.iter_mut().zip(kt.chunks_exact(HD)) {
                let acc = _mm512_mul_ps(dot16(&q, kj), vscale);
                mx = _mm512_max_ps(acc, mx);
                *sj = acc;
            }
            // Pass 2: e^{s − max} in place, a loop whose keys are independent (the exponential
            // is a chain of 15 dependent operations: fused with the sums below, it left the
            // multiply-add units idle).
            for sj in s.iter_mut() {
                *sj = exp16(_mm512_sub_ps(*sj, mx));
            }
            // Pass 3: their sum and the values weighted by them, even and odd keys into two sets
            // of accumulators (two independent chains of multiply-adds per value plane, not one).
            let (mut acc, mut acc1) = ([_mm512_setzero_ps(); HD], [_mm512_setzero_ps(); HD]);
            let (mut tot, mut tot1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for (p, v) in s.chunks_exact(2).zip(vt.chunks_exact(2 * HD)) {
                tot = _mm512_add_ps(tot, p[0]);
                tot1 = _mm512_add_ps(tot1, p[1]);
                for d in 0..HD {
                    acc[d] = _mm512_fmadd_ps(p[0], _mm512_set1_ps(v[d]), acc[d]);
                    acc1[d] = _mm512_fmadd_ps(p[1], _mm512_set1_ps(v[HD + d]), acc1[d]);
                }
            }
            if l % 2 == 1 {
                let (p, v) = (s[l - 1], &vt[(l - 1) * HD..]);
                tot = _mm512_add_ps(tot, p);
                for (ad, &vv) in acc.iter_mut().zip(v) {
                    *ad = _mm512_fmadd_ps(p, _mm512_set1_ps(vv), *ad);
                }
            }
            let tot = _mm512_add_ps(tot, tot1);
            for (d, ad) in acc.iter().enumerate().take(hd) {
                let y = lanes16(_mm512_div_ps(_mm512_add_ps(*ad, acc1[d]), tot));
                o[d * st + i0..d * st + i0 + n].copy_from_slice(&y[..n]);
            }
        }
    }

    /// One tile's inputs: a block of output channels `j0..j0 + CB` of a packed block of width
    /// `cb`, and pixels `p0..p0 + NV · L` of one image.
    struct Tile<'a> {
        w: &'a [f32],
        cb: usize,
        j0: usize,
        cin: usize,
        g: DirectGeom,
        p0: usize,
    }

    /// Defines the direct 3 × 3 convolution's driver `$run` and its tile `$tile` for one vector
    /// width ([`super::conv3x3`]): `$cbmax` output channels × up to 3 vectors of `$l` pixels in
    /// registers per tile. The last tile of a plane takes fewer vectors; when its last one is
    /// partial, the tile runs on a copy of its outputs padded to whole vectors (the lanes past the
    /// plane read guard or later pixels, and are never copied back).
    macro_rules! direct_tiles {
        ($run:ident, $tile:ident, $feat:literal, $v:ty, $l:expr, $cbmax:expr, $zero:ident, $set1:ident, $fma:ident) => {
            #[target_feature(enable = $feat)]
            pub(in super::super) fn $run(d: &Direct3x3, g: &DirectGeom, pad: &[f32], o: DirectOut, out: &mut [f32]) {
                const NV: usize = 3;
                const L: usize = $l;
                let hw = g.h * g.w;
                let mut part = [0f32; $cbmax * NV * L];
                for (co0, cb, p) in &d.blocks {
                    let mut j0 = 0;
                    while j0 < *cb {
                        let sub = (*cb - j0).min($cbmax);
                        let mut p0 = 0;
                        while p0 < hw {
                            let valid = (hw - p0).min(NV * L);
                            let nv = valid.div_ceil(L);
                            let t = Tile {
                                w: p,
                                cb: *cb,
                                j0,
                                cin: d.cin,
                                g: *g,
                                p0,
                            };
                            let first = o.first + (co0 + j0) * o.cs + p0;
                            let whole = valid == nv * L;
                            if !whole {
                                for j in 0..sub {
                                    part[j * NV * L..][..valid].copy_from_slice(&out[first + j * o.cs..][..valid]);
                                }
                            }
                            let (dst, first, cs) = if whole {
                                (&mut *out, first, o.cs)
                            } else {
                                (&mut part[..], 0, NV * L)
                            };
                            match (sub, nv) {
                                (8, 3) => $tile::<8, 3>(&t, pad, dst, first, cs),
                                (8, 2) => $tile::<8, 2>(&t, pad, dst, first, cs),
                                (8, _) => $tile::<8, 1>(&t, pad, dst, first, cs),
                                (4, 3) => $tile::<4, 3>(&t, pad, dst, first, cs),
                                (4, 2) => $tile::<4, 2>(&t, pad, dst, first, cs),
                                (4, _) => $tile::<4, 1>(&t, pad, dst, first, cs),
                                (2, 3) => $tile::<2, 3>(&t, pad, dst, first, cs),
                                (2, 2) => $tile::<2, 2>(&t, pad, dst, first, cs),
                                (2, _) => $tile::<2, 1>(&t, pad, dst, first, cs),
                                (_, 3) => $tile::<1, 3>(&t, pad, dst, first, cs),
                                (_, 2) => $tile::<1, 2>(&t, pad, dst, first, cs),
                                _ => $tile::<1, 1>(&t, pad, dst, first, cs),
                            }
                            if !whole {
                                let first = o.first + (co0 + j0) * o.cs + p0;
                                for j in 0..sub {
                                    out[first + j * o.cs..][..valid].copy_from_slice(&part[j * NV * L..][..valid]);
                                }
                            }
                            p0 += valid;
                        }
                        j0 += sub;
                    }
                }
            }

            /// Adds the tile's taps into `out[first + j · cs + i]`, j < CB, i < NV · L.
            #[target_feature(enable = $feat)]
            #[inline]
            fn $tile<const CB: usize, const NV: usize>(
                t: &Tile<'_>,
                pad: &[f32],
                out: &mut [f32],
                first: usize,
                cs: usize,
            ) {
                const L: usize = $l;
                let load = |s: &[f32]| -> $v {
                    let a: [f32; L] = s[..L].try_into().expect("a slice of one vector");
                    bytemuck::cast(a)
                };
                let mut acc: [[$v; NV]; CB] =
                    std::array::from_fn(|j| std::array::from_fn(|v| load(&out[first + j * cs + v * L..])));
                let w = t.g.w;
                for ci in 0..t.cin {
                    let wc = &t.w[ci * 9 * t.cb..][..9 * t.cb];
                    for dx in 0..3 {
                        let base = t.g.at(dx, ci) + dx - w - 1 + t.p0;
                        for dy in 0..3 {
                            let src = &pad[base + dy * w..][..NV * L];
                            let xs: [$v; NV] = std::array::from_fn(|v| load(&src[v * L..]));
                            let wt = &wc[(3 * dy + dx) * t.cb + t.j0..][..CB];
                            for (a, &wv) in acc.iter_mut().zip(wt) {
                                let b = $set1(wv);
                                for (av, &xv) in a.iter_mut().zip(&xs) {
                                    *av = $fma(xv, b, *av);
                                }
                            }
                        }
                    }
                }
                for (j, a) in acc.iter().enumerate() {
                    for (v, &av) in a.iter().enumerate() {
                        let y: [f32; L] = bytemuck::cast(av);
                        out[first + j * cs + v * L..][..L].copy_from_slice(&y);
                    }
                }
            }
        };
    }

    direct_tiles!(
        direct512,
        tile512,
        "avx512f",
        __m512,
        16,
        8,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps
    );
    direct_tiles!(
        direct256,
        tile256,
        "avx2,fma",
        __m256,
        8,
        4,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps
    );
}

/// The six rows of the F(4×4, 3×3) input matrix Bᵀ (Lavin & Gray 2016, §4.2; interpolation
/// points 0, ±1, ±2, ∞) applied elementwise to six inputs: `o[j][k] = Σᵢ Bᵀ[j][i]·d[i][k]`.
#[inline(always)]
fn b_t6(o: [&mut [f32]; 6], d: [&[f32]; 6]) {
    let [o0, o1, o2, o3, o4, o5] = o;
    let n = o0.len();
    let (o1, o2, o3, o4, o5) = (&mut o1[..n], &mut o2[..n], &mut o3[..n], &mut o4[..n], &mut o5[..n]);
    let (d0, d1, d2, d3, d4, d5) = (&d[0][..n], &d[1][..n], &d[2][..n], &d[3][..n], &d[4][..n], &d[5][..n]);
    for k in 0..n {
        let (x0, x1, x2, x3, x4, x5) = (d0[k], d1[k], d2[k], d3[k], d4[k], d5[k]);
        o0[k] = 4.0 * x0 - 5.0 * x2 + x4;
        o1[k] = (x4 + x3) - 4.0 * (x1 + x2);
        o2[k] = (x4 - x3) + 4.0 * (x1 - x2);
        o3[k] = (x4 - x2) + 2.0 * (x3 - x1);
        o4[k] = (x4 - x2) - 2.0 * (x3 - x1);
        o5[k] = 4.0 * x1 - 5.0 * x3 + x5;
    }
}

/// The four rows of the F(4×4, 3×3) output matrix Aᵀ applied elementwise to six inputs.
#[inline(always)]
fn a_t4(o: [&mut [f32]; 4], d: [&[f32]; 6]) {
    let [o0, o1, o2, o3] = o;
    let n = o0.len();
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    let (d0, d1, d2, d3, d4, d5) = (&d[0][..n], &d[1][..n], &d[2][..n], &d[3][..n], &d[4][..n], &d[5][..n]);
    for k in 0..n {
        let (x0, x1, x2, x3, x4, x5) = (d0[k], d1[k], d2[k], d3[k], d4[k], d5[k]);
        let (sp, sm, tp, tm) = (x1 + x2, x1 - x2, x3 + x4, x3 - x4);
        o0[k] = x0 + sp + tp;
        o1[k] = sm + 2.0 * tm;
        o2[k] = sp + 4.0 * tp;
        o3[k] = (sm + 8.0 * tm) + x5;
    }
}

/// Six rows `len` long of `s`, the first at `first`, each `stride` after the one before.
#[inline(always)]
fn strided6(s: &[f32], first: usize, stride: usize, len: usize) -> [&[f32]; 6] {
    let s = &s[first..first + 5 * stride + len];
    [
        &s[..len],
        &s[stride..stride + len],
        &s[2 * stride..2 * stride + len],
        &s[3 * stride..3 * stride + len],
        &s[4 * stride..4 * stride + len],
        &s[5 * stride..],
    ]
}

/// Six disjoint rows `len` long of `v`, the first at `first`, each `stride` (≥ `len`) after the
/// one before.
#[inline(always)]
fn rows6(v: &mut [f32], first: usize, stride: usize, len: usize) -> [&mut [f32]; 6] {
    let v = &mut v[first..first + 5 * stride + len];
    let (a, v) = v.split_at_mut(stride);
    let (b, v) = v.split_at_mut(stride);
    let (c, v) = v.split_at_mut(stride);
    let (d, v) = v.split_at_mut(stride);
    let (e, f) = v.split_at_mut(stride);
    [
        &mut a[..len],
        &mut b[..len],
        &mut c[..len],
        &mut d[..len],
        &mut e[..len],
        f,
    ]
}

/// Four disjoint rows, as [`rows6`].
#[inline(always)]
fn rows4(v: &mut [f32], first: usize, stride: usize, len: usize) -> [&mut [f32]; 4] {
    let v = &mut v[first..first + 3 * stride + len];
    let (a, v) = v.split_at_mut(stride);
    let (b, v) = v.split_at_mut(stride);
    let (c, d) = v.split_at_mut(stride);
    [&mut a[..len], &mut b[..len], &mut c[..len], d]
}

/// Floats of scratch [`wino4_input`] and [`wino4_output`] need for `rows` tile rows of a plane
/// `w` wide.
pub fn wino4_scratch(rows: usize, w: usize) -> usize {
    72 * rows * w.div_ceil(4)
}

avx2_dispatch! {
    /// Winograd F(4×4, 3×3) input transform (Lavin & Gray 2016, §4.2: V = Bᵀ d B on 6 × 6
    /// tiles) of the tile rows `rows` (r0..r1) of one channel of a stride-1, padding-1 3 × 3
    /// convolution. `chan` holds the channel's h × w planes, one per image; tile row r is row
    /// ty = r mod ⌈h/4⌉ of image ⌊r / ⌈h/4⌉⌋, and its tile tx reads input rows 4ty − 1 … 4ty + 4
    /// and columns 4tx − 1 … 4tx + 4 (zero outside the plane). Tile (r, tx) writes its 36 values
    /// to `v[ξ·xs + (r − r0)·⌈w/4⌉ + tx]`, ξ = 6i + j. The transforms run on all the tiles at
    /// once, so their vectors are as long as the tile rows' tiles. `tmp`: [`wino4_scratch`].
    pub fn wino4_input(chan: &[f32], h: usize, w: usize, rows: std::ops::Range<usize>, v: &mut [f32], xs: usize, tmp: &mut [f32]) => wino4_input_impl
}

#[inline(always)]
fn wino4_input_impl<const F: bool>(
    chan: &[f32],
    h: usize,
    w: usize,
    rows: std::ops::Range<usize>,
    v: &mut [f32],
    xs: usize,
    tmp: &mut [f32],
) {
    let (r0, r1) = (rows.start, rows.end);
    let (th, tw) = (h.div_ceil(4), w.div_ceil(4));
    let l = (r1 - r0) * tw;
    let (d, e) = tmp[..72 * l].split_at_mut(36 * l);
    // d[(6·rr + c)·l + (r − r0)·tw + tx]: the padded input at row rr, column c of tile (r, tx),
    // that is x[4tx + c − 1] of input row 4ty + rr − 1 (zero outside the plane).
    for r in r0..r1 {
        let (b, ty) = (r / th, r % th);
        let plane = &chan[b * h * w..(b + 1) * h * w];
        let o = (r - r0) * tw;
        for rr in 0..6 {
            let iy = (4 * ty + rr).wrapping_sub(1);
            let dr: [&mut [f32]; 6] = rows6(d, 6 * rr * l + o, l, tw);
            if iy >= h {
                for row in dr {
                    row.fill(0.0);
                }
                continue;
            }
            let row = &plane[iy * w..(iy + 1) * w];
            let [d0, d1, d2, d3, d4, d5] = dr;
            // Tiles whose six columns 4tx − 1 … 4tx + 4 all lie inside the row: 1 ≤ tx and
            // 4tx + 4 < w.
            let inner = if w >= 5 { ((w - 5) / 4 + 1).min(tw) } else { 0 };
            for tx in 1..inner {
                let q = &row[4 * tx - 1..4 * tx + 5];
                d0[tx] = q[0];
                d1[tx] = q[1];
                d2[tx] = q[2];
                d3[tx] = q[3];
                d4[tx] = q[4];
                d5[tx] = q[5];
            }
            let at = |k: usize| if (1..=w).contains(&k) { row[k - 1] } else { 0.0 };
            for tx in (0..tw).filter(|&tx| tx == 0 || tx >= inner.max(1)) {
                d0[tx] = at(4 * tx);
                d1[tx] = at(4 * tx + 1);
                d2[tx] = at(4 * tx + 2);
                d3[tx] = at(4 * tx + 3);
                d4[tx] = at(4 * tx + 4);
                d5[tx] = at(4 * tx + 5);
            }
        }
    }
    // Along x: e[(6·rr + j)·l + k] = Σ_c Bᵀ[j][c]·d[(6·rr + c)·l + k].
    for rr in 0..6 {
        b_t6(rows6(e, 6 * rr * l, l, l), strided6(d, 6 * rr * l, l, l));
    }
    // Along y: v[(6i + j)·xs + k] = Σ_rr Bᵀ[i][rr]·e[(6·rr + j)·l + k].
    for j in 0..6 {
        b_t6(rows6(v, j * xs, 6 * xs, l), strided6(e, j * l, 6 * l, l));
    }
}

avx2_dispatch! {
    /// Winograd F(4×4, 3×3) output transform (Lavin & Gray 2016, §4.2: Y = Aᵀ M A) of the tile
    /// rows `rows` (r0..r1) of one output channel (tiles as in [`wino4_input`]): tile (r, tx)'s 36
    /// products `m[ξ·xs + (r − r0)·⌈w/4⌉ + tx]` become the 4 × 4 outputs at rows 4ty … 4ty + 3
    /// and columns 4tx … 4tx + 3 of its image's h × w plane in `chan`, added to what is there
    /// (outputs past the plane's edge are dropped). `tmp`: [`wino4_scratch`].
    pub fn wino4_output(m: &[f32], xs: usize, chan: &mut [f32], h: usize, w: usize, rows: std::ops::Range<usize>, tmp: &mut [f32]) => wino4_output_impl
}

#[inline(always)]
fn wino4_output_impl<const F: bool>(
    m: &[f32],
    xs: usize,
    chan: &mut [f32],
    h: usize,
    w: usize,
    rows: std::ops::Range<usize>,
    tmp: &mut [f32],
) {
    let (r0, r1) = (rows.start, rows.end);
    let (th, tw, full) = (h.div_ceil(4), w.div_ceil(4), w / 4);
    let l = (r1 - r0) * tw;
    let (s, y) = tmp[..40 * l].split_at_mut(24 * l);
    // Along y: s[(6a + j)·l + k] = Σ_i Aᵀ[a][i]·m[(6i + j)·xs + k].
    for j in 0..6 {
        a_t4(rows4(s, j * l, 6 * l, l), strided6(m, j * xs, 6 * xs, l));
    }
    // Along x: y[(4a + c)·l + k] = Σ_j Aᵀ[c][j]·s[(6a + j)·l + k] = output (4ty + a, 4tx + c).
    for a in 0..4 {
        a_t4(rows4(y, 4 * a * l, l, l), strided6(s, 6 * a * l, l, l));
    }
    for r in r0..r1 {
        let (b, ty) = (r / th, r % th);
        let plane = &mut chan[b * h * w..(b + 1) * h * w];
        let o = (r - r0) * tw;
        for a in 0..4 {
            let oy = 4 * ty + a;
            if oy >= h {
                break;
            }
            let yr = |c: usize| &y[(4 * a + c) * l + o..][..tw];
            let (y0, y1, y2, y3) = (yr(0), yr(1), yr(2), yr(3));
            let orow = &mut plane[oy * w..(oy + 1) * w];
            let mut quads = orow.chunks_exact_mut(4);
            for ((((q, &v0), &v1), &v2), &v3) in (&mut quads).zip(y0).zip(y1).zip(y2).zip(y3) {
                q[0] += v0;
                q[1] += v1;
                q[2] += v2;
                q[3] += v3;
            }
            for (o, yc) in quads.into_remainder().iter_mut().zip([y0, y1, y2]) {
                *o += yc[full];
            }
        }
    }
}

/// A zeroed vector of `len` floats whose 2 MB-aligned interior Linux is asked to back with
/// 2 MB pages (`madvise(MADV_HUGEPAGE)`, which transparent huge pages in their common `madvise`
/// mode wait for), before any page is touched. For the CPU UNet's Winograd weights (572 MB on
/// the DDPM-CIFAR10 architecture): 2 MB pages take 512× fewer page faults to fill, and the
/// GEMMs that stream the weights every forward miss the TLB less. Elsewhere, or where the kernel
/// declines, it is an ordinary zeroed vector.
pub fn zeroed_huge(len: usize) -> Vec<f32> {
    let Ok(layout) = std::alloc::Layout::array::<f32>(len) else {
        return vec![0.0; len];
    };
    if layout.size() == 0 {
        return Vec::new();
    }
    // Zeroed by the allocator: a large `calloc` is fresh anonymous memory the kernel zero-fills
    // on first touch, so no pass writes zeros over it before the caller's own writes (which
    // cost a page fault per 2 MB page either way).
    // SAFETY: a non-zero-sized layout for `len` f32s; a null return is handled.
    #[allow(unsafe_code)]
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = p as usize;
        let (lo, hi) = (start.next_multiple_of(HUGE), (start + len * 4) / HUGE * HUGE);
        if hi > lo {
            // SAFETY: advice on pages inside this allocation (from `start` for len · 4 bytes);
            // it moves, frees and reads nothing, and a refusal is ignored.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `len` f32s (capacity
    // `len`), and all its bytes are zero, a valid f32 (0.0) each.
    #[allow(unsafe_code)]
    unsafe {
        Vec::from_raw_parts(p, len, len)
    }
}

avx2_dispatch! {
    /// Winograd F(4×4, 3×3) weight transform (Lavin & Gray 2016, §4.2: U = G g Gᵀ with the
    /// 6 × 3 G of points 0, ±1, ±2, ∞, in f64) of a [cout, cin, 3, 3] kernel into 36 matrices
    /// [ξ][cout][cin], ξ = 6i + j.
    pub fn wino4_weights(w: &[f32], cout: usize, cin: usize) -> Vec<f32> => wino4_weights_impl
}

#[inline(always)]
fn wino4_weights_impl<const F: bool>(w: &[f32], cout: usize, cin: usize) -> Vec<f32> {
    const G: [[f64; 3]; 6] = [
        [1.0 / 4.0, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ];
    let p = cout * cin;
    let mut u = zeroed_huge(36 * p);
    // In blocks of pairs, each kernel element as a row over the block (so every step below runs
    // along contiguous rows): g[q][pair], then t = G g ([i][b]), then u = t Gᵀ.
    const BLOCK: usize = 256;
    let mut g = vec![0f64; 9 * BLOCK];
    let mut t = vec![0f64; 18 * BLOCK];
    for p0 in (0..p).step_by(BLOCK) {
        let nb = BLOCK.min(p - p0);
        for (k, kernel) in w[9 * p0..9 * (p0 + nb)].chunks_exact(9).enumerate() {
            for (q, &x) in kernel.iter().enumerate() {
                g[q * BLOCK + k] = x as f64;
            }
        }
        for i in 0..6 {
            for b in 0..3 {
                let ti = &mut t[(3 * i + b) * BLOCK..][..nb];
                ti.fill(0.0);
                for a in 0..3 {
                    let c = G[i][a];
                    for (y, &x) in ti.iter_mut().zip(&g[(3 * a + b) * BLOCK..][..nb]) {
                        *y += c * x;
                    }
                }
            }
        }
        for i in 0..6 {
            for j in 0..6 {
                let out = &mut u[(6 * i + j) * p + p0..][..nb];
                let (t0, t1, t2) = (
                    &t[3 * i * BLOCK..][..nb],
                    &t[(3 * i + 1) * BLOCK..][..nb],
                    &t[(3 * i + 2) * BLOCK..][..nb],
                );
                for k in 0..nb {
                    out[k] = (t0[k] * G[j][0] + t1[k] * G[j][1] + t2[k] * G[j][2]) as f32;
                }
            }
        }
    }
    u
}

/// Output channels per block of a packed [`Direct3x3`] kernel (the widest block the AVX-512
/// tile takes: 8 broadcast weights against 3 vectors of 16 pixels, 24 accumulators).
const DIRECT_CB: usize = 8;

/// A 3 × 3, stride-1, padding-1 convolution kernel packed for [`conv3x3`]: the output channels
/// in blocks of 8 (the remainder as blocks of 4, 2 and 1), each block's weights ordered
/// [cin][tap = 3·dy + dx][channel in the block], so that a tile broadcasts them in the order it
/// reads them.
pub struct Direct3x3 {
    cin: usize,
    cout: usize,
    /// (first output channel, block width, packed weights [cin][9][width]).
    blocks: Vec<(usize, usize, Vec<f32>)>,
}

impl Direct3x3 {
    /// Packs a [cout, cin, 3, 3] kernel.
    pub fn new(w: &[f32], cout: usize, cin: usize) -> Self {
        assert_eq!(w.len(), cout * cin * 9, "Direct3x3: kernel of the wrong size");
        let mut widths = vec![DIRECT_CB; cout / DIRECT_CB];
        widths.extend([4, 2, 1].into_iter().filter(|&b| (cout % DIRECT_CB) & b != 0));
        let mut blocks = Vec::with_capacity(widths.len());
        let mut co0 = 0;
        for cb in widths {
            let mut p = vec![0f32; cin * 9 * cb];
            for ci in 0..cin {
                for tap in 0..9 {
                    for j in 0..cb {
                        p[(ci * 9 + tap) * cb + j] = w[((co0 + j) * cin + ci) * 9 + tap];
                    }
                }
            }
            blocks.push((co0, cb, p));
            co0 += cb;
        }
        Direct3x3 { cin, cout, blocks }
    }

    /// Packs the adjoint of a [cout, cin, 3, 3] kernel, the convolution that takes an output
    /// gradient ∂y [cout] to the input gradient ∂x [cin] of a 3 × 3, stride-1, padding-1
    /// convolution: ∂x[ci][p] = Σ_{co, dy, dx} w[co][ci][dy][dx] · ∂y[co][p − (dy − 1, dx − 1)],
    /// which is again such a convolution, with kernel w′[ci][co][tap] = w[co][ci][8 − tap] (the
    /// kernel rotated by 180° and its channel axes swapped).
    pub fn adjoint(w: &[f32], cout: usize, cin: usize) -> Self {
        assert_eq!(w.len(), cout * cin * 9, "Direct3x3: kernel of the wrong size");
        let mut wt = vec![0f32; w.len()];
        for co in 0..cout {
            for ci in 0..cin {
                for tap in 0..9 {
                    wt[(ci * cout + co) * 9 + tap] = w[(co * cin + ci) * 9 + 8 - tap];
                }
            }
        }
        Direct3x3::new(&wt, cin, cout)
    }
}

/// Where one image's input planes lie in the scratch of [`conv3x3`]: three copies of each
/// channel (copy `dx` serves the taps of column dx), each plane with `w + 1` zeros before it and
/// `w + 1 + 16` after, so that every tap of every output pixel is one read at a fixed offset.
#[derive(Clone, Copy)]
struct DirectGeom {
    h: usize,
    w: usize,
    /// Floats from one channel's plane to the next (one copy).
    cs: usize,
    /// Floats from one copy to the next.
    ds: usize,
}

impl DirectGeom {
    fn new(cin: usize, h: usize, w: usize) -> Self {
        let cs = h * w + 2 * (w + 1) + 16;
        DirectGeom { h, w, cs, ds: cin * cs }
    }
    /// The index in the scratch of copy `dx`, channel `ci`, pixel 0 (the plane's guard is before).
    fn at(&self, dx: usize, ci: usize) -> usize {
        dx * self.ds + ci * self.cs + self.w + 1
    }
}

/// Fills the scratch for one image (`x` its channel planes at stride `xs`): copy 1 is the plane,
/// copy 0 the plane with its last column zeroed (the tap left of column 0 reads there, the row
/// above's last pixel), copy 2 with its first column zeroed (the tap right of the last column
/// reads the next row's first pixel); every guard is written as zeros.
fn direct_pad(g: &DirectGeom, cin: usize, x: &[f32], xs: usize, pad: &mut [f32]) {
    let (h, w, hw) = (g.h, g.w, g.h * g.w);
    for dx in 0..3 {
        for ci in 0..cin {
            let p0 = g.at(dx, ci);
            pad[p0 - w - 1..p0].fill(0.0);
            pad[p0 + hw..p0 - w - 1 + g.cs].fill(0.0);
            let dst = &mut pad[p0..p0 + hw];
            dst.copy_from_slice(&x[ci * xs..ci * xs + hw]);
            match dx {
                0 => (0..h).for_each(|y| dst[y * w + w - 1] = 0.0),
                2 => (0..h).for_each(|y| dst[y * w] = 0.0),
                _ => {}
            }
        }
    }
}

/// Floats of scratch [`conv3x3`] needs for `cin` channels of h × w planes.
pub fn conv3x3_scratch(cin: usize, h: usize, w: usize) -> usize {
    3 * DirectGeom::new(cin, h, w).ds
}

/// The column matrix of a 3 × 3, stride-1, padding-1 convolution of one image (im2col):
/// `col[(ci·9 + tap)·h·w + p]` = x[ci] at pixel p shifted by the tap (dy − 1, dx − 1), zero
/// outside the plane, for `x` [cin][h][w]. The shifted planes are slices of [`conv3x3`]'s
/// zero-guarded copies, so each row is one contiguous copy (no per-row bounds), which is what the
/// weight gradient ∂W = ∂y · colᵀ needs. `pad`: [`conv3x3_scratch`] floats, contents not kept.
pub fn conv3x3_columns(x: &[f32], cin: usize, h: usize, w: usize, pad: &mut [f32], col: &mut [f32]) {
    let hw = h * w;
    assert!(
        x.len() >= cin * hw && col.len() >= cin * 9 * hw,
        "conv3x3_columns: buffers too small"
    );
    let g = DirectGeom::new(cin, h, w);
    let pad = &mut pad[..3 * g.ds];
    direct_pad(&g, cin, x, hw, pad);
    for (r, row) in col.chunks_exact_mut(hw).take(cin * 9).enumerate() {
        let (ci, ty, tx) = (r / 9, r % 9 / 3, r % 3);
        // Copy tx at row offset ty − 1 and column offset tx − 1 (as `direct_scalar` reads it).
        let at = g.at(tx, ci) + ty * w + tx - w - 1;
        row.copy_from_slice(&pad[at..at + hw]);
    }
}

/// Which copy of the direct 3 × 3 tiles to run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    /// AVX-512F (with AVX2 + FMA): 8 output channels × 3 vectors of 16 pixels per tile.
    Avx512,
    /// AVX2 + FMA: 4 output channels × 3 vectors of 8 pixels per tile.
    Avx2,
    /// Plain loops (any CPU).
    Scalar,
}

impl Isa {
    /// The widest this CPU runs.
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return if std::arch::is_x86_feature_detected!("avx512f") {
                    Isa::Avx512
                } else {
                    Isa::Avx2
                };
            }
        }
        Isa::Scalar
    }
}

/// A 3 × 3, stride-1, padding-1 convolution added into `out`, computed directly (no column
/// matrix): `out[co][b][y][x] += Σ_{ci, dy, dx} w[co][ci][dy][dx] · x[ci][b][y + dy − 1][x + dx − 1]`
/// with zeros outside the plane, for `x` [cin][nb][h][w] and `out` [cout][nb][h][w]
/// (channel-major, as the CPU UNet keeps its feature maps). Per image, the planes are first
/// copied into `pad` ([`conv3x3_scratch`] floats, contents not kept) with zero guards, so every
/// tap of a pixel is a read at a fixed offset; a tile then keeps a block of output channels ×
/// pixels in registers over all cin · 9 taps (one vector load of pixels feeds a multiply-add per
/// channel of the block). Against im2col + GEMM, the 9-fold column matrix and the GEMM's packing
/// of it are never written. Each output is summed over ci, then dx, then dy, one rounding per
/// multiply-add.
pub fn conv3x3(d: &Direct3x3, x: &[f32], nb: usize, h: usize, w: usize, out: &mut [f32], pad: &mut [f32]) {
    conv3x3_on(Isa::best(), d, x, nb, h, w, out, pad)
}

/// [`conv3x3`] on the tiles of `isa` (the next one down when this CPU lacks it).
#[allow(clippy::too_many_arguments)]
pub fn conv3x3_on(isa: Isa, d: &Direct3x3, x: &[f32], nb: usize, h: usize, w: usize, out: &mut [f32], pad: &mut [f32]) {
    let (cin, hw) = (d.cin, h * w);
    assert!(
        x.len() >= cin * nb * hw && out.len() >= d.cout * nb * hw,
        "conv3x3: buffers too small"
    );
    let g = DirectGeom::new(cin, h, w);
    let pad = &mut pad[..3 * g.ds];
    let isa = match isa {
        Isa::Avx512 if Isa::best() != Isa::Avx512 => Isa::best(),
        Isa::Avx2 if Isa::best() == Isa::Scalar => Isa::Scalar,
        i => i,
    };
    for b in 0..nb {
        direct_pad(&g, cin, &x[b * hw..], nb * hw, pad);
        let o = DirectOut {
            first: b * hw,
            cs: nb * hw,
        };
        match isa {
            // SAFETY (both arms): calling a `target_feature` function is sound when the CPU has
            // the features. `isa` was lowered above to at most `Isa::best()`, which is `Avx512`
            // only when AVX-512F, AVX2 and FMA were all detected, and `Avx2` only when AVX2 and
            // FMA were.
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            Isa::Avx512 => unsafe { x86::direct512(d, &g, pad, o, out) },
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            Isa::Avx2 => unsafe { x86::direct256(d, &g, pad, o, out) },
            _ => direct_scalar(d, &g, pad, o, out),
        }
    }
}

/// Where one image's output planes lie: channel `co` at `first + co · cs`.
#[derive(Clone, Copy)]
struct DirectOut {
    first: usize,
    cs: usize,
}

/// The tiles' arithmetic in plain loops, in the same order.
fn direct_scalar(d: &Direct3x3, g: &DirectGeom, pad: &[f32], o: DirectOut, out: &mut [f32]) {
    let (w, hw) = (g.w, g.h * g.w);
    for (co0, cb, p) in &d.blocks {
        for j in 0..*cb {
            let dst = &mut out[o.first + (co0 + j) * o.cs..][..hw];
            for ci in 0..d.cin {
                let wc = &p[ci * 9 * cb..(ci + 1) * 9 * cb];
                for dx in 0..3 {
                    let base = g.at(dx, ci) + dx - w - 1;
                    for dy in 0..3 {
                        let src = &pad[base + dy * w..][..hw];
                        let wt = wc[(3 * dy + dx) * cb + j];
                        for (y, &s) in dst.iter_mut().zip(src) {
                            *y = s.mul_add(wt, *y);
                        }
                    }
                }
            }
        }
    }
}

avx2_dispatch! {
    /// dst = src·a + b, then SiLU when `silu_after`.
    pub fn affine(dst: &mut [f32], src: &[f32], a: f32, b: f32, silu_after: bool) => affine_impl
}

#[inline(always)]
fn affine_impl<const F: bool>(dst: &mut [f32], src: &[f32], a: f32, b: f32, silu_after: bool) {
    if silu_after {
        for (y, &v) in dst.iter_mut().zip(src) {
            *y = silu_f::<F>(madd::<F>(v, a, b));
        }
    } else {
        for (y, &v) in dst.iter_mut().zip(src) {
            *y = madd::<F>(v, a, b);
        }
    }
}

avx2_dispatch! {
    /// Group-norm backward over one channel, first pass: with x̂ = (x − mean)·rstd and
    /// z = γ x̂ + β, writes dz = dy·SiLU'(z) = dy·s(1 + z(1 − s)), s = σ(z), when `silu` (else
    /// dz = dy) and returns (Σ dz, Σ dz·x̂) (f32 partial sums over eight lanes per block of 256,
    /// widened).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_act_grad(dz: &mut [f32], x: &[f32], dy: &[f32], mean: f32, rstd: f32, gamma: f32, beta: f32, silu: bool) -> (f64, f64) => norm_act_grad_impl
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn norm_act_grad_impl<const F: bool>(
    dz: &mut [f32],
    x: &[f32],
    dy: &[f32],
    mean: f32,
    rstd: f32,
    gamma: f32,
    beta: f32,
    silu: bool,
) -> (f64, f64) {
    if silu {
        for ((d, &xv), &g) in dz.iter_mut().zip(x).zip(dy) {
            let z = madd::<F>(gamma, (xv - mean) * rstd, beta);
            let s = 1.0 / (1.0 + exp_f::<F>(-z));
            *d = g * s * madd::<F>(z, 1.0 - s, 1.0);
        }
    } else {
        dz.copy_from_slice(dy);
    }
    let (mut t1, mut t2) = (0f64, 0f64);
    for (bd, bx) in dz.chunks(256).zip(x.chunks(256)) {
        let (mut a, mut b) = ([0f32; 8], [0f32; 8]);
        let (mut id, mut ix) = (bd.chunks_exact(8), bx.chunks_exact(8));
        for (cd, cx) in (&mut id).zip(&mut ix) {
            for k in 0..8 {
                a[k] += cd[k];
                b[k] = madd::<F>(cd[k], (cx[k] - mean) * rstd, b[k]);
            }
        }
        for (&d, &xv) in id.remainder().iter().zip(ix.remainder()) {
            t1 += d as f64;
            t2 += (d * (xv - mean) * rstd) as f64;
        }
        t1 += a.iter().map(|&v| v as f64).sum::<f64>();
        t2 += b.iter().map(|&v| v as f64).sum::<f64>();
    }
    (t1, t2)
}

avx2_dispatch! {
    /// Group-norm backward over one channel, second pass: dx += rstd·(γ dz − m1 − x̂ m2) with
    /// x̂ = (x − mean)·rstd (m1, m2: the group means of γ dz and γ dz·x̂).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_input_grad(dx: &mut [f32], dz: &[f32], x: &[f32], mean: f32, rstd: f32, gamma: f32, m1: f32, m2: f32) => norm_input_grad_impl
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn norm_input_grad_impl<const F: bool>(
    dx: &mut [f32],
    dz: &[f32],
    x: &[f32],
    mean: f32,
    rstd: f32,
    gamma: f32,
    m1: f32,
    m2: f32,
) {
    for ((d, &g), &xv) in dx.iter_mut().zip(dz).zip(x) {
        let xh = (xv - mean) * rstd;
        *d = madd::<F>(rstd, madd::<F>(gamma, g, -m1) - xh * m2, *d);
    }
}

avx2_dispatch! {
    /// Softmax backward of each row of `l` values, in place: ds ← p ⊙ (ds − Σ ds ⊙ p).
    pub fn softmax_grad_rows(ds: &mut [f32], p: &[f32], l: usize) => softmax_grad_rows_impl
}

#[inline(always)]
fn softmax_grad_rows_impl<const F: bool>(ds: &mut [f32], p: &[f32], l: usize) {
    for (drow, prow) in ds.chunks_exact_mut(l).zip(p.chunks_exact(l)) {
        // 32 lanes: two independent vector chains of multiply-adds on AVX-512, four on AVX2.
        let mut acc = [0f32; 32];
        let (mut id, mut ip) = (drow.chunks_exact(32), prow.chunks_exact(32));
        for (cd, cp) in (&mut id).zip(&mut ip) {
            for k in 0..32 {
                acc[k] = madd::<F>(cd[k], cp[k], acc[k]);
            }
        }
        let mut dot: f32 = id.remainder().iter().zip(ip.remainder()).map(|(a, b)| a * b).sum();
        dot += acc.iter().sum::<f32>();
        for (d, &pp) in drow.iter_mut().zip(prow) {
            *d = pp * (*d - dot);
        }
    }
}

avx2_dispatch! {
    /// SiLU backward: dx += dy·s(1 + x(1 − s)), s = σ(x).
    pub fn silu_grad(dx: &mut [f32], dy: &[f32], x: &[f32]) => silu_grad_impl
}

#[inline(always)]
fn silu_grad_impl<const F: bool>(dx: &mut [f32], dy: &[f32], x: &[f32]) {
    for ((d, &g), &xv) in dx.iter_mut().zip(dy).zip(x) {
        let s = 1.0 / (1.0 + exp_f::<F>(-xv));
        *d = madd::<F>(g * s, madd::<F>(xv, 1.0 - s, 1.0), *d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32;
            }
        }
        c
    }

    #[test]
    fn sgemm_matches_a_naive_product_with_strides_and_accumulation() {
        let (m, n, k) = (7, 13, 5);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 17 % 7) as f32 - 3.0) / 2.0).collect();
        let want = naive(m, n, k, &a, &b);
        // Destination with row stride n + 3 and an initial value of 1: read_dst accumulates.
        let mut dst = vec![1f32; (m - 1) * (n + 3) + n];
        sgemm(m, n, k, &mut dst, n + 3, true, Mat::rows(&a, k), Mat::rows(&b, n), 2.0);
        for i in 0..m {
            for j in 0..n {
                assert!((dst[i * (n + 3) + j] - (1.0 + 2.0 * want[i * n + j])).abs() < 1e-4);
            }
        }
        // Transposed operands: (bᵀ)ᵀ and (aᵀ)ᵀ stored column-major.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut dst = vec![7f32; m * n];
        sgemm(m, n, k, &mut dst, n, false, Mat::cols(&at, m), Mat::cols(&bt, k), 1.0);
        for (x, y) in dst.iter().zip(&want) {
            assert!((x - y).abs() < 1e-4);
        }
    }

    #[test]
    #[should_panic(expected = "rhs too small")]
    fn sgemm_refuses_an_operand_that_does_not_fit() {
        let mut dst = vec![0f32; 4];
        sgemm(
            2,
            2,
            2,
            &mut dst,
            2,
            false,
            Mat::rows(&[1.0; 4], 2),
            Mat::rows(&[1.0; 3], 2),
            1.0,
        );
    }

    #[test]
    fn fast_exp_is_within_two_ulp_of_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_731;
        }
        assert!(worst < 2.5 * f32::EPSILON as f64, "worst relative error {worst:e}");
        assert_eq!(exp(-1000.0), exp(-87.3));
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(1000.0).is_finite());
        assert!((silu(-200.0)).abs() < 1e-30 && (silu(3.0) - 3.0 / (1.0 + (-3f32).exp())).abs() < 1e-6);
        // The fused-multiply-add variant (what the AVX2 + FMA copies run), through softmax.
        let xs: Vec<f32> = (0..239_000).map(|i| -87.0 + i as f32 * 0.000_731).collect();
        let mut row = xs.clone();
        softmax_rows(&mut row, xs.len());
        let mx = xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let denom: f64 = xs.iter().map(|&x| (x as f64 - mx).exp()).sum();
        for (&x, &p) in xs.iter().zip(&row).step_by(97) {
            let want = (x as f64 - mx).exp() / denom;
            if want > 1e-30 {
                assert!(((p as f64 - want) / want).abs() < 1e-5, "softmax at {x}: {p} vs {want}");
            }
        }
        let mut worst = 0f64;
        for &x in xs.iter().step_by(7) {
            let (got, want) = (exp_f::<true>(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(
            worst < 2.5 * f32::EPSILON as f64,
            "fused: worst relative error {worst:e}"
        );
    }

    /// The small-head attention kernel equals the textbook formula (in f64) for head dimensions
    /// padded to 4, 8 and 16, lengths that are and are not whole blocks of 16 queries, and
    /// scores large enough that a softmax without its maximum subtracted would overflow.
    #[test]
    fn small_head_attention_equals_the_textbook_formula() {
        let mut scratch = Vec::new();
        for (hd, l, stride, amp) in [
            (8, 196, 200, 1.0),
            (3, 37, 50, 4.0),
            (16, 16, 16, 1.0),
            (5, 1, 3, 1.0),
            (11, 49, 60, 30.0),
        ] {
            let q: Vec<f32> = (0..hd * stride).map(|i| amp * val(1, i)).collect();
            let k: Vec<f32> = (0..hd * stride).map(|i| amp * val(2, i)).collect();
            let v: Vec<f32> = (0..hd * stride).map(|i| val(3, i)).collect();
            let mut o = vec![9f32; hd * stride];
            let head = Head {
                q: &q,
                k: &k,
                v: &v,
                stride,
                hd,
                l,
            };
            let scale = 1.0 / (hd as f32).sqrt();
            attend_small(&head, &mut o, scale, &mut scratch);
            // Every other path this CPU can run gives the same outputs.
            let mut others = Vec::new();
            let mut o_rows = vec![9f32; hd * stride];
            attend_rows(&head, &mut o_rows, scale, &mut scratch);
            others.push(("row by row", o_rows));
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                let mut o2 = vec![9f32; hd * stride];
                // SAFETY: the CPU has AVX2 and FMA (detected just above).
                #[allow(unsafe_code)]
                unsafe {
                    x86::attend(&head, &mut o2, scale, &mut scratch)
                };
                others.push(("AVX2", o2));
            }
            for (name, other) in &others {
                for (&a, &b) in o.iter().zip(other) {
                    assert!(
                        (a - b).abs() < 2e-6 * (1.0 + amp),
                        "hd {hd}, l {l}: {a} vs {b} ({name})"
                    );
                }
            }
            for i in 0..l {
                let s: Vec<f64> = (0..l)
                    .map(|j| {
                        scale as f64
                            * (0..hd)
                                .map(|d| q[d * stride + i] as f64 * k[d * stride + j] as f64)
                                .sum::<f64>()
                    })
                    .collect();
                let mx = s.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..l).map(|j| (s[j] - mx).exp() / z * v[d * stride + j] as f64).sum();
                    let got = o[d * stride + i] as f64;
                    assert!(
                        (got - want).abs() < 2e-6 * (1.0 + amp as f64),
                        "hd {hd}, l {l}: o[{d}, {i}] = {got}, want {want}"
                    );
                }
            }
            // Positions past l in each plane are left alone.
            for d in 0..hd {
                assert!(
                    o[d * stride + l..(d + 1) * stride].iter().all(|&x| x == 9.0),
                    "hd {hd}, l {l}"
                );
            }
        }
    }

    /// A deterministic value in [−1, 1) for element `i` of test array `s` (a multiplicative hash).
    fn val(s: usize, i: usize) -> f32 {
        (((i * 2_654_435_761 + s) % 1000) as f32 / 500.0) - 1.0
    }

    /// The training attention kernels against their definitions in f64 (Vaswani et al. Eq. 1 and
    /// its gradient, with the softmax row sums taken from P and ∂P, not from O): outputs, the
    /// probabilities in their blocked layout, and ∂Q, ∂K, ∂V added onto non-zero gradients, for
    /// head dimensions padded three ways and lengths below, at and between whole blocks of 16.
    #[test]
    fn training_attention_equals_its_definition() {
        if !attn_train_available(16) {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        for (hd, l) in [(3, 5), (4, 16), (8, 49), (8, 196), (12, 33), (16, 64), (1, 1)] {
            let n = hd * l;
            let (q, k, v, dout): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) = (
                (0..n).map(|i| val(1, i) * 2.0).collect(),
                (0..n).map(|i| val(2, i) * 2.0).collect(),
                (0..n).map(|i| val(3, i)).collect(),
                (0..n).map(|i| val(4, i)).collect(),
            );
            let scale = 1.0 / (hd as f32).sqrt();
            let h = TrainHead {
                q: &q,
                k: &k,
                v: &v,
                hd,
                l,
            };
            let mut o = vec![0f32; n];
            let mut pb = vec![f32::NAN; attn_train_probs(l)];
            let mut scratch = Vec::new();
            attn_train_forward(&h, scale, &mut o, &mut pb, &mut scratch);
            let init = |s: usize| -> Vec<f32> { (0..n).map(|i| val(s, i) * 0.1).collect() };
            let (mut dq, mut dk, mut dv) = (init(5), init(6), init(7));
            attn_train_backward(&h, &o, &dout, scale, &pb, &mut dq, &mut dk, &mut dv, &mut scratch);
            // Reference in f64.
            let at = |x: &[f32], d: usize, i: usize| x[d * l + i] as f64;
            let mut p = vec![0f64; l * l];
            for i in 0..l {
                let s: Vec<f64> = (0..l)
                    .map(|j| (0..hd).map(|d| at(&q, d, i) * at(&k, d, j)).sum::<f64>() * scale as f64)
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for j in 0..l {
                    p[i * l + j] = (s[j] - m).exp() / z;
                }
            }
            let close = |got: f32, want: f64, what: &str| {
                assert!(
                    (got as f64 - want).abs() <= 2e-5 * (1.0 + want.abs()),
                    "hd {hd}, l {l}: {what}: {got} vs {want}"
                );
            };
            for i in 0..l {
                for j in 0..l {
                    close(pb[((i / 16) * l + j) * 16 + i % 16], p[i * l + j], "P");
                }
                for d in 0..hd {
                    let want: f64 = (0..l).map(|j| p[i * l + j] * at(&v, d, j)).sum();
                    close(o[d * l + i], want, "O");
                }
            }
            // ∂P = ∂Oᵀ V, ∂S = P ⊙ (∂P − Σ_j P ∂P).
            let mut ds = vec![0f64; l * l];
            for i in 0..l {
                let dp: Vec<f64> = (0..l)
                    .map(|j| (0..hd).map(|d| at(&dout, d, i) * at(&v, d, j)).sum())
                    .collect();
                let r: f64 = (0..l).map(|j| p[i * l + j] * dp[j]).sum();
                for j in 0..l {
                    ds[i * l + j] = p[i * l + j] * (dp[j] - r);
                }
            }
            let sc = scale as f64;
            for d in 0..hd {
                for x in 0..l {
                    let want_q: f64 = sc * (0..l).map(|j| ds[x * l + j] * at(&k, d, j)).sum::<f64>();
                    let want_k: f64 = sc * (0..l).map(|i| ds[i * l + x] * at(&q, d, i)).sum::<f64>();
                    let want_v: f64 = (0..l).map(|i| p[i * l + x] * at(&dout, d, i)).sum();
                    let base = |s: usize| val(s, d * l + x) as f64 * 0.1;
                    close(dq[d * l + x], base(5) + want_q, "∂Q");
                    close(dk[d * l + x], base(6) + want_k, "∂K");
                    close(dv[d * l + x], base(7) + want_v, "∂V");
                }
            }
        }
    }

    /// The 3 × 3 convolution with zero padding 1, in f64, added onto `init`: `x` [cin][nb][h][w],
    /// `g` [cout][cin][3][3], result [cout][nb][h][w] (the reference of the Winograd and direct
    /// convolution tests).
    #[allow(clippy::too_many_arguments)]
    fn reference_conv3x3(
        x: &[f32],
        g: &[f32],
        init: &[f32],
        cin: usize,
        cout: usize,
        nb: usize,
        h: usize,
        w: usize,
    ) -> Vec<f64> {
        let hw = h * w;
        let mut out: Vec<f64> = init.iter().map(|&v| v as f64).collect();
        for co in 0..cout {
            for b in 0..nb {
                for y in 0..h {
                    for xx in 0..w {
                        let o = &mut out[(co * nb + b) * hw + y * w + xx];
                        for ci in 0..cin {
                            for dy in 0..3 {
                                for dx in 0..3 {
                                    let (iy, ix) = (y as isize + dy as isize - 1, xx as isize + dx as isize - 1);
                                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                        *o += g[((co * cin + ci) * 3 + dy) * 3 + dx] as f64
                                            * x[(ci * nb + b) * hw + iy as usize * w + ix as usize] as f64;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Winograd F(4×4, 3×3) through its three transforms equals the direct 3 × 3 convolution
    /// with zero padding 1 (in f64), on plane sizes that are and are not multiples of 4, for two
    /// images, with every tile row at once and in groups of one and three rows (groups that
    /// span both images); the scratch starts as NaN, so a value read before it is written shows.
    #[test]
    fn winograd_tiles_equal_the_direct_convolution() {
        for (h, w) in [(6, 8), (5, 7), (1, 1), (4, 3), (8, 8), (9, 13), (16, 4), (3, 32)] {
            let (cin, cout, nb) = (3, 2, 2);
            let x: Vec<f32> = (0..cin * nb * h * w).map(|i| val(1, i)).collect();
            let g: Vec<f32> = (0..cout * cin * 9).map(|i| val(2, i)).collect();
            let u = wino4_weights(&g, cout, cin);
            let (th, tw, hw) = (h.div_ceil(4), w.div_ceil(4), h * w);
            let rows = nb * th;
            for per in [rows, 1, 3] {
                let mut out = vec![0.5f32; cout * nb * hw];
                let mut tmp = vec![f32::NAN; wino4_scratch(per, w)];
                for r0 in (0..rows).step_by(per) {
                    let r1 = (r0 + per).min(rows);
                    let nt = (r1 - r0) * tw;
                    let mut v = vec![f32::NAN; 36 * cin * nt];
                    for ci in 0..cin {
                        let chan = &x[ci * nb * hw..(ci + 1) * nb * hw];
                        wino4_input(chan, h, w, r0..r1, &mut v[ci * nt..], cin * nt, &mut tmp);
                    }
                    let mut m = vec![0f32; 36 * cout * nt];
                    for xi in 0..36 {
                        for co in 0..cout {
                            for k in 0..nt {
                                m[(xi * cout + co) * nt + k] = (0..cin)
                                    .map(|ci| u[(xi * cout + co) * cin + ci] * v[(xi * cin + ci) * nt + k])
                                    .sum();
                            }
                        }
                    }
                    for co in 0..cout {
                        let chan = &mut out[co * nb * hw..(co + 1) * nb * hw];
                        wino4_output(&m[co * nt..], cout * nt, chan, h, w, r0..r1, &mut tmp);
                    }
                }
                let want_all = reference_conv3x3(&x, &g, &vec![0.5; cout * nb * hw], cin, cout, nb, h, w);
                for co in 0..cout {
                    for b in 0..nb {
                        for y in 0..h {
                            for xx in 0..w {
                                let want = want_all[(co * nb + b) * hw + y * w + xx];
                                let got = out[(co * nb + b) * hw + y * w + xx] as f64;
                                assert!(
                                    (got - want).abs() < 2e-5,
                                    "F(4x4, 3x3) {h}x{w} per {per}: out[{co}, {b}, {y}, {xx}] = {got}, want {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The direct 3 × 3 convolution equals the convolution with zero padding 1 (in f64), added
    /// onto what `out` held, on planes whose pixel counts are and are not whole vectors, output
    /// channel counts that use every block width (8, 4, 2, 1), and two images; every copy of the
    /// tiles (AVX-512, AVX2, plain loops) gives the same bits (the same fused multiply-adds in the
    /// same order); the scratch starts as NaN, so a guard read before it is written shows.
    #[test]
    fn direct_3x3_equals_the_convolution_on_every_tile_copy() {
        for (h, w, cin, cout) in [
            (28, 28, 3, 16),
            (14, 14, 5, 15),
            (7, 7, 2, 3),
            (1, 1, 1, 1),
            (3, 32, 4, 9),
            (5, 3, 1, 2),
            (2, 9, 2, 12),
        ] {
            let nb = 2;
            let hw = h * w;
            let x: Vec<f32> = (0..cin * nb * hw).map(|i| val(1, i)).collect();
            let g: Vec<f32> = (0..cout * cin * 9).map(|i| val(2, i)).collect();
            let init: Vec<f32> = (0..cout * nb * hw).map(|i| val(3, i)).collect();
            let d = Direct3x3::new(&g, cout, cin);
            let mut outs = Vec::new();
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                let mut out = init.clone();
                let mut pad = vec![f32::NAN; conv3x3_scratch(cin, h, w)];
                conv3x3_on(isa, &d, &x, nb, h, w, &mut out, &mut pad);
                outs.push((isa, out));
            }
            let want_all = reference_conv3x3(&x, &g, &init, cin, cout, nb, h, w);
            for co in 0..cout {
                for b in 0..nb {
                    for y in 0..h {
                        for xx in 0..w {
                            let o = (co * nb + b) * hw + y * w + xx;
                            let want = want_all[o];
                            let got = outs[0].1[o] as f64;
                            assert!(
                                (got - want).abs() < 2e-5,
                                "{h}x{w} cin {cin} cout {cout}: out[{co}, {b}, {y}, {xx}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
            for (isa, out) in &outs[1..] {
                assert!(
                    out.iter().zip(&outs[0].1).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{h}x{w} cin {cin} cout {cout}: {isa:?} differs from the plain loops"
                );
            }
        }
    }

    /// The adjoint packing is the input gradient (⟨conv(x), ∂y⟩ = ⟨x, adjoint(∂y)⟩, against the
    /// f64 reference convolution) and the columns copied from the padded planes are the shifted
    /// planes (bit for bit), on shapes with partial tiles and planes narrower than a vector.
    #[test]
    fn direct_3x3_adjoint_and_columns_equal_their_definitions() {
        for (h, w, cin, cout) in [
            (28, 28, 16, 16),
            (14, 14, 5, 11),
            (7, 7, 2, 3),
            (1, 1, 1, 1),
            (3, 32, 4, 9),
        ] {
            let hw = h * w;
            let x: Vec<f32> = (0..cin * hw).map(|i| val(1, i)).collect();
            let g: Vec<f32> = (0..cout * cin * 9).map(|i| val(2, i)).collect();
            let dy: Vec<f32> = (0..cout * hw).map(|i| val(3, i)).collect();
            let y = reference_conv3x3(&x, &g, &vec![0.0; cout * hw], cin, cout, 1, h, w);
            let lhs: f64 = y.iter().zip(&dy).map(|(&a, &b)| a * b as f64).sum();
            let adj = Direct3x3::adjoint(&g, cout, cin);
            let mut pad = vec![f32::NAN; conv3x3_scratch(cin.max(cout), h, w)];
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                let mut dx = vec![0f32; cin * hw];
                conv3x3_on(isa, &adj, &dy, 1, h, w, &mut dx, &mut pad);
                let rhs: f64 = dx.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = y.iter().map(|v| v.abs()).sum::<f64>() + 1.0;
                assert!(
                    (lhs - rhs).abs() <= 1e-5 * scale,
                    "{h}x{w} cin {cin} cout {cout} {isa:?}: <conv x, dy> = {lhs}, <x, adj dy> = {rhs}"
                );
            }
            let mut col = vec![f32::NAN; cin * 9 * hw];
            conv3x3_columns(&x, cin, h, w, &mut pad, &mut col);
            for ci in 0..cin {
                for tap in 0..9 {
                    let (ty, tx) = (tap / 3, tap % 3);
                    for yy in 0..h {
                        for xx in 0..w {
                            let (iy, ix) = (yy as isize + ty as isize - 1, xx as isize + tx as isize - 1);
                            let want = if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                x[ci * hw + iy as usize * w + ix as usize]
                            } else {
                                0.0
                            };
                            let got = col[(ci * 9 + tap) * hw + yy * w + xx];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{h}x{w} cin {cin}: col[{ci}, {tap}, {yy}, {xx}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
