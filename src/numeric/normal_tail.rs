//! The upper standard normal tail Φ̄(z) for z ≥ 0, fast and with a stated relative error, for the
//! PLD discretisation (two tail values per grid point, tens of millions per heterogeneous
//! composition).
//!
//! Φ̄(z) = e^{−z²/2} · G(z) with G(z) = e^{z²/2} Φ̄(z) = R(z)/√(2π) (R the Mills ratio;
//! Abramowitz & Stegun 26.2.12 for its asymptotics). G is entire and slowly varying, so a
//! degree-9 polynomial per short interval (table generated with 50-digit mpmath by
//! `scripts/gen_normal_tail.py`, constant term as two doubles) carries it to ≈ 1e-18.
//! z² is split exactly into p + e (Dekker's product), so e^{−z²/2} = e^{−p/2}·(1 − e/2) with one
//! call to the platform `exp` and no loss from rounding z² (which costs z²·u relative otherwise).
//!
//! Error (relative, z exact): `exp` ≤ 1 ulp (≤ 2u; glibc's is documented < 1 ulp), G's table ≪ u,
//! the polynomial's evaluation ≤ 3u (coefficients fall by ≥ 10× per degree, so every rounding
//! but the last addition is damped by 10^{−k}),
//! two products and 1 − e/2 ≤ 3u: ≤ 9u in all, **measured ≤ [`MEASURED_ULPS`]** against 50-digit
//! mpmath (test `normal_tail_matches_mpmath`). Beyond z = [`Z_MAX`] the tail is below 1e-299 and
//! only an upper bound is returned ([`upper_tail`] says which).

#[path = "normal_tail_table.rs"]
mod table;

/// Largest z with a relative-accuracy value; above it Φ̄(z) < 5.7e-300.
pub const Z_MAX: f64 = 37.0;
/// A bound on Φ̄(z) for z ≥ [`Z_MAX`] (Φ̄(37) ≈ 5.67e-300).
pub const BEYOND_Z_MAX: f64 = 1e-299;
/// Largest relative error measured against mpmath, in units of u = 2⁻⁵³ (see the module doc).
pub const MEASURED_ULPS: f64 = 3.5;

/// Interval of the table holding z ∈ [0, 37): its index, centre and 1/half-width.
#[inline]
fn interval(z: f64) -> (usize, f64, f64) {
    if z < 2.0 {
        let k = (z * 8.0) as usize;
        (k, (k as f64 + 0.5) / 8.0, 16.0)
    } else if z < 8.0 {
        let k = ((z - 2.0) * 4.0) as usize;
        (16 + k, 2.0 + (k as f64 + 0.5) / 4.0, 8.0)
    } else {
        let k = ((z - 8.0) * 2.0) as usize;
        (40 + k, 8.0 + (k as f64 + 0.5) / 2.0, 4.0)
    }
}

/// Φ̄(z) = P(N(0,1) > z) for 0 ≤ z < [`Z_MAX`] with relative error ≤ 9u (module doc); for
/// z ≥ [`Z_MAX`] (or +∞) it returns [`BEYOND_Z_MAX`], an upper bound only, and for NaN NaN.
#[inline]
pub fn upper_tail(z: f64) -> f64 {
    let (a, f) = upper_tail_parts(z);
    a.exp() * f
}

/// [`upper_tail`] at every z of `zs` (each ≥ 0, +∞ or NaN) into `out`, value for value the same
/// (the same operations on the same numbers), in two passes: the polynomial and the split of z²
/// of every point (into `args`), then the exponentials. A call to `exp` inside the first loop
/// kept only a few points' arithmetic in flight at once.
pub fn upper_tails(zs: &[f64], args: &mut Vec<f64>, out: &mut Vec<f64>) {
    args.clear();
    out.clear();
    args.resize(zs.len(), 0.0);
    out.resize(zs.len(), 0.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `parts_all_avx2` only enables AVX2 (no FMA: the same roundings), and the
            // CPU was just detected to have it.
            #[allow(unsafe_code)]
            unsafe {
                parts_all_avx2(zs, args, out)
            };
        } else {
            parts_all(zs, args, out);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    parts_all(zs, args, out);
    for (o, &a) in out.iter_mut().zip(args.iter()) {
        *o *= a.exp();
    }
}

/// [`upper_tail_parts`] of every z.
fn parts_all(zs: &[f64], args: &mut [f64], out: &mut [f64]) {
    for ((&z, a), o) in zs.iter().zip(args.iter_mut()).zip(out.iter_mut()) {
        (*a, *o) = upper_tail_parts(z);
    }
}

/// [`upper_tail_parts`] of every z, four at a time in 256-bit vectors ([`upper_tail_parts4`]),
/// the rest one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn parts_all_avx2(zs: &[f64], args: &mut [f64], out: &mut [f64]) {
    let mut zc = zs.chunks_exact(4);
    let mut ac = args.chunks_exact_mut(4);
    let mut oc = out.chunks_exact_mut(4);
    for ((z, a), o) in (&mut zc).zip(&mut ac).zip(&mut oc) {
        let (pa, pf) = upper_tail_parts4([z[0], z[1], z[2], z[3]]);
        a.copy_from_slice(&pa);
        o.copy_from_slice(&pf);
    }
    parts_all(zc.remainder(), ac.into_remainder(), oc.into_remainder());
}

