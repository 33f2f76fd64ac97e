//! One attention head with a small head dimension, forward and backward, for the per-sample
//! gradient pass ([`super::attn_train_forward`], [`super::attn_train_backward`]), in AVX-512
//! registers. Safe code (bounds-checked slices, vectors moved through `bytemuck`), compiled for
//! AVX-512F; the public wrappers call it only after detecting the feature.
//!
//! Queries sit in the 16 lanes of a vector, keys and values are broadcast from position-major
//! copies, as in the inference kernel ([`super::attend_small`]); the probabilities are kept
//! query-blocked (`pb[(blk·l + j)·16 + lane] = P[16·blk + lane, j]`), which is the layout the
//! backward reads them in. The backward's reductions over keys (∂Q) run in lanes; its reductions
//! over queries (∂K, ∂V) run on 16 × 16 tiles of P and ∂S transposed in registers, so that keys sit
//! in lanes there.

use std::arch::x86_64::*;

use super::x86::exp16;
use super::TrainHead;

/// Lanes of one vector: query positions per block, keys per tile.
const QB: usize = 16;

#[target_feature(enable = "avx512f")]
#[inline]
fn ld(s: &[f32]) -> __m512 {
    let a: [f32; QB] = s[..QB].try_into().expect("a slice of 16 floats");
    bytemuck::cast(a)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn st(v: __m512, s: &mut [f32]) {
    let a: [f32; QB] = bytemuck::cast(v);
    s[..QB].copy_from_slice(&a);
}

/// Lanes `i0..i0 + n` of plane `d` (`x[d·l + i0..]`), zero beyond `n`.
#[target_feature(enable = "avx512f")]
#[inline]
fn plane_block(x: &[f32], d: usize, l: usize, i0: usize, n: usize) -> __m512 {
    let mut a = [0f32; QB];
    a[..n].copy_from_slice(&x[d * l + i0..d * l + i0 + n]);
    bytemuck::cast(a)
}

/// Position-major copy `t[j·HD + d] = x[d·stride + j]` (j < l) of `hd` planes, zero for d ≥ hd
/// (the keys and values a kernel broadcasts from; also the inference kernel's).
pub(super) fn position_major<const HD: usize>(x: &[f32], hd: usize, l: usize, stride: usize, t: &mut [f32]) {
    t[..l * HD].fill(0.0);
    for d in 0..hd {
        for (j, &xv) in x[d * stride..d * stride + l].iter().enumerate() {
            t[j * HD + d] = xv;
        }
    }
}

/// Σ_d x[d]·t[d] over HD vectors and HD broadcast scalars, in two chains (even and odd d: half
/// the dependent multiply-adds): a block of scores against one key, or of ∂P against one value.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn dot16<const HD: usize>(x: &[__m512; HD], t: &[f32]) -> __m512 {
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for (xd, td) in x.chunks_exact(2).zip(t.chunks_exact(2)) {
        a0 = _mm512_fmadd_ps(xd[0], _mm512_set1_ps(td[0]), a0);
        a1 = _mm512_fmadd_ps(xd[1], _mm512_set1_ps(td[1]), a1);
    }
    _mm512_add_ps(a0, a1)
}

/// The 16 × 16 transpose of `r` (row i of the result is column i of the input), in four rounds
/// of in-register shuffles: pairs of rows interleaved, then pairs of pairs, then 128-bit lanes
/// gathered twice.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &[__m512; QB]) -> [__m512; QB] {
    let t: [__m512; QB] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // u[4k + m], lane L: rows 4k..4k + 3 of column 4L + m.
    let u: [__m512; QB] = std::array::from_fn(|i| {
        let (k, m) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * k + m / 2]),
            _mm512_castps_pd(t[4 * k + 2 + m / 2]),
        );
        _mm512_castpd_ps(if m % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    let mut out = [_mm512_setzero_ps(); QB];
    for m in 0..4 {
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
        let v1 = _mm512_shuffle_f32x4::<0xDD>(u[m], u[4 + m]);
        let w0 = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
        let w1 = _mm512_shuffle_f32x4::<0xDD>(u[8 + m], u[12 + m]);
        out[m] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
        out[8 + m] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
        out[4 + m] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
        out[12 + m] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
    }
    out
}

/// Dispatch on the head dimension padded to 4, 8 or 16.
#[target_feature(enable = "avx512f")]
pub(super) fn forward(h: &TrainHead<'_>, scale: f32, o: &mut [f32], pb: &mut [f32], scratch: &mut Vec<f32>) {
    match h.hd {
        0 => {}
        1..=4 => forward_hd::<4>(h, scale, o, pb, scratch),
        5..=8 => forward_hd::<8>(h, scale, o, pb, scratch),
        _ => forward_hd::<16>(h, scale, o, pb, scratch),
    }
}

