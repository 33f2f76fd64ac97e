//! Double-word ("double-double") arithmetic and a radix-2 FFT on it, for the PLD accountant's
//! precise mode (tiny δ, where the double-precision FFT's certified round-off is the floor).
//!
//! A value is hi + lo with |lo| ≤ ulp(hi)/2. The algorithms and their relative error bounds are
//! those of Joldes, Muller & Popescu 2017, "Tight and rigorous error bounds for basic building
//! blocks of double-word arithmetic", ACM TOMS 44(2): `add` is their Algorithm 6
//! (AccurateDWPlusDW, ≤ 3u²/(1 − 4u)), `mul` their Algorithm 12 (DWTimesDW3 with FMA, ≤ 4u²),
//! with u = 2⁻⁵³. The constants below round those bounds up.

use std::ops::{Add, Mul, Neg, Sub};

/// u² with u = 2⁻⁵³.
pub(crate) const U2: f64 = (f64::EPSILON / 2.0) * (f64::EPSILON / 2.0);
/// Relative error bound of one double-word addition or subtraction (JMP 2017, Thm 3.1: 3u²/(1−4u)).
pub const ADD_ERR: f64 = 4.0 * U2;
/// Relative error bound of one double-word multiplication (JMP 2017, Thm 5.3: 4u² for DWTimesDW3).
pub const MUL_ERR: f64 = 5.0 * U2;
/// Relative (modulus) error bound of one complex multiplication on double words: each part is
/// a sum of two products, |Δ| ≤ (MUL_ERR + ADD_ERR)(|ac| + |bd|) per part, and
/// (|ac| + |bd|)² + (|ad| + |bc|)² ≤ 2|z₁|²|z₂|², so ≤ √2·(MUL_ERR + ADD_ERR)(1 + 1e-6) < 16u².
pub const CMUL_ERR: f64 = 16.0 * U2;
/// Relative error bound of one twiddle factor from [`twiddles`] (Taylor series of sin and cos in
/// double words on |θ| ≤ π/4: 14 Horner steps of a multiplication, a division by a small integer
/// (≈ 3u²) and a subtraction each, errors of inner steps damped by θ² < 1; plus the rounding of θ
/// and the final multiplication by θ): ≤ 14·12u² + 15u² ≈ 183u²; 256u² leaves a margin.
pub const TWIDDLE_ERR: f64 = 256.0 * U2;
/// Componentwise error of one radix-2 level, relative to the sum of the moduli feeding each
/// output: a twiddle (TWIDDLE_ERR), a complex multiplication (CMUL_ERR) and a complex addition
/// (√2·ADD_ERR), rounded up. After L levels |ΔX_k| ≤ L·LEVEL_ERR·(1 + LEVEL_ERR)^L·‖x‖₁ (each
/// level's errors enter X_k through unit-modulus weights, over input cones that partition x).
pub const LEVEL_ERR: f64 = 512.0 * U2;