/// [`upper_tail_parts`] of four values in 256-bit vectors: lane by lane the same IEEE operations
/// in the same order (multiplications and additions, no fused multiply-add), so the same results
/// bit for bit; NaN and z ≥ [`Z_MAX`] are computed at z = 0 and their results replaced as there.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn upper_tail_parts4(z: [f64; 4]) -> ([f64; 4], [f64; 4]) {
    use std::arch::x86_64::{
        __m256d, _mm256_add_pd, _mm256_mul_pd, _mm256_set1_pd, _mm256_set_pd, _mm256_storeu_pd, _mm256_sub_pd,
    };
    let zz: [f64; 4] = std::array::from_fn(|l| if z[l] < Z_MAX { z[l] } else { 0.0 });
    let mut c = [0.0f64; 4];
    let mut inv_hw = [0.0f64; 4];
    let mut co = [&table::COEF[0]; 4];
    for l in 0..4 {
        let (k, cl, il) = interval(zz[l]);
        c[l] = cl;
        inv_hw[l] = il;
        co[l] = &table::COEF[k.min(table::COEF.len() - 1)];
    }
    let v = |x: [f64; 4]| _mm256_set_pd(x[3], x[2], x[1], x[0]);
    let cf = |i: usize| _mm256_set_pd(co[3][i], co[2][i], co[1][i], co[0][i]);
    let (add, sub, mul) = (
        |a, b| _mm256_add_pd(a, b),
        |a, b| _mm256_sub_pd(a, b),
        |a, b| _mm256_mul_pd(a, b),
    );
    let zv = v(zz);
    let s = mul(sub(zv, v(c)), v(inv_hw));
    let s2 = mul(s, s);
    let s4 = mul(s2, s2);
    let p23 = add(cf(2), mul(cf(3), s));
    let p45 = add(cf(4), mul(cf(5), s));
    let p67 = add(cf(6), mul(cf(7), s));
    let p89 = add(cf(8), mul(cf(9), s));
    let hi = add(add(p45, mul(s2, p67)), mul(s4, p89));
    let rest = add(mul(cf(1), s), mul(s2, add(p23, mul(s2, hi))));
    let g = add(cf(0), add(rest, cf(10)));
    let p = mul(zv, zv);
    let split = mul(_mm256_set1_pd(134_217_729.0), zv);
    let hi = sub(split, sub(split, zv));
    let lo = sub(zv, hi);
    let e = add(
        add(sub(mul(hi, hi), p), mul(mul(_mm256_set1_pd(2.0), hi), lo)),
        mul(lo, lo),
    );
    let av = mul(_mm256_set1_pd(-0.5), p);
    let fv = sub(g, mul(g, mul(_mm256_set1_pd(0.5), e)));
    let store = |x: __m256d| {
        let mut o = [0.0f64; 4];
        // SAFETY: `o` holds four f64 (unaligned store).
        #[allow(unsafe_code)]
        unsafe {
            _mm256_storeu_pd(o.as_mut_ptr(), x)
        };
        o
    };
    let (mut a, mut f) = (store(av), store(fv));
    for l in 0..4 {
        if z[l].is_nan() {
            (a[l], f[l]) = (0.0, f64::NAN);
        } else if z[l] >= Z_MAX {
            (a[l], f[l]) = (0.0, BEYOND_Z_MAX);
        }
    }
    (a, f)
}