/// Per block of 16 queries: the scores against every key and their maxima, e^{s − max} in place,
/// their sum and the values weighted by them (two chains), the outputs, then the probabilities
/// (scaled by one over the sum; zero in lanes past the last query).
#[target_feature(enable = "avx512f")]
fn forward_hd<const HD: usize>(h: &TrainHead<'_>, scale: f32, o: &mut [f32], pb: &mut [f32], scratch: &mut Vec<f32>) {
    let (l, hd) = (h.l, h.hd);
    if l == 0 {
        return;
    }
    scratch.clear();
    scratch.resize(2 * l * HD, 0.0);
    let (kt, vt) = scratch.split_at_mut(l * HD);
    position_major::<HD>(h.k, hd, l, l, kt);
    position_major::<HD>(h.v, hd, l, l, vt);
    let vscale = _mm512_set1_ps(scale);
    for blk in 0..l.div_ceil(QB) {
        let i0 = blk * QB;
        let n = QB.min(l - i0);
        let q: [__m512; HD] = std::array::from_fn(|d| {
            if d < hd {
                plane_block(h.q, d, l, i0, n)
            } else {
                _mm512_setzero_ps()
            }
        });
        let s = &mut pb[blk * l * QB..(blk + 1) * l * QB];
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for (sj, kj) in s.chunks_exact_mut(QB).zip(kt.chunks_exact(HD)) {
            let acc = _mm512_mul_ps(dot16(&q, kj), vscale);
            mx = _mm512_max_ps(acc, mx);
            st(acc, sj);
        }
        for sj in s.chunks_exact_mut(QB) {
            let e = exp16(_mm512_sub_ps(ld(sj), mx));
            st(e, sj);
        }
        let (mut acc, mut acc1) = ([_mm512_setzero_ps(); HD], [_mm512_setzero_ps(); HD]);
        let (mut tot, mut tot1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for (p, v) in s.chunks_exact(2 * QB).zip(vt.chunks_exact(2 * HD)) {
            let (p0, p1) = (ld(p), ld(&p[QB..]));
            tot = _mm512_add_ps(tot, p0);
            tot1 = _mm512_add_ps(tot1, p1);
            for d in 0..HD {
                acc[d] = _mm512_fmadd_ps(p0, _mm512_set1_ps(v[d]), acc[d]);
                acc1[d] = _mm512_fmadd_ps(p1, _mm512_set1_ps(v[HD + d]), acc1[d]);
            }
        }
        if l % 2 == 1 {
            let (p, v) = (ld(&s[(l - 1) * QB..]), &vt[(l - 1) * HD..]);
            tot = _mm512_add_ps(tot, p);
            for (ad, &vv) in acc.iter_mut().zip(v) {
                *ad = _mm512_fmadd_ps(p, _mm512_set1_ps(vv), *ad);
            }
        }
        let mut live = [0f32; QB];
        live[..n].fill(1.0);
        let inv = _mm512_div_ps(bytemuck::cast(live), _mm512_add_ps(tot, tot1));
        for (d, (ad, ad1)) in acc.iter().zip(&acc1).enumerate().take(hd) {
            let y: [f32; QB] = bytemuck::cast(_mm512_mul_ps(_mm512_add_ps(*ad, *ad1), inv));
            o[d * l + i0..d * l + i0 + n].copy_from_slice(&y[..n]);
        }
        for sj in s.chunks_exact_mut(QB) {
            let p = _mm512_mul_ps(ld(sj), inv);
            st(p, sj);
        }
    }
}

/// Dispatch on the head dimension padded to 4, 8 or 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) fn backward(
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
    match h.hd {
        0 => {}
        1..=4 => backward_hd::<4>(h, o, dout, scale, pb, [dq, dk, dv], scratch),
        5..=8 => backward_hd::<8>(h, o, dout, scale, pb, [dq, dk, dv], scratch),
        _ => backward_hd::<16>(h, o, dout, scale, pb, [dq, dk, dv], scratch),
    }
}