/// Defines a function whose body is compiled twice: as written, and with the target feature
/// `$feature` enabled (x86-64), the copy run where the CPU has it (detected once, cached by `std`).
/// Same operations, same roundings, so bit for bit the same results and the same error bounds:
/// - `"fma"` for the double-word algorithms, which call `f64::mul_add`, a correctly rounded fused
///   multiply-add either way: without the target feature it is a call into the runtime's `fma`
///   routine (≈ 70 % of a 10⁷-step PLD's CPU time went to those calls and the FFT around them),
///   with it one instruction;
/// - `"avx2"` (no FMA) for the PLD's per-point passes, which then use 256-bit vectors.
macro_rules! feature_dispatch {
    ($feature:tt; $(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block) => {
        $(#[$doc])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = $feature)]
                fn fast($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!($feature) {
                    // SAFETY: `fast` only enables the target feature just detected on this CPU;
                    // the code is otherwise safe Rust.
                    #[allow(unsafe_code)]
                    return unsafe { fast($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use feature_dispatch;

/// h + l with |l| ≤ ulp(h)/2.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Dd {
    /// Leading part.
    pub hi: f64,
    /// Trailing part.
    pub lo: f64,
}

#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

#[inline(always)]
fn fast_two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    (s, b - (s - a))
}

#[inline(always)]
fn two_prod(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    (p, a.mul_add(b, -p))
}

impl Dd {
    /// The double-word value of a double (exact).
    pub const fn from_f64(x: f64) -> Dd {
        Dd { hi: x, lo: 0.0 }
    }
    /// 0.
    pub(crate) const ZERO: Dd = Dd { hi: 0.0, lo: 0.0 };
    /// 1.
    pub const ONE: Dd = Dd { hi: 1.0, lo: 0.0 };
    /// Nearest double (relative error ≤ u).
    pub(crate) fn to_f64(self) -> f64 {
        self.hi + self.lo
    }
    /// Multiplication by a power of two (exact barring under/overflow).
    pub fn scale(self, p2: f64) -> Dd {
        Dd {
            hi: self.hi * p2,
            lo: self.lo * p2,
        }
    }
}

impl Add for Dd {
    type Output = Dd;
    #[inline(always)]
    fn add(self, y: Dd) -> Dd {
        let (sh, sl) = two_sum(self.hi, y.hi);
        let (th, tl) = two_sum(self.lo, y.lo);
        let c = sl + th;
        let (vh, vl) = fast_two_sum(sh, c);
        let w = tl + vl;
        let (hi, lo) = fast_two_sum(vh, w);
        Dd { hi, lo }
    }
}

impl Neg for Dd {
    type Output = Dd;
    #[inline(always)]
    fn neg(self) -> Dd {
        Dd {
            hi: -self.hi,
            lo: -self.lo,
        }
    }
}

impl Sub for Dd {
    type Output = Dd;
    #[inline(always)]
    fn sub(self, y: Dd) -> Dd {
        self + (-y)
    }
}

impl Mul for Dd {
    type Output = Dd;
    #[inline(always)]
    fn mul(self, y: Dd) -> Dd {
        let (ch, cl1) = two_prod(self.hi, y.hi);
        let tl0 = self.lo * y.lo;
        let tl1 = self.hi.mul_add(y.lo, tl0);
        let cl2 = self.lo.mul_add(y.hi, tl1);
        let cl3 = cl1 + cl2;
        let (hi, lo) = fast_two_sum(ch, cl3);
        Dd { hi, lo }
    }
}

/// A complex number on double words.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cdd {
    /// Real part.
    pub re: Dd,
    /// Imaginary part.
    pub im: Dd,
}

impl Cdd {
    /// 0.
    pub(crate) const ZERO: Cdd = Cdd {
        re: Dd::ZERO,
        im: Dd::ZERO,
    };
    /// 1.
    pub const ONE: Cdd = Cdd {
        re: Dd::ONE,
        im: Dd::ZERO,
    };
    /// Complex conjugate (exact).
    pub(crate) fn conj(self) -> Cdd {
        Cdd {
            re: self.re,
            im: -self.im,
        }
    }
    /// An upper bound on |z| in double precision (for error bookkeeping).
    pub(crate) fn norm_upper(self) -> f64 {
        let (a, b) = (self.re.hi.abs() + self.re.lo.abs(), self.im.hi.abs() + self.im.lo.abs());
        a.hypot(b) * (1.0 + 4.0 * f64::EPSILON)
    }
    /// |z| rounded to the nearest double-ish (relative error ≤ 4u), for bounds that only need a
    /// lower estimate corrected by an explicit margin.
    pub(crate) fn norm_f64(self) -> f64 {
        self.re.to_f64().hypot(self.im.to_f64())
    }
    /// z^e by repeated squaring (e ≥ 1): relative error ≤ (1 + CMUL_ERR)^{e−1} − 1 (by induction,
    /// as for doubles).
    pub(crate) fn powu(self, e: u64) -> Cdd {
        powu(self, e)
    }
}

impl Add for Cdd {
    type Output = Cdd;
    #[inline(always)]
    fn add(self, y: Cdd) -> Cdd {
        Cdd {
            re: self.re + y.re,
            im: self.im + y.im,
        }
    }
}

impl Sub for Cdd {
    type Output = Cdd;
    #[inline(always)]
    fn sub(self, y: Cdd) -> Cdd {
        Cdd {
            re: self.re - y.re,
            im: self.im - y.im,
        }
    }
}

impl Mul for Cdd {
    type Output = Cdd;
    #[inline(always)]
    fn mul(self, y: Cdd) -> Cdd {
        Cdd {
            re: self.re * y.re - self.im * y.im,
            im: self.re * y.im + self.im * y.re,
        }
    }
}

feature_dispatch! { "fma";
    /// z^e by repeated squaring ([`Cdd::powu`]).
    fn powu(z: Cdd, e: u64) -> Cdd {
        super::pow_by_squaring(z, e, Cdd::ONE)
    }
}

feature_dispatch! { "fma";
    /// `out[j]` = Σ_i p_i z_j^i by Horner's rule on double words, from the highest index:
    /// s ← s·z_j + p_i (one complex multiplication and one double-word addition per point; the
    /// loaded p_i are exact). Eight points z_j at a time, interleaved: each one's recurrence is a
    /// chain of dependent roundings (latency-bound); the eight chains run as two 4-wide vector
    /// chains (with FMA, 256-bit registers), which fill the pipeline (measured: 10⁷ steps, 0.023
    /// → 0.019 s CPU for the whole process against four scalar chains; sixteen lanes gain
    /// nothing more). Every z_j sees the same operations in the same order as alone.
    pub fn horner_many(p: &[f64], z: &[Cdd], out: &mut [Cdd]) {
        assert_eq!(z.len(), out.len());
        for (zc, oc) in z.chunks(8).zip(out.chunks_mut(8)) {
            let mut zz = [Cdd::ONE; 8];
            zz[..zc.len()].copy_from_slice(zc);
            // The chains' words lane by lane (one array per word), so that each operation below
            // runs as 4-wide vector instructions: the same operations, in the same order, on
            // every chain as `acc * z + x` on `Cdd`, hence the same roundings bit for bit.
            let (zrh, zrl) = (zz.map(|c| c.re.hi), zz.map(|c| c.re.lo));
            let (zih, zil) = (zz.map(|c| c.im.hi), zz.map(|c| c.im.lo));
            let (mut rh, mut rl, mut ih, mut il) = ([0.0f64; 8], [0.0f64; 8], [0.0f64; 8], [0.0f64; 8]);
            for &x in p.iter().rev() {
                let (mut nrh, mut nrl, mut nih, mut nil) = ([0.0f64; 8], [0.0f64; 8], [0.0f64; 8], [0.0f64; 8]);
                for j in 0..8 {
                    let a = Cdd {
                        re: Dd { hi: rh[j], lo: rl[j] },
                        im: Dd { hi: ih[j], lo: il[j] },
                    };
                    let w = Cdd {
                        re: Dd { hi: zrh[j], lo: zrl[j] },
                        im: Dd { hi: zih[j], lo: zil[j] },
                    };
                    let mut v = a * w;
                    v.re = v.re + Dd::from_f64(x);
                    (nrh[j], nrl[j], nih[j], nil[j]) = (v.re.hi, v.re.lo, v.im.hi, v.im.lo);
                }
                (rh, rl, ih, il) = (nrh, nrl, nih, nil);
            }
            for (j, o) in oc.iter_mut().enumerate() {
                *o = Cdd {
                    re: Dd { hi: rh[j], lo: rl[j] },
                    im: Dd { hi: ih[j], lo: il[j] },
                };
            }
        }
    }
}

/// 2π as a double word.
const TWO_PI: Dd = Dd {
    hi: std::f64::consts::TAU,
    lo: 2.449_293_598_294_706_4e-16,
};

/// (cos θ, sin θ) for |θ| ≤ π/4 by their Taylor series (terms below 2⁻¹¹⁰ relative dropped).
#[inline(always)]
fn cos_sin(theta: Dd) -> (Dd, Dd) {
    let t2 = theta * theta;
    // Horner from the highest term: 1/(2k)! and 1/(2k+1)! for k ≤ 13 (π/4)^28/28! < 1e-37.
    let mut c = Dd::ZERO;
    let mut s = Dd::ZERO;
    for k in (0..14).rev() {
        // c ← 1 − t²·c/((2k+1)(2k+2)); s ← 1 − t²·s/((2k+2)(2k+3)).
        let kc = ((2 * k + 1) * (2 * k + 2)) as f64;
        let ks = ((2 * k + 2) * (2 * k + 3)) as f64;
        c = Dd::ONE - div_small(t2 * c, kc);
        s = Dd::ONE - div_small(t2 * s, ks);
    }
    // c = Σ (−t²)^k/(2k)!, s·θ = Σ (−1)^k θ^{2k+1}/(2k+1)!
    (c, s * theta)
}

/// x / d for a small positive integer d (≤ 2⁵³), to double-word accuracy.
#[inline(always)]
fn div_small(x: Dd, d: f64) -> Dd {
    let q1 = x.hi / d;
    // r = x − q1·d exactly enough: q1·d by two_prod.
    let (p, pe) = two_prod(q1, d);
    let r = (x.hi - p) - pe + x.lo;
    let q2 = r / d;
    let (hi, lo) = fast_two_sum(q1, q2);
    Dd { hi, lo }
}

/// The N-th roots of unity w_j = e^{−2πij/N} (forward sign), j < N, N a power of two ≥ 8,
/// computed on the first octant and mapped by exact symmetries.
pub fn twiddles(n: usize) -> Vec<Cdd> {
    twiddles_fma(n)
}

feature_dispatch! { "fma";
    /// [`twiddles`].
    fn twiddles_fma(n: usize) -> Vec<Cdd> {
        assert!(n.is_power_of_two() && n >= 8);
        let eighth = n / 8;
        // θ_j = 2πj/N for j ≤ N/8 (N a power of two: the division is exact scaling). Plain loops,
        // not closures, so that the series is compiled into the FMA copy.
        let mut oct: Vec<(Dd, Dd)> = Vec::with_capacity(eighth + 1);
        for j in 0..=eighth {
            oct.push(cos_sin((TWO_PI * Dd::from_f64(j as f64)).scale(1.0 / n as f64)));
        }
        let quarter = n / 4;
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            let (q, r) = (j / quarter, j % quarter);
            // (cos, sin) of 2πr/N for r ≤ N/4 from the octant: cos(π/2 − θ) = sin θ.
            let (c, s) = if r <= eighth {
                oct[r]
            } else {
                let (c, s) = oct[quarter - r];
                (s, c)
            };
            // angle = q·π/2 + θ_r; e^{−i·angle}.
            let (cos, sin) = match q {
                0 => (c, s),
                1 => (-s, c),
                2 => (-c, -s),
                _ => (s, -c),
            };
            out.push(Cdd { re: cos, im: -sin });
        }
        out
    }
}

/// Relative error bound of one twiddle from [`twiddle`]: [`TWIDDLE_ERR`] for the series and
/// θ = 2πr/(8N), plus the division by 8N (≈ 3u²); doubled for margin.
pub const TWIDDLE_ANY_ERR: f64 = 2.0 * TWIDDLE_ERR;

feature_dispatch! { "fma";
    /// One N-th root of unity e^{−2πij/N} on double words, for any N ≤ 2⁵⁰ (not only powers of
    /// two): j is reduced exactly to an octant, θ = 2πr/(8N) ∈ [0, π/4] is formed on double words and
    /// [`cos_sin`] gives the rest by exact symmetries. Relative error ≤ [`TWIDDLE_ANY_ERR`].
    pub fn twiddle(j: u64, n: u64) -> Cdd {
        assert!(n > 0 && n <= 1 << 50);
        let j = j % n;
        // 8j = oct·N + r8 with 0 ≤ r8 < N: angle = oct·π/4 + 2π·r8/(8N).
        let oct = (8 * j as u128 / n as u128) as u64;
        let r8 = 8 * j - oct * n;
        let theta = |r: u64| div_small(TWO_PI * Dd::from_f64(r as f64), (8 * n) as f64);
        // angle = q·π/2 ± θ with θ ∈ [0, π/4].
        let (q, c, s) = if oct.is_multiple_of(2) {
            let (c, s) = cos_sin(theta(r8));
            (oct / 2, c, s)
        } else {
            let (c, s) = cos_sin(theta(n - r8));
            (oct.div_ceil(2), c, -s)
        };
        let (cos, sin) = match q % 4 {
            0 => (c, s),
            1 => (-s, c),
            2 => (-c, -s),
            _ => (s, -c),
        };
        Cdd { re: cos, im: -sin }
    }
}

feature_dispatch! { "fma";
    /// In-place radix-2 FFT on double words: X_k = Σ_j x_j w^{jk} with w = e^{∓2πi/N} (`inverse`:
    /// the + sign, unnormalised). `tw` from [`twiddles`] for this N.
    pub fn fft(x: &mut [Cdd], tw: &[Cdd], inverse: bool) {
        let n = x.len();
        assert!(n.is_power_of_two() && tw.len() == n);
        let bits = n.trailing_zeros();
        for i in 0..n {
            let j = i.reverse_bits() >> (usize::BITS - bits);
            if j > i {
                x.swap(i, j);
            }
        }
        let mut m = 2;
        while m <= n {
            let half = m / 2;
            let step = n / m;
            for start in (0..n).step_by(m) {
                for k in 0..half {
                    let w = if inverse { tw[k * step].conj() } else { tw[k * step] };
                    let t = w * x[start + k + half];
                    let u = x[start + k];
                    x[start + k] = u + t;
                    x[start + k + half] = u - t;
                }
            }
            m *= 2;
        }
    }
}

/// Componentwise error bound factor of [`fft`] of length N: |ΔX_k| ≤ fft_err(N)·‖x‖₁.
pub fn fft_err(n: usize) -> f64 {
    let l = (n as f64).log2().ceil();
    l * LEVEL_ERR * (l * LEVEL_ERR).exp() * (1.0 + 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-wise, vectorised Horner gives every point exactly what one scalar chain gives,
    /// whatever the number of points (a partial group of eight included).
    #[test]
    fn horner_many_equals_one_chain_per_point_bit_for_bit() {
        let p: Vec<f64> = (0..3001).map(|i| ((i * 7919) % 1000) as f64 * 1e-3 + 1e-9).collect();
        let n = 1u64 << 16;
        for count in [1usize, 5, 8, 11, 16, 19] {
            let z: Vec<Cdd> = (0..count as u64).map(|k| twiddle(k * 37 + 1, n)).collect();
            let mut out = vec![Cdd::ZERO; count];
            horner_many(&p, &z, &mut out);
            for (zk, got) in z.iter().zip(&out) {
                let mut acc = Cdd::ZERO;
                for &x in p.iter().rev() {
                    acc = acc * *zk;
                    acc.re = acc.re + Dd::from_f64(x);
                }
                // (`mul_add` is correctly rounded with or without the FMA instruction, so the
                // scalar chain here rounds as the vector lanes do.)
                assert_eq!(acc, *got, "{count} points");
            }
        }
    }

    #[test]
    fn twiddle_of_any_length_matches_the_table_and_the_platform() {
        // Powers of two: the table (≤ 256u² each) and the general form agree to ≈ 1e-30.
        let n = 1usize << 12;
        let tw = twiddles(n);
        for j in (0..n).step_by(7) {
            let a = twiddle(j as u64, n as u64);
            let d = (a - tw[j]).norm_upper();
            assert!(d < 1e-29, "j = {j}: {d:e}");
        }
        // Other lengths (f·2^k, f ∈ {3, 5, 7}): within the rounding of the platform's argument
        // (|2πj/N| ≤ 2π, ≈ 1e-15) of its cos/sin, and on the unit circle to double-word accuracy.
        for &n in &[3u64 * 1024, 5 * 4096, 7 * 65536, 2_621_440] {
            for j in [0, 1, 2, n / 8, n / 8 + 1, n / 3, n / 2 - 1, n / 2, n - 1, 12345 % n] {
                let a = twiddle(j, n);
                let ang = -std::f64::consts::TAU * (j as f64 / n as f64);
                assert!((a.re.to_f64() - ang.cos()).abs() < 4e-15, "n={n} j={j}");
                assert!((a.im.to_f64() - ang.sin()).abs() < 4e-15, "n={n} j={j}");
                let r2 = a.re * a.re + a.im * a.im - Dd::ONE;
                assert!(r2.to_f64().abs() < 1e-30, "n={n} j={j}: |w|² − 1 = {:e}", r2.to_f64());
            }
        }
    }

    #[test]
    fn arithmetic_is_twice_as_precise_as_doubles() {
        // (1 + 2⁻⁶⁰)² = 1 + 2⁻⁵⁹ + 2⁻¹²⁰: the middle term survives in the low word.
        let x = Dd::ONE + Dd::from_f64(2f64.powi(-60));
        let y = x * x;
        assert_eq!(y.hi, 1.0);
        assert_eq!(y.lo, 2f64.powi(-59));
        let z = y - Dd::ONE;
        assert_eq!(z.to_f64(), 2f64.powi(-59));
        // 1/3 by div_small times 3 returns to 1 within 1e-31.
        let t = div_small(Dd::ONE, 3.0) * Dd::from_f64(3.0) - Dd::ONE;
        assert!(t.to_f64().abs() < 1e-31, "{t:?}");
    }

    #[test]
    fn twiddles_lie_on_the_unit_circle_and_match_libm() {
        let n = 1 << 12;
        let tw = twiddles(n);
        for (j, w) in tw.iter().enumerate() {
            let r2 = w.re * w.re + w.im * w.im - Dd::ONE;
            assert!(r2.to_f64().abs() < 1e-30, "j = {j}: |w|² − 1 = {r2:?}");
            let th = std::f64::consts::TAU * j as f64 / n as f64;
            assert!((w.re.to_f64() - th.cos()).abs() < 1e-15, "j = {j}");
            assert!((w.im.to_f64() + th.sin()).abs() < 1e-15, "j = {j}");
        }
        // w^N = 1 through repeated squaring of w_1 (bound: N·(TWIDDLE_ERR + CMUL_ERR) ≈ 1.3e-26).
        let p = tw[1].powu(n as u64) - Cdd::ONE;
        assert!(p.norm_upper() < 1e-25, "{p:?}");
    }

    #[test]
    fn fft_matches_the_direct_sum_and_inverts() {
        let n = 64;
        let tw = twiddles(n);
        let x: Vec<Cdd> = (0..n)
            .map(|j| Cdd {
                re: Dd::from_f64(((j * 37 % 11) as f64) / 7.0),
                im: Dd::from_f64(((j * 13 % 5) as f64) / 3.0),
            })
            .collect();
        let mut y = x.clone();
        fft(&mut y, &tw, false);
        let l1: f64 = x.iter().map(|c| c.norm_upper()).sum();
        for (k, yk) in y.iter().enumerate() {
            let mut s = Cdd::ZERO;
            for (j, xj) in x.iter().enumerate() {
                s = s + *xj * tw[(j * k) % n];
            }
            let d = (*yk - s).norm_upper();
            assert!(d <= 2.0 * fft_err(n) * l1, "k = {k}: {d:e}");
        }
        fft(&mut y, &tw, true);
        for (a, b) in y.iter().zip(&x) {
            let d = (Cdd {
                re: a.re.scale(1.0 / n as f64),
                im: a.im.scale(1.0 / n as f64),
            } - *b)
                .norm_upper();
            assert!(d <= 2.0 * fft_err(n) * l1, "{d:e}");
        }
    }
}