/// (a, f) with [`upper_tail`](z) = e^a · f: for 0 ≤ z < [`Z_MAX`] a = −p/2 and f = G(z)(1 − e/2)
/// with z² = p + e exactly (module doc); beyond, (0, [`BEYOND_Z_MAX`]) (e^0 = 1 exactly); for
/// NaN, (0, NaN).
#[inline]
fn upper_tail_parts(z: f64) -> (f64, f64) {
    debug_assert!(z >= 0.0 || z.is_nan(), "upper_tail needs z ≥ 0, got {z}");
    if z.is_nan() {
        return (0.0, f64::NAN);
    }
    if z >= Z_MAX {
        return (0.0, BEYOND_Z_MAX);
    }
    let (k, c, inv_hw) = interval(z);
    let k = k.min(table::COEF.len() - 1);
    // s is exact (Sterbenz; the scale is a power of two) except on the first interval.
    let s = (z - c) * inv_hw;
    let co = &table::COEF[k];
    // Estrin's scheme (short dependency chains): c1 s + … + c9 s⁹ as pairs (c_k + c_{k+1} s)
    // combined with s², s⁴, s⁸; |s| ≤ 1 and the coefficients fall fast, so the sum of the
    // pairs' roundings stays far below u·c0.
    let s2 = s * s;
    let s4 = s2 * s2;
    let p23 = co[2] + co[3] * s;
    let p45 = co[4] + co[5] * s;
    let p67 = co[6] + co[7] * s;
    let p89 = co[8] + co[9] * s;
    let hi = p45 + s2 * p67 + s4 * p89;
    let rest = co[1] * s + s2 * (p23 + s2 * hi);
    // Constant term as value + residual (co[10]): the table's own rounding stays ≪ u.
    let g = co[0] + (rest + co[10]);
    // Dekker: z² = p + e exactly (no overflow for z < 37).
    let p = z * z;
    let split = 134_217_729.0 * z;
    let hi = split - (split - z);
    let lo = z - hi;
    let e = ((hi * hi - p) + 2.0 * hi * lo) + lo * lo;
    (-0.5 * p, g - g * (0.5 * e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative error of `upper_tail` against 50-digit mpmath values (hi + lo doubles) on 3,098
    /// points of [0, 37) (fixtures/reference/normal_tail_mpmath.csv), in units of u.
    fn worst_ulps(csv: &str) -> (f64, f64) {
        let u = f64::EPSILON / 2.0;
        let mut worst = (0.0f64, 0.0f64);
        for line in csv.lines().skip(1) {
            let f: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
            let (z, hi, lo) = (f[0], f[1], f[2]);
            let r = ((upper_tail(z) - hi) - lo) / hi / u;
            if r.abs() > worst.1 {
                worst = (z, r.abs());
            }
        }
        worst
    }

    /// The two-pass batch gives every value bit for bit as one call does (special values too).
    #[test]
    fn batched_tails_equal_single_calls() {
        let mut zs: Vec<f64> = (0..20_000).map(|i| i as f64 * 0.00191).collect();
        zs.extend([0.0, 1.999999999, 2.0, 8.0, 36.999, Z_MAX, 40.0, f64::INFINITY, f64::NAN]);
        let (mut a, mut out) = (Vec::new(), Vec::new());
        upper_tails(&zs, &mut a, &mut out);
        assert_eq!(out.len(), zs.len());
        for (&z, &v) in zs.iter().zip(&out) {
            let one = upper_tail(z);
            assert!(
                v.to_bits() == one.to_bits() || (v.is_nan() && one.is_nan()),
                "z = {z}: {v} vs {one}"
            );
        }
    }

    #[test]
    fn normal_tail_matches_mpmath() {
        let csv = include_str!("../../fixtures/reference/normal_tail_mpmath.csv");
        let (z, ulps) = worst_ulps(csv);
        assert!(csv.lines().count() > 3000);
        assert!(ulps <= MEASURED_ULPS, "relative error {ulps}u at z = {z}");
    }

    /// The same on a large file from `scripts/gen_normal_tail.py reference N SEED` (run by hand:
    /// `NORMAL_TAIL_REF=/tmp/nt.csv cargo test --release normal_tail_large -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn normal_tail_large() {
        let path = std::env::var("NORMAL_TAIL_REF").expect("NORMAL_TAIL_REF");
        let csv = std::fs::read_to_string(path).unwrap();
        let (z, ulps) = worst_ulps(&csv);
        println!("{} points: worst {ulps:.3}u at z = {z}", csv.lines().count() - 1);
        assert!(ulps <= MEASURED_ULPS);
    }

    #[test]
    fn beyond_the_table_is_an_upper_bound() {
        assert_eq!(upper_tail(37.0), BEYOND_Z_MAX);
        assert_eq!(upper_tail(f64::INFINITY), BEYOND_Z_MAX);
        // Φ̄(37) ≈ 5.67e-300 (mpmath), below the bound.
        assert!(upper_tail(36.999) < BEYOND_Z_MAX);
        assert_eq!(upper_tail(0.0), 0.5);
    }
}