/// Per block of 16 queries (lanes), r = Σ_d ∂O ⊙ O (= Σ_j P ∂P, the softmax gradient's row sum),
/// then per tile of 16 keys: ∂P = ∂Oᵀ V and ∂S = P ⊙ (∂P − r) key by key, ∂Q += ∂S Kᵀ in lanes;
/// the tile's P and ∂S transposed, and ∂V += ∂O P, ∂K += Q ∂S query by query with the tile's
/// keys in lanes (accumulated over blocks in padded planes, added to `dk`, `dv` at the end).
/// The scale of S = scale · Qᵀ K multiplies ∂Q and ∂K once, at the end.
#[target_feature(enable = "avx512f")]
fn backward_hd<const HD: usize>(
    h: &TrainHead<'_>,
    o: &[f32],
    dout: &[f32],
    scale: f32,
    pb: &[f32],
    [dq, dk, dv]: [&mut [f32]; 3],
    scratch: &mut Vec<f32>,
) {
    let (l, hd) = (h.l, h.hd);
    if l == 0 {
        return;
    }
    let tiles = l.div_ceil(QB);
    let lp = tiles * QB;
    scratch.clear();
    scratch.resize(4 * l * HD + 2 * HD * lp, 0.0);
    let (kt, rest) = scratch.split_at_mut(l * HD);
    let (vt, rest) = rest.split_at_mut(l * HD);
    let (qt, rest) = rest.split_at_mut(l * HD);
    let (dot, rest) = rest.split_at_mut(l * HD);
    let (dvp, dkp) = rest.split_at_mut(HD * lp);
    position_major::<HD>(h.k, hd, l, l, kt);
    position_major::<HD>(h.v, hd, l, l, vt);
    position_major::<HD>(h.q, hd, l, l, qt);
    position_major::<HD>(dout, hd, l, l, dot);
    let vscale = _mm512_set1_ps(scale);
    for blk in 0..tiles {
        let i0 = blk * QB;
        let n = QB.min(l - i0);
        let mut dov = [_mm512_setzero_ps(); HD];
        let mut r = _mm512_setzero_ps();
        for (d, g) in dov.iter_mut().enumerate().take(hd) {
            *g = plane_block(dout, d, l, i0, n);
            r = _mm512_fmadd_ps(*g, plane_block(o, d, l, i0, n), r);
        }
        let mut dqa = [_mm512_setzero_ps(); HD];
        let pblk = &pb[blk * l * QB..(blk + 1) * l * QB];
        for jt in 0..tiles {
            let j0 = jt * QB;
            let m = QB.min(l - j0);
            let mut pt = [_mm512_setzero_ps(); QB];
            let mut st_ = [_mm512_setzero_ps(); QB];
            for jj in 0..m {
                let j = j0 + jj;
                let p = ld(&pblk[j * QB..]);
                let dp = dot16(&dov, &vt[j * HD..(j + 1) * HD]);
                let ds = _mm512_mul_ps(p, _mm512_sub_ps(dp, r));
                for (a, &kv) in dqa.iter_mut().zip(&kt[j * HD..(j + 1) * HD]) {
                    *a = _mm512_fmadd_ps(ds, _mm512_set1_ps(kv), *a);
                }
                pt[jj] = p;
                st_[jj] = ds;
            }
            let (ptt, stt) = (transpose16(&pt), transpose16(&st_));
            let mut va: [__m512; HD] = std::array::from_fn(|d| ld(&dvp[d * lp + j0..]));
            let mut ka: [__m512; HD] = std::array::from_fn(|d| ld(&dkp[d * lp + j0..]));
            for ii in 0..n {
                let i = i0 + ii;
                let (gi, qi) = (&dot[i * HD..(i + 1) * HD], &qt[i * HD..(i + 1) * HD]);
                for d in 0..HD {
                    va[d] = _mm512_fmadd_ps(_mm512_set1_ps(gi[d]), ptt[ii], va[d]);
                    ka[d] = _mm512_fmadd_ps(_mm512_set1_ps(qi[d]), stt[ii], ka[d]);
                }
            }
            for d in 0..HD {
                st(va[d], &mut dvp[d * lp + j0..]);
                st(ka[d], &mut dkp[d * lp + j0..]);
            }
        }
        for (d, a) in dqa.iter().enumerate().take(hd) {
            let y: [f32; QB] = bytemuck::cast(_mm512_mul_ps(*a, vscale));
            for (t, &yv) in dq[d * l + i0..d * l + i0 + n].iter_mut().zip(&y) {
                *t += yv;
            }
        }
    }
    for d in 0..hd {
        for (j, (v, k)) in dv[d * l..(d + 1) * l]
            .iter_mut()
            .zip(&mut dk[d * l..(d + 1) * l])
            .enumerate()
        {
            *v += dvp[d * lp + j];
            *k += scale * dkp[d * lp + j];
        }
    }
}
